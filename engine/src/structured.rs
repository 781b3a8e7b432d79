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
mod gate;
mod gbnf;
pub mod masks;

pub use masks::{MaskRow, MaskStats, Masks, RowMask, MASK_WAIT_FRACTION, MIN_MASK_WAIT};

use crate::EngineError;
pub use compile::{CompileLimits, CompileStats, CompileTicket};
pub use gate::ReasoningGate;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use pagoda_core::{Constraint, StructuredOutputs};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Compiles constraints for one tokenizer and vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
    limits: CompileLimits,
}

impl GrammarCompiler {
    /// Builds llguidance's token trie from `tokenizer`'s vocabulary, with the
    /// model's EOS ids as the grammar's end and `vocab_size` (the model's logits
    /// width, which may exceed the tokenizer's) as its size.
    pub fn new(
        tokenizer: &tokenizers::Tokenizer,
        eos_ids: &[u32],
        vocab_size: usize,
        limits: CompileLimits,
    ) -> Result<Self, EngineError> {
        let fault = |e: String| EngineError::Fault {
            message: format!("structured outputs: {e}"),
        };
        let mut bt = toktrie_hf_tokenizers::ByteTokenizer::from_tokenizer(tokenizer.clone())
            .map_err(|e| fault(e.to_string()))?;
        let n_tok = tokenizer.get_vocab_size(true);
        let eos: Vec<u32> = eos_ids
            .iter()
            .copied()
            .filter(|&t| (t as usize) < n_tok)
            .collect();
        if !eos.is_empty() {
            bt.set_eos_tokens(&eos);
        }
        let env = bt
            .into_tok_env(Some(vocab_size.max(n_tok)))
            .map_err(|e| fault(e.to_string()))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| fault(e.to_string()))?;
        factory.quiet();
        limits.apply(factory.limits_mut());
        Ok(GrammarCompiler { factory, limits })
    }

    /// Checks the bounds, then builds the matcher (no mask yet).
    pub(crate) fn build_matcher(&self, spec: &StructuredOutputs) -> Result<Matcher, EngineError> {
        spec.validate()?;
        check_bounds(spec, &self.limits)?;
        let grammar = top_level_grammar(spec)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid_grammar(format!("Grammar error: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid_grammar(format!("Grammar error: {e}")));
        }
        Ok(matcher)
    }
}

/// The static bounds of [`bounds`], each refusal naming its flag.
fn check_bounds(spec: &StructuredOutputs, limits: &CompileLimits) -> Result<(), EngineError> {
    let too_deep = |what: &str| {
        invalid_grammar(format!(
            "the {what} nests more than {} levels deep (--structured-outputs-max-depth)",
            limits.max_depth
        ))
    };
    let mut regexes: Vec<String> = spec.whitespace_pattern.iter().cloned().collect();
    match &spec.constraint {
        Constraint::Json(schema) => {
            bounds::schema_depth(schema, limits.max_depth)
                .map_err(|_| too_deep("JSON schema (counting `$ref`s)"))?;
            bounds::schema_patterns(schema, &mut regexes);
        }
        Constraint::JsonObject => {}
        Constraint::Regex(rx) => regexes.push(rx.clone()),
        Constraint::Choice(choices) => {
            let total: u64 = choices.iter().map(|c| c.len() as u64 + 1).sum();
            if total > limits.max_regex_size {
                return Err(invalid_grammar(format!(
                    "`choice` has {} options of {total} bytes in all; the limit is {} bytes \
                     (--structured-outputs-max-regex-size)",
                    choices.len(),
                    limits.max_regex_size
                )));
            }
        }
        Constraint::Grammar(g) => {
            let lark = if gbnf::is_gbnf(g) {
                gbnf::to_lark(g)
                    .map_err(|e| invalid_grammar(format!("Invalid grammar specification: {e}")))?
            } else {
                g.clone()
            };
            bounds::lark_depth(&lark, limits.max_depth)
                .map_err(|_| too_deep("grammar's rule chain"))?;
            regexes.extend(bounds::lark_regexes(&lark));
            for schema in bounds::lark_json_schemas(&lark) {
                bounds::schema_depth(&schema, limits.max_depth)
                    .map_err(|_| too_deep("grammar's embedded JSON schema"))?;
                bounds::schema_patterns(&schema, &mut regexes);
            }
        }
    }
    for rx in &regexes {
        if let Some(size) = bounds::regex_size(rx).filter(|&s| s > limits.max_regex_size) {
            let shown: String = rx.chars().take(60).collect();
            return Err(invalid_grammar(format!(
                "the regex `{shown}` expands to {size} elements once its repetitions are counted; \
                 the limit is {} (--structured-outputs-max-regex-size)",
                limits.max_regex_size
            )));
        }
    }
    Ok(())
}

fn invalid_grammar(message: String) -> EngineError {
    EngineError::InvalidGrammar {
        param: "structured_outputs".into(),
        message,
    }
}

/// llguidance's grammar for a constraint, with vLLM's options applied.
fn top_level_grammar(spec: &StructuredOutputs) -> Result<TopLevelGrammar, EngineError> {
    let json_options = || JsonCompileOptions {
        whitespace_flexible: !spec.disable_any_whitespace,
        whitespace_pattern: spec.whitespace_pattern.clone(),
        ..JsonCompileOptions::default()
    };
    let with_options = |mut schema: Value| -> Value {
        if let Value::Object(o) = &mut schema {
            // A schema's own `x-guidance` options win over the request's.
            if !o.contains_key("x-guidance") {
                if let Ok(opts) = serde_json::to_value(json_options()) {
                    o.insert("x-guidance".into(), opts);
                }
            }
        }
        schema
    };
    Ok(match &spec.constraint {
        Constraint::Json(schema) => {
            let mut schema = match schema {
                Value::Bool(true) => json!({}),
                s => s.clone(),
            };
            if spec.disable_additional_properties {
                no_additional_properties(&mut schema);
            }
            TopLevelGrammar::from_json_schema(with_options(schema))
        }
        Constraint::JsonObject => {
            TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"})))
        }
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Constraint::Choice(choices) => {
            let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
            TopLevelGrammar::from_regex(&alternatives.join("|"))
        }
        Constraint::Grammar(g) if gbnf::is_gbnf(g) => {
            let lark = gbnf::to_lark(g)
                .map_err(|e| invalid_grammar(format!("Invalid grammar specification: {e}")))?;
            TopLevelGrammar::from_lark(lark)
        }
        Constraint::Grammar(g) => TopLevelGrammar::from_lark_or_grammar_list(g)
            .map_err(|e| invalid_grammar(format!("Invalid grammar specification: {e}")))?,
    })
}

/// vLLM's `disable_additional_properties`: every (sub)schema with `properties`
/// and no `additionalProperties` gets `additionalProperties: false`.
fn no_additional_properties(schema: &mut Value) {
    const MAPS: [&str; 4] = ["properties", "$defs", "definitions", "dependentSchemas"];
    const SUBS: [&str; 11] = [
        "additionalProperties",
        "items",
        "prefixItems",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "contains",
    ];
    match schema {
        Value::Object(o) => {
            for k in MAPS {
                if let Some(Value::Object(m)) = o.get_mut(k) {
                    m.values_mut().for_each(no_additional_properties);
                }
            }
            for k in SUBS {
                if let Some(v) = o.get_mut(k) {
                    no_additional_properties(v);
                }
            }
            if o.get("properties").is_some_and(Value::is_object)
                && !o.contains_key("additionalProperties")
            {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
        Value::Array(a) => a.iter_mut().for_each(no_additional_properties),
        _ => {}
    }
}

/// Escapes regex metacharacters so that `s` matches itself literally.
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One request's matcher and how many of its output tokens it has consumed.
/// Cloning a fresh grammar is how `n` samples of one request get theirs without
/// compiling again.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    num_consumed: usize,
    /// Output tokens the matcher consumed (fewer than `num_consumed` after reasoning).
    matcher_consumed: usize,
    /// Reasoning ahead of the constrained answer ([`Grammar::after_reasoning`]).
    gate: gate::Gate,
    /// The mask before any output token, computed on the compile pool; the
    /// first [`Grammar::compute_mask`] returns it.
    first_mask: Option<SimpleVob>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("num_consumed", &self.num_consumed)
            .field("gate", &self.gate)
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Grammar {
    fn new(matcher: Matcher) -> Self {
        Grammar {
            matcher,
            num_consumed: 0,
            matcher_consumed: 0,
            gate: gate::Gate::Open,
            first_mask: None,
        }
    }

    /// The constraint applies after the request's reasoning ([`ReasoningGate`]'s
    /// markers; `prompt` says whether reasoning is open or closed already): until
    /// then every token is allowed. For a fresh grammar (before any output).
    pub fn after_reasoning(mut self, markers: &ReasoningGate, prompt: &[u32]) -> Grammar {
        self.gate = gate::Gate::new(markers, prompt);
        self
    }

    /// Computes the first mask now (where the compile runs): an error means the
    /// constraint cannot produce any output.
    fn precompute_first_mask(&mut self) -> Result<(), String> {
        let m = self.compute_mask()?;
        self.first_mask = Some(m);
        Ok(())
    }

    /// The tokens allowed next: EOS only once the grammar is complete.
    pub fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        match self.gate {
            gate::Gate::Open => {}
            gate::Gate::Closed { .. } => {
                let len = match &self.first_mask {
                    Some(m) => m.len(),
                    None => self.grammar_mask()?.len(),
                };
                return Ok(SimpleVob::alloc_ones(len));
            }
            gate::Gate::Undecided { start, .. } => {
                let mut m = self.grammar_mask()?;
                if (start as usize) < m.len() {
                    m.allow_token(start);
                }
                return Ok(m);
            }
        }
        if let Some(m) = self.first_mask.take() {
            if self.matcher_consumed == 0 {
                return Ok(m);
            }
        }
        self.grammar_mask()
    }

    /// The matcher's mask now (the precomputed first one while it consumed nothing).
    fn grammar_mask(&mut self) -> Result<SimpleVob, String> {
        if self.matcher_consumed == 0 {
            if let Some(m) = &self.first_mask {
                return Ok(m.clone());
            }
        }
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("structured outputs: {e}"))
    }

    /// Advances the matcher by a sampled token (nothing once it stopped, e.g. on
    /// the EOS that ends a complete grammar).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.num_consumed += 1;
        if !self.gate.accept(token) {
            return Ok(());
        }
        self.matcher_consumed += 1;
        self.first_mask = None;
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("structured outputs: token {token} rejected: {e}"))
    }

    /// Output tokens consumed so far: must equal the request's output length
    /// whenever its next token is sampled.
    pub fn num_consumed(&self) -> usize {
        self.num_consumed
    }

    /// Whether the grammar is complete (only EOS may follow).
    pub fn is_stopped(&self) -> bool {
        self.gate == gate::Gate::Open && self.matcher.is_stopped()
    }
}

/// Sets every logit whose token `mask` does not allow to `-inf`; tokens past the
/// mask's end (a model vocabulary wider than the grammar's) are disallowed too.
pub fn apply_mask(logits: &mut [f32], mask: &SimpleVob) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        match words.get(w).copied().unwrap_or(0) {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            bits => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits & (1 << b) == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// What the compile threads share with [`SharedCompiler`]: the tokenizer, the
/// limits and the compiler, built on first use (building the token trie takes a
/// moment, which servers without structured requests should not pay at start).
pub(crate) struct SharedCore {
    tokenizer: Arc<tokenizers::Tokenizer>,
    eos_ids: Vec<u32>,
    vocab_size: usize,
    limits: CompileLimits,
    compiler: OnceLock<Result<GrammarCompiler, EngineError>>,
    counters: compile::Counters,
}

impl SharedCore {
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

/// The engine's compiler and its compile pool (started on first use).
pub struct SharedCompiler {
    core: Arc<SharedCore>,
    pool: Mutex<Option<compile::CompilePool>>,
}

impl SharedCompiler {
    pub fn new(
        tokenizer: Arc<tokenizers::Tokenizer>,
        eos_ids: Vec<u32>,
        vocab_size: usize,
        limits: CompileLimits,
    ) -> Self {
        SharedCompiler {
            core: Arc::new(SharedCore {
                tokenizer,
                eos_ids,
                vocab_size,
                limits,
                compiler: OnceLock::new(),
                counters: Default::default(),
            }),
            pool: Mutex::new(None),
        }
    }

    /// What the compile pool has done so far.
    pub fn stats(&self) -> compile::CompileStats {
        self.core.counters.snapshot()
    }

    /// The limits compiles run under.
    pub fn limits(&self) -> &CompileLimits {
        &self.core.limits
    }

    /// Queues `spec` on the compile pool; the ticket answers with the grammar.
    pub fn submit(&self, spec: &StructuredOutputs) -> Result<CompileTicket, EngineError> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.is_none() {
            *pool = Some(compile::CompilePool::start(self.core.clone())?);
        }
        let pool = pool.as_ref().expect("started above");
        Ok(pool.submit(spec.clone(), self.core.limits.timeout))
    }

    /// Compiles `spec` on the compile pool and waits for it on this thread.
    pub fn compile(&self, spec: &StructuredOutputs) -> Result<Grammar, EngineError> {
        self.submit(spec)?.wait_blocking()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_makes_literals() {
        assert_eq!(escape_regex("a.b"), "a\\.b");
        assert_eq!(escape_regex("(x|y)"), "\\(x\\|y\\)");
        assert_eq!(escape_regex("plain"), "plain");
    }

    #[test]
    fn additional_properties_are_closed_recursively() {
        let mut s = json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
            "$defs": {"d": {"properties": {}, "additionalProperties": true}}
        });
        no_additional_properties(&mut s);
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(s["$defs"]["d"]["additionalProperties"], json!(true));
    }

    #[test]
    fn mask_sets_disallowed_to_neg_inf() {
        let mut mask = SimpleVob::alloc(64);
        mask.allow_token(1);
        mask.allow_token(33);
        // The logits are wider than the mask: the tail is disallowed.
        let mut logits = vec![0.5f32; 70];
        apply_mask(&mut logits, &mask);
        for (i, l) in logits.iter().enumerate() {
            if i == 1 || i == 33 {
                assert_eq!(*l, 0.5, "token {i}");
            } else {
                assert_eq!(*l, f32::NEG_INFINITY, "token {i}");
            }
        }
        let mut all = SimpleVob::alloc(32);
        all.set_all(true);
        let mut logits = vec![1.0f32; 32];
        apply_mask(&mut logits, &all);
        assert!(logits.iter().all(|&l| l == 1.0));
    }
}
