//! Anthropic's stream: `message_start`, then per content block
//! `content_block_start`, its `content_block_delta`s (`thinking_delta`,
//! `text_delta`, `input_json_delta`) and `content_block_stop`; at the end
//! `message_delta` (`stop_reason`, `stop_sequence`, output tokens) and
//! `message_stop`. Silences get Anthropic's `ping` event.

use super::answer::stop_reason;
use crate::serve::bridge::{event, ChatRun, Finish, SseSource, Step};
use crate::serve::shape::{random_id, Delta};
use serde_json::{json, Value};

#[derive(Clone, Copy, PartialEq)]
enum Block {
    Thinking,
    Text,
    Tool,
}

/// One streamed message's state.
pub struct MessageEvents {
    model: String,
    run: ChatRun,
    started: bool,
    ended: bool,
    /// The open block, at `index`.
    open: Option<Block>,
    index: usize,
    has_calls: bool,
    buf: String,
}

impl MessageEvents {
    pub fn new(model: String, run: ChatRun) -> Self {
        MessageEvents {
            model,
            run,
            started: false,
            ended: false,
            open: None,
            index: 0,
            has_calls: false,
            buf: String::new(),
        }
    }

    fn emit(&mut self, kind: &str, mut data: Value) {
        data["type"] = kind.into();
        self.buf.push_str(&event(kind, &data));
    }

    fn close(&mut self) {
        if self.open.take().is_some() {
            self.emit("content_block_stop", json!({"index": self.index}));
            self.index += 1;
        }
    }

    /// Opens a block of `kind` unless one is open (a tool block always opens).
    fn ensure(&mut self, kind: Block, start: Value) {
        if self.open == Some(kind) && kind != Block::Tool {
            return;
        }
        self.close();
        self.emit(
            "content_block_start",
            json!({"index": self.index, "content_block": start}),
        );
        self.open = Some(kind);
    }

    fn delta(&mut self, d: Delta) {
        if !d.reasoning.is_empty() {
            self.ensure(
                Block::Thinking,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
            );
            let delta = json!({"type": "thinking_delta", "thinking": d.reasoning});
            self.emit(
                "content_block_delta",
                json!({"index": self.index, "delta": delta}),
            );
        }
        if !d.content.is_empty() {
            self.ensure(Block::Text, json!({"type": "text", "text": ""}));
            let delta = json!({"type": "text_delta", "text": d.content});
            self.emit(
                "content_block_delta",
                json!({"index": self.index, "delta": delta}),
            );
        }
        for c in &d.tool_calls {
            if c.get("id").is_some() {
                self.has_calls = true;
                let start = json!({"type": "tool_use", "id": random_id("toolu_"),
                                   "name": c["function"]["name"], "input": {}});
                self.ensure(Block::Tool, start);
            }
            let args = c["function"]["arguments"].as_str().unwrap_or("");
            if !args.is_empty() && self.open == Some(Block::Tool) {
                let delta = json!({"type": "input_json_delta", "partial_json": args});
                self.emit(
                    "content_block_delta",
                    json!({"index": self.index, "delta": delta}),
                );
            }
        }
    }

    fn done(&mut self, f: Finish) {
        self.close();
        let (reason, seq) = stop_reason(f.finish_reason, &f.stop_reason, self.has_calls);
        self.emit(
            "message_delta",
            json!({"delta": {"stop_reason": reason, "stop_sequence": seq},
                   "usage": {"output_tokens": f.output_tokens}}),
        );
        self.emit("message_stop", json!({}));
    }
}

impl SseSource for MessageEvents {
    async fn next_bytes(&mut self) -> Option<String> {
        if !self.started {
            self.started = true;
            let message = json!({
                "id": random_id("msg_"), "type": "message", "role": "assistant",
                "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.run.prompt_tokens(), "output_tokens": 0},
            });
            self.emit("message_start", json!({"message": message}));
            return Some(std::mem::take(&mut self.buf));
        }
        if self.ended {
            return None;
        }
        match self.run.next().await {
            None => return None,
            Some(Step::Idle) => self.emit("ping", json!({})),
            Some(Step::Delta(d)) => self.delta(d),
            Some(Step::Done(f)) => {
                self.ended = true;
                self.done(f);
            }
            Some(Step::Failed(e)) => {
                self.ended = true;
                let kind = match e {
                    crate::serve::error::ApiError::Unavailable { .. } => "overloaded_error",
                    _ => "api_error",
                };
                self.emit(
                    "error",
                    json!({"error": {"type": kind, "message": e.to_string()}}),
                );
            }
        }
        Some(std::mem::take(&mut self.buf))
    }
}
