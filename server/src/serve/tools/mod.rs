//! Tool calling: the parsers that find tool calls in a model's output
//! (`--tool-call-parser`), registered through `inventory` as the attention
//! backends are, so a new format is one file with one `inventory::submit!`.
//!
//! Every parser is written as one *step function* over the text not yet
//! settled ([`ToolParser::step`]): it settles what the text so far decides for
//! good (content, whole calls) and leaves the rest for the next delta. The
//! one-shot parse of a finished output and the streaming parse are the same
//! [`ToolStream`] driven with one delta or many, and every decision a step
//! takes is prefix-stable (see [`scan`]), so the deltas of a stream concatenate
//! to the one-shot parse however the output is cut. The property test over
//! every registered parser (`tests.rs`) checks exactly that.
//!
//! A call's arguments go out once its markup is complete and its JSON parsed,
//! so they are always valid JSON; a block the model breaks becomes content, the
//! same streamed or not. `tool_choice: "required"` and a named function do not
//! use these parsers: their output is constrained by a JSON schema
//! ([`choice`]) and read by the internal parsers there.

pub mod choice;
mod hermes;
mod llama3_json;
mod mistral;
mod pythonic;
pub mod scan;
#[cfg(test)]
mod tests;

pub use choice::{ToolChoice, ToolSpec};

/// One settled piece of a model's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// Text for the message's `content`.
    Content(String),
    /// A new call starts (its index is its position among the calls).
    CallStart { name: String },
    /// A fragment of the latest call's `arguments` (JSON text).
    Args(String),
}

/// Where a parser stands between steps (kept by [`ToolStream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// Nothing settled yet: whitespace here is dropped before a call.
    pub at_start: bool,
    /// The last thing settled was a call: whitespace here is dropped.
    pub after_call: bool,
    /// Parsers that decide once whether the output is calls (`llama3_json`,
    /// `pythonic`) keep that decision here.
    pub mode: Mode,
}

/// See [`Cursor::mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Undecided,
    Content,
    Calls,
}

/// What one step settled: `items`, from the first `settled` bytes of its text.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    pub items: Vec<Item>,
    pub settled: usize,
}

impl Step {
    pub fn content(&mut self, s: &str) {
        if !s.is_empty() {
            self.items.push(Item::Content(s.to_string()));
        }
    }
    pub fn call(&mut self, name: String, arguments: String) {
        self.items.push(Item::CallStart { name });
        self.items.push(Item::Args(arguments));
    }
}

/// A tool-call format.
pub trait ToolParser: Send + Sync {
    /// Settles what it can of `text` (the output not settled yet). With
    /// `is_final` the output is over and everything must be settled. Must be
    /// prefix-stable: what it settles of a text it settles identically of every
    /// extension of that text (the property test holds every parser to it).
    fn step(&self, text: &str, cursor: &mut Cursor, is_final: bool) -> Step;
}

/// A registered parser: `inventory::submit! { ToolParserEntry { name, parser } }`.
pub struct ToolParserEntry {
    /// The `--tool-call-parser` name.
    pub name: &'static str,
    pub parser: &'static dyn ToolParser,
}

inventory::collect!(ToolParserEntry);

/// A registered parser is `&'static`; streams hold `Arc<dyn ToolParser>` so that
/// the per-request parsers of [`choice`] (which know the named function) fit too.
impl<T: ToolParser + ?Sized> ToolParser for &'static T {
    fn step(&self, text: &str, cursor: &mut Cursor, is_final: bool) -> Step {
        (**self).step(text, cursor, is_final)
    }
}

/// The registered parser of this name.
pub fn lookup(name: &str) -> Option<&'static dyn ToolParser> {
    inventory::iter::<ToolParserEntry>
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.parser)
}

/// Every registered parser name, sorted (for help and errors).
pub fn names() -> Vec<&'static str> {
    let mut v: Vec<_> = inventory::iter::<ToolParserEntry>
        .into_iter()
        .map(|e| e.name)
        .collect();
    v.sort_unstable();
    v
}

/// Drives one parser over one output, delta by delta.
pub struct ToolStream {
    parser: std::sync::Arc<dyn ToolParser>,
    buf: String,
    cursor: Cursor,
    /// `parallel_tool_calls: false`: calls after the first are dropped.
    parallel: bool,
    calls: usize,
    /// Dropping a call's argument fragments too.
    dropping: bool,
    done: bool,
}

impl ToolStream {
    pub fn new(parser: std::sync::Arc<dyn ToolParser>, parallel: bool) -> Self {
        ToolStream {
            parser,
            buf: String::new(),
            cursor: Cursor {
                at_start: true,
                ..Default::default()
            },
            parallel,
            calls: 0,
            dropping: false,
            done: false,
        }
    }

    /// Feeds one delta of output; returns what it settles. After a call with
    /// `is_final` the stream is over (later calls return nothing).
    pub fn push(&mut self, delta: &str, is_final: bool) -> Vec<Item> {
        if self.done {
            return Vec::new();
        }
        self.buf.push_str(delta);
        let mut out = Vec::new();
        loop {
            let step = self.parser.step(&self.buf, &mut self.cursor, is_final);
            // A parser that settles past its text would lose output: clamp, and
            // at the end take whatever is left as content rather than lose it.
            let settled = step.settled.min(self.buf.len());
            for item in step.items {
                self.accept(item, &mut out);
            }
            self.buf.drain(..settled);
            if settled > 0 {
                self.cursor.at_start = false;
            }
            if settled == 0 || self.buf.is_empty() {
                break;
            }
        }
        if is_final {
            if !self.buf.is_empty() {
                let rest = std::mem::take(&mut self.buf);
                self.accept(Item::Content(rest), &mut out);
            }
            self.done = true;
        }
        out
    }

    fn accept(&mut self, item: Item, out: &mut Vec<Item>) {
        match &item {
            Item::CallStart { .. } => {
                self.cursor.after_call = true;
                self.dropping = !self.parallel && self.calls >= 1;
                if self.dropping {
                    return;
                }
                self.calls += 1;
            }
            Item::Args(_) if self.dropping => return,
            Item::Args(_) => {}
            Item::Content(s) if s.is_empty() => return,
            Item::Content(_) => {
                self.cursor.after_call = false;
                self.dropping = false;
            }
        }
        out.push(item);
    }
}

/// The one-shot parse of a whole output: `(content, [(name, arguments)])`.
pub fn parse_all(
    parser: std::sync::Arc<dyn ToolParser>,
    text: &str,
    parallel: bool,
) -> (String, Vec<(String, String)>) {
    collapse(ToolStream::new(parser, parallel).push(text, true))
}

/// Items folded into the content and the calls they make up.
pub fn collapse(items: impl IntoIterator<Item = Item>) -> (String, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for it in items {
        match it {
            Item::Content(s) => content.push_str(&s),
            Item::CallStart { name } => calls.push((name, String::new())),
            Item::Args(a) => {
                if let Some(c) = calls.last_mut() {
                    c.1.push_str(&a);
                }
            }
        }
    }
    (content, calls)
}

/// A `{"name": ..., "arguments" | "parameters": ...}` object as a call.
pub(crate) fn call_from_object(v: &serde_json::Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .unwrap_or(&serde_json::Value::Null);
    Some((name, scan::arguments_string(args)?))
}

/// What [`json_call`] found at the start of a text.
pub(crate) enum JsonCall {
    /// A complete call object of this many bytes, handed to the step.
    Call(usize),
    /// The object is not complete yet: wait for the next delta.
    Wait,
    /// Not a call object: the rest is content.
    NotACall,
}

/// Reads one `{"name", "arguments" | "parameters"}` object at the start of `t`
/// into `s` (the JSON-list parsers' common step: `llama3_json`, `required`).
pub(crate) fn json_call(t: &str, is_final: bool, s: &mut Step) -> JsonCall {
    match scan::json_value(t) {
        scan::Scan::Complete(v, n) => match call_from_object(&v) {
            Some((name, args)) => {
                s.call(name, args);
                JsonCall::Call(n)
            }
            None => JsonCall::NotACall,
        },
        scan::Scan::Incomplete if !is_final => JsonCall::Wait,
        _ => JsonCall::NotACall,
    }
}

/// Whitespace where it is dropped (at the start, after a call) when a call or
/// the end follows: how many bytes of `rest` to skip (0 when content follows,
/// which keeps its whitespace), or `None` to wait for the next delta.
pub(crate) fn lead_ws(
    rest: &str,
    cursor: &Cursor,
    is_final: bool,
    starts: &[&str],
) -> Option<usize> {
    if !(cursor.at_start || cursor.after_call) {
        return Some(0);
    }
    let ws = rest.len() - rest.trim_start().len();
    let after = &rest[ws..];
    if after.is_empty() {
        return if is_final { Some(ws) } else { None };
    }
    if starts.iter().any(|t| after.starts_with(t)) {
        return Some(ws);
    }
    if !is_final && starts.iter().any(|t| t.starts_with(after)) {
        return None;
    }
    Some(0)
}

/// What follows one start marker, for [`marked_blocks`].
pub(crate) enum Block {
    /// Calls, and the body bytes they took.
    Calls(Vec<(String, String)>, usize),
    /// Needs more text.
    Wait,
    /// Never a call: the marker and the body's first `n` bytes are content.
    Broken(usize),
}

/// One step of a parser whose calls follow a start marker (`hermes`, `mistral`):
/// text before a marker is content (a possible marker prefix at the end is held
/// back), and what follows a marker is `block`'s to read.
pub(crate) fn marked_blocks(
    text: &str,
    cur: &mut Cursor,
    fin: bool,
    start: &str,
    block: impl Fn(&str, bool) -> Block,
) -> Step {
    let mut s = Step::default();
    let mut pos = 0;
    while pos < text.len() {
        let Some(skip) = lead_ws(&text[pos..], cur, fin, &[start]) else {
            break;
        };
        if skip > 0 {
            pos += skip;
            s.settled = pos;
            continue;
        }
        let rest = &text[pos..];
        let Some(i) = rest.find(start) else {
            let hold = if fin {
                0
            } else {
                scan::partial_suffix(rest, start)
            };
            let c = &rest[..rest.len() - hold];
            if !c.is_empty() {
                s.content(c);
                cur.after_call = false;
                cur.at_start = false;
            }
            s.settled = pos + c.len();
            break;
        };
        if i > 0 {
            s.content(&rest[..i]);
            cur.after_call = false;
            cur.at_start = false;
        }
        let body_at = pos + i + start.len();
        match block(&text[body_at..], fin) {
            Block::Wait => {
                s.settled = pos + i;
                break;
            }
            Block::Broken(n) => {
                s.content(&text[pos + i..body_at + n]);
                cur.after_call = false;
                pos = body_at + n;
            }
            Block::Calls(calls, n) => {
                for (name, args) in calls {
                    s.call(name, args);
                }
                cur.after_call = true;
                pos = body_at + n;
            }
        }
        cur.at_start = false;
        s.settled = pos;
    }
    s
}
