//! The decoder forward pass (`crate::decoder`'s, the one every device runs) on a
//! device (`cuda:N`, or `emu` in tests): weights uploaded once in the compute dtype (bf16 by default, f16 or f32), every op a
//! kernel of core's [`ModelOps`](pagoda_core::ops::ModelOps) (so this crate
//! knows no CUDA), attention through the planned backends on the device's KV cache.
//!
//! Per step, vLLM's sequence of fused kernels: the embedding gather into the f32
//! residual stream; RMSNorm (fused with the residual add after the first layer);
//! the fused QKV GEMM; RoPE fused with writing K/V into the paged cache by slot
//! mapping; attention; o_proj; add + norm; the fused gate/up GEMM; SiLU-mul; down;
//! and, after the last layer, the residual add, final norm and LM head on the rows
//! whose logits are needed only. The residual stream stays f32 (as the CPU path), the
//! activations that feed GEMMs are of the compute dtype, the logits f32.
//!
//! Buffers ([`DeviceScratch`]) grow to the largest step seen and are reused, so a
//! warm step allocates no device memory.
//!
//! Families: all six (the decoder's switches; `ops.rs` has each op's launches):
//! Q/K/V biases (Qwen2) fused into RoPE; Qwen3's per-head Q/K norms (`qk_norm`,
//! before RoPE); sliding windows, Gemma 2's alternating sliding/global layers and its
//! attention-logit soft cap in the attention backends (one planned backend per
//! attention kind; every CUDA kernel takes the window and the cap); Gemma 2's scaled
//! embedding, post-attention and post-feedforward norms (its `1 + w` is in the loaded
//! weights, as on the CPU), tanh-GELU and final-logit soft cap (`soft_cap` on the
//! logits rows); Mixtral's MoE layers (`ops.rs`: device-side routing in fixed shapes,
//! every expert on every token, so decode steps of MoE models are captured into graphs
//! like the others); tied embeddings and Llama-3 RoPE scaling. Refused at construction,
//! with the reason: Q/K norms together with a Q/K/V bias (no family has both; the
//! bias is added inside RoPE, after where the norm would need it) and a top-k above the
//! routing kernel's 32.

mod bufs;
mod graphs;
mod model;
mod ops;
mod weights;
pub use bufs::DeviceScratch;
pub use graphs::{capture_sizes, DecodeGraphs};
pub use model::{device_unsupported, DeviceLlama, DeviceOutput, DeviceRun};
