//! Tests of the incremental detokenizer on a small byte-level BPE tokenizer built
//! here (no files, no network): the 256 byte symbols, a few merges (one of which
//! ends inside a Chinese character) and two special tokens.

use std::sync::{Arc, OnceLock};

use pagoda_engine::detokenizer::{DetokDelta, DetokError, IncrementalDetokenizer};
use proptest::prelude::*;
use tokenizers::Tokenizer;

/// GPT-2's byte -> printable char map used by byte-level BPE.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).unwrap();
            printable.push(b);
            n += 1;
        }
    }
    chars
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Multi-byte sequences merged into single tokens, left to right.
const MERGED: &[&[u8]] = &[
    b" the",
    b"ab",
    b"abcd", // one token holding several candidate stop strings
    b"STOP",
    "é".as_bytes(),
    &[0xE4, 0xBD], // first two bytes of 你: a token that ends mid-character
];
const SPECIALS: &[&str] = &["<|endoftext|>", "<|im_end|>"];

fn build_tokenizer() -> Tokenizer {
    let chars = byte_chars();
    let sym = |bytes: &[u8]| bytes.iter().map(|&b| chars[b as usize]).collect::<String>();
    let mut vocab: Vec<String> = (0..=255u8).map(|b| sym(&[b])).collect();
    let mut merges = Vec::new();
    for word in MERGED {
        for end in 2..=word.len() {
            let (left, right) = (sym(&word[..end - 1]), sym(&word[end - 1..end]));
            merges.push(json_str(&format!("{left} {right}")));
            let merged = sym(&word[..end]);
            if !vocab.contains(&merged) {
                vocab.push(merged);
            }
        }
    }
    let first_special = vocab.len();
    vocab.extend(SPECIALS.iter().map(|s| s.to_string()));
    let vocab_json: Vec<String> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{}: {i}", json_str(t)))
        .collect();
    let added: Vec<String> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                r#"{{"id": {}, "content": {}, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}}"#,
                first_special + i,
                json_str(s)
            )
        })
        .collect();
    let json = format!(
        r#"{{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{added}],
  "normalizer": null,
  "pre_tokenizer": {{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}},
  "post_processor": null,
  "decoder": {{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}},
  "model": {{"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
             "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
             "vocab": {{{vocab}}}, "merges": [{merges}]}}
}}"#,
        added = added.join(", "),
        vocab = vocab_json.join(", "),
        merges = merges.join(", "),
    );
    json.parse()
        .unwrap_or_else(|e| panic!("test tokenizer JSON: {e}\n{json}"))
}

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| Arc::new(build_tokenizer())).clone()
}

fn encode(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).unwrap().get_ids().to_vec()
}

fn id(token_text: &str) -> u32 {
    tokenizer().token_to_id(token_text).unwrap()
}

fn detok(prompt: &[u32], skip: bool, stop: &[&str], include: bool) -> IncrementalDetokenizer {
    IncrementalDetokenizer::new(
        tokenizer(),
        prompt,
        skip,
        stop.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .into(),
        include,
    )
}

/// Pushes one token at a time; returns every delta.
fn push_each(d: &mut IncrementalDetokenizer, ids: &[u32]) -> Vec<DetokDelta> {
    let mut out = Vec::new();
    for &t in ids {
        let delta = d.push(&[t]).unwrap();
        let stop = delta.stop_matched.is_some();
        out.push(delta);
        if stop {
            break;
        }
    }
    out
}

fn concat(deltas: &[DetokDelta]) -> String {
    deltas.iter().map(|d| d.text.as_str()).collect()
}

/// The expected full text: the plain decode, less a trailing U+FFFD of an
/// unfinished character.
fn full_decode(ids: &[u32], skip: bool) -> String {
    let mut t = tokenizer().decode(ids, skip).unwrap();
    if t.ends_with('\u{FFFD}') {
        t.pop();
    }
    t
}

#[test]
fn test_tokenizer_has_the_expected_shape() {
    assert_eq!(
        encode("😀"),
        vec![0xF0, 0x9F, 0x98, 0x80],
        "emoji must be 4 byte tokens"
    );
    assert_eq!(encode("你").len(), 2, "你 must split as [E4 BD] + [A0]");
    assert_eq!(encode("STOP").len(), 1);
    assert_eq!(
        tokenizer().decode(&encode("a 😀 你 é the"), false).unwrap(),
        "a 😀 你 é the"
    );
}

#[test]
fn multibyte_characters_are_never_split() {
    let text = "hi 😀你好 é!";
    let ids = encode(text);
    let mut d = detok(&encode("prompt: "), true, &[], false);
    let deltas = push_each(&mut d, &ids);
    for delta in &deltas {
        assert!(
            !delta.text.contains('\u{FFFD}'),
            "replacement char leaked: {deltas:?}"
        );
    }
    // The emoji shows up whole, in the step of its 4th byte.
    let emoji_step = deltas.iter().position(|x| x.text.contains('😀')).unwrap();
    assert_eq!(ids[emoji_step], 0x80);
    assert_eq!(concat(&deltas) + &d.finish(), text);
    assert_eq!(d.output_text(), text);
}

#[test]
fn stop_string_spanning_tokens_is_cut_in_the_step_it_completes() {
    let ids = encode("Hello ST");
    let ids: Vec<u32> = ids
        .into_iter()
        .chain([b'O' as u32, b'P' as u32])
        .chain(encode(" world"))
        .collect();
    for include in [false, true] {
        let mut d = detok(&[], true, &["STOP"], include);
        let deltas = push_each(&mut d, &ids);
        let last = deltas.last().unwrap();
        assert_eq!(last.stop_matched.as_deref(), Some("STOP"));
        assert_eq!(
            deltas.len(),
            encode("Hello ST").len() + 2,
            "stop must be found on the P token"
        );
        let want = if include { "Hello STOP" } else { "Hello " };
        assert_eq!(concat(&deltas), want);
        assert_eq!(d.output_text(), want);
        if !include {
            assert!(
                deltas.iter().all(|x| !x.text.contains('S')),
                "part of the stop string leaked: {deltas:?}"
            );
        }
        assert_eq!(d.finish(), "");
        assert!(matches!(d.push(&[1]), Err(DetokError::Closed { .. })));
    }
}

#[test]
fn held_back_prefix_is_released_when_it_does_not_complete() {
    let mut d = detok(&[], true, &["STOP"], false);
    let deltas = push_each(&mut d, &encode("Hello ST"));
    assert_eq!(
        concat(&deltas),
        "Hello ",
        "'ST' may start STOP and must be held back"
    );
    let more = d.push(&encode("x")).unwrap();
    assert_eq!(more.text, "STx");
    let mut d = detok(&[], true, &["STOP"], false);
    push_each(&mut d, &encode("Hello ST"));
    assert_eq!(d.finish(), "ST", "finish flushes held text");
}

#[test]
fn multibyte_stop_string_and_earliest_end_wins() {
    let mut d = detok(&[], true, &["😀"], false);
    let deltas = push_each(&mut d, &encode("ok 😀 no"));
    assert_eq!(concat(&deltas), "ok ");
    assert_eq!(deltas.last().unwrap().stop_matched.as_deref(), Some("😀"));

    // All at once: "bc" ends before "abcd" does, so it wins.
    let mut d = detok(&[], true, &["abcd", "bc"], false);
    let delta = d.push(&encode("xabcdy")).unwrap();
    assert_eq!(
        (delta.text.as_str(), delta.stop_matched.as_deref()),
        ("xa", Some("bc"))
    );
    // Same end: the longer one wins.
    let mut d = detok(&[], true, &["bc", "abc"], true);
    let delta = d.push(&encode("xabcd")).unwrap();
    assert_eq!(
        (delta.text.as_str(), delta.stop_matched.as_deref()),
        ("xabc", Some("abc"))
    );
}

#[test]
fn special_tokens_are_skipped_or_kept() {
    let eot = id("<|im_end|>");
    let ids: Vec<u32> = encode("done").into_iter().chain([eot]).collect();
    let mut d = detok(&[], true, &[], false);
    assert_eq!(concat(&push_each(&mut d, &ids)) + &d.finish(), "done");
    let mut d = detok(&[], false, &[], false);
    assert_eq!(
        concat(&push_each(&mut d, &ids)) + &d.finish(),
        "done<|im_end|>"
    );
    // A stop string inside a special token's text, when specials are shown.
    let mut d = detok(&[], false, &["<|im"], false);
    let deltas = push_each(&mut d, &ids);
    assert_eq!(
        (
            concat(&deltas).as_str(),
            deltas.last().unwrap().stop_matched.as_deref()
        ),
        ("done", Some("<|im"))
    );
}

#[test]
fn prompt_ending_mid_character_is_not_used_as_context() {
    let emoji = encode("😀");
    let mut d = detok(&emoji[..2], true, &[], false);
    let out = &emoji[2..];
    let text = concat(&push_each(&mut d, out)) + &d.finish();
    assert_eq!(text, full_decode(out, true));
}

#[test]
fn unfinished_character_at_finish_is_dropped() {
    let ids: Vec<u32> = encode("ab").into_iter().chain([0xF0, 0x9F]).collect();
    let mut d = detok(&[], true, &[], false);
    let deltas = push_each(&mut d, &ids);
    assert_eq!(concat(&deltas), "ab");
    assert_eq!(d.finish(), "");
    assert_eq!(d.output_text(), "ab");
}

/// Token ids drawn mostly from a small alphabet so that stop strings match often,
/// plus merged tokens, multi-byte pieces, stray continuation bytes and specials.
fn token_strategy() -> impl Strategy<Value = u32> {
    let tok = tokenizer();
    let merged: Vec<u32> = MERGED
        .iter()
        .map(|w| tok.token_to_id(&byte_sym(w)).unwrap())
        .collect();
    let specials: Vec<u32> = SPECIALS
        .iter()
        .map(|s| tok.token_to_id(s).unwrap())
        .collect();
    prop_oneof![
        6 => prop::sample::select(vec![b'a' as u32, b'b' as u32, b'c' as u32, b'd' as u32, b' ' as u32]),
        2 => prop::sample::select(merged),
        2 => prop::sample::select(vec![0xF0u32, 0x9F, 0x98, 0x80, 0xE4, 0xBD, 0xA0, 0xC3, 0xA9]),
        1 => 0u32..256,
        1 => prop::sample::select(specials),
    ]
}

fn byte_sym(bytes: &[u8]) -> String {
    let chars = byte_chars();
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

/// Splits `ids` into pushes of sizes taken cyclically from `sizes`.
fn chunks<'a>(ids: &'a [u32], sizes: &[usize]) -> Vec<&'a [u32]> {
    let mut out = Vec::new();
    let mut rest = ids;
    for &n in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at(n.min(rest.len()));
        out.push(a);
        rest = b;
    }
    out
}

/// Reference stop handling on the whole text: the occurrence ending first (ties:
/// starting first) of any stop string.
fn reference_stop(text: &str, stops: &[String], include: bool) -> (String, Option<String>) {
    let best = stops
        .iter()
        .filter_map(|s| {
            text.find(s.as_str())
                .map(|start| (start + s.len(), start, s))
        })
        .min_by_key(|&(end, start, _)| (end, start));
    match best {
        Some((end, start, s)) => (
            text[..if include { end } else { start }].to_string(),
            Some(s.clone()),
        ),
        None => (text.to_string(), None),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// Without stop strings, deltas + finish equal the full decode, for any push sizes.
    #[test]
    fn deltas_concatenate_to_full_decode(
        prompt in prop::collection::vec(token_strategy(), 0..8),
        ids in prop::collection::vec(token_strategy(), 0..40),
        sizes in prop::collection::vec(1usize..5, 1..4),
        skip in any::<bool>(),
    ) {
        let mut d = IncrementalDetokenizer::new(tokenizer(), &prompt, skip, Default::default(), false);
        let mut text = String::new();
        for c in chunks(&ids, &sizes) {
            let delta = d.push(c).unwrap();
            prop_assert!(delta.stop_matched.is_none());
            text.push_str(&delta.text);
            prop_assert_eq!(d.output_text(), text.as_str());
        }
        text.push_str(&d.finish());
        prop_assert_eq!(&text, &full_decode(&ids, skip));
        prop_assert_eq!(d.output_text(), text.as_str());
    }

    /// With stop strings, the emitted text is the full decode cut at the first
    /// stop occurrence, and the match is reported.
    #[test]
    fn stop_strings_cut_where_the_reference_says(
        ids in prop::collection::vec(token_strategy(), 0..40),
        stops in prop::collection::vec(prop_oneof![
            4 => "[abc ]{1,4}",
            3 => prop::sample::select(vec!["b", "bc", "cd", "abc", "bcd", "abcd"]).prop_map(String::from),
            1 => Just("é".to_string()),
            1 => Just("a😀".to_string()),
            1 => Just("<|endoftext|>".to_string()),
        ], 1..3),
        sizes in prop::collection::vec(1usize..4, 1..4),
        skip in any::<bool>(),
        include in any::<bool>(),
    ) {
        let mut d = IncrementalDetokenizer::new(tokenizer(), &[], skip, stops.clone().into(), include);
        let mut text = String::new();
        let mut matched = None;
        for c in chunks(&ids, &sizes) {
            let delta = d.push(c).unwrap();
            text.push_str(&delta.text);
            if delta.stop_matched.is_some() {
                matched = delta.stop_matched;
                break;
            }
        }
        text.push_str(&d.finish());
        let matched = matched.or(d.stop_matched().map(str::to_string));
        let (want, want_stop) = reference_stop(&full_decode(&ids, skip), &stops, include);
        prop_assert_eq!(&text, &want);
        prop_assert_eq!(matched, want_stop);
    }
}
