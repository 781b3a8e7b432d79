//! `cuda:N` through its [`Driver`] (`gpu.rs`: the device's context and Pagoda's one
//! stream on it, shared with the kernels and GEMMs): buffers are the driver's
//! allocations wrapped as [`DeviceMemory`]; copies are the driver's on the stream, then
//! synchronized (uploads and downloads are not on the step's hot path); memory info is
//! the driver's.

use super::reasons::{NO_DEVICE, NO_DRIVER};
use crate::driver::Driver;
use crate::gpu::CudaDriver;
use cudarc::driver::{sys, CudaContext, CudaSlice};
use pagoda_core::{
    CoreError, DType, Device, DeviceMemory, DevicePtr, DeviceRuntime, HostSlice, HostSliceMut,
    MemoryInfo, Shape, Storage, TensorMut, TensorRef,
};
use std::fmt;
use std::sync::Arc;

/// Probes libcuda (before any cudarc call that could panic) and the device count.
pub(super) fn unavailable() -> Option<String> {
    // SAFETY: is_culib_present only tries to dlopen libcuda and closes it again.
    if !unsafe { sys::is_culib_present() } {
        return Some(NO_DRIVER.to_string());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => None,
        Ok(_) => Some(NO_DEVICE.to_string()),
        Err(e) => Some(format!("{NO_DEVICE} ({e})")),
    }
}

fn failed(device: Device, what: &str, e: impl fmt::Display) -> CoreError {
    CoreError::DeviceUnavailable {
        device,
        message: format!("{what}: {e}"),
    }
}

/// One CUDA device's runtime.
pub struct CudaRuntime {
    device: Device,
    driver: CudaDriver,
}

pub(super) fn open(device: Device) -> Result<Arc<dyn DeviceRuntime>, CoreError> {
    let Device::Cuda(ordinal) = device else {
        return Err(CoreError::DeviceMismatch {
            name: "cuda runtime",
            expected: Device::Cuda(0),
            actual: device,
        });
    };
    let count = CudaContext::device_count().map_err(|e| failed(device, NO_DEVICE, e))?;
    if ordinal as i64 >= i64::from(count) {
        return Err(CoreError::DeviceUnavailable {
            device,
            message: format!("{NO_DEVICE} {ordinal} (the driver sees {count})"),
        });
    }
    let driver = CudaDriver::new(ordinal).map_err(|e| failed(device, "context", e))?;
    Ok(Arc::new(CudaRuntime { device, driver }))
}

/// A device allocation; dropping it frees the memory.
struct Buffer {
    _slice: CudaSlice<u8>,
    ptr: DevicePtr,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaBuffer({:#x}, {} bytes)",
            self.ptr.addr, self.ptr.len_bytes
        )
    }
}

impl DeviceMemory for Buffer {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

fn bytes_of<'a>(s: &HostSlice<'a>) -> &'a [u8] {
    fn cast<T>(x: &[T]) -> &[u8] {
        // SAFETY: f32/f16/bf16/fp8 are plain old data without padding; the byte view
        // covers exactly the same memory for the same lifetime.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
    }
    match *s {
        HostSlice::F32(x) => cast(x),
        HostSlice::F16(x) => cast(x),
        HostSlice::BF16(x) => cast(x),
        HostSlice::F8E4M3(x) => cast(x),
    }
}

fn bytes_of_mut(s: HostSliceMut<'_>) -> &mut [u8] {
    fn cast<T>(x: &mut [T]) -> &mut [u8] {
        // SAFETY: as in `bytes_of`; every byte pattern is a valid f32/f16/bf16/fp8.
        unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), std::mem::size_of_val(x)) }
    }
    match s {
        HostSliceMut::F32(x) => cast(x),
        HostSliceMut::F16(x) => cast(x),
        HostSliceMut::BF16(x) => cast(x),
        HostSliceMut::F8E4M3(x) => cast(x),
    }
}

/// What a copy checks: same device, same dtype, same length.
struct Want {
    name: &'static str,
    device: Device,
    dtype: DType,
    len: usize,
}

impl CudaRuntime {
    fn check(&self, w: Want, host: DType, host_len: usize) -> Result<(), CoreError> {
        if w.device != self.device {
            return Err(CoreError::DeviceMismatch {
                name: w.name,
                expected: self.device,
                actual: w.device,
            });
        }
        if w.dtype != host {
            return Err(CoreError::DTypeMismatch {
                name: w.name,
                expected: w.dtype,
                actual: host,
            });
        }
        if w.len != host_len {
            return Err(CoreError::ShapeMismatch {
                name: w.name,
                expected: w.len,
                actual: host_len,
            });
        }
        Ok(())
    }
}

impl DeviceRuntime for CudaRuntime {
    fn device(&self) -> Device {
        self.device
    }

    fn alloc_zeroed(&self, dtype: DType, shape: Shape) -> Result<Storage, CoreError> {
        let bytes = shape.numel() * dtype.size();
        let d = &self.driver;
        d.bind().map_err(|e| failed(self.device, "bind", e))?;
        let slice = d
            .alloc_zeroed(bytes)
            .map_err(|e| failed(self.device, "alloc", e))?;
        let ptr = DevicePtr {
            addr: d.addr(&slice),
            len_bytes: bytes,
        };
        let mem = Buffer { _slice: slice, ptr };
        Storage::from_device(self.device, dtype, shape, Box::new(mem))
    }

    fn upload(&self, dst: TensorMut<'_>, src: HostSlice<'_>) -> Result<(), CoreError> {
        let want = Want {
            name: "upload destination",
            device: dst.device_of(),
            dtype: dst.dtype(),
            len: dst.len(),
        };
        self.check(want, src.dtype(), src.len())?;
        let ptr = dst.device_ptr().ok_or(CoreError::NotOnHost {
            name: "upload destination",
            device: self.device,
        })?;
        // SAFETY: `ptr` addresses `len` elements of `dtype` of this device's memory (a
        // checked view of a live Storage, borrowed mutably by `dst`), the source is as
        // long, and the stream is synchronized before `src` can be released.
        unsafe { self.driver.upload_to(ptr.addr, bytes_of(&src)) }
            .map_err(|e| failed(self.device, "upload", e))?;
        self.synchronize()
    }

    fn download(&self, src: TensorRef<'_>, dst: HostSliceMut<'_>) -> Result<(), CoreError> {
        let want = Want {
            name: "download destination",
            device: src.device_of(),
            dtype: src.dtype(),
            len: src.len(),
        };
        self.check(want, dst.dtype(), dst.len())?;
        let ptr = src.device_ptr().ok_or(CoreError::NotOnHost {
            name: "download source",
            device: self.device,
        })?;
        // SAFETY: as in `upload`, the other way; `dst` stays borrowed until synchronized.
        unsafe { self.driver.download(ptr.addr, bytes_of_mut(dst)) }
            .map_err(|e| failed(self.device, "download", e))?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<(), CoreError> {
        self.driver
            .synchronize()
            .map_err(|e| failed(self.device, "synchronize", e))
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.driver.memory_info()
    }
}
