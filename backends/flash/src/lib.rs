//! Flash-style prefill attention on CPU: tiled online softmax over the paged cache.
