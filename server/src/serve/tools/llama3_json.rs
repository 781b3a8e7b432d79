//! `llama3_json`: Llama 3.1/3.2 answer a tool prompt with JSON only,
//! `{"name": ..., "parameters": {...}}` (`arguments` is read too), optionally
//! after `<|python_tag|>`, several separated by `;`. An output that does not
//! start that way is content; so is whatever follows the last call that is not
//! one.

use super::{json_call, Cursor, JsonCall, Mode, Step, ToolParser, ToolParserEntry};

const TAG: &str = "<|python_tag|>";

pub struct Llama3Json;

inventory::submit! { ToolParserEntry { name: "llama3_json", parser: &Llama3Json } }

impl ToolParser for Llama3Json {
    fn step(&self, text: &str, cur: &mut Cursor, fin: bool) -> Step {
        let mut s = Step::default();
        let mut pos = 0;
        loop {
            let rest = &text[pos..];
            match cur.mode {
                Mode::Undecided => {
                    let t = rest.trim_start();
                    let ws = rest.len() - t.len();
                    if t.starts_with(TAG) {
                        cur.mode = Mode::Calls;
                        pos += ws + TAG.len();
                    } else if t.starts_with('{') {
                        cur.mode = Mode::Calls;
                        pos += ws;
                    } else if !fin && (t.is_empty() || TAG.starts_with(t)) {
                        break;
                    } else {
                        cur.mode = Mode::Content;
                    }
                }
                Mode::Content => {
                    s.content(rest);
                    pos = text.len();
                    break;
                }
                Mode::Calls => {
                    let t = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    pos += rest.len() - t.len();
                    if t.is_empty() {
                        break;
                    }
                    match json_call(t, fin, &mut s) {
                        JsonCall::Call(n) => pos += n,
                        JsonCall::Wait => break,
                        JsonCall::NotACall => cur.mode = Mode::Content,
                    }
                }
            }
        }
        s.settled = pos;
        s
    }
}
