//! The safe side of the C launcher: argument checks, the call, its status as a
//! [`CutlassError`].

use std::ffi::{c_void, CStr};

/// The bindgen output for `cu/cutlass_gemm.h`.
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code
)]
#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/cutlass_gemm.rs"));
}

/// Rows of x, w and out must be a multiple of this many elements, and their base
/// addresses 16-byte aligned (the kernel's 128-bit loads and stores).
pub const ALIGN_ELEMS: usize = ffi::PG_CUTLASS_ALIGN_ELEMS as usize;

/// The element type of x, w and out (one for all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CutlassDtype {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
}

impl CutlassDtype {
    fn code(self) -> i32 {
        match self {
            CutlassDtype::Bf16 => ffi::PG_CUTLASS_BF16 as i32,
            CutlassDtype::F16 => ffi::PG_CUTLASS_F16 as i32,
        }
    }
}

/// Why a GEMM was not launched (or failed to launch).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutlassError {
    /// m, n or k is zero or does not fit in CUTLASS's `int`.
    #[error("CUTLASS GEMM: shape m={m} n={n} k={k} out of range (1..=2^31-1 each)")]
    Shape {
        /// Rows of x and out.
        m: usize,
        /// Rows of w, columns of out.
        n: usize,
        /// The reduction length.
        k: usize,
    },
    /// k or n not a multiple of [`ALIGN_ELEMS`], or a base address not 16-byte aligned.
    #[error(
        "CUTLASS GEMM: misaligned operands (n={n}, k={k} must be multiples of {ALIGN_ELEMS}; \
         x={x:#x}, w={w:#x}, out={out:#x} must be 16-byte aligned)"
    )]
    Misaligned {
        /// Columns of out.
        n: usize,
        /// The reduction length.
        k: usize,
        /// x's address.
        x: u64,
        /// w's address.
        w: u64,
        /// out's address.
        out: u64,
    },
    /// CUTLASS refused the problem for another reason.
    #[error("CUTLASS GEMM: not supported ({status})")]
    NotSupported {
        /// `cutlass::cutlassGetStatusString` of its status.
        status: String,
    },
    /// A CUDA runtime error (no driver, no kernel image for this GPU, a bad launch).
    #[error("CUTLASS GEMM: CUDA runtime error {name} ({code}): {message}")]
    Cuda {
        /// The `cudaError_t`.
        code: i32,
        /// Its name (`cudaErrorInsufficientDriver`, ...).
        name: String,
        /// Its description.
        message: String,
    },
    /// A status this wrapper does not know (a mismatch between header and library).
    #[error("CUTLASS GEMM: unknown launcher status {0}")]
    Unknown(i32),
}

/// One GEMM: `out[m, n] = x[m, k] · w[n, k]ᵀ`, device addresses, row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Device address of `x[m, k]`.
    pub x: u64,
    /// Device address of `w[n, k]`.
    pub w: u64,
    /// Device address of `out[m, n]`.
    pub out: u64,
    /// Rows of x and out (tokens).
    pub m: usize,
    /// Rows of w (output features).
    pub n: usize,
    /// Columns of x and w (input features).
    pub k: usize,
    /// The element type of x, w and out.
    pub dtype: CutlassDtype,
}

fn c_str(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::from("?");
    }
    // SAFETY: the launcher returns the CUDA runtime's or CUTLASS's static, NUL-terminated
    // strings (checked non-null above), valid for the whole process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn cuda_error(code: i32) -> CutlassError {
    // SAFETY: both functions only look the code up in the runtime's static tables.
    let (name, message) = unsafe {
        (
            ffi::pg_cutlass_cuda_error_name(code),
            ffi::pg_cutlass_cuda_error_string(code),
        )
    };
    CutlassError::Cuda {
        code,
        name: c_str(name),
        message: c_str(message),
    }
}

fn check(r: ffi::PgCutlassResult, g: Option<&Gemm>) -> Result<(), CutlassError> {
    let status = u32::try_from(r.status).map_err(|_| CutlassError::Unknown(r.status))?;
    match status {
        ffi::PG_CUTLASS_OK => Ok(()),
        ffi::PG_CUTLASS_CUDA_ERROR => Err(cuda_error(r.cuda_error)),
        ffi::PG_CUTLASS_MISALIGNED => {
            let g = g.ok_or(CutlassError::Unknown(r.status))?;
            Err(CutlassError::Misaligned {
                n: g.n,
                k: g.k,
                x: g.x,
                w: g.w,
                out: g.out,
            })
        }
        ffi::PG_CUTLASS_BAD_SHAPE => {
            let g = g.ok_or(CutlassError::Unknown(r.status))?;
            Err(CutlassError::Shape {
                m: g.m,
                n: g.n,
                k: g.k,
            })
        }
        ffi::PG_CUTLASS_NOT_SUPPORTED => {
            // SAFETY: a lookup in CUTLASS's static status strings.
            let s = unsafe { ffi::pg_cutlass_status_string(r.detail) };
            Err(CutlassError::NotSupported { status: c_str(s) })
        }
        _ => Err(CutlassError::Unknown(r.status)),
    }
}

/// Enqueues `g` on `stream` (a `CUstream`; null = the legacy default stream). Shape and
/// alignment are checked first (an error, no launch); nothing is allocated and the host
/// does not wait (the call can be captured in a CUDA graph).
///
/// # Safety
/// `x`, `w` and `out` must be device allocations of the context current on this thread
/// holding at least `m·k`, `n·k` and `m·n` elements of `dtype`, alive until the stream
/// has run the GEMM; `out` must not overlap x or w; `stream` must be a live stream of
/// that context (or null).
pub unsafe fn gemm(g: &Gemm, stream: *mut c_void) -> Result<(), CutlassError> {
    let int = |v: usize| i32::try_from(v).ok().filter(|&v| v > 0);
    let (Some(m), Some(n), Some(k)) = (int(g.m), int(g.n), int(g.k)) else {
        return Err(CutlassError::Shape {
            m: g.m,
            n: g.n,
            k: g.k,
        });
    };
    let p = ffi::PgCutlassGemmParams {
        x: g.x,
        w: g.w,
        out: g.out,
        m,
        n,
        k,
        dtype: g.dtype.code(),
        stream,
    };
    // SAFETY: `p` is a valid parameter struct for the duration of the call; the caller
    // guarantees the addresses and the stream (this function's contract).
    let r = unsafe { ffi::pg_cutlass_gemm(&p) };
    check(r, Some(g))
}

/// The number of CUDA devices the static runtime sees: on a machine without a driver a
/// [`CutlassError::Cuda`] (e.g. `cudaErrorInsufficientDriver`), never a crash.
pub fn device_count() -> Result<usize, CutlassError> {
    let mut count = 0i32;
    // SAFETY: the launcher writes one int through the valid pointer.
    let r = unsafe { ffi::pg_cutlass_device_count(&mut count) };
    check(r, None)?;
    Ok(usize::try_from(count).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_shapes_are_refused_before_any_launch() {
        for (m, n, k) in [(0, 8, 8), (8, 0, 8), (8, 8, 0), (1 << 31, 8, 8)] {
            let g = Gemm {
                x: 0,
                w: 0,
                out: 0,
                m,
                n,
                k,
                dtype: CutlassDtype::Bf16,
            };
            // SAFETY: the shape check refuses these before the launcher is called.
            let e = unsafe { gemm(&g, std::ptr::null_mut()) }.unwrap_err();
            assert_eq!(e, CutlassError::Shape { m, n, k });
        }
    }

    #[test]
    fn misaligned_operands_are_an_error_not_a_launch() {
        // The launcher checks alignment before touching the runtime or the pointers.
        for (x, n, k) in [(8u64, 64, 64), (0x1000, 64, 60), (0x1000, 60, 64)] {
            let g = Gemm {
                x,
                w: 0x2000,
                out: 0x3000,
                m: 3,
                n,
                k,
                dtype: CutlassDtype::F16,
            };
            // SAFETY: refused before launch (misaligned), so no address is dereferenced.
            let e = unsafe { gemm(&g, std::ptr::null_mut()) }.unwrap_err();
            assert!(matches!(e, CutlassError::Misaligned { .. }), "{e}");
            assert!(e.to_string().contains("multiples of 8"), "{e}");
        }
    }

    #[test]
    fn the_static_runtime_starts_without_a_driver() {
        // libcudart_static opens libcuda at its first call: here (no driver in CI) that is
        // an error code, on a GPU machine a count; never a failure to link or start.
        match device_count() {
            Ok(n) => println!("CUDA devices: {n}"),
            Err(CutlassError::Cuda { name, .. }) => {
                println!("no CUDA here: {name}");
                assert!(name.starts_with("cudaError"), "{name}");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
