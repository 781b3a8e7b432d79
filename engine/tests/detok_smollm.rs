//! The incremental detokenizer on SmolLM2's real byte-level BPE tokenizer (read
//! from the GGUF through `pagoda-models`): the reference greedy outputs must
//! come out exactly, and random token streams must concatenate to the full decode.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use pagoda_engine::detokenizer::IncrementalDetokenizer;
use pagoda_models::gguf::GgufFile;
use proptest::prelude::*;
use tokenizers::Tokenizer;

fn model_path() -> PathBuf {
    let path = std::env::var_os("PAGODA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.exists(),
        "SmolLM2 GGUF not found at {} (set PAGODA_MODEL or install it as CI does)",
        path.display()
    );
    path
}

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let gguf = GgufFile::open(&model_path()).expect("open GGUF");
        let tok = pagoda_models::Tokenizer::from_gguf(&gguf).expect("tokenizer from GGUF");
        Arc::new(tok.hf().clone())
    })
    .clone()
}

/// Feeds ids one at a time; returns all deltas + finish and the stop match.
fn run(
    prompt: &[u32],
    ids: &[u32],
    skip: bool,
    stop: &[&str],
    include: bool,
) -> (String, Option<String>) {
    let stop = stop
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .into();
    let mut d = IncrementalDetokenizer::new(tokenizer(), prompt, skip, stop, include);
    let mut text = String::new();
    for &t in ids {
        let delta = d.push(&[t]).unwrap();
        text.push_str(&delta.text);
        if delta.stop_matched.is_some() {
            text.push_str(&d.finish());
            return (text, delta.stop_matched);
        }
    }
    text.push_str(&d.finish());
    (text, None)
}

fn reference_cases() -> Vec<(Vec<u32>, Vec<u32>, String)> {
    // The in-repo copy (tests/data/README.md says where it comes from).
    let path = std::env::var("PAGODA_REFERENCE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/smollm2-greedy.json"
        )
        .to_string()
    });
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reference outputs {path}: {e}"));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                ids(&c["prompt_ids"]),
                ids(&c["greedy_ids"]),
                c["greedy_text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn reference_greedy_outputs_detokenize_exactly() {
    let cases = reference_cases();
    assert!(!cases.is_empty());
    for (prompt, out, want) in cases {
        assert_eq!(
            run(&prompt, &out, false, &[], false).0,
            want,
            "prompt ids {prompt:?}"
        );
        let skipped = tokenizer().decode(&out, true).unwrap();
        assert_eq!(run(&prompt, &out, true, &[], false).0, skipped);
        assert!(!skipped.contains("<|im_end|>"));
    }
}

#[test]
fn multibyte_text_and_stop_strings_on_the_real_vocabulary() {
    let tok = tokenizer();
    let text = "Hello, world! 😀 你好, café — naïve.\nUser: more text";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(run(&[], &ids, true, &[], false).0, text);
    let (cut, stop) = run(&[], &ids, true, &["\nUser:"], false);
    assert_eq!(
        (cut.as_str(), stop.as_deref()),
        ("Hello, world! 😀 你好, café — naïve.", Some("\nUser:"))
    );
    let (cut, _) = run(&[], &ids, true, &["好, ca"], true);
    assert_eq!(cut, "Hello, world! 😀 你好, ca");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random ids from the whole vocabulary (byte tokens, merges, specials).
    #[test]
    fn random_real_tokens_concatenate_to_full_decode(
        prompt in prop::collection::vec(0u32..49152, 0..8),
        ids in prop::collection::vec(prop_oneof![3 => 0u32..49152, 1 => 0u32..300], 0..40),
        skip in any::<bool>(),
    ) {
        let mut want = tokenizer().decode(&ids, skip).unwrap();
        if want.ends_with('\u{FFFD}') {
            want.pop();
        }
        let mut d = IncrementalDetokenizer::new(tokenizer(), &prompt, skip, Default::default(), false);
        let mut got = String::new();
        for &t in &ids {
            got.push_str(&d.push(&[t]).unwrap().text);
        }
        got.push_str(&d.finish());
        prop_assert_eq!(got, want);
    }
}
