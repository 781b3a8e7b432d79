//! The tile kernel: one request, one KV head, one tile of query tokens, and the
//! per-step repacking ([`pack`]) of the paged K/V into contiguous per-(request,
//! head) runs, so that key tiles are plain matrices (gathering rows 4 KiB apart
//! per tile took a quarter of the time, and re-gathered per query tile).
//!
//! The rows of the tile are (token, head) for every query head of the KV head's
//! GQA group, so each K/V tile is gathered once for the whole group. Per key tile:
//! `S = Q Kᵀ` and `O += P V` are dense GEMMs (the `gemm` crate), the mask is causal
//! aligned bottom-right (local query row `i` of a request with context `c` sees
//! keys `0..=c+i`, or with a sliding window `w` only the last `w` of them), the
//! scores are soft-capped (`cap * tanh(s / cap)`) when asked, and the softmax is
//! online (running max `m`, sum `l`).
//!
//! The repacking reads the cache at its own width (f32, bf16, f16 or fp8 E4M3, [`KvElem`])
//! and widens each row to f32 in registers as it copies it: the packed runs, the
//! only K/V the tiles read, are f32 whatever the cache holds. They hold only this
//! step's requests, not a copy of the cache.

use gemm::{gemm, Parallelism};
// The one vectorised exp: both CPU attention kernels share one softmax arithmetic.
use pagoda_kernels::{blocks::slot, exp_fast};
use pagoda_kernels::{kv_elem::widen_with, simd::Simd, KvElem};

/// Query rows per tile (tokens × group heads), about.
pub const TILE_ROWS: usize = 128;
/// Keys per tile.
pub const TILE_KEYS: usize = 128;

/// Per-thread work buffers, allocated by `plan`.
#[derive(Debug, Default)]
pub struct Scratch {
    q: Vec<f32>,
    s: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

impl Scratch {
    /// Buffers for tiles of at most `rows` rows with head dim `hd`.
    pub fn new(rows: usize, hd: usize) -> Self {
        Scratch {
            q: vec![0.0; rows * hd],
            s: vec![0.0; rows * TILE_KEYS],
            o: vec![0.0; rows * hd],
            m: vec![0.0; rows],
            l: vec![0.0; rows],
        }
    }
}

/// Shapes shared by every tile of a layer.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    /// Each query sees only its last `w` key positions (its own included).
    pub sliding_window: Option<usize>,
    /// `s = cap * tanh(s / cap)` on the scaled scores.
    pub soft_cap: Option<f32>,
}

/// One tile of work.
#[derive(Debug, Clone, Copy)]
pub struct Tile {
    pub kv_head: usize,
    /// Global index of the request's first query token.
    pub token0: usize,
    /// Local query rows `q0..q1` of the request.
    pub q0: usize,
    pub q1: usize,
    /// Keys cached before this step's tokens.
    pub context: usize,
}

/// Copies request rows `0..seq_len` of KV head `kv_head` out of the paged pools
/// into contiguous f32 `[seq_len, head_dim]` runs `dk`/`dv`, widening each row with
/// `S`'s vectors.
///
/// # Safety
/// `S`'s instruction set is available on this CPU; every block id in `blocks` must
/// be inside the pools; `dk`/`dv` must be valid for `seq_len * head_dim` elements
/// that no other thread touches.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn pack<S: Simd, E: KvElem>(
    k_cache: &[E],
    v_cache: &[E],
    blocks: &[u32],
    block_size: usize,
    num_kv_heads: usize,
    kv_head: usize,
    head_dim: usize,
    seq_len: usize,
    dk: *mut f32,
    dv: *mut f32,
) {
    let row_stride = num_kv_heads * head_dim;
    for p in 0..seq_len {
        let src = slot(blocks, block_size, p) * row_stride + kv_head * head_dim;
        let (ks, vs) = (&k_cache[src..src + head_dim], &v_cache[src..src + head_dim]);
        let kd = std::slice::from_raw_parts_mut(dk.add(p * head_dim), head_dim);
        let vd = std::slice::from_raw_parts_mut(dv.add(p * head_dim), head_dim);
        widen_with::<S, E>(ks, kd);
        widen_with::<S, E>(vs, vd);
    }
}

/// The buffers one tile reads and writes.
#[derive(Debug, Clone, Copy)]
pub struct TileIo<'a> {
    /// The layer's queries, `[tokens, heads, dim]`.
    pub q: &'a [f32],
    /// The request's packed `[seq_len, head_dim]` rows of this KV head ([`pack`]).
    pub k: *const f32,
    pub v: *const f32,
    /// The whole layer's output, `[tokens, heads, dim]`.
    pub out: *mut f32,
    /// The whole layer's LSE, `[tokens, heads]`, or null.
    pub lse: *mut f32,
}

/// Computes one tile; it writes only its own (token, head) rows of `io.out`/`io.lse`.
///
/// # Safety
/// `io.out` must be valid for the layer's `[tokens, heads, dim]` output (and
/// `io.lse`, if not null, for `[tokens, heads]`), with no other thread writing this
/// tile's rows; `io.k`/`io.v` must hold `context + q1` rows.
#[inline(always)]
pub unsafe fn tile(d: &Dims, t: &Tile, io: &TileIo<'_>, sc: &mut Scratch) {
    let TileIo { q, k, v, out, lse } = *io;
    let (g_n, hd, nh) = (d.group, d.head_dim, d.num_heads);
    let tokens = t.q1 - t.q0;
    let rows = tokens * g_n;

    // Gather the scaled queries, row = (token, head in group).
    for i in 0..tokens {
        let src = ((t.token0 + t.q0 + i) * nh + t.kv_head * g_n) * hd;
        let dst = &mut sc.q[i * g_n * hd..(i + 1) * g_n * hd];
        for (x, &y) in dst.iter_mut().zip(&q[src..src + g_n * hd]) {
            *x = y * d.scale;
        }
    }
    sc.o[..rows * hd].fill(0.0);
    sc.m[..rows].fill(f32::NEG_INFINITY);
    sc.l[..rows].fill(0.0);

    // Keys visible to the tile's last row; with a window, tiles start at the first
    // key the tile's first row sees (keys before it are masked for every row).
    let num_keys = t.context + t.q1;
    let first_pos = |i: usize| match d.sliding_window {
        Some(w) => (t.context + t.q0 + i + 1).saturating_sub(w),
        None => 0,
    };
    let mut k0 = first_pos(0);
    while k0 < num_keys {
        let n = TILE_KEYS.min(num_keys - k0);
        // S[rows, n] = Q[rows, hd] · K[n, hd]ᵀ
        matmul(
            (rows, n, hd),
            (sc.s.as_mut_ptr(), TILE_KEYS),
            false,
            Mat::rows(sc.q.as_ptr(), hd),
            Mat::transposed(k.add(k0 * hd), hd),
        );
        // Mask, online softmax, and P in place of S.
        for i in 0..tokens {
            // Keys k0.. visible to local query row q0+i: positions <= context + q0 + i.
            let limit = (t.context + t.q0 + i + 1).saturating_sub(k0).min(n);
            // ... and positions >= first_pos(i) (the sliding window).
            let lo = first_pos(i).saturating_sub(k0).min(limit);
            for gi in 0..g_n {
                let r = i * g_n + gi;
                let srow = &mut sc.s[r * TILE_KEYS..r * TILE_KEYS + n];
                if limit == lo {
                    srow.fill(0.0);
                    continue;
                }
                if let Some(c) = d.soft_cap {
                    for x in srow[lo..limit].iter_mut() {
                        *x = c * (*x / c).tanh();
                    }
                }
                let cm = max16(&srow[lo..limit]);
                let m_new = sc.m[r].max(cm);
                if m_new > sc.m[r] {
                    let corr = exp_fast(sc.m[r] - m_new);
                    sc.l[r] *= corr;
                    sc.o[r * hd..(r + 1) * hd]
                        .iter_mut()
                        .for_each(|x| *x *= corr);
                    sc.m[r] = m_new;
                }
                for x in srow[lo..limit].iter_mut() {
                    *x = exp_fast(*x - m_new);
                }
                srow[..lo].fill(0.0);
                srow[limit..].fill(0.0);
                sc.l[r] += sum16(&srow[lo..limit]);
            }
        }
        // O[rows, hd] += P[rows, n] · V[n, hd]
        matmul(
            (rows, hd, n),
            (sc.o.as_mut_ptr(), hd),
            true,
            Mat::rows(sc.s.as_ptr(), TILE_KEYS),
            Mat::rows(v.add(k0 * hd), hd),
        );
        k0 += n;
    }

    // Normalise and scatter the rows back to [token, head, dim].
    for i in 0..tokens {
        let tok = t.token0 + t.q0 + i;
        for gi in 0..g_n {
            let r = i * g_n + gi;
            let head = t.kv_head * g_n + gi;
            let inv = 1.0 / sc.l[r];
            let dst = std::slice::from_raw_parts_mut(out.add((tok * nh + head) * hd), hd);
            for (x, &y) in dst.iter_mut().zip(&sc.o[r * hd..(r + 1) * hd]) {
                *x = y * inv;
            }
            if !lse.is_null() {
                *lse.add(tok * nh + head) = sc.m[r] + sc.l[r].ln();
            }
        }
    }
}

/// A read-only matrix operand as `gemm` takes it: a pointer and the element
/// strides between columns and between rows.
#[derive(Clone, Copy)]
struct Mat {
    ptr: *const f32,
    col_stride: isize,
    row_stride: isize,
}

impl Mat {
    /// Row-major with `row_stride` elements per row.
    fn rows(ptr: *const f32, row_stride: usize) -> Mat {
        Mat {
            ptr,
            col_stride: 1,
            row_stride: row_stride as isize,
        }
    }

    /// The transpose of a row-major matrix with `row_stride` elements per row.
    fn transposed(ptr: *const f32, row_stride: usize) -> Mat {
        Mat {
            ptr,
            col_stride: row_stride as isize,
            row_stride: 1,
        }
    }
}

/// `dst[m, n] = lhs[m, k] · rhs[k, n]`, or `+=` with `accumulate`, on this thread
/// (the tiles are the parallelism). `dst` is row-major with the given row stride.
///
/// # Safety
/// Every pointer must be valid for its matrix under its strides.
#[inline(always)]
unsafe fn matmul(
    (m, n, k): (usize, usize, usize),
    (dst, dst_row_stride): (*mut f32, usize),
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
) {
    // gemm computes dst = alpha * dst + beta * lhs · rhs, reading dst only if asked.
    let alpha = if accumulate { 1.0 } else { 0.0 };
    gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_row_stride as isize,
        accumulate,
        lhs.ptr,
        lhs.col_stride,
        lhs.row_stride,
        rhs.ptr,
        rhs.col_stride,
        rhs.row_stride,
        alpha,
        1.0,
        false,
        false,
        false,
        Parallelism::None,
    );
}

/// Maximum over 16 independent lanes, so that the loop vectorises (a plain fold
/// is a serial chain of dependent `max`es).
#[inline(always)]
fn max16(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for i in 0..16 {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    let m = it
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    acc.iter().fold(m, |a, &b| a.max(b))
}

/// Sum over 16 independent lanes (vectorises, unlike a serial sum).
#[inline(always)]
fn sum16(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for i in 0..16 {
            acc[i] += c[i];
        }
    }
    it.remainder().iter().sum::<f32>() + acc.iter().sum::<f32>()
}
