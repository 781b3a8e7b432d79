//! AVX-512 kernels for `out = x · wᵀ` with `w` in `nn.Linear` layout (`[n, k]`).
//!
//! Both operands are contiguous along `k`, so every kernel here is a tile of dot
//! products: `M` rows of `x` against `R` rows of `w`, with `M * R` vector
//! accumulators that are summed horizontally once at the end. Each vector of `w`
//! loaded feeds `M` FMAs and each vector of `x` feeds `R`, and no packing is
//! needed: decode (small `m`) streams `w` exactly once, prefill reuses a chunk of
//! `w` held in L2 across all row tiles of `x`.
//!
//! The bf16 variants (`w` stored as bf16) round each loaded vector of `x` to bf16
//! (`vcvtne2ps2bf16`, reused for all `R` rows of the tile, so no buffer is needed)
//! and use `vdpbf16ps` (pairs of bf16 products accumulated in f32), reading half
//! the bytes of f32 weights.
//!
//! Callers check the CPU features ([`pagoda_kernels::Isa::detect`]: `avx512()` for the f32
//! kernels, `avx512_bf16()` for the bf16 ones) before calling anything `unsafe` here.

#![cfg(target_arch = "x86_64")]
// Constant-bound index loops over the accumulator tiles are what unrolls into
// register-resident code; iterator chains kept more of them on the stack.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

/// Raw pointers of one call, shared by the parallel tasks. Tasks write disjoint
/// output columns (`w` rows), so sharing the output pointer is sound.
pub(crate) struct Args<T> {
    /// Activations are always f32 (the bf16 kernels round them as they load).
    pub x: *const f32,
    pub w: *const T,
    pub out: *mut f32,
    pub k: usize,
    pub n: usize,
}
impl<T> Clone for Args<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Args<T> {}
// SAFETY: an `Args` only lives inside one `drive` call, while the slices behind its
// pointers are borrowed by the caller (`x` and `w` shared, `out` exclusively), and
// the tasks that receive copies write disjoint output columns and only read `x`/`w`.
unsafe impl<T> Send for Args<T> {}
// SAFETY: as for `Send`: shared use is reads of `x`/`w` and disjoint writes to `out`.
unsafe impl<T> Sync for Args<T> {}

/// `M` rows of `x` (from row `i0`) times `R` rows of `w` (from row `j0`), f32.
///
/// # Safety
/// AVX-512 F available; `i0 + M <= m`, `j0 + R <= n` for the buffers behind `a`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile_f32<const M: usize, const R: usize>(a: Args<f32>, i0: usize, j0: usize) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let k = a.k;
        let xp = a.x.add(i0 * k);
        let wp = a.w.add(j0 * k);
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        // Peel up to 15 elements so the loads of w's first row are 64-byte aligned (so
        // are the other rows' when k·4 is a multiple of 64, as in every model shape):
        // a split load costs two cache-line reads, ~10% of the streaming rate.
        let head = ((64 - (wp as usize & 63)) & 63) / 4;
        if head > 0 && head < k {
            let mask: __mmask16 = (1u32 << head) as u16 - 1;
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm512_maskz_loadu_ps(mask, wp.add(r * k));
            }
            for i in 0..M {
                let xv = _mm512_maskz_loadu_ps(mask, xp.add(i * k));
                for r in 0..R {
                    acc[i][r] = _mm512_fmadd_ps(xv, wv[r], acc[i][r]);
                }
            }
        }
        let mut c = if head < k { head } else { 0 };
        while c + 16 <= k {
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm512_loadu_ps(wp.add(r * k + c));
            }
            for i in 0..M {
                let xv = _mm512_loadu_ps(xp.add(i * k + c));
                for r in 0..R {
                    acc[i][r] = _mm512_fmadd_ps(xv, wv[r], acc[i][r]);
                }
            }
            c += 16;
        }
        if c < k {
            // Masked tail: lanes past k load as zero.
            let mask: __mmask16 = (1u32 << (k - c)) as u16 - 1;
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = _mm512_maskz_loadu_ps(mask, wp.add(r * k + c));
            }
            for i in 0..M {
                let xv = _mm512_maskz_loadu_ps(mask, xp.add(i * k + c));
                for r in 0..R {
                    acc[i][r] = _mm512_fmadd_ps(xv, wv[r], acc[i][r]);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (r, s) in row.iter().enumerate() {
                *a.out.add((i0 + i) * a.n + j0 + r) = _mm512_reduce_add_ps(*s);
            }
        }
    }
}

/// `cnt` (1..=32) f32 values from `p` rounded to bf16 (nearest even); lanes past
/// `cnt` are +0.0.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn load_x_bf16(p: *const f32, cnt: usize) -> __m512bh {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        if cnt >= 32 {
            return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p));
        }
        let lo_n = cnt.min(16);
        let hi_n = cnt - lo_n;
        let lo = _mm512_maskz_loadu_ps(((1u32 << lo_n) - 1) as u16, p);
        let hi = _mm512_maskz_loadu_ps(((1u32 << hi_n) - 1) as u16, p.add(lo_n));
        // The second argument fills the low 16 lanes.
        _mm512_cvtne2ps_pbh(hi, lo)
    }
}

/// `M` rows of f32 `x` (rounded to bf16 as loaded, each vector reused for the `R`
/// rows) times `R` rows of bf16 `w`, accumulated in f32.
///
/// # Safety
/// AVX-512 F/BW/BF16 available; `i0 + M <= m`, `j0 + R <= n`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn tile_bf16<const M: usize, const R: usize>(a: Args<u16>, i0: usize, j0: usize) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let k = a.k;
        let xp = a.x.add(i0 * k);
        let wp = a.w.add(j0 * k);
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        // Peel to a 64-byte aligned w (see tile_f32).
        let head = ((64 - (wp as usize & 63)) & 63) / 2;
        if head > 0 && head < k {
            let mask: __mmask32 = ((1u64 << head) - 1) as u32;
            let mut wv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                wv[r] = _mm512_maskz_loadu_epi16(mask, wp.add(r * k) as *const i16);
            }
            for i in 0..M {
                let xv = load_x_bf16(xp.add(i * k), head);
                for r in 0..R {
                    acc[i][r] = _mm512_dpbf16_ps(
                        acc[i][r],
                        xv,
                        std::mem::transmute::<__m512i, __m512bh>(wv[r]),
                    );
                }
            }
        }
        let mut c = if head < k { head } else { 0 };
        while c + 32 <= k {
            let mut wv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                wv[r] = _mm512_loadu_si512(wp.add(r * k + c) as *const _);
            }
            for i in 0..M {
                let xv = load_x_bf16(xp.add(i * k + c), 32);
                for r in 0..R {
                    acc[i][r] = _mm512_dpbf16_ps(
                        acc[i][r],
                        xv,
                        std::mem::transmute::<__m512i, __m512bh>(wv[r]),
                    );
                }
            }
            c += 32;
        }
        if c < k {
            // Masked tail: bf16 lanes past k load as +0.0.
            let mask: __mmask32 = ((1u64 << (k - c)) - 1) as u32;
            let mut wv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                wv[r] = _mm512_maskz_loadu_epi16(mask, wp.add(r * k + c) as *const i16);
            }
            for i in 0..M {
                let xv = load_x_bf16(xp.add(i * k + c), k - c);
                for r in 0..R {
                    acc[i][r] = _mm512_dpbf16_ps(
                        acc[i][r],
                        xv,
                        std::mem::transmute::<__m512i, __m512bh>(wv[r]),
                    );
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (r, s) in row.iter().enumerate() {
                *a.out.add((i0 + i) * a.n + j0 + r) = _mm512_reduce_add_ps(*s);
            }
        }
    }
}

/// A tile kernel: `(args, i0, j0)`.
pub(crate) type TileFn<T> = unsafe fn(Args<T>, usize, usize);

/// The GEMV tile for `m` rows (1..=8) of `x`: `R` rows of `w` such that `m·R <= 16`
/// accumulators, so `x` is reused across `R` rows and each `w` vector across all
/// `m` rows. (Measured: rustc 1.95 keeps tiles of up to 16 accumulators in
/// registers; from 18 on they live on the stack, a load and a store per FMA, which
/// made 4x5 and 8x3 tiles up to 1.6x slower than 4x1.)
/// Returns the kernel, its `R`, and the one-row kernel for the `n % R` tail.
pub(crate) fn gemv_tiles_f32(m: usize) -> (TileFn<f32>, usize, TileFn<f32>) {
    macro_rules! pick {
        ($($m:literal => $r:literal),*) => {
            match m {
                $($m => (tile_f32::<$m, $r> as TileFn<f32>, $r, tile_f32::<$m, 1> as TileFn<f32>),)*
                _ => unreachable!("gemv tiles are for m = 1..=8"),
            }
        };
    }
    pick!(1 => 8, 2 => 8, 3 => 5, 4 => 4, 5 => 3, 6 => 2, 7 => 2, 8 => 2)
}

/// [`gemv_tiles_f32`] for bf16.
pub(crate) fn gemv_tiles_bf16(m: usize) -> (TileFn<u16>, usize, TileFn<u16>) {
    macro_rules! pick {
        ($($m:literal => $r:literal),*) => {
            match m {
                $($m => (tile_bf16::<$m, $r> as TileFn<u16>, $r, tile_bf16::<$m, 1> as TileFn<u16>),)*
                _ => unreachable!("gemv tiles are for m = 1..=8"),
            }
        };
    }
    pick!(1 => 8, 2 => 8, 3 => 5, 4 => 4, 5 => 3, 6 => 2, 7 => 2, 8 => 2)
}

/// Rows of `x` per GEMM tile and the matching `w` rows: 4·4 = 16 accumulators (the
/// most that stay in registers, see [`gemv_tiles_f32`]); per 16 (f32) or 32 (bf16)
/// `k` it loads 8 vectors for 16 FMAs.
pub(crate) const GEMM_MT: usize = 4;
pub(crate) const GEMM_R: usize = 4;

/// Tile kernels of one call: `main[h]` is `h` rows × `r` columns, `tail[h]` is `h`
/// rows × 1 column (for `n % r`), for `h` in `1..=mt`.
pub(crate) struct Tiles<T> {
    pub mt: usize,
    pub r: usize,
    pub main: [Option<TileFn<T>>; 9],
    pub tail: [Option<TileFn<T>>; 9],
}

pub(crate) fn gemm_tiles_f32() -> Tiles<f32> {
    let mut t = Tiles {
        mt: GEMM_MT,
        r: GEMM_R,
        main: [None; 9],
        tail: [None; 9],
    };
    t.main[1] = Some(tile_f32::<1, GEMM_R>);
    t.main[2] = Some(tile_f32::<2, GEMM_R>);
    t.main[3] = Some(tile_f32::<3, GEMM_R>);
    t.main[4] = Some(tile_f32::<4, GEMM_R>);
    t.tail[1] = Some(tile_f32::<1, 1>);
    t.tail[2] = Some(tile_f32::<2, 1>);
    t.tail[3] = Some(tile_f32::<3, 1>);
    t.tail[4] = Some(tile_f32::<4, 1>);
    t
}

pub(crate) fn gemm_tiles_bf16() -> Tiles<u16> {
    let mut t = Tiles {
        mt: GEMM_MT,
        r: GEMM_R,
        main: [None; 9],
        tail: [None; 9],
    };
    t.main[1] = Some(tile_bf16::<1, GEMM_R>);
    t.main[2] = Some(tile_bf16::<2, GEMM_R>);
    t.main[3] = Some(tile_bf16::<3, GEMM_R>);
    t.main[4] = Some(tile_bf16::<4, GEMM_R>);
    t.tail[1] = Some(tile_bf16::<1, 1>);
    t.tail[2] = Some(tile_bf16::<2, 1>);
    t.tail[3] = Some(tile_bf16::<3, 1>);
    t.tail[4] = Some(tile_bf16::<4, 1>);
    t
}

/// A GEMV tile picker: `m` to (kernel, its `R`, one-row kernel).
pub(crate) type GemvPick<T> = fn(usize) -> (TileFn<T>, usize, TileFn<T>);

pub(crate) fn gemv_tiles<T>(m: usize, pick: GemvPick<T>) -> Tiles<T> {
    let (main, r, tail) = pick(m);
    let mut t = Tiles {
        mt: m,
        r,
        main: [None; 9],
        tail: [None; 9],
    };
    t.main[m] = Some(main);
    t.tail[m] = Some(tail);
    t
}

/// Runs `tiles` over the whole `m × n` output: tasks own chunks of `w` rows
/// (output columns); inside a chunk, row tiles of `x` are the outer loop so the
/// chunk of `w` stays in L2 while each `x` tile stays in L1.
///
/// # Safety
/// The CPU features of `tiles` are available; `a` describes valid `m × k`, `n × k`
/// and `m × n` buffers; every row count `h` the loop meets (`mt`, `m % mt`) has
/// kernels in `tiles`.
pub(crate) unsafe fn drive<T>(
    a: Args<T>,
    m: usize,
    tiles: &Tiles<T>,
    bytes_per_elem: usize,
    parallel: bool,
) {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        let (mt, r, n, k) = (tiles.mt, tiles.r, a.n, a.k);
        let task = |j0: usize, j1: usize| {
            let mut i = 0;
            while i < m {
                let h = mt.min(m - i);
                // SAFETY (both calls): h has kernels (caller's contract); i + h <= m and
                // the column ranges stay below j1 <= n.
                let (main, tail) = (tiles.main[h].unwrap(), tiles.tail[h].unwrap());
                let mut j = j0;
                while j + r <= j1 {
                    main(a, i, j);
                    j += r;
                }
                while j < j1 {
                    tail(a, i, j);
                    j += 1;
                }
                i += h;
            }
        };
        if !parallel {
            task(0, n);
            return;
        }
        // Chunk of w rows per task: at most ~256 KiB (L2-resident while all of x's row
        // tiles pass over it), a multiple of r, and at least 8 tasks per thread when n
        // allows, so a core slowed by other work does not hold the others up.
        let threads = rayon::current_num_threads();
        let by_cache = (256 << 10) / (k * bytes_per_elem).max(1);
        let by_balance = n.div_ceil(threads * 8);
        let chunk = (by_cache.min(by_balance) / r).max(1) * r;
        let tasks = n.div_ceil(chunk);
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(|t| {
            let j0 = t * chunk;
            task(j0, (j0 + chunk).min(n));
        });
    }
}
