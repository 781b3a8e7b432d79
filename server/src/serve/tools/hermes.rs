//! `hermes`: Hermes 2 Pro, Qwen2.5 and Qwen3 write each call as
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, after optional
//! text (the content). A block whose JSON is not a call stays content, markup
//! included; an unclosed block at the end of the output is read as if closed.

use super::{call_from_object, marked_blocks, Block, Cursor, Step, ToolParser, ToolParserEntry};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub struct Hermes;

inventory::submit! { ToolParserEntry { name: "hermes", parser: &Hermes } }

fn body_call(body: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    call_from_object(&v)
}

/// One block after `<tool_call>`: up to `</tool_call>` (or the end of a finished
/// output); a body that is not a call is content, markup included.
fn block(body: &str, fin: bool) -> Block {
    let (inner, n) = match body.find(END) {
        Some(j) => (&body[..j], j + END.len()),
        None if fin => (body, body.len()),
        None => return Block::Wait,
    };
    match body_call(inner) {
        Some(call) => Block::Calls(vec![call], n),
        None => Block::Broken(n),
    }
}

impl ToolParser for Hermes {
    fn step(&self, text: &str, cur: &mut Cursor, fin: bool) -> Step {
        marked_blocks(text, cur, fin, START, block)
    }
}
