//! The lowest layer of the device code path, the only one that differs by device.
//!
//! Everything above a [`Driver`] (the attention backends' `device.rs`, the model ops'
//! `ops.rs`, the `cuda:N` runtime's copies) plans, converts, packs, uploads, allocates,
//! captures and replays the same way on both devices. A driver does what a GPU's
//! driver API does, no more:
//!
//! * memory: [`Driver::alloc_zeroed`] (freed on drop), [`Driver::addr`], and core's
//!   views' addresses ([`Driver::ref_addr`], [`Driver::mut_addr`]);
//! * copies on the device's one stream: host to device ([`Driver::upload`]), device
//!   to host ([`Driver::download`]), device to device ([`Driver::copy_dtod`]);
//! * launches: a named kernel with its packed parameter struct and grid
//!   ([`Driver::launch`] of a [`Call`]), and the linear layers' GEMM ([`Driver::gemm`]);
//! * ordering: events ([`Driver::record_event`], [`Driver::wait_event`]) and
//!   [`Driver::synchronize`];
//! * graphs: [`Driver::begin_capture`], [`Driver::end_capture`], [`Driver::replay`];
//! * [`Driver::memory_info`] and [`Driver::num_sms`].
//!
//! `gpu.rs` implements it with cudarc on `cuda:N` (feature `cuda`); [`EmuDriver`]
//! (`driver/emu.rs`) with host memory, the SIMT emulator's launch
//! ([`pagoda_cuda_kernels::emu_launch::call`]) and recorded launches as graphs. The
//! emulator refuses what a GPU refuses: a misaligned 16-byte access, more than 1024
//! threads or 227 KiB of dynamic shared memory per block, an allocation, a copy from
//! host memory or a host wait while a graph is being captured, an allocation past the
//! device's memory.

mod emu;

pub(crate) use emu::EmuDriver;
pub use emu::EMU_MEMORY_BYTES;

use pagoda_core::{Device, MemoryInfo, TensorMut, TensorRef};
use pagoda_cuda_kernels::{Call, Dtype};

/// One `out[m, n] = x[m, k] · w[n, k]ᵀ` on device addresses (see `crate::gemm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gemm {
    /// `x`, `w`, `out` device addresses.
    pub addrs: (u64, u64, u64),
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `x`, `w`, `out` dtypes ([`crate::gemm::check_dtypes`]).
    pub dtypes: (Dtype, Dtype, Dtype),
}

/// What differs between a GPU and the emulator (see the module docs). Errors are
/// messages; the callers wrap them in their crate's error with what they were doing.
pub(crate) trait Driver: Send {
    /// A device allocation (freed on drop).
    type Buf: Send;
    /// A point in the stream's work.
    type Event;
    /// A captured graph.
    type Graph: Send;

    /// The device this driver serves.
    fn device(&self) -> Device;
    /// The SMs `paged`'s split plan spreads over.
    fn num_sms(&self) -> usize;
    /// Makes the device current on this thread (before allocations and copies).
    fn bind(&self) -> Result<(), String>;
    /// Free and total bytes of the device's memory (the `cuda:N` runtime's
    /// `memory_info`; on `emu`, what was allocated through the driver).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn memory_info(&self) -> Option<MemoryInfo>;

    /// `bytes` zeroed bytes, 16-byte aligned at least.
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Buf, String>;
    /// The allocation's device address.
    fn addr(&self, b: &Self::Buf) -> u64;
    /// The address of a view of this device's memory.
    fn ref_addr(&self, t: &TensorRef<'_>, name: &str) -> Result<u64, String>;
    /// The address of a writable view of this device's memory.
    fn mut_addr(&self, t: TensorMut<'_>, name: &str) -> Result<u64, String>;

    /// Copies `data` to the start of `b` on the stream (ordered before later launches;
    /// `data` may be reused when this returns).
    fn upload(&self, b: &mut Self::Buf, data: &[u8]) -> Result<(), String>;
    /// Copies `data` to device address `dst` on the stream, as [`Driver::upload`].
    ///
    /// # Safety
    /// `dst..dst + data.len()` is memory of this device, not in use by queued work.
    unsafe fn upload_to(&self, dst: u64, data: &[u8]) -> Result<(), String>;
    /// Copies `out.len()` bytes from device address `src` into `out` after the
    /// stream's earlier work; the bytes are there once the stream has reached a later
    /// event ([`Driver::wait_event`]) or [`Driver::synchronize`] returned.
    ///
    /// # Safety
    /// `src..src + out.len()` is memory of this device.
    unsafe fn download(&self, src: u64, out: &mut [u8]) -> Result<(), String>;
    /// Copies `bytes` from `src` to `dst` on the stream (captured into a graph like a
    /// launch).
    ///
    /// # Safety
    /// Both ranges are memory of this device and do not overlap.
    // No caller yet (core's runtime has no device-to-device copy); tested on emu.
    #[allow(dead_code)]
    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String>;

    /// Launches `call` on the stream (recorded while capturing).
    ///
    /// # Safety
    /// Every pointer in the call's struct is memory of this device of the sizes its
    /// fields imply, every index inside what it indexes.
    unsafe fn launch(&self, call: &Call) -> Result<(), String>;
    /// Enqueues the GEMM `g` (recorded while capturing).
    ///
    /// # Safety
    /// `x`, `w` and `out` are memory of this device holding `m·k`, `n·k` and `m·n`
    /// elements of their dtypes; `out` overlaps neither input.
    unsafe fn gemm(&self, g: &Gemm) -> Result<(), String>;

    /// Records the stream's work so far.
    fn record_event(&self) -> Result<Self::Event, String>;
    /// Waits on the host until the stream has reached `e` (not while capturing).
    fn wait_event(&self, e: &Self::Event) -> Result<(), String>;
    /// Waits on the host for all the stream's work (not while capturing; the `cuda:N`
    /// runtime's copies).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn synchronize(&self) -> Result<(), String>;

    /// Starts capturing this thread's work on the stream into a graph.
    fn begin_capture(&self) -> Result<(), String>;
    /// Ends the capture; the graph, ready to replay.
    fn end_capture(&self) -> Result<Self::Graph, String>;
    /// Drops a capture in progress (after an error); no-op otherwise.
    fn abort_capture(&self);
    /// Enqueues the captured work again.
    ///
    /// # Safety
    /// Every buffer the captured work reads or writes is alive at the address it had
    /// at capture, and its contents are valid for the kernels (checked as for an
    /// eager step).
    unsafe fn replay(&self, g: &Self::Graph) -> Result<(), String>;
}

/// Plain integers as the bytes an upload copies.
pub(crate) trait Plain: Copy {}
impl Plain for i32 {}
impl Plain for i64 {}
impl Plain for u8 {}

/// The bytes of plain integers.
pub(crate) fn bytes_of<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is a plain integer (no padding, every bit pattern valid as bytes); the
    // byte slice covers exactly the elements' memory and borrows it.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The bytes of plain integers, writable (a download's destination).
pub(crate) fn bytes_of_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; every byte pattern is a valid plain integer.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A device buffer that grows (to a power of two bytes) and is never shrunk; once
/// locked (CUDA graphs read it at its captured address) it does not move: a step that
/// needs more is an error.
pub(crate) struct Grow<B> {
    buf: Option<B>,
    bytes: usize,
    pub(crate) locked: bool,
}

impl<B> Grow<B> {
    pub(crate) fn new() -> Self {
        Grow {
            buf: None,
            bytes: 0,
            locked: false,
        }
    }

    /// At least `len` elements of `elem` bytes; their device address (0 when `len` is 0).
    pub(crate) fn reserve<D: Driver<Buf = B>>(
        &mut self,
        d: &D,
        len: usize,
        elem: usize,
    ) -> Result<u64, String> {
        let need = len
            .checked_mul(elem)
            .ok_or_else(|| format!("{len} elements overflow"))?;
        if need == 0 {
            return Ok(0);
        }
        if self.buf.is_none() || self.bytes < need {
            if self.locked {
                return Err(format!(
                    "{len} elements exceed the {} reserved for CUDA graphs",
                    self.bytes / elem
                ));
            }
            self.buf = None; // free first: the old contents are not needed
            let bytes = need.next_power_of_two();
            self.buf = Some(
                d.alloc_zeroed(bytes)
                    .map_err(|e| format!("allocating {len} elements: {e}"))?,
            );
            self.bytes = bytes;
        }
        Ok(d.addr(self.buf.as_ref().expect("allocated above")))
    }

    /// Copies `data` to the start of the buffer (growing it first); its device address.
    pub(crate) fn upload<D: Driver<Buf = B>, T: Plain>(
        &mut self,
        d: &D,
        data: &[T],
    ) -> Result<u64, String> {
        let addr = self.reserve(d, data.len(), std::mem::size_of::<T>())?;
        if let Some(b) = self.buf.as_mut().filter(|_| !data.is_empty()) {
            d.upload(b, bytes_of(data))
                .map_err(|e| format!("uploading {} elements: {e}", data.len()))?;
        }
        Ok(addr)
    }
}
