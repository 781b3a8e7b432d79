//! The kit must catch real bugs: a plain f32 backend with one deliberately
//! injected bug per variant fails the relevant check, while the same backend
//! without a bug passes every check.

use pagoda_backend_testkit::{try_run_check, Check, Subject, Tolerance};
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, Capabilities, CoreError, LayerIo,
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// Every query sees every key of its request.
    IgnoresCausalMask,
    /// Reads logical block i at physical block i instead of `block_table[i]`.
    ReadsBlockIndexNotTable,
    /// Query head h reads KV head h % num_kv_heads.
    WrongGqaMapping,
    /// Query token i sits at position i instead of context_len + i.
    IgnoresContextOffset,
    /// Sees one key past its own position.
    OffByOneCausal,
    /// Returns log2 instead of ln of the softmax denominator.
    LseInLog2,
    /// Never writes the last head.
    SkipsLastHead,
    /// Indexes buffers without checking their lengths.
    NoValidation,
    /// Keeps the first batch it planned.
    StalePlan,
    /// Adds up the keys in reverse order when the batch has an odd number of
    /// tokens: accurate, but a row's bits depend on the batch (it still declares
    /// `batch_invariant`, as every mutant does).
    OrderDependsOnBatch,
    /// Every row of a verify run sees the keys of the run's last row (the drafts
    /// after its own position): a one-pass verify kernel without the causal cut.
    RunRowsSeeTheWholeRun,
    /// Adds up the keys of a verify run's rows in reverse order: accurate, but a
    /// marked row's bits differ from the same row unmarked.
    RunOrderDiffers,
}

struct Mutant {
    cfg: AttentionConfig,
    batch: BatchDescriptor,
    bug: Bug,
}

/// Naive's capabilities without window or soft-cap (the mutants implement neither).
fn caps(decode: bool, prefill: bool) -> Capabilities {
    Capabilities {
        sliding_window: false,
        logits_soft_cap: false,
        decode,
        prefill,
        ..pagoda_backend_naive::capabilities()
    }
}

impl AttentionBackend for Mutant {
    fn name(&self) -> &str {
        "mutant"
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        if batch.block_size() != self.cfg.block_size && self.bug != Bug::NoValidation {
            return Err(CoreError::InvalidBatch {
                message: "block size".into(),
            });
        }
        if self.bug != Bug::StalePlan || self.batch.seq_lens().is_empty() {
            self.batch = batch.clone();
        }
        Ok(())
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        let (h, kvh, d, bs) = (
            self.cfg.num_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.block_size,
        );
        let b = &self.batch;
        let t = b.num_tokens();
        if self.bug != Bug::NoValidation {
            let pool_blocks = io.k_cache.len() / (bs * kvh * d);
            let blocks_ok =
                (0..b.num_reqs()).all(|r| b.blocks(r).iter().all(|&x| (x as usize) < pool_blocks));
            let lse_ok = io.lse.as_ref().map(|l| l.len() == t * h).unwrap_or(true);
            if io.q.len() != t * h * d
                || io.out.len() != t * h * d
                || !lse_ok
                || !blocks_ok
                || io.v_cache.len() != io.k_cache.len()
            {
                return Err(CoreError::InvalidBatch {
                    message: "bad buffers".into(),
                });
            }
        }
        let io = io.into_f32()?;
        let mut lse = io.lse;
        let heads = if self.bug == Bug::SkipsLastHead {
            h - 1
        } else {
            h
        };
        let run_of = |r: usize| b.verify_runs().find(|run| run.contains(&r));
        for r in 0..b.num_reqs() {
            let in_run = run_of(r);
            let blocks = b.blocks(in_run.clone().map_or(r, |run| run.end - 1));
            let ctx = if self.bug == Bug::IgnoresContextOffset {
                0
            } else {
                b.context_len(r)
            };
            for i in 0..b.query_len(r) {
                let tok = b.query_start_loc()[r] as usize + i;
                let last = match (self.bug, &in_run) {
                    (Bug::RunRowsSeeTheWholeRun, Some(run)) => b.seq_len(run.end - 1) - 1,
                    _ => ctx + i,
                };
                let last = match self.bug {
                    Bug::RunRowsSeeTheWholeRun => last,
                    Bug::IgnoresCausalMask => b.seq_lens()[r] as usize - 1,
                    Bug::OffByOneCausal => ctx + i + 1,
                    _ => ctx + i,
                };
                for head in 0..heads {
                    let kv = if self.bug == Bug::WrongGqaMapping {
                        head % kvh
                    } else {
                        head / (h / kvh)
                    };
                    let q = &io.q[(tok * h + head) * d..][..d];
                    let off = |p: usize| {
                        let blk = if self.bug == Bug::ReadsBlockIndexNotTable {
                            p / bs
                        } else {
                            blocks[p / bs] as usize
                        };
                        ((blk * bs + p % bs) * kvh + kv) * d
                    };
                    let scores: Vec<f32> = (0..=last)
                        .map(|p| {
                            q.iter()
                                .zip(&io.k_cache[off(p)..][..d])
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                                * self.cfg.scale
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0f32;
                    let mut acc = vec![0.0f32; d];
                    let reversed = (self.bug == Bug::OrderDependsOnBatch && t % 2 == 1)
                        || (self.bug == Bug::RunOrderDiffers && in_run.is_some());
                    let order: Vec<usize> = match reversed {
                        true => (0..=last).rev().collect(),
                        false => (0..=last).collect(),
                    };
                    for p in order {
                        let w = (scores[p] - m).exp();
                        sum += w;
                        for (a, v) in acc.iter_mut().zip(&io.v_cache[off(p)..][..d]) {
                            *a += w * v;
                        }
                    }
                    for (o, a) in io.out[(tok * h + head) * d..][..d].iter_mut().zip(&acc) {
                        *o = a / sum;
                    }
                    if let Some(l) = lse.as_deref_mut() {
                        l[tok * h + head] = if self.bug == Bug::LseInLog2 {
                            m + sum.log2()
                        } else {
                            m + sum.ln()
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// One f32 loop per row: invariant by construction (unless `OrderDependsOnBatch`),
    /// so `Check::BatchInvariance` runs on every mutant.
    fn batch_invariant(&self) -> Option<&'static str> {
        Some("mutant-f32-loop")
    }

    /// Every mutant claims one-pass verify runs, so `Check::VerifyRuns` compares
    /// marked and unmarked bits on each.
    fn serves_verify_runs(&self) -> bool {
        true
    }
}

fn mutant(bug: Bug) -> Subject {
    mutant_with(bug, caps(true, true))
}

fn mutant_with(bug: Bug, capabilities: Capabilities) -> Subject {
    Subject::from_ctor(format!("mutant-{bug:?}"), capabilities, move |cfg| {
        Ok(Mutant {
            cfg: cfg.clone(),
            batch: BatchDescriptor::default(),
            bug,
        })
    })
}

fn fails(bug: Bug, check: Check) -> String {
    match try_run_check(check, &mutant(bug), Tolerance::F32, None) {
        Ok(()) => panic!("the kit missed {bug:?} in {check:?}"),
        Err(report) => report,
    }
}

#[test]
fn a_correct_f32_backend_passes_every_check() {
    for check in Check::ALL {
        try_run_check(check, &mutant(Bug::None), Tolerance::F32, None)
            .unwrap_or_else(|e| panic!("{check:?}: {e}"));
    }
}

#[test]
fn decode_only_and_prefill_only_backends_pass_every_check() {
    for (decode, prefill) in [(true, false), (false, true)] {
        for check in Check::ALL {
            try_run_check(
                check,
                &mutant_with(Bug::None, caps(decode, prefill)),
                Tolerance::F32,
                None,
            )
            .unwrap_or_else(|e| panic!("decode {decode} prefill {prefill} {check:?}: {e}"));
        }
    }
}

#[test]
fn ignoring_the_causal_mask_fails() {
    // (A last prefill row sees every key anyway, so only the comparison with naive can tell.)
    let report = fails(Bug::IgnoresCausalMask, Check::RandomBatches);
    eprintln!("{report}");
}

#[test]
fn reading_blocks_by_index_fails() {
    let report = fails(Bug::ReadsBlockIndexNotTable, Check::RandomBatches);
    assert!(report.contains("random batch vs naive"), "{report}");
    fails(Bug::ReadsBlockIndexNotTable, Check::BlockPermutation);
}

#[test]
fn wrong_gqa_mapping_fails() {
    fails(Bug::WrongGqaMapping, Check::RandomBatches);
    fails(Bug::WrongGqaMapping, Check::GqaEqualsMha);
}

#[test]
fn ignoring_the_context_offset_fails() {
    fails(Bug::IgnoresContextOffset, Check::RandomBatches);
}

#[test]
fn reading_one_key_too_many_fails() {
    fails(Bug::OffByOneCausal, Check::RandomBatches);
}

#[test]
fn a_wrong_lse_base_fails() {
    let report = fails(Bug::LseInLog2, Check::RandomBatches);
    assert!(report.contains("lse"), "{report}");
    fails(Bug::LseInLog2, Check::LseMergeKvHalves);
    fails(Bug::LseInLog2, Check::LseMergeContextAndChunk);
}

#[test]
fn an_unwritten_head_fails() {
    fails(Bug::SkipsLastHead, Check::RandomBatches);
}

#[test]
fn a_batch_dependent_summation_order_fails_the_invariance_check() {
    let report = fails(Bug::OrderDependsOnBatch, Check::BatchInvariance);
    assert!(report.contains("bits must be equal"), "{report}");
    // Accurate all the same: the tolerance checks cannot see it.
    try_run_check(
        Check::RandomBatches,
        &mutant(Bug::OrderDependsOnBatch),
        Tolerance::F32,
        None,
    )
    .unwrap();
}

#[test]
fn missing_validation_fails() {
    let report = fails(Bug::NoValidation, Check::BadBuffers);
    assert!(report.contains("bad buffers"), "{report}");
}

#[test]
fn a_stale_plan_fails() {
    fails(Bug::StalePlan, Check::BlockPermutation);
    fails(Bug::StalePlan, Check::AloneEqualsInBatch);
}

#[test]
fn a_backend_missing_from_the_registry_is_a_clear_error() {
    let err = Subject::registered("no-such-backend")
        .err()
        .expect("must fail");
    assert!(
        err.to_string().contains("pagoda_backend_no_such_backend"),
        "{err}"
    );
}

#[test]
fn verify_run_rows_seeing_later_drafts_fail() {
    let report = fails(Bug::RunRowsSeeTheWholeRun, Check::VerifyRuns);
    assert!(report.contains("verify runs"), "{report}");
}

#[test]
fn verify_run_rows_with_other_bits_fail() {
    let report = fails(Bug::RunOrderDiffers, Check::VerifyRuns);
    assert!(report.contains("with the runs unmarked"), "{report}");
}
