//! The decoder's operations on the host ([`CpuOps`]): today's fused f32 kernels
//! (`pagoda_kernels`' norms, RoPE, gated activations), the packed f32/bf16 and
//! quantized GEMMs of [`Linear`], the CPU MoE MLP (`crate::moe`: each expert once on
//! the rows routed to it), the K/V write through the backend's writer. Activations
//! are host `Vec<f32>`s tagged with the KV cache's device when they meet a backend
//! (`cpu`, or `emu` when the CUDA kernels run emulated on the host).
//!
//! Also how the CPU holds a decoder's weights ([`Cpu`], placed by [`CpuPlace`]):
//! the linear layers as [`Linear`]s of the asked [`WeightDtype`], norms f32, the
//! embedding as loaded unless it is tied to the LM head, in which case the head's
//! one packed copy serves both (a lookup gathers the row back out of the panels).

use crate::arch::Activation;
use crate::decoder::{Dims, MlpDims, Moe, Ops, Place, RopeIn, Tail, Weights};
use crate::error::{kernel, ModelError};
use crate::linear::{Linear, WeightDtype};
use crate::moe::MoeScratch;
use crate::weights::Mat;
use pagoda_core::{AttentionBackend, Device, LayerIo, LayerKv, RopeShape, StepBatch};
use pagoda_core::{TensorMut, TensorRef};
use pagoda_kernels::{add_rms_norm, gelu_tanh_mul_fused, rms_norm, silu_mul_fused, RopeCache};

/// The token embedding table `[vocab, hidden]`.
#[derive(Debug, Clone)]
pub(crate) enum Embedding {
    /// Untied: the table as loaded.
    Table(Mat),
    /// Tied to the LM head: the head's packed matrix, shared (lookups gather a
    /// row back out of the panels, exactly as stored).
    Tied(Linear),
}

impl Embedding {
    fn row_into(&self, r: usize, dst: &mut [f32]) {
        match self {
            Embedding::Table(m) => dst.copy_from_slice(m.row(r)),
            // r < vocab (checked by the step's input validation), dst has k elements.
            Embedding::Tied(head) => {
                let _ = head.row_into(r, dst);
            }
        }
    }
}

/// The host's weights.
#[derive(Debug)]
pub(crate) struct Cpu;

impl Weights for Cpu {
    type Mat = Linear;
    type Vec = Vec<f32>;
    type Rope = RopeCache;
    type Embed = Embedding;

    fn tied_head(embed: &Embedding) -> Option<&Linear> {
        match embed {
            Embedding::Tied(head) => Some(head),
            Embedding::Table(_) => None,
        }
    }
}

/// Places weights on the host, the linear layers as `dtype`.
pub(crate) struct CpuPlace {
    pub(crate) dtype: WeightDtype,
}

impl Place for CpuPlace {
    type W = Cpu;

    fn mat(
        &mut self,
        name: &str,
        parts: Vec<Mat>,
        k: usize,
        router: bool,
    ) -> Result<Linear, ModelError> {
        // A router stays f32: its scores pick the experts.
        let dtype = if router { WeightDtype::F32 } else { self.dtype };
        Linear::from_parts(name, parts, k, dtype)
    }

    fn vec(&mut self, v: Vec<f32>) -> Result<Vec<f32>, ModelError> {
        Ok(v)
    }

    fn embed_and_head(
        &mut self,
        embed: Mat,
        lm_head: Option<Mat>,
        hidden: usize,
    ) -> Result<(Embedding, Option<Linear>), ModelError> {
        Ok(match lm_head {
            Some(head) => {
                let mut e = embed;
                e.materialize()?;
                let head = Linear::from_parts("lm_head", vec![head], hidden, self.dtype)?;
                (Embedding::Table(e), Some(head))
            }
            None => {
                let tied = Linear::from_parts("token_embd", vec![embed], hidden, self.dtype)?;
                (Embedding::Tied(tied), None)
            }
        })
    }

    fn rope(&mut self, rope: RopeCache) -> Result<RopeCache, ModelError> {
        Ok(rope)
    }
}

/// The host buffers of a step that only the CPU's ops use.
#[derive(Debug, Default)]
pub(crate) struct CpuScratch {
    /// The step's rotated keys and its values `[tokens, kv]`, for the backend's writer.
    k: Vec<f32>,
    v: Vec<f32>,
    /// Q or K heads of the fused rows, gathered for the per-head norms (Qwen3).
    heads: Vec<f32>,
    heads_normed: Vec<f32>,
    moe: MoeScratch,
}

/// The decoder's operations on the host for one step.
pub(crate) struct CpuOps<'a, 's> {
    pub(crate) step: &'a StepBatch<'s>,
    /// The KV cache's device (`cpu`, or `emu`): the tag activations get for a backend.
    pub(crate) device: Device,
    pub(crate) s: &'a mut CpuScratch,
}

/// Sets `v` to `len` elements, reusing its capacity (contents are overwritten by the caller).
fn size(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

/// The first `len` elements of `x`, or an error naming the op when it has fewer.
fn lead<'x>(x: &'x [f32], len: usize, what: &str) -> Result<&'x [f32], ModelError> {
    x.get(..len).ok_or_else(|| ModelError::Forward {
        message: format!("{what}: {} elements, {len} needed", x.len()),
    })
}

fn lead_mut<'x>(x: &'x mut [f32], len: usize, what: &str) -> Result<&'x mut [f32], ModelError> {
    let have = x.len();
    x.get_mut(..len).ok_or_else(|| ModelError::Forward {
        message: format!("{what}: {have} elements, {len} needed"),
    })
}

/// Copies the part `range` of every row of `x` (rows of `width`) into `out`.
fn take_cols(x: &[f32], width: usize, range: std::ops::Range<usize>, out: &mut Vec<f32>) {
    out.clear();
    for row in x.chunks_exact(width) {
        out.extend_from_slice(&row[range.clone()]);
    }
}

/// Copies `src` (rows of `range.len()`) back into the part `range` of every row of `x`.
fn put_cols(x: &mut [f32], width: usize, range: std::ops::Range<usize>, src: &[f32]) {
    for (row, part) in x.chunks_exact_mut(width).zip(src.chunks_exact(range.len())) {
        row[range.clone()].copy_from_slice(part);
    }
}

impl Ops for CpuOps<'_, '_> {
    type W = Cpu;
    type Buf = Vec<f32>;

    fn prunes_last_layer(&self) -> bool {
        true
    }

    fn embed(
        &mut self,
        table: &Embedding,
        scale: f32,
        d: Dims,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        size(out, d.len());
        for (t, &id) in self.step.input_ids.iter().take(d.rows).enumerate() {
            table.row_into(id as usize, &mut out[t * d.width..(t + 1) * d.width]);
        }
        if scale != 1.0 {
            out.iter_mut().for_each(|x| *x *= scale);
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        eps: f32,
        d: Dims,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        size(out, d.len());
        rms_norm(lead(x, d.len(), "rms_norm")?, w, eps, out).map_err(kernel)
    }

    fn add_rms_norm(
        &mut self,
        h: &mut Vec<f32>,
        x: &Vec<f32>,
        w: &Vec<f32>,
        eps: f32,
        d: Dims,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        size(out, d.len());
        let h = lead_mut(h, d.len(), "add_rms_norm residual")?;
        add_rms_norm(h, lead(x, d.len(), "add_rms_norm")?, w, eps, out).map_err(kernel)
    }

    fn linear(
        &mut self,
        x: &Vec<f32>,
        w: &Linear,
        d: Dims,
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        size(out, d.rows * n);
        let x = lead(x, d.len(), "linear")?;
        w.matmul(x, out, d.rows, d.width, n).map_err(kernel)
    }

    fn add_bias(&mut self, x: &mut Vec<f32>, bias: &Vec<f32>, d: Dims) -> Result<(), ModelError> {
        for row in lead_mut(x, d.len(), "bias")?.chunks_exact_mut(d.width) {
            row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
        }
        Ok(())
    }

    fn qk_norm(
        &mut self,
        qkv: &mut Vec<f32>,
        (qn, kn): (&Vec<f32>, &Vec<f32>),
        eps: f32,
        shape: RopeShape,
        n: usize,
    ) -> Result<(), ModelError> {
        let (hd, width) = (shape.head_dim, shape.qkv_dim());
        let q_dim = shape.num_heads * hd;
        let k_dim = shape.num_kv_heads * hd;
        let x = lead_mut(qkv, n * width, "qk_norm")?;
        // Rows of head_dim: the norm weight's length makes each head a row.
        for (range, w) in [(0..q_dim, qn), (q_dim..q_dim + k_dim, kn)] {
            let s = &mut *self.s;
            take_cols(x, width, range.clone(), &mut s.heads);
            size(&mut s.heads_normed, s.heads.len());
            rms_norm(&s.heads, w, eps, &mut s.heads_normed).map_err(kernel)?;
            put_cols(x, width, range, &s.heads_normed);
        }
        Ok(())
    }

    fn rope_write_kv<A: AttentionBackend + ?Sized>(
        &mut self,
        qkv: &Vec<f32>,
        r: RopeIn<'_, Cpu>,
        pools: &mut LayerKv,
        backend: &mut A,
        q: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let shape = r.shape;
        let hd = shape.head_dim;
        let (q_dim, kv_dim) = (shape.num_heads * hd, shape.num_kv_heads * hd);
        let width = shape.qkv_dim();
        let qkv = lead(qkv, r.n * width, "rope_write_kv")?;
        let s = &mut *self.s;
        take_cols(qkv, width, 0..q_dim, q);
        take_cols(qkv, width, q_dim..q_dim + kv_dim, &mut s.k);
        take_cols(qkv, width, q_dim + kv_dim..width, &mut s.v);
        if let Some(b) = r.bias {
            let (bq, rest) = b.split_at(q_dim);
            let (bk, bv) = rest.split_at(kv_dim);
            for (x, b) in [(&mut *q, bq), (&mut s.k, bk), (&mut s.v, bv)] {
                for row in x.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
            }
        }
        let positions = self.step.positions;
        let rope = r.rope;
        rope.apply(q, shape.num_heads, positions).map_err(kernel)?;
        rope.apply(&mut s.k, shape.num_kv_heads, positions)
            .map_err(kernel)?;
        let (k_pool, v_pool) = pools.views_mut();
        backend.write_kv(
            k_pool,
            v_pool,
            TensorRef::host(self.device, &s.k)?,
            TensorRef::host(self.device, &s.v)?,
            self.step.batch.slot_mapping(),
            kv_dim,
        )?;
        Ok(())
    }

    fn attend<A: AttentionBackend + ?Sized>(
        &mut self,
        q: &Vec<f32>,
        pools: &LayerKv,
        backend: &mut A,
        shape: RopeShape,
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let len = n * shape.num_heads * shape.head_dim;
        size(out, len);
        let (k_cache, v_cache) = pools.views();
        backend.run(LayerIo {
            q: TensorRef::host(self.device, lead(q, len, "attention")?)?,
            k_cache,
            v_cache,
            out: TensorMut::host(self.device, out)?,
            lse: None,
        })?;
        Ok(())
    }

    fn gated_act(
        &mut self,
        act: Activation,
        gate_up: &Vec<f32>,
        d: Dims,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        size(out, d.len());
        let gate_up = lead(gate_up, 2 * d.len(), "gated_act")?;
        match act {
            Activation::Silu => silu_mul_fused(gate_up, d.width, out),
            Activation::GeluTanh => gelu_tanh_mul_fused(gate_up, d.width, out),
        }
        .map_err(kernel)
    }

    fn moe(
        &mut self,
        moe: &Moe<Cpu>,
        t: &mut Tail<Vec<f32>>,
        m: usize,
        dims: MlpDims,
    ) -> Result<(), ModelError> {
        let len = m * dims.hidden;
        size(&mut t.proj, len);
        let x = lead(&t.xn, len, "moe")?;
        let d = (dims.hidden, dims.inter, dims.act);
        crate::moe::forward(moe, (x, m), d, &mut t.proj, &mut self.s.moe)
    }

    fn gather_rows(
        &mut self,
        x: &Vec<f32>,
        width: usize,
        first: usize,
        count: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let rows = self
            .step
            .logits_rows
            .get(first..first + count)
            .ok_or_else(|| ModelError::Forward {
                message: format!(
                    "logits rows {first}..{} of {}",
                    first + count,
                    self.step.logits_rows.len()
                ),
            })?;
        size(out, count * width);
        for (i, &t) in rows.iter().enumerate() {
            let src = x
                .get(t * width..(t + 1) * width)
                .ok_or_else(|| ModelError::Forward {
                    message: format!("logits row {t} is beyond the step's rows"),
                })?;
            out[i * width..(i + 1) * width].copy_from_slice(src);
        }
        Ok(())
    }

    fn soft_cap(&mut self, x: &mut Vec<f32>, len: usize, cap: f32) -> Result<(), ModelError> {
        let x = lead_mut(x, len, "soft_cap")?;
        x.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
        Ok(())
    }
}
