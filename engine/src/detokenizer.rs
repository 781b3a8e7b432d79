//! Incremental detokenization of one request's output, with stop strings.
//!
//! Text is produced with vLLM's prefix/read-offset method: each step decodes a
//! small window of tokens and emits what it adds to the decode of the window's
//! first `read_offset` tokens (text already emitted), but only once the window's text
//! does not end in U+FFFD, i.e. once no UTF-8 character is cut in half. Decoding
//! a window rather than single tokens keeps tokenizers whose first-token decode
//! differs (SentencePiece's leading space) correct; up to
//! [`PROMPT_CONTEXT_TOKENS`] prompt tokens seed the window for the same reason.
//! (tokenizers' own `DecodeStream` does the same but borrows the tokenizer, which
//! this owner of an `Arc` cannot store.)
//!
//! Stop strings are searched in the text each time it grows, so a stop string is
//! caught in the step that completes it even when it spans several tokens. When
//! several could match, the one whose end comes first wins (ties: the longer),
//! which is what a character-by-character scan would find. Unless
//! `include_stop_str_in_output`, the longest tail of the text that is a proper
//! prefix of some stop string is held back, so the client never sees any part of
//! a stop string nor anything after it.
//!
//! Both come from the request's [`StopAutomaton`] (built once, shared by its `n`
//! samples): each new byte of text is fed once, so the cost per token is bounded
//! by its bytes (at most two automaton steps each, [`IncrementalDetokenizer::stop_steps`]),
//! not by the number of stop strings. The tests keep the obvious scan over every
//! stop string as the reference it must agree with.
//!
//! Without a stop match, the concatenation of every delta and of [`finish`]
//! equals the decode of the output ids, less one trailing U+FFFD when the output
//! ends inside an unfinished character. Token ids the tokenizer does not know
//! decode to nothing, as in `tokenizers` and vLLM.
//!
//! [`finish`]: IncrementalDetokenizer::finish

use std::sync::Arc;

use pagoda_core::{StopAutomaton, StopStrings};
use tokenizers::Tokenizer;

/// How many trailing prompt tokens seed the decode window (vLLM uses 5).
pub const PROMPT_CONTEXT_TOKENS: usize = 5;

const REPLACEMENT: char = '\u{FFFD}';

/// Why detokenization failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DetokError {
    #[error("tokenizer could not decode token ids {ids:?}: {message}")]
    Decode { ids: Vec<u32>, message: String },
    #[error("tokens pushed after the request {state}")]
    Closed { state: &'static str },
}

/// What one [`IncrementalDetokenizer::push`] produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DetokDelta {
    /// Text safe to show the client now.
    pub text: String,
    /// The stop string that matched; the request must stop.
    pub stop_matched: Option<String>,
}

/// Turns one request's output token ids into text deltas.
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// The request's stop strings (shared with its other samples); `None` when
    /// there is none to look for.
    stop: Option<StopStrings>,
    include_stop_str_in_output: bool,
    /// The automaton's state after all of `text` (while no stop string matched).
    stop_state: u32,
    /// Automaton steps taken so far (transitions and failure hops).
    stop_steps: u64,
    /// The decode window; it slides forward (dropping its front) as text is emitted.
    ids: Vec<u32>,
    /// `ids[..read_offset]` are the tokens whose text was already taken.
    read_offset: usize,
    /// Decode of `ids[..read_offset]`.
    prefix_text: String,
    /// All output text decoded so far (cut at a stop string once one matched).
    text: String,
    /// Bytes of `text` handed out so far.
    emitted: usize,
    stop_matched: Option<String>,
    finished: bool,
}

impl IncrementalDetokenizer {
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        prompt_ids: &[u32],
        skip_special_tokens: bool,
        stop: StopStrings,
        include_stop_str_in_output: bool,
    ) -> Self {
        // Empty stop strings would match everywhere; SamplingParams::validate rejects
        // them, and the automaton ignores them.
        let stop = stop.iter().any(|s| !s.is_empty()).then_some(stop);
        let stop_state = stop.as_ref().map_or(0, |s| s.automaton().start());
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        // The prompt tail is only usable as context if it ends on a whole
        // character; otherwise the output's first bytes would merge with it.
        let (ids, prefix_text) = match tokenizer.decode(context, skip_special_tokens) {
            Ok(t) if !t.ends_with(REPLACEMENT) => (context.to_vec(), t),
            _ => (Vec::new(), String::new()),
        };
        IncrementalDetokenizer {
            tokenizer,
            skip_special_tokens,
            stop,
            include_stop_str_in_output,
            stop_state,
            stop_steps: 0,
            read_offset: ids.len(),
            ids,
            prefix_text,
            text: String::new(),
            emitted: 0,
            stop_matched: None,
            finished: false,
        }
    }

    /// Feeds new token ids; returns the text that is safe to emit now and, if a
    /// stop string matched, which one. Tokens after the one completing a stop
    /// string are ignored, and the text is cut before the stop string (after it
    /// with `include_stop_str_in_output`).
    pub fn push(&mut self, new_ids: &[u32]) -> Result<DetokDelta, DetokError> {
        if self.stop_matched.is_some() {
            return Err(DetokError::Closed {
                state: "matched a stop string",
            });
        }
        if self.finished {
            return Err(DetokError::Closed {
                state: "was finished",
            });
        }
        for &id in new_ids {
            self.ids.push(id);
            let window = self.decode(&self.ids)?;
            if window.len() <= self.prefix_text.len() || window.ends_with(REPLACEMENT) {
                continue; // nothing new yet, or a character still incomplete
            }
            let chunk = new_suffix(&window, &self.prefix_text).to_string();
            // Slide: the tokens just read become the new prefix.
            self.ids.drain(..self.read_offset);
            self.read_offset = self.ids.len();
            self.prefix_text = self.decode(&self.ids)?;
            if self.append(&chunk) {
                break;
            }
        }
        let end = self.safe_end();
        Ok(DetokDelta {
            text: self.take(end),
            stop_matched: self.stop_matched.clone(),
        })
    }

    /// At finish: flushes held-back text (never an incomplete character: the
    /// trailing U+FFFD of an unfinished sequence is dropped). Stop strings are
    /// still honoured in the flushed text (see [`Self::stop_matched`]). Later
    /// calls return an empty string.
    pub fn finish(&mut self) -> String {
        if self.finished {
            return String::new();
        }
        self.finished = true;
        if self.stop_matched.is_none() && self.ids.len() > self.read_offset {
            // Decode errors cannot be reported here; they would have shown in push.
            if let Ok(mut window) = self.decode(&self.ids) {
                if window.ends_with(REPLACEMENT) {
                    window.pop();
                }
                let chunk = new_suffix(&window, &self.prefix_text).to_string();
                self.append(&chunk);
            }
        }
        self.take(self.text.len())
    }

    /// The text emitted so far: the concatenation of every delta (and of
    /// `finish`'s result once called). Never contains held-back text.
    pub fn output_text(&self) -> &str {
        &self.text[..self.emitted]
    }

    /// The stop string that ended the request, if any (also set when the text
    /// flushed by `finish` completed one).
    pub fn stop_matched(&self) -> Option<&str> {
        self.stop_matched.as_deref()
    }

    /// Automaton steps spent looking for stop strings so far: at most twice the
    /// bytes of text produced, however many stop strings there are.
    pub fn stop_steps(&self) -> u64 {
        self.stop_steps
    }

    fn automaton(&self) -> Option<&StopAutomaton> {
        self.stop.as_ref().map(|s| s.automaton())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, DetokError> {
        self.tokenizer
            .decode(ids, self.skip_special_tokens)
            .map_err(|e| DetokError::Decode {
                ids: ids.to_vec(),
                message: e.to_string(),
            })
    }

    /// Appends decoded text and looks for a stop string completed by it; on a
    /// match cuts the text and returns true.
    fn append(&mut self, chunk: &str) -> bool {
        let old_len = self.text.len();
        self.text.push_str(chunk);
        let Some(stop) = self.stop.as_ref() else {
            return false;
        };
        // Only the new bytes are fed: the state carries what came before.
        let hit =
            stop.automaton()
                .feed(&mut self.stop_state, chunk.as_bytes(), &mut self.stop_steps);
        let Some((end, idx)) = hit else { return false };
        // A stop string is whole characters, so both ends are char boundaries.
        let end = old_len + end;
        let s = stop[idx].clone();
        let cut = if self.include_stop_str_in_output {
            end
        } else {
            end - s.len()
        };
        // Held-back text guarantees cut >= emitted; the max keeps slicing safe.
        self.text.truncate(cut.max(self.emitted));
        self.stop_matched = Some(s);
        true
    }

    /// End of the text that may be shown now: all of it, unless its tail could
    /// still grow into a stop string.
    fn safe_end(&self) -> usize {
        let len = self.text.len();
        if self.stop_matched.is_some() || self.include_stop_str_in_output {
            return len;
        }
        let Some(a) = self.automaton() else {
            return len;
        };
        // The held tail starts where a stop string starts: a char boundary.
        (len - a.held_len(self.stop_state)).max(self.emitted)
    }

    fn take(&mut self, end: usize) -> String {
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}

/// What `window` adds after `prefix`. Decodes of a longer window normally start
/// with the shorter one's; if a tokenizer breaks that, emit from the longest
/// common prefix rather than slicing inside a character.
fn new_suffix<'a>(window: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = window.strip_prefix(prefix) {
        return rest;
    }
    let common = window
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| window.len().min(prefix.len()));
    &window[floor_char_boundary(window, common)..]
}

/// Largest char boundary `<= i` (str::floor_char_boundary is unstable).
fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious stop-string logic the automaton replaced, kept as the
    /// reference: after `chunk` is appended to `text`, every stop string is
    /// searched in the window where a match could end in the new text; the
    /// earliest end wins (ties: the longer). Returns the match's (start, string).
    fn slow_match(text: &str, old_len: usize, stop: &[String]) -> Option<(usize, String)> {
        let max_len = stop.iter().map(String::len).max().unwrap_or(0);
        if max_len == 0 || text.len() == old_len {
            return None;
        }
        let from = floor_char_boundary(text, old_len.saturating_sub(max_len - 1));
        let haystack = &text[from..];
        stop.iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                haystack
                    .match_indices(s.as_str())
                    .map(|(pos, _)| from + pos)
                    .find(|start| start + s.len() > old_len)
                    .map(|start| (start, s))
            })
            .min_by_key(|(start, s)| (start + s.len(), *start))
            .map(|(start, s)| (start, s.clone()))
    }

    /// The reference's held-back tail: the longest suffix starting at or after
    /// `emitted` that is a proper prefix of some stop string.
    fn slow_safe_end(text: &str, emitted: usize, stop: &[String]) -> usize {
        let max_len = stop.iter().map(String::len).max().unwrap_or(0);
        if max_len == 0 {
            return text.len();
        }
        let lowest = floor_char_boundary(text, text.len().saturating_sub(max_len - 1)).max(emitted);
        for (i, _) in text[lowest..].char_indices() {
            let tail = &text[lowest + i..];
            if stop
                .iter()
                .any(|s| s.len() > tail.len() && s.starts_with(tail))
            {
                return lowest + i;
            }
        }
        text.len()
    }

    fn detok(stop: &[String], include: bool) -> IncrementalDetokenizer {
        let tok = Tokenizer::new(tokenizers::models::bpe::BPE::default());
        IncrementalDetokenizer::new(Arc::new(tok), &[], true, stop.to_vec().into(), include)
    }

    /// Feeds text chunks to the real detokenizer's stop logic and to the
    /// reference side by side; every delta and the match must agree.
    fn compare(stop: &[String], chunks: &[String], include: bool) -> Result<(), TestCaseError> {
        let mut d = detok(stop, include);
        let (mut text, mut emitted, mut fed) = (String::new(), 0, 0);
        for c in chunks {
            fed += c.len();
            let matched = d.append(c);
            let end = d.safe_end();
            let fast = d.take(end);
            // Reference.
            let old_len = text.len();
            text.push_str(c);
            let slow = slow_match(&text, old_len, stop);
            if let Some((start, s)) = &slow {
                let cut = if include { start + s.len() } else { *start };
                text.truncate(cut.max(emitted));
            }
            let end = if slow.is_some() || include {
                text.len()
            } else {
                slow_safe_end(&text, emitted, stop)
            };
            let want = text[emitted..end].to_string();
            emitted = end;
            prop_assert_eq!(&fast, &want);
            prop_assert_eq!(matched, slow.is_some());
            prop_assert_eq!(d.stop_matched(), slow.as_ref().map(|(_, s)| s.as_str()));
            if matched {
                break;
            }
        }
        prop_assert!(d.stop_steps() <= 2 * fed as u64);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn stop_logic_matches_the_obvious_scan(
            stop in prop::collection::vec("[ab é😀]{0,5}", 0..5),
            chunks in prop::collection::vec("[ab é😀c]{0,6}", 0..12),
            include in any::<bool>(),
        ) {
            compare(&stop, &chunks, include)?;
        }
    }

    #[test]
    fn many_stop_strings_cost_steps_per_byte_not_per_string() {
        // 2000 stop strings; text that keeps almost matching them.
        let stop: Vec<String> = (0..2000).map(|i| format!("xy{i:04}z")).collect();
        let mut d = detok(&stop, false);
        let mut total = 0;
        for i in 0..500 {
            let chunk = format!("xy{:04} ", i * 7);
            total += chunk.len();
            assert!(!d.append(&chunk));
            let end = d.safe_end();
            d.take(end);
        }
        // The old scan looked at every string for each chunk: ~2000 x 500 searches.
        assert!(
            d.stop_steps() <= 2 * total as u64,
            "{} steps",
            d.stop_steps()
        );
        assert!(d.append("xy0003z"));
        assert_eq!(d.stop_matched(), Some("xy0003z"));
    }
}
