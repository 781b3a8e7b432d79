//! The `cuda` device runtime: why it cannot be opened here, and (feature `cuda`) device
//! memory through cudarc. Never panics: libcuda is probed before cudarc touches it.

use pagoda_core::{
    register_device, CoreError, Device, DeviceKind, DeviceRegistration, DeviceRuntime,
};
use std::sync::Arc;

mod reasons;

pub use reasons::{COMPILED, NOT_COMPILED, NO_DEVICE, NO_DRIVER};

/// Why no `cuda` device can be opened in this process, or `None` if one may be.
pub fn cuda_unavailable() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        device::unavailable()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some(NOT_COMPILED.to_string())
    }
}

fn open(device: Device) -> Result<Arc<dyn DeviceRuntime>, CoreError> {
    if let Some(message) = cuda_unavailable() {
        return Err(CoreError::DeviceUnavailable { device, message });
    }
    #[cfg(feature = "cuda")]
    {
        device::open(device)
    }
    #[cfg(not(feature = "cuda"))]
    {
        unreachable!("cuda_unavailable is always Some without the feature")
    }
}

register_device!(DeviceRegistration {
    kind: DeviceKind::Cuda,
    provider: "pagoda-cuda",
    unavailable: cuda_unavailable,
    open,
});

#[cfg(feature = "cuda")]
mod device;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_family_is_registered_with_an_exact_reason() {
        let reason = pagoda_core::device_unavailable(Device::Cuda(0));
        if COMPILED {
            // Depends on the machine: no driver, no device, or usable.
            if let Some(r) = reason {
                assert!(r == NO_DRIVER || r.starts_with(NO_DEVICE), "{r}");
            }
        } else {
            assert_eq!(reason.as_deref(), Some(NOT_COMPILED));
            let e = pagoda_core::open_device(Device::Cuda(0)).err().unwrap();
            assert!(e.to_string().contains(NOT_COMPILED), "{e}");
        }
    }
}
