//! The model forward's kernels (`cu/model.cu`) on the `emu` device: embedding, RMSNorm
//! (plain and fused with the residual add), RoPE fused with the paged KV write, SwiGLU /
//! GeGLU, row gather, greedy argmax and dtype casts, run on host slices.
//!
//! As in [`crate::emu`], every function checks all lengths, indices (token ids,
//! positions, slots, rows) and shapes before launching, since the kernels trust their
//! inputs as on the GPU: bad input is [`Error::Invalid`], never a panic or an
//! out-of-bounds access. Integer inputs are `i32` (the device buffers' type).
//!
//! Semantics are those of `pagoda_kernels` (kernels/src/{norm,rope,act}.rs), f32 math:
//! * [`rms_norm`]: `out = v * (1 / sqrt(sum(v²) / n + eps)) * (w + w_offset)`;
//! * [`rope_write_kv`]: rotate-half (GPT-NeoX) RoPE from `RopeCache`'s cos/sin tables;
//! * [`argmax`] implements `pagoda_kernels::argmax`'s contract (first index of the largest
//!   value, NaNs skipped, `-inf` a valid value) with `None` mapped to index 0 and value
//!   `-inf`; on NaN-free rows that is also `max_index`'s `(index, value)`.

use crate::emu::{checked_mul, expect_len, to_i32};
use crate::params::{
    ArgmaxParams, CastParams, EmbedParams, GatherParams, GluParams, NormParams, RopeKvParams,
};
use crate::{ffi, graph, invalid, Dtype, Element, Error};
use std::ptr;

pub(crate) fn status(kernel: &'static str, rc: i32, dtype: Dtype) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else if rc == graph::FAULT_MISALIGNED {
        Err(crate::misaligned(kernel))
    } else {
        Err(Error::Unsupported {
            kernel,
            dtype,
            head_dim: 0,
        })
    }
}

pub(crate) fn finite(what: &'static str, v: f32) -> Result<(), Error> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(invalid(what, format!("{v} is not finite")))
    }
}

pub(crate) fn positive(what: &'static str, v: usize) -> Result<i32, Error> {
    if v == 0 {
        return Err(invalid(what, "must be > 0"));
    }
    to_i32(what, v)
}

/// `out[t, :] = scale * table[ids[t], :]`: `table` `[vocab, hidden]`, `out`
/// `[ids.len(), hidden]`; every id must be in `0..vocab`.
pub fn embed<W: Element, O: Element>(
    ids: &[i32],
    table: &[W],
    hidden: usize,
    scale: f32,
    out: &mut [O],
) -> Result<(), Error> {
    let hidden_i = positive("hidden", hidden)?;
    finite("scale", scale)?;
    if !table.len().is_multiple_of(hidden) {
        return Err(invalid(
            "table",
            format!(
                "{} elements is not a whole number of rows of {hidden}",
                table.len()
            ),
        ));
    }
    let vocab = table.len() / hidden;
    expect_len("out", out.len(), checked_mul("out", ids.len(), hidden)?)?;
    if let Some(id) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        return Err(invalid("ids", format!("token id {id} outside 0..{vocab}")));
    }
    if ids.is_empty() {
        return Ok(());
    }
    let p = EmbedParams {
        ids: ids.as_ptr(),
        table: table.as_ptr().cast(),
        out: out.as_mut_ptr().cast(),
        num_tokens: to_i32("ids", ids.len())?,
        hidden: hidden_i,
        scale,
        pad: 0,
    };
    let (w, o) = (W::DTYPE as i32, O::DTYPE as i32);
    // SAFETY: out holds ids.len() rows of `hidden`, every id names a row of `table`.
    let rc = graph::launch("embed", move || unsafe { ffi::pg_emu_embed(&p, w, o) });
    status("embed", rc, O::DTYPE)
}

/// Checks a norm's shapes; returns (rows, dim).
fn check_norm(
    x: usize,
    weight: usize,
    out: usize,
    eps: f32,
    w_offset: f32,
) -> Result<(i32, i32), Error> {
    let dim = positive("weight", weight)?;
    if !x.is_multiple_of(weight) {
        return Err(invalid(
            "x",
            format!("{x} elements is not a whole number of rows of {weight}"),
        ));
    }
    expect_len("out", out, x)?;
    finite("eps", eps)?;
    if eps < 0.0 {
        return Err(invalid("eps", format!("{eps} is negative")));
    }
    finite("w_offset", w_offset)?;
    Ok((to_i32("rows", x / weight)?, dim))
}

/// RMSNorm of each row of `x` (`[rows, weight.len()]`): `out = x * (1 / sqrt(mean(x²) +
/// eps)) * (weight + w_offset)` (`w_offset` 0 for Llama, 1 for Gemma).
pub fn rms_norm<X: Element, O: Element>(
    x: &[X],
    weight: &[f32],
    eps: f32,
    w_offset: f32,
    out: &mut [O],
) -> Result<(), Error> {
    let (rows, dim) = check_norm(x.len(), weight.len(), out.len(), eps, w_offset)?;
    if rows == 0 {
        return Ok(());
    }
    let p = NormParams {
        x: x.as_ptr().cast(),
        residual: ptr::null_mut(),
        weight: weight.as_ptr(),
        out: out.as_mut_ptr().cast(),
        rows,
        dim,
        eps,
        w_offset,
    };
    let (x, o) = (X::DTYPE as i32, O::DTYPE as i32);
    // SAFETY: x and out hold `rows` rows of `dim`, weight `dim` values.
    let rc = graph::launch("rms_norm", move || unsafe {
        ffi::pg_emu_rms_norm(&p, x, o)
    });
    status("rms_norm", rc, O::DTYPE)
}

/// vLLM's fused_add_rms_norm, out of place: `residual += x` (f32), then `out =
/// rms_norm(residual) * (weight + w_offset)` as [`rms_norm`].
pub fn add_rms_norm<X: Element, O: Element>(
    residual: &mut [f32],
    x: &[X],
    weight: &[f32],
    eps: f32,
    w_offset: f32,
    out: &mut [O],
) -> Result<(), Error> {
    let (rows, dim) = check_norm(residual.len(), weight.len(), out.len(), eps, w_offset)?;
    expect_len("x", x.len(), residual.len())?;
    if rows == 0 {
        return Ok(());
    }
    let p = NormParams {
        x: x.as_ptr().cast(),
        residual: residual.as_mut_ptr(),
        weight: weight.as_ptr(),
        out: out.as_mut_ptr().cast(),
        rows,
        dim,
        eps,
        w_offset,
    };
    let (x, o) = (X::DTYPE as i32, O::DTYPE as i32);
    // SAFETY: residual, x and out hold `rows` rows of `dim`, weight `dim` values.
    let rc = graph::launch("add_rms_norm", move || unsafe {
        ffi::pg_emu_add_rms_norm(&p, x, o)
    });
    status("add_rms_norm", rc, O::DTYPE)
}

/// Heads and pool geometry of [`rope_write_kv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeKvShape {
    /// Query heads (a multiple of `num_kv_heads`).
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head dim (even).
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
}

/// The tensors of one [`rope_write_kv`] (host memory); `positions.len()` tokens.
#[derive(Debug)]
pub struct RopeKvIo<'a, T, KV> {
    /// `[tokens, (num_heads + 2 num_kv_heads) head_dim]`, rows `[q | k | v]` heads.
    pub qkv: &'a [T],
    /// `[(num_heads + 2 num_kv_heads) head_dim]`, added before the rotation (Qwen2).
    pub bias: Option<&'a [f32]>,
    /// `[tokens]`, each in `0..max_pos`.
    pub positions: &'a [i32],
    /// `[max_pos, head_dim / 2]` (`pagoda_kernels::RopeCache`'s table).
    pub cos: &'a [f32],
    /// `[max_pos, head_dim / 2]`.
    pub sin: &'a [f32],
    /// `[tokens]` slots `block * block_size + offset`; negative: padding (q is written,
    /// K/V are not).
    pub slot_mapping: &'a [i32],
    /// `[tokens, num_heads, head_dim]` (written).
    pub q_out: &'a mut [T],
    /// `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub k_pool: &'a mut [KV],
    /// Same layout as `k_pool`.
    pub v_pool: &'a mut [KV],
}

/// RoPE on the q and k heads of the fused QKV output (plus the optional bias), q into
/// `q_out`, rotated k and plain v into the paged pools at their slots.
pub fn rope_write_kv<T: Element, KV: Element>(
    io: RopeKvIo<'_, T, KV>,
    shape: &RopeKvShape,
) -> Result<(), Error> {
    let s = shape;
    if s.num_heads == 0 || s.num_kv_heads == 0 || !s.num_heads.is_multiple_of(s.num_kv_heads) {
        return Err(invalid(
            "heads",
            format!(
                "num_heads {} must be a positive multiple of num_kv_heads {}",
                s.num_heads, s.num_kv_heads
            ),
        ));
    }
    if s.head_dim == 0 || !s.head_dim.is_multiple_of(2) {
        return Err(invalid(
            "head_dim",
            format!("{} must be even and > 0", s.head_dim),
        ));
    }
    positive("block_size", s.block_size)?;
    let heads = checked_mul("heads", s.num_kv_heads, 2)?
        .checked_add(s.num_heads)
        .ok_or_else(|| invalid("heads", "count overflows"))?;
    let width = checked_mul("qkv row", heads, s.head_dim)?;
    to_i32("qkv row", width)?;
    let tokens = io.positions.len();
    expect_len("slot_mapping", io.slot_mapping.len(), tokens)?;
    expect_len("qkv", io.qkv.len(), checked_mul("qkv", tokens, width)?)?;
    expect_len(
        "q_out",
        io.q_out.len(),
        checked_mul("q_out", tokens, s.num_heads * s.head_dim)?,
    )?;
    if let Some(b) = io.bias {
        expect_len("bias", b.len(), width)?;
    }
    let half = s.head_dim / 2;
    expect_len("sin", io.sin.len(), io.cos.len())?;
    if !io.cos.len().is_multiple_of(half) {
        return Err(invalid(
            "cos",
            format!(
                "{} values is not a whole number of rows of {half}",
                io.cos.len()
            ),
        ));
    }
    let max_pos = io.cos.len() / half;
    if let Some(p) = io
        .positions
        .iter()
        .find(|&&p| p < 0 || p as usize >= max_pos)
    {
        return Err(invalid(
            "positions",
            format!("position {p} outside 0..{max_pos}"),
        ));
    }
    expect_len("v_pool", io.v_pool.len(), io.k_pool.len())?;
    let block_elems = checked_mul("pool block", s.block_size, s.num_kv_heads * s.head_dim)?;
    if !io.k_pool.len().is_multiple_of(block_elems) {
        return Err(invalid(
            "k_pool",
            format!(
                "{} elements is not a whole number of blocks of {block_elems}",
                io.k_pool.len()
            ),
        ));
    }
    let slots = io.k_pool.len() / block_elems * s.block_size;
    if let Some(x) = io
        .slot_mapping
        .iter()
        .find(|&&x| x >= 0 && x as usize >= slots)
    {
        return Err(invalid(
            "slot_mapping",
            format!("slot {x} >= pool slots {slots}"),
        ));
    }
    if tokens == 0 {
        return Ok(());
    }
    let p = RopeKvParams {
        qkv: io.qkv.as_ptr().cast(),
        bias: io.bias.map_or(ptr::null(), <[f32]>::as_ptr),
        positions: io.positions.as_ptr(),
        cos: io.cos.as_ptr(),
        sin: io.sin.as_ptr(),
        slot_mapping: io.slot_mapping.as_ptr(),
        q_out: io.q_out.as_mut_ptr().cast(),
        k_pool: io.k_pool.as_mut_ptr().cast(),
        v_pool: io.v_pool.as_mut_ptr().cast(),
        num_tokens: to_i32("positions", tokens)?,
        num_heads: to_i32("num_heads", s.num_heads)?,
        num_kv_heads: to_i32("num_kv_heads", s.num_kv_heads)?,
        head_dim: to_i32("head_dim", s.head_dim)?,
    };
    let (t, kv) = (T::DTYPE as i32, KV::DTYPE as i32);
    // SAFETY: every length is checked above, positions index the tables, non-negative
    // slots index the pools.
    let rc = graph::launch("rope_kv", move || unsafe { ffi::pg_emu_rope_kv(&p, t, kv) });
    status("rope_write_kv", rc, KV::DTYPE)
}

fn glu<T: Element>(
    gate_up: &[T],
    inter: usize,
    out: &mut [T],
    kernel: &'static str,
    run: unsafe extern "C" fn(*const GluParams, i32) -> i32,
) -> Result<(), Error> {
    let inter_i = positive("inter", inter)?;
    to_i32("inter", checked_mul("inter", inter, 2)?)?;
    if !out.len().is_multiple_of(inter) {
        return Err(invalid(
            "out",
            format!(
                "{} elements is not a whole number of rows of {inter}",
                out.len()
            ),
        ));
    }
    let rows = out.len() / inter;
    expect_len(
        "gate_up",
        gate_up.len(),
        checked_mul("gate_up", rows, 2 * inter)?,
    )?;
    if rows == 0 {
        return Ok(());
    }
    let p = GluParams {
        gate_up: gate_up.as_ptr().cast(),
        out: out.as_mut_ptr().cast(),
        rows: to_i32("rows", rows)?,
        inter: inter_i,
    };
    let t = T::DTYPE as i32;
    // SAFETY: gate_up holds `rows` rows of 2 inter, out `rows` rows of inter.
    let rc = graph::launch(kernel, move || unsafe { run(&p, t) });
    status(kernel, rc, T::DTYPE)
}

/// SwiGLU: `out = silu(gate) * up` on `gate_up` `[rows, 2 inter]` (rows `[gate | up]`),
/// `out` `[rows, inter]`, in f32 (`pagoda_kernels::silu_mul_fused`).
pub fn silu_mul<T: Element>(gate_up: &[T], inter: usize, out: &mut [T]) -> Result<(), Error> {
    glu(gate_up, inter, out, "silu_mul", ffi::pg_emu_silu_mul)
}

/// GeGLU: `out = gelu_tanh(gate) * up` (PyTorch's tanh GELU,
/// `pagoda_kernels::gelu_tanh_mul_fused`), same layout as [`silu_mul`].
pub fn gelu_tanh_mul<T: Element>(gate_up: &[T], inter: usize, out: &mut [T]) -> Result<(), Error> {
    glu(
        gate_up,
        inter,
        out,
        "gelu_tanh_mul",
        ffi::pg_emu_gelu_tanh_mul,
    )
}

/// `out[i, :] = x[rows[i], :]` for rows of `dim` (bit copies).
pub fn gather_rows<X: Element>(
    x: &[X],
    dim: usize,
    rows: &[i32],
    out: &mut [X],
) -> Result<(), Error> {
    let dim_i = positive("dim", dim)?;
    if !x.len().is_multiple_of(dim) {
        return Err(invalid(
            "x",
            format!(
                "{} elements is not a whole number of rows of {dim}",
                x.len()
            ),
        ));
    }
    let src_rows = x.len() / dim;
    expect_len("out", out.len(), checked_mul("out", rows.len(), dim)?)?;
    if let Some(r) = rows.iter().find(|&&r| r < 0 || r as usize >= src_rows) {
        return Err(invalid("rows", format!("row {r} outside 0..{src_rows}")));
    }
    if rows.is_empty() {
        return Ok(());
    }
    let p = GatherParams {
        x: x.as_ptr().cast(),
        rows: rows.as_ptr(),
        out: out.as_mut_ptr().cast(),
        num_rows: to_i32("rows", rows.len())?,
        dim: dim_i,
    };
    let x = X::DTYPE as i32;
    // SAFETY: every row index names a row of x; out holds rows.len() rows.
    let rc = graph::launch("gather_rows", move || unsafe {
        ffi::pg_emu_gather_rows(&p, x)
    });
    status("gather_rows", rc, X::DTYPE)
}

/// Greedy sampling: per row of `logits` (`[ids.len(), vocab]`), `ids[r]` = the first index
/// of the largest non-NaN value and `values[r]` = that value; a row of only NaNs (or
/// `vocab` 0) gives `(0, -inf)`.
pub fn argmax<X: Element>(
    logits: &[X],
    vocab: usize,
    ids: &mut [i32],
    values: &mut [f32],
) -> Result<(), Error> {
    let rows = ids.len();
    expect_len("values", values.len(), rows)?;
    expect_len("logits", logits.len(), checked_mul("logits", rows, vocab)?)?;
    if rows == 0 {
        return Ok(());
    }
    let p = ArgmaxParams {
        logits: logits.as_ptr().cast(),
        ids: ids.as_mut_ptr(),
        values: values.as_mut_ptr(),
        rows: to_i32("rows", rows)?,
        vocab: to_i32("vocab", vocab)?,
    };
    let x = X::DTYPE as i32;
    // SAFETY: logits holds rows x vocab values, ids and values `rows` each.
    let rc = graph::launch("argmax", move || unsafe { ffi::pg_emu_argmax(&p, x) });
    status("argmax", rc, X::DTYPE)
}

/// `dst[i] = src[i]` converted to `D` (round to nearest even).
pub fn cast<S: Element, D: Element>(src: &[S], dst: &mut [D]) -> Result<(), Error> {
    expect_len("dst", dst.len(), src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    let p = CastParams {
        src: src.as_ptr().cast(),
        dst: dst.as_mut_ptr().cast(),
        n: i64::try_from(src.len()).map_err(|_| invalid("src", "length does not fit in i64"))?,
    };
    let (s, d) = (S::DTYPE as i32, D::DTYPE as i32);
    // SAFETY: src and dst both hold n elements.
    let rc = graph::launch("cast", move || unsafe { ffi::pg_emu_cast(&p, s, d) });
    status("cast", rc, D::DTYPE)
}

/// `sizeof` of model.cu's parameter structs: `[Embed, Norm, RopeKv, Glu, Gather, Argmax,
/// Cast, QkNorm, SoftCap, MoeRoute, MoeAcc]` (for the test that the `#[repr(C)]` mirrors
/// match).
#[doc(hidden)]
pub fn c_param_sizes() -> [u64; 11] {
    let mut out = [0u64; 11];
    // SAFETY: the C function writes exactly eleven u64s.
    unsafe { ffi::pg_model_params_sizes(out.as_mut_ptr()) };
    out
}
