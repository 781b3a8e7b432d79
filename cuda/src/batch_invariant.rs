//! vLLM's batch-invariance switch ([`BATCH_INVARIANT_ENV`]), read in two places: the
//! attention backend (`attn.rs`: `cuda-flash` serves prefill rows as `cuda-paged`
//! decode rows) and the `cuda:N` driver (`gpu.rs`: the CUTLASS GEMM wherever it applies).
//!
//! A leaf of its own so that the driver reads it without
//! depending on the kernel descriptions: those ask the device runtime whether `cuda`
//! is usable, and the runtime opens `cuda:N` through this driver.

/// vLLM's switch for batch-invariant kernels: with `VLLM_BATCH_INVARIANT=1`
/// `cuda-flash` serves prefill rows with `cuda-paged`'s arithmetic.
pub const BATCH_INVARIANT_ENV: &str = "VLLM_BATCH_INVARIANT";

/// Whether [`BATCH_INVARIANT_ENV`] is set to `1`.
pub fn batch_invariant_env() -> bool {
    std::env::var(BATCH_INVARIANT_ENV).is_ok_and(|v| v == "1")
}
