//! The checks every decoder runs before a step reaches a device: the config's
//! dims (once, at construction) and a step's inputs against the model and its KV cache.

use crate::config::LlamaConfig;
use crate::error::ModelError;
use pagoda_core::{BatchDescriptor, KvCache};

fn forward_err(message: String) -> ModelError {
    ModelError::Forward { message }
}

fn config_err(message: String) -> ModelError {
    ModelError::Config { message }
}

pub(crate) fn validate_config(c: &LlamaConfig) -> Result<(), ModelError> {
    let positive = [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_heads", c.num_heads),
        ("num_kv_heads", c.num_kv_heads),
        ("head_dim", c.head_dim),
        ("max_position_embeddings", c.max_position_embeddings),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(config_err(format!("{name} must be > 0")));
        }
    }
    if !c.num_heads.is_multiple_of(c.num_kv_heads) {
        return Err(config_err(format!(
            "{} heads are not a multiple of {} KV heads",
            c.num_heads, c.num_kv_heads
        )));
    }
    if !c.head_dim.is_multiple_of(2) {
        return Err(config_err(format!(
            "head_dim {} must be even for RoPE",
            c.head_dim
        )));
    }
    if c.vocab_size > u32::MAX as usize {
        return Err(config_err(format!(
            "vocab_size {} does not fit token ids",
            c.vocab_size
        )));
    }
    Ok(())
}

/// A step's inputs against the model (`c`, RoPE tables of `max_position`) and its KV
/// cache: lengths, token ids, positions, logits rows, the cache's shape and block size.
/// Shared by the CPU and the device forward.
pub(crate) fn check_step_inputs(
    c: &LlamaConfig,
    max_position: usize,
    input_ids: &[u32],
    positions: &[u32],
    batch: &BatchDescriptor,
    kv: &KvCache,
    logits_rows: &[usize],
) -> Result<(), ModelError> {
    let n = input_ids.len();
    if positions.len() != n {
        return Err(forward_err(format!(
            "{n} input ids but {} positions",
            positions.len()
        )));
    }
    if batch.num_tokens() != n || batch.slot_mapping().len() != n {
        return Err(forward_err(format!(
            "{n} input ids but the batch has {} tokens and {} slots",
            batch.num_tokens(),
            batch.slot_mapping().len()
        )));
    }
    if let Some((t, &id)) = input_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= c.vocab_size)
    {
        return Err(forward_err(format!(
            "token {t}: id {id} is out of the vocabulary of {}",
            c.vocab_size
        )));
    }
    if let Some(&p) = positions.iter().find(|&&p| p as usize >= max_position) {
        return Err(forward_err(format!(
            "position {p} is beyond the model's {max_position} positions"
        )));
    }
    if let Some(&t) = logits_rows.iter().find(|&&t| t >= n) {
        return Err(forward_err(format!(
            "logits row {t} is out of range for {n} tokens"
        )));
    }
    let spec = &kv.spec;
    if spec.num_layers != c.num_layers
        || kv.layers.len() != c.num_layers
        || spec.num_kv_heads != c.num_kv_heads
        || spec.head_dim != c.head_dim
    {
        return Err(forward_err(format!(
                "KV cache ({} layers, {} kv heads, head dim {}) does not fit the model ({} layers, {} kv heads, head dim {})",
                kv.layers.len(),
                spec.num_kv_heads,
                spec.head_dim,
                c.num_layers,
                c.num_kv_heads,
                c.head_dim
            )));
    }
    if spec.block_size != batch.block_size() {
        return Err(forward_err(format!(
            "batch block size {} but cache block size {}",
            batch.block_size(),
            spec.block_size
        )));
    }
    Ok(())
}
