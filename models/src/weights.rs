//! Dense f32 weights of a Llama-family model, as every loader produces them.
//!
//! Matrices follow PyTorch's `nn.Linear` convention: `[out_features, in_features]`,
//! row-major, so `y = x · Wᵀ`. Q and K rows are in HF's rotate-half order (GGUF
//! loaders undo llama.cpp's permutation).

/// A row-major f32 matrix, with the GGUF blocks it was dequantized from when
/// their format has a quantized kernel (so `--dtype auto` can keep them).
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
