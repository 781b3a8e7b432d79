//! cuBLAS behind [`super::DeviceGemm`]: one handle bound to the device's default stream,
//! its workspace set once at construction, so a call allocates nothing and never waits
//! on the host (it can be captured in a CUDA graph). A mutex serializes calls on the
//! handle (cuBLAS handles are not meant to be used by several threads at once).

use cudarc::cublas::{result, sys, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr as _};
use pagoda_cuda_kernels::Dtype;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// The workspace NVIDIA recommends for Hopper (32 MiB; 4 MiB suffices before it).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle with its workspace.
pub(super) struct Cublas {
    // Field order is drop order: the handle goes before the workspace it uses.
    blas: Mutex<CudaBlas>,
    _workspace: CudaSlice<u8>,
}

impl std::fmt::Debug for Cublas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cublas")
            .field("workspace_bytes", &WORKSPACE_BYTES)
            .finish_non_exhaustive()
    }
}

fn data_type(d: Dtype) -> sys::cudaDataType {
    match d {
        Dtype::F32 => sys::cudaDataType::CUDA_R_32F,
        Dtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        Dtype::F16 => sys::cudaDataType::CUDA_R_16F,
    }
}

impl Cublas {
    /// A handle on `stream` (its context must be current on this thread), or why not.
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<Self, String> {
        // cudarc panics when a cuBLAS call cannot load the library: look first.
        // SAFETY: is_culib_present only tries to dlopen libcublas (and closes it again).
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "libcublas could not be loaded (cuBLAS 13 must be on the library \
                        path, e.g. the nvidia-cublas wheel's lib folder)"
                    .to_string(),
            );
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate: {e}"))?;
        let workspace = stream
            .alloc_zeros::<u8>(WORKSPACE_BYTES)
            .map_err(|e| format!("allocating cuBLAS's workspace: {e}"))?;
        // The guard records the workspace's use on the stream when dropped (at once).
        let addr = workspace.device_ptr(stream).0;
        // SAFETY: the handle is live; the workspace is a device allocation of
        // WORKSPACE_BYTES in the handle's context and outlives the handle (field order).
        unsafe {
            sys::cublasSetWorkspace_v2(
                *blas.handle(),
                addr as usize as *mut c_void,
                WORKSPACE_BYTES,
            )
        }
        .result()
        .map_err(|e| format!("cublasSetWorkspace: {e}"))?;
        Ok(Cublas {
            blas: Mutex::new(blas),
            _workspace: workspace,
        })
    }

    /// Enqueues `out[m, n] = x[m, k] · w[n, k]ᵀ` (row-major) with f32 compute.
    ///
    /// # Safety
    /// As [`super::DeviceGemm::gemm_raw`]: live device buffers of the handle's context
    /// with `m·k`, `n·k`, `m·n` elements; m, n, k positive and within `c_int` (checked
    /// by the caller).
    pub(super) unsafe fn gemm(
        &self,
        (x, w, out): (u64, u64, u64),
        (m, n, k): (c_int, c_int, c_int),
        in_dtype: Dtype,
        out_dtype: Dtype,
    ) -> Result<(), String> {
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major cuBLAS sees row-major out[m, n] as outᵀ [n, m] = w · xᵀ: A = w
        // stored k x n (lda = k) transposed, B = x stored k x m (ldb = k), C ldc = n.
        // SAFETY: the caller's contract (addresses, sizes); alpha and beta are host f32
        // (the handle's default host pointer mode, compute type 32F), read during the call.
        unsafe {
            result::gemm_ex(
                *blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                w as usize as *const c_void,
                data_type(in_dtype),
                k,
                x as usize as *const c_void,
                data_type(in_dtype),
                k,
                (&beta as *const f32).cast(),
                out as usize as *mut c_void,
                data_type(out_dtype),
                n,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| format!("cublasGemmEx: {e}"))
    }
}
