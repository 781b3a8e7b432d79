//! `hermes`: Hermes 2 Pro, Qwen2.5 and Qwen3 write each call as
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, after optional
//! text (the content). A block whose JSON is not a call stays content, markup
//! included; an unclosed block at the end of the output is read as if closed.

use super::scan::partial_suffix;
use super::{call_from_object, lead_ws, Cursor, Step, ToolParser, ToolParserEntry};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub struct Hermes;

inventory::submit! { ToolParserEntry { name: "hermes", parser: &Hermes } }

fn body_call(body: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    call_from_object(&v)
}

impl ToolParser for Hermes {
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
            let (body, end) = match text[body_at..].find(END) {
                Some(j) => (&text[body_at..body_at + j], body_at + j + END.len()),
                None if fin => (&text[body_at..], text.len()),
                None => {
                    s.settled = pos + i;
                    break;
                }
            };
            match body_call(body) {
                Some((name, args)) => {
                    s.call(name, args);
                    cur.after_call = true;
                }
                None => {
                    s.content(&text[pos + i..end]);
                    cur.after_call = false;
                }
            }
            cur.at_start = false;
            pos = end;
            s.settled = pos;
        }
        s
    }
}
