//! The family switches ([`ArchConfig`]) of an HF `config.json`: which family the
//! `architectures` entry names, and the fields each family reads. A field that would
//! change the math in a way the decoder does not implement (a bias on o_proj, an
//! activation other than the family's, Qwen's per-layer sliding windows, ...) is
//! refused by name rather than ignored.

use crate::arch::{Activation, ArchConfig, Architecture, MoeConfig, SlidingLayers};
use crate::error::ModelError;
use serde_json::Value;

/// The family of a config: its first `architectures` entry, else its `model_type`.
pub fn architecture_of(j: &Value) -> Result<Architecture, ModelError> {
    let first = j
        .get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.first())
        .and_then(|x| x.as_str());
    let model_type = j.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
    match first {
        Some(name) => Architecture::from_hf(name),
        None => Architecture::ALL
            .into_iter()
            .find(|a| a.model_type() == model_type),
    }
    .ok_or_else(|| ModelError::UnsupportedArchitecture {
        arch: first.unwrap_or(model_type).to_string(),
    })
}

fn unsupported(arch: Architecture, field: &str, v: &Value, reason: &str) -> ModelError {
    ModelError::UnsupportedConfig {
        arch: arch.hf_name().to_string(),
        field: field.to_string(),
        value: v.to_string(),
        reason: reason.to_string(),
    }
}

/// The switches of `arch` from config `j`.
pub fn arch_config(j: &Value, arch: Architecture) -> Result<ArchConfig, ModelError> {
    let get = |k: &str| j.get(k).filter(|v| !v.is_null());
    let pos_usize = |k: &str| -> Result<Option<usize>, ModelError> {
        match get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) if x > 0 => Ok(Some(x as usize)),
                _ => Err(unsupported(arch, k, v, "not a positive integer")),
            },
        }
    };
    let pos_f32 = |k: &str| -> Result<Option<f32>, ModelError> {
        match get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x > 0.0 => Ok(Some(x as f32)),
                _ => Err(unsupported(arch, k, v, "not a positive number")),
            },
        }
    };
    // Fields that must be false (or absent) for every family we run.
    for k in ["mlp_bias", "use_sliding_window"] {
        if let Some(v) = get(k).filter(|v| v.as_bool() != Some(false)) {
            return Err(unsupported(arch, k, v, "not implemented"));
        }
    }
    if arch != Architecture::Qwen2 {
        // Qwen2's Q/K/V always have a bias (and no `attention_bias` field); others
        // would put one on o_proj too.
        if let Some(v) = get("attention_bias").filter(|v| v.as_bool() != Some(false)) {
            return Err(unsupported(arch, "attention_bias", v, "not implemented"));
        }
    }
    let expect_act = match arch {
        Architecture::Gemma2 => "gelu_pytorch_tanh",
        _ => "silu",
    };
    for k in ["hidden_act", "hidden_activation"] {
        if let Some(v) = get(k) {
            // Gemma 2 configs carry both; transformers uses `hidden_activation`.
            let ok = v.as_str() == Some(expect_act)
                || (arch == Architecture::Gemma2 && k == "hidden_act");
            if !ok {
                return Err(unsupported(
                    arch,
                    k,
                    v,
                    &format!("{arch} runs with `{expect_act}` only"),
                ));
            }
        }
    }
    let mut a = ArchConfig {
        architecture: arch,
        ..ArchConfig::default()
    };
    match arch {
        Architecture::Llama => {}
        Architecture::Qwen2 => a.qkv_bias = true,
        Architecture::Qwen3 => a.qk_norm = true,
        Architecture::Mistral => a.sliding_window = pos_usize("sliding_window")?,
        Architecture::Mixtral => {
            a.sliding_window = pos_usize("sliding_window")?;
            let num_experts =
                pos_usize("num_local_experts")?.ok_or_else(|| ModelError::Config {
                    message: "`num_local_experts` missing".into(),
                })?;
            let top_k = pos_usize("num_experts_per_tok")?.ok_or_else(|| ModelError::Config {
                message: "`num_experts_per_tok` missing".into(),
            })?;
            if top_k > num_experts {
                return Err(unsupported(
                    arch,
                    "num_experts_per_tok",
                    &Value::from(top_k),
                    "more than num_local_experts",
                ));
            }
            a.moe = Some(MoeConfig { num_experts, top_k });
        }
        Architecture::Gemma2 => {
            a.sliding_window = pos_usize("sliding_window")?;
            a.sliding_layers = SlidingLayers::Even;
            a.attn_logit_softcap = pos_f32("attn_logit_softcapping")?;
            a.final_logit_softcap = pos_f32("final_logit_softcapping")?;
            a.query_pre_attn_scalar = pos_f32("query_pre_attn_scalar")?;
            a.scale_embedding = true;
            a.post_norms = true;
            a.activation = Activation::GeluTanh;
        }
    }
    check_layer_types(get("layer_types"), &a)?;
    Ok(a)
}

/// Newer transformers write each layer's attention as `layer_types`; it must be
/// what the family's switches give (Gemma 2: sliding first, then alternating;
/// Mistral with a window: all sliding; others: all full), so Qwen's per-layer
/// windows or any other pattern are refused by name rather than run wrongly.
fn check_layer_types(v: Option<&Value>, a: &ArchConfig) -> Result<(), ModelError> {
    let Some(v) = v else { return Ok(()) };
    let arch = a.architecture;
    let list = v
        .as_array()
        .ok_or_else(|| unsupported(arch, "layer_types", v, "not a list"))?;
    for (l, t) in list.iter().enumerate() {
        let want = if a.is_sliding(l) {
            "sliding_attention"
        } else {
            "full_attention"
        };
        if t.as_str() != Some(want) {
            return Err(unsupported(
                arch,
                "layer_types",
                v,
                &format!("layer {l} would be `{want}` for {arch}"),
            ));
        }
    }
    Ok(())
}
