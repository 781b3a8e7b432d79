//! Reasoning output (`--reasoning-parser`): splits a model's
//! `<think>…</think>` from its answer into the message's `reasoning` field
//! (and its deprecated alias `reasoning_content`, as vLLM writes both).
//!
//! Written as the tool parsers are ([`crate::serve::tools`]): one
//! prefix-stable step function over the unsettled text, driven once for a
//! finished output and once per delta when streaming, so that both agree
//! however the output is cut. Registered through `inventory`, one file each.

#[cfg(test)]
mod tests;
mod think;

/// Where the output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Nothing read yet.
    #[default]
    Start,
    Reasoning,
    Content,
}

/// What one step settled, from the first `settled` bytes of its text.
#[derive(Debug, Default, PartialEq)]
pub struct RStep {
    pub reasoning: String,
    pub content: String,
    pub settled: usize,
}

/// A reasoning format.
pub trait ReasoningParser: Send + Sync {
    /// Settles what it can of `text` (with `is_final`, all of it). Must be
    /// prefix-stable, as [`crate::serve::tools::ToolParser::step`].
    fn step(&self, text: &str, phase: &mut Phase, is_final: bool) -> RStep;

    /// Its start and end markers, and whether the output is reasoning from its
    /// first token: a structured-output constraint applies after the reasoning
    /// (`pagoda_engine::structured::ReasoningGate`).
    fn markers(&self) -> Markers;
}

/// A reasoning format's markers (text, tokenized by the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Markers {
    pub start: &'static str,
    pub end: &'static str,
    pub starts_in_reasoning: bool,
}

/// A registered parser (`--reasoning-parser NAME`).
pub struct ReasoningParserEntry {
    pub name: &'static str,
    pub parser: &'static dyn ReasoningParser,
}

inventory::collect!(ReasoningParserEntry);

/// The registered parser of this name.
pub fn lookup(name: &str) -> Option<&'static dyn ReasoningParser> {
    inventory::iter::<ReasoningParserEntry>
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.parser)
}

/// Every registered name, sorted.
pub fn names() -> Vec<&'static str> {
    let mut v: Vec<_> = inventory::iter::<ReasoningParserEntry>
        .into_iter()
        .map(|e| e.name)
        .collect();
    v.sort_unstable();
    v
}

/// Drives one parser over one output.
pub struct ReasoningStream {
    parser: &'static dyn ReasoningParser,
    buf: String,
    phase: Phase,
    done: bool,
}

impl ReasoningStream {
    pub fn new(parser: &'static dyn ReasoningParser) -> Self {
        ReasoningStream {
            parser,
            buf: String::new(),
            phase: Phase::Start,
            done: false,
        }
    }

    /// Feeds a delta; returns the `(reasoning, content)` it settles.
    pub fn push(&mut self, delta: &str, is_final: bool) -> (String, String) {
        if self.done {
            return Default::default();
        }
        self.buf.push_str(delta);
        let (mut r, mut c) = (String::new(), String::new());
        loop {
            let before = self.phase;
            let s = self.parser.step(&self.buf, &mut self.phase, is_final);
            r.push_str(&s.reasoning);
            c.push_str(&s.content);
            let n = s.settled.min(self.buf.len());
            self.buf.drain(..n);
            // A phase change settles nothing but needs another step.
            if (n == 0 && self.phase == before) || self.buf.is_empty() {
                break;
            }
        }
        if is_final {
            // Nothing may be lost: what a parser left is where its phase says.
            let rest = std::mem::take(&mut self.buf);
            match self.phase {
                Phase::Reasoning => r.push_str(&rest),
                _ => c.push_str(&rest),
            }
            self.done = true;
        }
        (r, c)
    }
}
