//! SentencePiece BPE: the encoder of GGUF `llama` vocabularies (`tokenizer.ggml.model =
//! "llama"`: Llama 2, Mistral, Gemma), exactly as `sentencepiece`'s BPE model
//! computes it (and llama.cpp's `llm_tokenizer_spm`, but around user-defined pieces:
//! see the end).
//!
//! The text is cut at control and unknown tokens first (longest first, as llama.cpp's
//! `tokenizer_st_partition` does; Pagoda always parses special tokens in text, like HF
//! `tokenizers`; sentencepiece itself never sees them). Each remaining fragment gets
//! the dummy prefix `▁` when `add_space_prefix` is set and it starts the text or
//! follows a control or unknown token, has its spaces replaced by `▁`, and is split into
//! symbols: a user-defined piece starting at a position is one symbol that never
//! merges (sentencepiece's prefix matcher and `freeze`; GGUF stores these pieces with
//! spaces for `▁`, as llama.cpp's converter writes them), else one character. Then,
//! as long as some pair of adjacent symbols concatenates to a piece, the pair whose
//! piece has the highest score is merged (ties: the leftmost pair). What merges may
//! form are normal, user-defined and unused pieces (sentencepiece's `pieces_`; never a
//! control, unknown or byte token); an unused piece that a merge formed is split back
//! into the two pieces that made it (sentencepiece's resegmentation). A final symbol
//! that is no piece becomes its UTF-8 bytes as `<0xNN>` tokens (byte fallback) or,
//! in a vocabulary without byte tokens, the unknown token, one per run of unknown
//! symbols (sentencepiece merges such runs).
//!
//! This is not the same as HF `tokenizers`' BPE with merges ranked by score: there
//! the rank of a *pair* decides, and two overlapping pairs that form the same piece
//! in different ways (`ab|a` and `a|ba` in `ab a ba`) are ordered by rank instead of
//! by position; and its legacy `▁` normalizer also prefixes the text after a
//! user-defined piece. The HF tokenizer built next to this one (for decoding) is only
//! used to encode by code that asks for it explicitly ([`crate::Tokenizer::hf`]).
//!
//! Where llama.cpp differs from sentencepiece, sentencepiece's rule is kept:
//! llama.cpp cuts user-defined tokens out of the text like control tokens, so it adds
//! the dummy prefix after one (and not before one that starts the text); it also lets
//! merges form any token (control and byte tokens too) and never splits unused pieces
//! back (the last two matter only on vocabularies no converter writes). Text without
//! user-defined tokens encodes the same in both.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// GGUF token types (llama.cpp's `llama_token_type`, sentencepiece's piece types).
pub(crate) mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}
use token_type::*;

/// A SentencePiece BPE vocabulary and the GGUF flags that steer its encoding.
#[derive(Debug, Clone)]
pub struct SpmVocab {
    pieces: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i64>,
    /// Every token's id by text (a duplicated text keeps its last id, as llama.cpp).
    by_text: HashMap<String, u32>,
    /// The pieces merges may form (normal, user-defined, unused).
    mergeable: HashMap<String, u32>,
    /// `<0xNN>` token of each byte, where the vocabulary has it.
    byte_ids: Vec<Option<u32>>,
    unk: Option<u32>,
    /// Tokens cut out of the text before BPE (control, unknown), longest text first.
    specials: Vec<u32>,
    /// User-defined pieces as they appear in escaped text (`▁` for spaces), by
    /// first character, longest first.
    user_defined: HashMap<char, Vec<(String, u32)>>,
    add_space_prefix: bool,
    bos: Option<u32>,
    add_bos: bool,
    eos: Option<u32>,
    add_eos: bool,
}

/// What [`SpmVocab::new`] needs besides the pieces.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpmFlags {
    pub add_space_prefix: bool,
    pub unk: Option<u32>,
    pub bos: Option<u32>,
    pub add_bos: bool,
    pub eos: Option<u32>,
    pub add_eos: bool,
}

/// A candidate merge of symbols `left` and `right` into a piece of `score`, `size`
/// bytes long (stale once either symbol changed length).
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// The max-heap pops the highest score, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// A symbol: `len` bytes of the fragment from `start` (0 once merged into its left
/// neighbour), in a doubly linked list; `frozen` holds the id of a user-defined piece,
/// which never merges.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    frozen: Option<u32>,
}

/// A piece of the text after special tokens were cut out.
enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

impl SpmVocab {
    /// `pieces`, `scores` and `types` are indexed by token id (equal lengths).
    pub fn new(pieces: Vec<String>, scores: Vec<f32>, types: Vec<i64>, flags: SpmFlags) -> Self {
        let mut by_text = HashMap::with_capacity(pieces.len());
        let mut mergeable = HashMap::with_capacity(pieces.len());
        let mut byte_ids = vec![None; 256];
        let mut specials = Vec::new();
        let mut user_defined: HashMap<char, Vec<(String, u32)>> = HashMap::new();
        for (id, (p, &t)) in pieces.iter().zip(&types).enumerate() {
            let id = id as u32;
            by_text.insert(p.clone(), id);
            match t {
                NORMAL | USER_DEFINED | UNUSED => {
                    mergeable.insert(p.clone(), id);
                }
                _ => {}
            }
            if matches!(t, CONTROL | UNKNOWN) && !p.is_empty() {
                specials.push(id);
            }
            if t == USER_DEFINED {
                let escaped = p.replace(' ', "▁");
                if let Some(c) = escaped.chars().next() {
                    user_defined.entry(c).or_default().push((escaped, id));
                }
            }
            if t == BYTE {
                if let Some(b) = parse_byte_piece(p) {
                    byte_ids[b as usize] = Some(id);
                }
            }
        }
        // Longest first; equal lengths by id (a stable order for llama.cpp's unstable sort).
        specials.sort_by_key(|&id| (std::cmp::Reverse(pieces[id as usize].len()), id));
        for v in user_defined.values_mut() {
            v.sort_by_key(|(p, id)| (std::cmp::Reverse(p.len()), *id));
        }
        SpmVocab {
            pieces,
            scores,
            types,
            by_text,
            mergeable,
            byte_ids,
            unk: flags.unk,
            specials,
            user_defined,
            add_space_prefix: flags.add_space_prefix,
            bos: flags.bos,
            add_bos: flags.add_bos,
            eos: flags.eos,
            add_eos: flags.add_eos,
        }
    }

    /// The BOS token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether encoding with special tokens prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Token ids of `text`; `add_special` adds BOS/EOS as the vocabulary asks.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(
                self.bos
                    .ok_or("the vocabulary adds BOS but has no BOS token")?,
            );
        }
        // The dummy prefix goes before the first fragment and after each special token.
        let mut prev_special = true;
        let mut buf = String::new();
        for f in self.partition(text) {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(r) => {
                    buf.clear();
                    if self.add_space_prefix && prev_special {
                        buf.push('▁');
                    }
                    for c in text[r].chars() {
                        buf.push(if c == ' ' { '▁' } else { c });
                    }
                    self.bpe(&buf, &mut out)?;
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.push(
                self.eos
                    .ok_or("the vocabulary adds EOS but has no EOS token")?,
            );
        }
        Ok(out)
    }

    /// Cuts every occurrence of each special token (longest first) out of the text.
    fn partition(&self, text: &str) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0..text.len()));
        for &id in &self.specials {
            let tok = self.pieces[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Fragment::Text(r) = f else {
                    next.push(f);
                    continue;
                };
                let mut at = r.start;
                while let Some(i) = text[at..r.end].find(tok) {
                    let m = at + i;
                    if m > at {
                        next.push(Fragment::Text(at..m));
                    }
                    next.push(Fragment::Token(id));
                    at = m + tok.len();
                }
                if at < r.end {
                    next.push(Fragment::Text(at..r.end));
                }
            }
            frags = next;
        }
        frags
    }

    /// Merges by score over the symbols of `s` (already escaped) and appends the
    /// resulting tokens.
    fn bpe(&self, s: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let mut syms: Vec<Symbol> = Vec::with_capacity(s.len());
        let mut at = 0;
        while let Some(c) = s[at..].chars().next() {
            let user = self
                .user_defined
                .get(&c)
                .and_then(|v| v.iter().find(|(p, _)| s[at..].starts_with(p.as_str())));
            let (len, frozen) = match user {
                Some((p, id)) => (p.len(), Some(*id)),
                None => (c.len_utf8(), None),
            };
            let i = syms.len();
            syms.push(Symbol {
                start: at,
                len,
                prev: i.checked_sub(1),
                next: Some(i + 1),
                frozen,
            });
            at += len;
        }
        let n = syms.len();
        if let Some(last) = syms.last_mut() {
            last.next = None;
        }
        let mut heap = BinaryHeap::with_capacity(n);
        // Unused pieces formed by a merge, and the two pieces that formed them.
        let mut rev_merge: HashMap<&str, (&str, &str)> = HashMap::new();
        for i in 1..n {
            self.try_add(s, &syms, &mut heap, &mut rev_merge, Some(i - 1), Some(i));
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (bg.left, bg.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != bg.size {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(nx) = syms[r].next {
                syms[nx].prev = Some(l);
            }
            let (prev, next) = (syms[l].prev, syms[l].next);
            self.try_add(s, &syms, &mut heap, &mut rev_merge, prev, Some(l));
            self.try_add(s, &syms, &mut heap, &mut rev_merge, Some(l), next);
        }
        let mut unk_run = false;
        let mut i = (n > 0).then_some(0);
        while let Some(k) = i {
            let sy = &syms[k];
            if let Some(id) = sy.frozen {
                out.push(id);
                unk_run = false;
            } else {
                self.resegment(
                    &s[sy.start..sy.start + sy.len],
                    &rev_merge,
                    out,
                    &mut unk_run,
                )?;
            }
            i = syms[k].next;
        }
        Ok(())
    }

    /// Queues the merge of symbols `left` and `right` if their text is a mergeable piece.
    fn try_add<'s>(
        &self,
        s: &'s str,
        syms: &[Symbol],
        heap: &mut BinaryHeap<Bigram>,
        rev_merge: &mut HashMap<&'s str, (&'s str, &'s str)>,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (a, b) = (syms[l], syms[r]);
        if a.frozen.is_some() || b.frozen.is_some() {
            return;
        }
        let piece = &s[a.start..a.start + a.len + b.len];
        let Some(&id) = self.mergeable.get(piece) else {
            return;
        };
        heap.push(Bigram {
            score: self.scores[id as usize],
            left: l,
            right: r,
            size: piece.len(),
        });
        if self.types[id as usize] == UNUSED {
            let mid = a.start + a.len;
            rev_merge.insert(piece, (&s[a.start..mid], &s[mid..mid + b.len]));
        }
    }

    /// Appends the token(s) of a final symbol: its piece, the pieces an unused piece
    /// was merged from, or the fallback for text that is no piece.
    fn resegment(
        &self,
        w: &str,
        rev_merge: &HashMap<&str, (&str, &str)>,
        out: &mut Vec<u32>,
        unk_run: &mut bool,
    ) -> Result<(), String> {
        match self.by_text.get(w) {
            Some(&id) if self.types[id as usize] == UNUSED => {
                if let Some(&(a, b)) = rev_merge.get(w) {
                    self.resegment(a, rev_merge, out, unk_run)?;
                    return self.resegment(b, rev_merge, out, unk_run);
                }
                out.push(id);
                *unk_run = false;
            }
            Some(&id) => {
                out.push(id);
                *unk_run = false;
            }
            None => {
                let bytes: Option<Vec<u32>> =
                    w.bytes().map(|b| self.byte_ids[b as usize]).collect();
                match (bytes, self.unk) {
                    (Some(ids), _) => {
                        out.extend(ids);
                        *unk_run = false;
                    }
                    (None, Some(unk)) => {
                        if !*unk_run {
                            out.push(unk);
                        }
                        *unk_run = true;
                    }
                    (None, None) => {
                        return Err(format!(
                            "{w:?} is in no piece and the vocabulary has neither byte tokens \
                             nor an unknown token"
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// The byte of a `<0xNN>` piece.
pub(crate) fn parse_byte_piece(p: &str) -> Option<u8> {
    let hex = p.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn vocab(pieces: &[(&str, f32, i64)], flags: SpmFlags) -> SpmVocab {
        SpmVocab::new(
            pieces.iter().map(|p| p.0.to_string()).collect(),
            pieces.iter().map(|p| p.1).collect(),
            pieces.iter().map(|p| p.2).collect(),
            flags,
        )
    }

    /// The definition, slowly: repeatedly merge the adjacent pair whose concatenation
    /// is the highest-scoring mergeable piece (leftmost on ties).
    fn naive(v: &SpmVocab, s: &str) -> Vec<u32> {
        let mut syms: Vec<String> = s.chars().map(|c| c.to_string()).collect();
        loop {
            let mut best: Option<(f32, usize)> = None;
            for i in 0..syms.len().saturating_sub(1) {
                let cat = format!("{}{}", syms[i], syms[i + 1]);
                if let Some(&id) = v.mergeable.get(&cat) {
                    let sc = v.scores[id as usize];
                    if best.is_none_or(|(b, _)| sc > b) {
                        best = Some((sc, i));
                    }
                }
            }
            let Some((_, i)) = best else { break };
            let r = syms.remove(i + 1);
            syms[i].push_str(&r);
        }
        let mut out = Vec::new();
        for w in syms {
            match v.by_text.get(&w) {
                Some(&id) => out.push(id),
                None => out.extend(w.bytes().map(|b| v.byte_ids[b as usize].unwrap())),
            }
        }
        out
    }

    fn byte_pieces() -> Vec<(String, f32, i64)> {
        (0..=255u8)
            .map(|b| (format!("<0x{b:02X}>"), 0.0, BYTE))
            .collect()
    }

    #[test]
    fn merges_follow_scores_and_ties_go_left() {
        // "ab" outranks "bc": "abc" -> ab c; equal scores: the leftmost pair first.
        let v = vocab(
            &[
                ("a", -1.0, NORMAL),
                ("b", -1.0, NORMAL),
                ("c", -1.0, NORMAL),
                ("ab", -2.0, NORMAL),
                ("bc", -3.0, NORMAL),
                ("aa", -5.0, NORMAL),
            ],
            SpmFlags::default(),
        );
        assert_eq!(v.encode("abc", false).unwrap(), vec![3, 2]);
        assert_eq!(v.encode("aaa", false).unwrap(), vec![5, 0]);
        // Same piece from two overlapping splits: `ab|a` (left) wins over `a|ba`.
        let v = vocab(
            &[
                ("a", 0.0, NORMAL),
                ("b", 0.0, NORMAL),
                ("ab", -1.0, NORMAL),
                ("ba", -1.0, NORMAL),
                ("aba", -2.0, NORMAL),
            ],
            SpmFlags::default(),
        );
        assert_eq!(v.encode("ababa", false), Ok(naive(&v, "ababa")));
    }

    #[test]
    fn dummy_prefix_specials_bytes_and_unk() {
        let mut p: Vec<(String, f32, i64)> = vec![
            ("<unk>".into(), 0.0, UNKNOWN),
            ("<s>".into(), 0.0, CONTROL),
            ("</s>".into(), 0.0, CONTROL),
        ];
        p.extend(byte_pieces());
        for (t, s) in [
            ("▁", -1.0),
            ("h", -1.0),
            ("i", -1.0),
            ("▁h", -2.0),
            ("▁hi", -3.0),
        ] {
            p.push((t.into(), s, NORMAL));
        }
        let pieces: Vec<(&str, f32, i64)> = p.iter().map(|x| (x.0.as_str(), x.1, x.2)).collect();
        let flags = SpmFlags {
            add_space_prefix: true,
            unk: Some(0),
            bos: Some(1),
            add_bos: true,
            eos: Some(2),
            add_eos: false,
        };
        let v = vocab(&pieces, flags);
        let (sp, h, i, sp_h, hi) = (259, 260, 261, 262, 263);
        assert_eq!(v.encode("hi", true).unwrap(), vec![1, hi]);
        assert_eq!(v.encode("hi hi", false).unwrap(), vec![hi, hi]);
        // Leading space: dummy prefix plus the space.
        assert_eq!(v.encode(" hi", false).unwrap(), vec![sp, hi]);
        // After a special token the dummy prefix comes back.
        assert_eq!(v.encode("hi</s>hi", false).unwrap(), vec![hi, 2, hi]);
        // Unknown characters fall back to bytes: "é" = C3 A9, "\n" = 0A.
        assert_eq!(
            v.encode("hé\n", false).unwrap(),
            vec![sp_h, 3 + 0xC3, 3 + 0xA9, 3 + 0x0A]
        );
        assert_eq!(v.encode("", true).unwrap(), vec![1]);
        assert_eq!(v.encode("ih", false).unwrap(), vec![sp, i, h]);
        // Without byte tokens: one unknown token per run of unknown characters.
        let v = vocab(
            &[("<unk>", 0.0, UNKNOWN), ("a", -1.0, NORMAL)],
            SpmFlags {
                unk: Some(0),
                ..SpmFlags::default()
            },
        );
        assert_eq!(v.encode("aéèa€", false).unwrap(), vec![1, 0, 1, 0]);
    }

    #[test]
    fn user_defined_pieces_are_whole_and_get_no_prefix() {
        // GGUF stores a user-defined "▁▁" piece as two spaces.
        let v = vocab(
            &[
                ("<unk>", 0.0, UNKNOWN),
                ("<t>", 0.0, USER_DEFINED),
                ("  ", 0.0, USER_DEFINED),
                ("▁", -1.0, NORMAL),
                ("a", -1.0, NORMAL),
                ("▁a", -2.0, NORMAL),
                ("<", -1.0, NORMAL),
                ("t", -1.0, NORMAL),
                (">", -1.0, NORMAL),
                ("<t", -3.0, NORMAL),
            ],
            SpmFlags {
                add_space_prefix: true,
                unk: Some(0),
                ..SpmFlags::default()
            },
        );
        // As sentencepiece: the dummy prefix stays before a leading user-defined
        // piece and none follows one; the piece never merges with its neighbours.
        assert_eq!(v.encode("<t>a", false).unwrap(), vec![3, 1, 4]);
        assert_eq!(v.encode("a<t>a", false).unwrap(), vec![5, 1, 4]);
        assert_eq!(v.encode("a   a", false).unwrap(), vec![5, 2, 5]);
        assert_eq!(v.encode("<<t>", false).unwrap(), vec![3, 6, 1]);
    }

    #[test]
    fn unused_pieces_are_split_back() {
        let v = vocab(
            &[
                ("a", 0.0, NORMAL),
                ("b", 0.0, NORMAL),
                ("c", 0.0, NORMAL),
                ("ab", -1.0, UNUSED),
                ("abc", -2.0, NORMAL),
            ],
            SpmFlags::default(),
        );
        // "ab" (unused) lets "abc" form; a lone "ab" is split back into a, b.
        assert_eq!(v.encode("abc", false).unwrap(), vec![4]);
        assert_eq!(v.encode("ab", false).unwrap(), vec![0, 1]);
    }

    proptest! {
        /// The heap-based merge loop equals the quadratic definition on random
        /// vocabularies (scores with many ties) and texts.
        #[test]
        fn heap_equals_naive(
            extra in proptest::collection::vec(("[abc▁]{2,4}", -4i32..0), 0..24),
            text in "[abc ]{0,24}",
        ) {
            let mut p: Vec<(String, f32, i64)> = byte_pieces();
            for c in ["a", "b", "c", "▁"] {
                p.push((c.to_string(), 0.0, NORMAL));
            }
            for (t, s) in extra {
                if !p.iter().any(|x| x.0 == t) {
                    p.push((t, s as f32, NORMAL));
                }
            }
            let pieces: Vec<(&str, f32, i64)> = p.iter().map(|x| (x.0.as_str(), x.1, x.2)).collect();
            let v = vocab(&pieces, SpmFlags { add_space_prefix: true, ..SpmFlags::default() });
            let escaped: String = std::iter::once('▁').chain(text.chars().map(|c| if c == ' ' { '▁' } else { c })).collect();
            let want = if text.is_empty() { vec![] } else { naive(&v, &escaped) };
            prop_assert_eq!(v.encode(&text, false).unwrap(), want);
        }
    }
}
