//! Shared helpers for Pagoda's end-to-end tests: where the real model is, the
//! reference outputs, and a quick way to build an engine.

use pagoda_engine::{EngineConfig, LLMEngine};
use serde::Deserialize;
use std::path::PathBuf;

// Inventory only sees linked crates: link every backend.
use pagoda_backends as _;

/// The real model: `$PAGODA_MODEL`, else the cache path `scripts/fetch-model.sh` fills.
pub fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("PAGODA_MODEL") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("PAGODA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
                .join(".cache")
                .join("pagoda")
        });
    let p = cache.join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "the model file {} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

/// One case of `tests/data/smollm2-greedy.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReferenceCase {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
    pub top5_ids: Vec<u32>,
    pub top5_logprobs: Vec<f32>,
    /// Top-1 minus top-2 log-probability of the reference at each generated step.
    pub gaps: Vec<f32>,
    pub safe_len: usize,
}

#[derive(Deserialize)]
struct ReferenceFile {
    cases: Vec<ReferenceCase>,
}

/// The reference greedy continuations (HF transformers, f32, same weights).
pub fn reference_cases() -> Vec<ReferenceCase> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/smollm2-greedy.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str::<ReferenceFile>(&text)
        .expect("parsing the reference file")
        .cases
}

/// An engine config on the real model with small, test-friendly defaults.
pub fn test_config() -> EngineConfig {
    let mut c = EngineConfig::new(model_path());
    c.kv_cache_bytes = 256 << 20;
    c
}

pub fn engine(config: EngineConfig) -> LLMEngine {
    LLMEngine::new(config).expect("starting the engine")
}
