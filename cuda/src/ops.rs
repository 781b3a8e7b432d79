//! Core's [`ModelOps`] (the device forward's non-attention kernels) on both CUDA
//! devices: one implementation, `DeviceOps`, over the device's `Driver` (the families'
//! extras in `ops/families.rs`).
//!
//! On `emu` the kernels of `cu/model.cu` run in the SIMT emulator and the linear layers
//! on the CPU ([`crate::gemm::gemm_host`]); on `cuda:N` (feature `cuda`) the same
//! kernels run on the GPU and the linear layers through cuBLAS (or, with
//! `PAGODA_GEMM=cutlass`, the CUTLASS kernel wherever it applies). Everything else is
//! this file: the step's integer inputs (ids, positions, slots, logits rows) converted
//! to the kernels' `i32` once ([`pack_step`]) and uploaded in one copy into one device
//! buffer at a fixed address once [`ModelOps::reserve_step`] sized it; every op checks
//! its views' shapes, dtypes and device, packs the kernel's parameter struct and hands
//! the [`pagoda_cuda_kernels::Call`] to the driver; graphs are the driver's capture; the
//! two ops that return host values download and wait on an event. So a wrong
//! conversion, stride or scalar fails on `emu` exactly as on a GPU, and what a capture
//! cannot do (allocate, copy from the host, wait) is refused there.
//!
//! The kernels trust their structs: token ids (< vocab), positions (< the RoPE tables'
//! rows), slots (inside the pools) and logits rows (< tokens) were checked by the model
//! before [`ModelOps::begin_step`] (`models/src/device.rs`' `check_step`).

mod families;
mod kernels;

use crate::driver::{bytes_of_mut, Driver, EmuDriver, Grow};
use pagoda_core::{
    register_model_ops, CoreError, DType, Device, DeviceKind, DeviceRuntime, GatedAct, GraphId,
    ModelOps, ModelOpsRegistration, RopeIo, RopeShape, StepInputs, TensorMut, TensorRef,
};
use pagoda_cuda_kernels::{ArgmaxParams, Call, Dtype};
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Arc;

/// The kernels' dtype of a core dtype (fp8: no kernel reads it).
fn dt(d: DType) -> Result<Dtype, CoreError> {
    match d {
        DType::F32 => Ok(Dtype::F32),
        DType::BF16 => Ok(Dtype::Bf16),
        DType::F16 => Ok(Dtype::F16),
        DType::F8E4M3 => Err(crate::kernel::no_fp8()),
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32, CoreError> {
    i32::try_from(v).map_err(|_| CoreError::InvalidShape {
        message: format!("{what} = {v} does not fit in i32"),
    })
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

/// A device address as the pointer type a parameter struct holds.
fn p<T>(addr: u64) -> *mut T {
    addr as usize as *mut T
}

/// The step's inputs as the kernels take them, `[ids | positions | slots | rows]` i32
/// into `out` (cleared first): every negative slot is padding (-1); a value past
/// `i32::MAX` is an error. The one conversion of both devices.
pub fn pack_step(s: &StepInputs<'_>, out: &mut Vec<i32>) -> Result<(), CoreError> {
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
    let bad = |what: &str, v: String| CoreError::InvalidBatch {
        message: format!("{what} {v} does not fit in i32"),
    };
    out.clear();
    for &x in s.input_ids {
        out.push(i32::try_from(x).map_err(|_| bad("token id", x.to_string()))?);
    }
    for &x in s.positions {
        out.push(i32::try_from(x).map_err(|_| bad("position", x.to_string()))?);
    }
    for &x in s.slot_mapping {
        out.push(if x < 0 {
            -1
        } else {
            i32::try_from(x).map_err(|_| bad("slot", x.to_string()))?
        });
    }
    for &x in s.logits_rows {
        out.push(i32::try_from(x).map_err(|_| bad("logits row", x.to_string()))?);
    }
    Ok(())
}

/// The model kernels of one device (see the module docs).
pub(crate) struct DeviceOps<D: Driver> {
    runtime: Arc<dyn DeviceRuntime>,
    driver: D,
    /// `[ids | positions | slots | rows]` of the step, i32, and its host staging.
    step: Grow<D::Buf>,
    step_addr: u64,
    staging: Vec<i32>,
    /// Tokens and logits rows of the current step.
    num_tokens: usize,
    num_rows: usize,
    /// `(tokens, rows)` the step buffer was sized for by `reserve_step`; larger steps
    /// are refused from then on, so the buffer never moves under a captured graph.
    reserved: Option<(usize, usize)>,
    argmax_ids: Grow<D::Buf>,
    argmax_values: Grow<D::Buf>,
    argmax_host: Vec<i32>,
    graphs: Vec<D::Graph>,
    capturing: bool,
    /// GEMM shapes `(m, n, k)` run eagerly: the GEMM library picks an algorithm (and
    /// may allocate) for each new problem size, so a shape first met inside a capture
    /// is refused (every graph size needs its eager warm-up step).
    gemm_shapes: HashSet<(usize, usize, usize)>,
}

impl<D: Driver> DeviceOps<D> {
    /// Kernels for `runtime`'s device through `driver`, which must serve it.
    pub(crate) fn new(runtime: Arc<dyn DeviceRuntime>, driver: D) -> Result<Self, CoreError> {
        if runtime.device() != driver.device() {
            return Err(CoreError::DeviceMismatch {
                name: "model ops",
                expected: driver.device(),
                actual: runtime.device(),
            });
        }
        Ok(DeviceOps {
            runtime,
            driver,
            step: Grow::new(),
            step_addr: 0,
            staging: Vec::new(),
            num_tokens: 0,
            num_rows: 0,
            reserved: None,
            argmax_ids: Grow::new(),
            argmax_values: Grow::new(),
            argmax_host: Vec::new(),
            graphs: Vec::new(),
            capturing: false,
            gemm_shapes: HashSet::new(),
        })
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> CoreError {
        CoreError::DeviceFailed {
            device: self.driver.device(),
            message: format!("{what}: {e}"),
        }
    }

    fn graph_err(e: impl std::fmt::Display) -> CoreError {
        CoreError::Graph {
            message: e.to_string(),
        }
    }

    fn on_device(&self, name: &'static str, d: Device) -> Result<(), CoreError> {
        if d == self.driver.device() {
            Ok(())
        } else {
            Err(CoreError::DeviceMismatch {
                name,
                expected: self.driver.device(),
                actual: d,
            })
        }
    }

    /// The device address of a view of this device's memory.
    fn addr(&self, name: &'static str, t: &TensorRef<'_>) -> Result<u64, CoreError> {
        self.on_device(name, t.device_of())?;
        self.driver
            .ref_addr(t, name)
            .map_err(|e| self.failed(name, e))
    }

    /// The device address of a writable view (taken by value: the view is consumed).
    fn addr_mut(&self, name: &'static str, t: TensorMut<'_>) -> Result<u64, CoreError> {
        self.on_device(name, t.device_of())?;
        self.driver
            .mut_addr(t, name)
            .map_err(|e| self.failed(name, e))
    }

    /// Device address of section `i` (0 ids, 1 positions, 2 slots, 3 rows) of the step.
    fn section(&self, i: usize) -> Result<u64, CoreError> {
        if self.step_addr == 0 && self.num_tokens + self.num_rows > 0 {
            return Err(CoreError::InvalidBatch {
                message: "a model kernel ran before begin_step".into(),
            });
        }
        Ok(self.step_addr + (i.min(3) * self.num_tokens * 4) as u64)
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

    /// Launches `call` (its views were checked by the caller); errors name `op`.
    ///
    /// # Safety
    /// Every pointer in the call is memory of this device sized as the kernel reads
    /// and writes it, every index in it inside what it indexes.
    unsafe fn launch(&self, op: &str, call: Call) -> Result<(), CoreError> {
        // SAFETY: the caller's contract.
        unsafe { self.driver.launch(&call) }.map_err(|e| self.failed(op, e))
    }

    /// Waits for the stream (after a download): refused while capturing.
    fn wait(&self, what: &str) -> Result<(), CoreError> {
        let e = self
            .driver
            .record_event()
            .map_err(|e| self.failed(what, e))?;
        self.driver.wait_event(&e).map_err(|e| self.failed(what, e))
    }

    fn begin_step_inner(&mut self, s: &StepInputs<'_>) -> Result<(), CoreError> {
        let (n, r) = (s.input_ids.len(), s.logits_rows.len());
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
        pack_step(s, &mut self.staging)?;
        self.driver
            .bind()
            .map_err(|e| self.failed("begin_step", e))?;
        let addr = self
            .step
            .upload(&self.driver, &self.staging)
            .map_err(|e| self.failed("copying the step's inputs", e))?;
        self.step_addr = addr;
        self.num_tokens = n;
        self.num_rows = r;
        Ok(())
    }

    fn download_inner(&mut self, x: TensorRef<'_>, out: &mut [f32]) -> Result<(), CoreError> {
        if x.dtype() != DType::F32 {
            return Err(CoreError::DTypeMismatch {
                name: "download source",
                expected: DType::F32,
                actual: x.dtype(),
            });
        }
        if x.len() != out.len() {
            return Err(CoreError::ShapeMismatch {
                name: "download destination",
                expected: x.len(),
                actual: out.len(),
            });
        }
        let src = self.addr("download source", &x)?;
        // SAFETY: `src` is a view of this device holding `out.len()` f32s (checked);
        // f32 has no invalid bit patterns.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4) };
        // SAFETY: as above; `out` stays borrowed until the wait below.
        unsafe { self.driver.download(src, bytes) }.map_err(|e| self.failed("download", e))?;
        self.wait("download")
    }

    fn argmax_inner(&mut self, logits: TensorRef<'_>, ids: &mut [u32]) -> Result<(), CoreError> {
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
        let (d, device) = (&self.driver, self.driver.device());
        let fail = |message: String| CoreError::DeviceFailed {
            device,
            message: format!("argmax buffers: {message}"),
        };
        let ids_addr = self.argmax_ids.reserve(d, rows, 4).map_err(fail)?;
        let vals_addr = self.argmax_values.reserve(d, rows, 4).map_err(fail)?;
        let prm = ArgmaxParams {
            logits: p::<c_void>(self.addr("logits", &logits)?),
            ids: p(ids_addr),
            values: p(vals_addr),
            rows: i32_of("rows", rows)?,
            vocab: i32_of("vocab", vocab)?,
        };
        // SAFETY: `[rows, vocab]` logits on this device; the outputs hold >= rows.
        unsafe { self.launch("argmax", Call::Argmax(prm, dt(logits.dtype())?)) }?;
        let mut host = std::mem::take(&mut self.argmax_host);
        host.resize(rows, 0);
        // SAFETY: the ids buffer holds >= rows i32s; `host` waits below.
        let r = unsafe { self.driver.download(ids_addr, bytes_of_mut(&mut host)) }
            .map_err(|e| self.failed("argmax download", e))
            .and_then(|()| self.wait("argmax download"));
        for (d, &s) in ids.iter_mut().zip(&host) {
            *d = s.max(0) as u32;
        }
        self.argmax_host = host;
        r
    }

    fn reserve_inner(&mut self, max_tokens: usize, max_rows: usize) -> Result<(), CoreError> {
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
        let len = max_tokens
            .checked_mul(3)
            .and_then(|t| t.checked_add(max_rows))
            .ok_or_else(|| Self::graph_err("the step buffer's size overflows"))?;
        self.driver
            .bind()
            .map_err(|e| self.failed("reserve_step", e))?;
        self.step
            .reserve(&self.driver, len.max(1), 4)
            .map_err(|e| self.failed("allocating the step buffer", e))?;
        self.step.locked = true;
        self.reserved = Some((max_tokens, max_rows));
        Ok(())
    }
}

impl<D: Driver> ModelOps for DeviceOps<D>
where
    D::Buf: Send,
{
    fn device(&self) -> Device {
        self.driver.device()
    }

    fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.runtime
    }

    fn begin_step(&mut self, step: &StepInputs<'_>) -> Result<(), CoreError> {
        self.begin_step_inner(step)
    }

    fn embed(
        &mut self,
        table: TensorRef<'_>,
        scale: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        self.embed_inner(table, scale, out)
    }

    fn rms_norm(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        w_offset: f32,
        eps: f32,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        self.norm_inner(None, x, w, (w_offset, eps), out)
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
        self.norm_inner(Some(residual), x, w, (w_offset, eps), out)
    }

    fn linear(
        &mut self,
        x: TensorRef<'_>,
        w: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        self.linear_inner(x, w, out)
    }

    fn rope_write_kv(&mut self, io: RopeIo<'_>) -> Result<(), CoreError> {
        self.rope_inner(io)
    }

    fn gated_act(
        &mut self,
        act: GatedAct,
        gate_up: TensorRef<'_>,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        self.gated_inner(act, gate_up, out)
    }

    fn gather_logits_rows(
        &mut self,
        x: TensorRef<'_>,
        width: usize,
        first: usize,
        out: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        self.gather_inner(x, width, first, out)
    }

    fn qk_norm(
        &mut self,
        qkv: TensorMut<'_>,
        q_weight: TensorRef<'_>,
        k_weight: TensorRef<'_>,
        eps: f32,
        shape: RopeShape,
    ) -> Result<(), CoreError> {
        self.qk_norm_inner(qkv, (q_weight, k_weight), eps, shape)
    }

    fn soft_cap(&mut self, x: TensorMut<'_>, cap: f32) -> Result<(), CoreError> {
        self.soft_cap_inner(x, cap)
    }

    fn moe_route(
        &mut self,
        router_logits: TensorRef<'_>,
        top_k: usize,
        weights: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        self.moe_route_inner(router_logits, top_k, weights)
    }

    fn moe_accumulate(
        &mut self,
        y: TensorRef<'_>,
        weights: TensorRef<'_>,
        expert: usize,
        first: bool,
        acc: TensorMut<'_>,
        out: Option<TensorMut<'_>>,
    ) -> Result<(), CoreError> {
        self.moe_acc_inner((y, weights), (expert, first), acc, out)
    }

    fn download_f32(&mut self, x: TensorRef<'_>, out: &mut [f32]) -> Result<(), CoreError> {
        self.download_inner(x, out)
    }

    fn argmax(&mut self, logits: TensorRef<'_>, ids: &mut [u32]) -> Result<(), CoreError> {
        self.argmax_inner(logits, ids)
    }

    fn reserve_step(&mut self, max_tokens: usize, max_rows: usize) -> Result<(), CoreError> {
        self.reserve_inner(max_tokens, max_rows)
    }

    fn begin_capture(&mut self) -> Result<(), CoreError> {
        if self.reserved.is_none() {
            return Err(CoreError::Graph {
                message: "reserve_step must size the step buffer before a capture".into(),
            });
        }
        self.driver.begin_capture().map_err(Self::graph_err)?;
        self.capturing = true;
        Ok(())
    }

    fn end_capture(&mut self) -> Result<GraphId, CoreError> {
        self.capturing = false;
        let g = self.driver.end_capture().map_err(Self::graph_err)?;
        self.graphs.push(g);
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn abort_capture(&mut self) {
        if std::mem::take(&mut self.capturing) {
            self.driver.abort_capture();
        }
    }

    unsafe fn replay(&mut self, id: GraphId) -> Result<(), CoreError> {
        let g = self.graphs.get(id.0).ok_or_else(|| CoreError::Graph {
            message: format!("no graph {}", id.0),
        })?;
        // SAFETY: the caller's promise (ModelOps::replay); the step buffer did not move
        // since `reserve_step` (larger steps are refused).
        unsafe { self.driver.replay(g) }.map_err(Self::graph_err)
    }
}

/// The `emu` device's model ops: [`DeviceOps`] over the emulator's driver.
pub(crate) fn emu_ops(runtime: Arc<dyn DeviceRuntime>) -> Result<DeviceOps<EmuDriver>, CoreError> {
    DeviceOps::new(runtime, EmuDriver::new(crate::kernel::EMU_SMS))
}

fn open(runtime: Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError> {
    Ok(Box::new(emu_ops(runtime)?))
}

register_model_ops!(ModelOpsRegistration {
    kind: DeviceKind::Emu,
    provider: "pagoda-cuda",
    open,
});

/// The `cuda` family's model kernels: [`DeviceOps`] over cudarc with the feature;
/// without it the device cannot be opened in the first place (its runtime says "not
/// compiled with CUDA").
fn open_cuda(runtime: Arc<dyn DeviceRuntime>) -> Result<Box<dyn ModelOps>, CoreError> {
    let device = runtime.device();
    #[cfg(feature = "cuda")]
    {
        let Device::Cuda(ordinal) = device else {
            return Err(CoreError::DeviceMismatch {
                name: "model ops",
                expected: Device::Cuda(0),
                actual: device,
            });
        };
        let failed = |message: String| CoreError::DeviceFailed { device, message };
        let driver = crate::gpu::CudaDriver::new(ordinal)
            .and_then(crate::gpu::CudaDriver::with_gemm)
            .map_err(failed)?;
        Ok(Box::new(DeviceOps::new(runtime, driver)?))
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CoreError::DeviceUnavailable {
            device,
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
mod tests;
#[cfg(test)]
mod tests_families;
