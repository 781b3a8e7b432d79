//! The text tokenizer: a thin wrapper over HF `tokenizers`, built either from a
//! `tokenizer.json` or from the vocabulary stored in GGUF metadata.
//!
//! From GGUF two vocabularies are supported:
//! * byte-level BPE (`tokenizer.ggml.model == "gpt2"`), with the pre-tokenizers whose
//!   regexes we know exactly (`smollm`, `llama-bpe`, `qwen2`, `gpt-2`, and llama.cpp's
//!   `default`, also used when `tokenizer.ggml.pre` is missing); another `pre` is
//!   rejected by name rather than tokenized wrongly;
//! * SentencePiece BPE (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral, Gemma),
//!   encoded by [`crate::spm`] exactly as sentencepiece does (merges by piece score,
//!   byte fallback, the dummy prefix of `tokenizer.ggml.add_space_prefix`; llama.cpp
//!   encodes alike except around user-defined pieces);
//!   an HF tokenizer in the layout of those models' `tokenizer.json` (BPE with merges
//!   ranked by score, `byte_fallback`, `▁` normalizer, the matching decoder) is built
//!   next to it for decoding and for [`Tokenizer::hf`].
//!
//! Other GGUF tokenizer models (`bert`, `t5`, `rwkv`, ...) are rejected by name.

use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::spm::{token_type, SpmFlags, SpmVocab};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// GGUF token type of control (special) tokens.
const TOKEN_TYPE_CONTROL: i64 = token_type::CONTROL;
/// GGUF token type of user-defined added tokens.
const TOKEN_TYPE_USER_DEFINED: i64 = token_type::USER_DEFINED;

/// Qwen2's split regex (HF `tokenizer.json` of Qwen2/2.5/3): Llama 3's, but digits
/// one by one.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's pre-tokenizer split regex (HF `tokenizer.json` of Meta-Llama-3).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's `default` BPE pre-tokenizer (`LLAMA_VOCAB_PRE_TYPE_DEFAULT` in
/// `llama-vocab.cpp`), for GGUF byte-level vocabularies with `tokenizer.ggml.pre =
/// "default"` or none: these four regexes, each splitting the pieces the previous
/// one left (matches and the text between them both become pieces, which is HF's
/// `Split` with `Isolated`), then the GPT-2 byte mapping. The second is the GPT-2
/// regex without its final `|\s+`: a whitespace character it leaves unmatched is
/// a piece of its own either way, so the two split alike (llama.cpp's hand-written
/// matcher for it, `unicode_regex_split_custom_gpt2`, takes that `\s+` branch).
const DEFAULT_REGEXES: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// A tokenizer plus the special-token facts the engine needs.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The exact encoder of a GGUF SentencePiece vocabulary; `inner` then only decodes
    /// (and encodes for callers of [`Tokenizer::hf`]).
    spm: Option<Arc<SpmVocab>>,
    special: HashSet<u32>,
    bos: Option<u32>,
    add_bos: bool,
    /// No real vocabulary ([`Tokenizer::ids_only`]): text cannot be encoded.
    ids_only: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("sentencepiece", &self.spm.is_some())
            .field("bos", &self.bos)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer {
        message: e.to_string(),
    }
}

fn meta_err(key: &str, reason: &str) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

impl Tokenizer {
    /// Wraps an HF tokenizer. `bos` and `add_bos` are informational: BOS insertion is
    /// the tokenizer's post-processor's job.
    pub fn from_hf(inner: tokenizers::Tokenizer, bos: Option<u32>, add_bos: bool) -> Self {
        let special = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        Tokenizer {
            inner,
            spm: None,
            special,
            bos,
            add_bos,
            ids_only: false,
        }
    }

    /// Loads a `tokenizer.json`. BOS facts are unknown here (see [`Tokenizer::with_bos`]).
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        if !path.exists() {
            return Err(ModelError::NotFound {
                path: path.to_path_buf(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer {
            message: format!("{}: {e}", path.display()),
        })?;
        Ok(Self::from_hf(inner, None, false))
    }

    /// Sets the BOS facts (from `tokenizer_config.json` or `config.json`).
    pub fn with_bos(mut self, bos: Option<u32>, add_bos: bool) -> Self {
        self.bos = bos;
        self.add_bos = add_bos;
        self
    }

    /// Builds the tokenizer stored in GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(meta: &GgufFile) -> Result<Self, ModelError> {
        let model = meta
            .get("tokenizer.ggml.model")
            .and_then(|v| v.as_str())
            .ok_or_else(|| meta_err("tokenizer.ggml.model", "missing"))?;
        let (json, spm, add_bos, bos) = match model {
            "gpt2" => {
                let (json, add_bos, bos) = gguf_bpe_json(meta)?;
                (json, None, add_bos, bos)
            }
            "llama" => {
                let (json, spm) = gguf_spm(meta)?;
                let (add_bos, bos) = (spm.add_bos(), spm.bos());
                (json, Some(Arc::new(spm)), add_bos, bos)
            }
            other => {
                return Err(ModelError::UnsupportedTokenizer {
                    reason: format!(
                        "GGUF tokenizer model `{other}` (supported: gpt2 byte-level BPE, \
                         llama SentencePiece BPE)"
                    ),
                })
            }
        };
        let bytes = serde_json::to_vec(&json).map_err(tok_err)?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(tok_err)?;
        let mut t = Self::from_hf(inner, bos, add_bos);
        t.spm = spm;
        Ok(t)
    }

    /// A stand-in for a model without a tokenizer (`--load-format dummy` with no
    /// `tokenizer.json`), as vLLM's `skip_tokenizer_init`: token-id prompts only.
    /// [`Tokenizer::encode`] refuses text with [`ModelError::NoTokenizer`]; token `i`
    /// decodes to the placeholder `[i]`, so outputs stay readable ids.
    pub fn ids_only(vocab_size: usize) -> Result<Self, ModelError> {
        let vocab: serde_json::Map<String, Value> = (0..vocab_size)
            .map(|i| (format!("[{i}]"), json!(i)))
            .collect();
        let doc = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[0]"},
        });
        let bytes = serde_json::to_vec(&doc).map_err(tok_err)?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(tok_err)?;
        let mut t = Self::from_hf(inner, None, false);
        t.ids_only = true;
        Ok(t)
    }

    /// Whether this is [`Tokenizer::ids_only`]'s stand-in (no text encoding).
    pub fn is_ids_only(&self) -> bool {
        self.ids_only
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        if self.ids_only {
            return Err(ModelError::NoTokenizer {
                chars: text.chars().count(),
            });
        }
        if let Some(spm) = &self.spm {
            return spm.encode(text, add_special_tokens).map_err(tok_err);
        }
        Ok(self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// The wrapped HF tokenizer (e.g. for incremental decoding with `decode_stream`).
    /// For a GGUF SentencePiece vocabulary its encoding is HF's BPE with merges ranked
    /// by score, which can differ from [`Tokenizer::encode`] in rare tie cases and
    /// after user-defined pieces (see [`crate::spm`]).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// Whether encoding with special tokens prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
}

/// The HF pre-tokenizer JSON for a GGUF `tokenizer.ggml.pre` value.
fn pre_tokenizer_for(pre: &str) -> Result<Value, ModelError> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    Ok(match pre {
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]}),
        "gpt-2" => byte_level(true),
        "llama-bpe" | "llama3" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]}),
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]}),
        "default" => {
            let mut seq: Vec<Value> = DEFAULT_REGEXES
                .iter()
                .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
                .collect();
            seq.push(byte_level(false));
            json!({"type": "Sequence", "pretokenizers": seq})
        }
        other => {
            return Err(ModelError::UnsupportedTokenizer {
                reason: format!(
                    "GGUF pre-tokenizer `{other}` (supported: smollm, llama-bpe, qwen2, gpt-2, default)"
                ),
            })
        }
    })
}

/// `tokenizer.ggml.tokens` as strings.
fn gguf_tokens(meta: &GgufFile) -> Result<Vec<String>, ModelError> {
    meta.get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "missing or not an array"))?
        .iter()
        .map(|t| {
            t.as_str()
                .map(str::to_string)
                .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "non-string token"))
        })
        .collect()
}

/// `tokenizer.ggml.token_type` (normal where missing, as llama.cpp).
fn gguf_token_types(meta: &GgufFile, n: usize) -> Vec<i64> {
    let mut types: Vec<i64> = match meta
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
    {
        Some(a) => a
            .iter()
            .map(|v| v.as_f64().map(|x| x as i64).unwrap_or(token_type::NORMAL))
            .collect(),
        None => Vec::new(),
    };
    types.resize(n, token_type::NORMAL);
    types
}

/// A token id key: `None` when absent, an error when out of range.
fn gguf_token_id(meta: &GgufFile, key: &str, n: usize) -> Result<Option<u32>, ModelError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if (id as usize) < n => Ok(Some(id as u32)),
            _ => Err(meta_err(key, "not a valid token id")),
        },
    }
}

/// HF `TemplateProcessing` that puts `bos` before and `eos` after each sequence
/// (`null` when neither is added).
fn template_processing(bos: Option<(u32, &str)>, eos: Option<(u32, &str)>) -> Value {
    if bos.is_none() && eos.is_none() {
        return Value::Null;
    }
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let seq = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
    let wrap = |s: &str, type_id: u32| {
        let mut v = Vec::new();
        if let Some((_, t)) = bos {
            v.push(special(t, type_id));
        }
        v.push(seq(s, type_id));
        if let Some((_, t)) = eos {
            v.push(special(t, type_id));
        }
        v
    };
    let mut pair = wrap("A", 0);
    pair.extend(wrap("B", 1));
    let mut specials = serde_json::Map::new();
    for (id, t) in bos.into_iter().chain(eos) {
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({
        "type": "TemplateProcessing",
        "single": wrap("A", 0),
        "pair": pair,
        "special_tokens": specials,
    })
}

/// The SentencePiece encoder of a GGUF `llama` vocabulary, and the HF
/// `tokenizer.json` equivalent (the layout of Llama 2 / Mistral / Gemma
/// `tokenizer.json` files: legacy `▁` normalizer, BPE with byte fallback and merges
/// ranked by piece score, the SentencePiece decoder).
///
/// Defaults where a key is missing are llama.cpp's for this model: BOS 1, EOS 2,
/// `add_bos_token` true, `add_eos_token` false, `add_space_prefix` true, scores 0.
/// `tokenizer.ggml.pre` means nothing here (converters write `default`) and
/// `remove_extra_whitespaces` is ignored, as llama.cpp ignores both for this model.
fn gguf_spm(meta: &GgufFile) -> Result<(Value, SpmVocab), ModelError> {
    let tokens = gguf_tokens(meta)?;
    let n = tokens.len();
    let types = gguf_token_types(meta, n);
    let scores: Vec<f32> = match meta.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
        Some(a) if a.len() == n => a
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| meta_err("tokenizer.ggml.scores", "non-numeric score"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(meta_err("tokenizer.ggml.scores", "not one score per token")),
        None => vec![0.0; n],
    };
    let flag =
        |key: &str, default: bool| meta.get(key).and_then(|v| v.as_bool()).unwrap_or(default);
    let default_id = |id: u32| ((id as usize) < n).then_some(id);
    let bos = gguf_token_id(meta, "tokenizer.ggml.bos_token_id", n)?.or(default_id(1));
    let eos = gguf_token_id(meta, "tokenizer.ggml.eos_token_id", n)?.or(default_id(2));
    let unk = gguf_token_id(meta, "tokenizer.ggml.unknown_token_id", n)?.or_else(|| {
        types
            .iter()
            .position(|&t| t == token_type::UNKNOWN)
            .map(|i| i as u32)
    });
    let flags = SpmFlags {
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix", true),
        unk,
        bos,
        add_bos: flag("tokenizer.ggml.add_bos_token", true) && bos.is_some(),
        eos,
        add_eos: flag("tokenizer.ggml.add_eos_token", false) && eos.is_some(),
    };

    let mut vocab = serde_json::Map::with_capacity(n);
    let mut added = Vec::new();
    let mut has_bytes = false;
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(tok.clone(), json!(id));
        has_bytes |= ty == token_type::BYTE;
        if matches!(
            ty,
            token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN
        ) {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty != token_type::USER_DEFINED,
            }));
        }
    }
    // Merges as transformers' SentencePiece converter ranks them: every split of a
    // normal piece into two normal pieces, by the piece's score (high first), then id.
    let normal: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types[*i] == token_type::NORMAL)
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f32, usize, &str, &str)> = Vec::new();
    for (&piece, &id) in &normal {
        for (k, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(k);
            if normal.contains_key(l) && normal.contains_key(r) {
                ranked.push((scores[id], id, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)));
    let merges: Vec<Value> = ranked.iter().map(|m| json!([m.2, m.3])).collect();

    let tok_of =
        |id: Option<u32>, on: bool| id.filter(|_| on).map(|i| (i, tokens[i as usize].as_str()));
    let post_processor = template_processing(
        tok_of(flags.bos, flags.add_bos),
        tok_of(flags.eos, flags.add_eos),
    );
    let mut normalizers = Vec::new();
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if flags.add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null,
            "unk_token": unk.map(|u| tokens[u as usize].clone()),
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": has_bytes, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    Ok((json, SpmVocab::new(tokens, scores, types, flags)))
}

/// Builds the `tokenizer.json` equivalent of a GGUF byte-level BPE (`gpt2`)
/// vocabulary; also returns (add_bos, bos id).
fn gguf_bpe_json(meta: &GgufFile) -> Result<(Value, bool, Option<u32>), ModelError> {
    // A missing `pre` is llama.cpp's `default` split (it warns that the file predates
    // pre-tokenizer names and the model's own split may differ): do what it does.
    let pre = match meta.get("tokenizer.ggml.pre").and_then(|v| v.as_str()) {
        Some(p) => p,
        None => {
            tracing::warn!(
                "GGUF has no tokenizer.ggml.pre: using llama.cpp's `default` pre-tokenizer, \
                 as llama.cpp does (the model's own may differ; reconvert the file)"
            );
            "default"
        }
    };
    let pre_tokenizer = pre_tokenizer_for(pre)?;
    // Llama 3 keeps whole words that are in the vocabulary without applying merges.
    let ignore_merges = matches!(pre, "llama-bpe" | "llama3");

    let tokens = gguf_tokens(meta)?;
    let types = gguf_token_types(meta, tokens.len());
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(tok.clone(), json!(id));
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
            }));
        }
    }
    let merges: Vec<Value> = match meta.get("tokenizer.ggml.merges").and_then(|v| v.as_array()) {
        Some(a) => a
            .iter()
            .map(|m| {
                let s = m.as_str().and_then(|s| s.split_once(' '));
                s.map(|(a, b)| json!([a, b]))
                    .ok_or_else(|| meta_err("tokenizer.ggml.merges", "merge is not `a b`"))
            })
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let bos = gguf_token_id(meta, "tokenizer.ggml.bos_token_id", tokens.len())?;
    // Without the key we do not add BOS: raw prompts stay exactly as the user wrote them.
    let add_bos = meta
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
        && bos.is_some();
    let post_processor = template_processing(
        bos.filter(|_| add_bos)
            .map(|b| (b, tokens[b as usize].as_str())),
        None,
    );
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges,
        },
    });
    Ok((json, add_bos, bos))
}
