//! Device and dtype as properties of the data: [`Device`], [`DType`], the owned
//! [`Storage`] of one buffer and the borrowed views [`TensorRef`] / [`TensorMut`]
//! (device, dtype, shape) that the attention protocol and the KV cache are built on.
//!
//! Host memory (the `cpu` device and the `emu` device, which runs the CUDA kernels
//! compiled for the host) is held here as typed `Vec`s. Memory of a real device is
//! owned by that device's runtime crate and reaches core only as an opaque
//! [`DeviceMemory`] box whose views carry a [`DevicePtr`] (an address and a length):
//! core knows no CUDA (candle's `Device`/`Storage` split is the model).

use crate::fp8::F8E4M3;
use crate::CoreError;
use half::{bf16, f16};
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

impl std::str::FromStr for Device {
    type Err = CoreError;

    /// vLLM's `--device` spelling: `cpu`, `cuda`, `cuda:N`, and Pagoda's `emu`.
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let bad = || CoreError::InvalidDevice {
            spec: s.to_string(),
        };
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            "emu" => Ok(Device::Emu),
            other => match other.strip_prefix("cuda:") {
                Some(n) => n.parse().map(Device::Cuda).map_err(|_| bad()),
                None => Err(bad()),
            },
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
    /// OCP FP8 E4M3 ([`F8E4M3`]): KV caches only (`--kv-cache-dtype fp8`), read by
    /// the CPU attention backends.
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

/// A host element type a view can be read as.
pub trait HostElem: Copy + Send + Sync + 'static + sealed::Sealed {
    const DTYPE: DType;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    #[doc(hidden)]
    fn slice(s: HostSlice<'_>) -> Option<&[Self]>;
    #[doc(hidden)]
    fn slice_mut(s: HostSliceMut<'_>) -> Option<&mut [Self]>;
    #[doc(hidden)]
    fn wrap(x: &[Self]) -> HostSlice<'_>;
    #[doc(hidden)]
    fn wrap_mut(x: &mut [Self]) -> HostSliceMut<'_>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for crate::fp8::F8E4M3 {}
}

macro_rules! host_elem {
    ($t:ty, $variant:ident, $from:expr, $to:expr) => {
        impl HostElem for $t {
            const DTYPE: DType = DType::$variant;
            fn from_f32(x: f32) -> Self {
                $from(x)
            }
            fn to_f32(self) -> f32 {
                $to(self)
            }
            fn slice(s: HostSlice<'_>) -> Option<&[Self]> {
                match s {
                    HostSlice::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn slice_mut(s: HostSliceMut<'_>) -> Option<&mut [Self]> {
                match s {
                    HostSliceMut::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn wrap(x: &[Self]) -> HostSlice<'_> {
                HostSlice::$variant(x)
            }
            fn wrap_mut(x: &mut [Self]) -> HostSliceMut<'_> {
                HostSliceMut::$variant(x)
            }
        }
    };
}
host_elem!(f32, F32, |x| x, |x| x);
host_elem!(f16, F16, f16::from_f32, f16::to_f32);
host_elem!(bf16, BF16, bf16::from_f32, bf16::to_f32);
host_elem!(F8E4M3, F8E4M3, F8E4M3::from_f32, F8E4M3::to_f32);

/// Host elements of one dtype, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum HostSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    F8E4M3(&'a [F8E4M3]),
}

/// Host elements of one dtype, borrowed mutably.
#[derive(Debug)]
pub enum HostSliceMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    F8E4M3(&'a mut [F8E4M3]),
}

impl HostSlice<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::F32(_) => DType::F32,
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
            HostSlice::F8E4M3(_) => DType::F8E4M3,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(x) => x.len(),
            HostSlice::F16(x) => x.len(),
            HostSlice::BF16(x) => x.len(),
            HostSlice::F8E4M3(x) => x.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element `i` widened to f32 (slow path: references and tests).
    ///
    /// # Panics
    /// If `i` is out of bounds, as slice indexing does.
    pub fn at(&self, i: usize) -> f32 {
        match self {
            HostSlice::F32(x) => x[i],
            HostSlice::F16(x) => x[i].to_f32(),
            HostSlice::BF16(x) => x[i].to_f32(),
            HostSlice::F8E4M3(x) => x[i].to_f32(),
        }
    }
    /// Element `i` widened to f32, `None` out of bounds.
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        match self {
            HostSlice::F32(x) => x.get(i).copied(),
            HostSlice::F16(x) => x.get(i).map(|v| v.to_f32()),
            HostSlice::BF16(x) => x.get(i).map(|v| v.to_f32()),
            HostSlice::F8E4M3(x) => x.get(i).map(|v| v.to_f32()),
        }
    }
}

impl HostSliceMut<'_> {
    pub fn dtype(&self) -> DType {
        self.reborrow().dtype()
    }
    pub fn len(&self) -> usize {
        self.reborrow().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sets element `i` to `x` rounded to this slice's dtype (slow path: references).
    ///
    /// # Panics
    /// If `i` is out of bounds, as slice indexing does.
    pub fn set(&mut self, i: usize, x: f32) {
        match self {
            HostSliceMut::F32(o) => o[i] = x,
            HostSliceMut::F16(o) => o[i] = f16::from_f32(x),
            HostSliceMut::BF16(o) => o[i] = bf16::from_f32(x),
            HostSliceMut::F8E4M3(o) => o[i] = F8E4M3::from_f32(x),
        }
    }
    /// A read-only view of the same elements.
    pub fn reborrow(&self) -> HostSlice<'_> {
        match self {
            HostSliceMut::F32(x) => HostSlice::F32(x),
            HostSliceMut::F16(x) => HostSlice::F16(x),
            HostSliceMut::BF16(x) => HostSlice::BF16(x),
            HostSliceMut::F8E4M3(x) => HostSlice::F8E4M3(x),
        }
    }
    fn reborrow_mut(&mut self) -> HostSliceMut<'_> {
        match self {
            HostSliceMut::F32(x) => HostSliceMut::F32(x),
            HostSliceMut::F16(x) => HostSliceMut::F16(x),
            HostSliceMut::BF16(x) => HostSliceMut::BF16(x),
            HostSliceMut::F8E4M3(x) => HostSliceMut::F8E4M3(x),
        }
    }
    /// Copies `src[s]` into `self[d]`, converting to this slice's dtype (f32 sources
    /// are rounded to nearest even). Ranges must be in bounds and of equal length.
    fn copy_converted(
        &mut self,
        d: std::ops::Range<usize>,
        src: HostSlice<'_>,
        s: std::ops::Range<usize>,
    ) {
        fn conv<T: HostElem>(dst: &mut [T], src: HostSlice<'_>) {
            match src {
                HostSlice::F32(x) => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, v)| *d = T::from_f32(*v)),
                HostSlice::F16(x) => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, v)| *d = T::from_f32(v.to_f32())),
                HostSlice::BF16(x) => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, v)| *d = T::from_f32(v.to_f32())),
                HostSlice::F8E4M3(x) => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, v)| *d = T::from_f32(v.to_f32())),
            }
        }
        let src = match src {
            HostSlice::F32(x) => HostSlice::F32(&x[s]),
            HostSlice::F16(x) => HostSlice::F16(&x[s]),
            HostSlice::BF16(x) => HostSlice::BF16(&x[s]),
            HostSlice::F8E4M3(x) => HostSlice::F8E4M3(&x[s]),
        };
        match (self.reborrow_mut(), src) {
            // Same dtype: a plain copy.
            (HostSliceMut::F32(o), HostSlice::F32(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::F16(o), HostSlice::F16(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::BF16(o), HostSlice::BF16(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::F8E4M3(o), HostSlice::F8E4M3(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::F32(o), x) => conv(&mut o[d], x),
            (HostSliceMut::F16(o), x) => conv(&mut o[d], x),
            (HostSliceMut::BF16(o), x) => conv(&mut o[d], x),
            (HostSliceMut::F8E4M3(o), x) => conv(&mut o[d], x),
        }
    }
}

mod storage;
mod view;

pub use storage::{scatter_rows, HostVec, Storage};
pub use view::{DeviceMemory, DevicePtr, Shape, TensorMut, TensorRef};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_as_vllm_spells_them() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert_eq!("emu".parse::<Device>(), Ok(Device::Emu));
        for bad in ["tpu", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(e.to_string().contains("cpu, cuda, cuda:N"), "{e}");
        }
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    }

    #[test]
    fn views_know_their_dtype_and_refuse_the_wrong_one() {
        let x = [bf16::from_f32(1.5); 6];
        let v = TensorRef::host_shaped(Device::Emu, &x, Shape::new(&[2, 3]).unwrap()).unwrap();
        assert_eq!(
            (v.dtype(), v.device_of(), v.len()),
            (DType::BF16, Device::Emu, 6)
        );
        assert_eq!(v.as_host::<bf16>("q").unwrap()[0].to_f32(), 1.5);
        assert_eq!(
            v.as_f32("q"),
            Err(CoreError::DTypeMismatch {
                name: "q",
                expected: DType::F32,
                actual: DType::BF16
            })
        );
        assert!(TensorRef::host(Device::Cuda(0), &x).is_err());
        assert!(TensorRef::host_shaped(Device::Cpu, &x, Shape::new(&[4]).unwrap()).is_err());
    }

    #[test]
    fn device_views_carry_an_address_and_are_not_host() {
        let ptr = DevicePtr {
            addr: 0x1000,
            len_bytes: 64,
        };
        let v = TensorRef::device(Device::Cuda(0), DType::F16, ptr, Shape::new(&[32]).unwrap())
            .unwrap();
        assert_eq!(v.device_ptr(), Some(ptr));
        assert!(matches!(v.as_f32("k"), Err(CoreError::NotOnHost { .. })));
        // 33 f16s do not fit in 64 bytes.
        assert!(
            TensorRef::device(Device::Cuda(0), DType::F16, ptr, Shape::new(&[33]).unwrap())
                .is_err()
        );
    }

    #[test]
    fn splits_keep_rows_and_offset_device_addresses() {
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let v = TensorRef::host_shaped(Device::Cpu, &x, Shape::new(&[4, 3]).unwrap()).unwrap();
        let (a, b) = v.split_at(3).unwrap();
        assert_eq!(
            (a.shape().dims(), b.shape().dims()),
            (&[1, 3][..], &[3, 3][..])
        );
        assert_eq!(b.as_f32("b").unwrap()[0], 3.0);
        let (a, _) = v.split_at(4).unwrap();
        assert_eq!(a.shape().dims(), &[4]);
        assert!(v.split_at(13).is_err());
        let ptr = DevicePtr {
            addr: 1000,
            len_bytes: 24,
        };
        let mut y = [0.0f32; 2];
        let _ = TensorMut::cpu(&mut y).split_at(1).unwrap();
        let d = TensorMut::device(
            Device::Cuda(0),
            DType::BF16,
            ptr,
            Shape::new(&[4, 3]).unwrap(),
        )
        .unwrap();
        let (a, b) = d.split_at(6).unwrap();
        assert_eq!(
            a.device_ptr(),
            Some(DevicePtr {
                addr: 1000,
                len_bytes: 12
            })
        );
        assert_eq!(
            b.device_ptr(),
            Some(DevicePtr {
                addr: 1012,
                len_bytes: 12
            })
        );
    }

    #[test]
    fn fp8_storage_is_one_byte_an_element_and_rounds_on_every_write() {
        let shape = Shape::new(&[2, 3]).unwrap();
        let mut s = Storage::host_filled(Device::Cpu, DType::F8E4M3, shape, 500.0).unwrap();
        assert_eq!((s.dtype(), s.size_bytes()), (DType::F8E4M3, 6));
        assert_eq!(DType::F8E4M3.to_string(), "fp8_e4m3");
        // Filled with 500: clamped to the largest finite value.
        assert!(s
            .host::<F8E4M3>()
            .unwrap()
            .iter()
            .all(|x| x.to_f32() == 448.0));
        let (a, b) = s.view().split_at(3).unwrap();
        assert_eq!((a.shape().dims(), b.dtype()), (&[1, 3][..], DType::F8E4M3));
        let (_, mut b) = s.view_mut().split_at(3).unwrap();
        b.reborrow().into_host_slice().unwrap().set(2, 0.3);
        let src = [1.0f32, -0.3];
        scatter_rows(&mut s.view_mut(), TensorRef::cpu(&src), &[1], 2, "k").unwrap();
        let got = s.host::<F8E4M3>().unwrap();
        assert_eq!(got[2..4], [F8E4M3::from_f32(1.0), F8E4M3::from_f32(-0.3)]);
        assert_eq!((got[3].to_f32(), got[5].to_f32()), (-0.3125, 0.3125));
        assert_eq!(s.view().host_slice().unwrap().at(3), -0.3125);
        assert!(s.host::<f32>().is_err());
    }

    #[test]
    fn scatter_rows_converts_to_the_destination_dtype() {
        let mut s =
            Storage::host_filled(Device::Cpu, DType::BF16, Shape::flat(6), f32::NAN).unwrap();
        let src = [1.0f32, 2.0, 3.0, 4.0];
        scatter_rows(&mut s.view_mut(), TensorRef::cpu(&src), &[2, -1], 2, "k").unwrap();
        let got: Vec<f32> = s
            .host::<bf16>()
            .unwrap()
            .iter()
            .map(|x| x.to_f32())
            .collect();
        assert!(got[..4].iter().all(|x| x.is_nan()));
        assert_eq!(&got[4..], &[1.0, 2.0]);
        let e = scatter_rows(&mut s.view_mut(), TensorRef::cpu(&src), &[3, 0], 2, "k").unwrap_err();
        assert!(matches!(e, CoreError::InvalidBatch { .. }));
    }
}
