//! What every GEMM of the crate shares: [`GemmImpl`] (the library on a `cuda:N` device),
//! [`GemmError`], and the checks of the dtype rule and of the operands' lengths.
//!
//! Below both implementations (`host.rs` and, feature `cuda`, `device.rs`) and the
//! `gemm` facade, so that they use these and not each other or their parent.

use pagoda_cuda_kernels::Dtype;

/// Which library runs the GEMM on a `cuda:N` device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmImpl {
    /// cuBLAS (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`): every dtype combination, any shape;
    /// libcublas is opened at run time.
    Cublas,
    /// The CUTLASS tensor-core kernel of `pagoda-cutlass`: bf16 or f16 in and out (the
    /// same dtype for x, w and out), n and k multiples of 8, 16-byte aligned buffers.
    Cutlass,
}

/// Why a GEMM could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    /// x and w differ in dtype, or out is neither x's dtype nor f32.
    #[error("gemm: unsupported dtypes x={x:?} w={w:?} out={out:?} (x and w must match; out is x's dtype or f32)")]
    Dtypes {
        /// x's dtype.
        x: Dtype,
        /// w's dtype.
        w: Dtype,
        /// out's dtype.
        out: Dtype,
    },
    /// A buffer's dtype has no GEMM here (fp8: KV caches only).
    #[error("gemm: {what} is {dtype}; the CUDA kernels do not read fp8 data yet")]
    UnsupportedDType {
        /// Which buffer (`x`, `w`, `out`).
        what: &'static str,
        /// Its dtype.
        dtype: pagoda_core::DType,
    },
    /// A buffer does not hold exactly the elements the shape needs.
    #[error("gemm: {what} has {actual} elements, m={m} n={n} k={k} needs {expected}")]
    Length {
        /// Which buffer (`x`, `w`, `out`).
        what: &'static str,
        /// Elements the shape needs.
        expected: usize,
        /// Elements it has.
        actual: usize,
        /// Rows of x and out.
        m: usize,
        /// Rows of w.
        n: usize,
        /// The reduction length.
        k: usize,
    },
    /// m·k, n·k or m·n overflows `usize`, or a size does not fit the library's `int`.
    #[error("gemm: shape m={m} n={n} k={k} too large ({why})")]
    TooLarge {
        /// Rows of x and out.
        m: usize,
        /// Rows of w.
        n: usize,
        /// The reduction length.
        k: usize,
        /// Which limit.
        why: &'static str,
    },
    /// The chosen implementation cannot run this problem (dtype combination, alignment).
    #[error("gemm ({implementation:?}): {reason}")]
    Unsupported {
        /// The implementation asked for.
        implementation: GemmImpl,
        /// Why not.
        reason: String,
    },
    /// A buffer is not on this GEMM's device, or a device address is unusable.
    #[error("gemm: {what}: {reason}")]
    Operand {
        /// Which buffer.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The device, the driver or the library cannot be used in this process.
    #[error("gemm ({implementation:?}) unavailable on cuda:{ordinal}: {reason}")]
    Unavailable {
        /// The implementation asked for.
        implementation: GemmImpl,
        /// The device.
        ordinal: usize,
        /// Why (no driver, no device, no libcublas, ...).
        reason: String,
    },
    /// The library reported an error for a launch.
    #[error("gemm ({implementation:?}) failed: {reason}")]
    Launch {
        /// The implementation.
        implementation: GemmImpl,
        /// Its error.
        reason: String,
    },
}

/// Checks the dtype rule: x and w of one dtype, out of x's dtype or f32.
pub fn check_dtypes(x: Dtype, w: Dtype, out: Dtype) -> Result<(), GemmError> {
    if x == w && (out == x || out == Dtype::F32) {
        Ok(())
    } else {
        Err(GemmError::Dtypes { x, w, out })
    }
}

/// The element counts of x, w and out (`m·k`, `n·k`, `m·n`), or [`GemmError::TooLarge`].
pub fn operand_lens(m: usize, n: usize, k: usize) -> Result<[usize; 3], GemmError> {
    let too_large = GemmError::TooLarge {
        m,
        n,
        k,
        why: "element count overflows usize",
    };
    match (m.checked_mul(k), n.checked_mul(k), m.checked_mul(n)) {
        (Some(x), Some(w), Some(out)) => Ok([x, w, out]),
        _ => Err(too_large),
    }
}

/// Checks that buffers of `lens` elements fit the shape exactly.
pub(crate) fn check_lens(lens: [usize; 3], m: usize, n: usize, k: usize) -> Result<(), GemmError> {
    let want = operand_lens(m, n, k)?;
    for ((what, actual), expected) in ["x", "w", "out"].into_iter().zip(lens).zip(want) {
        if actual != expected {
            return Err(GemmError::Length {
                what,
                expected,
                actual,
                m,
                n,
                k,
            });
        }
    }
    Ok(())
}
