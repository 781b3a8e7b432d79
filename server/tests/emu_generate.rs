//! `pagoda generate --device emu --dtype float32` (the device forward, every CUDA
//! kernel emulated, the attention through the CUDA backends' device code path) gives
//! the CPU path's greedy ids (same flags) on prompts of different lengths submitted
//! together: with default settings, with chunked prefill (`--max-num-batched-tokens 8`,
//! so the longer prompts run in chunks beside the others' decodes) and with a KV cache
//! of a few blocks (a request preempted and recomputed; the run must report it).
//!
//! The models are the tracked tiny fixtures (2 layers, hidden 64, head dim 16, GQA 2):
//! mistral (a sliding window of 8; its reference prompts of 22, 56 and 26 ids give
//! varied greedy ids) for the default and chunked runs, qwen2 (QKV bias; prompts of 3,
//! 11 and 15 ids, 12 tokens, 8 blocks of 4: the first two outgrow the cache together)
//! for the preempting one, since mistral's window frees blocks as it goes. The
//! emulator runs a CUDA thread per fiber, so they are kept small. Both paths are f32:
//! ids are compared exactly.

use std::path::PathBuf;
use std::process::Command;

fn family(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/families")
        .join(name)
}

/// The fixture's reference prompts as `--prompt-ids` values.
fn reference_prompts(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(family(name).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids: Vec<String> = p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.to_string())
                .collect();
            ids.join(",")
        })
        .collect()
}

/// Prompts of 3, 11 and 15 token ids.
fn short_prompts() -> Vec<String> {
    [3usize, 11, 15]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((7 + 13 * i + 29 * j) % 390 + 5).to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// Each prompt's generated ids, and the run's preemption count (from its log line).
fn generate(
    device: &str,
    model: &str,
    prompts: &[String],
    max_tokens: usize,
    extra: &[&str],
) -> (Vec<Vec<u64>>, u64) {
    let model = family(model);
    let mut args = vec![
        "generate".to_string(),
        "--model".into(),
        model.to_str().unwrap().into(),
        "--device".into(),
        device.into(),
        "--dtype".into(),
        "float32".into(),
        "--json".into(),
        "--temperature".into(),
        "0".into(),
        "--max-tokens".into(),
        max_tokens.to_string(),
        "--ignore-eos".into(),
        "--block-size".into(),
        "4".into(),
        // Graph buckets 1, 2 and 4 only: each capture runs on the emulator.
        "--max-num-seqs".into(),
        "4".into(),
    ];
    for p in prompts {
        args.push("--prompt-ids".into());
        args.push(p.clone());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(&args)
        .env("RUST_LOG", "info")
        .output()
        .expect("running pagoda");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pagoda generate --device {device} {extra:?} failed: {stderr}"
    );
    let ids = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect()
        })
        .collect::<Vec<Vec<u64>>>();
    assert_eq!(ids.len(), 3, "{device} {extra:?}: {stderr}");
    let preemptions = stderr
        .lines()
        .find_map(|l| {
            let (head, _) = l.split_once(" preemptions")?;
            head.rsplit(' ').next()?.parse::<u64>().ok()
        })
        .unwrap_or_else(|| panic!("no preemption count in the log: {stderr}"));
    (ids, preemptions)
}

#[test]
fn emu_device_greedy_ids_equal_the_cpu_path() {
    let mistral = reference_prompts("mistral");
    let short = short_prompts();
    for (label, model, prompts, tokens, extra, must_preempt) in [
        ("default", "mistral", &mistral, 8, &[][..], false),
        (
            "chunked",
            "mistral",
            &mistral,
            8,
            &["--max-num-batched-tokens", "8"][..],
            false,
        ),
        (
            "preempting",
            "qwen2",
            &short,
            12,
            &["--num-kv-blocks", "8"][..],
            true,
        ),
    ] {
        let (cpu, cpu_preempted) = generate("cpu", model, prompts, tokens, extra);
        assert!(
            cpu.iter().all(|ids| ids.len() == tokens),
            "{label}: {cpu:?}"
        );
        let (emu, emu_preempted) = generate("emu", model, prompts, tokens, extra);
        assert_eq!(emu, cpu, "{label}: emu vs cpu greedy ids");
        if must_preempt {
            assert!(
                cpu_preempted > 0 && emu_preempted > 0,
                "{label}: preemptions cpu {cpu_preempted}, emu {emu_preempted}"
            );
        }
    }
}
