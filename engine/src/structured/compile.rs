//! Constraint compilation off the request path: a small pool of dedicated,
//! low-priority threads with a large stack, a deadline per compile, and
//! cancellation when the client goes.
//!
//! Why a pool of its own: llguidance compiles recursively (a deep enough `$ref`
//! chain overflowed a 2 MiB stack and aborted the server), a hostile constraint
//! can take seconds of CPU, and compiling on the request-preparation pool let two
//! such requests hold both of its slots while plain completions waited. Here:
//!
//! * each thread has [`COMPILE_STACK_BYTES`] of stack (address space; only the
//!   pages a compile touches are committed), and [`super::bounds`] refuses chains
//!   deeper than [`CompileLimits::max_depth`] before llguidance sees them, a bound
//!   those threads survive (tested at the bound);
//! * the threads run in the idle scheduling class (`SCHED_IDLE`, nice 19 where
//!   that is refused), so the engine's step threads win the cores from them at once;
//! * every job has a deadline ([`CompileLimits::timeout`]): a job still queued at
//!   its deadline is dropped, and a watchdog cancels the first mask's computation
//!   (llguidance's cancellation handle) once it is due; the building of the parser
//!   itself is bounded by llguidance's fuel and size limits
//!   ([`CompileLimits::apply`]), which also bound its memory;
//! * dropping the [`CompileTicket`] (the client hung up) cancels the job the same way;
//! * the first mask is computed here, so a constraint that cannot start (a `$ref`
//!   cycle, an empty language) is a 400 before the request is queued, and the
//!   engine's first step does not pay for the most expensive mask.

use super::compiler::GrammarCompiler;
use super::grammar::Grammar;
use super::limits::{CompileLimits, COMPILE_STACK_BYTES};
use crate::EngineError;
use llguidance::CancellationHandle;
use pagoda_core::StructuredOutputs;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the compile threads share with [`SharedCompiler`]: the tokenizer, the
/// limits and the compiler, built on first use (building the token trie takes a
/// moment, which servers without structured requests should not pay at start).
pub(crate) struct SharedCore {
    tokenizer: Arc<tokenizers::Tokenizer>,
    eos_ids: Vec<u32>,
    vocab_size: usize,
    limits: CompileLimits,
    compiler: OnceLock<Result<GrammarCompiler, EngineError>>,
    counters: Counters,
}

impl SharedCore {
    pub(super) fn new(
        tokenizer: Arc<tokenizers::Tokenizer>,
        eos_ids: Vec<u32>,
        vocab_size: usize,
        limits: CompileLimits,
    ) -> Self {
        SharedCore {
            tokenizer,
            eos_ids,
            vocab_size,
            limits,
            compiler: OnceLock::new(),
            counters: Counters::default(),
        }
    }

    /// What the pool has done so far.
    pub(super) fn stats(&self) -> CompileStats {
        self.counters.snapshot()
    }

    /// The limits compiles run under.
    pub(super) fn limits(&self) -> &CompileLimits {
        &self.limits
    }

    fn compiler(&self) -> Result<&GrammarCompiler, EngineError> {
        self.compiler
            .get_or_init(|| {
                let t0 = Instant::now();
                let c = GrammarCompiler::new(
                    &self.tokenizer,
                    &self.eos_ids,
                    self.vocab_size,
                    self.limits.clone(),
                );
                tracing::info!(
                    "structured outputs: token trie built in {:.0} ms",
                    t0.elapsed().as_secs_f64() * 1e3
                );
                c
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// What the pool has done (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Jobs that produced a grammar.
    pub completed: u64,
    /// Jobs refused (invalid, over a bound, cannot start).
    pub refused: u64,
    /// Jobs past their deadline.
    pub timed_out: u64,
    /// Jobs whose client went away first.
    pub cancelled: u64,
}

/// The counters behind [`CompileStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    completed: std::sync::atomic::AtomicU64,
    refused: std::sync::atomic::AtomicU64,
    timed_out: std::sync::atomic::AtomicU64,
    cancelled: std::sync::atomic::AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> CompileStats {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        CompileStats {
            completed: g(&self.completed),
            refused: g(&self.refused),
            timed_out: g(&self.timed_out),
            cancelled: g(&self.cancelled),
        }
    }
    fn count(&self, outcome: Outcome) {
        let a = match outcome {
            Outcome::Completed => &self.completed,
            Outcome::Refused => &self.refused,
            Outcome::TimedOut => &self.timed_out,
            Outcome::Cancelled => &self.cancelled,
        };
        a.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
enum Outcome {
    Completed,
    Refused,
    TimedOut,
    Cancelled,
}

/// One job's shared state: its deadline and how to stop it.
struct JobState {
    deadline: Instant,
    cancelled: AtomicBool,
    /// The matcher's cancellation handle while the first mask is computed.
    mask: Mutex<Option<CancellationHandle>>,
}

impl JobState {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        if let Some(h) = lock(&self.mask).as_ref() {
            h.cancel();
        }
    }
    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

type Reply = Result<Grammar, EngineError>;

struct Job {
    spec: StructuredOutputs,
    state: Arc<JobState>,
    reply: mpsc::SyncSender<Reply>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    running: Vec<Arc<JobState>>,
    shutdown: bool,
}

struct PoolShared {
    queue: Mutex<Queue>,
    /// Wakes workers (a job or shutdown) and the watchdog (a job started).
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The compile threads and their watchdog; dropping the pool stops them.
pub(super) struct CompilePool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
}

impl CompilePool {
    pub(super) fn start(core: Arc<SharedCore>) -> Result<Self, EngineError> {
        let shared = Arc::new(PoolShared {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let spawn_err = |e: std::io::Error| EngineError::Fault {
            message: format!("cannot start a structured-output compile thread: {e}"),
        };
        let mut threads = Vec::new();
        for i in 0..core.limits.threads.max(1) {
            let (s, c) = (shared.clone(), core.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("pagoda-grammar-{i}"))
                    .stack_size(COMPILE_STACK_BYTES)
                    .spawn(move || worker(&s, &c))
                    .map_err(spawn_err)?,
            );
        }
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("pagoda-grammar-watchdog".into())
                .spawn(move || watchdog(&s))
                .map_err(spawn_err)?,
        );
        Ok(CompilePool { shared, threads })
    }

    pub(super) fn submit(&self, spec: StructuredOutputs, timeout: Duration) -> CompileTicket {
        let state = Arc::new(JobState {
            deadline: Instant::now() + timeout,
            cancelled: AtomicBool::new(false),
            mask: Mutex::new(None),
        });
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.shared.queue).jobs.push_back(Job {
            spec,
            state: state.clone(),
            reply: tx,
        });
        self.shared.cv.notify_all();
        CompileTicket {
            rx: Some(rx),
            state,
            timeout,
        }
    }
}

impl Drop for CompilePool {
    fn drop(&mut self) {
        {
            let mut q = lock(&self.shared.queue);
            q.shutdown = true;
            q.running.iter().for_each(|s| s.cancel());
        }
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves the calling thread to the idle scheduling class, so compiles only use a
/// core the engine leaves free (Linux: both calls act on the calling thread).
///
/// Why not only `nice`: at nice 10 a compile still has ~10 % of a core's weight
/// and, more to the point, the kernel lets it finish its slice before a waking step
/// thread runs: eight abandoned heavy compiles raised a plain stream's p50
/// inter-token latency 1.8x on 2 cores. `SCHED_IDLE` threads are preempted as
/// soon as a normal thread wakes. Where the class is refused (a sandbox), nice 19
/// is the fallback; a failure of both changes nothing else.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions; sched_setscheduler and setpriority only
    // read their arguments (the param lives on this stack) and act on this thread.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        }
    }
}

fn worker(shared: &PoolShared, core: &SharedCore) {
    lower_priority();
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if q.shutdown {
                    return;
                }
                if let Some(j) = q.jobs.pop_front() {
                    q.running.push(j.state.clone());
                    break j;
                }
                q = shared.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        shared.cv.notify_all(); // the watchdog watches running jobs
        let state = job.state.clone();
        let (outcome, result) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_job(core, &job.spec, &state)
        }))
        .unwrap_or_else(|_| {
            (
                Outcome::Refused,
                Err(EngineError::InvalidGrammar {
                    param: "structured_outputs".into(),
                    message: "the constraint could not be compiled (internal error)".into(),
                }),
            )
        });
        core.counters.count(outcome);
        lock(&shared.queue)
            .running
            .retain(|s| !Arc::ptr_eq(s, &state));
        // The receiver is gone when the client left; nothing to tell then.
        let _ = job.reply.send(result);
    }
}

/// Cancels running jobs once they are due, every 20 ms while any runs.
fn watchdog(shared: &PoolShared) {
    let mut q = lock(&shared.queue);
    loop {
        if q.shutdown {
            return;
        }
        let now = Instant::now();
        for s in &q.running {
            if now >= s.deadline {
                s.cancel();
            }
        }
        q = if q.running.is_empty() {
            shared.cv.wait(q).unwrap_or_else(|e| e.into_inner())
        } else {
            shared
                .cv
                .wait_timeout(q, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0
        };
    }
}

fn timed_out(core: &SharedCore) -> EngineError {
    timeout_error(core.limits.timeout)
}

fn timeout_error(timeout: Duration) -> EngineError {
    EngineError::InvalidGrammar {
        param: "structured_outputs".into(),
        message: format!(
            "the structured-output constraint did not compile within {:.1} s \
             (--structured-outputs-compile-timeout); simplify it",
            timeout.as_secs_f64()
        ),
    }
}

fn cancelled() -> EngineError {
    EngineError::InvalidGrammar {
        param: "structured_outputs".into(),
        message: "compilation cancelled: the request was abandoned".into(),
    }
}

/// One compile: bounds, parser, first mask; each phase checks the deadline.
fn run_job(core: &SharedCore, spec: &StructuredOutputs, state: &JobState) -> (Outcome, Reply) {
    let stop = |state: &JobState| {
        if state.is_cancelled() && Instant::now() < state.deadline {
            Some((Outcome::Cancelled, Err(cancelled())))
        } else if state.is_cancelled() || Instant::now() >= state.deadline {
            Some((Outcome::TimedOut, Err(timed_out(core))))
        } else {
            None
        }
    };
    if let Some(r) = stop(state) {
        return r;
    }
    let refused = |e| (Outcome::Refused, Err(e));
    let compiler = match core.compiler() {
        Ok(c) => c,
        Err(e) => return refused(e),
    };
    let matcher = match compiler.build_matcher(spec) {
        Ok(m) => m.into_cancellable(),
        Err(e) => return refused(e),
    };
    if let Some(r) = stop(state) {
        return r;
    }
    *lock(&state.mask) = matcher.cancellation_handle();
    let mut grammar = Grammar::new(matcher);
    // A cancellation between the check above and publishing the handle is seen
    // here: the matcher was not cancelled, so test the flag again.
    if let Some(r) = stop(state) {
        return r;
    }
    match grammar.precompute_first_mask() {
        Ok(()) => (Outcome::Completed, Ok(grammar)),
        Err(e) => stop(state).unwrap_or_else(|| {
            refused(EngineError::InvalidGrammar {
                param: "structured_outputs".into(),
                message: format!(
                    "the constraint cannot generate any output: {}",
                    e.lines().next().unwrap_or_default()
                ),
            })
        }),
    }
}

/// A submitted compile. Dropping it before it answered cancels the job.
pub struct CompileTicket {
    rx: Option<mpsc::Receiver<Reply>>,
    state: Arc<JobState>,
    timeout: Duration,
}

impl CompileTicket {
    /// Waits on this thread (not on an async worker).
    pub fn wait_blocking(mut self) -> Reply {
        let rx = self.rx.take().expect("a ticket is waited on once");
        recv(&rx, &self.state, self.timeout)
    }

    /// Waits without holding an async worker: the wait runs on tokio's blocking
    /// pool, and dropping this future (the client hung up) cancels the job.
    pub async fn wait(mut self) -> Reply {
        let rx = self.rx.take().expect("a ticket is waited on once");
        let timeout = self.timeout;
        let state = self.state.clone();
        let mut guard = CancelOnDrop(Some(self.state.clone()));
        let r = tokio::task::spawn_blocking(move || recv(&rx, &state, timeout))
            .await
            .unwrap_or_else(|e| {
                Err(EngineError::Fault {
                    message: format!("waiting for a structured-output compile: {e}"),
                })
            });
        guard.0 = None; // answered: nothing to cancel
        r
    }
}

/// Waits for the job's answer until its deadline plus a second of grace (the
/// worker answers "timed out" itself when it can; the grace lets that answer
/// arrive). A worker stuck past that (a parser build that llguidance's limits did
/// not bound) is left to finish in the background: the job is cancelled, its
/// answer dropped, and the request gets the timeout now.
fn recv(rx: &mpsc::Receiver<Reply>, state: &JobState, timeout: Duration) -> Reply {
    let wait = state
        .deadline
        .saturating_duration_since(Instant::now())
        .saturating_add(Duration::from_secs(1));
    match rx.recv_timeout(wait) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            state.cancel();
            Err(timeout_error(timeout))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(EngineError::Fault {
            message: "the structured-output compile pool stopped".into(),
        }),
    }
}

impl Drop for CompileTicket {
    fn drop(&mut self) {
        if self.rx.is_some() {
            self.state.cancel();
        }
    }
}

struct CancelOnDrop(Option<Arc<JobState>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.cancel();
        }
    }
}
