//! The vLLM-V1-style scheduler, KV cache manager and block pool with prefix caching.
