//! `pagoda generate --load-format dummy` on the tiny config: random weights, no
//! tokenizer, token-id prompts run on the CPU (the same ids per seed), and a text
//! prompt is refused with the reason.

use std::process::Command;

fn pagoda(args: &[&str]) -> std::process::Output {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-dummy");
    Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(["generate", "--load-format", "dummy", "--model", model])
        .args(["--max-tokens", "4", "--ignore-eos", "--json"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running pagoda")
}

fn outputs(args: &[&str]) -> Vec<serde_json::Value> {
    let out = pagoda(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pagoda failed: {stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn token_id_prompts_generate_on_the_cpu() {
    let args = ["--prompt-ids", "1,2,3", "--prompt-ids", "7, 8"];
    let a = outputs(&args);
    assert_eq!(a.len(), 2);
    assert_eq!(a[0]["prompt_token_ids"], serde_json::json!([1, 2, 3]));
    assert_eq!(a[1]["prompt_token_ids"], serde_json::json!([7, 8]));
    for o in &a {
        let ids = o["token_ids"].as_array().unwrap();
        assert_eq!(ids.len(), 4);
        assert!(ids.iter().all(|t| t.as_u64().unwrap() < 256));
        // No tokenizer: the text is the ids' placeholders.
        assert!(o["text"].as_str().unwrap().starts_with('['), "{o}");
    }
    // Same seed, same weights, same greedy ids; another seed, other weights.
    assert_eq!(a, outputs(&args));
    let b = outputs(&[&args[..], &["--seed", "1"]].concat());
    assert_ne!(a[0]["token_ids"], b[0]["token_ids"]);
}

#[test]
fn text_prompts_are_refused_without_a_tokenizer() {
    let out = pagoda(&["--prompt", "hello"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no tokenizer"), "{stderr}");
    assert!(stderr.contains("token ids"), "{stderr}");
}
