//! `mistral`: Mistral models mark calls with the `[TOOL_CALLS]` token, then
//! either a JSON list of `{"name", "arguments"}` objects (tokenizer v3) or
//! `name[ARGS]{...}` per call (v11 and later; `name{...}` is read too). Text
//! before the marker is content. A marker followed by something that can never
//! be a call is content, marker included (`skip_special_tokens: false` shows it).

use super::scan::{json_value, partial_suffix, Scan};
use super::{call_from_object, lead_ws, Cursor, Step, ToolParser, ToolParserEntry};

const START: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

pub struct Mistral;

inventory::submit! { ToolParserEntry { name: "mistral", parser: &Mistral } }

/// What follows one marker.
enum Block {
    /// Calls, and the byte after them (relative to the body).
    Calls(Vec<(String, String)>, usize),
    /// Needs more text.
    Wait,
    /// Never a call: the marker is content.
    Broken,
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

fn block(body: &str, fin: bool) -> Block {
    let lead = body.len() - body.trim_start().len();
    let b = &body[lead..];
    if b.starts_with('[') {
        return match json_value(body) {
            Scan::Complete(serde_json::Value::Array(items), n) => {
                match items
                    .iter()
                    .map(call_from_object)
                    .collect::<Option<Vec<_>>>()
                {
                    Some(calls) => Block::Calls(calls, n),
                    None => Block::Broken,
                }
            }
            Scan::Incomplete if !fin => Block::Wait,
            _ => Block::Broken,
        };
    }
    let name_len = b.find(|c: char| !is_name_char(c)).unwrap_or(b.len());
    let name = &b[..name_len];
    let after = &b[name_len..];
    if after.is_empty() {
        return if fin { Block::Broken } else { Block::Wait };
    }
    if name.is_empty() {
        return Block::Broken;
    }
    let args_at = if after.starts_with(ARGS) {
        ARGS.len()
    } else if after.starts_with('{') {
        0
    } else if !fin && ARGS.starts_with(after) {
        return Block::Wait;
    } else {
        return Block::Broken;
    };
    let base = lead + name_len + args_at;
    match json_value(&body[base..]) {
        Scan::Complete(v @ serde_json::Value::Object(_), n) => {
            Block::Calls(vec![(name.to_string(), v.to_string())], base + n)
        }
        Scan::Incomplete if !fin => Block::Wait,
        _ => Block::Broken,
    }
}

impl ToolParser for Mistral {
    fn step(&self, text: &str, cur: &mut Cursor, fin: bool) -> Step {
        let mut s = Step::default();
        let mut pos = 0;
        while pos < text.len() {
            let Some(skip) = lead_ws(&text[pos..], cur, fin, &[START]) else {
                break;
            };
            if skip > 0 {
                pos += skip;
                s.settled = pos;
                continue;
            }
            let rest = &text[pos..];
            let Some(i) = rest.find(START) else {
                let hold = if fin { 0 } else { partial_suffix(rest, START) };
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
            let body_at = pos + i + START.len();
            match block(&text[body_at..], fin) {
                Block::Wait => {
                    s.settled = pos + i;
                    break;
                }
                Block::Broken => {
                    s.content(START);
                    cur.after_call = false;
                    pos = body_at;
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
}
