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

#[inline(always)]
unsafe fn attend_generic<S: Simd, E: KvElem>(
    a: &ItemArgs<'_, E>,
    o: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
) {
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
