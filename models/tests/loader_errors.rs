//! Loader error paths and GGUF robustness: tiny GGUF files written here, truncated
//! copies of the real model, random bytes, unsupported types/tokenizers/architectures,
//! and the Q/K permutation round trip.

use pagoda_models::loader::{permute_qk, unpermute_qk};
use pagoda_models::{load_model, LoadedModel, Mat, ModelError};
use proptest::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A metadata value for the tiny GGUF writer.
enum V {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
    F32Arr(Vec<f32>),
}

/// Writes a GGUF v3 file: metadata, then tensors given as (name, dims innermost
/// first, type id, raw bytes).
fn gguf_bytes(kv: &[(&str, V)], tensors: &[(String, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        s(&mut b, k);
        match v {
            V::U32(x) => b.extend(4u32.to_le_bytes().into_iter().chain(x.to_le_bytes())),
            V::F32(x) => b.extend(6u32.to_le_bytes().into_iter().chain(x.to_le_bytes())),
            V::Bool(x) => b.extend(7u32.to_le_bytes().into_iter().chain([*x as u8])),
            V::Str(x) => {
                b.extend(8u32.to_le_bytes());
                s(&mut b, x);
            }
            V::StrArr(xs) => {
                b.extend(
                    9u32.to_le_bytes()
                        .into_iter()
                        .chain(8u32.to_le_bytes())
                        .chain((xs.len() as u64).to_le_bytes()),
                );
                xs.iter().for_each(|x| s(&mut b, x));
            }
            V::I32Arr(xs) => {
                b.extend(
                    9u32.to_le_bytes()
                        .into_iter()
                        .chain(5u32.to_le_bytes())
                        .chain((xs.len() as u64).to_le_bytes()),
                );
                xs.iter().for_each(|x| b.extend(x.to_le_bytes()));
            }
            V::F32Arr(xs) => {
                b.extend(
                    9u32.to_le_bytes()
                        .into_iter()
                        .chain(6u32.to_le_bytes())
                        .chain((xs.len() as u64).to_le_bytes()),
                );
                xs.iter().for_each(|x| b.extend(x.to_le_bytes()));
            }
        }
    }
    let mut offset = 0u64;
    let mut data = Vec::new();
    for (name, dims, ty, bytes) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        data.extend(bytes);
        while data.len() % 32 != 0 {
            data.push(0);
        }
        offset = data.len() as u64;
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(data);
    b
}

/// Options for the tiny llama GGUF.
struct Tiny {
    arch: &'static str,
    /// `llama` gets the SentencePiece vocabulary [`SPM_TOKENS`], anything else the
    /// byte-level BPE one [`TOKENS`].
    tok_model: &'static str,
    /// `tokenizer.ggml.pre`; omitted when empty.
    pre: &'static str,
    q_type: u32,
    /// `rope_freqs.weight`, when given.
    rope_freqs: Option<&'static [f32]>,
    /// SentencePiece `tokenizer.ggml.add_space_prefix`, when given.
    add_space_prefix: Option<bool>,
    /// The hidden size `h` (2 heads of `h / 2`, 1 KV head, ffn `2h`).
    hidden: u64,
    /// The 7 linear layers' type: 0 (F32, values encoding their position) or 13
    /// (Q5_K, blocks from [`q5_k_blocks`]); `q_type` still overrides `attn_q`'s.
    mat_type: u32,
}

const TINY: Tiny = Tiny {
    arch: "llama",
    tok_model: "gpt2",
    pre: "smollm",
    q_type: 0,
    rope_freqs: None,
    add_space_prefix: None,
    hidden: 4,
    mat_type: 0,
};
const TOKENS: [&str; 6] = ["<|end|>", "a", "b", "ab", "Ġ", "Ġab"];
/// A SentencePiece vocabulary: unknown, BOS, EOS, then pieces by falling score.
const SPM_TOKENS: [&str; 6] = ["<unk>", "<s>", "</s>", "▁", "a", "▁a"];

/// Q5_K blocks for `rows` rows of `cols` (whole blocks of 256): bytes from a seeded
/// xorshift, with finite f16 `d` and `dmin` (both signs).
fn q5_k_blocks(rows: u64, cols: u64, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut b: Vec<u8> = (0..rows * cols / 256 * 176).map(|_| next() as u8).collect();
    for blk in b.chunks_exact_mut(176) {
        for o in [0, 2] {
            let v = (next() % 2001) as f32 / 1000.0 - 1.0;
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    b
}

/// A 1-layer llama (by default hidden 4, 2 heads of dim 2, 1 KV head, ffn 8) with F32
/// weights whose values encode their position, so the loaded weights can be checked
/// exactly.
fn tiny_gguf(o: &Tiny) -> Vec<u8> {
    let (h, ffn) = (o.hidden, 2 * o.hidden);
    let kv = vec![
        ("general.architecture", V::Str(o.arch.into())),
        ("general.alignment", V::U32(32)),
        ("llama.block_count", V::U32(1)),
        ("llama.embedding_length", V::U32(h as u32)),
        ("llama.feed_forward_length", V::U32(ffn as u32)),
        ("llama.attention.head_count", V::U32(2)),
        ("llama.attention.head_count_kv", V::U32(1)),
        ("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5)),
        ("llama.rope.freq_base", V::F32(10000.0)),
        ("llama.context_length", V::U32(64)),
        ("tokenizer.ggml.model", V::Str(o.tok_model.into())),
    ];
    let mut kv = kv;
    if !o.pre.is_empty() {
        kv.push(("tokenizer.ggml.pre", V::Str(o.pre.into())));
    }
    let strs = |t: &[&str]| V::StrArr(t.iter().map(|s| s.to_string()).collect());
    if o.tok_model == "llama" {
        // llama.cpp's defaults fill BOS (1), EOS (2), add_bos (true).
        kv.extend([
            ("tokenizer.ggml.tokens", strs(&SPM_TOKENS)),
            (
                "tokenizer.ggml.token_type",
                V::I32Arr(vec![2, 3, 3, 1, 1, 1]),
            ),
            (
                "tokenizer.ggml.scores",
                V::F32Arr(vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0]),
            ),
            ("tokenizer.ggml.unknown_token_id", V::U32(0)),
        ]);
        if let Some(p) = o.add_space_prefix {
            kv.push(("tokenizer.ggml.add_space_prefix", V::Bool(p)));
        }
    } else {
        kv.extend([
            ("tokenizer.ggml.tokens", strs(&TOKENS)),
            (
                "tokenizer.ggml.token_type",
                V::I32Arr(vec![3, 1, 1, 1, 1, 1]),
            ),
            (
                "tokenizer.ggml.merges",
                V::StrArr(vec!["a b".into(), "Ġ ab".into()]),
            ),
            ("tokenizer.ggml.eos_token_id", V::U32(0)),
            ("tokenizer.ggml.add_bos_token", V::Bool(false)),
        ]);
    }
    let f32s = |n: usize, base: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (base + i as f32).to_le_bytes())
            .collect()
    };
    let hn = h as usize;
    let mut t = vec![(
        "token_embd.weight".to_string(),
        vec![h, 6],
        0,
        f32s(6 * hn, 0.0),
    )];
    t.push(("blk.0.attn_norm.weight".into(), vec![h], 0, f32s(hn, 1.0)));
    t.push(("blk.0.ffn_norm.weight".into(), vec![h], 0, f32s(hn, 2.0)));
    for (i, (n, c, r)) in tiny_mats(o).into_iter().enumerate() {
        let ty = if n == "attn_q" { o.q_type } else { o.mat_type };
        let data = if ty == 13 {
            q5_k_blocks(r, c, i as u64)
        } else {
            f32s((c * r) as usize, 100.0 * i as f32)
        };
        t.push((format!("blk.0.{n}.weight"), vec![c, r], ty, data));
    }
    t.push(("output_norm.weight".into(), vec![h], 0, f32s(hn, 3.0)));
    if let Some(f) = o.rope_freqs {
        let bytes = f.iter().flat_map(|x| x.to_le_bytes()).collect();
        t.push(("rope_freqs.weight".into(), vec![f.len() as u64], 0, bytes));
    }
    gguf_bytes(&kv, &t)
}

/// The tiny model's linear layers in file order: (name, columns, rows).
fn tiny_mats(o: &Tiny) -> [(&'static str, u64, u64); 7] {
    let (h, ffn) = (o.hidden, 2 * o.hidden);
    [
        ("attn_q", h, h),
        ("attn_k", h, h / 2),
        ("attn_v", h, h / 2),
        ("attn_output", h, h),
        ("ffn_gate", h, ffn),
        ("ffn_up", h, ffn),
        ("ffn_down", ffn, h),
    ]
}

fn write_tmp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

fn load_bytes(bytes: &[u8]) -> Result<LoadedModel, ModelError> {
    let dir = tempfile::tempdir().unwrap();
    load_model(&write_tmp(dir.path(), "m.gguf", bytes))
}

#[test]
fn tiny_gguf_loads_exactly() {
    let m = load_bytes(&tiny_gguf(&TINY)).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim
        ),
        (6, 4, 2, 1, 2)
    );
    assert!(c.tie_word_embeddings && m.weights.lm_head.is_none());
    assert_eq!(m.weights.embed.row(5), &[20.0, 21.0, 22.0, 23.0]);
    let l = &m.weights.layers[0];
    assert_eq!(l.attn_norm, vec![1.0, 2.0, 3.0, 4.0]);
    // attn_v is stored as-is: row r holds 200 + 4r ..
    assert_eq!(l.wv.row(1), &[204.0, 205.0, 206.0, 207.0]);
    // head_dim 2: the permutation swaps nothing ([n, 1, 2] -> [n, 2, 1] keeps order).
    assert_eq!(l.wq.row(1), &[4.0, 5.0, 6.0, 7.0]);
    assert_eq!((l.w_down.rows, l.w_down.cols), (4, 8));
    assert_eq!(m.eos_token_ids, vec![0]);
    assert_eq!(m.tokenizer.encode("ab ab", false).unwrap(), vec![3, 5]);
    assert_eq!(m.tokenizer.encode("<|end|>", false).unwrap(), vec![0]);
    assert!(m.tokenizer.is_special(0));
}

/// A GGUF whose linear layers are Q5_K (a Q5_K_M file's type) loads them as their
/// blocks, no f32 copy, with the dequantizer's values, and `--dtype auto` holds
/// and runs them as Q5_K.
#[test]
fn q5_k_matrices_load_as_stored() {
    use pagoda_kernels::{QuantFormat, QuantMatrix};
    use pagoda_models::dequant::dequantize_reference;
    let o = Tiny {
        hidden: 256,
        mat_type: 13,
        q_type: 13,
        ..TINY
    };
    let m = load_bytes(&tiny_gguf(&o)).unwrap();
    let l = &m.weights.layers[0];
    let mats = [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down];
    for (i, (mat, (name, cols, rows))) in mats.into_iter().zip(tiny_mats(&o)).enumerate() {
        let (r, c) = (rows as usize, cols as usize);
        assert!(mat.has_shape(r, c) && mat.data.is_empty(), "{name}");
        let q = mat.quant.as_ref().expect("Q5_K blocks held as stored");
        assert_eq!(q.format, QuantFormat::Q5K, "{name}");
        // Q and K rows are unpermuted at load; the others are the file's bytes.
        if !matches!(name, "attn_q" | "attn_k") {
            assert_eq!(q.bytes, q5_k_blocks(rows, cols, i as u64), "{name}");
        }
        let want = dequantize_reference(name, 13, &q.bytes, r * c).unwrap();
        assert_eq!(*mat.values().unwrap(), want[..], "{name}");
        let packed = QuantMatrix::from_gguf(q.format, &q.bytes, r, c).unwrap();
        assert_eq!(packed.dequantize(), want, "{name}");
    }
    let model = pagoda_models::Llama::new_with_dtype(
        m.config,
        m.weights,
        pagoda_models::WeightDtype::Native,
    )
    .unwrap();
    let summary = model.weight_summary();
    assert!(
        summary.iter().any(|(kind, _)| kind.starts_with("Q5_K ")),
        "{summary:?}"
    );
}

#[test]
fn unsupported_tensor_type_is_named() {
    for (ty, name) in [(99u32, "99"), (40, "40")] {
        match load_bytes(&tiny_gguf(&Tiny { q_type: ty, ..TINY })) {
            Err(ModelError::UnsupportedTensorType { tensor, ggml_type }) => {
                assert_eq!(tensor, "blk.0.attn_q.weight");
                assert!(ggml_type.contains(name), "{ggml_type}");
            }
            other => panic!(
                "expected UnsupportedTensorType, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}

#[test]
fn unsupported_tokenizer_and_architecture() {
    for (o, needle) in [
        (
            Tiny {
                pre: "mystery-pre",
                ..TINY
            },
            "mystery-pre",
        ),
        (
            Tiny {
                tok_model: "t5",
                ..TINY
            },
            "t5",
        ),
    ] {
        match load_bytes(&tiny_gguf(&o)) {
            Err(ModelError::UnsupportedTokenizer { reason }) => {
                assert!(reason.contains(needle), "{reason}")
            }
            other => panic!("expected UnsupportedTokenizer, got {:?}", other.map(|_| ())),
        }
    }
    match load_bytes(&tiny_gguf(&Tiny {
        arch: "gptneox",
        ..TINY
    })) {
        Err(ModelError::UnsupportedArchitecture { arch }) => assert_eq!(arch, "gptneox"),
        other => panic!(
            "expected UnsupportedArchitecture, got {:?}",
            other.map(|_| ())
        ),
    }
}

/// A GGUF SentencePiece (`llama`) vocabulary: merges by score, the dummy prefix
/// (llama.cpp's default: on; `add_space_prefix = false` turns it off), BOS added by
/// default, special tokens cut out of the text, the unknown token for characters no
/// piece covers (no byte tokens here), and decoding back.
#[test]
fn sentencepiece_vocab_from_gguf() {
    let m = load_bytes(&tiny_gguf(&Tiny {
        tok_model: "llama",
        pre: "default",
        ..TINY
    }))
    .unwrap();
    let t = &m.tokenizer;
    assert_eq!((t.bos_token_id(), t.add_bos()), (Some(1), true));
    assert_eq!(t.encode("a a", true).unwrap(), vec![1, 5, 5]);
    assert_eq!(t.encode(" a", false).unwrap(), vec![3, 5]);
    assert_eq!(t.encode("a</s>a", false).unwrap(), vec![5, 2, 5]);
    assert_eq!(t.encode("aba", false).unwrap(), vec![5, 0, 4]);
    assert_eq!(t.decode(&[1, 5, 5], true).unwrap(), "a a");
    assert_eq!(t.decode(&[1, 5, 5], false).unwrap(), "<s> a a");
    assert!(t.is_special(1) && t.is_special(0) && !t.is_special(5));
    // The HF tokenizer built for decoding encodes alike here.
    let hf = t.hf().encode("a a", true).unwrap();
    assert_eq!(hf.get_ids(), &[1, 5, 5]);
    let m = load_bytes(&tiny_gguf(&Tiny {
        tok_model: "llama",
        pre: "",
        add_space_prefix: Some(false),
        ..TINY
    }))
    .unwrap();
    assert_eq!(m.tokenizer.encode("a a", false).unwrap(), vec![4, 5]);
    assert_eq!(m.tokenizer.decode(&[4, 5], true).unwrap(), "a a");
}

/// llama.cpp's `default` BPE pre-tokenizer, named or implied by a missing
/// `tokenizer.ggml.pre`: punctuation runs split off first, then the GPT-2 split.
#[test]
fn default_bpe_pre_tokenizer_from_gguf() {
    for pre in ["default", ""] {
        let m = load_bytes(&tiny_gguf(&Tiny { pre, ..TINY })).unwrap();
        // "ab ab": Ġab after "ab" as with the other splits.
        assert_eq!(m.tokenizer.encode("ab ab", false).unwrap(), vec![3, 5]);
    }
}

/// `rope_freqs.weight` (Llama 3.1's scaling as GGUF stores it) becomes the config's
/// per-frequency divisors; a wrong shape or a non-positive factor is refused.
#[test]
fn rope_freqs_tensor_is_loaded() {
    let m = load_bytes(&tiny_gguf(&Tiny {
        rope_freqs: Some(&[4.0]),
        ..TINY
    }))
    .unwrap();
    assert_eq!(m.config.rope_freq_factors, Some(vec![4.0]));
    assert_eq!(
        load_bytes(&tiny_gguf(&TINY))
            .unwrap()
            .config
            .rope_freq_factors,
        None
    );
    match load_bytes(&tiny_gguf(&Tiny {
        rope_freqs: Some(&[1.0, 2.0]),
        ..TINY
    })) {
        Err(ModelError::TensorShape { name, .. }) => assert_eq!(name, "rope_freqs.weight"),
        other => panic!("expected TensorShape, got {:?}", other.map(|_| ())),
    }
    match load_bytes(&tiny_gguf(&Tiny {
        rope_freqs: Some(&[0.0]),
        ..TINY
    })) {
        Err(ModelError::Metadata { key, .. }) => assert_eq!(key, "rope_freqs.weight"),
        other => panic!("expected Metadata, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn not_found_and_unknown_format() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        load_model(&dir.path().join("nope.gguf")),
        Err(ModelError::NotFound { .. })
    ));
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    for (name, bytes) in [
        ("random.bin", &random[..]),
        ("empty.gguf", &[][..]),
        ("abc", b"GGU"),
    ] {
        let p = write_tmp(dir.path(), name, bytes);
        assert!(
            matches!(load_model(&p), Err(ModelError::UnknownFormat { .. })),
            "{name}"
        );
    }
    // A directory without config.json is not a model either.
    assert!(matches!(
        load_model(dir.path()),
        Err(ModelError::UnknownFormat { .. })
    ));
}

#[test]
fn truncated_real_model_is_corrupt() {
    let path = std::env::var_os("PAGODA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap())
                .join(".cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    let full =
        std::fs::read(&path).unwrap_or_else(|e| panic!("real model at {}: {e}", path.display()));
    let dir = tempfile::tempdir().unwrap();
    for n in [
        4,
        8,
        23,
        100,
        5_000,
        1_000_000,
        2_000_000,
        full.len() / 2,
        full.len() - 1,
    ] {
        let p = write_tmp(dir.path(), "cut.gguf", &full[..n]);
        match load_model(&p) {
            Err(ModelError::CorruptGguf { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!(
                "first {n} bytes: expected CorruptGguf, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}

#[test]
fn absurd_counts_are_corrupt_not_allocations() {
    let mut b = tiny_gguf(&TINY);
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    assert!(matches!(
        load_bytes(&b),
        Err(ModelError::CorruptGguf { .. })
    ));
    let mut b = tiny_gguf(&TINY);
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes()); // tensor count
    assert!(matches!(
        load_bytes(&b),
        Err(ModelError::CorruptGguf { .. })
    ));
    let mut b = tiny_gguf(&TINY);
    b[4..8].copy_from_slice(&7u32.to_le_bytes()); // version
    assert!(matches!(
        load_bytes(&b),
        Err(ModelError::CorruptGguf { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any single corrupted byte or truncation of a valid file gives Ok or an error, never
    /// a panic.
    #[test]
    fn damaged_tiny_files_never_panic(pos in 0usize..2000, byte in any::<u8>(), cut in 0usize..2000) {
        let mut b = tiny_gguf(&TINY);
        let pos = pos % b.len();
        b[pos] = byte;
        b.truncate(cut.max(4).min(b.len()));
        let _ = load_bytes(&b);
    }

    /// Undoing llama.cpp's Q/K permutation inverts it, and matches the index formula
    /// hf[h][p * hd/2 + i] = gguf[h][2i + p].
    #[test]
    fn qk_permutation_round_trip(n_heads in 1usize..5, half in 1usize..9, cols in 1usize..5) {
        let hd = 2 * half;
        let rows = n_heads * hd;
        let hf = Mat::new(rows, cols, (0..rows * cols).map(|x| x as f32).collect());
        let gguf = permute_qk(&hf, n_heads).unwrap();
        for h in 0..n_heads {
            for i in 0..half {
                for p in 0..2 {
                    prop_assert_eq!(hf.row(h * hd + p * half + i), gguf.row(h * hd + 2 * i + p));
                }
            }
        }
        prop_assert_eq!(unpermute_qk(&gguf, n_heads).unwrap(), hf);
    }
}

#[test]
fn qk_permutation_rejects_bad_shapes() {
    let m = Mat::new(6, 1, vec![0.0; 6]);
    assert!(unpermute_qk(&m, 4).is_err()); // 6 rows are not 4 heads
    assert!(unpermute_qk(&m, 2).is_err()); // head dim 3 is odd
    assert!(unpermute_qk(&m, 0).is_err());
}
