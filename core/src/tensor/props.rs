//! The plain value types that describe data: where it lives ([`Device`], its family
//! [`DeviceKind`]) and its element type ([`DType`]).
//!
//! A leaf: it uses no other module of the crate, so that [`CoreError`](crate::CoreError),
//! whose variants carry these values, can name them without a cycle (error -> here,
//! never back). Parsing a [`Device`] from its `--device` spelling fails with a
//! `CoreError`, so that `FromStr` impl lives one level up, in the tensor module.

use std::fmt;

/// Where data lives and kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory, CPU kernels.
    Cpu,
    /// Memory of the CUDA device with this ordinal.
    Cuda(usize),
    /// Host memory, CUDA kernels compiled for the host through the SIMT emulation
    /// header (slow; for testing kernel logic on machines without a GPU).
    Emu,
}

impl Device {
    /// The device family, for capability lists.
    pub fn kind(self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Cuda(_) => DeviceKind::Cuda,
            Device::Emu => DeviceKind::Emu,
        }
    }

    /// Whether this device's memory is host memory (views hold slices, not addresses).
    pub fn is_host(self) -> bool {
        !matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Emu => write!(f, "emu"),
        }
    }
}

/// A device family, for capability lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Emu,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Emu => "emu",
        })
    }
}

/// Element types of activations, weights and the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// OCP FP8 E4M3 ([`F8E4M3`](crate::fp8::F8E4M3)): KV caches only
    /// (`--kv-cache-dtype fp8`), read by the CPU attention backends.
    F8E4M3,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "fp8_e4m3",
        })
    }
}
