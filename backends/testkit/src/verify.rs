//! [`Check::VerifyRuns`](crate::Check::VerifyRuns): speculative verify rows. A verify
//! row (a request's last known token and `k` drafts) reaches a backend as `k + 1`
//! consecutive causal decode rows of one request, marked as one *verify run*
//! (`BatchDescriptor::mark_verify_run`). From one case, every request becomes a run
//! of `k + 1` new queries at its last `k + 1` positions (`k` drawn in
//! `0..=MAX_DRAFTS`; `k = 0` leaves a plain decode row), over the case's permuted
//! blocks and cached K/V. Every backend that serves
//! decode rows must match the reference on the marked batch (a backend that ignores
//! the marks serves plain decode rows); one that declares
//! `AttentionBackend::serves_verify_runs` must also give the same bits as on the
//! same batch unmarked (its one-pass kernel keeps each row's arithmetic).

use crate::case::{run, Case};
use crate::error::{KitError, Tolerance};
use crate::gen::{CaseSpec, Rng};
use crate::judge::{compare_outputs, equal_bits, naive, subject_for, Outcome};
use crate::place::round_to;
use crate::subject::Subject;

/// Most drafts a verify row carries in the check (vLLM's usual 1-7, and past the
/// paged kernel's tile of 5 rows).
pub const MAX_DRAFTS: usize = 9;

pub(crate) fn verify_runs(
    subject: &Subject,
    spec: &CaseSpec,
    tol: Tolerance,
) -> Result<Outcome, KitError> {
    const CHECK: &str = "verify runs";
    if !subject.capabilities.decode {
        return Ok(Outcome::NotApplicable);
    }
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let (h, d) = (cfg.num_heads, cfg.head_dim);
    let mut rng = Rng::new(spec.seed ^ 0x5bec_u64);
    // Each request's last `k + 1` query tokens as decode rows.
    let (mut sl, mut br, mut q, mut runs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..case.query_lens.len() {
        let s = case.seq_lens[r];
        let len = s.min(1 + rng.below(MAX_DRAFTS + 1));
        if len > 1 {
            runs.push(sl.len()..sl.len() + len);
        }
        for j in 0..len {
            sl.push(s - len + 1 + j);
            br.push(case.block_rows[r].clone());
        }
        let mut rows = rng.fill(len * h * d, spec.amplitude);
        round_to(cfg.q_dtype, &mut rows);
        q.extend_from_slice(&rows);
    }
    let ql = vec![1; sl.len()];
    let plain = Case::from_parts(cfg.clone(), ql.clone(), sl, br, case.full.clone(), vec![q])?;
    let mut marked = plain.clone();
    for run in &runs {
        marked
            .batch
            .mark_verify_run(run.clone())
            .map_err(|source| KitError::Backend {
                backend: "kit".into(),
                stage: "mark_verify_run",
                source,
            })?;
    }
    let Some(mut be) = subject_for(subject, &cfg, &ql)? else {
        return Ok(Outcome::NotApplicable);
    };
    let lse = [subject.capabilities.returns_lse];
    let got = run(be.as_mut(), &marked, &lse)?;
    let want = run(naive(&cfg)?.as_mut(), &plain, &[true])?;
    compare_outputs(CHECK, &marked, &got, &want, tol)?;
    if be.serves_verify_runs() {
        let alone = run(be.as_mut(), &plain, &lse)?;
        let what = format!("{} rows in {} runs", ql.len(), runs.len());
        let unmarked = "with the runs unmarked";
        equal_bits(CHECK, unmarked, "out", &got.out[0], &alone.out[0], &what)?;
        if let (Some(x), Some(y)) = (&got.lse[0], &alone.lse[0]) {
            equal_bits(CHECK, unmarked, "lse", x, y, &what)?;
        }
    }
    Ok(Outcome::Passed)
}
