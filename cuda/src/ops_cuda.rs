//! Core's [`ModelOps`] on `cuda:N` (feature `cuda`): the kernels of `cu/model.cu`
//! launched through cudarc on the device's engine stream, the linear layers through
//! [`DeviceGemm`]: cuBLAS, or with `PAGODA_GEMM=cutlass` the CUTLASS kernel wherever it
//! applies (bf16/f16 in and out; the f32 logits of the LM head stay on cuBLAS).
//!
//! The step's integer inputs (ids, positions, slots, logits rows) live in one device
//! buffer at a fixed address, written by one copy from a pinned host buffer in
//! [`ModelOps::begin_step`]; the buffers grow (allocating) only when a step is larger
//! than any before. Every other method only fills a parameter struct and launches: no
//! allocation, no host synchronization, except the two that return host values
//! ([`ModelOps::download_f32`], [`ModelOps::argmax`]).

use crate::gemm::{DeviceGemm, GemmImpl};
use crate::gpu::{engine_stream, kernels};
use crate::ops::dims2;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr as _, PinnedHostSlice};
use pagoda_core::{
    CoreError, DType, Device, DeviceRuntime, GatedAct, GraphId, HostSliceMut, ModelOps, RopeShape,
    StepInputs, TensorMut, TensorRef,
};
use pagoda_cuda_kernels::cuda::CudaKernels;
use pagoda_cuda_kernels::{
    ArgmaxParams, Dtype, EmbedParams, GatherParams, GluParams, NormParams, RopeKvParams,
};
use std::ffi::c_void;
use std::sync::Arc;

fn dt(d: DType) -> Result<Dtype, CoreError> {
    match d {
        DType::F32 => Ok(Dtype::F32),
        DType::BF16 => Ok(Dtype::Bf16),
        DType::F16 => Ok(Dtype::F16),
        DType::F8E4M3 => Err(crate::attn::no_fp8()),
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32, CoreError> {
    i32::try_from(v).map_err(|_| CoreError::InvalidShape {
        message: format!("{what} = {v} does not fit in i32"),
    })
}

/// The model kernels of one CUDA device.
pub struct CudaOps {
    runtime: Arc<dyn DeviceRuntime>,
    device: Device,
    kernels: Arc<CudaKernels>,
    stream: Arc<CudaStream>,
    gemm: DeviceGemm,
    /// The CUTLASS GEMM, when `PAGODA_GEMM=cutlass`.
    cutlass: Option<DeviceGemm>,
    /// `[ids | positions | slots | rows]` of the step, i32.
    step: Option<CudaSlice<i32>>,
    staging: Option<PinnedHostSlice<i32>>,
    /// Tokens and logits rows of the current step.
    num_tokens: usize,
    num_rows: usize,
    argmax_ids: Option<CudaSlice<i32>>,
    argmax_values: Option<CudaSlice<f32>>,
    /// `(tokens, rows)` the step buffer was sized for by `reserve_step`; larger steps
    /// are refused from then on, so the buffer never moves under a captured graph.
    reserved: Option<(usize, usize)>,
    graphs: Vec<Graph>,
}

/// A captured graph (cudarc's `CudaGraph` is not `Send`: it holds raw handles).
struct Graph(cudarc::driver::CudaGraph);

// SAFETY: CUDA graph handles may be used from any thread as long as calls on one graph
// are serialized (CUDA's graph thread-safety rules); `CudaOps` owns its graphs and only
// touches them through `&mut self`.
unsafe impl Send for Graph {}

impl CudaOps {
    /// Kernels for `runtime`'s device, a `cuda:N`.
    pub fn new(runtime: Arc<dyn DeviceRuntime>) -> Result<Self, CoreError> {
        let device = runtime.device();
        let Device::Cuda(ordinal) = device else {
            return Err(CoreError::DeviceMismatch {
                name: "model ops",
                expected: Device::Cuda(0),
                actual: device,
            });
        };
        let failed = |message: String| CoreError::DeviceFailed { device, message };
        let kernels = kernels(ordinal).map_err(failed)?;
        let stream = engine_stream(ordinal).map_err(failed)?;
        let gemm = DeviceGemm::new(ordinal, GemmImpl::Cublas).map_err(|e| failed(e.to_string()))?;
        let cutlass = match std::env::var("PAGODA_GEMM").as_deref() {
            Ok("cutlass") => Some(
                DeviceGemm::new(ordinal, GemmImpl::Cutlass).map_err(|e| failed(e.to_string()))?,
            ),
            _ => None,
        };
        Ok(CudaOps {
            runtime,
            device,
            kernels,
            stream,
            gemm,
            cutlass,
            step: None,
            staging: None,
            num_tokens: 0,
            num_rows: 0,
            argmax_ids: None,
            argmax_values: None,
            reserved: None,
            graphs: Vec::new(),
        })
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> CoreError {
        CoreError::DeviceFailed {
            device: self.device,
            message: format!("{what}: {e}"),
        }
    }

    fn addr(&self, name: &'static str, t: &TensorRef<'_>) -> Result<u64, CoreError> {
        if t.device_of() != self.device {
            return Err(CoreError::DeviceMismatch {
                name,
                expected: self.device,
                actual: t.device_of(),
            });
        }
        t.device_ptr()
            .map(|p| p.addr)
            .ok_or(CoreError::DeviceMismatch {
                name,
                expected: self.device,
                actual: t.device_of(),
            })
    }

    fn addr_mut(&self, name: &'static str, t: &TensorMut<'_>) -> Result<u64, CoreError> {
        self.addr(name, &t.as_ref())
    }

    /// Device address of section `i` (0 ids, 1 positions, 2 slots, 3 rows) of the step.
    fn section(&self, i: usize) -> Result<u64, CoreError> {
        let step = self.step.as_ref().ok_or(CoreError::InvalidBatch {
            message: "a model kernel ran before begin_step".into(),
        })?;
        let (base, _sync) = step.device_ptr(&self.stream);
        let off = match i {
            0 => 0,
            1 => self.num_tokens,
            2 => 2 * self.num_tokens,
            _ => 3 * self.num_tokens,
        };
        Ok(base + (off * 4) as u64)
    }

    /// Grows the step buffer (device + pinned staging) to at least `len` i32s.
    fn ensure_step_buffer(&mut self, len: usize) -> Result<(), CoreError> {
        if self.step.as_ref().is_some_and(|b| b.len() >= len) {
            return Ok(());
        }
        let cap = len.next_power_of_two().max(64);
        self.step = None;
        self.staging = None;
        let b = self
            .stream
            .alloc_zeros::<i32>(cap)
            .map_err(|e| self.failed("allocating the step buffer", e))?;
        // SAFETY: a pinned host allocation of `cap` i32s; it is read only through
        // `as_mut_slice`, after the previous step's copy (every step ends with a
        // download that waits for the stream).
        let h = unsafe { self.kernels.context().alloc_pinned::<i32>(cap) }
            .map_err(|e| self.failed("allocating the pinned step buffer", e))?;
        self.step = Some(b);
        self.staging = Some(h);
        Ok(())
    }

    fn check_tokens(&self, name: &'static str, rows: usize) -> Result<(), CoreError> {
        if rows == self.num_tokens {
            Ok(())
        } else {
            Err(CoreError::ShapeMismatch {
                name,
                expected: self.num_tokens,
                actual: rows,
            })
        }
    }
}

fn p<T>(addr: u64) -> *mut T {
    addr as usize as *mut T
}

impl ModelOps for CudaOps {
    fn device(&self) -> Device {
        self.device
    }

    fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.runtime
    }

    fn begin_step(&mut self, s: &StepInputs<'_>) -> Result<(), CoreError> {
        let n = s.input_ids.len();
        if s.positions.len() != n || s.slot_mapping.len() != n {
            return Err(CoreError::InvalidBatch {
                message: format!(
                    "{n} input ids, {} positions, {} slots",
                    s.positions.len(),
                    s.slot_mapping.len()
                ),
            });
        }
        let r = s.logits_rows.len();
        if let Some((max_tokens, max_rows)) = self.reserved {
            if n > max_tokens || r > max_rows {
                return Err(CoreError::Graph {
                    message: format!(
                        "a step of {n} tokens and {r} logits rows exceeds the {max_tokens} and \
                         {max_rows} reserved before capture"
                    ),
                });
            }
        }
        let len = 3 * n + r;
        self.ensure_step_buffer(len)?;
        let staging = self.staging.as_mut().expect("allocated above");
        let host = staging
            .as_mut_slice()
            .map_err(|e| CoreError::DeviceFailed {
                device: self.device,
                message: format!("waiting for the previous step's copy: {e}"),
            })?;
        let bad = |what: &str, v: u64| CoreError::InvalidBatch {
            message: format!("{what} {v} does not fit in i32"),
        };
        for (d, &x) in host[..n].iter_mut().zip(s.input_ids) {
            *d = i32::try_from(x).map_err(|_| bad("token id", x.into()))?;
        }
        for (d, &x) in host[n..2 * n].iter_mut().zip(s.positions) {
            *d = i32::try_from(x).map_err(|_| bad("position", x.into()))?;
        }
        for (d, &x) in host[2 * n..3 * n].iter_mut().zip(s.slot_mapping) {
            *d = if x < 0 {
                -1
            } else {
                i32::try_from(x).map_err(|_| bad("slot", x as u64))?
            };
        }
        for (d, &x) in host[3 * n..len].iter_mut().zip(s.logits_rows) {
            *d = i32::try_from(x).map_err(|_| bad("logits row", x.into()))?;
        }
        let step = self.step.as_mut().expect("allocated above");
        // The whole (power-of-two) buffer: one copy, the tail unused.
        self.stream
            .memcpy_htod(staging, step)
            .map_err(|e| CoreError::DeviceFailed {
                device: self.device,
                message: format!("copying the step's inputs: {e}"),
            })?;
        self.num_tokens = n;
        self.num_rows = r;
        Ok(())
    }

    fn embed(
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
        let prm = EmbedParams {
            ids: p(self.section(0)?),
            table: p::<c_void>(self.addr("table", &table)?),
            out: p(self.addr_mut("embed out", &out)?),
            num_tokens: i32_of("tokens", rows)?,
            hidden: i32_of("hidden", hidden)?,
            scale,
            pad: 0,
        };
        // SAFETY: the views hold `[vocab, hidden]` and `[rows, hidden]` elements of their
        // dtypes on this device (core's device views); ids were checked < vocab by the
        // model before begin_step.
        unsafe {
            self.kernels
                .embed(&self.stream, &prm, dt(table.dtype())?, dt(out.dtype())?)
        }
        .map_err(|e| self.failed("embed", e))
    }

    fn rms_norm(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        w_offset: f32,
        eps: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let dim = w.len();
        if dim == 0
            || x.len() != out.len()
            || !x.len().is_multiple_of(dim)
            || w.dtype() != DType::F32
        {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "rms_norm: x {} elements, weight {dim} (f32), out {}",
                    x.len(),
                    out.len()
                ),
            });
        }
        let prm = NormParams {
            x: p::<c_void>(self.addr("norm input", &x)?),
            residual: std::ptr::null_mut(),
            weight: p(self.addr("norm weight", &w)?),
            out: p(self.addr_mut("norm out", &out)?),
            rows: i32_of("rows", x.len() / dim)?,
            dim: i32_of("dim", dim)?,
            eps,
            w_offset,
        };
        // SAFETY: lengths checked above; all views are this device's memory.
        unsafe {
            self.kernels
                .rms_norm(&self.stream, &prm, dt(x.dtype())?, dt(out.dtype())?)
        }
        .map_err(|e| self.failed("rms_norm", e))
    }

    fn add_rms_norm(
        &mut self,
        residual: TensorMut<'_>,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        w_offset: f32,
        eps: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let dim = w.len();
        let ok = dim > 0
            && residual.dtype() == DType::F32
            && w.dtype() == DType::F32
            && x.len() == residual.len()
            && out.len() == x.len()
            && x.len().is_multiple_of(dim);
        if !ok {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "add_rms_norm: residual {} ({}), x {}, weight {dim}, out {}",
                    residual.len(),
                    residual.dtype(),
                    x.len(),
                    out.len()
                ),
            });
        }
        let prm = NormParams {
            x: p::<c_void>(self.addr("residual add input", &x)?),
            residual: p(self.addr_mut("residual", &residual)?),
            weight: p(self.addr("norm weight", &w)?),
            out: p(self.addr_mut("norm out", &out)?),
            rows: i32_of("rows", x.len() / dim)?,
            dim: i32_of("dim", dim)?,
            eps,
            w_offset,
        };
        // SAFETY: lengths and dtypes checked above; all views are this device's memory.
        unsafe {
            self.kernels
                .add_rms_norm(&self.stream, &prm, dt(x.dtype())?, dt(out.dtype())?)
        }
        .map_err(|e| self.failed("add_rms_norm", e))
    }

    fn linear(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        mut out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (m, k) = dims2("linear input", x.shape().dims())?;
        let (n, _) = dims2("linear weight", w.shape().dims())?;
        let (xd, wd, od) = (dt(x.dtype())?, dt(w.dtype())?, dt(out.dtype())?);
        let g = match &self.cutlass {
            Some(c) if c.supports((m, n, k), xd, wd, od).is_ok() => c,
            _ => &self.gemm,
        };
        g.gemm(&x, &w, &mut out, m, n, k)
            .map_err(|e| self.failed("linear", e))
    }

    fn rope_write_kv(
        &mut self,
        qkv: TensorRef<'_>,
        bias: Option<TensorRef<'_>>,
        cos: TensorRef<'_>,
        sin: TensorRef<'_>,
        shape: RopeShape,
        q_out: TensorMut<'_>,
        k_pool: TensorMut<'_>,
        v_pool: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let n = self.num_tokens;
        let RopeShape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
        } = shape;
        let ok = qkv.len() == n * shape.qkv_dim()
            && q_out.len() == n * h * d
            && q_out.dtype() == qkv.dtype()
            && k_pool.shape() == v_pool.shape()
            && k_pool.dtype() == v_pool.dtype()
            && matches!(k_pool.shape().dims(), [_, _, a, b] if *a == kvh && *b == d)
            && cos.dtype() == DType::F32
            && sin.dtype() == DType::F32
            && cos.len() == sin.len()
            && d % 2 == 0
            && bias
                .as_ref()
                .is_none_or(|b| b.len() == shape.qkv_dim() && b.dtype() == DType::F32);
        if !ok {
            return Err(CoreError::InvalidShape {
                message: format!(
                    "rope_write_kv: {n} tokens, qkv {} ({}), q_out {} ({}), pools {} ({}), shape {shape:?}",
                    qkv.len(),
                    qkv.dtype(),
                    q_out.len(),
                    q_out.dtype(),
                    k_pool.shape(),
                    k_pool.dtype()
                ),
            });
        }
        let prm = RopeKvParams {
            qkv: p::<c_void>(self.addr("qkv", &qkv)?),
            bias: match &bias {
                Some(b) => p(self.addr("qkv bias", b)?),
                None => std::ptr::null(),
            },
            positions: p(self.section(1)?),
            cos: p(self.addr("rope cos", &cos)?),
            sin: p(self.addr("rope sin", &sin)?),
            slot_mapping: p(self.section(2)?),
            q_out: p(self.addr_mut("q_out", &q_out)?),
            k_pool: p(self.addr_mut("K pool", &k_pool)?),
            v_pool: p(self.addr_mut("V pool", &v_pool)?),
            num_tokens: i32_of("tokens", n)?,
            num_heads: i32_of("heads", h)?,
            num_kv_heads: i32_of("kv heads", kvh)?,
            head_dim: i32_of("head dim", d)?,
        };
        // SAFETY: shapes checked above; positions were checked < max_pos and slots
        // against the pool by the model and the batch constructor before begin_step.
        unsafe {
            self.kernels
                .rope_write_kv(&self.stream, &prm, dt(qkv.dtype())?, dt(k_pool.dtype())?)
        }
        .map_err(|e| self.failed("rope_write_kv", e))
    }

    fn gated_act(
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
        let prm = GluParams {
            gate_up: p::<c_void>(self.addr("gate_up", &gate_up)?),
            out: p(self.addr_mut("gated act out", &out)?),
            rows: i32_of("rows", rows)?,
            inter: i32_of("inter", inter)?,
        };
        let d = dt(out.dtype())?;
        // SAFETY: lengths and dtypes checked above.
        unsafe {
            match act {
                GatedAct::Silu => self.kernels.silu_mul(&self.stream, &prm, d),
                GatedAct::GeluTanh => self.kernels.gelu_tanh_mul(&self.stream, &prm, d),
            }
        }
        .map_err(|e| self.failed("gated_act", e))
    }

    fn gather_logits_rows(
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
                    "gather: x {} ({}), out {} ({}), rows {first}.. of {} of {width}",
                    x.len(),
                    x.dtype(),
                    out.len(),
                    out.dtype(),
                    self.num_rows
                ),
            });
        }
        let prm = GatherParams {
            x: p::<c_void>(self.addr("gather input", &x)?),
            rows: p(self.section(3)? + (first * 4) as u64),
            out: p(self.addr_mut("gather out", &out)?),
            num_rows: i32_of("rows", r)?,
            dim: i32_of("width", width)?,
        };
        // SAFETY: lengths checked above; rows were checked < tokens by the model.
        unsafe { self.kernels.gather_rows(&self.stream, &prm, dt(x.dtype())?) }
            .map_err(|e| self.failed("gather_rows", e))
    }

    fn download_f32(&mut self, x: TensorRef<'_>, out: &mut [f32]) -> Result<(), CoreError> {
        if x.dtype() != DType::F32 {
            return Err(CoreError::DTypeMismatch {
                name: "download source",
                expected: DType::F32,
                actual: x.dtype(),
            });
        }
        self.runtime.download(x, HostSliceMut::F32(out))
    }

    fn argmax(&mut self, logits: TensorRef<'_>, ids: &mut [u32]) -> Result<(), CoreError> {
        let (rows, vocab) = dims2("logits", logits.shape().dims())?;
        if ids.len() != rows {
            return Err(CoreError::ShapeMismatch {
                name: "argmax ids",
                expected: rows,
                actual: ids.len(),
            });
        }
        if rows == 0 {
            return Ok(());
        }
        if self.argmax_ids.as_ref().is_none_or(|b| b.len() < rows) {
            let cap = rows.next_power_of_two();
            self.argmax_ids = Some(
                self.stream
                    .alloc_zeros::<i32>(cap)
                    .map_err(|e| self.failed("argmax buffer", e))?,
            );
            self.argmax_values = Some(
                self.stream
                    .alloc_zeros::<f32>(cap)
                    .map_err(|e| self.failed("argmax buffer", e))?,
            );
        }
        let (ids_addr, vals_addr) = {
            let a = self.argmax_ids.as_ref().expect("allocated above");
            let b = self.argmax_values.as_ref().expect("allocated above");
            (a.device_ptr(&self.stream).0, b.device_ptr(&self.stream).0)
        };
        let prm = ArgmaxParams {
            logits: p::<c_void>(self.addr("logits", &logits)?),
            ids: p(ids_addr),
            values: p(vals_addr),
            rows: i32_of("rows", rows)?,
            vocab: i32_of("vocab", vocab)?,
        };
        // SAFETY: `[rows, vocab]` logits on this device; the outputs hold >= rows.
        unsafe { self.kernels.argmax(&self.stream, &prm, dt(logits.dtype())?) }
            .map_err(|e| self.failed("argmax", e))?;
        let mut host = vec![0i32; self.argmax_ids.as_ref().map_or(0, |b| b.len())];
        self.stream
            .memcpy_dtoh(
                self.argmax_ids.as_ref().expect("allocated above"),
                &mut host,
            )
            .map_err(|e| self.failed("argmax download", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.failed("argmax download", e))?;
        for (d, &s) in ids.iter_mut().zip(&host) {
            *d = s.max(0) as u32;
        }
        Ok(())
    }

    fn reserve_step(&mut self, max_tokens: usize, max_rows: usize) -> Result<(), CoreError> {
        if let Some(r) = self.reserved {
            if r != (max_tokens, max_rows) {
                return Err(CoreError::Graph {
                    message: format!(
                        "step buffer already reserved for {r:?}, not ({max_tokens}, {max_rows})"
                    ),
                });
            }
            return Ok(());
        }
        self.ensure_step_buffer(3 * max_tokens + max_rows)?;
        self.reserved = Some((max_tokens, max_rows));
        Ok(())
    }

    fn begin_capture(&mut self) -> Result<(), CoreError> {
        if self.reserved.is_none() {
            return Err(CoreError::Graph {
                message: "reserve_step must size the step buffer before a capture".into(),
            });
        }
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|e| self.failed("beginning a stream capture", e))
    }

    fn end_capture(&mut self) -> Result<GraphId, CoreError> {
        let g = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(|e| self.failed("ending the stream capture", e))?
            .ok_or_else(|| self.failed("ending the stream capture", "no graph was captured"))?;
        // Uploaded now: the first replay must not pay for it.
        g.upload()
            .map_err(|e| self.failed("uploading the graph", e))?;
        self.graphs.push(Graph(g));
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn abort_capture(&mut self) {
        // Ending the capture discards what was recorded; its error (the capture was
        // already invalidated) is the one being reported by the caller.
        let _ = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    }

    unsafe fn replay(&mut self, id: GraphId) -> Result<(), CoreError> {
        let g = self.graphs.get(id.0).ok_or_else(|| CoreError::Graph {
            message: format!("no graph {}", id.0),
        })?;
        g.0.launch()
            .map_err(|e| self.failed("launching a CUDA graph", e))
    }
}

/// The registration's entry for `cuda`.
pub(crate) fn open(runtime: Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError> {
    Ok(Box::new(CudaOps::new(runtime)?))
}
