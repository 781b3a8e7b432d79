//! Device and dtype as properties of the data: [`Device`], [`DType`], the owned
//! [`Storage`] of one buffer and the borrowed views [`TensorRef`] / [`TensorMut`]
//! (device, dtype, shape) that the attention protocol and the KV cache are built on.
//!
//! Host memory (the `cpu` device and the `emu` device, which runs the CUDA kernels
//! compiled for the host) is held here as typed `Vec`s. Memory of a real device is
//! owned by that device's runtime crate and reaches core only as an opaque
//! [`DeviceMemory`] box whose views carry a [`DevicePtr`] (an address and a length):
//! core knows no CUDA (candle's `Device`/`Storage` split is the model).
//!
//! Its modules, leaf first (each uses only the ones named before it here):
//! `props` (device and dtype, used by the crate's error type too), `host` (typed host
//! slices), `view` (borrowed views and their shape) and `storage` (owned buffers).
//! This module only wires them, and parses a [`Device`] (that parse fails with a
//! [`CoreError`], which `props` must not name).

mod host;
mod props;
mod storage;
mod view;

pub use host::{HostElem, HostSlice, HostSliceMut};
pub use props::{DType, Device, DeviceKind};
pub use storage::{scatter_rows, HostVec, Storage};
pub use view::{DeviceMemory, DevicePtr, Shape, TensorMut, TensorRef};

use crate::CoreError;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::F8E4M3;
    use half::bf16;

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
