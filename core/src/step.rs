//! [`StepBatch`]: one step's model inputs, built once per step by the engine's runner
//! and handed down whole to the forward pass (the CPU decoder and the device forward),
//! instead of as a list of loose arguments that every layer of the step path repeats.

use crate::attention::BatchDescriptor;

/// The inputs of one forward step, in the batch's token order (decode rows first, as
/// the scheduler orders them and the [`BatchDescriptor`] checks).
#[derive(Debug, Clone, Copy)]
pub struct StepBatch<'a> {
    /// `[num_tokens]` token ids.
    pub input_ids: &'a [u32],
    /// `[num_tokens]` positions.
    pub positions: &'a [u32],
    /// The attention metadata: rows, sequence lengths, block table, slot mapping.
    pub batch: &'a BatchDescriptor,
    /// The token indices whose logits the step returns, in output order.
    pub logits_rows: &'a [usize],
}

impl StepBatch<'_> {
    /// Tokens in the step.
    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }
}
