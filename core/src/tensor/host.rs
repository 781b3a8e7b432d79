//! Host elements of one dtype: the element types a view can be read as
//! ([`HostElem`]) and borrowed typed slices of them ([`HostSlice`], [`HostSliceMut`]).
//!
//! Shared by the owned buffers (`storage`) and the views (`view`), so it sits below
//! both: it uses only the dtype it tags (`props`) and the fp8 element, never the
//! buffers or views themselves.

use super::props::DType;
use crate::fp8::F8E4M3;
use half::{bf16, f16};

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
    /// A shorter-lived writable view of the same elements (for the views and
    /// buffers beside this module, hence `pub(super)`).
    pub(super) fn reborrow_mut(&mut self) -> HostSliceMut<'_> {
        match self {
            HostSliceMut::F32(x) => HostSliceMut::F32(x),
            HostSliceMut::F16(x) => HostSliceMut::F16(x),
            HostSliceMut::BF16(x) => HostSliceMut::BF16(x),
            HostSliceMut::F8E4M3(x) => HostSliceMut::F8E4M3(x),
        }
    }
    /// Copies `src[s]` into `self[d]`, converting to this slice's dtype (f32 sources
    /// are rounded to nearest even). Ranges must be in bounds and of equal length.
    /// `pub(super)`: `storage`'s row scatter is its caller.
    pub(super) fn copy_converted(
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
