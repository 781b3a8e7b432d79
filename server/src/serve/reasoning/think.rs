//! The `<think>…</think>` parsers. `deepseek_r1`: the output starts in
//! reasoning (DeepSeek-R1's template opens `<think>` in the prompt; a leading
//! `<think>` in the output is dropped) and an output that never closes it is all
//! reasoning, as vLLM reads it. `qwen3`: reasoning only when the output opens
//! with `<think>` (so `enable_thinking: false`, whose template closes an empty
//! think block in the prompt, gives plain content); an unclosed block at the end
//! (cut by `max_tokens`) is reasoning.

use super::{Markers, Phase, RStep, ReasoningParser, ReasoningParserEntry};
use crate::serve::tools::scan::partial_suffix;

const START: &str = "<think>";
const END: &str = "</think>";

/// Shared by both: what happens at the start is the difference.
pub struct Think {
    /// The output is reasoning even without a leading `<think>`.
    starts_in_reasoning: bool,
}

static DEEPSEEK_R1: Think = Think {
    starts_in_reasoning: true,
};
static QWEN3: Think = Think {
    starts_in_reasoning: false,
};

inventory::submit! { ReasoningParserEntry { name: "deepseek_r1", parser: &DEEPSEEK_R1 } }
inventory::submit! { ReasoningParserEntry { name: "qwen3", parser: &QWEN3 } }

impl ReasoningParser for Think {
    fn markers(&self) -> Markers {
        Markers {
            start: START,
            end: END,
            starts_in_reasoning: self.starts_in_reasoning,
        }
    }

    fn step(&self, text: &str, phase: &mut Phase, fin: bool) -> RStep {
        let mut s = RStep::default();
        match *phase {
            Phase::Start => {
                if text.starts_with(START) {
                    *phase = Phase::Reasoning;
                    s.settled = START.len();
                } else if !fin && START.starts_with(text) {
                    // `<thi`: wait for the next delta to decide.
                } else {
                    *phase = if self.starts_in_reasoning {
                        Phase::Reasoning
                    } else {
                        Phase::Content
                    };
                }
            }
            Phase::Reasoning => match text.find(END) {
                Some(i) => {
                    s.reasoning.push_str(&text[..i]);
                    *phase = Phase::Content;
                    s.settled = i + END.len();
                }
                None => {
                    let hold = if fin { 0 } else { partial_suffix(text, END) };
                    s.reasoning.push_str(&text[..text.len() - hold]);
                    s.settled = text.len() - hold;
                }
            },
            Phase::Content => {
                s.content.push_str(text);
                s.settled = text.len();
            }
        }
        s
    }
}
