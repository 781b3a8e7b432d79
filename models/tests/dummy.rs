//! `--load-format dummy`: random weights of a config's shapes, deterministic per
//! seed, in vLLM's range with unit norms; the fixtures parse; the ids-only tokenizer.

use pagoda_models::dummy::{dummy_config_path, DUMMY_RANGE};
use pagoda_models::hf::read_config_file;
use pagoda_models::{dummy_layer, dummy_weights, load_dummy, LoadFormat, Mat, ModelError};
use std::path::PathBuf;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
}

fn shape(m: &Mat) -> (usize, usize) {
    assert_eq!(m.data.len(), m.rows * m.cols);
    (m.rows, m.cols)
}

#[test]
fn weights_have_the_configs_shapes() {
    let (c, _) = read_config_file(&data("tiny-dummy/config.json")).unwrap();
    let w = dummy_weights(&c, 7).unwrap();
    let (v, h, i) = (c.vocab_size, c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    assert_eq!(shape(&w.embed), (v, h));
    assert_eq!(shape(w.lm_head.as_ref().unwrap()), (v, h));
    assert_eq!(w.norm, vec![1.0; h]);
    assert_eq!(w.layers.len(), c.num_layers);
    for l in &w.layers {
        assert_eq!(shape(&l.wq), (q, h));
        assert_eq!(shape(&l.wk), (kv, h));
        assert_eq!(shape(&l.wv), (kv, h));
        assert_eq!(shape(&l.wo), (h, q));
        assert_eq!(shape(&l.w_gate), (i, h));
        assert_eq!(shape(&l.w_up), (i, h));
        assert_eq!(shape(&l.w_down), (h, i));
        assert!(l.attn_norm.iter().chain(&l.ffn_norm).all(|&x| x == 1.0));
        assert!(l.extra.q_bias.is_none() && l.extra.moe.is_none());
    }
    // Values in vLLM's range, spread over it (not constant, both signs).
    let all: Vec<f32> = w
        .embed
        .data
        .iter()
        .chain(&w.layers[1].w_down.data)
        .copied()
        .collect();
    assert!(all.iter().all(|x| x.abs() <= DUMMY_RANGE));
    let mean = all.iter().map(|&x| f64::from(x)).sum::<f64>() / all.len() as f64;
    assert!(mean.abs() < 2e-5, "mean {mean}");
    let max = all.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max > 0.99 * DUMMY_RANGE, "max {max}");
    // A tied config has no separate LM head.
    let mut tied = c.clone();
    tied.tie_word_embeddings = true;
    assert!(dummy_weights(&tied, 7).unwrap().lm_head.is_none());
}

#[test]
fn deterministic_per_seed_and_per_layer() {
    let (c, _) = read_config_file(&data("tiny-dummy/config.json")).unwrap();
    let a = dummy_weights(&c, 1).unwrap();
    let b = dummy_weights(&c, 1).unwrap();
    let other = dummy_weights(&c, 2).unwrap();
    assert_eq!(a.embed, b.embed);
    assert_eq!(a.layers[1].wq, b.layers[1].wq);
    assert_ne!(a.embed, other.embed);
    assert_ne!(a.layers[1].wq, other.layers[1].wq);
    // Every tensor its own stream: no two tensors alike, no layer alike another.
    assert_ne!(a.layers[0].wk.data, a.layers[0].wv.data);
    assert_ne!(a.layers[0].wq, a.layers[1].wq);
    assert_ne!(a.embed.data, a.lm_head.as_ref().unwrap().data);
    // A layer alone is the same layer (lazy generation gives the same model).
    let l1 = dummy_layer(&c, 1, 1);
    assert_eq!(l1.w_gate, a.layers[1].w_gate);
    assert_eq!(l1.w_down, a.layers[1].w_down);
}

#[test]
fn family_extras_are_generated() {
    // Qwen2's Q/K/V biases in range; Mixtral's experts replace the dense MLP.
    let (q, _) = read_config_file(&data("families/qwen2/config.json")).unwrap();
    let l = dummy_layer(&q, 0, 0);
    let qb = l.extra.q_bias.as_ref().unwrap();
    assert_eq!(qb.len(), q.num_heads * q.head_dim);
    assert!(qb.iter().all(|x| x.abs() <= DUMMY_RANGE) && qb.iter().any(|&x| x != 0.0));
    let (m, _) = read_config_file(&data("families/mixtral/config.json")).unwrap();
    let l = dummy_layer(&m, 0, 0);
    let moe = l.extra.moe.as_ref().unwrap();
    let n = m.arch.moe.unwrap().num_experts;
    assert_eq!(moe.experts.len(), n);
    assert_eq!(shape(&moe.router), (n, m.hidden_size));
    assert_eq!(shape(&l.w_gate), (0, 0));
    assert_ne!(moe.experts[0].w_up, moe.experts[1].w_up);
}

#[test]
fn the_fixtures_have_the_public_shapes() {
    let (c, _) = read_config_file(&data("llama3-8b-shape/config.json")).unwrap();
    assert_eq!(
        (c.num_layers, c.hidden_size, c.intermediate_size),
        (32, 4096, 14336)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (32, 8, 128));
    assert_eq!(c.vocab_size, 128256);
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(c.rope_scaling.unwrap().factor, 8.0);
    assert!(!c.tie_word_embeddings);
    let (s, _) = read_config_file(&data("smollm2-shape/config.json")).unwrap();
    assert_eq!(
        (s.num_layers, s.hidden_size, s.vocab_size),
        (30, 576, 49152)
    );
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (9, 3, 64));
    assert!(s.tie_word_embeddings);
}

#[test]
fn load_dummy_takes_a_file_or_a_directory() {
    let by_dir = load_dummy(&data("tiny-dummy"), 3).unwrap();
    let by_file = LoadFormat::Dummy
        .load(&data("tiny-dummy/config.json"), 3)
        .unwrap();
    assert_eq!(by_dir.weights.embed, by_file.weights.embed);
    assert_eq!(by_dir.eos_token_ids, [2]);
    assert_eq!(by_dir.name, "tiny-dummy");
    assert!(by_dir.chat_template.is_none());
    // No tokenizer.json there: ids only, text refused with the reason.
    let t = &by_dir.tokenizer;
    assert!(t.is_ids_only());
    assert_eq!(t.vocab_size(), by_dir.config.vocab_size);
    assert_eq!(t.decode(&[5, 255], false).unwrap(), "[5][255]");
    let e = t.encode("hello", true).unwrap_err();
    assert!(matches!(e, ModelError::NoTokenizer { chars: 5 }), "{e}");
    assert!(e.to_string().contains("token ids"), "{e}");
    // A directory with a tokenizer.json keeps it (text works).
    let q = load_dummy(&data("families/qwen2"), 0).unwrap();
    assert!(!q.tokenizer.is_ids_only());
    assert!(!q.tokenizer.encode("hello", false).unwrap().is_empty());
    // Missing config: NotFound naming config.json.
    let e = dummy_config_path(&data("no-such-dir")).unwrap_err();
    assert!(matches!(e, ModelError::NotFound { .. }), "{e}");
}

#[test]
fn load_format_values() {
    assert_eq!("auto".parse::<LoadFormat>().unwrap(), LoadFormat::Auto);
    assert_eq!("Dummy".parse::<LoadFormat>().unwrap(), LoadFormat::Dummy);
    let e = "safetensors".parse::<LoadFormat>().unwrap_err().to_string();
    assert!(e.contains("valid values: auto, dummy"), "{e}");
}

/// The cost at Llama-3-8B shapes, measured on one layer and the embedding (the whole
/// model is 32 GB of f32: run it where that fits). `cargo test --release -p
/// pagoda-models --test dummy -- --ignored --nocapture`.
#[test]
#[ignore]
fn eight_b_generation_cost() {
    let (c, _) = read_config_file(&data("llama3-8b-shape/config.json")).unwrap();
    let t = std::time::Instant::now();
    let l = dummy_layer(&c, 0, 0);
    let layer_s = t.elapsed().as_secs_f64();
    let layer_params: usize = [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
        .iter()
        .map(|m| m.data.len())
        .sum();
    drop(l);
    let mut one = c.clone();
    one.num_layers = 1;
    let t = std::time::Instant::now();
    let w = dummy_weights(&one, 0).unwrap();
    let one_s = t.elapsed().as_secs_f64();
    let embed_params = 2 * w.embed.data.len();
    drop(w);
    let total = c.num_layers * layer_params + embed_params;
    let est = (one_s - layer_s) + c.num_layers as f64 * layer_s;
    println!(
        "8B shapes on {} threads: a layer ({:.0} M params) {layer_s:.2} s, embed + LM head \
         ({:.0} M) {:.2} s; whole model {:.2} G params = {:.1} GB f32, est. {est:.1} s",
        rayon::current_num_threads(),
        layer_params as f64 / 1e6,
        embed_params as f64 / 1e6,
        one_s - layer_s,
        total as f64 / 1e9,
        total as f64 * 4.0 / 1e9
    );
}
