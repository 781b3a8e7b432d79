//! `pagoda generate --device emu --dtype float32` (the device forward, every CUDA
//! kernel emulated, the attention through the CUDA backends' device code path) gives
//! the CPU path's greedy ids on prompts of different lengths, submitted together:
//! with default settings, with chunked prefill (`--max-num-batched-tokens 8`, so the
//! longest prompt runs in chunks beside the others' decodes) and with a KV cache of a
//! few blocks (requests preempted and recomputed; the run must report preemptions).
//!
//! The model is the tracked tiny Qwen2 fixture (2 layers, hidden 64, head dim 16, GQA
//! 2, QKV bias): the emulator runs a CUDA thread per fiber, so it is kept small. Both
//! paths are f32, so ids are compared exactly; the fixture's greedy steps are checked
//! to be far from ties by the CPU path's own reference test (tests/tests/families.rs).

use std::path::PathBuf;
use std::process::Command;

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/families/qwen2")
}

/// Prompts of 3, 11 and 21 token ids.
fn prompts() -> Vec<String> {
    [3usize, 11, 21]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| (7 + 13 * i + 29 * j) % 390 + 5)
                .map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// Each prompt's generated ids, and the run's preemption count (from its log line).
fn generate(device: &str, extra: &[&str]) -> (Vec<Vec<u64>>, u64) {
    let model = model();
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
        "6".into(),
        "--ignore-eos".into(),
        "--block-size".into(),
        "4".into(),
        // Graph buckets 1, 2 and 4 only: each capture runs on the emulator.
        "--max-num-seqs".into(),
        "4".into(),
    ];
    for p in prompts() {
        args.push("--prompt-ids".into());
        args.push(p);
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
    let (cpu, _) = generate("cpu", &[]);
    assert!(cpu.iter().all(|ids| ids.len() == 6), "{cpu:?}");
    for (label, extra, must_preempt) in [
        ("default", &[][..], false),
        ("chunked", &["--max-num-batched-tokens", "8"][..], false),
        // 3 + 6, 11 + 6 and 21 + 6 tokens need 3, 5 and 7 blocks of 4: 8 blocks hold
        // the longest alone, never all three.
        ("preempting", &["--num-kv-blocks", "8"][..], true),
    ] {
        let (emu, preemptions) = generate("emu", extra);
        assert_eq!(emu, cpu, "{label}: emu vs cpu greedy ids");
        if must_preempt {
            assert!(preemptions > 0, "{label}: no request was preempted");
        }
    }
}
