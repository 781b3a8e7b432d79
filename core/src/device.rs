//! Device runtimes: who owns a device's memory ([`DeviceRuntime`]) and how the engine
//! finds it ([`open_device`]).
//!
//! Host devices (`cpu`, `emu`) are served here by [`HostRuntime`]. A device runtime
//! crate (the CUDA one) registers itself with [`register_device!`](crate::register_device)
//! so that core, the engine and the selector reach device memory without knowing CUDA:
//! a binary that does not link such a crate says so when asked for that device.

use crate::tensor::{
    DType, Device, DeviceKind, HostSlice, HostSliceMut, HostVec, Shape, Storage, TensorMut,
    TensorRef,
};
use crate::CoreError;
use std::sync::Arc;

/// Free and total bytes of a device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    pub free_bytes: usize,
    pub total_bytes: usize,
}

/// The owner of one device's memory: allocates [`Storage`] on it and copies between
/// it and the host. Kernels that run on the device come from the backends.
pub trait DeviceRuntime: Send + Sync {
    /// The device this runtime serves.
    fn device(&self) -> Device;
    /// A zeroed buffer of `shape` elements of `dtype`.
    fn alloc_zeroed(&self, dtype: DType, shape: Shape) -> Result<Storage, CoreError>;
    /// Copies host elements (of `dst`'s dtype and length) into `dst`, a view of this
    /// device's memory.
    fn upload(&self, dst: TensorMut<'_>, src: HostSlice<'_>) -> Result<(), CoreError>;
    /// Copies `src`, a view of this device's memory, into host elements (of its dtype
    /// and length).
    fn download(&self, src: TensorRef<'_>, dst: HostSliceMut<'_>) -> Result<(), CoreError>;
    /// Waits for the device's queued work.
    fn synchronize(&self) -> Result<(), CoreError>;
    /// Free and total memory, where the device can tell.
    fn memory_info(&self) -> Option<MemoryInfo>;
}

/// Host memory (the `cpu` and `emu` devices).
#[derive(Debug, Clone, Copy)]
pub struct HostRuntime {
    device: Device,
}

impl HostRuntime {
    /// The runtime of a host device; an error for a device of its own memory.
    pub fn new(device: Device) -> Result<Self, CoreError> {
        if device.is_host() {
            Ok(HostRuntime { device })
        } else {
            Err(CoreError::DeviceMismatch {
                name: "host runtime",
                expected: Device::Cpu,
                actual: device,
            })
        }
    }
}

fn same_len(name: &'static str, expected: usize, actual: usize) -> Result<(), CoreError> {
    if expected == actual {
        Ok(())
    } else {
        Err(CoreError::ShapeMismatch {
            name,
            expected,
            actual,
        })
    }
}

impl DeviceRuntime for HostRuntime {
    fn device(&self) -> Device {
        self.device
    }
    fn alloc_zeroed(&self, dtype: DType, shape: Shape) -> Result<Storage, CoreError> {
        Storage::from_host(
            self.device,
            HostVec::filled(dtype, shape.numel(), 0.0),
            shape,
        )
    }
    fn upload(&self, dst: TensorMut<'_>, src: HostSlice<'_>) -> Result<(), CoreError> {
        same_len("upload source", dst.len(), src.len())?;
        let d = dst.into_host_slice().ok_or(CoreError::NotOnHost {
            name: "upload destination",
            device: self.device,
        })?;
        match (d, src) {
            (HostSliceMut::F32(d), HostSlice::F32(s)) => d.copy_from_slice(s),
            (HostSliceMut::F16(d), HostSlice::F16(s)) => d.copy_from_slice(s),
            (HostSliceMut::BF16(d), HostSlice::BF16(s)) => d.copy_from_slice(s),
            (HostSliceMut::F8E4M3(d), HostSlice::F8E4M3(s)) => d.copy_from_slice(s),
            (d, s) => {
                return Err(CoreError::DTypeMismatch {
                    name: "upload source",
                    expected: d.dtype(),
                    actual: s.dtype(),
                })
            }
        }
        Ok(())
    }
    fn download(&self, src: TensorRef<'_>, dst: HostSliceMut<'_>) -> Result<(), CoreError> {
        same_len("download destination", src.len(), dst.len())?;
        let s = src.host_slice().ok_or(CoreError::NotOnHost {
            name: "download source",
            device: self.device,
        })?;
        match (dst, s) {
            (HostSliceMut::F32(d), HostSlice::F32(s)) => d.copy_from_slice(s),
            (HostSliceMut::F16(d), HostSlice::F16(s)) => d.copy_from_slice(s),
            (HostSliceMut::BF16(d), HostSlice::BF16(s)) => d.copy_from_slice(s),
            (HostSliceMut::F8E4M3(d), HostSlice::F8E4M3(s)) => d.copy_from_slice(s),
            (d, s) => {
                return Err(CoreError::DTypeMismatch {
                    name: "download destination",
                    expected: s.dtype(),
                    actual: d.dtype(),
                })
            }
        }
        Ok(())
    }
    fn synchronize(&self) -> Result<(), CoreError> {
        Ok(())
    }
    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }
}

/// A device runtime crate's entry: which device family it serves, why it cannot
/// (no driver, no device), and how to open a device of that family.
pub struct DeviceRegistration {
    pub kind: DeviceKind,
    /// The crate that registered it (for messages).
    pub provider: &'static str,
    /// Why no device of this family can be opened here (e.g. "not compiled with CUDA",
    /// "no CUDA driver found"); empty when one may be.
    pub unavailable: fn() -> Option<String>,
    pub open: fn(Device) -> Result<Arc<dyn DeviceRuntime>, CoreError>,
}

inventory::collect!(DeviceRegistration);

/// Registers a device runtime: `register_device!(DeviceRegistration { .. });`
#[macro_export]
macro_rules! register_device {
    ($reg:expr) => {
        $crate::inventory::submit! { $reg }
    };
}

fn registration(kind: DeviceKind) -> Option<&'static DeviceRegistration> {
    inventory::iter::<DeviceRegistration>
        .into_iter()
        .find(|r| r.kind == kind)
}

/// Why `device` cannot be used in this process, or `None` if it may be opened.
/// Host devices always can.
pub fn device_unavailable(device: Device) -> Option<String> {
    if device.is_host() {
        return None;
    }
    match registration(device.kind()) {
        Some(r) => (r.unavailable)(),
        None => Some(format!(
            "this binary links no {} runtime (pagoda-cuda is not among its dependencies)",
            device.kind()
        )),
    }
}

/// The runtime of `device`: [`HostRuntime`] for `cpu` and `emu`, the registered
/// runtime for others; [`CoreError::DeviceUnavailable`] with the reason otherwise.
pub fn open_device(device: Device) -> Result<Arc<dyn DeviceRuntime>, CoreError> {
    if device.is_host() {
        return Ok(Arc::new(HostRuntime::new(device)?));
    }
    if let Some(message) = device_unavailable(device) {
        return Err(CoreError::DeviceUnavailable { device, message });
    }
    let r = registration(device.kind()).ok_or_else(|| CoreError::DeviceUnavailable {
        device,
        message: "no runtime registered".into(),
    })?;
    (r.open)(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_devices_open_and_copy() {
        let rt = open_device(Device::Emu).unwrap();
        let mut s = rt.alloc_zeroed(DType::F32, Shape::flat(3)).unwrap();
        assert_eq!(s.device(), Device::Emu);
        rt.upload(s.view_mut(), HostSlice::F32(&[1.0, 2.0, 3.0]))
            .unwrap();
        let mut back = [0.0f32; 3];
        rt.download(s.view(), HostSliceMut::F32(&mut back)).unwrap();
        assert_eq!(back, [1.0, 2.0, 3.0]);
        assert!(rt.upload(s.view_mut(), HostSlice::F32(&[1.0])).is_err());
        let half = [half::bf16::ZERO; 3];
        assert!(matches!(
            rt.upload(s.view_mut(), HostSlice::BF16(&half)),
            Err(CoreError::DTypeMismatch { .. })
        ));
    }

    #[test]
    fn a_cuda_device_without_a_runtime_is_a_clear_error() {
        // core's own tests link no device runtime crate.
        let e = open_device(Device::Cuda(0)).err().unwrap();
        assert!(matches!(e, CoreError::DeviceUnavailable { .. }));
        assert!(e.to_string().contains("cuda:0"), "{e}");
        assert!(device_unavailable(Device::Cpu).is_none());
    }
}
