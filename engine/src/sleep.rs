//! Sleep mode, vLLM's `POST /sleep?level=` and `POST /wake_up?tags=`: an idle
//! engine gives back its memory without the process (and its socket, its
//! tokenizer, its metrics) going away.
//!
//! vLLM's level 1 offloads the weights to host memory and discards the KV cache;
//! on the CPU the weights already are in host memory, so level 1 frees the KV
//! cache only (and forgets the prefix cache, publishing `AllBlocksCleared`).
//! Level 2 discards both: the whole engine core is dropped, and waking the
//! weights builds it again from the configuration it was started with (the
//! model file is read again, as vLLM's level 2 expects new weights to be loaded).
//! The counters of `/metrics` carry over a rebuild, so Prometheus sees no reset.
//!
//! One rule keeps it simple and safe: an engine sleeps only when idle (no request
//! waiting or running); a sleep asked for while requests run is refused, and
//! requests that arrive while it sleeps are refused with [`EngineError::Sleeping`].

use crate::{EngineConfig, EngineError, EngineStats, KvCacheEvent, LLMEngine};

/// What is released: vLLM's sleep "tags".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    pub weights: bool,
    pub kv_cache: bool,
}

impl Released {
    pub fn is_sleeping(&self) -> bool {
        self.weights || self.kv_cache
    }

    /// The level it amounts to (0 awake, 1 the KV cache only, 2 the weights too).
    pub fn level(&self) -> u8 {
        match (self.weights, self.kv_cache) {
            (true, _) => 2,
            (false, true) => 1,
            (false, false) => 0,
        }
    }
}

/// The sleep state of one engine core, and what it needs to wake up.
pub(crate) struct Sleeper {
    config: EngineConfig,
    /// Whether the block pool records KV-cache events (set again after a rebuild).
    kv_events: bool,
    /// The counters of engines dropped by level 2, added to the live one's.
    carried: EngineStats,
    released: Released,
}

impl Sleeper {
    pub(crate) fn new(engine: &LLMEngine, kv_events: bool) -> Sleeper {
        Sleeper {
            config: engine.config().clone(),
            kv_events,
            carried: EngineStats::default(),
            released: Released::default(),
        }
    }

    pub(crate) fn released(&self) -> Released {
        self.released
    }

    /// Puts the engine to sleep at `level` (1 or 2); deeper than it is only.
    /// Returns the KV-cache events of a dropped engine (its `AllBlocksCleared`),
    /// for the caller's sink.
    pub(crate) fn sleep(
        &mut self,
        engine: &mut Option<LLMEngine>,
        level: u8,
    ) -> Result<Vec<KvCacheEvent>, EngineError> {
        if !(1..=2).contains(&level) {
            return Err(EngineError::invalid(
                "level",
                format!("sleep level must be 1 or 2, got {level}"),
            ));
        }
        if let Some(e) = engine.as_ref() {
            let busy = e.unfinished_request_ids().len();
            if busy > 0 {
                return Err(EngineError::SleepState {
                    message: format!(
                        "cannot sleep while {busy} request(s) are waiting or running; \
                         retry once they finish"
                    ),
                });
            }
        }
        if level == 2 {
            let mut events = Vec::new();
            if let Some(mut e) = engine.take() {
                let sched = e.core_mut().scheduler_mut();
                // Idle, so nothing holds a block: the reset cannot be refused.
                if sched.reset_prefix_cache().is_ok() {
                    events = sched.take_kv_events();
                }
                self.carried = e.stats().after(&self.carried);
                drop(e);
                crate::release_freed_memory();
            }
            self.released = Released {
                weights: true,
                kv_cache: true,
            };
            tracing::info!("sleep level 2: the model's weights and KV cache are released");
            return Ok(events);
        }
        if let Some(e) = engine.as_mut() {
            if !self.released.kv_cache {
                e.core_mut().free_kv_cache()?;
                self.released.kv_cache = true;
                tracing::info!("sleep level 1: the KV cache is released, the weights stay");
            }
        }
        Ok(Vec::new())
    }

    /// Wakes up what `weights` / `kv_cache` name (vLLM's tags; both when none is
    /// given). The KV cache belongs to the engine core here, so it cannot come
    /// back while the weights sleep.
    pub(crate) fn wake_up(
        &mut self,
        engine: &mut Option<LLMEngine>,
        weights: bool,
        kv_cache: bool,
    ) -> Result<(), EngineError> {
        if kv_cache && !weights && self.released.weights {
            return Err(EngineError::SleepState {
                message: "the KV cache cannot wake up before the weights \
                          (wake up with tags=weights first, or with no tags)"
                    .into(),
            });
        }
        if weights && self.released.weights {
            let mut e = LLMEngine::new(self.config.clone())?;
            e.core_mut().scheduler_mut().set_kv_events(self.kv_events);
            *engine = Some(e);
            self.released = Released::default();
            tracing::info!("woke up: the model is loaded again");
            if !kv_cache {
                // Built with its cache; keep the part that was not asked for asleep.
                if let Some(e) = engine.as_mut() {
                    e.core_mut().free_kv_cache()?;
                }
                self.released.kv_cache = true;
            }
            return Ok(());
        }
        if kv_cache && self.released.kv_cache {
            if let Some(e) = engine.as_mut() {
                e.core_mut().restore_kv_cache()?;
            }
            self.released.kv_cache = false;
            tracing::info!("woke up: the KV cache is allocated again");
        }
        Ok(())
    }

    /// The counters of every engine this core has been (gauges: the live one's).
    pub(crate) fn stats(&self, engine: Option<&LLMEngine>) -> EngineStats {
        match engine {
            Some(e) => e.stats().after(&self.carried),
            None => EngineStats {
                num_running: 0,
                num_waiting: 0,
                kv_cache_usage: 0.0,
                ..self.carried.clone()
            },
        }
    }
}
