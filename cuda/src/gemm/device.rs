//! [`DeviceGemm`]: the GEMM on a `cuda:N` device, through cuBLAS or CUTLASS
//! ([`GemmImpl`]), on the device's default stream (the one the device runtime and the
//! attention launches use, so no events are needed between them).

use super::cublas::Cublas;
use super::types::{check_dtypes, operand_lens, GemmError, GemmImpl};
use crate::context::{engine_stream, kernels};
use cudarc::driver::{result as drv, CudaContext, CudaStream};
use pagoda_core::{DType, Device, TensorMut, TensorRef};
use pagoda_cuda_kernels::cuda::CudaKernels;
use pagoda_cuda_kernels::Dtype;
use pagoda_cutlass::{CutlassDtype, CutlassError};
use std::ffi::c_int;
use std::sync::Arc;

/// The linear layers' GEMM on `cuda:ordinal`: `out[m, n] = x[m, k] · w[n, k]ᵀ`, row-major,
/// f32 accumulation. A call checks its arguments, then only enqueues work on the device's
/// default stream: no allocation, no host synchronization.
pub struct DeviceGemm {
    ordinal: usize,
    implementation: GemmImpl,
    // The cuBLAS handle goes before the context it lives in (field order is drop order).
    cublas: Option<Cublas>,
    stream: Arc<CudaStream>,
    kernels: Arc<CudaKernels>,
}

impl std::fmt::Debug for DeviceGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGemm")
            .field("ordinal", &self.ordinal)
            .field("implementation", &self.implementation)
            .finish_non_exhaustive()
    }
}

fn of_core(what: &'static str, d: DType) -> Result<Dtype, GemmError> {
    match d {
        DType::F32 => Ok(Dtype::F32),
        DType::BF16 => Ok(Dtype::Bf16),
        DType::F16 => Ok(Dtype::F16),
        DType::F8E4M3 => Err(GemmError::UnsupportedDType { what, dtype: d }),
    }
}

impl DeviceGemm {
    /// The GEMM of `implementation` on `cuda:ordinal`, or why it cannot run here (no
    /// driver, no device, no libcublas for [`GemmImpl::Cublas`]): an error, never a panic.
    pub fn new(ordinal: usize, implementation: GemmImpl) -> Result<Self, GemmError> {
        let unavailable = |reason: String| GemmError::Unavailable {
            implementation,
            ordinal,
            reason,
        };
        let kernels = kernels(ordinal).map_err(unavailable)?;
        let ctx = kernels.context();
        ctx.bind_to_thread()
            .map_err(|e| unavailable(e.to_string()))?;
        let stream = engine_stream(ordinal).map_err(unavailable)?;
        let cublas = match implementation {
            GemmImpl::Cublas => Some(Cublas::new(&stream).map_err(unavailable)?),
            GemmImpl::Cutlass => {
                // The CUTLASS library's own static CUDA runtime must see the device too.
                let count =
                    pagoda_cutlass::device_count().map_err(|e| unavailable(e.to_string()))?;
                if ordinal >= count {
                    return Err(unavailable(format!(
                        "the CUDA runtime sees {count} device(s)"
                    )));
                }
                None
            }
        };
        Ok(DeviceGemm {
            ordinal,
            implementation,
            cublas,
            stream,
            kernels,
        })
    }

    /// The library behind this GEMM.
    pub fn implementation(&self) -> GemmImpl {
        self.implementation
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The stream the GEMMs are enqueued on (the device's engine stream).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.kernels.context()
    }

    /// Whether this implementation runs `m, n, k` with these dtypes, addresses aside
    /// (so a model can pick at load time): the dtype rule ([`super::check_dtypes`]),
    /// sizes within `int`, and for CUTLASS bf16/f16 only with out of x's dtype and n, k
    /// multiples of [`pagoda_cutlass::ALIGN_ELEMS`].
    pub fn supports(
        &self,
        (m, n, k): (usize, usize, usize),
        x_dtype: Dtype,
        w_dtype: Dtype,
        out_dtype: Dtype,
    ) -> Result<(), GemmError> {
        check_dtypes(x_dtype, w_dtype, out_dtype)?;
        operand_lens(m, n, k)?;
        for v in [m, n, k] {
            if c_int::try_from(v).is_err() {
                return Err(GemmError::TooLarge {
                    m,
                    n,
                    k,
                    why: "a size exceeds the library's int",
                });
            }
        }
        if self.implementation == GemmImpl::Cutlass {
            let unsupported = |reason: String| GemmError::Unsupported {
                implementation: GemmImpl::Cutlass,
                reason,
            };
            if x_dtype == Dtype::F32 || out_dtype != x_dtype {
                return Err(unsupported(format!(
                    "bf16 or f16 in and out only (asked {x_dtype:?} -> {out_dtype:?}; use cuBLAS)"
                )));
            }
            let a = pagoda_cutlass::ALIGN_ELEMS;
            if n % a != 0 || k % a != 0 {
                return Err(unsupported(format!(
                    "n={n} and k={k} must be multiples of {a}"
                )));
            }
        }
        Ok(())
    }

    /// Enqueues `out[m, n] = x[m, k] · w[n, k]ᵀ` on device addresses. m = 0 or n = 0 does
    /// nothing; k = 0 zeroes out.
    ///
    /// # Safety
    /// `x`, `w` and `out` must be device allocations on this device holding at least
    /// `m·k`, `n·k` and `m·n` elements of their dtypes, alive until the stream has run the
    /// GEMM (freeing them on this stream orders that), and `out` must not overlap x or w.
    pub unsafe fn gemm_raw(
        &self,
        (x, w, out): (u64, u64, u64),
        (m, n, k): (usize, usize, usize),
        x_dtype: Dtype,
        w_dtype: Dtype,
        out_dtype: Dtype,
    ) -> Result<(), GemmError> {
        self.supports((m, n, k), x_dtype, w_dtype, out_dtype)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        for (what, addr, d) in [
            ("x", x, x_dtype),
            ("w", w, w_dtype),
            ("out", out, out_dtype),
        ] {
            let size = d_size(d) as u64;
            if addr == 0 || addr % size != 0 {
                return Err(GemmError::Operand {
                    what,
                    reason: format!("device address {addr:#x} is null or not {size}-byte aligned"),
                });
            }
        }
        let launch = |reason: String| GemmError::Launch {
            implementation: self.implementation,
            reason,
        };
        // The libraries use the thread's current context: make it this device's.
        self.context()
            .bind_to_thread()
            .map_err(|e| launch(e.to_string()))?;
        if k == 0 {
            // An empty sum: zeros, m·n·size bytes.
            let bytes = (m * n)
                .checked_mul(d_size(out_dtype))
                .ok_or(GemmError::TooLarge {
                    m,
                    n,
                    k,
                    why: "out's byte count overflows usize",
                })?;
            // SAFETY: out holds m·n elements of out_dtype on this device (the contract);
            // the memset is enqueued on the device's stream.
            return unsafe { drv::memset_d8_async(out, 0, bytes, self.stream.cu_stream()) }
                .map_err(|e| launch(format!("zeroing out for k = 0: {e}")));
        }
        // `supports` checked that m, n, k fit in c_int.
        let int = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
        match (self.implementation, &self.cublas) {
            (GemmImpl::Cublas, Some(blas)) => {
                // SAFETY: the caller's contract; sizes positive and within c_int.
                unsafe { blas.gemm((x, w, out), (int(m), int(n), int(k)), x_dtype, out_dtype) }
                    .map_err(launch)
            }
            (GemmImpl::Cublas, None) => Err(launch("no cuBLAS handle".to_string())),
            (GemmImpl::Cutlass, _) => {
                let dtype = match x_dtype {
                    Dtype::Bf16 => CutlassDtype::Bf16,
                    _ => CutlassDtype::F16, // `supports` refused f32
                };
                let g = pagoda_cutlass::Gemm {
                    x,
                    w,
                    out,
                    m,
                    n,
                    k,
                    dtype,
                };
                // SAFETY: the caller's contract; the context is current on this thread
                // and the stream is its default stream.
                unsafe { pagoda_cutlass::gemm(&g, self.stream.cu_stream().cast()) }
                    .map_err(|e| cutlass_error(e, m, n, k))
            }
        }
    }

    /// The same on views of device memory: their device must be this one, their
    /// dtypes follow the rule, and they must hold exactly `m·k`, `n·k`, `m·n` elements.
    pub fn gemm(
        &self,
        x: &TensorRef<'_>,
        w: &TensorRef<'_>,
        out: &mut TensorMut<'_>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), GemmError> {
        let device = Device::Cuda(self.ordinal);
        let [xl, wl, ol] = operand_lens(m, n, k)?;
        let views = [
            ("x", x.device_of(), x.len(), xl, x.device_ptr()),
            ("w", w.device_of(), w.len(), wl, w.device_ptr()),
            ("out", out.device_of(), out.len(), ol, out.device_ptr()),
        ];
        for (what, dev, len, want, ptr) in views {
            if dev != device || ptr.is_none() {
                return Err(GemmError::Operand {
                    what,
                    reason: format!("on {dev}, not device memory of {device}"),
                });
            }
            if len != want {
                return Err(GemmError::Length {
                    what,
                    expected: want,
                    actual: len,
                    m,
                    n,
                    k,
                });
            }
        }
        let addr = |p: Option<pagoda_core::DevicePtr>| p.map_or(0, |p| p.addr);
        // SAFETY: the views are device memory of this device (checked above) holding
        // exactly the elements the shape needs, borrowed for this call; their owners free
        // them on this device's stream, after the GEMM. `out` is a unique borrow, so it
        // does not overlap x or w.
        unsafe {
            self.gemm_raw(
                (
                    addr(x.device_ptr()),
                    addr(w.device_ptr()),
                    addr(out.device_ptr()),
                ),
                (m, n, k),
                of_core("x", x.dtype())?,
                of_core("w", w.dtype())?,
                of_core("out", out.dtype())?,
            )
        }
    }
}

fn d_size(d: Dtype) -> usize {
    match d {
        Dtype::F32 => 4,
        Dtype::Bf16 | Dtype::F16 => 2,
    }
}

fn cutlass_error(e: CutlassError, m: usize, n: usize, k: usize) -> GemmError {
    match e {
        CutlassError::Shape { .. } => GemmError::TooLarge {
            m,
            n,
            k,
            why: "CUTLASS's int sizes",
        },
        CutlassError::Misaligned { .. } | CutlassError::NotSupported { .. } => {
            GemmError::Unsupported {
                implementation: GemmImpl::Cutlass,
                reason: e.to_string(),
            }
        }
        CutlassError::Cuda { .. } | CutlassError::Unknown(_) => GemmError::Launch {
            implementation: GemmImpl::Cutlass,
            reason: e.to_string(),
        },
    }
}
