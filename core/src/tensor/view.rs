//! Borrowed views of one buffer: [`TensorRef`] / [`TensorMut`] (device, dtype,
//! shape; host slices or a [`DevicePtr`] into device memory), and [`Shape`].

use super::host::{HostElem, HostSlice, HostSliceMut};
use super::props::{DType, Device};
use crate::CoreError;
use std::fmt;

/// An address range in a device's memory: opaque to core (a `CUdeviceptr` for CUDA).
/// Only the device's runtime and kernels dereference it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr {
    pub addr: u64,
    pub len_bytes: usize,
}

/// Device memory owned by a device runtime (e.g. a `CudaSlice` in the CUDA crate).
/// Dropping it frees the memory.
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// The whole allocation.
    fn ptr(&self) -> DevicePtr;
}

/// Up to 4 dimensions, row-major.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    dims: [usize; 4],
    rank: u8,
}

impl Shape {
    /// A shape of `dims` (at most 4; more is a [`CoreError::InvalidShape`]).
    pub fn new(dims: &[usize]) -> Result<Self, CoreError> {
        if dims.len() > 4 {
            return Err(CoreError::InvalidShape {
                message: format!("{} dimensions, at most 4 are supported", dims.len()),
            });
        }
        let mut d = [1; 4];
        d[..dims.len()].copy_from_slice(dims);
        Ok(Shape {
            dims: d,
            rank: dims.len() as u8,
        })
    }
    /// A flat shape of `n` elements.
    pub fn flat(n: usize) -> Self {
        Shape {
            dims: [n, 1, 1, 1],
            rank: 1,
        }
    }
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

/// The shapes of the two parts of a split at element `at` of `shape` (0 < at <= numel
/// checked by the caller): whole leading rows keep the trailing dimensions, other
/// splits are flat.
fn split_shapes(shape: Shape, at: usize) -> (Shape, Shape) {
    let dims = shape.dims();
    let row: usize = dims.iter().skip(1).product();
    let n = shape.numel();
    if dims.len() > 1 && row > 0 && at.is_multiple_of(row) {
        let (mut a, mut b) = (shape, shape);
        a.dims[0] = at / row;
        b.dims[0] = (n - at) / row;
        (a, b)
    } else {
        (Shape::flat(at), Shape::flat(n - at))
    }
}

fn split_check(len: usize, at: usize) -> Result<(), CoreError> {
    if at > len {
        return Err(CoreError::InvalidShape {
            message: format!("cannot split {len} elements at {at}"),
        });
    }
    Ok(())
}

fn offset_ptr(ptr: DevicePtr, dtype: DType, at: usize) -> (DevicePtr, DevicePtr) {
    let bytes = at * dtype.size();
    (
        DevicePtr {
            addr: ptr.addr,
            len_bytes: bytes,
        },
        DevicePtr {
            addr: ptr.addr + bytes as u64,
            len_bytes: ptr.len_bytes.saturating_sub(bytes),
        },
    )
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Data<'a> {
    Host(HostSlice<'a>),
    Device { dtype: DType, ptr: DevicePtr },
}

#[derive(Debug)]
pub(super) enum DataMut<'a> {
    Host(HostSliceMut<'a>),
    Device { dtype: DType, ptr: DevicePtr },
}

/// A read-only view of one buffer: device, dtype and shape travel with the data.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub(super) device: Device,
    pub(super) shape: Shape,
    pub(super) data: Data<'a>,
}

/// A writable view of one buffer.
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub(super) device: Device,
    pub(super) shape: Shape,
    pub(super) data: DataMut<'a>,
}

pub(super) fn host_view_check(device: Device, len: usize, shape: &Shape) -> Result<(), CoreError> {
    if !device.is_host() {
        return Err(CoreError::DeviceMismatch {
            name: "host slice",
            expected: device,
            actual: Device::Cpu,
        });
    }
    if shape.numel() != len {
        return Err(CoreError::InvalidShape {
            message: format!(
                "shape {shape} has {} elements, the data {len}",
                shape.numel()
            ),
        });
    }
    Ok(())
}

impl<'a> TensorRef<'a> {
    /// A flat CPU view of f32s (the common case of the CPU path).
    pub fn cpu(x: &'a [f32]) -> Self {
        TensorRef {
            device: Device::Cpu,
            shape: Shape::flat(x.len()),
            data: Data::Host(HostSlice::F32(x)),
        }
    }
    /// A flat view of host elements on a host device (`cpu` or `emu`).
    pub fn host<T: HostElem>(device: Device, x: &'a [T]) -> Result<Self, CoreError> {
        Self::host_shaped(device, x, Shape::flat(x.len()))
    }
    /// A shaped view of host elements on a host device.
    pub fn host_shaped<T: HostElem>(
        device: Device,
        x: &'a [T],
        shape: Shape,
    ) -> Result<Self, CoreError> {
        host_view_check(device, x.len(), &shape)?;
        Ok(TensorRef {
            device,
            shape,
            data: Data::Host(T::wrap(x)),
        })
    }
    /// A view of device memory. Only a device runtime should build these: the address
    /// must point at `shape.numel()` elements of `dtype` on `device`.
    pub fn device(
        device: Device,
        dtype: DType,
        ptr: DevicePtr,
        shape: Shape,
    ) -> Result<Self, CoreError> {
        device_view_check(device, dtype, ptr, &shape)?;
        Ok(TensorRef {
            device,
            shape,
            data: Data::Device { dtype, ptr },
        })
    }
    pub fn device_of(&self) -> Device {
        self.device
    }
    pub fn dtype(&self) -> DType {
        match self.data {
            Data::Host(s) => s.dtype(),
            Data::Device { dtype, .. } => dtype,
        }
    }
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.numel()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The same data seen as another shape of as many elements.
    pub fn reshape(self, shape: Shape) -> Result<Self, CoreError> {
        if shape.numel() != self.len() {
            return Err(CoreError::InvalidShape {
                message: format!("cannot view {} elements as {shape}", self.len()),
            });
        }
        Ok(TensorRef { shape, ..self })
    }
    /// The first `at` elements and the rest (row splits keep the trailing dimensions).
    pub fn split_at(self, at: usize) -> Result<(Self, Self), CoreError> {
        split_check(self.len(), at)?;
        let (sa, sb) = split_shapes(self.shape, at);
        let (da, db) = match self.data {
            Data::Host(h) => {
                let (a, b) = match h {
                    HostSlice::F32(x) => (HostSlice::F32(&x[..at]), HostSlice::F32(&x[at..])),
                    HostSlice::F16(x) => (HostSlice::F16(&x[..at]), HostSlice::F16(&x[at..])),
                    HostSlice::BF16(x) => (HostSlice::BF16(&x[..at]), HostSlice::BF16(&x[at..])),
                    HostSlice::F8E4M3(x) => {
                        (HostSlice::F8E4M3(&x[..at]), HostSlice::F8E4M3(&x[at..]))
                    }
                };
                (Data::Host(a), Data::Host(b))
            }
            Data::Device { dtype, ptr } => {
                let (a, b) = offset_ptr(ptr, dtype, at);
                (
                    Data::Device { dtype, ptr: a },
                    Data::Device { dtype, ptr: b },
                )
            }
        };
        let part = |shape, data| TensorRef {
            device: self.device,
            shape,
            data,
        };
        Ok((part(sa, da), part(sb, db)))
    }
    /// The host elements, if this view is host memory (any dtype).
    pub fn host_slice(&self) -> Option<HostSlice<'a>> {
        match self.data {
            Data::Host(s) => Some(s),
            Data::Device { .. } => None,
        }
    }
    /// The host elements as `T`; `name` labels the error (dtype or device mismatch).
    pub fn as_host<T: HostElem>(&self, name: &'static str) -> Result<&'a [T], CoreError> {
        match self.data {
            Data::Host(s) => T::slice(s).ok_or(CoreError::DTypeMismatch {
                name,
                expected: T::DTYPE,
                actual: s.dtype(),
            }),
            Data::Device { .. } => Err(CoreError::NotOnHost {
                name,
                device: self.device,
            }),
        }
    }
    /// The host f32s (what the CPU kernels read).
    pub fn as_f32(&self, name: &'static str) -> Result<&'a [f32], CoreError> {
        self.as_host::<f32>(name)
    }
    /// The device address, if this view is device memory.
    pub fn device_ptr(&self) -> Option<DevicePtr> {
        match self.data {
            Data::Device { ptr, .. } => Some(ptr),
            Data::Host(_) => None,
        }
    }
}

pub(super) fn device_view_check(
    device: Device,
    dtype: DType,
    ptr: DevicePtr,
    shape: &Shape,
) -> Result<(), CoreError> {
    if device.is_host() {
        return Err(CoreError::DeviceMismatch {
            name: "device pointer",
            expected: Device::Cuda(0),
            actual: device,
        });
    }
    let need = shape.numel() * dtype.size();
    if ptr.len_bytes < need {
        return Err(CoreError::InvalidShape {
            message: format!(
                "shape {shape} of {dtype} needs {need} bytes, the allocation has {}",
                ptr.len_bytes
            ),
        });
    }
    Ok(())
}

impl<'a> TensorMut<'a> {
    /// A flat CPU view of f32s.
    pub fn cpu(x: &'a mut [f32]) -> Self {
        TensorMut {
            device: Device::Cpu,
            shape: Shape::flat(x.len()),
            data: DataMut::Host(HostSliceMut::F32(x)),
        }
    }
    /// A flat view of host elements on a host device (`cpu` or `emu`).
    pub fn host<T: HostElem>(device: Device, x: &'a mut [T]) -> Result<Self, CoreError> {
        let shape = Shape::flat(x.len());
        Self::host_shaped(device, x, shape)
    }
    /// A shaped view of host elements on a host device.
    pub fn host_shaped<T: HostElem>(
        device: Device,
        x: &'a mut [T],
        shape: Shape,
    ) -> Result<Self, CoreError> {
        host_view_check(device, x.len(), &shape)?;
        Ok(TensorMut {
            device,
            shape,
            data: DataMut::Host(T::wrap_mut(x)),
        })
    }
    /// A writable view of device memory (see [`TensorRef::device`]).
    pub fn device(
        device: Device,
        dtype: DType,
        ptr: DevicePtr,
        shape: Shape,
    ) -> Result<Self, CoreError> {
        device_view_check(device, dtype, ptr, &shape)?;
        Ok(TensorMut {
            device,
            shape,
            data: DataMut::Device { dtype, ptr },
        })
    }
    pub fn device_of(&self) -> Device {
        self.device
    }
    pub fn dtype(&self) -> DType {
        match &self.data {
            DataMut::Host(s) => s.dtype(),
            DataMut::Device { dtype, .. } => *dtype,
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
    /// A shorter-lived writable view of the same data.
    pub fn reborrow(&mut self) -> TensorMut<'_> {
        TensorMut {
            device: self.device,
            shape: self.shape,
            data: match &mut self.data {
                DataMut::Host(s) => DataMut::Host(s.reborrow_mut()),
                DataMut::Device { dtype, ptr } => DataMut::Device {
                    dtype: *dtype,
                    ptr: *ptr,
                },
            },
        }
    }
    /// A read-only view of the same data.
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            device: self.device,
            shape: self.shape,
            data: match &self.data {
                DataMut::Host(s) => Data::Host(s.reborrow()),
                DataMut::Device { dtype, ptr } => Data::Device {
                    dtype: *dtype,
                    ptr: *ptr,
                },
            },
        }
    }
    /// The same data seen as another shape of as many elements.
    pub fn reshape(self, shape: Shape) -> Result<Self, CoreError> {
        if shape.numel() != self.len() {
            return Err(CoreError::InvalidShape {
                message: format!("cannot view {} elements as {shape}", self.len()),
            });
        }
        Ok(TensorMut { shape, ..self })
    }
    /// The first `at` elements and the rest (row splits keep the trailing dimensions).
    pub fn split_at(self, at: usize) -> Result<(Self, Self), CoreError> {
        split_check(self.len(), at)?;
        let (sa, sb) = split_shapes(self.shape, at);
        let device = self.device;
        let (da, db) = match self.data {
            DataMut::Host(h) => {
                let (a, b) = match h {
                    HostSliceMut::F32(x) => {
                        let (a, b) = x.split_at_mut(at);
                        (HostSliceMut::F32(a), HostSliceMut::F32(b))
                    }
                    HostSliceMut::F16(x) => {
                        let (a, b) = x.split_at_mut(at);
                        (HostSliceMut::F16(a), HostSliceMut::F16(b))
                    }
                    HostSliceMut::BF16(x) => {
                        let (a, b) = x.split_at_mut(at);
                        (HostSliceMut::BF16(a), HostSliceMut::BF16(b))
                    }
                    HostSliceMut::F8E4M3(x) => {
                        let (a, b) = x.split_at_mut(at);
                        (HostSliceMut::F8E4M3(a), HostSliceMut::F8E4M3(b))
                    }
                };
                (DataMut::Host(a), DataMut::Host(b))
            }
            DataMut::Device { dtype, ptr } => {
                let (a, b) = offset_ptr(ptr, dtype, at);
                (
                    DataMut::Device { dtype, ptr: a },
                    DataMut::Device { dtype, ptr: b },
                )
            }
        };
        Ok((
            TensorMut {
                device,
                shape: sa,
                data: da,
            },
            TensorMut {
                device,
                shape: sb,
                data: db,
            },
        ))
    }
    /// The host elements as `T`, consuming the view (keeps its lifetime).
    pub fn into_host<T: HostElem>(self, name: &'static str) -> Result<&'a mut [T], CoreError> {
        match self.data {
            DataMut::Host(s) => {
                let actual = s.dtype();
                T::slice_mut(s).ok_or(CoreError::DTypeMismatch {
                    name,
                    expected: T::DTYPE,
                    actual,
                })
            }
            DataMut::Device { .. } => Err(CoreError::NotOnHost {
                name,
                device: self.device,
            }),
        }
    }
    /// The host f32s (what the CPU kernels write).
    pub fn into_f32(self, name: &'static str) -> Result<&'a mut [f32], CoreError> {
        self.into_host::<f32>(name)
    }
    /// The host elements, any dtype, consuming the view.
    pub fn into_host_slice(self) -> Option<HostSliceMut<'a>> {
        match self.data {
            DataMut::Host(s) => Some(s),
            DataMut::Device { .. } => None,
        }
    }
    /// The device address, if this view is device memory.
    pub fn device_ptr(&self) -> Option<DevicePtr> {
        match self.data {
            DataMut::Device { ptr, .. } => Some(ptr),
            DataMut::Host(_) => None,
        }
    }
}
