//! The runner's side of speculative decoding (see [`crate::spec`]): scheduled drafts
//! appended to their request's tokens for the step, the verify rows' `k + 1` logits
//! rows (after the sampled and prompt-logprob rows in the logits buffer), their
//! verification, and the next step's proposals.

use super::state::ModelRunner;
use crate::spec::draft::DraftRequest;
use crate::spec::verify::{verify_row, VerifyInput};
use pagoda_core::{ModelRunnerOutput, SchedulerOutput, SpecDecodeRow};

impl ModelRunner {
    /// Appends each scheduled request's drafts to its tokens for this step (they are
    /// taken off again by [`Self::verify_spec_rows`]).
    pub(super) fn add_drafts(&mut self, sched_out: &SchedulerOutput) {
        for (h, drafts) in &sched_out.scheduled_spec_decode_tokens {
            if let Some(st) = self.state_mut(*h) {
                st.token_ids.truncate(st.token_ids.len() - st.num_drafts);
                st.token_ids.extend_from_slice(drafts);
                st.num_drafts = drafts.len();
            }
        }
    }

    /// Verifies every verify row from its logits (at `offset` floats into the
    /// buffer, rows in `self.spec_rows` order): the kept tokens replace the drafts in
    /// the request's tokens and go out in [`ModelRunnerOutput::spec_rows`]; a row that
    /// cannot be sampled fails its request alone.
    pub(super) fn verify_spec_rows(
        &mut self,
        sched_out: &SchedulerOutput,
        mut offset: usize,
        out: &mut ModelRunnerOutput,
    ) {
        let vocab = self.sampler.vocab_size();
        let rows = std::mem::take(&mut self.spec_rows);
        for r in &rows {
            let n = (r.num_drafts + 1) * vocab;
            let logits = &mut self.logits[offset..offset + n];
            offset += n;
            let h = sched_out.num_scheduled_tokens[r.sched_index].0;
            let Some(st) = self.requests[h.index as usize].as_mut() else {
                continue;
            };
            let input = VerifyInput {
                params: &st.params,
                tokens: &st.token_ids,
                num_prompt_tokens: st.num_prompt_tokens,
                num_drafts: r.num_drafts,
                seed: st.seed,
                eos_ids: &self.eos_ids,
            };
            let verified = verify_row(&self.sampler, &input, logits);
            st.token_ids.truncate(st.token_ids.len() - st.num_drafts);
            st.num_drafts = 0;
            match verified {
                Ok((token_ids, logprobs)) => {
                    st.token_ids.extend_from_slice(&token_ids);
                    out.spec_rows.push(SpecDecodeRow {
                        handle: h,
                        num_draft_tokens: r.num_drafts,
                        token_ids,
                        logprobs,
                    });
                }
                Err(e) => {
                    tracing::warn!("request {}: cannot sample: {e}", st.req_id);
                    out.failed.push((h, format!("cannot sample: {e}")));
                }
            }
        }
        self.spec_rows = rows;
        self.spec_rows.clear();
    }

    /// After the step's bookkeeping: steps verified rows back over their rejected
    /// drafts, then proposes drafts for every row that produced tokens.
    pub(super) fn finish_spec(&mut self, sched_out: &SchedulerOutput, out: &mut ModelRunnerOutput) {
        for row in &out.spec_rows {
            if let Some(st) = self.state_mut(row.handle) {
                st.num_computed_tokens -= row.num_rejected();
            }
        }
        let Some(spec) = self.spec.as_ref() else {
            return;
        };
        if self.faults.is_some() {
            return; // the fault hooks see plain rows only
        }
        let mut wanted = Vec::new();
        for (i, &(h, _)) in sched_out.num_scheduled_tokens.iter().enumerate() {
            let produced =
                out.sampled_token_ids[i].is_some() || out.spec_rows.iter().any(|r| r.handle == h);
            if !produced {
                continue;
            }
            // (The fields, not `self.state`: the draft model is borrowed below.)
            let st = self.requests.get(h.index as usize).and_then(Option::as_ref);
            let Some(st) = st.filter(|s| s.handle == h) else {
                continue;
            };
            if !crate::spec::eligible(&st.params, self.masks.contains(h)) {
                continue;
            }
            // Drafts past `max_tokens` could never be kept: the step after a full
            // acceptance emits one token more than it drafted.
            let outputs = st.token_ids.len() - st.num_prompt_tokens;
            let left = st
                .params
                .max_tokens
                .unwrap_or(usize::MAX)
                .saturating_sub(outputs);
            wanted.push(DraftRequest {
                handle: h,
                tokens: &st.token_ids,
                limit: left.saturating_sub(1),
            });
        }
        let drafts = match self.draft.as_mut() {
            // One batched draft forward per draft position.
            Some(d) => match d.propose(&wanted) {
                Ok(d) => d,
                Err(e) => {
                    // A draft failure costs only the speedup: no drafts this step.
                    tracing::warn!("draft model: {e}");
                    Vec::new()
                }
            },
            None => wanted
                .iter()
                .map(|r| spec.propose(r.tokens, r.limit))
                .collect(),
        };
        for (r, drafts) in wanted.iter().zip(drafts) {
            if !drafts.is_empty() {
                out.spec_token_ids.push((r.handle, drafts));
            }
        }
    }
}
