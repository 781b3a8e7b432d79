//! Loading the real SmolLM2-135M-Instruct GGUF: config, weights, tokenizer against the
//! HF reference ids, chat template and EOS ids.

use pagoda_models::gguf::GgufFile;
use pagoda_models::loader::{gguf_config, unpermute_qk};
use pagoda_models::{inspect_model, load_model, ChatMessage, LoadedModel, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

fn model_path() -> PathBuf {
    let p = std::env::var_os("PAGODA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.is_file(),
        "real model not found at {} (set PAGODA_MODEL)",
        p.display()
    );
    p
}

fn model() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| load_model(&model_path()).expect("load real model"))
}

fn reference() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/smollm2-greedy.json"
    ))
    .expect("reference greedy file");
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn config_matches_smollm2() {
    let c = &model().config;
    assert_eq!(
        (
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.vocab_size
        ),
        (30, 576, 9, 3, 64, 49152)
    );
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.rope_theta, 100_000.0);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!(c.rope_scaling.is_none());
    let (ic, name) = inspect_model(&model_path()).unwrap();
    assert_eq!(&ic, c);
    assert_eq!(name, "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(model().name, name);
}

#[test]
fn tensor_inventory() {
    let f = GgufFile::open(&model_path()).unwrap();
    let count = |ty: u32| f.tensors.iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(count(3), 210, "Q4_1 matrices");
    assert_eq!(count(0), 61, "F32 norms");
    assert_eq!(f.tensor("token_embd.weight").unwrap().ggml_type, 8);
    assert_eq!(
        f.tensor("token_embd.weight").unwrap().dims,
        vec![576, 49152]
    );
    assert!(f.tensor("output.weight").is_none());
    assert_eq!(gguf_config(&f).unwrap(), model().config);
}

#[test]
fn weights_are_dense_and_finite() {
    let m = model();
    let w = &m.weights;
    assert_eq!((w.embed.rows, w.embed.cols), (49152, 576));
    assert_eq!(w.layers.len(), 30);
    assert!(w.lm_head.is_none());
    let l = &w.layers[7];
    assert_eq!(
        (l.wq.rows, l.wq.cols, l.wk.rows, l.wv.rows),
        (576, 576, 192, 192)
    );
    assert_eq!(
        (l.wo.rows, l.wo.cols, l.w_gate.rows, l.w_down.cols),
        (576, 576, 1536, 1536)
    );
    for mat in [&w.embed, &l.wq, &l.wk, &l.w_down] {
        let v = mat.values().unwrap();
        assert_eq!(v.len(), mat.rows * mat.cols);
        assert!(v.iter().all(|x| x.is_finite()));
        assert!(v.iter().any(|&x| x != 0.0));
    }
    // Quantized matrices are held as their blocks only: no f32 copy at load.
    assert!(l.wq.data.is_empty() && l.wq.quant.is_some());
    assert!(w.norm.iter().all(|x| x.is_finite()) && w.norm.len() == 576);
}

/// Q/K rows of the loaded model are the GGUF rows with llama.cpp's permutation undone.
#[test]
fn qk_rows_are_unpermuted() {
    let f = GgufFile::open(&model_path()).unwrap();
    let t = f.tensor("blk.0.attn_k.weight").unwrap();
    // The file's Q4_1 blocks travel with their rows.
    let blocks = pagoda_models::QuantBlocks {
        format: pagoda_kernels::QuantFormat::Q4_1,
        bytes: f.tensor_data(t).to_vec(),
    };
    let raw = pagoda_models::Mat::quantized(192, 576, blocks.clone());
    let k = &model().weights.layers[0].wk;
    assert_eq!(k, &unpermute_qk(&raw, 3).unwrap());
    let q = k.quant.as_ref().unwrap();
    let packed = pagoda_kernels::QuantMatrix::from_gguf(q.format, &q.bytes, 192, 576).unwrap();
    let kv = k.values().unwrap();
    assert_eq!(packed.dequantize(), *kv);
    // With f32 rows too, both move together.
    let dense =
        pagoda_models::Mat::new(192, 576, f.dequantize(t).unwrap()).with_quant(Some(blocks));
    let moved = unpermute_qk(&dense, 3).unwrap();
    assert_eq!(moved.data, *kv);
    // Head 1, HF row 1 (first half, i=1) came from GGUF row 2 (i=1, p=0); HF row 33
    // (second half, i=1) from GGUF row 3.
    assert_eq!(moved.row(64 + 1), dense.row(64 + 2));
    assert_eq!(moved.row(64 + 33), dense.row(64 + 3));
}

#[test]
fn tokenizer_matches_reference_ids() {
    let tok: &Tokenizer = &model().tokenizer;
    let r = reference();
    for case in r["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode(prompt, true).unwrap(),
            ids(&case["prompt_ids"]),
            "prompt {prompt:?}"
        );
        assert_eq!(
            tok.decode(&ids(&case["greedy_ids"]), false).unwrap(),
            case["greedy_text"].as_str().unwrap()
        );
    }
}

#[test]
fn tokenizer_special_tokens_and_round_trip() {
    let tok = &model().tokenizer;
    assert_eq!(tok.encode("<|im_start|>", true).unwrap(), vec![1]);
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert!(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
    assert!(!tok.is_special(504));
    assert_eq!((0..49152).filter(|&i| tok.is_special(i)).count(), 17);
    assert!(!tok.add_bos());
    assert_eq!(tok.vocab_size(), 49152);
    for text in [
        "héllo wörld 🦀🎉",
        "中文测试，你好世界",
        "  leading spaces\n\ttabs 12345",
        "<|im_start|>user\nhi<|im_end|>",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
    assert_eq!(tok.decode(&[1, 504, 2], true).unwrap(), "The");
}

#[test]
fn eos_and_chat_template() {
    let m = model();
    assert_eq!(m.eos_token_ids, vec![2]);
    let t = m
        .chat_template
        .as_ref()
        .expect("SmolLM2 GGUF has a chat template");
    let msgs = [
        ChatMessage {
            role: "system".into(),
            content: "You are terse.".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "Hi!".into(),
        },
    ];
    let text = t.render(&msgs, true).unwrap();
    assert_eq!(text, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
    let no_gen = t.render(&msgs, false).unwrap();
    assert!(!no_gen.ends_with("assistant\n"));
    // Without a system message SmolLM2's template inserts its default one.
    let text = t.render(&msgs[1..], true).unwrap();
    assert!(
        text.starts_with("<|im_start|>system\n") && text.contains("SmolLM"),
        "{text}"
    );
    let ids = m.tokenizer.encode(&text, true).unwrap();
    assert_eq!(ids[0], 1);
}
