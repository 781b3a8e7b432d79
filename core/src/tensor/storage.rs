//! Owned buffers: [`Storage`] (typed host `Vec`s, or device memory owned by a
//! runtime crate) and [`scatter_rows`].

use super::host::{HostElem, HostSlice, HostSliceMut};
use super::props::{DType, Device};
use super::view::{
    device_view_check, host_view_check, Data, DataMut, DeviceMemory, Shape, TensorMut, TensorRef,
};
use crate::fp8::F8E4M3;
use crate::CoreError;
use half::{bf16, f16};

/// Owned elements of a host device.
#[derive(Debug, Clone, PartialEq)]
pub enum HostVec {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F8E4M3(Vec<F8E4M3>),
}

impl HostVec {
    /// `len` elements of `dtype`, each `value` rounded to it.
    pub fn filled(dtype: DType, len: usize, value: f32) -> Self {
        match dtype {
            DType::F32 => HostVec::F32(vec![value; len]),
            DType::F16 => HostVec::F16(vec![f16::from_f32(value); len]),
            DType::BF16 => HostVec::BF16(vec![bf16::from_f32(value); len]),
            DType::F8E4M3 => HostVec::F8E4M3(vec![F8E4M3::from_f32(value); len]),
        }
    }
    fn slice(&self) -> HostSlice<'_> {
        match self {
            HostVec::F32(x) => HostSlice::F32(x),
            HostVec::F16(x) => HostSlice::F16(x),
            HostVec::BF16(x) => HostSlice::BF16(x),
            HostVec::F8E4M3(x) => HostSlice::F8E4M3(x),
        }
    }
    fn slice_mut(&mut self) -> HostSliceMut<'_> {
        match self {
            HostVec::F32(x) => HostSliceMut::F32(x),
            HostVec::F16(x) => HostSliceMut::F16(x),
            HostVec::BF16(x) => HostSliceMut::BF16(x),
            HostVec::F8E4M3(x) => HostSliceMut::F8E4M3(x),
        }
    }
}

#[derive(Debug)]
enum Mem {
    Host(HostVec),
    Device {
        dtype: DType,
        mem: Box<dyn DeviceMemory>,
    },
}

/// One owned buffer: its device, dtype, shape and memory. Host storage is built here;
/// device storage by the device's runtime ([`Storage::from_device`]).
#[derive(Debug)]
pub struct Storage {
    device: Device,
    shape: Shape,
    mem: Mem,
}

impl Storage {
    /// Host storage of `shape` on a host device, every element `value`.
    pub fn host_filled(
        device: Device,
        dtype: DType,
        shape: Shape,
        value: f32,
    ) -> Result<Self, CoreError> {
        let data = HostVec::filled(dtype, shape.numel(), value);
        Self::from_host(device, data, shape)
    }
    /// Host storage holding `data` as `shape`.
    pub fn from_host(device: Device, data: HostVec, shape: Shape) -> Result<Self, CoreError> {
        host_view_check(device, data.slice().len(), &shape)?;
        Ok(Storage {
            device,
            shape,
            mem: Mem::Host(data),
        })
    }
    /// Storage of device memory that a runtime allocated for `shape` elements of `dtype`.
    pub fn from_device(
        device: Device,
        dtype: DType,
        shape: Shape,
        mem: Box<dyn DeviceMemory>,
    ) -> Result<Self, CoreError> {
        device_view_check(device, dtype, mem.ptr(), &shape)?;
        Ok(Storage {
            device,
            shape,
            mem: Mem::Device { dtype, mem },
        })
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn dtype(&self) -> DType {
        match &self.mem {
            Mem::Host(v) => v.slice().dtype(),
            Mem::Device { dtype, .. } => *dtype,
        }
    }
    pub fn shape(&self) -> Shape {
        self.shape
    }
    pub fn len(&self) -> usize {
        self.shape.numel()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes the elements take.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }
    /// A read-only view of the whole buffer.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            device: self.device,
            shape: self.shape,
            data: match &self.mem {
                Mem::Host(v) => Data::Host(v.slice()),
                Mem::Device { dtype, mem } => Data::Device {
                    dtype: *dtype,
                    ptr: mem.ptr(),
                },
            },
        }
    }
    /// A writable view of the whole buffer.
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        TensorMut {
            device: self.device,
            shape: self.shape,
            data: match &mut self.mem {
                Mem::Host(v) => DataMut::Host(v.slice_mut()),
                Mem::Device { dtype, mem } => DataMut::Device {
                    dtype: *dtype,
                    ptr: mem.ptr(),
                },
            },
        }
    }
    /// The host elements as `T` (tests and CPU code; an error on device memory or
    /// another dtype).
    pub fn host<T: HostElem>(&self) -> Result<&[T], CoreError> {
        self.view().as_host("storage")
    }
    /// The host elements as `T`, writable.
    pub fn host_mut<T: HostElem>(&mut self) -> Result<&mut [T], CoreError> {
        self.view_mut().into_host("storage")
    }
}

/// Copies `src[t]` rows into `dst` rows `dst_rows[t]` (`row_elems` elements each),
/// converting to `dst`'s dtype; rows with a negative index are skipped. Host memory
/// only; the device runtimes have their own kernels for this.
pub fn scatter_rows(
    dst: &mut TensorMut<'_>,
    src: TensorRef<'_>,
    dst_rows: &[i64],
    row_elems: usize,
    name: &'static str,
) -> Result<(), CoreError> {
    let n = dst_rows.len();
    if src.len() != n * row_elems {
        return Err(CoreError::ShapeMismatch {
            name,
            expected: n * row_elems,
            actual: src.len(),
        });
    }
    let device = dst.device_of();
    let Some(src) = src.host_slice() else {
        return Err(CoreError::NotOnHost {
            name,
            device: src.device_of(),
        });
    };
    let mut d = dst.reborrow();
    let num_rows = d.len() / row_elems.max(1);
    let mut out = match d.data {
        DataMut::Host(ref mut s) => s.reborrow_mut(),
        DataMut::Device { .. } => {
            return Err(CoreError::NotOnHost {
                name: "cache",
                device,
            })
        }
    };
    for (t, &row) in dst_rows.iter().enumerate() {
        if row < 0 {
            continue;
        }
        let row = row as usize;
        if row >= num_rows {
            return Err(CoreError::InvalidBatch {
                message: format!("slot {row} out of range for a cache of {num_rows} slots"),
            });
        }
        out.copy_converted(
            row * row_elems..(row + 1) * row_elems,
            src,
            t * row_elems..(t + 1) * row_elems,
        );
    }
    Ok(())
}
