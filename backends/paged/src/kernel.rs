//! The per-work-item decode kernel: one request, one range of key positions, all
//! heads. Each chunk of keys is read as whole token rows (`num_kv_heads * head_dim`
//! contiguous floats, a block is one contiguous run), so memory is streamed rather
//! than gathered in per-head pieces. Within a chunk, each KV head serves its whole
//! GQA group: K and V rows are loaded once per group, the scores of up to four
//! heads share each K load and the V accumulation keeps four heads' outputs in
//! registers across the chunk. The softmax is online (running max and sum per head);
//! soft-capped scores are capped before it. (A sliding window only narrows the key
//! range of the items, in `plan`.)
//!
//! The cache is read at its own width ([`KvElem`]: f32, bf16, f16 or fp8 E4M3):
//! each K/V vector is widened to f32 in registers as it is loaded, so a 16-bit
//! cache streams half the bytes (fp8 a quarter) and the arithmetic is the f32
//! kernel's.

use pagoda_kernels::blocks::slot;
use pagoda_kernels::exp_fast;
use pagoda_kernels::simd::{Portable, Simd};
use pagoda_kernels::{Isa, KvElem};

/// Keys per online-softmax step; the scores live on the stack as `[group, CHUNK]`.
const CHUNK: usize = 16;
/// Largest GQA group the stack scratch holds (also the declared `max_gqa_ratio`).
pub const MAX_GROUP: usize = 64;

/// Read-only inputs of one work item, over a cache of elements `E`.
pub struct ItemArgs<'a, E> {
    /// The request's query row, `[num_heads, head_dim]`.
    pub q: &'a [f32],
    pub k_cache: &'a [E],
    pub v_cache: &'a [E],
    /// The request's physical blocks.
    pub blocks: &'a [u32],
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub group: usize,
    pub scale: f32,
    /// `s = cap * tanh(s / cap)` on the scaled scores.
    pub soft_cap: Option<f32>,
    /// Key positions `start..end` of the request.
    pub start: usize,
    pub end: usize,
}

/// Writes the normalised partial output `o: [num_heads, head_dim]` and its
/// log-sum-exp `lse: [num_heads]`; `l: [num_heads]` is scratch.
///
/// # Safety
/// `isa` is available on this CPU ([`Isa::available`]); `a.blocks` covers
/// positions `..a.end` and each of those block ids is below the pools' number of
/// blocks (`k_cache.len() / (block_size * num_kv_heads * head_dim)`, with
/// `v_cache` as long as `k_cache`). The other lengths are asserted here.
pub unsafe fn attend<E: KvElem>(
    isa: Isa,
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    let nh = a.num_kv_heads * a.group;
    assert!(a.group <= MAX_GROUP && a.head_dim.is_multiple_of(16) && a.q.len() == nh * a.head_dim);
    assert!(o.len() == nh * a.head_dim && lse.len() == nh && l.len() == nh);
    // SAFETY: `isa` is available and every K/V row the kernel reads (block id times
    // `block_size` plus offset, times `num_kv_heads * head_dim`) lies inside the
    // pools (the caller's contract); `q`, `o`, `lse`, `l` have the lengths asserted
    // above and `head_dim` is a multiple of every `Simd::LANES`.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Bf16 => attend_avx512(a, o, lse, l),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => attend_avx2(a, o, lse, l),
            _ => attend_generic::<Portable, E>(a, o, lse, l),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_avx512<E: KvElem>(
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    attend_generic::<pagoda_kernels::simd::Avx512, E>(a, o, lse, l)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2<E: KvElem>(
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    attend_generic::<pagoda_kernels::simd::Avx2, E>(a, o, lse, l)
}

/// Elements of `E` per 64-byte cache line: the prefetch stride.
const fn per_line<E>() -> usize {
    64 / std::mem::size_of::<E>()
}

/// `s[gi * CHUNK + j] = scale * q[gi] · k[j]` for `NG` heads, sharing each K load.
/// Prefetches the rows `pf` (the next chunk) one row per key, spread out so that the
/// prefetches never crowd the miss buffers that the demand loads need.
#[inline(always)]
unsafe fn scores<S: Simd, E: KvElem, const NG: usize>(
    q: *const f32,
    kp: *const E,
    off: &[usize],
    pf: &[usize],
    hd: usize,
    scale: f32,
    s: *mut f32,
) {
    for (j, &o) in off.iter().enumerate() {
        if let Some(&pj) = pf.get(j) {
            let mut d = 0;
            while d < hd {
                S::prefetch(kp.add(pj + d) as *const f32);
                d += per_line::<E>();
            }
        }
        let k = kp.add(o);
        let mut acc = [S::zero(); NG];
        let mut d = 0;
        while d < hd {
            let kv = E::load::<S>(k.add(d));
            for (gi, a) in acc.iter_mut().enumerate() {
                *a = S::fma(S::load(q.add(gi * hd + d)), kv, *a);
            }
            d += S::LANES;
        }
        for (gi, a) in acc.iter().enumerate() {
            *s.add(gi * CHUNK + j) = S::reduce(*a) * scale;
        }
    }
}

/// `o[gi] += sum_j p[gi * CHUNK + j] * v[j]` for `NG` heads, accumulating in
/// registers; prefetches one cache line of each row `pf` per line of columns.
#[inline(always)]
unsafe fn accumulate<S: Simd, E: KvElem, const NG: usize>(
    o: *mut f32,
    vp: *const E,
    off: &[usize],
    pf: &[usize],
    hd: usize,
    p: *const f32,
) {
    let mut d = 0;
    while d < hd {
        if d.is_multiple_of(per_line::<E>()) {
            for &pj in pf {
                S::prefetch(vp.add(pj + d) as *const f32);
            }
        }
        let mut acc = [S::zero(); NG];
        for (gi, a) in acc.iter_mut().enumerate() {
            *a = S::load(o.add(gi * hd + d));
        }
        for (j, &oj) in off.iter().enumerate() {
            let vv = E::load::<S>(vp.add(oj + d));
            for (gi, a) in acc.iter_mut().enumerate() {
                *a = S::fma(S::splat(*p.add(gi * CHUNK + j)), vv, *a);
            }
        }
        for (gi, a) in acc.iter().enumerate() {
            S::store(o.add(gi * hd + d), *a);
        }
        d += S::LANES;
    }
}

#[inline(always)]
unsafe fn attend_generic<S: Simd, E: KvElem>(
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    let (g_n, hd, bs, nkv) = (a.group, a.head_dim, a.block_size, a.num_kv_heads);
    let row_stride = nkv * hd;
    // Keys per step. When token rows are a multiple of 4 KiB apart, one head's
    // pieces of consecutive rows all land in the same L1 sets; 16 of them exceed
    // the associativity and evict the queries and accumulators (measured: Llama-8B
    // shape ran ~30% slower), so take 8 keys per step there.
    let chunk = if (row_stride * std::mem::size_of::<E>()).is_multiple_of(4096) {
        CHUNK / 2
    } else {
        CHUNK
    };
    let mut s = [0f32; MAX_GROUP * CHUNK];
    let mut off = [0usize; CHUNK];
    o.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    let (kp, vp) = (a.k_cache.as_ptr(), a.v_cache.as_ptr());

    // Offsets of the next chunk's rows, whose K/V pieces are prefetched one KV head
    // ahead of use: random block order defeats the hardware prefetchers at every
    // block boundary, and one core alone cannot keep enough misses in flight.
    let mut next = [0usize; CHUNK];
    let row_offsets = |pos: usize, out: &mut [usize; CHUNK]| {
        let n = chunk.min(a.end.saturating_sub(pos));
        for (j, x) in out.iter_mut().enumerate().take(n) {
            let p = pos + j;
            *x = slot(a.blocks, bs, p) * row_stride;
        }
        n
    };
    let mut pos = a.start;
    let mut n = row_offsets(pos, &mut off);
    while pos < a.end {
        let n_next = row_offsets(pos + n, &mut next);
        for h in 0..nkv {
            let head0 = h * g_n;
            let q = a.q.as_ptr().add(head0 * hd);
            let oh = o.as_mut_ptr().add(head0 * hd);
            let (kh, vh) = (kp.add(h * hd), vp.add(h * hd));
            let offs = &off[..n];
            let mut g = 0;
            while g < g_n {
                let (qg, sg) = (q.add(g * hd), s.as_mut_ptr().add(g * CHUNK));
                let pf: &[usize] = if g == 0 { &next[..n_next] } else { &[] };
                match g_n - g {
                    1 => scores::<S, E, 1>(qg, kh, offs, pf, hd, a.scale, sg),
                    2 => scores::<S, E, 2>(qg, kh, offs, pf, hd, a.scale, sg),
                    3 => scores::<S, E, 3>(qg, kh, offs, pf, hd, a.scale, sg),
                    _ => scores::<S, E, 4>(qg, kh, offs, pf, hd, a.scale, sg),
                }
                g += 4;
            }
            // Online softmax: rescale each head's running output to its new maximum.
            for gi in 0..g_n {
                let head = head0 + gi;
                let row = &mut s[gi * CHUNK..(gi + 1) * CHUNK];
                if let Some(c) = a.soft_cap {
                    for x in row[..n].iter_mut() {
                        *x = c * (*x / c).tanh();
                    }
                }
                let cm = row[..n].iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
                let m_new = m[head].max(cm);
                if m_new > m[head] {
                    let corr = exp_fast(m[head] - m_new);
                    l[head] *= corr;
                    let oo = oh.add(gi * hd);
                    let cv = S::splat(corr);
                    let mut d = 0;
                    while d < hd {
                        S::store(oo.add(d), S::mul(S::load(oo.add(d)), cv));
                        d += S::LANES;
                    }
                    m[head] = m_new;
                }
                // Whole-chunk loop so that it vectorises; lanes past n are zeroed after.
                for x in row.iter_mut() {
                    *x = exp_fast(*x - m_new);
                }
                row[n..].fill(0.0);
                l[head] += row.iter().sum::<f32>();
            }
            let mut g = 0;
            while g < g_n {
                let (og, pg) = (oh.add(g * hd), s.as_ptr().add(g * CHUNK));
                let pf: &[usize] = if g == 0 { &next[..n_next] } else { &[] };
                match g_n - g {
                    1 => accumulate::<S, E, 1>(og, vh, offs, pf, hd, pg),
                    2 => accumulate::<S, E, 2>(og, vh, offs, pf, hd, pg),
                    3 => accumulate::<S, E, 3>(og, vh, offs, pf, hd, pg),
                    _ => accumulate::<S, E, 4>(og, vh, offs, pf, hd, pg),
                }
                g += 4;
            }
        }
        pos += n;
        n = n_next;
        off = next;
    }
    for head in 0..nkv * g_n {
        if l[head] > 0.0 {
            let inv = 1.0 / l[head];
            o[head * hd..(head + 1) * hd]
                .iter_mut()
                .for_each(|x| *x *= inv);
            m[head] += l[head].ln();
        } else {
            m[head] = f32::NEG_INFINITY;
        }
    }
}
