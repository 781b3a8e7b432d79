//! The text tokenizer: a thin wrapper over HF `tokenizers`, built either from a
//! `tokenizer.json` or from the vocabulary stored in GGUF metadata.
//!
//! From GGUF only byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is supported, with
//! the pre-tokenizers whose regex we know exactly (`smollm`, `llama-bpe`, `qwen2`, `gpt-2`);
//! anything else is rejected by name rather than tokenized wrongly.

use crate::error::ModelError;
use crate::gguf::GgufFile;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::Path;

/// GGUF token type of control (special) tokens.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined added tokens.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Qwen2's split regex (HF `tokenizer.json` of Qwen2/2.5/3): Llama 3's, but digits
/// one by one.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's pre-tokenizer split regex (HF `tokenizer.json` of Meta-Llama-3).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer plus the special-token facts the engine needs.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: HashSet<u32>,
    bos: Option<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
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
            special,
            bos,
            add_bos,
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
        let json = gguf_tokenizer_json(meta)?;
        let add_bos = json.1;
        let bos = json.2;
        let bytes = serde_json::to_vec(&json.0).map_err(tok_err)?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(tok_err)?;
        Ok(Self::from_hf(inner, bos, add_bos))
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
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
        other => {
            return Err(ModelError::UnsupportedTokenizer {
                reason: format!(
                    "GGUF pre-tokenizer `{other}` (supported: smollm, llama-bpe, qwen2, gpt-2)"
                ),
            })
        }
    })
}

/// Builds the `tokenizer.json` equivalent of GGUF tokenizer metadata; also returns
/// (add_bos, bos id).
fn gguf_tokenizer_json(meta: &GgufFile) -> Result<(Value, bool, Option<u32>), ModelError> {
    let model = meta
        .get("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .ok_or_else(|| meta_err("tokenizer.ggml.model", "missing"))?;
    if model != "gpt2" {
        return Err(ModelError::UnsupportedTokenizer {
            reason: format!("GGUF tokenizer model `{model}` (supported: gpt2 byte-level BPE)"),
        });
    }
    // A missing `pre` means llama.cpp's "default" split, whose regexes differ from HF's
    // byte-level ones: refuse rather than guess.
    let pre = meta
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("(missing)");
    let pre_tokenizer = pre_tokenizer_for(pre)?;
    // Llama 3 keeps whole words that are in the vocabulary without applying merges.
    let ignore_merges = matches!(pre, "llama-bpe" | "llama3");

    let tokens = meta
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "missing or not an array"))?;
    let types: Vec<i64> = match meta
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
    {
        Some(a) => a
            .iter()
            .map(|v| v.as_f64().map(|x| x as i64).unwrap_or(1))
            .collect(),
        None => vec![1; tokens.len()],
    };
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let tok = tok
            .as_str()
            .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "non-string token"))?;
        vocab.insert(tok.to_string(), json!(id));
        let ty = types.get(id).copied().unwrap_or(1);
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
    let id_of = |key: &str| -> Result<Option<u32>, ModelError> {
        match meta.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(id) if (id as usize) < tokens.len() => Ok(Some(id as u32)),
                _ => Err(meta_err(key, "not a valid token id")),
            },
        }
    };
    let bos = id_of("tokenizer.ggml.bos_token_id")?;
    // Without the key we do not add BOS: raw prompts stay exactly as the user wrote them.
    let add_bos = meta
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
        && bos.is_some();
    let post_processor = match (add_bos, bos) {
        (true, Some(b)) => {
            let tok = tokens[b as usize].as_str().unwrap_or_default();
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {tok: {"id": tok, "ids": [b], "tokens": [tok]}},
            })
        }
        _ => Value::Null,
    };
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
