//! What every check shares, below all of them: the two backends a case runs on (the
//! subject's, [`subject_for`], and the reference, [`naive`]), how outputs are judged
//! (within tolerance, [`compare_outputs`]; bit for bit, [`equal_bits`]), and what a
//! check concludes about a case ([`Outcome`]).
//!
//! `checks` dispatches to `invariance` and `verify`, which need these too; here they
//! are used by all three and use none of them.

use crate::case::{Case, Outputs};
use crate::error::{KitError, Tolerance};
use crate::place::Reference;
use crate::subject::Subject;
use pagoda_core::{AttentionBackend, AttentionConfig};

/// What a check concluded about one case (an error is a failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// The case is outside what the backend serves (e.g. a runtime reason refused
    /// it): drawn again, not counted.
    NotApplicable,
}

/// The reference backend for a subject configuration: `naive`, computing in f64 on
/// the host from buffers of the subject's device and dtypes ([`Reference`]).
pub fn naive(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, KitError> {
    Reference::new(cfg)
        .map(|b| Box::new(b) as Box<dyn AttentionBackend>)
        .map_err(|source| KitError::Backend {
            backend: "naive".into(),
            stage: "create",
            source,
        })
}

/// The subject's backend for `cfg`, or `None` when it refuses the rows (runtime reasons).
pub(crate) fn subject_for(
    subject: &Subject,
    cfg: &AttentionConfig,
    query_lens: &[usize],
) -> Result<Option<Box<dyn AttentionBackend>>, KitError> {
    if !subject
        .reasons(cfg, Subject::role_of(query_lens))
        .is_empty()
    {
        return Ok(None);
    }
    subject.create(cfg).map(Some)
}

/// Compares outputs (and LSE where both have it) of every layer.
pub(crate) fn compare_outputs(
    check: &'static str,
    case: &Case,
    got: &Outputs,
    want: &Outputs,
    tol: Tolerance,
) -> Result<(), KitError> {
    let (h, d) = (case.cfg.num_heads, case.cfg.head_dim);
    for l in 0..got.out.len() {
        tol.compare(check, "out", &got.out[l], &want.out[l], h, d)?;
        if let (Some(a), Some(b)) = (&got.lse[l], &want.lse[l]) {
            tol.compare(check, "lse", a, b, h, 1)?;
        }
    }
    Ok(())
}

/// Compares `got` with `want` (`want_is`: what the latter is) bit for bit for
/// `check`; names the first difference.
pub(crate) fn equal_bits(
    check: &'static str,
    want_is: &str,
    buffer: &'static str,
    got: &[f32],
    want: &[f32],
    what: &str,
) -> Result<(), KitError> {
    if let Some(i) = (0..got.len().max(want.len()))
        .find(|&i| got.get(i).map(|x| x.to_bits()) != want.get(i).map(|x| x.to_bits()))
    {
        return Err(KitError::Protocol {
            check,
            message: format!(
                "{buffer} element {i} of {what}: {:?} vs {:?} {want_is} (bits must be equal)",
                got.get(i),
                want.get(i)
            ),
        });
    }
    Ok(())
}
