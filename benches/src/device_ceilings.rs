//! A CUDA device's roofline ceilings (feature `cuda`): device-to-device copy
//! bandwidth over 1 GiB (bytes read + written per second) and the cuBLAS bf16 GEMM
//! rate at 8192³, the same measures as `benches/cuda_attention.rs`, as a library
//! function that reports failures instead of panicking (`device_step` uses it).

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaStream};
use half::bf16;
use std::sync::Arc;
use std::time::Instant;

/// Seconds per call of `f` after one warm-up call, synchronizing once per batch.
fn time(
    stream: &CudaStream,
    reps: u32,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let sync = |s: &CudaStream| s.synchronize().map_err(|e| format!("synchronize: {e}"));
    f()?;
    sync(stream)?;
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    sync(stream)?;
    Ok(t.elapsed().as_secs_f64() / f64::from(reps))
}

/// (copy bytes/s counting read + write, bf16 GEMM FLOP/s) of CUDA device `ordinal`.
/// The caller must have checked that a driver is present (cudarc panics without
/// libcuda): open the device through `pagoda_core::open_device` first.
pub fn cuda_ceilings(ordinal: usize) -> Result<(f64, f64), String> {
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("CUDA context: {e}"))?;
    let stream: Arc<CudaStream> = ctx.default_stream();
    let alloc = |e| format!("allocation: {e}");
    let bytes = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(bytes).map_err(alloc)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes).map_err(alloc)?;
    let copy = time(&stream, 10, || {
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| format!("copy: {e}"))
    })?;
    let n = 8192usize;
    let a = stream.alloc_zeros::<bf16>(n * n).map_err(alloc)?;
    let b = stream.alloc_zeros::<bf16>(n * n).map_err(alloc)?;
    let mut c = stream.alloc_zeros::<bf16>(n * n).map_err(alloc)?;
    let blas = CudaBlas::new(stream.clone())
        .map_err(|e| format!("cuBLAS (libcublas on the library path?): {e}"))?;
    let d = n as i32;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: d,
        n: d,
        k: d,
        alpha: bf16::ONE,
        lda: d,
        ldb: d,
        beta: bf16::ZERO,
        ldc: d,
    };
    let gemm = time(&stream, 5, || {
        // SAFETY: a, b and c are n x n device matrices of this stream's context,
        // matching the dimensions and leading dimensions of `cfg`.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(|e| format!("gemm: {e}"))
    })?;
    Ok((2.0 * bytes as f64 / copy, 2.0 * (n as f64).powi(3) / gemm))
}
