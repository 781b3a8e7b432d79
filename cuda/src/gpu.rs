//! The attention backends' [`Driver`] on a `cuda:N` device (feature `cuda`): cudarc.
//!
//! Everything above the driver (conversions, buffer sizes, parameter packing, the
//! graph lock) is `device.rs`, which the `emu` device runs too. Here: allocations and
//! uploads on the device's engine stream, core's device views' addresses, and the
//! launches of `pagoda_cuda_kernels::cuda`. Uploads and launches share that stream
//! with the device runtime's copies, so they are ordered without events.

use crate::attn::Kernel;
use crate::device::{DeviceAttn, Driver};
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr as _};
use pagoda_core::{TensorMut, TensorRef};
use pagoda_cuda_kernels::cuda::CudaKernels;
use pagoda_cuda_kernels::{AttnParams, Dtype, WriteKvParams};
use std::sync::{Arc, Mutex};

/// A device's shared state: the kernels (context + loaded modules) and the one stream
/// all of Pagoda's work on the device goes to.
type Shared = (usize, Arc<CudaKernels>, Arc<CudaStream>);

fn shared(ordinal: usize) -> Result<Shared, String> {
    static ALL: Mutex<Vec<Shared>> = Mutex::new(Vec::new());
    let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = all.iter().find(|(o, ..)| *o == ordinal) {
        return Ok(s.clone());
    }
    let k = Arc::new(CudaKernels::new(ordinal).map_err(|e| e.to_string())?);
    // Load every module now: a missing kernel image is a construction error, not a
    // failure in the middle of a step.
    k.preload().map_err(|e| e.to_string())?;
    let stream = k
        .context()
        .new_stream()
        .map_err(|e| format!("creating a stream: {e}"))?;
    // SAFETY: every use of this context's buffers by Pagoda is enqueued on `stream`
    // (the runtime's copies, the kernels, cuBLAS, CUTLASS), so stream order alone
    // orders them; cudarc's per-buffer events exist for several streams, and events
    // recorded outside a capture cannot be waited on inside one (CUDA graphs).
    unsafe { k.context().disable_event_tracking() };
    all.push((ordinal, k, stream));
    Ok(all.last().expect("pushed").clone())
}

/// One [`CudaKernels`] (context + loaded modules) per device ordinal, shared by every
/// backend of the process: modules load once, and all launches use the context the
/// device runtime allocates in (the device's primary context).
pub(crate) fn kernels(ordinal: usize) -> Result<Arc<CudaKernels>, String> {
    shared(ordinal).map(|s| s.1)
}

/// The stream every copy, kernel and GEMM of Pagoda on `cuda:ordinal` is enqueued on:
/// not the legacy default stream, which cannot be captured into a CUDA graph, and one
/// stream, so that its order is the only order needed.
pub fn engine_stream(ordinal: usize) -> Result<Arc<CudaStream>, String> {
    shared(ordinal).map(|s| s.2)
}

/// The streaming multiprocessors of the context's device (`paged`'s split plan).
fn num_sms(ctx: &CudaContext) -> Result<usize, String> {
    let n = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())?;
    Ok(usize::try_from(n).unwrap_or(1).max(1))
}

/// The driver of `cuda:N`: the shared kernels and stream of the device.
pub(crate) struct CudaDriver {
    kernels: Arc<CudaKernels>,
    stream: Arc<CudaStream>,
    num_sms: usize,
}

/// A backend's device state on `cuda:N`.
pub(crate) type Gpu = DeviceAttn<CudaDriver>;

/// The state for `cuda:ordinal`, or why the device cannot launch.
pub(crate) fn gpu(ordinal: usize) -> Result<Gpu, String> {
    let kernels = kernels(ordinal)?;
    let stream = engine_stream(ordinal)?;
    let num_sms = num_sms(kernels.context())?;
    Ok(DeviceAttn::new(CudaDriver {
        kernels,
        stream,
        num_sms,
    }))
}

impl Driver for CudaDriver {
    type Buf = CudaSlice<u8>;

    fn alloc_zeroed(&self, bytes: usize) -> Result<CudaSlice<u8>, String> {
        // cuMemAlloc aligns to 256 bytes.
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| e.to_string())
    }

    fn addr(&self, b: &CudaSlice<u8>) -> u64 {
        let (addr, _sync) = b.device_ptr(&self.stream);
        addr
    }

    fn upload(&self, b: &mut CudaSlice<u8>, data: &[u8]) -> Result<(), String> {
        if data.len() > b.len() {
            return Err(format!("{} bytes into {}", data.len(), b.len()));
        }
        let mut head = b.slice_mut(0..data.len());
        self.stream
            .memcpy_htod(data, &mut head)
            .map_err(|e| e.to_string())
    }

    fn num_sms(&self) -> usize {
        self.num_sms
    }

    fn bind(&self) -> Result<(), String> {
        self.kernels
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())
    }

    fn ref_addr(&self, t: &TensorRef<'_>, name: &str) -> Result<u64, String> {
        t.device_ptr()
            .map(|p| p.addr)
            .ok_or_else(|| format!("{name} is host memory, not on the CUDA device"))
    }

    fn mut_addr(&self, t: TensorMut<'_>, name: &str) -> Result<u64, String> {
        t.device_ptr()
            .map(|p| p.addr)
            .ok_or_else(|| format!("{name} is host memory, not on the CUDA device"))
    }

    unsafe fn attn(&self, kernel: Kernel, p: &AttnParams, dtype: Dtype) -> Result<(), String> {
        let (k, s) = (&self.kernels, &*self.stream);
        // SAFETY: the caller's contract (device memory of this context).
        unsafe {
            match kernel {
                Kernel::Naive => k.naive(s, p, dtype),
                Kernel::Paged => k.paged(s, p, dtype),
                Kernel::Flash => k.flash(s, p, dtype),
            }
        }
        .map_err(|e| e.to_string())
    }

    unsafe fn write_kv(&self, p: &WriteKvParams, dtype: Dtype) -> Result<(), String> {
        // SAFETY: the caller's contract.
        unsafe { self.kernels.write_kv(&self.stream, p, dtype) }.map_err(|e| e.to_string())
    }
}
