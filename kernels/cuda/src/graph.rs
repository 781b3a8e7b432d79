//! Recorded launches on the `emu` device: what a CUDA graph is on the GPU.
//!
//! On `cuda:N`, a decode step is captured once per batch-size bucket (stream capture)
//! and replayed: every launch keeps the arguments it had at capture, so everything that
//! changes from step to step must be read by the kernels from device buffers at fixed
//! addresses (token ids, positions, slots, the attention metadata), and the launch
//! geometry and scalars must not depend on the step's contents.
//!
//! The emulator honours the same contract so that the tests see a violation: between
//! [`begin_capture`] and [`end_capture`], every emu launch on this thread (the model
//! kernels of [`crate::emu_model`], the attention kernels of [`crate::emu`], and host
//! work such as the emu GEMM, through [`launch`]) is checked as usual and then
//! *recorded* instead of run, with its parameters (raw pointers into host buffers,
//! scalars) copied; [`EmuGraph::replay`] runs the recorded launches again in order. A
//! buffer that moved since the capture, or a per-step value passed by value, gives a
//! replay different from an eager step, which the model tests compare bit for bit.
//!
//! The capture state is per thread, as a capturing CUDA stream belongs to whoever
//! launches into it; the engine runs a step on one thread.

use crate::Error;
use std::cell::RefCell;

/// One recorded launch: returns the kernel's status (0 = ran).
struct Launch {
    name: &'static str,
    run: Box<dyn Fn() -> i32>,
}

// SAFETY: a launch holds raw pointers into buffers owned by the device's runtime (host
// memory on `emu`), which are `Send`; it runs only through `EmuGraph::replay`, whose
// caller guarantees those buffers are alive and not otherwise borrowed. The closure
// itself has no thread affinity (no thread-locals, no `Rc`).
unsafe impl Send for Launch {}

thread_local! {
    static RECORDING: RefCell<Option<Vec<Launch>>> = const { RefCell::new(None) };
}

/// A sequence of recorded emu launches (see the module docs).
#[derive(Default)]
pub struct EmuGraph {
    launches: Vec<Launch>,
}

impl std::fmt::Debug for EmuGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuGraph")
            .field("launches", &self.names())
            .finish()
    }
}

impl EmuGraph {
    /// The recorded launches' kernel names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.launches.iter().map(|l| l.name).collect()
    }

    /// How many launches were recorded.
    pub fn len(&self) -> usize {
        self.launches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// Runs the recorded launches in order; the first that fails stops the replay.
    ///
    /// # Safety
    /// Every buffer the captured launches pointed at must still be alive, at the same
    /// address and of at least the same length, and not borrowed elsewhere while this
    /// runs (on the GPU: the graph's memory must outlive it). The kernels trust their
    /// inputs: the contents (ids, slots, block tables) must have been checked for this
    /// step as for an eager one.
    pub unsafe fn replay(&self) -> Result<(), Error> {
        if is_capturing() {
            return Err(crate::invalid(
                "graph",
                "cannot replay a graph while capturing",
            ));
        }
        for l in &self.launches {
            let rc = (l.run)();
            if rc != 0 {
                return Err(crate::invalid(
                    "graph",
                    format!("replayed launch {} failed with status {rc}", l.name),
                ));
            }
        }
        Ok(())
    }
}

/// Whether this thread is capturing.
pub fn is_capturing() -> bool {
    RECORDING.with(|r| r.borrow().is_some())
}

/// Starts recording this thread's emu launches; an error if already capturing.
pub fn begin_capture() -> Result<(), Error> {
    RECORDING.with(|r| {
        let mut r = r.borrow_mut();
        if r.is_some() {
            return Err(crate::invalid("graph", "already capturing"));
        }
        *r = Some(Vec::new());
        Ok(())
    })
}

/// Stops recording and returns what was recorded; an error if not capturing.
pub fn end_capture() -> Result<EmuGraph, Error> {
    RECORDING.with(|r| {
        r.borrow_mut()
            .take()
            .map(|launches| EmuGraph { launches })
            .ok_or_else(|| crate::invalid("graph", "not capturing"))
    })
}

/// Drops a capture in progress (after an error in the middle of one); no-op otherwise.
pub fn abort_capture() {
    RECORDING.with(|r| r.borrow_mut().take());
}

/// The status of a launch that made a 16-byte vector access at an address that is not
/// a multiple of 16 (a "misaligned address" fault on the GPU).
pub const FAULT_MISALIGNED: i32 = 0x100;

/// Runs `f` now, or records it when this thread is capturing (then returns 0); a
/// replay runs it through the same check.
///
/// `f` must capture only `Copy` data (parameter structs of raw pointers, scalars):
/// what it points at is read when it runs, at capture-free time now or at replay.
/// A launch during which an emulated kernel noted a fault (a misaligned vector access)
/// returns [`FAULT_MISALIGNED`] even if the kernel's own status was 0.
pub fn launch(name: &'static str, f: impl Fn() -> i32 + 'static) -> i32 {
    let checked = move || {
        // SAFETY: reads and clears the emulator's fault flag of this thread (one left by
        // a launch made outside this function, such as the self-test's, is not ours).
        unsafe { crate::ffi::pg_emu_take_fault() };
        let rc = f();
        // SAFETY: as above.
        let fault = unsafe { crate::ffi::pg_emu_take_fault() };
        if fault != 0 && rc == 0 {
            FAULT_MISALIGNED
        } else {
            rc
        }
    };
    RECORDING.with(|r| match r.borrow_mut().as_mut() {
        Some(rec) => {
            rec.push(Launch {
                name,
                run: Box::new(checked),
            });
            0
        }
        None => checked(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::sync::Arc;

    #[test]
    fn records_instead_of_running_and_replays_in_order() {
        let hits = Arc::new(AtomicU32::new(0));
        let h = hits.clone();
        assert_eq!(
            launch("eager", move || {
                h.fetch_add(1, Relaxed);
                0
            }),
            0
        );
        assert_eq!(hits.load(Relaxed), 1);
        begin_capture().unwrap();
        assert!(begin_capture().is_err(), "nested capture");
        for k in [10u32, 100] {
            let h = hits.clone();
            launch("add", move || {
                h.fetch_add(k, Relaxed);
                0
            });
        }
        assert_eq!(hits.load(Relaxed), 1, "recorded launches do not run");
        let g = end_capture().unwrap();
        assert!(end_capture().is_err());
        assert_eq!(g.names(), ["add", "add"]);
        // SAFETY: the launches capture only an Arc and a constant.
        unsafe { g.replay() }.unwrap();
        // SAFETY: as above.
        unsafe { g.replay() }.unwrap();
        assert_eq!(hits.load(Relaxed), 221);
    }

    #[test]
    fn a_failing_launch_stops_the_replay_with_its_name() {
        begin_capture().unwrap();
        launch("bad", || 3);
        launch("never", || panic!("must not run after a failure"));
        let g = end_capture().unwrap();
        // SAFETY: the launches capture nothing.
        let e = unsafe { g.replay() }.unwrap_err().to_string();
        assert!(e.contains("bad") && e.contains('3'), "{e}");
        abort_capture();
        assert!(!is_capturing());
    }
}
