//! Each `cuda:N` device's shared state (feature `cuda`): its [`CudaKernels`] (the
//! device's primary context and the loaded kernel modules) and Pagoda's one engine
//! stream on it, made once per ordinal and shared by every user in the process.
//!
//! A leaf below the driver (`gpu.rs`) and the GEMMs (`gemm/device.rs`): both open the
//! same context and stream, and neither needs the other to find them.

use cudarc::driver::CudaStream;
use pagoda_cuda_kernels::cuda::CudaKernels;
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
