//! The weight of a linear layer in its storage dtype, and the one matmul entry
//! the forward pass calls: [`Linear`].
//!
//! [`WeightDtype`] says how a model stores its linear layers: f32 or bf16 packed
//! panels (dequantizing a GGUF file's blocks at load), the GGUF file's own
//! quantized blocks where a quantized kernel runs them ([`WeightDtype::Native`],
//! what `--dtype auto` gives a GGUF), or Q8_0 quantized at load from f32
//! ([`WeightDtype::Q8_0`], `--quantization q8_0`). A matrix built from several
//! tensors (the fused QKV and gate/up projections) keeps each part's format.

use crate::error::ModelError;
use crate::weights::Mat;
use pagoda_kernels::quant::{matmul_quant_fused, QuantKernel};
use pagoda_kernels::{
    gemm_paths, matmul_packed, matmul_packed_bf16, KernelError, PackedMatrix, PackedMatrixBf16,
    QuantMatrix,
};

/// How the linear-layer weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    /// f32 (a GGUF's blocks dequantized exactly): the reference.
    #[default]
    F32,
    /// Rounded to bf16 (nearest even); activations stay f32, products accumulate
    /// in f32.
    Bf16,
    /// As stored: a GGUF's Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K matrices stay
    /// quantized (int8 activations, `pagoda_kernels::quant`), anything else f32.
    Native,
    /// Quantized at load to Q8_0's scheme (per 32 weights an f32 scale and int8),
    /// whatever the source; a matrix whose width is not a multiple of 32 stays f32.
    Q8_0,
}

/// A linear layer's weight matrix `[n, k]` (`nn.Linear` layout).
#[derive(Debug, Clone)]
pub enum Linear {
    /// Packed into column panels for the broadcast-form GEMM
    /// (`pagoda_kernels::packed`).
    F32(PackedMatrix),
    /// Rounded to bf16 and packed the same way (`pagoda_kernels::packed_bf16`).
    Bf16(PackedMatrixBf16),
    /// Quantized: consecutive row ranges, each in one format (one part unless a
    /// fused matrix mixes formats, as Q4_K_M files do).
    Quant(Vec<QuantMatrix>),
}

fn pack_err(name: &str) -> impl FnOnce(KernelError) -> ModelError + '_ {
    move |source| ModelError::Pack {
        name: name.to_string(),
        source,
    }
}

impl Linear {
    /// The matrix whose rows are `parts`' rows in order (each `[rows, k]`), stored
    /// as `dtype` says; `name` is for errors.
    pub fn from_parts(
        name: &str,
        parts: Vec<Mat>,
        k: usize,
        dtype: WeightDtype,
    ) -> Result<Self, ModelError> {
        let n: usize = parts.iter().map(|p| p.rows).sum();
        let quantized = parts.iter().all(|p| p.quant.is_some());
        let concat = |parts: Vec<Mat>| -> Result<Vec<f32>, ModelError> {
            let mut data = Vec::with_capacity(n * k);
            for p in parts {
                data.extend_from_slice(&p.values()?);
            }
            Ok(data)
        };
        Ok(match dtype {
            WeightDtype::Native if quantized => {
                // Runs of parts in one format become one matrix.
                let mut out: Vec<QuantMatrix> = Vec::new();
                let mut run: Option<(pagoda_kernels::QuantFormat, Vec<u8>, usize)> = None;
                let flush = |run: Option<(_, Vec<u8>, usize)>, out: &mut Vec<QuantMatrix>| {
                    if let Some((fmt, bytes, rows)) = run {
                        out.push(
                            QuantMatrix::from_gguf(fmt, &bytes, rows, k).map_err(pack_err(name))?,
                        );
                    }
                    Ok::<_, ModelError>(())
                };
                for p in parts {
                    let q = p.quant.expect("checked: every part is quantized");
                    match &mut run {
                        Some((fmt, bytes, rows)) if *fmt == q.format => {
                            bytes.extend_from_slice(&q.bytes);
                            *rows += p.rows;
                        }
                        _ => {
                            flush(run.take(), &mut out)?;
                            run = Some((q.format, q.bytes, p.rows));
                        }
                    }
                }
                flush(run, &mut out)?;
                Linear::Quant(out)
            }
            WeightDtype::Q8_0 if k.is_multiple_of(pagoda_kernels::quant::QB) => {
                Linear::Quant(vec![
                    QuantMatrix::quantize_q8_0(&concat(parts)?, n, k).map_err(pack_err(name))?
                ])
            }
            WeightDtype::Bf16 => {
                Linear::Bf16(PackedMatrixBf16::pack(&concat(parts)?, n, k).map_err(pack_err(name))?)
            }
            _ => Linear::F32(PackedMatrix::pack(&concat(parts)?, n, k).map_err(pack_err(name))?),
        })
    }

    /// `out[m, n] = x[m, k] · selfᵀ`.
    pub fn matmul(
        &self,
        x: &[f32],
        out: &mut [f32],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<(), KernelError> {
        debug_assert_eq!((self.k(), self.n()), (k, n));
        match self {
            Linear::F32(w) => matmul_packed(x, w, out, m),
            Linear::Bf16(w) => matmul_packed_bf16(x, w, out, m),
            Linear::Quant(parts) => matmul_quant_fused(x, parts, out, m),
        }
    }

    /// Rows (output columns).
    pub fn n(&self) -> usize {
        match self {
            Linear::F32(w) => w.n(),
            Linear::Bf16(w) => w.n(),
            Linear::Quant(parts) => parts.iter().map(|p| p.n()).sum(),
        }
    }

    /// Columns (the reduction length).
    pub fn k(&self) -> usize {
        match self {
            Linear::F32(w) => w.k(),
            Linear::Bf16(w) => w.k(),
            Linear::Quant(parts) => parts.first().map_or(0, |p| p.k()),
        }
    }

    /// Bytes of weights held (a decode step reads them all).
    pub fn num_bytes(&self) -> usize {
        match self {
            Linear::F32(w) => w.num_bytes(),
            Linear::Bf16(w) => w.k().div_ceil(2) * w.n().div_ceil(pagoda_kernels::PANEL) * 256,
            Linear::Quant(parts) => parts.iter().map(|p| p.num_bytes()).sum(),
        }
    }

    /// Row `r` as stored, widened to f32 (the lookup of an embedding tied to this
    /// matrix). `r < n` and `dst.len() == k`.
    pub fn row_into(&self, r: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        match self {
            Linear::F32(p) => p.row_into(r, dst),
            Linear::Bf16(p) => p.row_into(r, dst),
            Linear::Quant(parts) => {
                let mut r = r;
                for p in parts {
                    if r < p.n() {
                        return p.row_into(r, dst);
                    }
                    r -= p.n();
                }
                Err(KernelError::InvalidArgument {
                    name: "r",
                    message: format!("row beyond the matrix's {} rows", self.n()),
                })
            }
        }
    }

    /// What this matrix is stored as and which kernel runs it here, e.g.
    /// `Q4_1 avx512-vnni (vpdpbusd)` or `bf16 avx512-bf16 (vdpbf16ps)`.
    pub fn describe(&self) -> String {
        let paths = gemm_paths();
        match self {
            Linear::F32(_) => format!("f32 {}", paths.f32.name()),
            Linear::Bf16(_) => format!("bf16 {}", paths.bf16.name()),
            Linear::Quant(parts) => {
                let names: Vec<&str> = parts.iter().map(|p| p.format_name()).collect();
                format!("{} {}", names.join("+"), QuantKernel::detect().name())
            }
        }
    }
}
