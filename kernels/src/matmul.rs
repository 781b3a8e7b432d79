//! What the packed GEMMs share with any `out = x · wᵀ` (`w` in PyTorch `nn.Linear`
//! layout, `[n, k]` row-major): shape checks, the empty shapes, the shared output
//! pointer, and [`matmul_t_ref`], the slow reference every GEMM is tested against.
//!
//! The unpacked fast paths (`matmul_t`: AVX-512 GEMV/GEMM tiles, a portable GEMV,
//! the `gemm` crate) served no path once the model packed its weights; they live on
//! in `pagoda-benches` (`benches/src/unpacked`) as the baseline of the matmul bench.

use crate::error::{check_len, KernelError};

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

/// The output pointer shared by parallel tasks that write disjoint parts of it
/// (panel blocks in `packed`).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: an `OutPtr` is made from a `&mut [f32]` that stays borrowed for the whole
// parallel call, and the tasks holding copies write disjoint elements through it.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: concurrent users write disjoint elements only.
unsafe impl Sync for OutPtr {}
impl OutPtr {
    // A method (not field access) so closures capture the whole Sync wrapper.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// Slow reference: plain loops with f64 accumulation.
pub fn matmul_t_ref(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    check(x, w, out, m, k, n)?;
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for c in 0..k {
                s += x[i * k + c] as f64 * w[j * k + c] as f64;
            }
            out[i * n + j] = s as f32;
        }
    }
    Ok(())
}
