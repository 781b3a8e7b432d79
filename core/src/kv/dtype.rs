//! The KV cache's element type as `--kv-cache-dtype` chooses it ([`KvCacheDtype`]),
//! with the list of values the flag accepts ([`KvCacheDtype::VALID`]).
//!
//! A leaf: it names only [`DType`], so that [`CoreError`](crate::CoreError), whose
//! message for a bad `--kv-cache-dtype` lists the valid values, can name it without a
//! cycle (error -> here, never back). Parsing the flag fails with a `CoreError`, so
//! that `FromStr` impl lives one level up, in the kv module.

use crate::tensor::DType;
use std::fmt;

/// vLLM's `--kv-cache-dtype`: `auto` (the model's compute dtype) or a fixed
/// element type for the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// vLLM's default: the cache takes the model's compute dtype
    /// ([`KvCacheDtype::resolve`]); on the CPU that is f32, whatever `--dtype` the
    /// weights have (bf16 and quantized weights compute in f32).
    #[default]
    Auto,
    /// This element type, whatever the model computes in.
    Fixed(DType),
}

impl KvCacheDtype {
    /// The values `--kv-cache-dtype` accepts, with their aliases, for messages.
    pub const VALID: &'static str = "auto, bfloat16 (bf16), float16 (fp16, f16, half), \
         float32 (fp32, f32, float), fp8 (fp8_e4m3)";

    /// The pools' element type for a model that computes in `compute`.
    pub fn resolve(self, compute: DType) -> DType {
        match self {
            KvCacheDtype::Auto => compute,
            KvCacheDtype::Fixed(d) => d,
        }
    }
}

impl fmt::Display for KvCacheDtype {
    /// vLLM's spelling (`auto`, `bfloat16`), Pagoda's for the others.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fixed(DType::BF16) => "bfloat16",
            KvCacheDtype::Fixed(DType::F16) => "float16",
            KvCacheDtype::Fixed(DType::F32) => "float32",
            KvCacheDtype::Fixed(DType::F8E4M3) => "fp8_e4m3",
        })
    }
}
