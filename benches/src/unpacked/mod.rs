//! The unpacked matmul family, kept here as the baseline the packed GEMMs of
//! `pagoda_kernels::packed` are measured against (no serving path uses it).
//!
//! `out = x · wᵀ` with `w` in PyTorch `nn.Linear` layout (`[n, k]`, row-major),
//! unpacked: for callers that cannot pack `w` once (the model packs its weights and
//! uses `pagoda_kernels::packed`, which is faster at every size).
//!
//! On CPUs with AVX-512 (the serving target) `m = 1` runs the parallel AVX-512
//! GEMV of `avx512.rs` (streams `w` once on every core), `m = 2..=4` the portable
//! row-streaming GEMV below, and `m >= 5` (batched decode, prefill) the AVX-512
//! 4x4 register tiles over L2-resident chunks of `w`. Elsewhere: the `gemm` crate (strided, so
//! `w` is never transposed in memory) for `m == 1` and prefill-sized `m`, and a
//! portable GEMV for small `m` (2..=8) that streams each weight row once per four
//! inputs. `pagoda_kernels::matmul_t_ref` is the slow reference all are tested against.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod bf16;

pub use bf16::{matmul_t_bf16, matmul_t_bf16_ref, matmul_t_bf16_with, to_bf16, Bf16Path};
use pagoda_kernels::{Isa, KernelError};
use rayon::prelude::*;

/// Checks that a buffer has exactly `expected` elements.
fn check_len(name: &'static str, actual: usize, expected: usize) -> Result<(), KernelError> {
    if actual != expected {
        return Err(KernelError::ShapeMismatch {
            name,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Rows of `x` the GEMV kernel handles per pass over the weights (register budget).
pub const GEMV_MAX_M: usize = 4;

/// Largest `m` that [`matmul_t`] sends to the portable GEMV path (CPUs without AVX-512).
pub const GEMV_AUTO_MAX_M: usize = 8;

/// On AVX-512 CPUs, the largest `m` that [`matmul_t`] (and `matmul_t_bf16`) send to
/// a GEMV path; above it, the AVX-512 GEMM tiles.
pub const AVX512_GEMV_MAX_M: usize = 4;

/// Below this many multiply-adds a call runs on the calling thread only.
const PARALLEL_MIN_FLOPS: usize = 1 << 16;

/// Which implementation [`matmul_t_with`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPath {
    /// Pick per shape (what [`matmul_t`] does).
    Auto,
    /// The `gemm` crate.
    Gemm,
    /// The portable row-streaming GEMV (any `m`; fast only for small `m`).
    Gemv,
    /// The AVX-512 GEMV tiles (any `m`, in groups of 8 rows; fast for small `m`).
    /// Falls back to [`MatmulPath::Gemv`] without AVX-512.
    Avx512Gemv,
    /// The AVX-512 GEMM tiles (any `m`; fast for prefill-sized `m`). Falls back to
    /// [`MatmulPath::Gemm`] without AVX-512.
    Avx512Gemm,
}

/// Buffer lengths of `x[m, k]`, `w[n, k]` (any weight element type) and `out[m, n]`.
pub(crate) fn check<W>(
    x: &[f32],
    w: &[W],
    out: &[f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    check_len("x", x.len(), m * k)?;
    check_len("w", w.len(), n * k)?;
    check_len("out", out.len(), m * n)
}

/// Handles the empty shapes (an empty `k` gives zeros); true when nothing is left to do.
pub(crate) fn trivial(out: &mut [f32], m: usize, k: usize, n: usize) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        out.fill(0.0);
        return true;
    }
    false
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`, choosing the faster path for the shape.
pub fn matmul_t(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    matmul_t_with(MatmulPath::Auto, x, w, out, m, k, n)
}

/// [`matmul_t`] with an explicit path (benches and tests compare them).
pub fn matmul_t_with(
    path: MatmulPath,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    check(x, w, out, m, k, n)?;
    if trivial(out, m, k, n) {
        return Ok(());
    }
    let avx = Isa::detect().avx512();
    let path = match path {
        // Measured (benches/matmul.rs and examples/matmul_ab.rs, SmolLM2 shapes,
        // cold weights, shared 2-core Zen machine, interleaved). m = 1: called
        // alone, gemm's single-thread GEMV streams fastest (~30-37 GB/s vs 22-30
        // for the parallel AVX-512 GEMV), but inside a real decode step (run on a
        // rayon worker) the AVX-512 GEMV makes the step 6-10% faster
        // (decode_step_timing, A/B interleaved, 6 of 7 pairs), so it is the
        // default. m = 2..=4: the portable GEMV (one weight row at a time against
        // all m rows) streams 1.2-1.4x faster than the AVX-512 GEMV tiles and
        // ~2.5x gemm. m >= 5: the AVX-512 4x4 GEMM tiles (1.3-1.9x the GEMVs at
        // m = 8, 1.8x gemm at m = 32, 1.4-1.7x at m = 128..512).
        MatmulPath::Auto if m == 1 && avx && m1_avx512() => MatmulPath::Avx512Gemv,
        MatmulPath::Auto if m == 1 => MatmulPath::Gemm,
        MatmulPath::Auto if avx && m <= AVX512_GEMV_MAX_M => MatmulPath::Gemv,
        MatmulPath::Auto if avx => MatmulPath::Avx512Gemm,
        MatmulPath::Avx512Gemv if !avx => MatmulPath::Gemv,
        MatmulPath::Avx512Gemm if !avx => MatmulPath::Gemm,
        // Without AVX-512 (measured before the AVX-512 kernels): gemm's own m = 1
        // kernel is 0-30% faster than ours; for m = 2..=8 ours is 1.2-3x faster
        // (gemm packs and re-reads the weights); at m = 32 gemm wins 1.6x.
        MatmulPath::Auto if (2..=GEMV_AUTO_MAX_M).contains(&m) => MatmulPath::Gemv,
        MatmulPath::Auto => MatmulPath::Gemm,
        p => p,
    };
    match path {
        MatmulPath::Gemv => gemv(x, w, out, m, k, n),
        #[cfg(target_arch = "x86_64")]
        MatmulPath::Avx512Gemv => avx512_gemv(x, w, out, m, k, n),
        #[cfg(target_arch = "x86_64")]
        MatmulPath::Avx512Gemm => avx512_gemm(x, w, out, m, k, n),
        _ => gemm_path(x, w, out, m, k, n),
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn avx512_gemv(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    use crate::unpacked::avx512::{drive, gemv_tiles, gemv_tiles_f32, Args};
    // Groups of up to 8 rows of x, each streaming w once.
    for i0 in (0..m).step_by(8) {
        let mg = (m - i0).min(8);
        let a = Args {
            x: x[i0 * k..].as_ptr(),
            w: w.as_ptr(),
            out: out[i0 * n..].as_mut_ptr(),
            k,
            n,
        };
        let tiles = gemv_tiles(mg, gemv_tiles_f32);
        // SAFETY: AVX-512 F was detected by the caller; x holds mg rows from i0, w
        // n rows, out mg rows of n from i0 (lengths checked); tiles has kernels for mg.
        unsafe { drive(a, mg, &tiles, 4, parallel(mg, k, n)) };
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512_gemm(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    use crate::unpacked::avx512::{drive, gemm_tiles_f32, Args};
    let a = Args {
        x: x.as_ptr(),
        w: w.as_ptr(),
        out: out.as_mut_ptr(),
        k,
        n,
    };
    // SAFETY: AVX-512 F was detected by the caller; the buffers have the checked
    // lengths; the GEMM tiles cover every row count 1..=GEMM_MT.
    unsafe { drive(a, m, &gemm_tiles_f32(), 4, parallel(m, k, n)) };
}

/// `PAGODA_MATMUL_M1=gemm` (read once) sends `m = 1` to gemm's single-thread GEMV
/// instead of the parallel AVX-512 one (for A/B measurements).
fn m1_avx512() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("PAGODA_MATMUL_M1").map_or(true, |v| v != "gemm"))
}

/// Whether a call of this size is worth splitting over the rayon pool.
pub(crate) fn parallel(m: usize, k: usize, n: usize) -> bool {
    m * k * n >= PARALLEL_MIN_FLOPS && rayon::current_num_threads() > 1
}

fn gemm_path(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    let par = if m * k * n >= PARALLEL_MIN_FLOPS && rayon::current_num_threads() > 1 {
        // 0 = the current (global) rayon pool's size, so we never oversubscribe.
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: lengths were checked: x is m*k (row stride k), w is n*k read as the
    // k×n matrix wᵀ (row stride 1, column stride k), out is m*n (row stride n).
    // read_dst = false, so out's old contents are ignored.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

/// Output rows (of `w`) per rayon task: big enough to amortise scheduling.
const GEMV_ROWS_PER_TASK: usize = 64;

fn gemv(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    // Process inputs in groups of up to GEMV_MAX_M so each weight row is read once per group.
    for i0 in (0..m).step_by(GEMV_MAX_M) {
        let mg = (m - i0).min(GEMV_MAX_M);
        let xg = &x[i0 * k..(i0 + mg) * k];
        let og = &mut out[i0 * n..(i0 + mg) * n];
        gemv_group(xg, w, og, mg, k, n);
    }
}

fn gemv_group(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    let parallel = m * k * n >= PARALLEL_MIN_FLOPS && rayon::current_num_threads() > 1;
    let fma = Isa::detect().avx2_fma();
    let dst = OutPtr(out.as_mut_ptr());
    // Each task owns the output columns j0..j0+len of every one of the m rows, so
    // the writes of different tasks never overlap.
    let block = |b: usize| {
        let j0 = b * GEMV_ROWS_PER_TASK;
        let len = (n - j0).min(GEMV_ROWS_PER_TASK);
        for j in j0..j0 + len {
            let acc = dot_rows_dispatch(fma, x, &w[j * k..(j + 1) * k], m, k);
            for (i, &a) in acc.iter().enumerate().take(m) {
                // SAFETY: i < m and j < n, so i*n + j < out.len() (= m*n, checked);
                // no other task writes column j (see above), and `out` is
                // exclusively borrowed for the whole call.
                unsafe { *dst.get().add(i * n + j) = a };
            }
        }
    };
    let blocks = n.div_ceil(GEMV_ROWS_PER_TASK);
    if parallel {
        (0..blocks).into_par_iter().for_each(block);
    } else {
        (0..blocks).for_each(block);
    }
}

/// The output pointer shared by parallel tasks that write disjoint parts of it
/// (GEMV columns).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: an `OutPtr` is made from a `&mut [f32]` that stays borrowed for the whole
// parallel call, and the tasks holding copies write disjoint elements through it.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: concurrent users write disjoint elements only.
unsafe impl Sync for OutPtr {}
impl OutPtr {
    // A method (not field access) so closures capture the whole Sync wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

fn dot_rows_dispatch(fma: bool, x: &[f32], row: &[f32], m: usize, k: usize) -> [f32; GEMV_MAX_M] {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: the CPU supports AVX2 and FMA (checked by the caller through `Isa`).
        return unsafe { dot_rows_avx2(x, row, m, k) };
    }
    let _ = fma;
    dot_rows::<false>(x, row, m, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2(x: &[f32], row: &[f32], m: usize, k: usize) -> [f32; GEMV_MAX_M] {
    dot_rows::<true>(x, row, m, k)
}

/// Lanes per accumulator: two AVX vectors, so the adds form independent chains.
const LANES: usize = 16;

/// Dot products of `row` with each of the `m` rows of `x`, reading `row` once.
/// Written as fixed-width lane arrays so the compiler vectorises it.
#[inline(always)]
fn dot_rows<const FMA: bool>(x: &[f32], row: &[f32], m: usize, k: usize) -> [f32; GEMV_MAX_M] {
    let mut acc = [[0.0f32; LANES]; GEMV_MAX_M];
    let full = k / LANES * LANES;
    let mut c = 0;
    while c < full {
        let wv: &[f32; LANES] = row[c..c + LANES].try_into().unwrap();
        for i in 0..m {
            let xv: &[f32; LANES] = x[i * k + c..i * k + c + LANES].try_into().unwrap();
            let a = &mut acc[i];
            for l in 0..LANES {
                a[l] = if FMA {
                    xv[l].mul_add(wv[l], a[l])
                } else {
                    a[l] + xv[l] * wv[l]
                };
            }
        }
        c += LANES;
    }
    let mut res = [0.0f32; GEMV_MAX_M];
    for i in 0..m {
        let mut s = acc[i].iter().sum::<f32>();
        for c in full..k {
            s += x[i * k + c] * row[c];
        }
        res[i] = s;
    }
    res
}
