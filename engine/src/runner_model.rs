//! The model a [`crate::runner::ModelRunner`] drives: the CPU forward ([`Llama`] in
//! host memory), or the device forward ([`DeviceLlama`], weights on the device, every
//! op a kernel of the device's [`ModelOps`]). Both take the same step inputs and hand
//! back `[logits rows, vocab]` f32 logits on the host for the sampler, so the runner,
//! the sampler and everything above them are the same on every device.

use crate::EngineError;
use pagoda_core::{AttentionBackend, BatchDescriptor, KvCache, ModelOps};
use pagoda_models::{DeviceLlama, DeviceScratch, ForwardScratch, Llama, LlamaConfig};

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

    /// One step: `logits` gets `[logits_rows.len(), vocab]` f32 on the host.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        input_ids: &[u32],
        positions: &[u32],
        batch: &BatchDescriptor,
        attn: &mut [Box<dyn AttentionBackend>],
        kv: &mut KvCache,
        logits_rows: &[usize],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        match self {
            RunnerModel::Host { model, scratch } => model.forward_kinds(
                input_ids,
                positions,
                batch,
                attn,
                kv,
                logits_rows,
                logits,
                scratch,
            )?,
            RunnerModel::Device {
                model,
                ops,
                scratch,
            } => model.forward_kinds(
                ops.as_mut(),
                input_ids,
                positions,
                batch,
                attn,
                kv,
                logits_rows,
                logits,
                scratch,
            )?,
        }
        Ok(())
    }
}
