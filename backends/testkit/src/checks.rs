//! The checks of the suite. Each takes the subject, one drawn [`CaseSpec`] and a
//! tolerance, and returns an [`Outcome`] (passed, or not applicable to the case,
//! e.g. refused by a runtime reason) or the first [`KitError`].

use crate::case::{cache_spec, run, slot, Case, Outputs};
use crate::error::{KitError, Tolerance};
use crate::gen::{CaseSpec, Rng};
use crate::invariance::batch_invariance;
use crate::judge::{compare_outputs, subject_for};
use crate::place::{runtime, upload, HostKv, Placement};
use crate::subject::Subject;
use crate::verify::verify_runs;
use pagoda_core::{merge_states, AttentionConfig};

// Shared with `invariance` and `verify` (which this module dispatches to), so they
// live below all three, in `judge`; re-exported so `checks::naive` and
// `checks::Outcome` still resolve.
pub use crate::judge::{naive, Outcome};

/// One check of the suite; the macro generates one `#[test]` per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Random batches (two layers, one plan) equal `naive`, LSE included; `write_kv` equals core's.
    RandomBatches,
    /// Renumbering physical blocks (and moving their contents) changes nothing.
    BlockPermutation,
    /// Each request alone gives the same rows as inside the batch.
    AloneEqualsInBatch,
    /// A decode step equals the last row of the equivalent prefill.
    DecodeEqualsPrefill,
    /// GQA equals MHA over K/V heads repeated per group.
    GqaEqualsMha,
    /// Split-KV: a decode row over two halves of its keys, both on the subject,
    /// merged by LSE ([`merge_states`]), equals the whole. Needs decode rows and LSE.
    LseMergeKvHalves,
    /// Chunked prefill: the new tokens' causal part (on the subject, context 0) merged
    /// by LSE with their view of the cached context (on `naive`) equals the whole.
    /// Needs prefill rows and LSE.
    LseMergeContextAndChunk,
    /// Wrong buffer lengths, out-of-range blocks and a foreign block size are errors, not panics.
    BadBuffers,
    /// For a backend that declares `batch_invariant`: the same query rows re-cut into
    /// chunks, shuffled, dealt into other batches, over renumbered blocks and in pools
    /// of other thread counts give the same bits (the `invariance` module). Skipped for
    /// a backend that declares nothing.
    BatchInvariance,
    /// Speculative verify rows: runs of `k + 1` decode rows of one request (random
    /// `k`) match the reference, and bit for bit the same rows unmarked where the
    /// backend declares `serves_verify_runs` (the `verify` module).
    VerifyRuns,
}

impl Check {
    pub const ALL: [Check; 10] = [
        Check::RandomBatches,
        Check::BlockPermutation,
        Check::AloneEqualsInBatch,
        Check::DecodeEqualsPrefill,
        Check::GqaEqualsMha,
        Check::LseMergeKvHalves,
        Check::LseMergeContextAndChunk,
        Check::BadBuffers,
        Check::BatchInvariance,
        Check::VerifyRuns,
    ];

    /// Why the check does not apply to a backend with these capabilities at all
    /// (then the suite skips it), or `None`.
    pub fn not_applicable(self, caps: &pagoda_core::Capabilities) -> Option<&'static str> {
        match self {
            Check::LseMergeKvHalves | Check::LseMergeContextAndChunk if !caps.returns_lse => {
                Some("does not return LSE")
            }
            Check::LseMergeKvHalves if !caps.decode => Some("serves no decode rows"),
            Check::LseMergeContextAndChunk if !caps.prefill => Some("serves no prefill rows"),
            Check::VerifyRuns if !caps.decode => Some("serves no decode rows"),
            _ => None,
        }
    }

    /// Proptest cases per run (overridden by `PROPTEST_CASES`).
    pub fn cases(self) -> u32 {
        match self {
            Check::RandomBatches => 128,
            Check::BadBuffers => 1,
            Check::BatchInvariance | Check::VerifyRuns => 24,
            _ => 40,
        }
    }

    /// Smallest GQA group the check's cases draw.
    pub fn min_group(self) -> usize {
        if self == Check::GqaEqualsMha {
            2
        } else {
            1
        }
    }

    /// Runs the check on one case.
    pub fn run(
        self,
        subject: &Subject,
        spec: &CaseSpec,
        tol: Tolerance,
    ) -> Result<Outcome, KitError> {
        match self {
            Check::RandomBatches => random_batches(subject, spec, tol),
            Check::BlockPermutation => block_permutation(subject, spec, tol),
            Check::AloneEqualsInBatch => alone_equals_in_batch(subject, spec, tol),
            Check::DecodeEqualsPrefill => decode_equals_prefill(subject, spec, tol),
            Check::GqaEqualsMha => gqa_equals_mha(subject, spec, tol),
            Check::LseMergeKvHalves => lse_merge_kv_halves(subject, spec, tol),
            Check::LseMergeContextAndChunk => lse_merge_context_and_chunk(subject, spec, tol),
            Check::BadBuffers => bad_buffers(subject, spec),
            Check::BatchInvariance => batch_invariance(subject, spec),
            Check::VerifyRuns => verify_runs(subject, spec, tol),
        }
    }
}

/// Two results that are each within `tol` of the exact value may differ by twice it.
fn doubled(tol: Tolerance) -> Tolerance {
    Tolerance {
        atol: 2.0 * tol.atol,
        rtol: 2.0 * tol.rtol,
    }
}

fn same_pools(check: &'static str, a: &HostKv, b: &HostKv) -> Result<(), KitError> {
    let eq = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
    };
    for (l, (la, lb)) in a.layers.iter().zip(&b.layers).enumerate() {
        if !eq(&la.k, &lb.k) || !eq(&la.v, &lb.v) {
            return Err(KitError::Protocol {
                check,
                message: format!(
                    "layer {l}: the cache after write_kv differs from pagoda_core::write_kv's"
                ),
            });
        }
    }
    Ok(())
}

fn random_batches(subject: &Subject, spec: &CaseSpec, tol: Tolerance) -> Result<Outcome, KitError> {
    const CHECK: &str = "random batch vs naive";
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 2)?;
    let Some(mut be) = subject_for(subject, &cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    // LSE on the first layer only: the second checks that `lse: None` works too.
    let got = run(
        be.as_mut(),
        &case,
        &[subject.capabilities.returns_lse, false],
    )?;
    let want = run(naive(&cfg)?.as_mut(), &case, &[true, true])?;
    same_pools(CHECK, &got.cache, &want.cache)?;
    compare_outputs(CHECK, &case, &got, &want, tol)?;
    Ok(Outcome::Passed)
}

/// Moves block `src_block` of every layer of `src` to `dst_block` of `dst`.
fn copy_block(src: &HostKv, src_block: usize, dst: &mut HostKv, dst_block: usize) {
    let n = src.spec.block_size * src.spec.slot_elems();
    for (s, d) in src.layers.iter().zip(dst.layers.iter_mut()) {
        d.k[dst_block * n..(dst_block + 1) * n]
            .copy_from_slice(&s.k[src_block * n..(src_block + 1) * n]);
        d.v[dst_block * n..(dst_block + 1) * n]
            .copy_from_slice(&s.v[src_block * n..(src_block + 1) * n]);
    }
}

/// Copies one slot of every layer.
fn copy_slot(src: &HostKv, src_slot: usize, dst: &mut HostKv, dst_slot: usize) {
    let e = src.spec.slot_elems();
    for (s, d) in src.layers.iter().zip(dst.layers.iter_mut()) {
        d.k[dst_slot * e..(dst_slot + 1) * e]
            .copy_from_slice(&s.k[src_slot * e..(src_slot + 1) * e]);
        d.v[dst_slot * e..(dst_slot + 1) * e]
            .copy_from_slice(&s.v[src_slot * e..(src_slot + 1) * e]);
    }
}

fn block_permutation(
    subject: &Subject,
    spec: &CaseSpec,
    tol: Tolerance,
) -> Result<Outcome, KitError> {
    const CHECK: &str = "block permutation";
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let Some(mut be) = subject_for(subject, &cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    let pool = case.full.spec.num_blocks;
    let pi = Rng::new(spec.seed ^ 0xB10C_u64).permutation(pool);
    let mut full = HostKv::filled(case.full.spec, f32::NAN);
    for (b, &to) in pi.iter().enumerate() {
        copy_block(&case.full, b, &mut full, to as usize);
    }
    let rows = case
        .block_rows
        .iter()
        .map(|r| r.iter().map(|&b| pi[b as usize]).collect())
        .collect();
    let moved = Case::from_parts(
        cfg,
        case.query_lens.clone(),
        case.seq_lens.clone(),
        rows,
        full,
        case.q.clone(),
    )?;
    let lse = [subject.capabilities.returns_lse];
    // The same instance plans both batches: re-planning must not leak state.
    let a = run(be.as_mut(), &case, &lse)?;
    let b = run(be.as_mut(), &moved, &lse)?;
    compare_outputs(CHECK, &case, &b, &a, doubled(tol))?;
    Ok(Outcome::Passed)
}

fn alone_equals_in_batch(
    subject: &Subject,
    spec: &CaseSpec,
    tol: Tolerance,
) -> Result<Outcome, KitError> {
    const CHECK: &str = "request alone vs in batch";
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let Some(mut be) = subject_for(subject, &cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    let lse = [subject.capabilities.returns_lse];
    let batch = run(be.as_mut(), &case, &lse)?;
    let (h, d) = (cfg.num_heads, cfg.head_dim);
    for r in 0..case.query_lens.len() {
        let t = case.tokens_of(r);
        let q = vec![case.q[0][t.start * h * d..t.end * h * d].to_vec()];
        let alone = Case::from_parts(
            cfg.clone(),
            vec![case.query_lens[r]],
            vec![case.seq_lens[r]],
            vec![case.block_rows[r].clone()],
            case.full.clone(),
            q,
        )?;
        // The same instance re-plans a smaller batch: plans must not go stale.
        let got = run(be.as_mut(), &alone, &lse)?;
        doubled(tol).compare(
            CHECK,
            "out",
            &got.out[0],
            &batch.out[0][t.start * h * d..t.end * h * d],
            h,
            d,
        )?;
        if let (Some(a), Some(b)) = (&got.lse[0], &batch.lse[0]) {
            doubled(tol).compare(CHECK, "lse", a, &b[t.start * h..t.end * h], h, 1)?;
        }
    }
    Ok(Outcome::Passed)
}

fn decode_equals_prefill(
    subject: &Subject,
    spec: &CaseSpec,
    tol: Tolerance,
) -> Result<Outcome, KitError> {
    const CHECK: &str = "decode vs last prefill row";
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let (h, d) = (cfg.num_heads, cfg.head_dim);
    let idx: Vec<usize> = (0..case.seq_lens.len())
        .filter(|&r| case.seq_lens[r] >= 2)
        .collect();
    if idx.is_empty() {
        return Ok(Outcome::NotApplicable);
    }
    let mut rng = Rng::new(spec.seed ^ 0xDEC0DE);
    let (mut p_lens, mut p_q, mut d_q) = (Vec::new(), Vec::new(), Vec::new());
    for &r in &idx {
        let len = case.query_lens[r].max(2).min(case.seq_lens[r]);
        let q = rng.fill(len * h * d, spec.amplitude);
        d_q.extend_from_slice(&q[(len - 1) * h * d..]);
        p_q.extend(q);
        p_lens.push(len);
    }
    let seqs: Vec<usize> = idx.iter().map(|&r| case.seq_lens[r]).collect();
    let rows: Vec<Vec<u32>> = idx.iter().map(|&r| case.block_rows[r].clone()).collect();
    let prefill = Case::from_parts(
        cfg.clone(),
        p_lens.clone(),
        seqs.clone(),
        rows.clone(),
        case.full.clone(),
        vec![p_q],
    )?;
    let decode = Case::from_parts(
        cfg.clone(),
        vec![1; idx.len()],
        seqs,
        rows,
        case.full.clone(),
        vec![d_q],
    )?;
    let caps = &subject.capabilities;
    // Each side runs on the subject when it serves that role, else on naive.
    let side = |serves: bool, c: &Case| -> Result<Option<Outputs>, KitError> {
        let be = if serves {
            subject_for(subject, &cfg, &c.query_lens)?
        } else {
            Some(naive(&cfg)?)
        };
        match be {
            Some(mut be) => run(be.as_mut(), c, &[!serves || caps.returns_lse]).map(Some),
            None => Ok(None),
        }
    };
    let (Some(p), Some(dec)) = (side(caps.prefill, &prefill)?, side(caps.decode, &decode)?) else {
        return Ok(Outcome::NotApplicable);
    };
    for (i, _) in idx.iter().enumerate() {
        let last = prefill.tokens_of(i).end - 1;
        let p_out = &p.out[0][last * h * d..(last + 1) * h * d];
        doubled(tol).compare(
            CHECK,
            "out",
            &dec.out[0][i * h * d..(i + 1) * h * d],
            p_out,
            h,
            d,
        )?;
        if let (Some(a), Some(b)) = (&dec.lse[0], &p.lse[0]) {
            doubled(tol).compare(
                CHECK,
                "lse",
                &a[i * h..(i + 1) * h],
                &b[last * h..(last + 1) * h],
                h,
                1,
            )?;
        }
    }
    Ok(Outcome::Passed)
}

fn gqa_equals_mha(subject: &Subject, spec: &CaseSpec, tol: Tolerance) -> Result<Outcome, KitError> {
    const CHECK: &str = "GQA vs MHA with repeated K/V";
    if spec.group < 2 {
        return Ok(Outcome::NotApplicable);
    }
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let Some(mut be) = subject_for(subject, &cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    let mut mha_cfg = cfg.clone();
    mha_cfg.num_kv_heads = cfg.num_heads;
    let Some(mut mha_be) = subject_for(subject, &mha_cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    let (h, d, g) = (cfg.num_heads, cfg.head_dim, spec.group);
    let mut full = HostKv::filled(cache_spec(&mha_cfg, 1, case.full.spec.num_blocks), f32::NAN);
    let (src, dst) = (&case.full.layers[0], &mut full.layers[0]);
    let slots = case.full.spec.num_blocks * cfg.block_size;
    for s in 0..slots {
        for head in 0..h {
            let from = (s * cfg.num_kv_heads + head / g) * d;
            let to = (s * h + head) * d;
            dst.k[to..to + d].copy_from_slice(&src.k[from..from + d]);
            dst.v[to..to + d].copy_from_slice(&src.v[from..from + d]);
        }
    }
    let mha = Case::from_parts(
        mha_cfg,
        case.query_lens.clone(),
        case.seq_lens.clone(),
        case.block_rows.clone(),
        full,
        case.q.clone(),
    )?;
    let lse = [subject.capabilities.returns_lse];
    let a = run(be.as_mut(), &case, &lse)?;
    let b = run(mha_be.as_mut(), &mha, &lse)?;
    compare_outputs(CHECK, &case, &a, &b, doubled(tol))?;
    Ok(Outcome::Passed)
}

/// `[tokens, heads]` rows of LSE and `[tokens, heads, dim]` outputs of one half.
struct Half {
    out: Vec<f32>,
    lse: Vec<f32>,
}

/// The common setup of both LSE-merge checks: the case (without a window), the
/// requests that split, where each splits, and a pool where the part after the split
/// also sits in fresh blocks from position 0.
struct MergeSetup {
    cfg: AttentionConfig,
    case: Case,
    /// Requests whose keys split in two non-empty parts.
    idx: Vec<usize>,
    /// Per request of `idx`: the first key position of the second part.
    split: Vec<usize>,
    /// The case's pool plus the fresh blocks.
    full: HostKv,
    /// Per request of `idx`: its blocks (first part) and its fresh blocks (second part).
    a_rows: Vec<Vec<u32>>,
    b_rows: Vec<Vec<u32>>,
    /// Per request of `idx`: the length of the second part.
    b_seqs: Vec<usize>,
}

impl MergeSetup {
    /// `None` when no request splits. `split_at(case, r, rng)` picks request `r`'s
    /// split point among those with `splits(case, r)`.
    fn new(
        subject: &Subject,
        spec: &CaseSpec,
        rng: &mut Rng,
        splits: impl Fn(&Case, usize) -> bool,
        split_at: impl Fn(&Case, usize, &mut Rng) -> usize,
    ) -> Result<Option<MergeSetup>, KitError> {
        // Windows are relative to positions, which a split renumbers: test without.
        let mut spec = spec.clone();
        spec.sliding_window = None;
        let cfg = spec.config(subject);
        let case = Case::from_spec(&spec, cfg.clone(), 1)?;
        let bs = cfg.block_size;
        let pool = case.full.spec.num_blocks;
        let idx: Vec<usize> = (0..case.seq_lens.len())
            .filter(|&r| splits(&case, r))
            .collect();
        if idx.is_empty() {
            return Ok(None);
        }
        let split: Vec<usize> = idx.iter().map(|&r| split_at(&case, r, rng)).collect();
        // The second part moves to fresh blocks, starting at position 0.
        let fresh: Vec<usize> = idx
            .iter()
            .zip(&split)
            .map(|(&r, &m)| (case.seq_lens[r] - m).div_ceil(bs))
            .collect();
        let mut full = HostKv::filled(
            cache_spec(&cfg, 1, pool + fresh.iter().sum::<usize>()),
            f32::NAN,
        );
        for b in 0..pool {
            copy_block(&case.full, b, &mut full, b);
        }
        let mut next = pool as u32;
        let mut b_rows = Vec::new();
        for ((&r, &m), &n) in idx.iter().zip(&split).zip(&fresh) {
            let row: Vec<u32> = (next..next + n as u32).collect();
            next += n as u32;
            for pos in m..case.seq_lens[r] {
                copy_slot(
                    &case.full,
                    slot(&case.block_rows[r], bs, pos),
                    &mut full,
                    slot(&row, bs, pos - m),
                );
            }
            b_rows.push(row);
        }
        let a_rows = idx.iter().map(|&r| case.block_rows[r].clone()).collect();
        let b_seqs = idx
            .iter()
            .zip(&split)
            .map(|(&r, &m)| case.seq_lens[r] - m)
            .collect();
        Ok(Some(MergeSetup {
            cfg,
            case,
            idx,
            split,
            full,
            a_rows,
            b_rows,
            b_seqs,
        }))
    }

    /// `naive` over the whole keys with queries `q` of lengths `q_lens`, the merge of
    /// `a` and `b`, and the comparison.
    fn compare(
        &self,
        check: &'static str,
        q_lens: Vec<usize>,
        q: Vec<f32>,
        a: Half,
        b: Half,
        tol: Tolerance,
    ) -> Result<(), KitError> {
        let (h, d) = (self.cfg.num_heads, self.cfg.head_dim);
        let whole_seqs = self.idx.iter().map(|&r| self.case.seq_lens[r]).collect();
        let whole = Case::from_parts(
            self.cfg.clone(),
            q_lens,
            whole_seqs,
            self.a_rows.clone(),
            self.full.clone(),
            vec![q],
        )?;
        let want = half(run(naive(&self.cfg)?.as_mut(), &whole, &[true])?);
        let mut out = vec![0.0; want.out.len()];
        let mut lse = vec![0.0; want.lse.len()];
        merge_states(&a.out, &a.lse, &b.out, &b.lse, d, &mut out, &mut lse);
        doubled(tol).compare(check, "merged out", &out, &want.out, h, d)?;
        doubled(tol).compare(check, "merged lse", &lse, &want.lse, h, 1)?;
        Ok(())
    }
}

fn lse_merge_kv_halves(
    subject: &Subject,
    spec: &CaseSpec,
    tol: Tolerance,
) -> Result<Outcome, KitError> {
    const CHECK: &str = "LSE merge of two KV halves vs whole";
    if Check::LseMergeKvHalves
        .not_applicable(&subject.capabilities)
        .is_some()
    {
        return Ok(Outcome::NotApplicable);
    }
    let mut rng = Rng::new(spec.seed ^ 0x4D45_5247);
    // One query per request seeing all keys; halves: keys [0, m) and [m, seq), m >= 1.
    let Some(m) = MergeSetup::new(
        subject,
        spec,
        &mut rng,
        |c, r| c.seq_lens[r] >= 2,
        |c, r, rng| 1 + rng.below(c.seq_lens[r] - 1),
    )?
    else {
        return Ok(Outcome::NotApplicable);
    };
    let (h, d, n) = (m.cfg.num_heads, m.cfg.head_dim, m.idx.len());
    let q = rng.fill(n * h * d, spec.amplitude);
    let case = |seqs: Vec<usize>, rows: Vec<Vec<u32>>| {
        Case::from_parts(
            m.cfg.clone(),
            vec![1; n],
            seqs,
            rows,
            m.full.clone(),
            vec![q.clone()],
        )
    };
    let a_case = case(m.split.clone(), m.a_rows.clone())?;
    let b_case = case(m.b_seqs.clone(), m.b_rows.clone())?;
    let (Some(mut sa), Some(mut sb)) = (
        subject_for(subject, &m.cfg, &a_case.query_lens)?,
        subject_for(subject, &m.cfg, &b_case.query_lens)?,
    ) else {
        return Ok(Outcome::NotApplicable);
    };
    let a = half(run(sa.as_mut(), &a_case, &[true])?);
    let b = half(run(sb.as_mut(), &b_case, &[true])?);
    m.compare(CHECK, vec![1; n], q, a, b, tol)?;
    Ok(Outcome::Passed)
}

fn lse_merge_context_and_chunk(
    subject: &Subject,
    spec: &CaseSpec,
    tol: Tolerance,
) -> Result<Outcome, KitError> {
    const CHECK: &str = "LSE merge of cached context and new chunk vs whole";
    if Check::LseMergeContextAndChunk
        .not_applicable(&subject.capabilities)
        .is_some()
    {
        return Ok(Outcome::NotApplicable);
    }
    let mut rng = Rng::new(spec.seed ^ 0x4D45_5247);
    // Prefill rows split at the context: [0, context) | the new tokens.
    let Some(m) = MergeSetup::new(
        subject,
        spec,
        &mut rng,
        |c, r| c.query_lens[r] >= 2,
        |c, r, _| c.seq_lens[r] - c.query_lens[r],
    )?
    else {
        return Ok(Outcome::NotApplicable);
    };
    let (h, d) = (m.cfg.num_heads, m.cfg.head_dim);
    let case = &m.case;
    let q_lens: Vec<usize> = m.idx.iter().map(|&r| case.query_lens[r]).collect();
    let q: Vec<f32> = m
        .idx
        .iter()
        .flat_map(|&r| {
            case.q[0][case.tokens_of(r).start * h * d..case.tokens_of(r).end * h * d].to_vec()
        })
        .collect();
    // The subject computes the new tokens' causal part (context 0, fresh blocks).
    let b_case = Case::from_parts(
        m.cfg.clone(),
        q_lens.clone(),
        m.b_seqs.clone(),
        m.b_rows.clone(),
        m.full.clone(),
        vec![q.clone()],
    )?;
    let Some(mut sb) = subject_for(subject, &m.cfg, &b_case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    let b = half(run(sb.as_mut(), &b_case, &[true])?);
    // naive computes the context part: one decode row per query token of a request
    // with context (the others see no context: lse -inf, output 0).
    let tokens = q.len() / (h * d);
    let mut a = Half {
        out: vec![0.0; tokens * h * d],
        lse: vec![f32::NEG_INFINITY; tokens * h],
    };
    let (mut rows, mut seqs, mut dq, mut at) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut t = 0;
    for (i, &ctx) in m.split.iter().enumerate() {
        for _ in 0..q_lens[i] {
            if ctx > 0 {
                rows.push(m.a_rows[i].clone());
                seqs.push(ctx);
                dq.extend_from_slice(&q[t * h * d..(t + 1) * h * d]);
                at.push(t);
            }
            t += 1;
        }
    }
    if !at.is_empty() {
        let a_case = Case::from_parts(
            m.cfg.clone(),
            vec![1; at.len()],
            seqs,
            rows,
            m.full.clone(),
            vec![dq],
        )?;
        let got = half(run(naive(&m.cfg)?.as_mut(), &a_case, &[true])?);
        for (j, &t) in at.iter().enumerate() {
            a.out[t * h * d..(t + 1) * h * d].copy_from_slice(&got.out[j * h * d..(j + 1) * h * d]);
            a.lse[t * h..(t + 1) * h].copy_from_slice(&got.lse[j * h..(j + 1) * h]);
        }
    }
    m.compare(CHECK, q_lens, q, a, b, tol)?;
    Ok(Outcome::Passed)
}

fn half(o: Outputs) -> Half {
    let mut out = o.out;
    let mut lse = o.lse;
    Half {
        out: out.remove(0),
        lse: lse.remove(0).unwrap_or_default(),
    }
}

/// Calls `f`, turning a panic into a protocol error.
fn no_panic<T>(check: &'static str, what: &str, f: impl FnOnce() -> T) -> Result<T, KitError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| KitError::Protocol {
        check,
        message: format!("panicked on {what} instead of returning an error"),
    })
}

fn bad_buffers(subject: &Subject, spec: &CaseSpec) -> Result<Outcome, KitError> {
    const CHECK: &str = "bad buffers";
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let Some(mut be) = subject_for(subject, &cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    let e = case.cache.spec.slot_elems();
    let place = Placement::of(&cfg);
    let kit = |stage: &'static str| {
        let backend = subject.name.clone();
        move |source| KitError::Backend {
            backend,
            stage,
            source,
        }
    };
    let rt = runtime(&place).map_err(kit("open device"))?;
    let rt = rt.as_ref();
    let placed = |dtype, data: &[f32]| upload(rt, dtype, data).map_err(kit("upload"));
    let layer = &case.cache.layers[0];
    let (mut k_pool, mut v_pool) = (
        placed(place.kv_dtype, &layer.k)?,
        placed(place.kv_dtype, &layer.v)?,
    );
    let (new_k, new_v) = (
        placed(place.q_dtype, &case.new_k[0])?,
        placed(place.q_dtype, &case.new_v[0])?,
    );
    be.write_kv(
        k_pool.view_mut(),
        v_pool.view_mut(),
        new_k.view(),
        new_v.view(),
        case.batch.slot_mapping(),
        e,
    )
    .map_err(kit("write_kv"))?;
    be.plan(&case.batch).map_err(kit("plan"))?;
    let q = placed(place.q_dtype, &case.q[0])?;
    let n_q = q.len();
    let n_kv = k_pool.len();
    let n_out = case.out_elems();
    let n_lse = case.batch.num_tokens() * cfg.num_heads;
    let lse_ok = subject.capabilities.returns_lse;
    // Buffers of the given lengths: prefixes of the placed ones, or new ones.
    let mut attempt = |what: &str,
                       q_len: usize,
                       kv_len: usize,
                       out_len: usize,
                       lse_len: Option<usize>|
     -> Result<bool, KitError> {
        let mut out = placed(place.q_dtype, &vec![0.0; out_len])?;
        let mut lse = lse_len
            .map(|n| placed(pagoda_core::DType::F32, &vec![0.0; n]))
            .transpose()?;
        fn prefix(
            s: &pagoda_core::Storage,
            n: usize,
        ) -> Result<pagoda_core::TensorRef<'_>, pagoda_core::CoreError> {
            s.view().split_at(n).map(|(a, _)| a)
        }
        let io = pagoda_core::LayerIo {
            q: prefix(&q, q_len).map_err(kit("buffers"))?,
            k_cache: prefix(&k_pool, kv_len).map_err(kit("buffers"))?,
            v_cache: prefix(&v_pool, kv_len).map_err(kit("buffers"))?,
            out: out.view_mut(),
            lse: lse.as_mut().map(|l| l.view_mut()),
        };
        Ok(no_panic(CHECK, what, || be.run(io))?.is_ok())
    };
    let mut accepted = Vec::new();
    if attempt("a short q", n_q - 1, n_kv, n_out, None)? {
        accepted.push("a q buffer one element short");
    }
    if attempt("a short out", n_q, n_kv, n_out - 1, None)? {
        accepted.push("an out buffer one element short");
    }
    if lse_ok && attempt("a short lse", n_q, n_kv, n_out, Some(n_lse - 1))? {
        accepted.push("an lse buffer one element short");
    }
    // A pool one block smaller than the largest block id used needs: reading it would be out of bounds.
    let max_block = case.batch.max_block().unwrap_or(0) as usize;
    let block_elems = cfg.block_size * e;
    if attempt(
        "a pool too small for the block table",
        n_q,
        max_block * block_elems,
        n_out,
        None,
    )? {
        accepted.push("a KV pool without the blocks the block table names");
    }
    if !attempt("a valid call", n_q, n_kv, n_out, lse_ok.then_some(n_lse))? {
        accepted.push("(rejected) a valid call after the bad ones");
    }
    // A batch laid out for another block size must be refused at plan time.
    let other = if cfg.block_size == 1 { 2 } else { 1 };
    let rows: Vec<&[u32]> = case.block_rows.iter().map(|r| r.as_slice()).collect();
    if let Ok(batch) = pagoda_core::BatchDescriptor::new(other, &[1], &[1], &rows[..1]) {
        if no_panic(CHECK, "a batch with another block size", || be.plan(&batch))?.is_ok() {
            accepted.push("a batch whose block size differs from the configuration's");
        }
    }
    if accepted.is_empty() {
        Ok(Outcome::Passed)
    } else {
        Err(KitError::Protocol {
            check: CHECK,
            message: format!("accepted {}", accepted.join("; ")),
        })
    }
}
