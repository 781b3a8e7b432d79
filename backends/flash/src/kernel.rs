//! The tile kernel: one request, one KV head, one tile of query tokens, read in
//! place from the paged cache (at its own width, widened in registers).
//!
//! Every row runs [`pagoda_kernels::attn`]'s arithmetic, the one `paged` runs for a
//! decode row: the keys cut into splits at the multiples of
//! [`attn::SPLIT_KEYS`] positions, each an online softmax over chunks cut at the
//! multiples of [`attn::chunk_keys`], the splits merged in position order. So a
//! prompt token's output is bit for bit what it would be as a decode row, whether
//! its prompt came in one chunk or many, or partly from the prefix cache.
//!
//! The tile shares the cache reads between its rows: per chunk of keys, the offsets
//! are computed once and every token of the tile takes its visible part of the
//! chunk (the mask is causal aligned bottom-right: local query row `i` of a request
//! with context `c` sees keys `0..=c+i`, or with a sliding window `w` only the last
//! `w` of them) while the chunk's K and V rows are in L1. Each KV head serves its
//! whole GQA group: the group's query rows of a token are contiguous.

use pagoda_kernels::attn::{self, HeadKv, Merge, RowParams, SplitState, CHUNK, MAX_GROUP};
use pagoda_kernels::{simd::Simd, KvElem};

/// Query rows per tile (tokens × group heads), about.
pub const TILE_ROWS: usize = 128;

/// Per-thread work buffers, allocated by `plan`.
#[derive(Debug, Default)]
pub struct Scratch {
    /// The current split's online-softmax state per row: max, sum, output.
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
    /// The merge of the splits so far per row.
    mm: Vec<f32>,
    ml: Vec<f32>,
    mo: Vec<f32>,
}

impl Scratch {
    /// Buffers for tiles of at most `rows` rows with head dim `hd`.
    pub fn new(rows: usize, hd: usize) -> Self {
        Scratch {
            m: vec![0.0; rows],
            l: vec![0.0; rows],
            o: vec![0.0; rows * hd],
            mm: vec![0.0; rows],
            ml: vec![0.0; rows],
            mo: vec![0.0; rows * hd],
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

/// The buffers one tile reads and writes.
#[derive(Debug, Clone, Copy)]
pub struct TileIo<'a, E> {
    /// The layer's queries, `[tokens, heads, dim]`.
    pub q: &'a [f32],
    /// The layer's K/V pools.
    pub k_cache: &'a [E],
    pub v_cache: &'a [E],
    /// The request's physical blocks.
    pub blocks: &'a [u32],
    /// The whole layer's output, `[tokens, heads, dim]`.
    pub out: *mut f32,
    /// The whole layer's LSE, `[tokens, heads]`, or null.
    pub lse: *mut f32,
}

/// Computes one tile; it writes only its own (token, head) rows of `io.out`/`io.lse`.
///
/// # Safety
/// `S`'s instruction set is available; `io.out` must be valid for the layer's
/// `[tokens, heads, dim]` output (and `io.lse`, if not null, for `[tokens, heads]`),
/// with no other thread writing this tile's rows; `io.blocks` covers positions
/// `..context + q1` and each of those block ids is inside the pools; `head_dim` is
/// a multiple of `S::LANES` and `group <= MAX_GROUP`; `sc` was made for at least
/// `(q1 - q0) * group` rows of `head_dim`.
#[inline(always)]
pub unsafe fn tile<S: Simd, E: KvElem>(d: &Dims, t: &Tile, io: &TileIo<'_, E>, sc: &mut Scratch) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let (g_n, hd, nh, nkv) = (d.group, d.head_dim, d.num_heads, d.num_kv_heads);
        debug_assert!(g_n <= MAX_GROUP);
        let tokens = t.q1 - t.q0;
        let row_stride = nkv * hd;
        let chunk = attn::chunk_keys::<E>(row_stride);
        let kv = HeadKv {
            k: io.k_cache.as_ptr().add(t.kv_head * hd),
            v: io.v_cache.as_ptr().add(t.kv_head * hd),
            blocks: io.blocks,
            block_size: d.block_size,
            row_stride,
        };
        let params = RowParams {
            head_dim: hd,
            scale: d.scale,
            soft_cap: d.soft_cap,
        };
        // Local row i (position context + q0 + i) sees keys lo(i)..hi(i).
        let hi = |i: usize| t.context + t.q0 + i + 1;
        let lo = |i: usize| d.sliding_window.map_or(0, |w| hi(i).saturating_sub(w));
        let q_row = |i: usize| {
            io.q.as_ptr()
                .add(((t.token0 + t.q0 + i) * nh + t.kv_head * g_n) * hd)
        };
        let rows = tokens * g_n;
        let (sm, sl, so) = (&mut sc.m[..rows], &mut sc.l[..rows], &mut sc.o[..rows * hd]);
        let (mm, ml, mo) = (
            &mut sc.mm[..rows],
            &mut sc.ml[..rows],
            &mut sc.mo[..rows * hd],
        );
        mm.fill(f32::NEG_INFINITY);
        ml.fill(0.0);
        mo.fill(0.0);
        let mut s = [0f32; MAX_GROUP * CHUNK];
        let mut off = [0usize; CHUNK];

        // lo and hi grow with i: the first row sees the first key, the last the last.
        for (s0, s1) in attn::splits(lo(0), hi(tokens - 1)) {
            // The rows that see keys of this split.
            let first = (0..tokens).find(|&i| hi(i) > s0).unwrap_or(tokens);
            let last = (first..tokens).take_while(|&i| lo(i) < s1).count() + first;
            for i in first..last {
                split_state(sm, sl, so, i, g_n, hd).reset();
            }
            let mut pos = s0;
            while pos < s1 {
                let ce = attn::chunk_end(pos, chunk, s1);
                kv.offsets(pos, &mut off[..ce - pos]);
                for i in first..last {
                    let (a, b) = (pos.max(lo(i)), ce.min(hi(i)));
                    if a >= b {
                        continue;
                    }
                    let mut st = split_state(sm, sl, so, i, g_n, hd);
                    let keys = &off[a - pos..b - pos];
                    attn::chunk_step::<S, E>(
                        &params,
                        q_row(i),
                        kv.k,
                        kv.v,
                        keys,
                        &[],
                        &mut st,
                        &mut s,
                    );
                }
                pos = ce;
            }
            for i in first..last {
                let mut st = split_state(sm, sl, so, i, g_n, hd);
                attn::finish_split(&mut st, hd);
                for gi in 0..g_n {
                    let r = i * g_n + gi;
                    let mut g = Merge {
                        m: &mut mm[r],
                        l: &mut ml[r],
                        o: &mut mo[r * hd..(r + 1) * hd],
                    };
                    g.add(st.m[gi], &st.o[gi * hd..(gi + 1) * hd]);
                }
            }
        }

        // Normalise and scatter the rows back to [token, head, dim].
        for i in 0..tokens {
            let tok = t.token0 + t.q0 + i;
            for gi in 0..g_n {
                let r = i * g_n + gi;
                let head = t.kv_head * g_n + gi;
                let g = Merge {
                    m: &mut mm[r],
                    l: &mut ml[r],
                    o: &mut mo[r * hd..(r + 1) * hd],
                };
                let dst = std::slice::from_raw_parts_mut(io.out.add((tok * nh + head) * hd), hd);
                let x = g.finish(dst);
                if !io.lse.is_null() {
                    *io.lse.add(tok * nh + head) = x;
                }
            }
        }
    }
}

/// Row `i`'s group of `g_n` heads in the split buffers.
#[inline(always)]
fn split_state<'a>(
    m: &'a mut [f32],
    l: &'a mut [f32],
    o: &'a mut [f32],
    i: usize,
    g_n: usize,
    hd: usize,
) -> SplitState<'a> {
    SplitState {
        m: &mut m[i * g_n..(i + 1) * g_n],
        l: &mut l[i * g_n..(i + 1) * g_n],
        o: &mut o[i * g_n * hd..(i + 1) * g_n * hd],
    }
}
