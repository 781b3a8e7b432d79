//! vLLM's stop check on one request. It sits below `spec` (whose `append_tokens`
//! appends every sampled token, plain or accepted draft, and checks after each) and
//! apart from the scheduler, which only reaches it through `spec`: a leaf, so the
//! two never call each other.

use pagoda_core::{Request, RequestStatus, StopReason};

/// vLLM's stop check, after one token was appended. Stop tokens first (once
/// `min_tokens` outputs exist: EOS unless `ignore_eos`, then stop token ids), then
/// the length cap (model length or `max_tokens`).
pub(super) fn check_stop(req: &mut Request, max_len: usize) -> bool {
    // Stop tokens are checked before the length cap (as vLLM does): an EOS sampled as
    // the last allowed token finishes with "stop", not "length".
    let n_out = req.num_output_tokens();
    if n_out >= req.sampling_params.min_tokens {
        if let Some(&last) = req.all_token_ids().last() {
            if !req.sampling_params.ignore_eos && req.eos_token_ids.contains(&last) {
                req.status = RequestStatus::FinishedStopped;
                req.stop_reason = Some(StopReason::Eos(last));
                return true;
            }
            if req.sampling_params.stop_token_ids.contains(&last) {
                req.status = RequestStatus::FinishedStopped;
                req.stop_reason = Some(StopReason::StopTokenId(last));
                return true;
            }
        }
    }
    if req.num_tokens() >= max_len || n_out >= req.max_tokens() {
        req.status = RequestStatus::FinishedLengthCapped;
        return true;
    }
    false
}
