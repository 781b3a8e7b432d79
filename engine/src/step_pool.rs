//! The threads a step runs on, kept hot for the length of the step.
//!
//! A decode step at one stream is ~150 small parallel loops (four GEMVs a layer, the
//! LM head in chunks) of 20-300 µs each. Rayon parks an idle worker after a few
//! rounds of `sched_yield`, and waking a parked thread costs tens of µs (a futex
//! wake, and on a VM an IPI to a halted vCPU), so at one stream the second core
//! joined each loop late or not at all: the server used one core out of two.
//! [`StepPool::install`] runs the step on one worker and, for as long as the step
//! lasts, keeps every other worker polling the pool for work (`rayon::yield_now`)
//! instead of parking, the way llama.cpp's threads poll between graph nodes. When
//! there is nothing to steal they give the core to the OS scheduler
//! (`sched_yield`), so a client process on the same cores still runs; between
//! steps they park as before.

use crate::error::EngineError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Environment variable: `0` turns the polling off (A/B runs, shared machines).
pub const STEP_SPIN_ENV: &str = "PAGODA_STEP_SPIN";

/// The step's thread pool; see the module doc.
#[derive(Clone)]
pub struct StepPool {
    pool: Arc<rayon::ThreadPool>,
    spin: bool,
    /// Workers polling right now (for tests).
    active: Arc<AtomicUsize>,
}

impl std::fmt::Debug for StepPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepPool")
            .field("threads", &self.pool.current_num_threads())
            .field("spin", &self.spin)
            .finish()
    }
}

impl StepPool {
    /// As many threads as the global rayon pool (`RAYON_NUM_THREADS`, else the
    /// CPUs), named for profiles; polling on unless `PAGODA_STEP_SPIN=0`.
    pub fn new() -> Result<Self, EngineError> {
        let spin = std::env::var(STEP_SPIN_ENV).map_or(true, |v| v.trim() != "0");
        Self::with_threads(rayon::current_num_threads(), spin)
    }

    /// `threads` workers; `spin` keeps the idle ones polling during a step.
    pub fn with_threads(threads: usize, spin: bool) -> Result<Self, EngineError> {
        Self::build(threads, spin, None)
    }

    /// One worker per CPU of `cpus`, each pinned to its CPU (a data-parallel rank's
    /// cores: two ranks never compete for one core's caches and time).
    pub fn pinned(cpus: &[usize]) -> Result<Self, EngineError> {
        let spin = std::env::var(STEP_SPIN_ENV).map_or(true, |v| v.trim() != "0");
        Self::build(cpus.len(), spin, Some(cpus.to_vec()))
    }

    fn build(threads: usize, spin: bool, cpus: Option<Vec<usize>>) -> Result<Self, EngineError> {
        let mut builder = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("pagoda-step-{i}"));
        if let Some(cpus) = cpus {
            builder = builder.start_handler(move |i| pin_to(cpus[i % cpus.len()]));
        }
        let pool = builder.build().map_err(|e| EngineError::Fault {
            message: format!("starting the step thread pool: {e}"),
        })?;
        Ok(Self {
            pool: Arc::new(pool),
            spin,
            active: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub fn num_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Whether idle workers poll during a step.
    pub fn spins(&self) -> bool {
        self.spin
    }

    /// Runs `f` on a worker of the pool, the other workers polling for its parallel
    /// loops until it returns.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let helpers = self.num_threads() - 1;
        if !self.spin || helpers == 0 {
            return self.pool.install(f);
        }
        self.pool.install(|| {
            let done = AtomicBool::new(false);
            let started = AtomicBool::new(false);
            let ready = AtomicUsize::new(0);
            let me = rayon::current_thread_index();
            rayon::scope(|s| {
                // One poller in each worker's own broadcast queue (no other worker
                // can take it, and pushing it wakes them all); this worker's returns
                // at once whenever it gets to it.
                s.spawn_broadcast(|_, ctx| {
                    if Some(ctx.index()) == me {
                        return;
                    }
                    // A worker that reaches its poller only after the step began may
                    // be running it on top of a half of the step's loops that it
                    // stole first; polling there until the step ends would wait on
                    // the step while the step waits on that half (a deadlock, seen
                    // with several pools on two cores). Before the step begins the
                    // pool holds no other job, so a poller seen then sits at the
                    // bottom of its worker's stack and may poll.
                    if started.load(Ordering::Acquire) {
                        return;
                    }
                    ready.fetch_add(1, Ordering::AcqRel);
                    self.active.fetch_add(1, Ordering::Relaxed);
                    poll_until(&done);
                    self.active.fetch_sub(1, Ordering::Relaxed);
                });
                // Set on return and on unwind: a panicking step must not leave the
                // scope waiting on pollers forever.
                let _stop = Stop(&done);
                wait_for_pollers(&ready, helpers);
                started.store(true, Ordering::Release);
                f()
            })
        })
    }
}

/// How long a step waits for the other workers to take their pollers before it
/// starts without the late ones (a parked worker wakes in tens of µs).
const POLLER_WAIT: std::time::Duration = std::time::Duration::from_micros(500);

/// Spins until `helpers` pollers are ready or [`POLLER_WAIT`] has passed.
fn wait_for_pollers(ready: &AtomicUsize, helpers: usize) {
    let t = std::time::Instant::now();
    let mut spins = 0u32;
    while ready.load(Ordering::Acquire) < helpers {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(16) {
            if t.elapsed() >= POLLER_WAIT {
                return;
            }
            // The core to a worker being woken, when there are more threads than cores.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Pins the calling thread to `cpu`; a refusal (a CPU outside the process's
/// allowed set) leaves it unpinned, with a warning.
fn pin_to(cpu: usize) {
    // SAFETY: `set` is a plain bit set initialised by CPU_ZERO before use, and
    // sched_setaffinity only reads it (pid 0: this thread).
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if !ok {
        tracing::warn!(
            "could not pin a step thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Sets the flag when dropped.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

thread_local! {
    static POLLING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread is polling while one is held.
struct Polling;

impl Polling {
    /// `None` if this thread is polling already.
    fn enter() -> Option<Polling> {
        // `then`, not `then_some`: an eagerly built guard would be dropped (and clear
        // the flag) when this thread is polling already.
        (!POLLING.replace(true)).then(|| Polling)
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        POLLING.set(false);
    }
}

/// Steals and runs pool jobs until `done`; between finds, a few spin hints, then
/// the core to the OS scheduler.
fn poll_until(done: &AtomicBool) {
    // A thread polls once: a nested poller returns at once.
    // (Broadcast pollers never nest; this guards against any other way in.)
    let Some(_polling) = Polling::enter() else {
        return;
    };
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            _ => {
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(16) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn install_returns_the_result_with_and_without_polling() {
        for spin in [false, true] {
            for threads in [1, 2, 4] {
                let pool = StepPool::with_threads(threads, spin).unwrap();
                for _ in 0..20 {
                    let s: u64 = pool.install(|| (0..10_000u64).into_par_iter().sum());
                    assert_eq!(s, 10_000 * 9_999 / 2, "spin {spin} threads {threads}");
                }
            }
        }
    }

    #[test]
    fn a_panicking_step_does_not_hang_the_pool() {
        let pool = StepPool::with_threads(2, true).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| panic!("step failed"))
        }));
        assert!(r.is_err());
        let s: u64 = pool.install(|| (0..100u64).into_par_iter().sum());
        assert_eq!(s, 4950);
    }

    #[test]
    fn a_thread_polls_once() {
        let outer = Polling::enter();
        assert!(outer.is_some());
        assert!(Polling::enter().is_none());
        // A nested poller returns without waiting for its flag.
        poll_until(&AtomicBool::new(false));
        drop(outer);
        assert!(Polling::enter().is_some());
    }

    #[test]
    fn with_four_threads_the_three_others_poll() {
        let pool = StepPool::with_threads(4, true).unwrap();
        // A worker woken too late for a step skips polling in it (see `install`), so
        // on a loaded machine not every step sees all three: most must.
        let mut all_three = 0;
        for _ in 0..20 {
            let t = std::time::Instant::now();
            let seen = pool.install(|| {
                // Wait (a bounded while) for every other worker to be polling.
                while pool.active.load(Ordering::Relaxed) < 3
                    && t.elapsed() < std::time::Duration::from_millis(200)
                {
                    std::hint::spin_loop();
                }
                pool.active.load(Ordering::Relaxed)
            });
            all_three += usize::from(seen == 3);
        }
        assert!(all_three >= 10, "3 pollers in only {all_three} of 20 steps");
        assert_eq!(pool.active.load(Ordering::Relaxed), 0, "pollers left");
    }

    /// A worker that takes a half of the step's first loop before its poller must not
    /// run the poller on top of that half (it would wait for the step, and the step
    /// for the half): back-to-back steps of nested loops, the window being a worker
    /// still looking for work from the previous step when the next one starts.
    /// (Seen once in ~100 runs of tests/tests/spec_decode.rs before the fix.)
    #[test]
    fn back_to_back_steps_of_nested_loops_never_deadlock() {
        // Three pools on their own threads (three engines in one process, as the
        // tests run them): more threads than cores, so a worker is often
        // descheduled between looking for its poller and stealing.
        let (tx, rx) = std::sync::mpsc::channel();
        for seed in 1..=3u64 {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let pool = StepPool::with_threads(2, true).unwrap();
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
                for i in 0..30_000u64 {
                    // Between steps, 0-60 µs of the caller's own work (the scheduler's).
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let gap = std::time::Instant::now();
                    while gap.elapsed().as_nanos() < u128::from(x % 60_000) {
                        std::hint::spin_loop();
                    }
                    let s: u64 = pool.install(|| {
                        (0..4u64)
                            .into_par_iter()
                            .map(|a| (0..4u64).into_par_iter().map(|b| a * b).sum::<u64>())
                            .sum()
                    });
                    assert_eq!(s, 36);
                    if i % 1_000 == 0 {
                        let _ = tx.send(0);
                    }
                }
                let _ = tx.send(1);
            });
        }
        drop(tx);
        let mut finished = 0;
        while finished < 3 {
            match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok(f) => finished += f,
                Err(e) => panic!("a pool deadlocked (no progress for 60 s): {e}"),
            }
        }
    }

    #[test]
    fn the_steps_parallel_loops_use_every_worker() {
        let pool = StepPool::with_threads(2, true).unwrap();
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        for _ in 0..200 {
            pool.install(|| {
                (0..64).into_par_iter().for_each(|_| {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                    seen.lock().unwrap().insert(rayon::current_thread_index());
                })
            });
            if seen.lock().unwrap().len() == 2 {
                return;
            }
        }
        panic!("one worker ran every item: {:?}", seen.lock().unwrap());
    }
}
