//! Device and dtype as properties of the data: [`Device`], [`DType`], the owned
//! [`Storage`] of one buffer and the borrowed views [`TensorRef`] / [`TensorMut`]
//! (device, dtype, shape) that the attention protocol and the KV cache are built on.
//!
//! Host memory (the `cpu` device and the `emu` device, which runs the CUDA kernels
//! compiled for the host) is held here as typed `Vec`s. Memory of a real device is
//! owned by that device's runtime crate and reaches core only as an opaque
//! [`DeviceMemory`] box whose views carry a [`DevicePtr`] (an address and a length):
//! core knows no CUDA (candle's `Device`/`Storage` split is the model).

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
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
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

/// Host elements of one dtype, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum HostSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// Host elements of one dtype, borrowed mutably.
#[derive(Debug)]
pub enum HostSliceMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
}

impl HostSlice<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::F32(_) => DType::F32,
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(x) => x.len(),
            HostSlice::F16(x) => x.len(),
            HostSlice::BF16(x) => x.len(),
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
        }
    }
    /// Element `i` widened to f32, `None` out of bounds.
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        match self {
            HostSlice::F32(x) => x.get(i).copied(),
            HostSlice::F16(x) => x.get(i).map(|v| v.to_f32()),
            HostSlice::BF16(x) => x.get(i).map(|v| v.to_f32()),
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
        }
    }
    /// A read-only view of the same elements.
    pub fn reborrow(&self) -> HostSlice<'_> {
        match self {
            HostSliceMut::F32(x) => HostSlice::F32(x),
            HostSliceMut::F16(x) => HostSlice::F16(x),
            HostSliceMut::BF16(x) => HostSlice::BF16(x),
        }
    }
    fn reborrow_mut(&mut self) -> HostSliceMut<'_> {
        match self {
            HostSliceMut::F32(x) => HostSliceMut::F32(x),
            HostSliceMut::F16(x) => HostSliceMut::F16(x),
            HostSliceMut::BF16(x) => HostSliceMut::BF16(x),
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
            }
        }
        let src = match src {
            HostSlice::F32(x) => HostSlice::F32(&x[s]),
            HostSlice::F16(x) => HostSlice::F16(&x[s]),
            HostSlice::BF16(x) => HostSlice::BF16(&x[s]),
        };
        match (self.reborrow_mut(), src) {
            // Same dtype: a plain copy.
            (HostSliceMut::F32(o), HostSlice::F32(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::F16(o), HostSlice::F16(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::BF16(o), HostSlice::BF16(x)) => o[d].copy_from_slice(x),
            (HostSliceMut::F32(o), x) => conv(&mut o[d], x),
            (HostSliceMut::F16(o), x) => conv(&mut o[d], x),
            (HostSliceMut::BF16(o), x) => conv(&mut o[d], x),
        }
    }
}

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
enum Data<'a> {
    Host(HostSlice<'a>),
    Device { dtype: DType, ptr: DevicePtr },
}

#[derive(Debug)]
enum DataMut<'a> {
    Host(HostSliceMut<'a>),
    Device { dtype: DType, ptr: DevicePtr },
}

/// A read-only view of one buffer: device, dtype and shape travel with the data.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    device: Device,
    shape: Shape,
    data: Data<'a>,
}

/// A writable view of one buffer.
#[derive(Debug)]
pub struct TensorMut<'a> {
    device: Device,
    shape: Shape,
    data: DataMut<'a>,
}

fn host_view_check(device: Device, len: usize, shape: &Shape) -> Result<(), CoreError> {
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

fn device_view_check(
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

/// Owned elements of a host device.
#[derive(Debug, Clone, PartialEq)]
pub enum HostVec {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl HostVec {
    /// `len` elements of `dtype`, each `value` rounded to it.
    pub fn filled(dtype: DType, len: usize, value: f32) -> Self {
        match dtype {
            DType::F32 => HostVec::F32(vec![value; len]),
            DType::F16 => HostVec::F16(vec![f16::from_f32(value); len]),
            DType::BF16 => HostVec::BF16(vec![bf16::from_f32(value); len]),
        }
    }
    fn slice(&self) -> HostSlice<'_> {
        match self {
            HostVec::F32(x) => HostSlice::F32(x),
            HostVec::F16(x) => HostSlice::F16(x),
            HostVec::BF16(x) => HostSlice::BF16(x),
        }
    }
    fn slice_mut(&mut self) -> HostSliceMut<'_> {
        match self {
            HostVec::F32(x) => HostSliceMut::F32(x),
            HostVec::F16(x) => HostSliceMut::F16(x),
            HostVec::BF16(x) => HostSliceMut::BF16(x),
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
