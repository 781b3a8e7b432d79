//! [`EngineHandle`]: the LLM engine on its own thread, driven through channels.
//!
//! The server (or any async caller) submits requests and reads per-request output
//! streams; the engine loop never waits on HTTP work. Tokenization happens on the
//! caller's thread so the loop only sees token ids. Dropping a [`RequestStream`]
//! before it finished aborts the request, so a client that disconnects frees its
//! KV blocks at the next step.

use crate::sleep::Sleeper;
use crate::structured::{Grammar, SharedCompiler};
use crate::{EngineError, EngineStats, LLMEngine, ModelInfo, PromptInput, RequestOutput};
use pagoda_core::{CheckedParams, SamplingParams};
use pagoda_models::{ChatTemplate, Tokenizer};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::mpsc as tmpsc;

/// One request for [`EngineHandle::submit`].
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub request_id: String,
    pub prompt: PromptInput,
    pub params: SamplingParams,
    pub cache_salt: Option<String>,
    /// Lower runs first under the priority policy; 0 otherwise.
    pub priority: i32,
    /// The API request this is one sample (or prompt) of: its sequences share a
    /// group, and one group holds at most its share of the seats while others
    /// wait (`Request::group`). `None`: a group of its own.
    pub group: Option<u64>,
    /// The grammar of `params.structured_outputs`, compiled by the caller (a server
    /// compiles on its blocking pool; each sample gets a clone); compiled in
    /// [`EngineHandle::submit`] when missing.
    pub grammar: Option<Grammar>,
}

type OutputSender = tmpsc::UnboundedSender<Result<RequestOutput, EngineError>>;

// `Add` boxes its parameters: one small allocation per request keeps every
// channel slot (aborts, shutdown) small.
enum Command {
    Add {
        request_id: String,
        prompt_ids: Vec<u32>,
        params: Box<CheckedParams>,
        place: crate::Placement,
        grammar: Option<Box<Grammar>>,
        tx: OutputSender,
    },
    Abort(String),
    Shutdown {
        abort_running: bool,
    },
    /// vLLM's `POST /reset_prefix_cache`: forget every cached block (the reply
    /// says whether it could: not while blocks are in use).
    ResetPrefixCache {
        preempt_running: bool,
        reply: mpsc::Sender<bool>,
    },
    /// Sleep mode (`crate::sleep`): release memory at `level` 1 or 2.
    Sleep {
        level: u8,
        reply: mpsc::Sender<Result<(), EngineError>>,
    },
    WakeUp {
        weights: bool,
        kv_cache: bool,
        reply: mpsc::Sender<Result<(), EngineError>>,
    },
}

/// Where the engine loop hands the block pool's KV-cache events after each step
/// (the server's publisher; see `pagoda_scheduler::kv_events`). It must not block:
/// the loop calls it between steps.
pub type KvEventSink = Box<dyn FnMut(Vec<pagoda_scheduler::KvCacheEvent>) + Send>;

struct Shared {
    stats: Mutex<EngineStats>,
    /// Set when the loop died on an engine fault; `/health` reports it.
    fault: Mutex<Option<EngineError>>,
    /// Adds sent but not yet seen by the loop, plus the scheduler's waiting count.
    num_pending: AtomicUsize,
    num_waiting: AtomicUsize,
    num_running: AtomicUsize,
    stopped: AtomicBool,
    /// The sleep level (0: awake), for `/is_sleeping` and refusing new requests.
    sleep_level: AtomicU8,
}

/// One engine core on its own thread: a data-parallel rank.
struct Rank {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Rank {
    /// vLLM's data-parallel balancing score (`DPLBAsyncMPClient`): a waiting
    /// request counts four times a running one.
    fn load(&self) -> usize {
        let waiting = self.shared.num_waiting.load(Ordering::Acquire)
            + self.shared.num_pending.load(Ordering::Acquire);
        waiting * 4 + self.shared.num_running.load(Ordering::Acquire)
    }
}

/// A cloneable handle to the engine threads: one, or `--data-parallel-size` ranks,
/// each an engine core with its own KV cache, behind one submit that balances them.
#[derive(Clone)]
pub struct EngineHandle {
    ranks: Arc<Vec<Rank>>,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<Arc<ChatTemplate>>,
    info: Arc<ModelInfo>,
    structured: Arc<SharedCompiler>,
    max_waiting: usize,
}

/// The outputs of one request, in order; the last one has `finished == true`.
pub struct RequestStream {
    request_id: String,
    rx: tmpsc::UnboundedReceiver<Result<RequestOutput, EngineError>>,
    tx: mpsc::Sender<Command>,
    finished: bool,
}

impl RequestStream {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The next output; None once the request finished (or the engine stopped).
    pub async fn next(&mut self) -> Option<Result<RequestOutput, EngineError>> {
        if self.finished {
            return None;
        }
        let item = self.rx.recv().await;
        match &item {
            Some(Ok(o)) if o.finished => self.finished = true,
            Some(Err(_)) | None => self.finished = true,
            _ => {}
        }
        item
    }

    /// Blocking variant for non-async callers.
    pub fn blocking_next(&mut self) -> Option<Result<RequestOutput, EngineError>> {
        if self.finished {
            return None;
        }
        let item = self.rx.blocking_recv();
        match &item {
            Some(Ok(o)) if o.finished => self.finished = true,
            Some(Err(_)) | None => self.finished = true,
            _ => {}
        }
        item
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.tx.send(Command::Abort(self.request_id.clone()));
        }
    }
}

impl EngineHandle {
    /// Moves the engine onto its own thread. At most `max_waiting` requests may wait
    /// for admission; more get [`EngineError::QueueFull`].
    pub fn start(engine: LLMEngine, max_waiting: usize) -> EngineHandle {
        Self::start_with_kv_events(engine, max_waiting, None)
    }

    /// [`EngineHandle::start`], with the block pool's KV-cache events collected and
    /// handed to `sink` after every step that produced some (none are collected
    /// without a sink).
    pub fn start_with_kv_events(
        engine: LLMEngine,
        max_waiting: usize,
        sink: Option<KvEventSink>,
    ) -> EngineHandle {
        Self::start_ranks(vec![(engine, sink)], max_waiting)
    }

    /// Data parallel: each engine (built from one configuration, so one model and
    /// tokenizer) on its own thread, with its KV-event sink; a request goes to the
    /// rank with the least waiting x 4 + running (vLLM's balancing score).
    /// `max_waiting` bounds the sum.
    ///
    /// # Panics
    /// When `engines` is empty.
    pub fn start_ranks(
        engines: Vec<(LLMEngine, Option<KvEventSink>)>,
        max_waiting: usize,
    ) -> EngineHandle {
        assert!(!engines.is_empty(), "at least one engine");
        let first = &engines[0].0;
        let tokenizer = first.tokenizer();
        let chat_template = first.chat_template();
        let info = Arc::new(first.model_info().clone());
        let structured = first.structured_compiler();
        let ranks = engines
            .into_iter()
            .enumerate()
            .map(|(i, (engine, sink))| Rank::start(i, engine, sink))
            .collect();
        EngineHandle {
            ranks: Arc::new(ranks),
            tokenizer,
            chat_template,
            info,
            structured,
            max_waiting,
        }
    }

    /// How many engine cores (data-parallel ranks) serve.
    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }
    pub fn chat_template(&self) -> Option<&Arc<ChatTemplate>> {
        self.chat_template.as_ref()
    }
    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }
    /// Compiles structured-output constraints (to check one before submitting).
    pub fn structured_compiler(&self) -> &Arc<SharedCompiler> {
        &self.structured
    }
    /// The counters of all ranks together (see [`EngineStats::combine`]).
    pub fn stats(&self) -> EngineStats {
        EngineStats::combine(&self.rank_stats())
    }

    /// Each rank's counters, by rank.
    pub fn rank_stats(&self) -> Vec<EngineStats> {
        self.ranks
            .iter()
            .map(|r| r.shared.stats.lock().map(|s| s.clone()).unwrap_or_default())
            .collect()
    }
    /// Ok while the engine loop is alive and has not faulted: the fault itself
    /// otherwise ([`EngineError::Fault`]), or [`EngineError::Shutdown`].
    /// With data parallel, any rank's fault or stop is the server's.
    pub fn health(&self) -> Result<(), EngineError> {
        for r in self.ranks.iter() {
            let fault = r
                .shared
                .fault
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(f) = fault {
                return Err(f);
            }
            if r.shared.stopped.load(Ordering::Acquire) {
                return Err(EngineError::Shutdown);
            }
        }
        Ok(())
    }

    /// Tokenizes and validates on the caller's thread, then queues the request.
    pub fn submit(&self, req: SubmitRequest) -> Result<RequestStream, EngineError> {
        self.health()?;
        let level = self.sleep_level();
        if level > 0 {
            return Err(EngineError::Sleeping { level });
        }
        let prompt_ids = match req.prompt {
            PromptInput::Tokens(ids) => ids,
            PromptInput::Text(t) => self.tokenizer.encode(&t, true)?,
        };
        let params = crate::llm_engine::check_request(&prompt_ids, req.params, &self.info)?;
        // Compiled here (if the caller did not), off the engine loop; an invalid
        // constraint is the caller's 400.
        let grammar = match (&params.structured_outputs, req.grammar) {
            (Some(spec), None) => Some(Box::new(self.structured.compile(spec)?)),
            (Some(_), Some(g)) => Some(Box::new(g)),
            (None, _) => None,
        };
        let waiting: usize = self
            .ranks
            .iter()
            .map(|r| {
                r.shared.num_waiting.load(Ordering::Acquire)
                    + r.shared.num_pending.load(Ordering::Acquire)
            })
            .sum();
        if waiting >= self.max_waiting {
            return Err(EngineError::QueueFull {
                max_waiting: self.max_waiting,
            });
        }
        // The first of the least loaded: one rank gets everything at light load,
        // so its prefix cache serves repeats (as vLLM's balancer).
        let rank = self
            .ranks
            .iter()
            .min_by_key(|r| r.load())
            .expect("at least one rank");
        let (otx, orx) = tmpsc::unbounded_channel();
        rank.shared.num_pending.fetch_add(1, Ordering::AcqRel);
        rank.tx
            .send(Command::Add {
                request_id: req.request_id.clone(),
                prompt_ids,
                params: Box::new(params),
                place: crate::Placement {
                    cache_salt: req.cache_salt,
                    priority: req.priority,
                    group: req.group,
                },
                grammar,
                tx: otx,
            })
            .map_err(|_| EngineError::Shutdown)?;
        Ok(RequestStream {
            request_id: req.request_id,
            rx: orx,
            tx: rank.tx.clone(),
            finished: false,
        })
    }

    /// Aborts the request on whichever rank runs it (the others ignore the id).
    pub fn abort(&self, request_id: &str) {
        for r in self.ranks.iter() {
            let _ = r.tx.send(Command::Abort(request_id.to_string()));
        }
    }

    /// Forgets every cached prefix block (vLLM's `/reset_prefix_cache`). False when
    /// blocks are in use by running requests (nothing is reset then).
    /// With `preempt_running`, running requests are preempted first (they resume,
    /// recomputed) so that the reset always succeeds.
    /// With data parallel, every rank's; true when all were reset.
    pub fn reset_prefix_cache(&self, preempt_running: bool) -> Result<bool, EngineError> {
        self.health()?;
        let mut all = true;
        for r in self.ranks.iter() {
            let (reply, done) = mpsc::channel();
            r.tx.send(Command::ResetPrefixCache {
                preempt_running,
                reply,
            })
            .map_err(|_| EngineError::Shutdown)?;
            all &= done.recv().map_err(|_| EngineError::Shutdown)?;
        }
        Ok(all)
    }

    /// Sleep mode: every rank releases its KV cache (`level` 1) or its weights
    /// too (2); refused while requests run ([`crate::sleep`]). With data parallel,
    /// a refusal by one rank wakes those already asleep.
    pub fn sleep(&self, level: u8) -> Result<(), EngineError> {
        self.health()?;
        for (i, r) in self.ranks.iter().enumerate() {
            let done = r.call(|reply| Command::Sleep { level, reply });
            if let Err(e) = done {
                for woken in &self.ranks[..i] {
                    // Best effort: the error to report is the refusal.
                    let _ = woken.call(|reply| Command::WakeUp {
                        weights: true,
                        kv_cache: true,
                        reply,
                    });
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Wakes up the weights and/or the KV cache of every rank (vLLM's tags).
    pub fn wake_up(&self, weights: bool, kv_cache: bool) -> Result<(), EngineError> {
        self.health()?;
        for r in self.ranks.iter() {
            r.call(|reply| Command::WakeUp {
                weights,
                kv_cache,
                reply,
            })?;
        }
        Ok(())
    }

    /// The deepest sleep level of any rank (0: all awake).
    pub fn sleep_level(&self) -> u8 {
        self.ranks
            .iter()
            .map(|r| r.shared.sleep_level.load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// Stops the loop: with `abort_running` in-flight requests are aborted, otherwise
    /// they run to completion first. Blocks until the loop has exited.
    pub fn shutdown(&self, abort_running: bool) {
        for r in self.ranks.iter() {
            let _ = r.tx.send(Command::Shutdown { abort_running });
        }
        for r in self.ranks.iter() {
            if let Some(t) = r.thread.lock().ok().and_then(|mut t| t.take()) {
                let _ = t.join();
            }
        }
    }
}

impl Rank {
    /// Sends a command built around a reply channel and waits for the reply.
    fn call(
        &self,
        cmd: impl FnOnce(mpsc::Sender<Result<(), EngineError>>) -> Command,
    ) -> Result<(), EngineError> {
        let (reply, done) = mpsc::channel();
        self.tx
            .send(cmd(reply))
            .map_err(|_| EngineError::Shutdown)?;
        done.recv().map_err(|_| EngineError::Shutdown)?
    }

    /// Rank `index`'s engine loop on a thread of its own.
    fn start(index: usize, mut engine: LLMEngine, sink: Option<KvEventSink>) -> Rank {
        engine
            .core_mut()
            .scheduler_mut()
            .set_kv_events(sink.is_some());
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            stats: Mutex::new(engine.stats()),
            fault: Mutex::new(None),
            num_pending: AtomicUsize::new(0),
            num_waiting: AtomicUsize::new(0),
            num_running: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            sleep_level: AtomicU8::new(0),
        });
        let loop_shared = shared.clone();
        // Rank 0 keeps the single engine's thread name.
        let name = match index {
            0 => "pagoda-engine".to_string(),
            i => format!("pagoda-engine-{i}"),
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || engine_loop(engine, rx, loop_shared, sink))
            .expect("spawning the engine thread");
        Rank {
            tx,
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }
}

/// The engine thread's state: the engine, where each request's outputs go, and
/// whether it is draining for shutdown.
struct EngineLoop {
    /// `None` while asleep at level 2 (the weights are released).
    engine: Option<LLMEngine>,
    sleeper: Sleeper,
    shared: Arc<Shared>,
    senders: std::collections::HashMap<String, OutputSender>,
    draining: bool,
    last_log: std::time::Instant,
    kv_events: Option<KvEventSink>,
}

fn engine_loop(
    engine: LLMEngine,
    rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    kv_events: Option<KvEventSink>,
) {
    let sleeper = Sleeper::new(&engine, kv_events.is_some());
    let mut l = EngineLoop {
        engine: Some(engine),
        sleeper,
        shared,
        senders: Default::default(),
        draining: false,
        last_log: std::time::Instant::now(),
        kv_events,
    };
    loop {
        // Block only when idle; otherwise take what has arrived and step.
        let first = if l.has_work() {
            rx.try_recv().ok()
        } else if l.draining {
            break;
        } else {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        };
        for cmd in first.into_iter().chain(rx.try_iter()) {
            l.command(cmd);
        }
        if l.has_work() && !l.step() {
            break;
        }
        l.publish_kv_events();
        l.publish_stats();
    }
    l.shared.stopped.store(true, Ordering::Release);
    for (_, tx) in l.senders.drain() {
        let _ = tx.send(Err(EngineError::Shutdown));
    }
}

impl EngineLoop {
    fn has_work(&self) -> bool {
        self.engine
            .as_ref()
            .is_some_and(|e| e.has_unfinished_requests())
    }

    /// Hands what the block pool recorded since the last call to the sink.
    fn publish_kv_events(&mut self) {
        if let (Some(sink), Some(engine)) = (self.kv_events.as_mut(), self.engine.as_mut()) {
            let events = engine.core_mut().scheduler_mut().take_kv_events();
            if !events.is_empty() {
                sink(events);
            }
        }
    }

    /// Applies one command from the handles.
    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Add {
                request_id,
                prompt_ids,
                params,
                place,
                grammar,
                tx,
            } => {
                self.shared.num_pending.fetch_sub(1, Ordering::AcqRel);
                if self.draining {
                    let _ = tx.send(Err(EngineError::Shutdown));
                    return;
                }
                let released = self.sleeper.released();
                let Some(engine) = self.engine.as_mut().filter(|_| !released.is_sleeping()) else {
                    let _ = tx.send(Err(EngineError::Sleeping {
                        level: released.level(),
                    }));
                    return;
                };
                match engine.add_checked(
                    request_id.clone(),
                    prompt_ids,
                    *params,
                    place,
                    grammar.map(|g| *g),
                ) {
                    Ok(()) => {
                        self.senders.insert(request_id, tx);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            }
            Command::Abort(id) => {
                if let Some(e) = self.engine.as_mut() {
                    e.abort_request(&id);
                }
                self.senders.remove(&id);
            }
            Command::Sleep { level, reply } => {
                let done = self.sleeper.sleep(&mut self.engine, level);
                let done = done.map(|events| {
                    if let (Some(sink), false) = (self.kv_events.as_mut(), events.is_empty()) {
                        sink(events);
                    }
                });
                self.note_sleep_level();
                let _ = reply.send(done);
            }
            Command::WakeUp {
                weights,
                kv_cache,
                reply,
            } => {
                let done = self.sleeper.wake_up(&mut self.engine, weights, kv_cache);
                self.note_sleep_level();
                let _ = reply.send(done);
            }
            Command::ResetPrefixCache {
                preempt_running,
                reply,
            } => {
                let Some(engine) = self.engine.as_mut() else {
                    // Asleep at level 2: there is no cache to forget.
                    let _ = reply.send(true);
                    return;
                };
                let sched = engine.core_mut().scheduler_mut();
                let done = if preempt_running {
                    sched.reset_prefix_cache_and_preempt()
                } else {
                    sched.reset_prefix_cache()
                };
                let _ = reply.send(done.is_ok());
            }
            Command::Shutdown { abort_running } => {
                self.draining = true;
                if let (true, Some(engine)) = (abort_running, self.engine.as_mut()) {
                    for id in engine.unfinished_request_ids() {
                        engine.abort_request(&id);
                        // Cut short by shutdown: an error (503), not a partial answer.
                        if let Some(tx) = self.senders.remove(&id) {
                            let _ = tx.send(Err(EngineError::Shutdown));
                        }
                    }
                }
            }
        }
    }

    /// One engine step, its outputs sent to their requests. False after an
    /// engine-wide fault (every request failed with it; the loop ends).
    fn step(&mut self) -> bool {
        // A panic inside a step (a kernel, the allocator) leaves the engine's state
        // unknown: it is an engine-wide fault, reported like any other.
        let Some(engine) = self.engine.as_mut() else {
            return true;
        };
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.step()))
            .unwrap_or_else(|panic| {
                Err(EngineError::Fault {
                    message: format!("panic in an engine step: {}", panic_message(&panic)),
                })
            });
        match step {
            Ok(outputs) => {
                for out in outputs {
                    self.send(out);
                }
                true
            }
            Err(e) => {
                self.fail_all(e);
                false
            }
        }
    }

    /// Sends one output to its request's stream; a request that failed alone gets
    /// its error, and one whose receiver is gone is aborted.
    fn send(&mut self, out: RequestOutput) {
        let finished = out.finished;
        let id = out.request_id.clone();
        let item = match out.error {
            Some(message) => Err(EngineError::RequestFailed {
                request_id: id.clone(),
                message,
            }),
            None => Ok(out),
        };
        let gone = match self.senders.get(&id) {
            Some(tx) => tx.send(item).is_err(),
            None => false,
        };
        if finished {
            self.senders.remove(&id);
        } else if gone {
            // The receiver is gone without a Drop-abort (e.g. runtime shut down).
            if let Some(e) = self.engine.as_mut() {
                e.abort_request(&id);
            }
            self.senders.remove(&id);
        }
    }

    /// An engine-wide fault: recorded for `/health` and new requests, and sent to
    /// every request in flight.
    fn fail_all(&mut self, e: EngineError) {
        tracing::error!("{e}");
        let e = match e {
            e @ EngineError::Fault { .. } => e,
            other => EngineError::Fault {
                message: other.to_string(),
            },
        };
        *self.shared.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        for (_, tx) in self.senders.drain() {
            let _ = tx.send(Err(e.clone()));
        }
    }

    /// Publishes the sleep level for the handles (`/is_sleeping`, new requests).
    fn note_sleep_level(&self) {
        let level = self.sleeper.released().level();
        self.shared.sleep_level.store(level, Ordering::Release);
    }

    /// Counters for the handles (queue length, `/metrics`) and the periodic log line.
    fn publish_stats(&mut self) {
        let stats = self.sleeper.stats(self.engine.as_ref());
        self.shared
            .num_waiting
            .store(stats.num_waiting, Ordering::Release);
        self.shared
            .num_running
            .store(stats.num_running, Ordering::Release);
        if self.last_log.elapsed() >= Duration::from_secs(5)
            && (stats.num_running + stats.num_waiting) > 0
        {
            if let Some(e) = self.engine.as_mut() {
                e.log_stats(self.last_log.elapsed());
            }
            self.last_log = std::time::Instant::now();
        }
        if let Ok(mut s) = self.shared.stats.lock() {
            *s = stats;
        }
    }
}

/// The text of a caught panic's payload.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
