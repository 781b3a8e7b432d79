//! The per-work-item decode kernel: one request, one range of key positions, all
//! heads. Each chunk of keys is read as whole token rows (`num_kv_heads * head_dim`
//! contiguous floats, a block is one contiguous run), so memory is streamed rather
//! than gathered in per-head pieces. Within a chunk, each KV head serves its whole
//! GQA group: K and V rows are loaded once per group, the scores of up to four
//! heads share each K load and the V accumulation keeps four heads' outputs in
//! registers across the chunk. The arithmetic is [`pagoda_kernels::attn`]'s (one
//! online softmax per split, chunks cut at fixed positions), the same the `flash`
//! backend runs for a prefill row, so a row's bits do not depend on which kernel ran
//! it. (A sliding window only narrows the key range of the items, in `plan`.)
//!
//! A verify run (a speculative verify row: one request's last token and its drafts
//! as consecutive decode rows, see `BatchDescriptor::verify_runs`) is served by
//! [`attend_run`]: one pass over the keys of a split for all the run's queries, each
//! chunk's K/V read from memory once and then from L1 for the other rows. Each row
//! takes exactly the chunk steps [`attend`] would take for it alone (the same chunk
//! starts, its own end), so its bits are those of the plain decode row.
//!
//! The cache is read at its own width ([`KvElem`]: f32, bf16, f16 or fp8 E4M3):
//! each K/V vector is widened to f32 in registers as it is loaded, so a 16-bit
//! cache streams half the bytes (fp8 a quarter) and the arithmetic is the f32
//! kernel's.

use pagoda_kernels::attn::{self, CHUNK};
use pagoda_kernels::simd::{Portable, Simd};
use pagoda_kernels::{Isa, KvElem};

/// Largest GQA group the stack scratch holds (also the declared `max_gqa_ratio`).
pub use pagoda_kernels::attn::MAX_GROUP;

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

/// Most rows of a verify run one [`attend_run`] call serves (longer runs are cut
/// into calls of this many rows by the plan).
pub const MAX_RUN: usize = 16;

/// One row of a verify run: its query row `[num_heads, head_dim]` and the end of
/// its key range (the run's rows share the start).
#[derive(Clone, Copy)]
pub struct RunRow<'a> {
    pub q: &'a [f32],
    pub end: usize,
}

/// [`attend`] for the rows of one verify run over the key positions from `a.start`
/// to each row's own `end` (`a` is the last row's item: the longest range), in one
/// pass: row `j` writes `o[j * num_heads * head_dim..]`, `lse[j * num_heads..]`
/// (and uses `l` alike), bit-identical to [`attend`] on that row alone.
///
/// # Safety
/// As [`attend`] for `a`; every row's end is at most `a.end`.
pub unsafe fn attend_run<E: KvElem>(
    isa: Isa,
    a: &ItemArgs<'_, E>,
    rows: &[RunRow<'_>],
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    let nh = a.num_kv_heads * a.group;
    let n = rows.len();
    assert!(a.group <= MAX_GROUP && a.head_dim.is_multiple_of(16) && n <= MAX_RUN);
    assert!(rows
        .iter()
        .all(|r| r.q.len() == nh * a.head_dim && r.end <= a.end));
    assert!(o.len() == n * nh * a.head_dim && lse.len() == n * nh && l.len() == n * nh);
    // SAFETY: as in `attend`: the caller's contract covers every key position up to
    // `a.end`, which bounds every row's; lengths asserted above.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Bf16 => run_avx512(a, rows, o, lse, l),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => run_avx2(a, rows, o, lse, l),
            _ => run_generic::<Portable, E>(a, rows, o, lse, l),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn run_avx512<E: KvElem>(
    a: &ItemArgs<'_, E>,
    rows: &[RunRow<'_>],
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe { run_generic::<pagoda_kernels::simd::Avx512, E>(a, rows, o, lse, l) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<E: KvElem>(
    a: &ItemArgs<'_, E>,
    rows: &[RunRow<'_>],
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe { run_generic::<pagoda_kernels::simd::Avx2, E>(a, rows, o, lse, l) }
}

/// `attend_generic` with the rows of a run inside the KV-head loop: each row's
/// state (`m`, `l`, `o` at its offsets) sees the chunk steps it would see alone.
#[inline(always)]
unsafe fn run_generic<S: Simd, E: KvElem>(
    a: &ItemArgs<'_, E>,
    rows: &[RunRow<'_>],
    o: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let (g_n, hd, nkv) = (a.group, a.head_dim, a.num_kv_heads);
        let nh = nkv * g_n;
        let row_stride = nkv * hd;
        let chunk = attn::chunk_keys::<E>(row_stride);
        let params = attn::RowParams {
            head_dim: hd,
            scale: a.scale,
            soft_cap: a.soft_cap,
        };
        let mut s = [0f32; MAX_GROUP * CHUNK];
        let mut off = [0usize; CHUNK];
        let mut next = [0usize; CHUNK];
        let (kp, vp) = (a.k_cache.as_ptr(), a.v_cache.as_ptr());
        let kv = attn::HeadKv {
            k: kp,
            v: vp,
            blocks: a.blocks,
            block_size: a.block_size,
            row_stride,
        };
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        o.fill(0.0);
        let row_offsets = |pos: usize, out: &mut [usize; CHUNK]| {
            let n = attn::chunk_end(pos, chunk, a.end).saturating_sub(pos);
            kv.offsets(pos, &mut out[..n]);
            n
        };
        let mut pos = a.start;
        let mut n = row_offsets(pos, &mut off);
        while pos < a.end {
            let n_next = row_offsets(pos + n, &mut next);
            for h in 0..nkv {
                let head0 = h * g_n;
                for (j, row) in rows.iter().enumerate() {
                    if row.end <= pos {
                        continue;
                    }
                    // This row's chunk: the same start, cut at its own end (what
                    // `attend_generic` takes for it alone).
                    let nj = n.min(row.end - pos);
                    let (h0, h1) = (j * nh + head0, j * nh + head0 + g_n);
                    let mut hs = attn::SplitState {
                        m: &mut m[h0..h1],
                        l: &mut l[h0..h1],
                        o: &mut o[h0 * hd..h1 * hd],
                    };
                    attn::chunk_step::<S, E>(
                        &params,
                        row.q.as_ptr().add(head0 * hd),
                        kp.add(h * hd),
                        vp.add(h * hd),
                        &off[..nj],
                        &next[..n_next],
                        &mut hs,
                        &mut s,
                    );
                }
            }
            pos += n;
            n = n_next;
            off = next;
        }
        for j in 0..rows.len() {
            let mut st = attn::SplitState {
                m: &mut m[j * nh..(j + 1) * nh],
                l: &mut l[j * nh..(j + 1) * nh],
                o: &mut o[j * nh * hd..(j + 1) * nh * hd],
            };
            attn::finish_split(&mut st, hd);
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
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe { attend_generic::<pagoda_kernels::simd::Avx512, E>(a, o, lse, l) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2<E: KvElem>(
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    lse: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe { attend_generic::<pagoda_kernels::simd::Avx2, E>(a, o, lse, l) }
}

#[inline(always)]
unsafe fn attend_generic<S: Simd, E: KvElem>(
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let (g_n, hd, nkv) = (a.group, a.head_dim, a.num_kv_heads);
        let row_stride = nkv * hd;
        // Chunks cut at multiples of `chunk` positions (`attn`'s scheme), so that a
        // prefill row of `flash` over the same keys takes the same steps.
        let chunk = attn::chunk_keys::<E>(row_stride);
        let params = attn::RowParams {
            head_dim: hd,
            scale: a.scale,
            soft_cap: a.soft_cap,
        };
        let mut s = [0f32; MAX_GROUP * CHUNK];
        let mut off = [0usize; CHUNK];
        let mut next = [0usize; CHUNK];
        let (kp, vp) = (a.k_cache.as_ptr(), a.v_cache.as_ptr());
        let kv = attn::HeadKv {
            k: kp,
            v: vp,
            blocks: a.blocks,
            block_size: a.block_size,
            row_stride,
        };
        let mut st = attn::SplitState { m, l, o };
        st.reset();

        // Offsets of the next chunk's rows, whose K/V pieces are prefetched one KV head
        // ahead of use: random block order defeats the hardware prefetchers at every
        // block boundary, and one core alone cannot keep enough misses in flight.
        let row_offsets = |pos: usize, out: &mut [usize; CHUNK]| {
            let n = attn::chunk_end(pos, chunk, a.end).saturating_sub(pos);
            kv.offsets(pos, &mut out[..n]);
            n
        };
        let mut pos = a.start;
        let mut n = row_offsets(pos, &mut off);
        while pos < a.end {
            let n_next = row_offsets(pos + n, &mut next);
            for h in 0..nkv {
                let head0 = h * g_n;
                let mut hs = attn::SplitState {
                    m: &mut st.m[head0..head0 + g_n],
                    l: &mut st.l[head0..head0 + g_n],
                    o: &mut st.o[head0 * hd..(head0 + g_n) * hd],
                };
                attn::chunk_step::<S, E>(
                    &params,
                    a.q.as_ptr().add(head0 * hd),
                    kp.add(h * hd),
                    vp.add(h * hd),
                    &off[..n],
                    &next[..n_next],
                    &mut hs,
                    &mut s,
                );
            }
            pos += n;
            n = n_next;
            off = next;
        }
        attn::finish_split(&mut st, hd);
    }
}
