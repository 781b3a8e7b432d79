//! The model a [`crate::runner::ModelRunner`] drives: the CPU forward ([`Llama`] in
//! host memory), or the device forward ([`DeviceLlama`], weights on the device, every
//! op a kernel of the device's [`ModelOps`]). Both take the same step inputs and hand
//! back `[logits rows, vocab]` f32 logits on the host for the sampler, so the runner,
//! the sampler and everything above them are the same on every device.

use crate::EngineError;
use pagoda_core::{AttentionBackend, GraphLimits, KvCache, ModelOps, StepBatch};
use pagoda_models::{
    DecodeGraphs, DeviceLlama, DeviceOutput, DeviceRun, DeviceScratch, ForwardScratch, Llama,
    LlamaConfig,
};

/// The CPU forward or the device forward, each with its reusable buffers.
pub enum RunnerModel {
    /// Host memory, CPU kernels.
    Host {
        model: Box<Llama>,
        scratch: Box<ForwardScratch>,
    },
    /// Weights and activations on a device (`cuda:N`, or `emu`).
    Device {
        model: Box<DeviceLlama>,
        ops: Box<dyn ModelOps>,
        scratch: Box<DeviceScratch>,
        /// Decode steps' CUDA graphs, once captured (`None`: every step eager).
        graphs: Option<Box<DecodeGraphs>>,
    },
}

impl RunnerModel {
    /// The CPU forward.
    pub fn host(model: Llama) -> Self {
        RunnerModel::Host {
            model: Box::new(model),
            scratch: Box::default(),
        }
    }

    /// Whether this is the device forward.
    pub fn is_device(&self) -> bool {
        matches!(self, RunnerModel::Device { .. })
    }

    pub fn config(&self) -> &LlamaConfig {
        match self {
            RunnerModel::Host { model, .. } => model.config(),
            RunnerModel::Device { model, .. } => model.config(),
        }
    }

    /// How many times the device buffers were allocated (`None` on the CPU): a warm
    /// engine's count does not change from step to step.
    pub fn num_device_allocations(&self) -> Option<usize> {
        match self {
            RunnerModel::Host { .. } => None,
            RunnerModel::Device { scratch, .. } => Some(scratch.num_allocations()),
        }
    }

    /// Captured decode buckets and replays so far (`None`: no graphs).
    pub fn graph_stats(&self) -> Option<(Vec<usize>, usize)> {
        match self {
            RunnerModel::Device {
                graphs: Some(g), ..
            } => Some((g.buckets(), g.num_replays())),
            _ => None,
        }
    }

    /// Captures the decode graphs of `sizes` (device models only); returns the
    /// captured buckets.
    pub fn capture_graphs(
        &mut self,
        attn: &mut [Box<dyn AttentionBackend>],
        kv: &mut KvCache,
        limits: GraphLimits,
        sizes: &[usize],
    ) -> Result<Vec<usize>, EngineError> {
        match self {
            RunnerModel::Host { .. } => Err(EngineError::invalid(
                "enforce_eager",
                "CUDA graphs need a device model (--device cuda or emu)",
            )),
            RunnerModel::Device {
                model,
                ops,
                scratch,
                graphs,
            } => {
                *graphs = None;
                let mut last_tenth = 0;
                let mut run = DeviceRun {
                    ops: ops.as_mut(),
                    attn,
                    kv,
                    scratch,
                };
                let g = model.capture_decode_graphs(&mut run, limits, sizes, |done, all| {
                    let tenth = done * 10 / all.max(1);
                    if tenth > last_tenth {
                        last_tenth = tenth;
                        tracing::debug!("capturing CUDA graphs: {done}/{all}");
                    }
                })?;
                let buckets = g.buckets();
                *graphs = Some(Box::new(g));
                Ok(buckets)
            }
        }
    }

    /// One step: plans the attention backends, then runs the forward; `logits` gets
    /// `[logits_rows.len(), vocab]` f32 on the host. A device model with graphs runs
    /// a uniform decode step from its bucket's graph (planned by `plan_graph`).
    pub fn forward(
        &mut self,
        step: &StepBatch<'_>,
        attn: &mut [Box<dyn AttentionBackend>],
        kv: &mut KvCache,
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.forward_into(step, attn, kv, StepOut::Logits(logits))
            .map(|_| ())
    }

    /// [`RunnerModel::forward`] for a step whose sampled rows are all plain greedy: a
    /// device model reduces the logits rows to their argmax ids on the device
    /// (`greedy`, true returned); the CPU model fills `logits` (false).
    pub fn forward_greedy(
        &mut self,
        step: &StepBatch<'_>,
        attn: &mut [Box<dyn AttentionBackend>],
        kv: &mut KvCache,
        logits: &mut Vec<f32>,
        greedy: &mut Vec<u32>,
    ) -> Result<bool, EngineError> {
        let out = match self {
            RunnerModel::Host { .. } => StepOut::Logits(logits),
            RunnerModel::Device { .. } => StepOut::Greedy(greedy),
        };
        self.forward_into(step, attn, kv, out)
    }

    fn forward_into(
        &mut self,
        step: &StepBatch<'_>,
        attn: &mut [Box<dyn AttentionBackend>],
        kv: &mut KvCache,
        mut out: StepOut<'_>,
    ) -> Result<bool, EngineError> {
        let greedy = matches!(out, StepOut::Greedy(_));
        if let RunnerModel::Device {
            model,
            ops,
            scratch,
            graphs: Some(g),
        } = self
        {
            let mut run = DeviceRun {
                ops: ops.as_mut(),
                attn: &mut *attn,
                kv: &mut *kv,
                scratch,
            };
            if model.forward_graph(g, step, &mut run, out.device())? {
                return Ok(greedy);
            }
        }
        for a in attn.iter_mut() {
            a.plan(step.batch)?;
        }
        match self {
            RunnerModel::Host { model, scratch } => {
                let StepOut::Logits(logits) = out else {
                    unreachable!("forward_greedy asks the CPU model for logits")
                };
                model.forward_kinds(step, attn, kv, logits, scratch)?
            }
            RunnerModel::Device {
                model,
                ops,
                scratch,
                ..
            } => {
                let mut run = DeviceRun {
                    ops: ops.as_mut(),
                    attn,
                    kv,
                    scratch,
                };
                model.forward_kinds(step, &mut run, out.device())?
            }
        }
        Ok(greedy)
    }
}

/// Where a step's logits rows go.
enum StepOut<'a> {
    Logits(&'a mut Vec<f32>),
    Greedy(&'a mut Vec<u32>),
}

impl StepOut<'_> {
    fn device(&mut self) -> DeviceOutput<'_> {
        match self {
            StepOut::Logits(v) => DeviceOutput::Logits(v),
            StepOut::Greedy(v) => DeviceOutput::Greedy(v),
        }
    }
}
