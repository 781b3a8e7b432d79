//! Core's [`ModelOps`] (the non-attention kernels of the device forward) on the `emu`
//! device: the kernels of `cu/model.cu` compiled for the host through the SIMT
//! emulator (`pagoda_cuda_kernels::emu_model`), the linear layers' GEMM on the CPU
//! ([`crate::gemm::gemm_host`]), on host buffers tagged `emu`.
//!
//! Every buffer's device, dtype and shape is checked here against what the op needs;
//! the kernels' wrappers then check lengths and indices (token ids against the table,
//! positions against the RoPE tables, slots against the pools), so bad input is an
//! error, never a panic.

use crate::gemm::{check_dtypes, check_lens, gemm_host, GemmError};
use pagoda_core::{
    register_model_ops, CoreError, Device, DeviceKind, DeviceRuntime, GatedAct, GraphId, HostSlice,
    HostSliceMut, ModelOps, ModelOpsRegistration, RopeShape, StepInputs, TensorMut, TensorRef,
};
use pagoda_cuda_kernels::emu_model::{self, RopeKvIo, RopeKvShape};
use pagoda_cuda_kernels::graph::{self, EmuGraph};
use pagoda_cuda_kernels::Element;
use std::sync::Arc;

/// Calls `$body` with `$x` bound to the typed host slice of a read view (an fp8
/// slice returns the error from the enclosing function: no kernel reads fp8).
macro_rules! with_ref {
    ($s:expr, $x:ident => $body:expr) => {
        match $s {
            HostSlice::F32($x) => $body,
            HostSlice::F16($x) => $body,
            HostSlice::BF16($x) => $body,
            HostSlice::F8E4M3(_) => return Err(crate::attn::no_fp8()),
        }
    };
}

/// Calls `$body` with `$x` bound to the typed host slice of a write view (fp8: as
/// in `with_ref`).
macro_rules! with_mut {
    ($s:expr, $x:ident => $body:expr) => {
        match $s {
            HostSliceMut::F32($x) => $body,
            HostSliceMut::F16($x) => $body,
            HostSliceMut::BF16($x) => $body,
            HostSliceMut::F8E4M3(_) => return Err(crate::attn::no_fp8()),
        }
    };
}

fn kernel_err(op: &'static str, e: impl std::fmt::Display) -> CoreError {
    CoreError::DeviceFailed {
        device: Device::Emu,
        message: format!("{op}: {e}"),
    }
}

fn on_emu(name: &'static str, device: Device) -> Result<(), CoreError> {
    if device == Device::Emu {
        Ok(())
    } else {
        Err(CoreError::DeviceMismatch {
            name,
            expected: Device::Emu,
            actual: device,
        })
    }
}

fn host_ref<'a>(name: &'static str, t: &TensorRef<'a>) -> Result<HostSlice<'a>, CoreError> {
    on_emu(name, t.device_of())?;
    t.host_slice().ok_or(CoreError::NotOnHost {
        name,
        device: t.device_of(),
    })
}

fn host_mut<'a>(name: &'static str, t: TensorMut<'a>) -> Result<HostSliceMut<'a>, CoreError> {
    on_emu(name, t.device_of())?;
    let device = t.device_of();
    t.into_host_slice()
        .ok_or(CoreError::NotOnHost { name, device })
}

fn f32_ref<'a>(name: &'static str, t: &TensorRef<'a>) -> Result<&'a [f32], CoreError> {
    on_emu(name, t.device_of())?;
    t.as_f32(name)
}

fn f32_mut<'a>(name: &'static str, t: TensorMut<'a>) -> Result<&'a mut [f32], CoreError> {
    on_emu(name, t.device_of())?;
    t.into_f32(name)
}

/// `[rows, cols]` of a 2-D view.
pub(crate) fn dims2(name: &str, shape: &[usize]) -> Result<(usize, usize), CoreError> {
    match shape {
        [r, c] => Ok((*r, *c)),
        d => Err(CoreError::InvalidShape {
            message: format!("`{name}` must be 2-D, got {d:?}"),
        }),
    }
}

fn to_i32<T: Copy + TryInto<i32>>(
    name: &'static str,
    v: &[T],
    out: &mut Vec<i32>,
) -> Result<(), CoreError> {
    out.clear();
    for &x in v {
        out.push(x.try_into().map_err(|_| CoreError::InvalidBatch {
            message: format!("a `{name}` value does not fit in i32"),
        })?);
    }
    Ok(())
}

/// The model kernels on `emu`.
pub struct EmuOps {
    runtime: Arc<dyn DeviceRuntime>,
    /// The step's integer inputs, as the kernels take them (i32): the emu's "device
    /// buffers", refilled in place (a captured launch reads them at their addresses).
    ids: Vec<i32>,
    positions: Vec<i32>,
    slots: Vec<i32>,
    rows: Vec<i32>,
    /// `(tokens, rows)` fixed by `reserve_step`: steps beyond are refused, so the
    /// buffers above never move.
    reserved: Option<(usize, usize)>,
    /// Argmax values (the kernel writes them; the caller wants the ids).
    values: Vec<f32>,
    ids_out: Vec<i32>,
    /// Captured graphs, by [`GraphId`].
    graphs: Vec<EmuGraph>,
    /// GEMM shapes `(m, n, k)` run eagerly: as cuBLAS, which picks an algorithm (and
    /// may allocate) for each new problem size, a shape first met inside a capture is
    /// refused (so every graph size needs its eager warm-up step).
    gemm_shapes: std::collections::HashSet<(usize, usize, usize)>,
}

impl EmuOps {
    /// Kernels for `runtime`'s device, which must be `emu`.
    pub fn new(runtime: Arc<dyn DeviceRuntime>) -> Result<Self, CoreError> {
        on_emu("model ops", runtime.device())?;
        Ok(EmuOps {
            runtime,
            ids: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            rows: Vec::new(),
            reserved: None,
            values: Vec::new(),
            ids_out: Vec::new(),
            graphs: Vec::new(),
            gemm_shapes: Default::default(),
        })
    }

    /// Downloads wait for the device: not while capturing.
    fn not_capturing(op: &'static str) -> Result<(), CoreError> {
        if graph::is_capturing() {
            Err(CoreError::Graph {
                message: format!("{op} waits for the device, which a capture cannot"),
            })
        } else {
            Ok(())
        }
    }
}

/// `gemm_host`, run now or recorded into the capture in progress (its slices as raw
/// parts: a replay reads the buffers at their captured addresses).
fn gemm_launch<X: Element, W: Element, O: Element>(
    x: &[X],
    w: &[W],
    out: &mut [O],
    (m, n, k): (usize, usize, usize),
) -> Result<(), GemmError> {
    if !graph::is_capturing() {
        return gemm_host(x, w, out, m, n, k);
    }
    check_dtypes(X::DTYPE, W::DTYPE, O::DTYPE)?;
    check_lens([x.len(), w.len(), out.len()], m, n, k)?;
    let (xp, xl) = (x.as_ptr() as usize, x.len());
    let (wp, wl) = (w.as_ptr() as usize, w.len());
    let (op, ol) = (out.as_mut_ptr() as usize, out.len());
    graph::launch("gemm", move || {
        // SAFETY: the slices were valid at capture; `EmuGraph::replay`'s caller
        // guarantees they still are, at the same addresses, unaliased.
        let (x, w, out) = unsafe {
            (
                std::slice::from_raw_parts(xp as *const X, xl),
                std::slice::from_raw_parts(wp as *const W, wl),
                std::slice::from_raw_parts_mut(op as *mut O, ol),
            )
        };
        i32::from(gemm_host(x, w, out, m, n, k).is_err())
    });
    Ok(())
}

impl ModelOps for EmuOps {
    fn device(&self) -> Device {
        Device::Emu
    }

    fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.runtime
    }

    fn begin_step(&mut self, step: &StepInputs<'_>) -> Result<(), CoreError> {
        let n = step.input_ids.len();
        if step.positions.len() != n || step.slot_mapping.len() != n {
            return Err(CoreError::InvalidBatch {
                message: format!(
                    "{n} input ids, {} positions, {} slots",
                    step.positions.len(),
                    step.slot_mapping.len()
                ),
            });
        }
        if let Some((max_tokens, max_rows)) = self.reserved {
            if n > max_tokens || step.logits_rows.len() > max_rows {
                return Err(CoreError::Graph {
                    message: format!(
                        "a step of {n} tokens and {} logits rows exceeds the {max_tokens} and \
                         {max_rows} reserved before capture",
                        step.logits_rows.len()
                    ),
                });
            }
        }
        to_i32("input_ids", step.input_ids, &mut self.ids)?;
        to_i32("positions", step.positions, &mut self.positions)?;
        self.slots.clear();
        for &s in step.slot_mapping {
            // Every negative slot is padding; the kernels take -1.
            self.slots.push(if s < 0 {
                -1
            } else {
                i32::try_from(s).map_err(|_| CoreError::InvalidBatch {
                    message: format!("slot {s} does not fit in i32"),
                })?
            });
        }
        to_i32("logits_rows", step.logits_rows, &mut self.rows)
    }

    fn embed(
        &mut self,
        table: TensorRef<'_>,
        scale: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (_, hidden) = dims2("table", table.shape().dims())?;
        let t = host_ref("table", &table)?;
        let o = host_mut("embed out", out)?;
        let ids = &self.ids;
        with_ref!(t, t => with_mut!(o, o => emu_model::embed(ids, t, hidden, scale, o)))
            .map_err(|e| kernel_err("embed", e))
    }

    fn rms_norm(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        w_offset: f32,
        eps: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let w = f32_ref("norm weight", &w)?;
        let x = host_ref("norm input", &x)?;
        let o = host_mut("norm out", out)?;
        with_ref!(x, x => with_mut!(o, o => emu_model::rms_norm(x, w, eps, w_offset, o)))
            .map_err(|e| kernel_err("rms_norm", e))
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
        let w = f32_ref("norm weight", &w)?;
        let r = f32_mut("residual", residual)?;
        let x = host_ref("residual add input", &x)?;
        let o = host_mut("norm out", out)?;
        with_ref!(x, x => with_mut!(o, o => emu_model::add_rms_norm(r, x, w, eps, w_offset, o)))
            .map_err(|e| kernel_err("add_rms_norm", e))
    }

    fn linear(
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
        if !graph::is_capturing() {
            self.gemm_shapes.insert((m, n, k));
        } else if !self.gemm_shapes.contains(&(m, n, k)) {
            return Err(CoreError::Graph {
                message: format!(
                    "linear: a GEMM of [{m}, {k}] x [{n}, {k}]ᵀ first met inside a capture \
                     (cuBLAS would initialise that shape there): run an eager step of this \
                     size first"
                ),
            });
        }
        let xs = host_ref("linear input", &x)?;
        let ws = host_ref("linear weight", &w)?;
        let o = host_mut("linear out", out)?;
        with_ref!(xs, xs => with_ref!(ws, ws => with_mut!(o, o => gemm_launch(xs, ws, o, (m, n, k)))))
            .map_err(|e| kernel_err("linear", e))
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
        let block_size = match k_pool.shape().dims() {
            [_, bs, h, d] if *h == shape.num_kv_heads && *d == shape.head_dim => *bs,
            d => {
                return Err(CoreError::InvalidShape {
                    message: format!(
                        "K pool {d:?}, expected [blocks, block_size, {}, {}]",
                        shape.num_kv_heads, shape.head_dim
                    ),
                })
            }
        };
        if v_pool.shape() != k_pool.shape() || v_pool.dtype() != k_pool.dtype() {
            return Err(CoreError::InvalidShape {
                message: "the V pool differs from the K pool in shape or dtype".into(),
            });
        }
        if q_out.dtype() != qkv.dtype() {
            return Err(CoreError::DTypeMismatch {
                name: "q_out",
                expected: qkv.dtype(),
                actual: q_out.dtype(),
            });
        }
        let bias = bias.map(|b| f32_ref("qkv bias", &b)).transpose()?;
        let cos = f32_ref("rope cos", &cos)?;
        let sin = f32_ref("rope sin", &sin)?;
        let ks = RopeKvShape {
            num_heads: shape.num_heads,
            num_kv_heads: shape.num_kv_heads,
            head_dim: shape.head_dim,
            block_size,
        };
        let qkv = host_ref("qkv", &qkv)?;
        let q = host_mut("q_out", q_out)?;
        let k = host_mut("K pool", k_pool)?;
        let v = host_mut("V pool", v_pool)?;
        let (positions, slots) = (&self.positions, &self.slots);
        macro_rules! go {
            ($qkv:expr, $q:expr, $k:expr, $v:expr) => {
                emu_model::rope_write_kv(
                    RopeKvIo {
                        qkv: $qkv,
                        bias,
                        positions,
                        cos,
                        sin,
                        slot_mapping: slots,
                        q_out: $q,
                        k_pool: $k,
                        v_pool: $v,
                    },
                    &ks,
                )
            };
        }
        macro_rules! kv_arms {
            ($qkv:expr, $q:expr) => {
                match (k, v) {
                    (HostSliceMut::F32(k), HostSliceMut::F32(v)) => go!($qkv, $q, k, v),
                    (HostSliceMut::BF16(k), HostSliceMut::BF16(v)) => go!($qkv, $q, k, v),
                    (HostSliceMut::F16(k), HostSliceMut::F16(v)) => go!($qkv, $q, k, v),
                    _ => Err(mixed("K and V pools")),
                }
            };
        }
        let r = match (qkv, q) {
            (HostSlice::F32(a), HostSliceMut::F32(q)) => kv_arms!(a, q),
            (HostSlice::BF16(a), HostSliceMut::BF16(q)) => kv_arms!(a, q),
            (HostSlice::F16(a), HostSliceMut::F16(q)) => kv_arms!(a, q),
            _ => Err(mixed("qkv and q_out")),
        };
        r.map_err(|e| kernel_err("rope_write_kv", e))
    }

    fn gated_act(
        &mut self,
        act: GatedAct,
        gate_up: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (_, inter) = dims2("gated act out", out.shape().dims())?;
        if gate_up.dtype() != out.dtype() {
            return Err(CoreError::DTypeMismatch {
                name: "gated act out",
                expected: gate_up.dtype(),
                actual: out.dtype(),
            });
        }
        let g = host_ref("gate_up", &gate_up)?;
        let o = host_mut("gated act out", out)?;
        let r = match (g, o) {
            (HostSlice::F32(g), HostSliceMut::F32(o)) => glu(act, g, inter, o),
            (HostSlice::BF16(g), HostSliceMut::BF16(o)) => glu(act, g, inter, o),
            (HostSlice::F16(g), HostSliceMut::F16(o)) => glu(act, g, inter, o),
            _ => Err(mixed("input and output")),
        };
        r.map_err(|e| kernel_err("gated_act", e))
    }

    fn gather_logits_rows(
        &mut self,
        x: TensorRef<'_>,
        width: usize,
        first: usize,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        if x.dtype() != out.dtype() {
            return Err(CoreError::DTypeMismatch {
                name: "gathered rows",
                expected: x.dtype(),
                actual: out.dtype(),
            });
        }
        let xs = host_ref("gather input", &x)?;
        let o = host_mut("gather out", out)?;
        let count = o.len().checked_div(width).unwrap_or(0);
        let rows = self
            .rows
            .get(first..first + count)
            .ok_or_else(|| CoreError::InvalidShape {
                message: format!(
                    "gather: rows {first}..{} of the step's {}",
                    first + count,
                    self.rows.len()
                ),
            })?;
        let r = match (xs, o) {
            (HostSlice::F32(x), HostSliceMut::F32(o)) => emu_model::gather_rows(x, width, rows, o),
            (HostSlice::BF16(x), HostSliceMut::BF16(o)) => {
                emu_model::gather_rows(x, width, rows, o)
            }
            (HostSlice::F16(x), HostSliceMut::F16(o)) => emu_model::gather_rows(x, width, rows, o),
            _ => Err(mixed("input and output")),
        };
        r.map_err(|e| kernel_err("gather_rows", e))
    }

    fn download_f32(&mut self, x: TensorRef<'_>, out: &mut [f32]) -> Result<(), CoreError> {
        Self::not_capturing("download")?;
        let xs = host_ref("download source", &x)?;
        if xs.len() != out.len() {
            return Err(CoreError::ShapeMismatch {
                name: "download destination",
                expected: xs.len(),
                actual: out.len(),
            });
        }
        match xs {
            HostSlice::F32(x) => out.copy_from_slice(x),
            other => out
                .iter_mut()
                .enumerate()
                .for_each(|(i, o)| *o = other.at(i)),
        }
        Ok(())
    }

    fn argmax(&mut self, logits: TensorRef<'_>, ids: &mut [u32]) -> Result<(), CoreError> {
        Self::not_capturing("argmax")?;
        let (rows, vocab) = dims2("logits", logits.shape().dims())?;
        if ids.len() != rows {
            return Err(CoreError::ShapeMismatch {
                name: "argmax ids",
                expected: rows,
                actual: ids.len(),
            });
        }
        self.ids_out.resize(rows, 0);
        self.values.resize(rows, 0.0);
        let l = host_ref("logits", &logits)?;
        let (io, vo) = (&mut self.ids_out, &mut self.values);
        with_ref!(l, l => emu_model::argmax(l, vocab, io, vo))
            .map_err(|e| kernel_err("argmax", e))?;
        for (d, &s) in ids.iter_mut().zip(self.ids_out.iter()) {
            *d = s as u32;
        }
        Ok(())
    }

    fn reserve_step(&mut self, max_tokens: usize, max_rows: usize) -> Result<(), CoreError> {
        if let Some(r) = self.reserved {
            if r != (max_tokens, max_rows) {
                return Err(CoreError::Graph {
                    message: format!(
                        "step buffers already reserved for {r:?}, not ({max_tokens}, {max_rows})"
                    ),
                });
            }
            return Ok(());
        }
        for v in [&mut self.ids, &mut self.positions, &mut self.slots] {
            v.reserve_exact(max_tokens.saturating_sub(v.len()));
        }
        self.rows
            .reserve_exact(max_rows.saturating_sub(self.rows.len()));
        self.reserved = Some((max_tokens, max_rows));
        Ok(())
    }

    fn begin_capture(&mut self) -> Result<(), CoreError> {
        if self.reserved.is_none() {
            return Err(CoreError::Graph {
                message: "reserve_step must size the step buffers before a capture".into(),
            });
        }
        graph::begin_capture().map_err(|e| kernel_err("begin_capture", e))
    }

    fn end_capture(&mut self) -> Result<GraphId, CoreError> {
        let g = graph::end_capture().map_err(|e| kernel_err("end_capture", e))?;
        self.graphs.push(g);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn abort_capture(&mut self) {
        graph::abort_capture();
    }

    unsafe fn replay(&mut self, id: GraphId) -> Result<(), CoreError> {
        let g = self.graphs.get(id.0).ok_or_else(|| CoreError::Graph {
            message: format!("no graph {}", id.0),
        })?;
        // SAFETY: the caller's promise (ModelOps::replay); the step buffers did not
        // move since `reserve_step` (larger steps are refused).
        unsafe { g.replay() }.map_err(|e| kernel_err("replay", e))
    }
}

/// Two buffers that must share a dtype do not (checked before; kept as an error,
/// not a panic).
fn mixed(what: &str) -> pagoda_cuda_kernels::Error {
    pagoda_cuda_kernels::Error::Invalid {
        what: "dtypes",
        detail: format!("{what} differ in dtype"),
    }
}

fn glu<T: pagoda_cuda_kernels::Element>(
    act: GatedAct,
    g: &[T],
    inter: usize,
    o: &mut [T],
) -> Result<(), pagoda_cuda_kernels::Error> {
    match act {
        GatedAct::Silu => emu_model::silu_mul(g, inter, o),
        GatedAct::GeluTanh => emu_model::gelu_tanh_mul(g, inter, o),
    }
}

fn open(runtime: Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError> {
    Ok(Box::new(EmuOps::new(runtime)?))
}

register_model_ops!(ModelOpsRegistration {
    kind: DeviceKind::Emu,
    provider: "pagoda-cuda",
    open,
});

/// The `cuda` family's model kernels: `ops_cuda.rs` with the feature; without it the
/// device cannot be opened in the first place (its runtime says "not compiled with CUDA").
fn open_cuda(runtime: Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError> {
    #[cfg(feature = "cuda")]
    {
        crate::ops_cuda::open(runtime)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CoreError::DeviceUnavailable {
            device: runtime.device(),
            message: crate::NOT_COMPILED.into(),
        })
    }
}

register_model_ops!(ModelOpsRegistration {
    kind: DeviceKind::Cuda,
    provider: "pagoda-cuda",
    open: open_cuda,
});

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_core::{open_device, DType, Shape};

    /// As cuBLAS, which initialises each new problem size on first use: a GEMM shape
    /// first met inside a capture is refused, one run eagerly before is recorded.
    #[test]
    fn a_gemm_shape_first_met_in_a_capture_is_refused() {
        let rt = open_device(Device::Emu).unwrap();
        let mut ops = EmuOps::new(rt.clone()).unwrap();
        ops.reserve_step(4, 4).unwrap();
        let w = rt
            .alloc_zeroed(DType::F32, Shape::new(&[3, 8]).unwrap())
            .unwrap();
        let x2 = rt
            .alloc_zeroed(DType::F32, Shape::new(&[2, 8]).unwrap())
            .unwrap();
        let x4 = rt
            .alloc_zeroed(DType::F32, Shape::new(&[4, 8]).unwrap())
            .unwrap();
        let mut o2 = rt
            .alloc_zeroed(DType::F32, Shape::new(&[2, 3]).unwrap())
            .unwrap();
        let mut o4 = rt
            .alloc_zeroed(DType::F32, Shape::new(&[4, 3]).unwrap())
            .unwrap();
        ops.linear(x2.view(), w.view(), o2.view_mut()).unwrap();
        ops.begin_capture().unwrap();
        let seen = ops.linear(x2.view(), w.view(), o2.view_mut());
        let new = ops.linear(x4.view(), w.view(), o4.view_mut());
        ops.abort_capture();
        seen.unwrap();
        let e = new.unwrap_err().to_string();
        assert!(e.contains("first met inside a capture"), "{e}");
        // Warmed up eagerly, the same shape captures.
        ops.linear(x4.view(), w.view(), o4.view_mut()).unwrap();
        ops.begin_capture().unwrap();
        let warmed = ops.linear(x4.view(), w.view(), o4.view_mut());
        ops.abort_capture();
        warmed.unwrap();
    }
}
