//! The device buffers of a step ([`DeviceScratch`]) and the views a step takes of
//! them (buffers are sized for the largest step and a step uses their first rows), and
//! the device module's shared helpers (uploads, error conversions).

use crate::config::LlamaConfig;
use crate::decoder::{Bufs, Tail};
use crate::error::ModelError;
use pagoda_core::{
    CoreError, DType, DeviceRuntime, HostSlice, Shape, Storage, TensorMut, TensorRef,
};
use std::sync::Arc;

pub(super) fn dev(e: CoreError) -> ModelError {
    ModelError::Forward {
        message: e.to_string(),
    }
}

pub(super) fn config_err(message: String) -> ModelError {
    ModelError::Config { message }
}

/// Host f32 values as `dtype` elements, uploaded into a new buffer of `shape`.
pub(super) fn upload(
    rt: &dyn DeviceRuntime,
    dtype: DType,
    dims: &[usize],
    data: &[f32],
) -> Result<Storage, ModelError> {
    let shape = Shape::new(dims).map_err(dev)?;
    let mut s = rt.alloc_zeroed(dtype, shape).map_err(dev)?;
    match dtype {
        DType::F32 => rt.upload(s.view_mut(), HostSlice::F32(data)),
        DType::BF16 => {
            let v: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f32(x)).collect();
            rt.upload(s.view_mut(), HostSlice::BF16(&v))
        }
        DType::F16 => {
            let v: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
            rt.upload(s.view_mut(), HostSlice::F16(&v))
        }
        DType::F8E4M3 => Err(pagoda_core::CoreError::UnsupportedDType {
            what: "device model weights",
            dtype,
            reason: "fp8 is a KV cache dtype only",
        }),
    }
    .map_err(dev)?;
    Ok(s)
}

/// The leading `dims.iter().product()` elements of a buffer, seen as `dims` (a step
/// uses the first rows of buffers sized for the largest step).
pub(super) fn lead<'a>(s: &'a mut Storage, dims: &[usize]) -> Result<TensorMut<'a>, ModelError> {
    let shape = Shape::new(dims).map_err(dev)?;
    let (head, _) = s.view_mut().split_at(shape.numel()).map_err(dev)?;
    head.reshape(shape).map_err(dev)
}

pub(super) fn lead_ref<'a>(s: &'a Storage, dims: &[usize]) -> Result<TensorRef<'a>, ModelError> {
    let shape = Shape::new(dims).map_err(dev)?;
    let (head, _) = s.view().split_at(shape.numel()).map_err(dev)?;
    head.reshape(shape).map_err(dev)
}

/// The first `n` rows of width `w`, as `[n, w]`.
pub(super) fn rows(s: &mut Storage, n: usize, w: usize) -> Result<TensorMut<'_>, ModelError> {
    lead(s, &[n, w])
}

pub(super) fn rows_ref(s: &Storage, n: usize, w: usize) -> Result<TensorRef<'_>, ModelError> {
    lead_ref(s, &[n, w])
}

/// A required buffer of a family (allocated when the config asks for it).
pub(super) fn need<'a, T>(b: &'a mut Option<T>, what: &str) -> Result<&'a mut T, ModelError> {
    b.as_mut().ok_or_else(|| ModelError::Forward {
        message: format!("the device buffers have no {what} (built for another config)"),
    })
}

/// The MoE layers' buffers (Mixtral).
pub(super) struct MoeBufs {
    /// Router scores `[tokens, experts]` f32.
    pub(super) logits: Storage,
    /// Dense routing weights `[tokens, experts]` f32 (0: expert not picked).
    pub(super) weights: Storage,
    /// The weighted sum of the experts' outputs `[tokens, hidden]` f32.
    pub(super) acc: Storage,
    /// One expert's output `[tokens, hidden]`.
    pub(super) y: Storage,
}

/// Device buffers of `DeviceLlama::forward_kinds`, for up to `tokens` tokens and
/// an LM head over `rows` logits rows at a time: they grow (allocating) only when a step
/// has more tokens; a step with more logits rows (prompt log-probabilities) runs the
/// LM head chunk by chunk.
pub struct DeviceScratch {
    pub(super) tokens: usize,
    pub(super) rows: usize,
    pub(super) bufs: Bufs<Storage>,
    pub(super) moe: Option<MoeBufs>,
    pub(super) rows_u32: Vec<u32>,
    /// Times the buffers were (re)allocated: steady state means no change.
    pub(super) num_allocations: usize,
}

impl DeviceScratch {
    /// Buffers for steps of up to `tokens` tokens, the LM head `rows` rows at a time
    /// (the engine: `--max-num-batched-tokens` and `--max-num-seqs`).
    pub fn new(
        rt: &Arc<dyn DeviceRuntime>,
        config: &LlamaConfig,
        dtype: DType,
        tokens: usize,
        rows: usize,
    ) -> Result<Self, ModelError> {
        let (tokens, rows) = (tokens.max(1), rows.max(1));
        let (bufs, moe) = new_bufs(rt.as_ref(), config, dtype, tokens, rows)?;
        Ok(DeviceScratch {
            tokens,
            rows,
            bufs,
            moe,
            rows_u32: Vec::with_capacity(rows),
            num_allocations: 1,
        })
    }

    /// How many times the buffers were allocated (1 after construction).
    pub fn num_allocations(&self) -> usize {
        self.num_allocations
    }

    /// Bytes of device memory the buffers take.
    pub fn size_bytes(&self) -> usize {
        let (b, t) = (&self.bufs, &self.bufs.t);
        let moe = self
            .moe
            .iter()
            .flat_map(|m| [&m.logits, &m.weights, &m.acc, &m.y]);
        [
            &b.h,
            &b.qkv,
            &b.q,
            &b.attn,
            &b.sel_attn,
            &b.sel_h,
            &b.sel_n,
            &b.logits,
            &t.xn,
            &t.proj,
            &t.post,
            &t.gate_up,
            &t.act,
        ]
        .into_iter()
        .chain(moe)
        .map(|s| s.size_bytes())
        .sum()
    }

    pub(super) fn reserve(
        &mut self,
        rt: &dyn DeviceRuntime,
        config: &LlamaConfig,
        dtype: DType,
        tokens: usize,
    ) -> Result<(), ModelError> {
        if tokens <= self.tokens {
            return Ok(());
        }
        self.tokens = tokens.next_power_of_two();
        (self.bufs, self.moe) = new_bufs(rt, config, dtype, self.tokens, self.rows)?;
        self.num_allocations += 1;
        Ok(())
    }
}

/// The buffers of steps of up to `n` tokens and `r` logits rows at a time (the
/// residual stream, the MoE sums and the logits f32, the rest in `dtype`). A buffer
/// the model does not use is one element: a family without post-norms never writes
/// `post`. The last layer past its attention runs on the `r` logits rows alone
/// (`sel_attn`, `sel_h`), as on the CPU.
fn new_bufs(
    rt: &dyn DeviceRuntime,
    c: &LlamaConfig,
    dtype: DType,
    n: usize,
    r: usize,
) -> Result<(Bufs<Storage>, Option<MoeBufs>), ModelError> {
    let hd = c.head_dim;
    let (q_dim, kv_dim) = (c.num_heads * hd, c.num_kv_heads * hd);
    let (hidden, inter) = (c.hidden_size, c.intermediate_size);
    let a = |dt: DType, len: usize| {
        rt.alloc_zeroed(dt, Shape::flat(len.max(1))).map_err(|e| {
            config_err(format!(
                "allocating {len} activation elements on {}: {e}",
                rt.device()
            ))
        })
    };
    let moe = match c.arch.moe {
        Some(m) => Some(MoeBufs {
            logits: a(DType::F32, n * m.num_experts)?,
            weights: a(DType::F32, n * m.num_experts)?,
            acc: a(DType::F32, n * hidden)?,
            y: a(dtype, n * hidden)?,
        }),
        None => None,
    };
    let post = if c.arch.post_norms { n * hidden } else { 0 };
    let bufs = Bufs {
        h: a(DType::F32, n * hidden)?,
        qkv: a(dtype, n * (q_dim + 2 * kv_dim))?,
        q: a(dtype, n * q_dim)?,
        attn: a(dtype, n * q_dim)?,
        sel_attn: a(dtype, r * q_dim)?,
        sel_h: a(DType::F32, r * hidden)?,
        sel_n: a(dtype, r * hidden)?,
        logits: a(DType::F32, r * c.vocab_size)?,
        t: Tail {
            xn: a(dtype, n * hidden)?,
            proj: a(dtype, n * hidden)?,
            post: a(dtype, post)?,
            gate_up: a(dtype, n * 2 * inter)?,
            act: a(dtype, n * inter)?,
        },
    };
    Ok((bufs, moe))
}
