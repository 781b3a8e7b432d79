//! CPU math kernels (GEMM, norms, RoPE, activations) and, behind the `cuda` feature, CUDA kernels.
