//! Structured outputs (vLLM's guided decoding) through `llguidance`, the grammar
//! engine vLLM and llama.cpp use.
//!
//! * [`GrammarCompiler`] turns a request's [`StructuredOutputs`] (JSON schema, JSON
//!   object, regex, choice, Lark or GBNF grammar) into a [`Grammar`]: an llguidance
//!   `Matcher` over our tokenizer's vocabulary (padded to the model's), built once
//!   per engine ([`SharedCompiler`] builds it on first use). An invalid constraint is
//!   [`EngineError::InvalidGrammar`] (HTTP 400) with llguidance's message, found
//!   before the request enters the engine.
//! * Compiles run on the [`compile`] pool: dedicated low-priority threads with a
//!   large stack, after the static bounds of [`bounds`] (chain depth, regex size),
//!   under a deadline and llguidance's fuel and size limits ([`CompileLimits`]),
//!   cancelled when the client goes; the first mask is computed there too, so a
//!   constraint that cannot start is refused before it is queued.
//! * Each step the model runner hands the constrained rows' grammars to
//!   [`Masks`], a small pool of mask threads (not the rayon pool the forward pass
//!   uses) that computes their allowed-token bitmasks while the model runs, as vLLM
//!   does; after the forward pass the runner waits for them within a bound (late
//!   rows are deferred to a later step, see [`masks`]), [`apply_mask`] sets every
//!   disallowed logit to `-inf`, and after sampling [`Grammar::accept`] advances the
//!   matcher by the sampled token.
//! * A grammar lives as long as its request inside the engine: preemption keeps it
//!   (a recomputed prefix is never consumed again: the matcher follows the
//!   generated tokens, [`Grammar::num_consumed`]), finishing or aborting drops it.
//!   When the grammar is complete its mask allows EOS only, so the request stops
//!   with EOS (`finish_reason: "stop"`).

pub mod bounds;
pub mod compile;
mod compiler;
mod gate;
mod gbnf;
mod grammar;
pub mod limits;
pub mod masks;

pub use masks::{MaskRow, MaskStats, Masks, RowMask, MASK_WAIT_FRACTION, MIN_MASK_WAIT};

use crate::EngineError;
use compile::{CompilePool, SharedCore};
pub use compile::{CompileStats, CompileTicket};
pub use compiler::GrammarCompiler;
pub use gate::ReasoningGate;
pub use grammar::{apply_mask, Grammar};
pub use limits::CompileLimits;
use pagoda_core::StructuredOutputs;
use std::sync::{Arc, Mutex};

/// The engine's compiler and its compile pool (started on first use).
pub struct SharedCompiler {
    core: Arc<SharedCore>,
    pool: Mutex<Option<CompilePool>>,
}

impl SharedCompiler {
    pub fn new(
        tokenizer: Arc<tokenizers::Tokenizer>,
        eos_ids: Vec<u32>,
        vocab_size: usize,
        limits: CompileLimits,
    ) -> Self {
        SharedCompiler {
            core: Arc::new(SharedCore::new(tokenizer, eos_ids, vocab_size, limits)),
            pool: Mutex::new(None),
        }
    }

    /// What the compile pool has done so far.
    pub fn stats(&self) -> compile::CompileStats {
        self.core.stats()
    }

    /// The limits compiles run under.
    pub fn limits(&self) -> &CompileLimits {
        self.core.limits()
    }

    /// Queues `spec` on the compile pool; the ticket answers with the grammar.
    pub fn submit(&self, spec: &StructuredOutputs) -> Result<CompileTicket, EngineError> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.is_none() {
            *pool = Some(CompilePool::start(self.core.clone())?);
        }
        let pool = pool.as_ref().expect("started above");
        Ok(pool.submit(spec.clone(), self.core.limits().timeout))
    }

    /// Compiles `spec` on the compile pool and waits for it on this thread.
    pub fn compile(&self, spec: &StructuredOutputs) -> Result<Grammar, EngineError> {
        self.submit(spec)?.wait_blocking()
    }
}
