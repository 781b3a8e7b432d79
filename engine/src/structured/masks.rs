//! Grammar masks of each step's constrained rows: computed on a small dedicated
//! pool of mask threads (not the rayon pool the forward pass uses) while the model
//! runs, with a bound on how long a step waits for them.
//!
//! The bound (issue 29 D7): after the forward pass, a step waits for its masks at
//! most [`MASK_WAIT_FRACTION`] of the forward's own time (at least
//! [`MIN_MASK_WAIT`]). A constrained row whose mask is not ready by then is
//! *deferred*: it is not sampled this step, the scheduler schedules its last token
//! again (its KV is rewritten with the same values), and its mask, which goes on
//! computing, is used at the next step that reaches it. A row's result does not
//! depend on the step it is sampled in (batch invariance; the sampler's draws are
//! counter-based per request), so deferring changes when a token comes, never
//! which. Hence one request's expensive grammar (or its `n` samples, which share
//! one llguidance lexer and so compute one at a time) delays its own rows, not the
//! others': every step ends within `(1 + MASK_WAIT_FRACTION)` forward times plus
//! applying the masks. A step whose every row waits on a mask has no one to
//! protect and waits for them all.
//!
//! Masks are computed in submission order, except that a grammar whose last mask
//! was heavy ([`HEAVY_MASK`]) may use all mask threads but one: however many
//! expensive masks are queued, the light ones always have a thread and never wait
//! behind them (a grammar's first mask counts as light: the first masks of `n`
//! new expensive samples can delay the others' masks once, never a plain row).
//! A deferred row's mask is never starved: it completes within its
//! own compute time, queued behind the masks submitted before it (a heavy one,
//! behind the heavy ones).

use super::Grammar;
use crate::EngineError;
use llguidance::toktrie::SimpleVob;
use pagoda_core::ReqHandle;
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A step waits for masks at most this fraction of its forward pass's time.
pub const MASK_WAIT_FRACTION: f64 = 0.5;
/// ...and at least this long (a very fast forward must not defer every mask).
pub const MIN_MASK_WAIT: Duration = Duration::from_millis(2);

/// Cumulative mask statistics of a runner.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MaskStats {
    /// Masks computed (one per constrained row per sampled step).
    pub num_masks: u64,
    /// Mask-thread time spent computing them.
    pub compute: Duration,
    /// Time steps waited for masks after the forward pass (the part of the mask
    /// work the forward pass did not hide).
    pub wait: Duration,
    /// Time the step spent applying the masks to the logits and advancing the
    /// grammars by the sampled tokens (on the engine thread, not overlapped).
    pub apply: Duration,
    /// Constrained rows deferred to a later step because their mask was late.
    pub deferred: u64,
}

impl MaskStats {
    /// Mean mask-thread time per mask.
    pub fn per_mask(&self) -> Duration {
        if self.num_masks == 0 {
            Duration::ZERO
        } else {
            self.compute / self.num_masks as u32
        }
    }
}

/// How many mask threads: a quarter of the cores, 2 to 8 (the forward pass keeps
/// the rest; at least 2 so that one thread is always free of heavy masks).
fn num_mask_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get() / 4)
        .clamp(2, 8)
}

/// A grammar whose last mask took longer than this is *heavy*: at most all but
/// one of the mask threads run heavy masks at a time, so the others' (light)
/// masks never queue behind them. 2 ms is the shortest a step waits
/// ([`MIN_MASK_WAIT`]); JSON-schema masks take well under it.
pub const HEAVY_MASK: Duration = Duration::from_millis(2);

struct Task {
    handle: ReqHandle,
    grammar: Box<Grammar>,
    /// Its grammar's last mask was heavy (see [`HEAVY_MASK`]).
    heavy: bool,
    /// Test-only extra time the mask takes (see `FaultInjection::slow_mask`).
    delay: Duration,
}

struct Done {
    handle: ReqHandle,
    grammar: Box<Grammar>,
    mask: Result<SimpleVob, String>,
    compute: Duration,
}

/// The tasks waiting for a mask thread.
#[derive(Default)]
struct Queue {
    tasks: std::collections::VecDeque<Task>,
    heavy_running: usize,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Most heavy masks computed at once (threads - 1).
    max_heavy: usize,
}

/// The mask threads: tasks in (in order, but a heavy one waits while the heavy
/// share is taken), finished masks out.
struct MaskPool {
    shared: Arc<Shared>,
    done: mpsc::Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl MaskPool {
    fn new(n: usize) -> Result<Self, EngineError> {
        let (dtx, drx) = mpsc::channel::<Done>();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            max_heavy: n.saturating_sub(1).max(1),
        });
        let mut pool = MaskPool {
            shared,
            done: drx,
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let (shared, dtx) = (pool.shared.clone(), dtx.clone());
            let t = std::thread::Builder::new()
                .name(format!("pagoda-mask-{i}"))
                .spawn(move || mask_thread(&shared, &dtx))
                .map_err(|e| EngineError::Fault {
                    message: format!("cannot start a mask thread: {e}"),
                })?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    fn submit(&self, task: Task) {
        lock(&self.shared.queue).tasks.push_back(task);
        // Every idle thread looks: one that cannot take a heavy task leaves it.
        self.shared.ready.notify_all();
    }
}

fn lock(q: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first task this thread may take, waiting for one; `None` once closed.
fn next_task(shared: &Shared) -> Option<Task> {
    let mut q = lock(&shared.queue);
    loop {
        if q.closed {
            return None;
        }
        let heavy_ok = q.heavy_running < shared.max_heavy;
        if let Some(i) = q.tasks.iter().position(|t| heavy_ok || !t.heavy) {
            let t = q.tasks.remove(i).expect("position is in range");
            q.heavy_running += t.heavy as usize;
            return Some(t);
        }
        q = shared.ready.wait(q).unwrap_or_else(|p| p.into_inner());
    }
}

fn mask_thread(shared: &Shared, done: &mpsc::Sender<Done>) {
    while let Some(task) = next_task(shared) {
        let Task {
            handle,
            mut grammar,
            heavy,
            delay,
        } = task;
        let t0 = Instant::now();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        // A panic inside the grammar engine fails this row, not the thread.
        let mask =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| grammar.compute_mask()))
                .unwrap_or_else(|_| Err("structured outputs: the grammar engine panicked".into()));
        let compute = t0.elapsed();
        if heavy {
            lock(&shared.queue).heavy_running -= 1;
            shared.ready.notify_all();
        }
        let d = Done {
            handle,
            grammar,
            mask,
            compute,
        };
        if done.send(d).is_err() {
            return;
        }
    }
}

impl Drop for MaskPool {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One sampled row of a step that has a grammar, as the runner hands it over.
#[derive(Debug, Clone, Copy)]
pub struct MaskRow {
    /// The row's index among the step's sampled rows.
    pub k: usize,
    pub handle: ReqHandle,
    /// Output tokens the request has; its grammar must have consumed as many.
    pub generated: usize,
    /// Test-only extra mask time.
    pub delay: Duration,
}

/// What a step's constrained row gets.
#[derive(Debug)]
pub enum RowMask {
    /// Its mask (or why the grammar failed).
    Ready(Result<SimpleVob, String>),
    /// Not ready in time: the row is not sampled this step.
    Deferred,
}

/// The grammars of the constrained requests and their masks in flight.
pub struct Masks {
    pool: Option<MaskPool>,
    /// Grammars not on a mask thread.
    idle: HashMap<ReqHandle, Box<Grammar>>,
    /// Masks computed for a grammar's current position and not yet used.
    ready: HashMap<ReqHandle, Result<SimpleVob, String>>,
    /// Grammars on a mask thread; `true` once their request is gone (the
    /// grammar is dropped when it comes back).
    busy: HashMap<ReqHandle, bool>,
    /// Grammars whose last mask was heavy ([`HEAVY_MASK`]).
    heavy: std::collections::HashSet<ReqHandle>,
    /// This step's constrained rows.
    rows: Vec<MaskRow>,
    stats: MaskStats,
}

impl Default for Masks {
    fn default() -> Self {
        Self::new()
    }
}

impl Masks {
    pub fn new() -> Self {
        Masks {
            pool: None,
            idle: HashMap::new(),
            ready: HashMap::new(),
            busy: HashMap::new(),
            heavy: std::collections::HashSet::new(),
            rows: Vec::new(),
            stats: MaskStats::default(),
        }
    }

    /// Attaches a request's compiled grammar.
    pub fn add(&mut self, handle: ReqHandle, grammar: Grammar) {
        self.idle.insert(handle, Box::new(grammar));
    }

    /// Drops a request's grammar (now, or when its mask thread hands it back).
    pub fn remove(&mut self, handle: ReqHandle) {
        self.idle.remove(&handle);
        self.ready.remove(&handle);
        self.heavy.remove(&handle);
        if let Some(gone) = self.busy.get_mut(&handle) {
            *gone = true;
        }
    }

    /// Requests holding a grammar.
    pub fn len(&self) -> usize {
        self.idle.len() + self.busy.values().filter(|&&gone| !gone).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, handle: ReqHandle) -> bool {
        self.idle.contains_key(&handle) || self.busy.get(&handle) == Some(&false)
    }

    pub fn stats(&self) -> MaskStats {
        self.stats
    }

    /// Starts the masks of this step's constrained rows (`rows`: only requests
    /// that hold a grammar); a grammar out of step with its request is reported
    /// in `errors[k]` instead.
    pub fn start(
        &mut self,
        rows: &[MaskRow],
        errors: &mut [Option<String>],
    ) -> Result<(), EngineError> {
        self.collect();
        self.rows.clear();
        for &r in rows {
            if let Some(g) = self.idle.get(&r.handle) {
                if g.num_consumed() != r.generated {
                    errors[r.k] = Some(format!(
                        "structured outputs: the grammar consumed {} tokens but {} were generated",
                        g.num_consumed(),
                        r.generated
                    ));
                    continue;
                }
            }
            self.rows.push(r);
            if self.ready.contains_key(&r.handle) {
                continue; // computed ahead, while the row was deferred
            }
            let Some(grammar) = self.idle.remove(&r.handle) else {
                continue; // on a mask thread since an earlier step
            };
            let pool = match &mut self.pool {
                Some(p) => p,
                None => self.pool.insert(MaskPool::new(num_mask_threads())?),
            };
            pool.submit(Task {
                handle: r.handle,
                grammar,
                heavy: self.heavy.contains(&r.handle),
                delay: r.delay,
            });
            self.busy.insert(r.handle, false);
        }
        Ok(())
    }

    /// Whether this step has constrained rows.
    pub fn has_rows(&self) -> bool {
        !self.rows.is_empty()
    }

    /// How many of this step's constrained rows still wait for their mask (the
    /// masks finished meanwhile are taken in first).
    pub fn num_pending(&mut self) -> usize {
        self.collect();
        self.rows
            .iter()
            .filter(|r| !self.ready.contains_key(&r.handle))
            .count()
    }

    /// Waits for this step's masks, until `deadline` if given, and hands each row
    /// its mask (taken: the row is sampled now) or [`RowMask::Deferred`].
    pub fn finish(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Vec<(usize, RowMask)>, EngineError> {
        let t0 = Instant::now();
        while self.num_pending() > 0 {
            let Some(pool) = &self.pool else { break };
            let got = match deadline {
                None => pool.done.recv().map_err(|_| ()),
                Some(d) => {
                    match pool
                        .done
                        .recv_timeout(d.saturating_duration_since(Instant::now()))
                    {
                        Ok(x) => Ok(x),
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                        Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
                    }
                }
            };
            let done = got.map_err(|()| EngineError::Fault {
                message: "the mask threads died".into(),
            })?;
            self.put_back(done);
        }
        self.stats.wait += t0.elapsed();
        let mut out = Vec::with_capacity(self.rows.len());
        for r in &self.rows {
            let m = match self.ready.remove(&r.handle) {
                // A grammar that was on a mask thread at `start` is checked now.
                Some(_) if self.idle.get(&r.handle).map(|g| g.num_consumed()) != Some(r.generated) => {
                    RowMask::Ready(Err(format!(
                        "structured outputs: the grammar is out of step with the {} generated tokens",
                        r.generated
                    )))
                }
                Some(m) => RowMask::Ready(m),
                None => {
                    self.stats.deferred += 1;
                    RowMask::Deferred
                }
            };
            out.push((r.k, m));
        }
        self.rows.clear();
        Ok(out)
    }

    /// Advances a request's grammar by its sampled token (`None`: it has none).
    pub fn accept(&mut self, handle: ReqHandle, token: u32) -> Option<Result<(), String>> {
        let g = self.idle.get_mut(&handle)?;
        let t0 = Instant::now();
        let r = g.accept(token);
        self.stats.apply += t0.elapsed();
        Some(r)
    }

    /// Adds applying time measured by the runner.
    pub fn add_apply_time(&mut self, d: Duration) {
        self.stats.apply += d;
    }

    /// Takes in the masks finished since the last look, without waiting.
    fn collect(&mut self) {
        let mut done = Vec::new();
        if let Some(pool) = &self.pool {
            done.extend(pool.done.try_iter());
        }
        for d in done {
            self.put_back(d);
        }
    }

    fn put_back(&mut self, d: Done) {
        self.stats.num_masks += 1;
        self.stats.compute += d.compute;
        if self.busy.remove(&d.handle) == Some(false) {
            if d.compute > HEAVY_MASK {
                self.heavy.insert(d.handle);
            } else {
                self.heavy.remove(&d.handle);
            }
            self.idle.insert(d.handle, d.grammar);
            self.ready.insert(d.handle, d.mask);
        }
    }
}
