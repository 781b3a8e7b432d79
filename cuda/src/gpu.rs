//! The [`Driver`] of a `cuda:N` device (feature `cuda`): cudarc.
//!
//! Everything above the driver (conversions, buffer sizes, parameter packing, graph
//! capture and replay) is `device.rs`, `ops.rs` and the runtime's copies, which the
//! `emu` device runs too. Here: allocations, copies, launches, the GEMM, events and
//! stream capture on the device's one engine stream (shared by the runtime, the
//! attention backends and the model ops, so stream order alone orders them), core's
//! device views' addresses, and the device's memory info.

use crate::batch_invariant::batch_invariant_env;
use crate::context::{engine_stream, kernels};
use crate::driver::{Driver, Gemm};
use crate::gemm::{DeviceGemm, GemmImpl};
use cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr as _,
};
use pagoda_core::{Device, MemoryInfo, TensorMut, TensorRef};
use pagoda_cuda_kernels::cuda::CudaKernels;
use pagoda_cuda_kernels::{AttnKernel, Call};
use std::sync::Arc;

/// The streaming multiprocessors of the context's device (`paged`'s split plan).
fn num_sms(ctx: &CudaContext) -> Result<usize, String> {
    let n = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())?;
    Ok(usize::try_from(n).unwrap_or(1).max(1))
}

/// The driver of `cuda:N`: the shared kernels and stream of the device, and (model
/// ops only) the GEMMs.
pub(crate) struct CudaDriver {
    device: Device,
    kernels: Arc<CudaKernels>,
    stream: Arc<CudaStream>,
    num_sms: usize,
    /// cuBLAS, and the CUTLASS GEMM when `PAGODA_GEMM=cutlass` (`with_gemm`).
    gemm: Option<(DeviceGemm, Option<DeviceGemm>)>,
}

/// A captured graph (cudarc's `CudaGraph` is not `Send`: it holds raw handles).
pub(crate) struct Graph(CudaGraph);

// SAFETY: CUDA graph handles may be used from any thread as long as calls on one graph
// are serialized (CUDA's graph thread-safety rules); a graph's owner (the model ops)
// only touches it through `&mut self`.
unsafe impl Send for Graph {}

impl CudaDriver {
    /// The driver of `cuda:ordinal`, or why the device cannot launch.
    pub(crate) fn new(ordinal: usize) -> Result<Self, String> {
        let kernels = kernels(ordinal)?;
        let stream = engine_stream(ordinal)?;
        let num_sms = num_sms(kernels.context())?;
        Ok(CudaDriver {
            device: Device::Cuda(ordinal),
            kernels,
            stream,
            num_sms,
            gemm: None,
        })
    }

    /// Loads the attention kernel `k`'s fatbin now (a backend does at its creation: a
    /// missing image is a construction error, and no module loads during a capture).
    pub(crate) fn load_attn(&self, k: &'static AttnKernel) -> Result<(), String> {
        self.kernels.load_attn(k).map_err(|e| e.to_string())
    }

    /// With the linear layers' GEMMs: cuBLAS, and with `PAGODA_GEMM=cutlass` (or
    /// vLLM's `VLLM_BATCH_INVARIANT=1`) the CUTLASS kernel wherever it applies
    /// (bf16/f16 in and out): one fixed 128x128x64 tile without split-K, so a row's
    /// sums do not depend on m, where cuBLAS picks its algorithm by shape.
    pub(crate) fn with_gemm(mut self) -> Result<Self, String> {
        let Device::Cuda(ordinal) = self.device else {
            unreachable!("a CUDA driver serves a cuda device")
        };
        let blas = DeviceGemm::new(ordinal, GemmImpl::Cublas).map_err(|e| e.to_string())?;
        let want_cutlass =
            std::env::var("PAGODA_GEMM").as_deref() == Ok("cutlass") || batch_invariant_env();
        let cutlass = match want_cutlass {
            true => Some(DeviceGemm::new(ordinal, GemmImpl::Cutlass).map_err(|e| e.to_string())?),
            false => None,
        };
        self.gemm = Some((blas, cutlass));
        Ok(self)
    }

    fn view_addr(
        &self,
        d: Device,
        p: Option<pagoda_core::DevicePtr>,
        name: &str,
    ) -> Result<u64, String> {
        match p {
            Some(p) if d == self.device => Ok(p.addr),
            _ => Err(format!(
                "{name} is on {d}, not device memory of {}",
                self.device
            )),
        }
    }
}

fn drv(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Driver for CudaDriver {
    type Buf = CudaSlice<u8>;
    type Event = CudaEvent;
    type Graph = Graph;

    fn device(&self) -> Device {
        self.device
    }

    fn num_sms(&self) -> usize {
        self.num_sms
    }

    fn bind(&self) -> Result<(), String> {
        self.kernels.context().bind_to_thread().map_err(drv)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        let (free_bytes, total_bytes) = self.kernels.context().mem_get_info().ok()?;
        Some(MemoryInfo {
            free_bytes,
            total_bytes,
        })
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<CudaSlice<u8>, String> {
        // cuMemAlloc aligns to 256 bytes; a zero-byte allocation is refused.
        self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(drv)
    }

    fn addr(&self, b: &CudaSlice<u8>) -> u64 {
        let (addr, _sync) = b.device_ptr(&self.stream);
        addr
    }

    fn ref_addr(&self, t: &TensorRef<'_>, name: &str) -> Result<u64, String> {
        self.view_addr(t.device_of(), t.device_ptr(), name)
    }

    fn mut_addr(&self, t: TensorMut<'_>, name: &str) -> Result<u64, String> {
        self.view_addr(t.device_of(), t.device_ptr(), name)
    }

    fn upload(&self, b: &mut CudaSlice<u8>, data: &[u8]) -> Result<(), String> {
        if data.len() > b.len() {
            return Err(format!("{} bytes into {}", data.len(), b.len()));
        }
        let mut head = b.slice_mut(0..data.len());
        self.stream.memcpy_htod(data, &mut head).map_err(drv)
    }

    unsafe fn upload_to(&self, dst: u64, data: &[u8]) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the caller's contract; from pageable memory the driver has copied
        // `data` out when this returns.
        unsafe { result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }.map_err(drv)
    }

    unsafe fn download(&self, src: u64, out: &mut [u8]) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the caller's contract; `out` stays borrowed until the caller waited.
        unsafe { result::memcpy_dtoh_async(out, src, self.stream.cu_stream()) }.map_err(drv)
    }

    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }.map_err(drv)
    }

    unsafe fn launch(&self, call: &Call) -> Result<(), String> {
        // SAFETY: the caller's contract (device memory of this context).
        unsafe { self.kernels.call(&self.stream, call) }.map_err(drv)
    }

    unsafe fn gemm(&self, g: &Gemm) -> Result<(), String> {
        let (blas, cutlass) = self
            .gemm
            .as_ref()
            .ok_or("this driver was opened without the GEMMs")?;
        let (x, w, o) = g.dtypes;
        let shape = (g.m, g.n, g.k);
        let lib = match cutlass {
            Some(c) if c.supports(shape, x, w, o).is_ok() => c,
            _ => blas,
        };
        // SAFETY: the caller's contract.
        unsafe { lib.gemm_raw(g.addrs, shape, x, w, o) }.map_err(drv)
    }

    fn record_event(&self) -> Result<CudaEvent, String> {
        self.stream.record_event(None).map_err(drv)
    }

    fn wait_event(&self, e: &CudaEvent) -> Result<(), String> {
        e.synchronize().map_err(drv)
    }

    fn synchronize(&self) -> Result<(), String> {
        self.stream.synchronize().map_err(drv)
    }

    fn begin_capture(&self) -> Result<(), String> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv)
    }

    fn end_capture(&self) -> Result<Graph, String> {
        let g = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv)?
            .ok_or("no graph was captured")?;
        // Uploaded now: the first replay must not pay for it.
        g.upload()
            .map_err(|e| format!("uploading the graph: {e}"))?;
        Ok(Graph(g))
    }

    fn abort_capture(&self) {
        // Ending the capture discards what was recorded; its error (the capture was
        // already invalidated) is the one being reported by the caller.
        let _ = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
    }

    unsafe fn replay(&self, g: &Graph) -> Result<(), String> {
        g.0.launch().map_err(drv)
    }
}
