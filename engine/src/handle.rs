//! [`EngineHandle`]: the LLM engine on its own thread, driven through channels.
//!
//! The server (or any async caller) submits requests and reads per-request output
//! streams; the engine loop never waits on HTTP work. Tokenization happens on the
//! caller's thread so the loop only sees token ids. Dropping a [`RequestStream`]
//! before it finished aborts the request, so a client that disconnects frees its
//! KV blocks at the next step.

use crate::structured::{Grammar, SharedCompiler};
use crate::{EngineError, EngineStats, LLMEngine, ModelInfo, PromptInput, RequestOutput};
use pagoda_core::{CheckedParams, SamplingParams};
use pagoda_models::{ChatTemplate, Tokenizer};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
}

struct Shared {
    stats: Mutex<EngineStats>,
    /// Set when the loop died on an engine fault; `/health` reports it.
    fault: Mutex<Option<EngineError>>,
    /// Adds sent but not yet seen by the loop, plus the scheduler's waiting count.
    num_pending: AtomicUsize,
    num_waiting: AtomicUsize,
    stopped: AtomicBool,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<Arc<ChatTemplate>>,
    info: Arc<ModelInfo>,
    structured: Arc<SharedCompiler>,
    max_waiting: usize,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
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
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            stats: Mutex::new(engine.stats()),
            fault: Mutex::new(None),
            num_pending: AtomicUsize::new(0),
            num_waiting: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });
        let tokenizer = engine.tokenizer();
        let chat_template = engine.chat_template();
        let info = Arc::new(engine.model_info().clone());
        let structured = engine.structured_compiler();
        let loop_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pagoda-engine".into())
            .spawn(move || engine_loop(engine, rx, loop_shared))
            .expect("spawning the engine thread");
        EngineHandle {
            tx,
            shared,
            tokenizer,
            chat_template,
            info,
            structured,
            max_waiting,
            thread: Arc::new(Mutex::new(Some(thread))),
        }
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
    pub fn stats(&self) -> EngineStats {
        self.shared
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
    /// Ok while the engine loop is alive and has not faulted: the fault itself
    /// otherwise ([`EngineError::Fault`]), or [`EngineError::Shutdown`].
    pub fn health(&self) -> Result<(), EngineError> {
        let fault = self
            .shared
            .fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(f) = fault {
            return Err(f);
        }
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(EngineError::Shutdown);
        }
        Ok(())
    }

    /// Tokenizes and validates on the caller's thread, then queues the request.
    pub fn submit(&self, req: SubmitRequest) -> Result<RequestStream, EngineError> {
        self.health()?;
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
        let waiting = self.shared.num_waiting.load(Ordering::Acquire)
            + self.shared.num_pending.load(Ordering::Acquire);
        if waiting >= self.max_waiting {
            return Err(EngineError::QueueFull {
                max_waiting: self.max_waiting,
            });
        }
        let (otx, orx) = tmpsc::unbounded_channel();
        self.shared.num_pending.fetch_add(1, Ordering::AcqRel);
        self.tx
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
            tx: self.tx.clone(),
            finished: false,
        })
    }

    pub fn abort(&self, request_id: &str) {
        let _ = self.tx.send(Command::Abort(request_id.to_string()));
    }

    /// Stops the loop: with `abort_running` in-flight requests are aborted, otherwise
    /// they run to completion first. Blocks until the loop has exited.
    pub fn shutdown(&self, abort_running: bool) {
        let _ = self.tx.send(Command::Shutdown { abort_running });
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// The engine thread's state: the engine, where each request's outputs go, and
/// whether it is draining for shutdown.
struct EngineLoop {
    engine: LLMEngine,
    shared: Arc<Shared>,
    senders: std::collections::HashMap<String, OutputSender>,
    draining: bool,
    last_log: std::time::Instant,
}

fn engine_loop(engine: LLMEngine, rx: mpsc::Receiver<Command>, shared: Arc<Shared>) {
    let mut l = EngineLoop {
        engine,
        shared,
        senders: Default::default(),
        draining: false,
        last_log: std::time::Instant::now(),
    };
    loop {
        // Block only when idle; otherwise take what has arrived and step.
        let first = if l.engine.has_unfinished_requests() {
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
        if l.engine.has_unfinished_requests() && !l.step() {
            break;
        }
        l.publish_stats();
    }
    l.shared.stopped.store(true, Ordering::Release);
    for (_, tx) in l.senders.drain() {
        let _ = tx.send(Err(EngineError::Shutdown));
    }
}

impl EngineLoop {
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
                match self.engine.add_checked(
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
                self.engine.abort_request(&id);
                self.senders.remove(&id);
            }
            Command::Shutdown { abort_running } => {
                self.draining = true;
                if abort_running {
                    for id in self.engine.unfinished_request_ids() {
                        self.engine.abort_request(&id);
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
        let engine = &mut self.engine;
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
            self.engine.abort_request(&id);
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

    /// Counters for the handles (queue length, `/metrics`) and the periodic log line.
    fn publish_stats(&mut self) {
        let stats = self.engine.stats();
        self.shared
            .num_waiting
            .store(stats.num_waiting, Ordering::Release);
        if self.last_log.elapsed() >= Duration::from_secs(5)
            && (stats.num_running + stats.num_waiting) > 0
        {
            self.engine.log_stats(self.last_log.elapsed());
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
