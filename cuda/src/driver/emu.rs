//! The `emu` device's [`Driver`]: host memory, the SIMT emulator's launches, recorded
//! launches as graphs ([`pagoda_cuda_kernels::graph`]), the GEMM on the CPU.
//!
//! What a GPU refuses, this refuses too: while this thread captures, an allocation, a
//! copy from or to host memory and a host wait are errors (kernel launches, the GEMM
//! and device-to-device copies are recorded instead of run); an allocation past
//! [`EMU_MEMORY_BYTES`] live through this driver is out of memory; the launches check
//! the geometry and the 16-byte alignment of vector accesses
//! ([`pagoda_cuda_kernels::emu_launch`]).

use super::{Driver, Gemm};
use crate::gemm::{check_dtypes, gemm_host, operand_lens, GemmError};
use half::{bf16, f16};
use pagoda_core::{Device, HostSlice, HostSliceMut, MemoryInfo, TensorMut, TensorRef};
use pagoda_cuda_kernels::graph::{self, EmuGraph};
use pagoda_cuda_kernels::{emu_launch, Call, Dtype, Element};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The memory the `emu` device reports (its allocations through the driver count
/// against it; the weights and activations are core's host buffers and do not).
pub const EMU_MEMORY_BYTES: usize = 16 << 30;

/// The `emu` device's driver (see the module docs).
#[derive(Debug)]
pub(crate) struct EmuDriver {
    num_sms: usize,
    capacity: usize,
    /// Bytes of the live allocations made through this driver.
    used: Arc<AtomicUsize>,
}

/// An allocation: 16-byte units (host memory aligned as a GPU allocation is, at least),
/// its bytes counted in the driver's memory info until dropped.
#[derive(Debug)]
pub(crate) struct EmuBuf {
    data: Vec<u128>,
    used: Arc<AtomicUsize>,
}

impl Drop for EmuBuf {
    fn drop(&mut self) {
        self.used.fetch_sub(self.data.len() * 16, Ordering::Relaxed);
    }
}

impl EmuDriver {
    pub(crate) fn new(num_sms: usize) -> Self {
        Self::with_memory(num_sms, EMU_MEMORY_BYTES)
    }

    /// A driver whose device has `capacity` bytes (tests: out of memory).
    pub(crate) fn with_memory(num_sms: usize, capacity: usize) -> Self {
        EmuDriver {
            num_sms,
            capacity,
            used: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// What a capture cannot do on a GPU (allocate, copy from or to pageable host
/// memory, wait on the host).
fn not_capturing(what: &str) -> Result<(), String> {
    if graph::is_capturing() {
        Err(format!(
            "{what} during a CUDA graph capture (a GPU refuses it)"
        ))
    } else {
        Ok(())
    }
}

fn host_ref_addr(s: HostSlice<'_>) -> u64 {
    (match s {
        HostSlice::F32(x) => x.as_ptr().cast::<u8>(),
        HostSlice::F16(x) => x.as_ptr().cast(),
        HostSlice::BF16(x) => x.as_ptr().cast(),
        HostSlice::F8E4M3(x) => x.as_ptr().cast(),
    }) as usize as u64
}

fn host_mut_addr(s: HostSliceMut<'_>) -> u64 {
    (match s {
        HostSliceMut::F32(x) => x.as_mut_ptr().cast::<u8>(),
        HostSliceMut::F16(x) => x.as_mut_ptr().cast(),
        HostSliceMut::BF16(x) => x.as_mut_ptr().cast(),
        HostSliceMut::F8E4M3(x) => x.as_mut_ptr().cast(),
    }) as usize as u64
}

fn on_emu(name: &str, d: Device) -> Result<(), String> {
    if d == Device::Emu {
        Ok(())
    } else {
        Err(format!("{name} is on {d}, not the emu device"))
    }
}

/// `len` elements at `addr` (empty without reading `addr` when `len` is 0).
///
/// # Safety
/// `addr` names `len` live, initialised `T`s when `len > 0`.
unsafe fn slice<'a, T>(addr: u64, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as usize as *const T, len) }
}

/// # Safety
/// As [`slice`], and nothing else reads or writes them meanwhile.
unsafe fn slice_mut<'a, T>(addr: u64, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut T, len) }
}

/// `gemm_host` on the operands at `g`'s addresses.
///
/// # Safety
/// [`Driver::gemm`]'s contract, with host addresses.
unsafe fn gemm_at(g: &Gemm) -> Result<(), GemmError> {
    unsafe fn go<X: Element, O: Element>(g: &Gemm) -> Result<(), GemmError> {
        let [xl, wl, ol] = operand_lens(g.m, g.n, g.k)?;
        let (x, w, o) = g.addrs;
        // SAFETY: the caller's contract: the operands hold these counts of X and O.
        let (x, w, out) = unsafe { (slice::<X>(x, xl), slice::<X>(w, wl), slice_mut::<O>(o, ol)) };
        gemm_host(x, w, out, g.m, g.n, g.k)
    }
    let (x, w, o) = g.dtypes;
    check_dtypes(x, w, o)?;
    // SAFETY: (every arm) the caller's contract; the dtypes name the element types.
    unsafe {
        match (x, o) {
            (Dtype::F32, _) => go::<f32, f32>(g),
            (Dtype::Bf16, Dtype::Bf16) => go::<bf16, bf16>(g),
            (Dtype::Bf16, _) => go::<bf16, f32>(g),
            (Dtype::F16, Dtype::F16) => go::<f16, f16>(g),
            (Dtype::F16, _) => go::<f16, f32>(g),
        }
    }
}

impl Driver for EmuDriver {
    type Buf = EmuBuf;
    /// The emulator runs every launch before returning: an event is always reached.
    type Event = ();
    type Graph = EmuGraph;

    fn device(&self) -> Device {
        Device::Emu
    }

    fn num_sms(&self) -> usize {
        self.num_sms
    }

    fn bind(&self) -> Result<(), String> {
        Ok(())
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        let used = self.used.load(Ordering::Relaxed);
        Some(MemoryInfo {
            free_bytes: self.capacity.saturating_sub(used),
            total_bytes: self.capacity,
        })
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<EmuBuf, String> {
        not_capturing("an allocation")?;
        let units = bytes.div_ceil(16);
        let size = units * 16;
        let used = self.used.fetch_add(size, Ordering::Relaxed);
        if used.saturating_add(size) > self.capacity {
            self.used.fetch_sub(size, Ordering::Relaxed);
            return Err(format!(
                "out of memory: {size} bytes asked, {} of {} free",
                self.capacity.saturating_sub(used),
                self.capacity
            ));
        }
        Ok(EmuBuf {
            data: vec![0u128; units],
            used: self.used.clone(),
        })
    }

    fn addr(&self, b: &EmuBuf) -> u64 {
        b.data.as_ptr() as usize as u64
    }

    fn ref_addr(&self, t: &TensorRef<'_>, name: &str) -> Result<u64, String> {
        on_emu(name, t.device_of())?;
        t.host_slice()
            .map(host_ref_addr)
            .ok_or_else(|| format!("{name} is not host memory of the emu device"))
    }

    fn mut_addr(&self, t: TensorMut<'_>, name: &str) -> Result<u64, String> {
        on_emu(name, t.device_of())?;
        t.into_host_slice()
            .map(host_mut_addr)
            .ok_or_else(|| format!("{name} is not host memory of the emu device"))
    }

    fn upload(&self, b: &mut EmuBuf, data: &[u8]) -> Result<(), String> {
        if data.len() > b.data.len() * 16 {
            return Err(format!("{} bytes into {}", data.len(), b.data.len() * 16));
        }
        let dst = self.addr(b);
        // SAFETY: `b` holds at least `data.len()` bytes (checked) and is exclusively
        // borrowed; u128 has no invalid bit patterns.
        unsafe { self.upload_to(dst, data) }
    }

    unsafe fn upload_to(&self, dst: u64, data: &[u8]) -> Result<(), String> {
        not_capturing("a host-to-device copy")?;
        // SAFETY: the caller's contract (`dst` names `data.len()` writable bytes that
        // do not overlap `data`, a separate host buffer).
        unsafe { slice_mut::<u8>(dst, data.len()) }.copy_from_slice(data);
        Ok(())
    }

    unsafe fn download(&self, src: u64, out: &mut [u8]) -> Result<(), String> {
        not_capturing("a device-to-host copy")?;
        // SAFETY: the caller's contract.
        out.copy_from_slice(unsafe { slice::<u8>(src, out.len()) });
        Ok(())
    }

    unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        let rc = graph::launch("memcpy_dtod", move || {
            // SAFETY: the caller's contract (both ranges live and disjoint), at the
            // copy's time: now, or at each replay (the graph's contract).
            unsafe { slice_mut::<u8>(dst, bytes).copy_from_slice(slice::<u8>(src, bytes)) };
            0
        });
        debug_assert_eq!(rc, 0);
        Ok(())
    }

    unsafe fn launch(&self, call: &Call) -> Result<(), String> {
        // SAFETY: the caller's contract (host addresses on emu).
        unsafe { emu_launch::call(call) }.map_err(|e| e.to_string())
    }

    unsafe fn gemm(&self, g: &Gemm) -> Result<(), String> {
        if !graph::is_capturing() {
            // SAFETY: the caller's contract.
            return unsafe { gemm_at(g) }.map_err(|e| e.to_string());
        }
        // Checked now as a launch is; run at each replay.
        check_dtypes(g.dtypes.0, g.dtypes.1, g.dtypes.2).map_err(|e| e.to_string())?;
        let g = *g;
        graph::launch("gemm", move || {
            // SAFETY: the graph's contract: the operands are alive at the addresses
            // they had at capture.
            i32::from(unsafe { gemm_at(&g) }.is_err())
        });
        Ok(())
    }

    fn record_event(&self) -> Result<(), String> {
        Ok(())
    }

    fn wait_event(&self, _: &()) -> Result<(), String> {
        not_capturing("a host wait for an event")
    }

    fn synchronize(&self) -> Result<(), String> {
        not_capturing("a host synchronization")
    }

    fn begin_capture(&self) -> Result<(), String> {
        graph::begin_capture().map_err(|e| e.to_string())
    }

    fn end_capture(&self) -> Result<EmuGraph, String> {
        graph::end_capture().map_err(|e| e.to_string())
    }

    fn abort_capture(&self) {
        graph::abort_capture();
    }

    unsafe fn replay(&self, g: &EmuGraph) -> Result<(), String> {
        // SAFETY: the caller's contract.
        unsafe { g.replay() }.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_copies_and_host_waits_are_refused_during_a_capture() {
        let d = EmuDriver::new(2);
        let mut b = d.alloc_zeroed(20).unwrap();
        assert_eq!(d.addr(&b) % 16, 0);
        d.upload(&mut b, &[1; 20]).unwrap();
        assert!(d.upload(&mut b, &[1; 40]).is_err());
        d.begin_capture().unwrap();
        let alloc = d.alloc_zeroed(16);
        let copy = d.upload(&mut b, &[2; 4]);
        let mut host = [0u8; 4];
        // SAFETY: `b` holds 32 bytes.
        let down = unsafe { d.download(d.addr(&b), &mut host) };
        let wait = d.record_event().and_then(|e| d.wait_event(&e));
        let sync = d.synchronize();
        d.abort_capture();
        for r in [alloc.map(drop), copy, down, wait, sync] {
            assert!(r.unwrap_err().contains("capture"));
        }
        d.synchronize().unwrap();
    }

    #[test]
    fn memory_info_counts_live_allocations_and_refuses_past_the_device() {
        let d = EmuDriver::with_memory(2, 1024);
        let m = d.memory_info().unwrap();
        assert_eq!((m.free_bytes, m.total_bytes), (1024, 1024));
        let a = d.alloc_zeroed(100).unwrap(); // 112 bytes in 16-byte units
        assert_eq!(d.memory_info().unwrap().free_bytes, 1024 - 112);
        let e = d.alloc_zeroed(1000).map(drop).unwrap_err();
        assert!(e.contains("out of memory"), "{e}");
        assert_eq!(d.memory_info().unwrap().free_bytes, 1024 - 112);
        drop(a);
        assert_eq!(d.memory_info().unwrap().free_bytes, 1024);
        let _whole = d.alloc_zeroed(1024).unwrap();
    }

    #[test]
    fn a_device_to_device_copy_is_recorded_and_replayed() {
        let d = EmuDriver::new(2);
        let mut a = d.alloc_zeroed(16).unwrap();
        let b = d.alloc_zeroed(16).unwrap();
        let (pa, pb) = (d.addr(&a), d.addr(&b));
        d.upload(&mut a, &[7; 16]).unwrap();
        d.begin_capture().unwrap();
        // SAFETY: both hold 16 bytes and stay alive past the replay.
        unsafe { d.copy_dtod(pb, pa, 16) }.unwrap();
        let g = d.end_capture().unwrap();
        let mut host = [0u8; 16];
        // SAFETY: `b` holds 16 bytes.
        unsafe { d.download(pb, &mut host) }.unwrap();
        assert_eq!(host, [0; 16], "recorded, not run");
        // SAFETY: `a` and `b` are alive at their captured addresses.
        unsafe { d.replay(&g) }.unwrap();
        // SAFETY: `b` holds 16 bytes.
        unsafe { d.download(pb, &mut host) }.unwrap();
        assert_eq!(host, [7; 16]);
    }
}
