//! Dense f32 weights of a decoder model, as every loader produces them.
//!
//! Matrices follow PyTorch's `nn.Linear` convention: `[out_features, in_features]`,
//! row-major, so `y = x · Wᵀ`. Q and K rows are in HF's rotate-half order (GGUF
//! loaders undo llama.cpp's permutation).

/// A row-major f32 matrix, or (from a GGUF file, when a quantized kernel runs the
/// tensor's format) only its GGUF blocks: `data` is then empty and [`Mat::values`]
/// dequantizes on demand, so loading a quantized model never holds an f32 copy of
/// its weights (`--dtype auto` keeps the blocks; other dtypes dequantize one
/// matrix at a time while packing).
#[derive(Debug, Clone, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
    pub quant: Option<QuantBlocks>,
}

/// A tensor's GGUF blocks as stored in the file (row-major, rows in the same
/// order as the [`Mat`]'s `data`): each row is whole blocks of `format`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantBlocks {
    pub format: pagoda_kernels::QuantFormat,
    pub bytes: Vec<u8>,
}

impl Mat {
    /// The 0 x 0 matrix (the dense MLP of a MoE layer).
    pub fn empty() -> Self {
        Mat {
            rows: 0,
            cols: 0,
            data: Vec::new(),
            quant: None,
        }
    }

    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "Mat::new: data length must be rows * cols"
        );
        Mat {
            rows,
            cols,
            data,
            quant: None,
        }
    }
    /// With the GGUF blocks `data` was dequantized from.
    pub fn with_quant(mut self, quant: Option<QuantBlocks>) -> Self {
        self.quant = quant;
        self
    }

    /// Only the GGUF blocks `quant` (whole blocks per row), no f32 values.
    pub fn quantized(rows: usize, cols: usize, quant: QuantBlocks) -> Self {
        Mat {
            rows,
            cols,
            data: Vec::new(),
            quant: Some(quant),
        }
    }

    /// Whether it holds `rows x cols` values, as f32 or as blocks only.
    pub fn has_shape(&self, rows: usize, cols: usize) -> bool {
        let blocks_only = self.data.is_empty()
            && self.quant.as_ref().is_some_and(|q| {
                let (be, bb) = q.format.block_layout();
                cols.is_multiple_of(be) && q.bytes.len() == rows * cols / be * bb
            });
        self.rows == rows && self.cols == cols && (self.data.len() == rows * cols || blocks_only)
    }

    /// The f32 values: `data`, or the blocks dequantized (as the GGUF loader
    /// would have, bit for bit) when only they are held.
    pub fn values(&self) -> Result<std::borrow::Cow<'_, [f32]>, crate::ModelError> {
        match &self.quant {
            Some(q) if self.data.is_empty() && self.rows * self.cols > 0 => {
                let ty = crate::dequant::ggml_type_of(q.format);
                let v = crate::dequant::dequantize("matrix", ty, &q.bytes, self.rows * self.cols)?;
                Ok(std::borrow::Cow::Owned(v))
            }
            _ => Ok(std::borrow::Cow::Borrowed(&self.data)),
        }
    }

    /// Makes `data` hold the values (dequantizing blocks-only matrices once).
    pub fn materialize(&mut self) -> Result<(), crate::ModelError> {
        if self.data.is_empty() {
            self.data = self.values()?.into_owned();
        }
        Ok(())
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// Weights of one decoder layer.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// `[num_heads * head_dim, hidden]`
    pub wq: Mat,
    /// `[num_kv_heads * head_dim, hidden]`
    pub wk: Mat,
    pub wv: Mat,
    /// `[hidden, num_heads * head_dim]`
    pub wo: Mat,
    pub ffn_norm: Vec<f32>,
    /// `[intermediate, hidden]`
    pub w_gate: Mat,
    pub w_up: Mat,
    /// `[hidden, intermediate]`
    pub w_down: Mat,
    /// What the families beyond Llama add (all empty for Llama).
    pub extra: LayerExtras,
}

/// Optional per-layer weights of the families beyond Llama. A layer with `moe` has
/// empty (0 x 0) dense MLP matrices.
#[derive(Debug, Clone, Default)]
pub struct LayerExtras {
    /// Q/K/V biases (Qwen2): `[num_heads * head_dim]`, `[kv_dim]`, `[kv_dim]`.
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// Per-head RMSNorm weights of Q and K (Qwen3): `[head_dim]`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Norms after attention and after the MLP (Gemma 2): `[hidden]`.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    pub moe: Option<MoeWeights>,
}

/// A sparse MoE MLP (Mixtral): the router and each expert's SwiGLU matrices.
#[derive(Debug, Clone)]
pub struct MoeWeights {
    /// `[num_experts, hidden]`
    pub router: Mat,
    pub experts: Vec<ExpertWeights>,
}

/// One expert: `[intermediate, hidden]` gate and up, `[hidden, intermediate]` down.
#[derive(Debug, Clone)]
pub struct ExpertWeights {
    pub w_gate: Mat,
    pub w_up: Mat,
    pub w_down: Mat,
}

/// All weights. `lm_head` is None when embeddings are tied.
#[derive(Debug, Clone)]
pub struct LlamaWeights {
    /// `[vocab, hidden]`
    pub embed: Mat,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    pub lm_head: Option<Mat>,
}
