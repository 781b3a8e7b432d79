//! The typed SSE events of a streamed response: `response.created` and
//! `response.in_progress`, then per output item `response.output_item.added`,
//! its deltas (`response.output_text.delta` inside a content part,
//! `response.reasoning_text.delta`, `response.function_call_arguments.delta`),
//! its `.done` events and `response.output_item.done`; at the end
//! `response.completed` (also when `max_output_tokens` cut it: then its
//! `status` is `incomplete`, as vLLM) with the same response object a
//! non-streamed request gets. Every event
//! carries `sequence_number`, counting from 0.

use super::object::{call_item, message_item, reasoning_item, text_part, usage, Turn};
use crate::serve::bridge::{event, ChatRun, Finish, SseSource, Step};
use crate::serve::shape::{random_id, Delta};
use crate::serve::state::AppState;
use serde_json::{json, Value};
use std::sync::Arc;

/// The item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

/// One streamed response's state.
pub struct ResponseEvents {
    st: Arc<AppState>,
    turn: Turn,
    run: ChatRun,
    seq: u64,
    started: bool,
    ended: bool,
    /// Finished output items.
    output: Vec<Value>,
    open: Option<Open>,
    /// Events of this step, not sent yet.
    buf: String,
}

impl ResponseEvents {
    pub fn new(st: Arc<AppState>, turn: Turn, run: ChatRun) -> Self {
        ResponseEvents {
            st,
            turn,
            run,
            seq: 0,
            started: false,
            ended: false,
            output: Vec::new(),
            open: None,
            buf: String::new(),
        }
    }

    fn emit(&mut self, kind: &str, mut data: Value) {
        data["type"] = kind.into();
        data["sequence_number"] = self.seq.into();
        self.seq += 1;
        self.buf.push_str(&event(kind, &data));
    }

    /// The output index of the open item (it is the next one).
    fn index(&self) -> usize {
        self.output.len()
    }

    fn response(&self, status: &str, usage: Value) -> Value {
        self.turn
            .response(&self.st.model_name, status, &self.output, usage)
    }

    /// Ends the open item: its `.done` events, then `output_item.done`.
    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let i = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
                );
                reasoning_item(&id, &text)
            }
            Open::Message { id, text } => {
                let at = json!({"item_id": id, "output_index": i, "content_index": 0});
                let mut done = at.clone();
                done["text"] = text.clone().into();
                done["logprobs"] = json!([]);
                self.emit("response.output_text.done", done);
                let mut part = at;
                part["part"] = text_part(&text);
                self.emit("response.content_part.done", part);
                message_item(&id, "completed", vec![text_part(&text)])
            }
            Open::Call {
                id,
                call_id,
                name,
                args,
            } => {
                self.emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": i, "arguments": args, "name": name}),
                );
                call_item(&id, "completed", &call_id, &name, &args)
            }
        };
        self.emit(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
        self.output.push(item);
    }

    fn reasoning(&mut self, text: &str) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close();
            let id = random_id("rs_");
            let mut item = reasoning_item(&id, "");
            item["content"] = json!([]);
            self.emit(
                "response.output_item.added",
                json!({"output_index": self.index(), "item": item}),
            );
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let i = self.index();
        if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
            all.push_str(text);
            let data = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": text});
            self.emit("response.reasoning_text.delta", data);
        }
    }

    fn content(&mut self, text: &str) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close();
            let id = random_id("msg_");
            let i = self.index();
            self.emit(
                "response.output_item.added",
                json!({"output_index": i, "item": message_item(&id, "in_progress", vec![])}),
            );
            self.emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": i, "content_index": 0, "part": text_part("")}),
            );
            self.open = Some(Open::Message {
                id,
                text: String::new(),
            });
        }
        let i = self.index();
        if let Some(Open::Message { id, text: all }) = &mut self.open {
            all.push_str(text);
            let data = json!({"item_id": id, "output_index": i, "content_index": 0,
                              "delta": text, "logprobs": []});
            self.emit("response.output_text.delta", data);
        }
    }

    /// Chat's tool-call deltas: a new call (with `id`) opens a `function_call`
    /// item; fragments extend the open one.
    fn call(&mut self, c: &Value) {
        let args = c["function"]["arguments"].as_str().unwrap_or("");
        if let Some(call_id) = c["id"].as_str() {
            self.close();
            let id = random_id("fc_");
            let name = c["function"]["name"].as_str().unwrap_or("").to_string();
            self.emit(
                "response.output_item.added",
                json!({"output_index": self.index(),
                       "item": call_item(&id, "in_progress", call_id, &name, "")}),
            );
            self.open = Some(Open::Call {
                id,
                call_id: call_id.to_string(),
                name,
                args: String::new(),
            });
        }
        if args.is_empty() {
            return;
        }
        let i = self.index();
        if let Some(Open::Call { id, args: all, .. }) = &mut self.open {
            all.push_str(args);
            let data = json!({"item_id": id, "output_index": i, "delta": args});
            self.emit("response.function_call_arguments.delta", data);
        }
    }

    fn delta(&mut self, d: Delta) {
        if !d.reasoning.is_empty() {
            self.reasoning(&d.reasoning);
        }
        if !d.content.is_empty() {
            self.content(&d.content);
        }
        for c in &d.tool_calls {
            self.call(c);
        }
    }

    fn done(&mut self, f: Finish) {
        if self.output.is_empty() && self.open.is_none() {
            // An empty answer is still one (empty) message, as non-streamed.
            self.content("");
        }
        self.close();
        let status = if f.finish_reason == "length" {
            "incomplete"
        } else {
            "completed"
        };
        let r = self.response(
            status,
            usage(f.prompt_tokens, f.cached_tokens, f.output_tokens),
        );
        self.turn.keep(&self.st, &r);
        // `response.completed` even when `max_output_tokens` cut it (its
        // `status` says `incomplete`), as vLLM sends it: the `openai` client's
        // `responses.stream()` waits for this event and fails on any other.
        self.emit("response.completed", json!({"response": r}));
    }

    fn failed(&mut self, e: crate::serve::error::ApiError) {
        self.close();
        let mut r = self.response("failed", Value::Null);
        r["error"] = json!({"code": "server_error", "message": e.to_string()});
        self.emit("response.failed", json!({"response": r}));
    }
}

impl SseSource for ResponseEvents {
    async fn next_bytes(&mut self) -> Option<String> {
        if !self.started {
            self.started = true;
            let r = self.response("in_progress", Value::Null);
            self.emit("response.created", json!({"response": r.clone()}));
            self.emit("response.in_progress", json!({"response": r}));
            return Some(std::mem::take(&mut self.buf));
        }
        if self.ended {
            return None;
        }
        match self.run.next().await {
            None => return None,
            Some(Step::Idle) => return Some(": keep-alive\n\n".into()),
            Some(Step::Delta(d)) => self.delta(d),
            Some(Step::Done(f)) => {
                self.ended = true;
                self.done(f);
            }
            Some(Step::Failed(e)) => {
                self.ended = true;
                self.failed(e);
            }
        }
        Some(std::mem::take(&mut self.buf))
    }
}
