//! `mistral`: Mistral models mark calls with the `[TOOL_CALLS]` token, then
//! either a JSON list of `{"name", "arguments"}` objects (tokenizer v3) or
//! `name[ARGS]{...}` per call (v11 and later; `name{...}` is read too). Text
//! before the marker is content. A marker followed by something that can never
//! be a call is content, marker included (`skip_special_tokens: false` shows it).

use super::scan::{json_value, Scan};
use super::{call_from_object, marked_blocks, Block, Cursor, Step, ToolParser, ToolParserEntry};

const START: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

pub struct Mistral;

inventory::submit! { ToolParserEntry { name: "mistral", parser: &Mistral } }

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
                    None => Block::Broken(0),
                }
            }
            Scan::Incomplete if !fin => Block::Wait,
            _ => Block::Broken(0),
        };
    }
    let name_len = b.find(|c: char| !is_name_char(c)).unwrap_or(b.len());
    let name = &b[..name_len];
    let after = &b[name_len..];
    if after.is_empty() {
        return if fin { Block::Broken(0) } else { Block::Wait };
    }
    if name.is_empty() {
        return Block::Broken(0);
    }
    let args_at = if after.starts_with(ARGS) {
        ARGS.len()
    } else if after.starts_with('{') {
        0
    } else if !fin && ARGS.starts_with(after) {
        return Block::Wait;
    } else {
        return Block::Broken(0);
    };
    let base = lead + name_len + args_at;
    match json_value(&body[base..]) {
        Scan::Complete(v @ serde_json::Value::Object(_), n) => {
            Block::Calls(vec![(name.to_string(), v.to_string())], base + n)
        }
        Scan::Incomplete if !fin => Block::Wait,
        _ => Block::Broken(0),
    }
}

impl ToolParser for Mistral {
    fn step(&self, text: &str, cur: &mut Cursor, fin: bool) -> Step {
        // A marker that can never start a call is content by itself.
        marked_blocks(text, cur, fin, START, block)
    }
}
