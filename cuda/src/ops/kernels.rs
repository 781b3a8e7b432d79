//! The ops that launch a kernel: each checks its views, packs the parameter struct and
//! hands the [`Call`] (or the GEMM) to the driver, the same on both devices.

use super::{dims2, dt, i32_of, p, DeviceOps};
use crate::driver::{Driver, Gemm};
use pagoda_core::{CoreError, DType, GatedAct, RopeIo, RopeShape, TensorMut, TensorRef};
use pagoda_cuda_kernels::{Call, EmbedParams, GatherParams, GluParams, NormParams, RopeKvParams};
use std::ffi::c_void;

impl<D: Driver> DeviceOps<D> {
    pub(super) fn embed_inner(
        &mut self,
        table: TensorRef<'_>,
        scale: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (_, hidden) = dims2("table", table.shape().dims())?;
        let (rows, oh) = dims2("embed out", out.shape().dims())?;
        self.check_tokens("embed out", rows)?;
        if oh != hidden {
            return Err(CoreError::ShapeMismatch {
                name: "embed out width",
                expected: hidden,
                actual: oh,
            });
        }
        let dtypes = (dt(table.dtype())?, dt(out.dtype())?);
        let prm = EmbedParams {
            ids: p(self.section(0)?),
            table: p::<c_void>(self.addr("table", &table)?),
            out: p(self.addr_mut("embed out", out)?),
            num_tokens: i32_of("tokens", rows)?,
            hidden: i32_of("hidden", hidden)?,
            scale,
            pad: 0,
        };
        // SAFETY: the views hold `[vocab, hidden]` and `[rows, hidden]` elements of their
        // dtypes on this device (core's views); ids were checked < vocab by the model
        // before begin_step.
        unsafe { self.launch("embed", Call::Embed(prm, dtypes.0, dtypes.1)) }
    }

    /// `rms_norm` (no residual) or `add_rms_norm`; `(w_offset, eps)`.
    pub(super) fn norm_inner(
        &mut self,
        residual: Option<TensorMut<'_>>,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        (w_offset, eps): (f32, f32),
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let dim = w.len();
        let ok = dim > 0
            && w.dtype() == DType::F32
            && x.len() == out.len()
            && x.len().is_multiple_of(dim)
            && residual
                .as_ref()
                .is_none_or(|r| r.dtype() == DType::F32 && r.len() == x.len());
        let op = if residual.is_some() {
            "add_rms_norm"
        } else {
            "rms_norm"
        };
        if !ok {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "{op}: x {} elements, weight {dim} ({}), out {}, residual {:?}",
                    x.len(),
                    w.dtype(),
                    out.len(),
                    residual.as_ref().map(|r| (r.len(), r.dtype()))
                ),
            });
        }
        let (xd, od) = (dt(x.dtype())?, dt(out.dtype())?);
        let res = match residual {
            Some(r) => p(self.addr_mut("residual", r)?),
            None => std::ptr::null_mut(),
        };
        let prm = NormParams {
            x: p::<c_void>(self.addr("norm input", &x)?),
            residual: res,
            weight: p(self.addr("norm weight", &w)?),
            out: p(self.addr_mut("norm out", out)?),
            rows: i32_of("rows", x.len() / dim)?,
            dim: i32_of("dim", dim)?,
            eps,
            w_offset,
        };
        let call = if res.is_null() {
            Call::RmsNorm(prm, xd, od)
        } else {
            Call::AddRmsNorm(prm, xd, od)
        };
        // SAFETY: lengths and dtypes checked above; all views are this device's memory.
        unsafe { self.launch(op, call) }
    }

    pub(super) fn linear_inner(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (m, k) = dims2("linear input", x.shape().dims())?;
        let (n, kw) = dims2("linear weight", w.shape().dims())?;
        let (mo, no) = dims2("linear out", out.shape().dims())?;
        if kw != k || mo != m || no != n {
            return Err(CoreError::InvalidShape {
                message: format!("linear: x [{m}, {k}] · w [{n}, {kw}]ᵀ into out [{mo}, {no}]"),
            });
        }
        if !self.capturing {
            self.gemm_shapes.insert((m, n, k));
        } else if !self.gemm_shapes.contains(&(m, n, k)) {
            return Err(CoreError::Graph {
                message: format!(
                    "linear: a GEMM of [{m}, {k}] x [{n}, {k}]ᵀ first met inside a capture \
                     (the GEMM library would initialise that shape there): run an eager \
                     step of this size first"
                ),
            });
        }
        let g = Gemm {
            dtypes: (dt(x.dtype())?, dt(w.dtype())?, dt(out.dtype())?),
            addrs: (
                self.addr("linear input", &x)?,
                self.addr("linear weight", &w)?,
                self.addr_mut("linear out", out)?,
            ),
            m,
            n,
            k,
        };
        // SAFETY: the views are this device's memory holding exactly `m·k`, `n·k` and
        // `m·n` elements (their 2-D shapes, checked against each other above); `out` is
        // a unique borrow, so it overlaps neither input.
        unsafe { self.driver.gemm(&g) }.map_err(|e| self.failed("linear", e))
    }

    pub(super) fn rope_inner(&mut self, io: RopeIo<'_>) -> Result<(), CoreError> {
        let n = self.num_tokens;
        let RopeShape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
        } = io.shape;
        let (qkv, k_pool, v_pool) = (&io.qkv, &io.k_pool, &io.v_pool);
        let ok = qkv.len() == n * io.shape.qkv_dim()
            && io.q_out.len() == n * h * d
            && io.q_out.dtype() == qkv.dtype()
            && k_pool.shape() == v_pool.shape()
            && k_pool.dtype() == v_pool.dtype()
            && matches!(k_pool.shape().dims(), [_, _, a, b] if *a == kvh && *b == d)
            && io.cos.dtype() == DType::F32
            && io.sin.dtype() == DType::F32
            && io.cos.len() == io.sin.len()
            && d % 2 == 0
            && io
                .bias
                .as_ref()
                .is_none_or(|b| b.len() == io.shape.qkv_dim() && b.dtype() == DType::F32);
        if !ok {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "rope_write_kv: {n} tokens, qkv {} ({}), q_out {} ({}), pools {} ({}), shape {:?}",
                    qkv.len(),
                    qkv.dtype(),
                    io.q_out.len(),
                    io.q_out.dtype(),
                    k_pool.shape(),
                    k_pool.dtype(),
                    io.shape
                ),
            });
        }
        let dtypes = (dt(qkv.dtype())?, dt(k_pool.dtype())?);
        let prm = RopeKvParams {
            qkv: p::<c_void>(self.addr("qkv", qkv)?),
            bias: match &io.bias {
                Some(b) => p(self.addr("qkv bias", b)?),
                None => std::ptr::null(),
            },
            positions: p(self.section(1)?),
            cos: p(self.addr("rope cos", &io.cos)?),
            sin: p(self.addr("rope sin", &io.sin)?),
            slot_mapping: p(self.section(2)?),
            q_out: p(self.addr_mut("q_out", io.q_out)?),
            k_pool: p(self.addr_mut("K pool", io.k_pool)?),
            v_pool: p(self.addr_mut("V pool", io.v_pool)?),
            num_tokens: i32_of("tokens", n)?,
            num_heads: i32_of("heads", h)?,
            num_kv_heads: i32_of("kv heads", kvh)?,
            head_dim: i32_of("head dim", d)?,
        };
        // SAFETY: shapes checked above; positions were checked < max_pos and slots
        // against the pool by the model and the batch constructor before begin_step.
        unsafe { self.launch("rope_write_kv", Call::RopeKv(prm, dtypes.0, dtypes.1)) }
    }

    pub(super) fn gated_inner(
        &mut self,
        act: GatedAct,
        gate_up: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (rows, inter) = dims2("gated act out", out.shape().dims())?;
        if gate_up.len() != 2 * out.len() || gate_up.dtype() != out.dtype() {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "gated act: gate_up {} ({}), out {} ({})",
                    gate_up.len(),
                    gate_up.dtype(),
                    out.len(),
                    out.dtype()
                ),
            });
        }
        let d = dt(out.dtype())?;
        let prm = GluParams {
            gate_up: p::<c_void>(self.addr("gate_up", &gate_up)?),
            out: p(self.addr_mut("gated act out", out)?),
            rows: i32_of("rows", rows)?,
            inter: i32_of("inter", inter)?,
        };
        let call = match act {
            GatedAct::Silu => Call::SiluMul(prm, d),
            GatedAct::GeluTanh => Call::GeluTanhMul(prm, d),
        };
        // SAFETY: lengths and dtypes checked above.
        unsafe { self.launch("gated_act", call) }
    }

    pub(super) fn gather_inner(
        &mut self,
        x: TensorRef<'_>,
        width: usize,
        first: usize,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let r = out.len().checked_div(width).unwrap_or(0);
        if width == 0
            || x.dtype() != out.dtype()
            || out.len() != r * width
            || first + r > self.num_rows
            || x.len() != self.num_tokens * width
        {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "gather: x {} ({}), out {} ({}), rows {first}..{} of {} of {width}",
                    x.len(),
                    x.dtype(),
                    out.len(),
                    out.dtype(),
                    first + r,
                    self.num_rows
                ),
            });
        }
        let d = dt(x.dtype())?;
        let prm = GatherParams {
            x: p::<c_void>(self.addr("gather input", &x)?),
            rows: p(self.section(3)? + (first * 4) as u64),
            out: p(self.addr_mut("gather out", out)?),
            num_rows: i32_of("rows", r)?,
            dim: i32_of("width", width)?,
        };
        // SAFETY: lengths checked above; rows were checked < tokens by the model.
        unsafe { self.launch("gather_rows", Call::Gather(prm, d)) }
    }
}
