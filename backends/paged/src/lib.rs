//! Paged decode attention on CPU: split-KV (flash-decoding), SIMD, multi-threaded.
