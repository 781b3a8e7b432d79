//! `pagoda generate --json` on the real model returns the reference greedy ids for
//! the three reference prompts submitted together, under default settings, forced
//! preemption, forced chunked prefill and with prefix caching off; and `pagoda
//! backends` explains the registry.

use std::path::PathBuf;
use std::process::Command;

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("PAGODA_MODEL") {
        return PathBuf::from(p);
    }
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let p = std::env::var_os("PAGODA_CACHE")
        .map(PathBuf::from)
        .unwrap_or(home.join(".cache/pagoda"));
    p.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

struct Case {
    prompt: String,
    greedy_ids: Vec<u64>,
    safe_len: usize,
}

fn cases() -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/smollm2-greedy.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap().to_string(),
            greedy_ids: c["greedy_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect(),
            safe_len: c["safe_len"].as_u64().unwrap() as usize,
        })
        .collect()
}

fn pagoda(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running pagoda")
}

fn generate_matches_reference(extra: &[&str]) {
    let cases = cases();
    let model = model_path();
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "48",
        // The exact path (the default keeps the GGUF's quantization).
        "--dtype",
        "float32",
    ];
    for c in &cases {
        args.push("--prompt");
        args.push(&c.prompt);
    }
    args.extend_from_slice(extra);
    let out = pagoda(&args);
    assert!(
        out.status.success(),
        "pagoda generate {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), cases.len());
    for (c, l) in cases.iter().zip(&lines) {
        assert_eq!(l["prompt"].as_str().unwrap(), c.prompt, "prompt order");
        let ids: Vec<u64> = l["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert!(
            ids.len() >= c.safe_len,
            "{extra:?} {:?}: {} tokens",
            c.prompt,
            ids.len()
        );
        assert_eq!(
            &ids[..c.safe_len],
            &c.greedy_ids[..c.safe_len],
            "{extra:?}: {:?}",
            c.prompt
        );
        assert!(l["text"].is_string() && l["finish_reason"].is_string());
    }
}

#[test]
fn generate_default() {
    generate_matches_reference(&[]);
}

#[test]
fn generate_with_preemption() {
    generate_matches_reference(&["--num-kv-blocks", "24"]);
    // 4-token blocks: each request needs ~15 of the 23 usable blocks, so the three
    // cannot all run and some are preempted and recomputed.
    generate_matches_reference(&["--num-kv-blocks", "24", "--block-size", "4"]);
}

#[test]
fn generate_with_chunked_prefill() {
    generate_matches_reference(&["--max-num-batched-tokens", "8"]);
}

#[test]
fn generate_without_prefix_caching() {
    generate_matches_reference(&["--no-prefix-caching"]);
}

#[test]
fn generate_with_backend_overrides() {
    generate_matches_reference(&["--attention-backend", "naive"]);
    generate_matches_reference(&["--attention-backend", "prefill=flash"]);
    generate_matches_reference(&["--attention-backend", "decode=paged,prefill=flash"]);
}

#[test]
fn invalid_backend_overrides_fail_with_reasons() {
    let model = model_path();
    let m = model.to_str().unwrap();
    let out = pagoda(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "hi",
        "--attention-backend",
        "paged",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("prefill"), "{err}");
    let out = pagoda(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "hi",
        "--attention-backend",
        "nope",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("naive") && err.contains("paged") && err.contains("flash"),
        "{err}"
    );
}

#[test]
fn missing_model_is_a_clear_error() {
    let out = pagoda(&[
        "generate",
        "--model",
        "/nonexistent/x.gguf",
        "--prompt",
        "hi",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/x.gguf") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn backends_command_shows_verdicts_and_choice() {
    let model = model_path();
    let out = pagoda(&["backends", "--model", model.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("naive") && s.contains("paged") && s.contains("flash"),
        "{s}"
    );
    assert!(s.contains("cuda-paged") && s.contains("cuda-flash"), "{s}");
    assert!(s.contains("choice: decode=paged,prefill=flash"), "{s}");
}

/// `backends` reports the queries' dtype `serve` computes in (issue 23: they disagreed
/// on `emu`, f32 against the device forward's bf16).
#[test]
fn backends_on_emu_report_the_device_forwards_dtype() {
    let model = model_path();
    let m = model.to_str().unwrap();
    for (dtype, want) in [
        ("auto", "q bf16, kv cache bf16"),
        ("float32", "q f32, kv cache f32"),
    ] {
        let out = pagoda(&[
            "backends", "--model", m, "--device", "emu", "--dtype", dtype,
        ]);
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{s}");
        assert!(
            s.contains(&format!("device emu, {want}")),
            "--dtype {dtype}: {s}"
        );
    }
}

#[test]
fn backends_on_cuda_say_not_compiled() {
    let model = model_path();
    let out = pagoda(&[
        "backends",
        "--model",
        model.to_str().unwrap(),
        "--device",
        "cuda",
    ]);
    let s = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["cuda-naive", "cuda-paged", "cuda-flash"] {
        assert!(s.contains(name), "{s}");
    }
    assert!(s.contains("not compiled with CUDA"), "{s}");
}
