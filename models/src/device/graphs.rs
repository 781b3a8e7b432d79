//! CUDA graphs of decode steps (vLLM's piecewise-free "full" graphs for uniform
//! decode batches): the forward of a decode-only step captured once per batch-size
//! bucket at start, then replayed with only the contents of the input buffers changed.
//!
//! A step of `n` decode rows runs the graph of the smallest bucket `b >= n`: its inputs
//! are padded to `b` rows (token 0 at position 0, slot -1 so nothing is written to the
//! KV cache, one key of block 0 to attend to) and the block table to the width of the
//! longest sequence the engine allows; only the first `n` rows of logits are copied
//! back. Mixed and prefill steps, steps wider than the largest bucket, and steps whose
//! logits rows are not exactly their rows in order run eagerly.
//!
//! What makes a replay right: every kernel reads the step's values from buffers at
//! fixed addresses (the step inputs of [`ModelOps::begin_step`], the attention
//! backends' metadata from [`AttentionBackend::plan_graph`]), and the launches'
//! geometry and scalars depend only on the bucket and [`GraphLimits`]. On `emu` the
//! graph is a recording of the launches ([`ModelOps::replay`]), so the tests that
//! compare replayed and eager steps bit for bit check exactly that.

use super::{DeviceLlama, DeviceOutput, DeviceRun, DeviceScratch};
use crate::error::ModelError;
use pagoda_core::{
    AttentionBackend, BatchDescriptor, CoreError, GraphId, GraphLimits, GraphSupport, ModelOps,
    StepBatch,
};
use std::ops::DerefMut;

/// vLLM's capture sizes: 1, 2, 4, then steps of 8 up to `max_num_seqs` (rounded up to a
/// multiple of 8), none above `max_tokens` (a bucket is a step of that many tokens).
pub fn capture_sizes(max_num_seqs: usize, max_tokens: usize) -> Vec<usize> {
    let top = max_num_seqs.max(1);
    let mut v = Vec::new();
    let mut b = 1;
    loop {
        v.push(b);
        if b >= top {
            break;
        }
        b = if b < 8 { 2 * b } else { b + 8 };
    }
    v.retain(|&b| b <= max_tokens.max(1));
    v
}

/// The captured decode graphs of one model, ops object and set of backends.
#[derive(Debug)]
pub struct DecodeGraphs {
    limits: GraphLimits,
    /// `(bucket, graph)`, buckets ascending.
    graphs: Vec<(usize, GraphId)>,
    /// The scratch buffers' allocation count at capture: another count means they
    /// moved, and the graphs are not replayed any more.
    scratch_allocations: usize,
    stale: bool,
    ids: Vec<u32>,
    positions: Vec<u32>,
    rows: Vec<usize>,
    batch: BatchDescriptor,
    num_replays: usize,
}

impl DecodeGraphs {
    /// The captured buckets, ascending.
    pub fn buckets(&self) -> Vec<usize> {
        self.graphs.iter().map(|&(b, _)| b).collect()
    }

    /// Steps run from a graph so far.
    pub fn num_replays(&self) -> usize {
        self.num_replays
    }

    pub fn limits(&self) -> &GraphLimits {
        &self.limits
    }

    /// The bucket a step of `n` decode rows replays, if any.
    pub fn bucket_for(&self, n: usize) -> Option<usize> {
        self.graphs.iter().map(|&(b, _)| b).find(|&b| b >= n)
    }

    /// Pads a decode step of `n` rows to `bucket` rows (see the module docs).
    /// The padded step `pad` built, as a step's inputs.
    fn step(&self) -> StepBatch<'_> {
        StepBatch {
            input_ids: &self.ids,
            positions: &self.positions,
            batch: &self.batch,
            logits_rows: &self.rows,
        }
    }

    fn pad(
        &mut self,
        input_ids: &[u32],
        positions: &[u32],
        batch: &BatchDescriptor,
        bucket: usize,
    ) -> Result<(), CoreError> {
        self.ids.clear();
        self.ids.extend_from_slice(input_ids);
        self.ids.resize(bucket, 0);
        self.positions.clear();
        self.positions.extend_from_slice(positions);
        self.positions.resize(bucket, 0);
        self.rows.clear();
        self.rows.extend(0..bucket);
        self.batch.clone_from(batch);
        self.batch
            .pad_decode(bucket, self.limits.max_blocks_per_seq)
    }
}

fn graph_err(e: CoreError) -> ModelError {
    ModelError::Forward {
        message: format!("CUDA graphs: {e}"),
    }
}

impl DeviceLlama {
    /// Captures one decode graph per size of `sizes` (see [`capture_sizes`]) on `run`'s
    /// kernels, backends, KV cache and scratch buffers, which must all outlive the
    /// graphs unmoved. `progress` is called after each capture with (done, total).
    pub fn capture_decode_graphs<B, A>(
        &self,
        run: &mut DeviceRun<'_, B>,
        limits: GraphLimits,
        sizes: &[usize],
        mut progress: impl FnMut(usize, usize),
    ) -> Result<DecodeGraphs, ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        let (ops, attn, kv, s) = run.parts();
        if let Some(a) = attn
            .iter()
            .find(|a| a.graph_support() != GraphSupport::UniformDecode)
        {
            return Err(graph_err(CoreError::GraphUnsupported {
                what: format!("attention backend `{}`", a.name()),
            }));
        }
        let mut sizes = sizes.to_vec();
        sizes.sort_unstable();
        sizes.dedup();
        let Some(&largest) = sizes.last() else {
            return Err(graph_err(CoreError::Graph {
                message: "no capture sizes".into(),
            }));
        };
        if largest > limits.max_num_tokens {
            return Err(graph_err(CoreError::Graph {
                message: format!(
                    "capture size {largest} exceeds the step budget of {} tokens",
                    limits.max_num_tokens
                ),
            }));
        }
        let rt = ops.runtime().clone();
        if largest > s.rows {
            return Err(graph_err(CoreError::Graph {
                message: format!(
                    "capture size {largest} exceeds the {} logits rows of the activation \
                     buffers (sized for --max-num-seqs)",
                    s.rows
                ),
            }));
        }
        s.reserve(rt.as_ref(), &self.dec.config, self.dtype, largest)?;
        // Logits rows never exceed tokens: reserve the rows section for all of them.
        ops.reserve_step(s.tokens, s.tokens).map_err(graph_err)?;
        let mut g = DecodeGraphs {
            limits,
            graphs: Vec::with_capacity(sizes.len()),
            scratch_allocations: s.num_allocations,
            stale: false,
            ids: Vec::with_capacity(largest),
            positions: Vec::with_capacity(largest),
            rows: Vec::with_capacity(largest),
            batch: BatchDescriptor::default(),
            num_replays: 0,
        };
        let empty = BatchDescriptor::new(kv.spec.block_size, &[], &[], &[])?;
        // Largest first, as vLLM: the first capture sizes everything the rest reuse.
        for (done, &bucket) in sizes.iter().rev().enumerate() {
            g.pad(&[], &[], &empty, bucket).map_err(graph_err)?;
            self.check_step(&g.step(), attn.len(), kv)?;
            self.hand_over_padded(ops, &g, attn, s)?;
            // One eager step of this very size first, on every device: lazy
            // initialisation (module loading, the GEMM library's handles, and its
            // heuristics and workspace for each new problem size) must not happen
            // inside a capture. The emu device refuses a GEMM shape first met there.
            self.launch(ops, bucket, bucket, attn, kv, s)?;
            ops.begin_capture().map_err(graph_err)?;
            let captured = self.launch(ops, bucket, bucket, attn, kv, s);
            if let Err(e) = captured {
                ops.abort_capture();
                return Err(e);
            }
            let id = ops.end_capture().map_err(graph_err)?;
            g.graphs.push((bucket, id));
            progress(done + 1, sizes.len());
        }
        g.graphs.sort_unstable_by_key(|&(b, _)| b);
        if s.num_allocations != g.scratch_allocations {
            return Err(graph_err(CoreError::Graph {
                message: "the activation buffers moved during capture".into(),
            }));
        }
        Ok(g)
    }

    /// Hands the padded step in `g` to the device: its inputs (one copy) and every
    /// backend's graph plan (metadata into their fixed buffers).
    fn hand_over_padded<B, A>(
        &self,
        ops: &mut dyn ModelOps,
        g: &DecodeGraphs,
        attn: &mut [B],
        s: &mut DeviceScratch,
    ) -> Result<(), ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        self.begin_step(ops, &g.step(), s)?;
        for a in attn.iter_mut() {
            a.plan_graph(&g.batch, &g.limits)?;
        }
        Ok(())
    }

    /// Runs a decode step from its bucket's graph, if it qualifies (see the module
    /// docs); `Ok(false)` when it must run eagerly instead (nothing was done then).
    pub fn forward_graph<B, A>(
        &self,
        g: &mut DecodeGraphs,
        step: &StepBatch<'_>,
        run: &mut DeviceRun<'_, B>,
        out: DeviceOutput<'_>,
    ) -> Result<bool, ModelError>
    where
        B: DerefMut<Target = A>,
        A: AttentionBackend + ?Sized,
    {
        let (ops, attn, kv, s) = run.parts();
        let (n, batch) = (step.num_tokens(), step.batch);
        let uniform_decode = n > 0
            && batch.num_decode_reqs() == batch.num_reqs()
            && batch.num_tokens() == n
            && step.logits_rows.iter().copied().eq(0..n)
            && batch.block_table_stride() <= g.limits.max_blocks_per_seq;
        let Some(bucket) = g.bucket_for(n).filter(|_| uniform_decode && !g.stale) else {
            return Ok(false);
        };
        if s.num_allocations != g.scratch_allocations {
            // Cannot happen while steps stay within the limits the scratch was sized
            // for; if it does, the graphs point at freed buffers: never replay them.
            tracing::warn!("activation buffers moved since CUDA graph capture: running eagerly");
            g.stale = true;
            return Ok(false);
        }
        self.check_step(step, attn.len(), kv)?;
        g.pad(step.input_ids, step.positions, batch, bucket)
            .map_err(graph_err)?;
        self.hand_over_padded(ops, g, attn, s)?;
        let id = g
            .graphs
            .iter()
            .find(|&&(b, _)| b == bucket)
            .map(|&(_, id)| id)
            .expect("bucket_for found it");
        // SAFETY: the graph was captured by `capture_decode_graphs` with these ops,
        // backends, KV cache and scratch (the caller keeps them together); the scratch
        // did not move (allocation count unchanged), the KV pools and weights never
        // move, the step buffers and the backends' metadata are fixed since capture
        // (`reserve_step`, `plan_graph` refuse to grow them); this step's inputs were
        // checked above and handed over by `begin_step` and `plan_graph`.
        unsafe { ops.replay(id) }.map_err(graph_err)?;
        g.num_replays += 1;
        self.finish(ops, (bucket, n), out, s)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::capture_sizes;

    #[test]
    fn vllm_capture_sizes() {
        assert_eq!(capture_sizes(1, 8192), [1]);
        assert_eq!(capture_sizes(3, 8192), [1, 2, 4]);
        assert_eq!(capture_sizes(8, 8192), [1, 2, 4, 8]);
        assert_eq!(capture_sizes(20, 8192), [1, 2, 4, 8, 16, 24]);
        let v = capture_sizes(256, 8192);
        assert_eq!(v.len(), 3 + 32);
        assert_eq!(v.last(), Some(&256));
        assert_eq!(capture_sizes(256, 16), [1, 2, 4, 8, 16]);
    }
}
