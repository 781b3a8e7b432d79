//! Loading an HF model directory: a tiny random 2-layer Llama is written as two
//! safetensors shards with an index, plus tokenizer and generation configs, and must
//! load back exactly.

use half::{bf16, f16};
use pagoda_models::{inspect_model, load_model, ChatMessage, LlamaWeights, Mat, ModelError};
use safetensors::{Dtype, View};
use serde_json::json;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

const VOCAB: usize = 8;
const HIDDEN: usize = 8;
const INTER: usize = 12;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 4;
const LAYERS: usize = 2;

/// A tensor to serialize (owned bytes).
struct T {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &T {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Deterministic pseudo-random values; each tensor is stored in `dtype` and the
/// expected f32 values are exactly what that dtype represents.
fn tensor(seed: &mut u64, shape: &[usize], dtype: Dtype) -> (T, Vec<f32>) {
    let n: usize = shape.iter().product();
    let vals: Vec<f32> = (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let (data, exact): (Vec<u8>, Vec<f32>) = match dtype {
        Dtype::F32 => (
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            vals.clone(),
        ),
        Dtype::F16 => {
            let h: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        Dtype::BF16 => {
            let h: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        _ => unreachable!(),
    };
    (
        T {
            dtype,
            shape: shape.to_vec(),
            data,
        },
        exact,
    )
}

/// Writes the model directory; returns the expected f32 values by tensor name.
fn write_model(dir: &Path, tied: bool, sharded: bool) -> BTreeMap<String, Vec<f32>> {
    let mut seed = 42u64;
    let mut tensors: Vec<(String, T)> = Vec::new();
    let mut expect = BTreeMap::new();
    let mut add = |name: String, shape: &[usize], dtype: Dtype| {
        let (t, v) = tensor(&mut seed, shape, dtype);
        expect.insert(name.clone(), v);
        tensors.push((name, t));
    };
    add(
        "model.embed_tokens.weight".into(),
        &[VOCAB, HIDDEN],
        Dtype::BF16,
    );
    for i in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{i}.{s}.weight");
        add(p("input_layernorm"), &[HIDDEN], Dtype::F32);
        add(
            p("self_attn.q_proj"),
            &[HEADS * HEAD_DIM, HIDDEN],
            Dtype::F16,
        );
        add(
            p("self_attn.k_proj"),
            &[KV_HEADS * HEAD_DIM, HIDDEN],
            Dtype::F16,
        );
        add(
            p("self_attn.v_proj"),
            &[KV_HEADS * HEAD_DIM, HIDDEN],
            Dtype::F32,
        );
        add(
            p("self_attn.o_proj"),
            &[HIDDEN, HEADS * HEAD_DIM],
            Dtype::BF16,
        );
        add(p("post_attention_layernorm"), &[HIDDEN], Dtype::F32);
        add(p("mlp.gate_proj"), &[INTER, HIDDEN], Dtype::F32);
        add(p("mlp.up_proj"), &[INTER, HIDDEN], Dtype::F16);
        add(p("mlp.down_proj"), &[HIDDEN, INTER], Dtype::F32);
    }
    add("model.norm.weight".into(), &[HIDDEN], Dtype::F32);
    if !tied {
        add("lm_head.weight".into(), &[VOCAB, HIDDEN], Dtype::F32);
    }
    let write = |file: &str, part: &[(String, T)]| {
        let bytes =
            safetensors::serialize(part.iter().map(|(n, t)| (n.as_str(), t)), &None).unwrap();
        std::fs::write(dir.join(file), bytes).unwrap();
    };
    if sharded {
        let mid = tensors.len() / 2;
        let files = [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ];
        write(files[0], &tensors[..mid]);
        write(files[1], &tensors[mid..]);
        let map: BTreeMap<&str, &str> = tensors
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.as_str(), files[usize::from(i >= mid)]))
            .collect();
        let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    } else {
        write("model.safetensors", &tensors);
    }
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 128,
        "tie_word_embeddings": tied, "bos_token_id": 0, "eos_token_id": 1,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    let tok_cfg = json!({
        "bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}, "add_bos_token": true,
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
    });
    std::fs::write(dir.join("tokenizer_config.json"), tok_cfg.to_string()).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": [1, 7]}).to_string(),
    )
    .unwrap();
    expect
}

/// A byte-level BPE tokenizer.json with BOS added by its post-processor.
fn tokenizer_json() -> serde_json::Value {
    let vocab = json!({"<s>": 0, "</s>": 1, "h": 2, "i": 3, "hi": 4, "Ġ": 5, "Ġhi": 6, "<eot>": 7});
    let added = |id: u32, c: &str| json!({"id": id, "content": c, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<s>"), added(1, "</s>"), added(7, "<eot>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": [["h", "i"], ["Ġ", "hi"]]},
    })
}

fn mat(e: &BTreeMap<String, Vec<f32>>, name: &str, rows: usize, cols: usize) -> Mat {
    Mat::new(rows, cols, e[name].clone())
}

fn assert_weights(w: &LlamaWeights, e: &BTreeMap<String, Vec<f32>>, tied: bool) {
    assert_eq!(w.embed, mat(e, "model.embed_tokens.weight", VOCAB, HIDDEN));
    assert_eq!(w.layers.len(), LAYERS);
    for (i, l) in w.layers.iter().enumerate() {
        let p = |s: &str| format!("model.layers.{i}.{s}.weight");
        assert_eq!(l.attn_norm, e[&p("input_layernorm")]);
        // HF Q/K are already in rotate-half order: loaded as-is, no permutation.
        assert_eq!(
            l.wq,
            mat(e, &p("self_attn.q_proj"), HEADS * HEAD_DIM, HIDDEN)
        );
        assert_eq!(
            l.wk,
            mat(e, &p("self_attn.k_proj"), KV_HEADS * HEAD_DIM, HIDDEN)
        );
        assert_eq!(
            l.wv,
            mat(e, &p("self_attn.v_proj"), KV_HEADS * HEAD_DIM, HIDDEN)
        );
        assert_eq!(
            l.wo,
            mat(e, &p("self_attn.o_proj"), HIDDEN, HEADS * HEAD_DIM)
        );
        assert_eq!(l.ffn_norm, e[&p("post_attention_layernorm")]);
        assert_eq!(l.w_gate, mat(e, &p("mlp.gate_proj"), INTER, HIDDEN));
        assert_eq!(l.w_up, mat(e, &p("mlp.up_proj"), INTER, HIDDEN));
        assert_eq!(l.w_down, mat(e, &p("mlp.down_proj"), HIDDEN, INTER));
    }
    assert_eq!(w.norm, e["model.norm.weight"]);
    match tied {
        true => assert!(w.lm_head.is_none()),
        false => assert_eq!(
            w.lm_head.as_ref().unwrap(),
            &mat(e, "lm_head.weight", VOCAB, HIDDEN)
        ),
    }
}

#[test]
fn sharded_untied_model_loads_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let expect = write_model(dir.path(), false, true);
    let m = load_model(dir.path()).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_layers
        ),
        (VOCAB, HIDDEN, INTER, LAYERS)
    );
    assert_eq!(
        (c.num_heads, c.num_kv_heads, c.head_dim),
        (HEADS, KV_HEADS, HIDDEN / HEADS)
    );
    assert_eq!(
        (
            c.rope_theta,
            c.max_position_embeddings,
            c.tie_word_embeddings
        ),
        (500000.0, 128, false)
    );
    let rs = c.rope_scaling.expect("llama3 rope scaling");
    assert_eq!(
        (
            rs.factor,
            rs.low_freq_factor,
            rs.high_freq_factor,
            rs.original_max_position_embeddings
        ),
        (8.0, 1.0, 4.0, 64)
    );
    assert_weights(&m.weights, &expect, false);
    assert_eq!(m.eos_token_ids, vec![1, 7]);
    assert_eq!(m.name, dir.path().file_name().unwrap().to_string_lossy());
    let (ic, _) = inspect_model(dir.path()).unwrap();
    assert_eq!(&ic, c);

    let t = &m.tokenizer;
    assert_eq!(t.encode("hi hi", true).unwrap(), vec![0, 4, 6]);
    assert_eq!(t.encode("hi hi", false).unwrap(), vec![4, 6]);
    assert_eq!(t.decode(&[0, 4, 6, 1], true).unwrap(), "hi hi");
    assert!(t.is_special(7) && !t.is_special(4));
    assert_eq!((t.bos_token_id(), t.add_bos()), (Some(0), true));

    let chat = m.chat_template.as_ref().unwrap();
    let msgs = [ChatMessage {
        role: "user".into(),
        content: " hi ".into(),
    }];
    assert_eq!(
        chat.render(&msgs, true).unwrap(),
        "<s>[user]hi</s>[assistant]"
    );
}

#[test]
fn single_file_tied_model_and_eos_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let expect = write_model(dir.path(), true, false);
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    let m = load_model(dir.path()).unwrap();
    assert!(m.config.tie_word_embeddings);
    assert_weights(&m.weights, &expect, true);
    // Without generation_config.json the EOS id comes from config.json.
    assert_eq!(m.eos_token_ids, vec![1]);
}

#[test]
fn hf_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), false, true);
    // A missing shard named by the index.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert!(matches!(load_model(dir.path()), Err(ModelError::Io { .. })));

    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), false, false);
    let cfg = dir.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c["intermediate_size"] = json!(INTER + 1);
    std::fs::write(&cfg, c.to_string()).unwrap();
    match load_model(dir.path()) {
        Err(ModelError::TensorShape { name, .. }) => assert!(name.contains("mlp"), "{name}"),
        other => panic!("expected TensorShape, got {:?}", other.map(|_| ())),
    }
    c["architectures"] = json!(["GPTNeoXForCausalLM"]);
    std::fs::write(&cfg, c.to_string()).unwrap();
    assert!(
        matches!(load_model(dir.path()), Err(ModelError::UnsupportedArchitecture { arch }) if arch == "GPTNeoXForCausalLM")
    );
    std::fs::write(&cfg, "{not json").unwrap();
    assert!(matches!(
        load_model(dir.path()),
        Err(ModelError::Config { .. })
    ));
}

/// A config field that would change the math in a way the decoder does not
/// implement is refused at load, naming the field; so is a family's missing tensor.
#[test]
fn unsupported_config_fields_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), false, false);
    let cfg = dir.path().join("config.json");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    for (arch, field, value) in [
        ("LlamaForCausalLM", "attention_bias", json!(true)),
        ("LlamaForCausalLM", "mlp_bias", json!(true)),
        ("LlamaForCausalLM", "hidden_act", json!("gelu")),
        ("Qwen2ForCausalLM", "use_sliding_window", json!(true)),
        (
            "Gemma2ForCausalLM",
            "layer_types",
            json!(["sliding_attention", "sliding_attention"]),
        ),
        (
            "Qwen2ForCausalLM",
            "layer_types",
            json!(["sliding_attention", "full_attention"]),
        ),
        ("MixtralForCausalLM", "num_experts_per_tok", json!(9)),
    ] {
        let mut c = base.clone();
        c["architectures"] = json!([arch]);
        c["num_local_experts"] = json!(4);
        c["num_experts_per_tok"] = json!(2);
        c[field] = value;
        std::fs::write(&cfg, c.to_string()).unwrap();
        match load_model(dir.path()) {
            Err(e @ ModelError::UnsupportedConfig { .. }) => {
                assert!(e.to_string().contains(field), "{arch} {field}: {e}")
            }
            other => panic!(
                "{arch} {field}: expected UnsupportedConfig, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    // Qwen2 needs its q/k/v biases: the Llama tensors alone are refused by name.
    let mut c = base.clone();
    c["architectures"] = json!(["Qwen2ForCausalLM"]);
    std::fs::write(&cfg, c.to_string()).unwrap();
    match load_model(dir.path()) {
        Err(ModelError::MissingTensor { name }) => assert!(name.contains("q_proj.bias"), "{name}"),
        other => panic!("expected MissingTensor, got {:?}", other.map(|_| ())),
    }
}
