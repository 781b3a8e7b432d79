//! The CUDA kernel author's test kit, for a kernel wherever it lives
//! (`pagoda-cuda-kernels`' own `paged.cu`, a backend crate's `.cu`):
//!
//! * [`attn`] (re-exported at the root): random paged batches in vLLM's layout, the
//!   f64 reference attention over them, each dtype's derived tolerance, and proptest
//!   strategies for the batch shapes;
//! * [`sanitize`]: the kernel file under ThreadSanitizer and AddressSanitizer through
//!   the SIMT emulator, launched by a small C++ driver.

pub mod attn;
pub mod sanitize;

pub use attn::*;
