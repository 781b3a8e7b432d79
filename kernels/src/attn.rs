//! The one attention arithmetic of the CPU backends: what a query row computes,
//! whether it is a decode row (`paged`), a row of a prefill chunk (`flash`), or a
//! row recomputed after a preemption. Both backends call these functions and
//! nothing else for the floating-point work, so a row's bits depend only on its
//! query, its keys and values, and the configuration: never on the rows beside it,
//! how its prompt was chunked, which positions came from the prefix cache, the
//! block layout, the thread count or how the work was split across threads (the
//! `batch_invariant` capability of `pagoda_core::AttentionBackend`).
//!
//! The scheme (fixed split size, as vLLM's batch-invariant mode and Thinking
//! Machines' kernels do it): a row at position `p` attends to keys `lo..=p`
//! (`lo = 0`, or `p + 1 - window`).
//!
//! * **Splits**: the keys are cut at the multiples of [`SPLIT_KEYS`] positions, so
//!   a split's boundaries depend on positions only. Each split is one online
//!   softmax ([`chunk_step`] over its chunks, then [`finish_split`]), and the
//!   splits are merged in position order by [`Merge`].
//! * **Chunks**: within a split, keys are taken in chunks cut at the multiples of
//!   [`chunk_keys`] positions (16, or 8 when token rows are a multiple of 4 KiB
//!   apart; a function of the configuration only). Per chunk and head: the scores
//!   `reduce(Σ_lanes q·k) · scale` (the lane-wise FMA chain over the head dim, then
//!   one fixed reduction tree), the soft cap, the running maximum and the rescale,
//!   `p = exp_fast(s - m)`, the sum of `p` by one fixed tree over the chunk's slots,
//!   and `o = fma(p, v, o)` in key order.
//!
//! The arithmetic differs between instruction sets (16 lanes on AVX-512, 8 on AVX2
//! and in the portable code, whose reduction trees differ), so the guarantee is per
//! ISA: on one machine under one `PAGODA_DISABLE_AVX512` setting.

use crate::blocks::slot;
use crate::exp_fast;
use crate::kv_elem::KvElem;
use crate::simd::Simd;

/// Keys per split: splits start at the multiples of this many positions.
pub const SPLIT_KEYS: usize = 256;
/// Most keys per chunk; the score scratch is `[group, CHUNK]`.
pub const CHUNK: usize = 16;
/// Largest GQA group the score scratch holds.
pub const MAX_GROUP: usize = 64;

/// Keys per online-softmax chunk for a cache of `E` whose token rows are
/// `row_stride` elements apart. When rows are a multiple of 4 KiB apart, one head's
/// pieces of consecutive rows all land in the same L1 sets; 16 of them exceed the
/// associativity and evict the queries and accumulators (measured: Llama-8B shape
/// ran ~30 % slower), so take 8 keys per step there. A function of the
/// configuration only, so every row of a model uses the same chunks.
pub fn chunk_keys<E>(row_stride: usize) -> usize {
    if (row_stride * std::mem::size_of::<E>()).is_multiple_of(4096) {
        CHUNK / 2
    } else {
        CHUNK
    }
}

/// The splits of keys `lo..hi`: `(start, end)` pairs cut at the multiples of
/// [`SPLIT_KEYS`], in position order; one empty split when `lo == hi`.
pub fn splits(lo: usize, hi: usize) -> impl Iterator<Item = (usize, usize)> {
    let (first, last) = if hi > lo {
        (lo / SPLIT_KEYS, (hi - 1) / SPLIT_KEYS)
    } else {
        (0, 0)
    };
    (first..=last).map(move |j| {
        if hi > lo {
            (lo.max(j * SPLIT_KEYS), hi.min((j + 1) * SPLIT_KEYS))
        } else {
            (lo, lo)
        }
    })
}

/// The end of the chunk that starts at (or contains) `pos`, capped at `end`.
#[inline(always)]
pub fn chunk_end(pos: usize, chunk: usize, end: usize) -> usize {
    ((pos / chunk + 1) * chunk).min(end)
}

/// Where the keys of one head come from: pool base pointers for one KV head (`k`,
/// `v` already offset by `kv_head * head_dim`) and the paged layout.
#[derive(Clone, Copy)]
pub struct HeadKv<'a, E> {
    pub k: *const E,
    pub v: *const E,
    /// The sequence's physical blocks.
    pub blocks: &'a [u32],
    pub block_size: usize,
    /// Elements between consecutive token rows (`num_kv_heads * head_dim`).
    pub row_stride: usize,
}

impl<E> HeadKv<'_, E> {
    /// The element offsets of positions `pos..pos + out.len()` (at most [`CHUNK`]).
    #[inline(always)]
    pub fn offsets(&self, pos: usize, out: &mut [usize]) {
        for (j, x) in out.iter_mut().enumerate() {
            *x = slot(self.blocks, self.block_size, pos + j) * self.row_stride;
        }
    }
}

/// The per-head constants of the arithmetic.
#[derive(Debug, Clone, Copy)]
pub struct RowParams {
    pub head_dim: usize,
    pub scale: f32,
    /// `s = cap * tanh(s / cap)` on the scaled scores.
    pub soft_cap: Option<f32>,
}

/// Elements of `E` per 64-byte cache line: the prefetch stride.
const fn per_line<E>() -> usize {
    64 / std::mem::size_of::<E>()
}

/// Keys per register block of [`scores`] (and head-dim vectors per block of
/// [`accumulate`]): 4 on 32-register AVX-512, 2 on 16-register AVX2 and portable.
/// Blocking only chooses which independent chains share a load; every score and
/// every output element takes the same operations in the same order whatever the
/// block, so the bits do not depend on it.
const fn block<S: Simd>() -> usize {
    if S::LANES >= 16 {
        4
    } else {
        2
    }
}

/// `s[gi * CHUNK + j] = scale * q[gi] · k[j]` for `NG` heads: each score is one
/// lane-wise FMA chain over the head dim, then `S::reduce`'s tree (by
/// `S::reduce4`/`reduce2`, the same bits). Keys go in blocks of
/// `J` so that each K vector feeds `NG` chains and each q vector `J` (loads per FMA
/// about 1/2 instead of 4/3). Prefetches the rows `pf` (the next chunk) one row per
/// key (prefetches never change a result).
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
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        for &pj in pf {
            let mut d = 0;
            while d < hd {
                S::prefetch(kp.add(pj + d) as *const f32);
                d += per_line::<E>();
            }
        }
        let (n, jb) = (off.len(), block::<S>());
        let mut j = 0;
        while j + jb <= n {
            if jb == 4 {
                score_block::<S, E, NG, 4>(q, kp, &off[j..j + 4], hd, scale, s.add(j));
            } else {
                score_block::<S, E, NG, 2>(q, kp, &off[j..j + 2], hd, scale, s.add(j));
            }
            j += jb;
        }
        while j < n {
            score_block::<S, E, NG, 1>(q, kp, &off[j..j + 1], hd, scale, s.add(j));
            j += 1;
        }
    }
}

/// [`scores`] for the `J` keys `off` (`J` = `off.len()`), written at `s[gi * CHUNK + j]`.
#[inline(always)]
unsafe fn score_block<S: Simd, E: KvElem, const NG: usize, const J: usize>(
    q: *const f32,
    kp: *const E,
    off: &[usize],
    hd: usize,
    scale: f32,
    s: *mut f32,
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let k: [*const E; J] = std::array::from_fn(|jj| kp.add(off[jj]));
        let mut acc = [[S::zero(); J]; NG];
        let mut d = 0;
        while d < hd {
            let kv: [S::V; J] = std::array::from_fn(|jj| E::load::<S>(k[jj].add(d)));
            for (gi, a) in acc.iter_mut().enumerate() {
                let qv = S::load(q.add(gi * hd + d));
                for (x, &kx) in a.iter_mut().zip(kv.iter()) {
                    *x = S::fma(qv, kx, *x);
                }
            }
            d += S::LANES;
        }
        for (gi, a) in acc.iter().enumerate() {
            let r: [f32; J] = match J {
                4 => pad(S::reduce4([a[0], a[1], a[2], a[3]])),
                2 => pad(S::reduce2([a[0], a[1]])),
                _ => std::array::from_fn(|jj| S::reduce(a[jj])),
            };
            for (jj, x) in r.iter().enumerate() {
                *s.add(gi * CHUNK + jj) = x * scale;
            }
        }
    }
}

/// `x` as an array of `J >= N` (only called with `J == N`).
#[inline(always)]
fn pad<const N: usize, const J: usize>(x: [f32; N]) -> [f32; J] {
    std::array::from_fn(|i| x[i])
}

/// `o[gi] += sum_j p[gi * CHUNK + j] * v[j]` for `NG` heads: each output element
/// one FMA chain in key order. The head dim goes in blocks of `block` vectors kept
/// in registers across the chunk, so each V vector feeds `NG` chains and each `p`
/// broadcast a block. Prefetches the rows `pf`, one cache line of each per line of
/// columns.
#[inline(always)]
unsafe fn accumulate<S: Simd, E: KvElem, const NG: usize>(
    o: *mut f32,
    vp: *const E,
    off: &[usize],
    pf: &[usize],
    hd: usize,
    p: *const f32,
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let db = block::<S>() * S::LANES;
        let mut d = 0;
        while d < hd {
            let w = if d + db <= hd { db } else { S::LANES };
            let mut x = d;
            while x < d + w {
                for &pj in pf {
                    S::prefetch(vp.add(pj + x) as *const f32);
                }
                x += per_line::<E>();
            }
            match w / S::LANES {
                4 => accumulate_block::<S, E, NG, 4>(o.add(d), vp.add(d), off, hd, p),
                2 => accumulate_block::<S, E, NG, 2>(o.add(d), vp.add(d), off, hd, p),
                _ => accumulate_block::<S, E, NG, 1>(o.add(d), vp.add(d), off, hd, p),
            }
            d += w;
        }
    }
}

/// [`accumulate`] for the `DB` vectors of columns at `o`/`vp` (already offset).
#[inline(always)]
unsafe fn accumulate_block<S: Simd, E: KvElem, const NG: usize, const DB: usize>(
    o: *mut f32,
    vp: *const E,
    off: &[usize],
    hd: usize,
    p: *const f32,
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let mut acc: [[S::V; DB]; NG] = std::array::from_fn(|gi| {
            std::array::from_fn(|b| S::load(o.add(gi * hd + b * S::LANES)))
        });
        for (j, &oj) in off.iter().enumerate() {
            let vv: [S::V; DB] = std::array::from_fn(|b| E::load::<S>(vp.add(oj + b * S::LANES)));
            for (gi, a) in acc.iter_mut().enumerate() {
                let pj = S::splat(*p.add(gi * CHUNK + j));
                for (x, &v) in a.iter_mut().zip(vv.iter()) {
                    *x = S::fma(pj, v, *x);
                }
            }
        }
        for (gi, a) in acc.iter().enumerate() {
            for (b, x) in a.iter().enumerate() {
                S::store(o.add(gi * hd + b * S::LANES), *x);
            }
        }
    }
}

/// The online-softmax state of `group` heads of one query row, within one split:
/// running maxima `m`, sums `l`, unnormalised outputs `o` (`[group, head_dim]`).
pub struct SplitState<'a> {
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub o: &'a mut [f32],
}

impl SplitState<'_> {
    /// The state before any key.
    #[inline(always)]
    pub fn reset(&mut self) {
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.o.fill(0.0);
    }
}

/// One chunk of keys (`off`: their element offsets from `k`/`v`, at most
/// [`CHUNK`], all inside one chunk of [`chunk_keys`]) for `group = st.m.len()` heads
/// whose query rows are `q[group, head_dim]` (contiguous): scores, soft cap,
/// online-softmax update, `o += p · v`. `pf`: row offsets to prefetch (the next
/// chunk's), or empty. `s` is scratch.
///
/// # Safety
/// `S`'s instruction set is available; `q` holds `group * head_dim` floats;
/// `k + off[j] .. + head_dim` and the same of `v` are inside their pools for every
/// `j` (and of `pf`); `head_dim` is a multiple of `S::LANES`; `group <= MAX_GROUP`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn chunk_step<S: Simd, E: KvElem>(
    p: &RowParams,
    q: *const f32,
    k: *const E,
    v: *const E,
    off: &[usize],
    pf: &[usize],
    st: &mut SplitState<'_>,
    s: &mut [f32; MAX_GROUP * CHUNK],
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let (g_n, hd, n) = (st.m.len(), p.head_dim, off.len());
        debug_assert!(g_n <= MAX_GROUP && n <= CHUNK && st.o.len() == g_n * hd);
        let mut g = 0;
        while g < g_n {
            let (qg, sg) = (q.add(g * hd), s.as_mut_ptr().add(g * CHUNK));
            let pf: &[usize] = if g == 0 { pf } else { &[] };
            match g_n - g {
                1 => scores::<S, E, 1>(qg, k, off, pf, hd, p.scale, sg),
                2 => scores::<S, E, 2>(qg, k, off, pf, hd, p.scale, sg),
                3 => scores::<S, E, 3>(qg, k, off, pf, hd, p.scale, sg),
                _ => scores::<S, E, 4>(qg, k, off, pf, hd, p.scale, sg),
            }
            g += 4;
        }
        // Online softmax: rescale each head's running output to its new maximum.
        for gi in 0..g_n {
            let row = &mut s[gi * CHUNK..(gi + 1) * CHUNK];
            if let Some(c) = p.soft_cap {
                for x in row[..n].iter_mut() {
                    *x = c * (*x / c).tanh();
                }
            }
            row[n..].fill(f32::NEG_INFINITY);
            let cm = S::max16(row.as_ptr());
            let m_new = st.m[gi].max(cm);
            if m_new > st.m[gi] {
                let corr = exp_fast(st.m[gi] - m_new);
                st.l[gi] *= corr;
                let oo = st.o.as_mut_ptr().add(gi * hd);
                let cv = S::splat(corr);
                let mut d = 0;
                while d < hd {
                    S::store(oo.add(d), S::mul(S::load(oo.add(d)), cv));
                    d += S::LANES;
                }
                st.m[gi] = m_new;
            }
            // Whole-chunk loop so that it vectorises; lanes past n are zeroed after.
            for x in row.iter_mut() {
                *x = exp_fast(*x - m_new);
            }
            row[n..].fill(0.0);
            st.l[gi] += S::sum16(row.as_ptr());
        }
        let mut g = 0;
        while g < g_n {
            let (og, pg) = (st.o.as_mut_ptr().add(g * hd), s.as_ptr().add(g * CHUNK));
            let pf: &[usize] = if g == 0 { pf } else { &[] };
            match g_n - g {
                1 => accumulate::<S, E, 1>(og, v, off, pf, hd, pg),
                2 => accumulate::<S, E, 2>(og, v, off, pf, hd, pg),
                3 => accumulate::<S, E, 3>(og, v, off, pf, hd, pg),
                _ => accumulate::<S, E, 4>(og, v, off, pf, hd, pg),
            }
            g += 4;
        }
    }
}

/// Ends a split: `o /= l` per head and `m` becomes the split's log-sum-exp
/// (`-inf`, with `o` left zero, for a head that saw no key).
#[inline(always)]
pub fn finish_split(st: &mut SplitState<'_>, head_dim: usize) {
    for (gi, (m, &l)) in st.m.iter_mut().zip(st.l.iter()).enumerate() {
        if l > 0.0 {
            let inv = 1.0 / l;
            st.o[gi * head_dim..(gi + 1) * head_dim]
                .iter_mut()
                .for_each(|x| *x *= inv);
            *m += l.ln();
        } else {
            *m = f32::NEG_INFINITY;
        }
    }
}

/// The merge of one head's splits, folded in position order: the running
/// log-sum-exp maximum `m`, weight sum `l` and weighted output `o`.
pub struct Merge<'a> {
    pub m: &'a mut f32,
    pub l: &'a mut f32,
    pub o: &'a mut [f32],
}

impl Merge<'_> {
    /// Before the first split.
    #[inline(always)]
    pub fn reset(&mut self) {
        *self.m = f32::NEG_INFINITY;
        *self.l = 0.0;
        self.o.fill(0.0);
    }

    /// Folds in the next split's normalised output `part_o` with log-sum-exp
    /// `part_lse` (skipped when `-inf`: it saw no key).
    #[inline(always)]
    pub fn add(&mut self, part_lse: f32, part_o: &[f32]) {
        if part_lse == f32::NEG_INFINITY {
            return;
        }
        let m_new = self.m.max(part_lse);
        let a = (*self.m - m_new).exp();
        let b = (part_lse - m_new).exp();
        *self.l = *self.l * a + b;
        for (x, &y) in self.o.iter_mut().zip(part_o) {
            *x = *x * a + b * y;
        }
        *self.m = m_new;
    }

    /// Writes the merged output into `out` and returns its log-sum-exp (zeros and
    /// `-inf` when no split saw a key).
    #[inline(always)]
    pub fn finish(&self, out: &mut [f32]) -> f32 {
        if *self.l > 0.0 {
            let inv = 1.0 / *self.l;
            for (x, &y) in out.iter_mut().zip(self.o.iter()) {
                *x = y * inv;
            }
            *self.m + self.l.ln()
        } else {
            out.fill(0.0);
            f32::NEG_INFINITY
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_cut_at_positions() {
        let s: Vec<_> = splits(0, 600).collect();
        assert_eq!(s, vec![(0, 256), (256, 512), (512, 600)]);
        let s: Vec<_> = splits(300, 520).collect();
        assert_eq!(s, vec![(300, 512), (512, 520)]);
        assert_eq!(splits(5, 5).collect::<Vec<_>>(), vec![(5, 5)]);
        assert_eq!(splits(0, 256).collect::<Vec<_>>(), vec![(0, 256)]);
        assert_eq!(chunk_end(3, 16, 100), 16);
        assert_eq!(chunk_end(16, 16, 20), 20);
    }

    #[test]
    fn chunk_trees_are_the_max_and_a_sum() {
        use crate::simd::Portable;
        let row: Vec<f32> = (0..CHUNK)
            .map(|i| ((i * 7 % 11) as f32 - 3.0) * 0.37)
            .collect();
        for n in 0..=CHUNK {
            let want = row[..n].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut padded = row.clone();
            padded[n..].fill(f32::NEG_INFINITY);
            // SAFETY: `padded` holds CHUNK = 16 floats; Portable needs no feature.
            assert_eq!(unsafe { Portable::max16(padded.as_ptr()) }, want, "n = {n}");
            padded[n..].fill(0.0);
            let exact: f64 = row[..n].iter().map(|&x| x as f64).sum();
            // SAFETY: as above.
            let got = unsafe { Portable::sum16(padded.as_ptr()) } as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                "n = {n}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn merge_of_one_split_is_that_split() {
        let (mut m, mut l, mut o) = (0.0, 0.0, vec![0.0; 3]);
        let mut g = Merge {
            m: &mut m,
            l: &mut l,
            o: &mut o,
        };
        g.reset();
        g.add(f32::NEG_INFINITY, &[9.0, 9.0, 9.0]);
        g.add(1.5, &[1.0, -2.0, 0.25]);
        let mut out = vec![0.0; 3];
        assert_eq!(g.finish(&mut out), 1.5);
        assert_eq!(out, vec![1.0, -2.0, 0.25]);
    }
}
