//! [`Check::BatchInvariance`](crate::Check::BatchInvariance): for a backend that
//! declares `AttentionBackend::batch_invariant`, the same query rows give the same
//! bits however they are batched. From one case (its rows run as one batch, the
//! reference bits), each variant re-cuts every request's query into chunks (decode
//! rows of one token where the subject serves decode rows, prefill chunks of two or
//! more where it serves prefill rows: a chunk's earlier positions are then cached
//! context), shuffles the pieces, deals them into several smaller batches (decode
//! rows first, as a batch must have them), renumbers the physical blocks, and runs
//! each batch in a pool of a random number of threads. Every output and LSE element
//! must equal the reference's bit for bit.

use crate::case::{run, Case};
use crate::error::KitError;
use crate::gen::{CaseSpec, Rng};
use crate::judge::{equal_bits, subject_for, Outcome};
use crate::place::HostKv;
use crate::subject::Subject;

/// Variants per case.
const VARIANTS: usize = 3;
/// Largest thread pool a variant runs in.
const MAX_THREADS: usize = 6;

/// A piece of one request: its query tokens `t0..t1` (local to the request).
#[derive(Debug, Clone, Copy)]
struct Piece {
    req: usize,
    t0: usize,
    t1: usize,
}

/// Cuts query length `q` into chunks: lengths 1 only (`decode` and not `prefill`),
/// lengths >= 2 only (`prefill` and not `decode`), or any mix.
fn cut(q: usize, decode: bool, prefill: bool, rng: &mut Rng) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut t = 0;
    while t < q {
        let left = q - t;
        let len = match (decode, prefill) {
            (true, false) => 1,
            (false, _) if left < 4 => left,
            (false, _) => 2 + rng.below(left - 3),
            _ => 1 + rng.below(left),
        };
        out.push((t, t + len));
        t += len;
    }
    out
}

/// Compares `got` with `want` bit for bit; names the first difference.
fn same_bits(buffer: &'static str, got: &[f32], want: &[f32], what: &str) -> Result<(), KitError> {
    equal_bits("batch invariance", "as one batch", buffer, got, want, what)
}

pub(crate) fn batch_invariance(subject: &Subject, spec: &CaseSpec) -> Result<Outcome, KitError> {
    let cfg = spec.config(subject);
    let case = Case::from_spec(spec, cfg.clone(), 1)?;
    let caps = &subject.capabilities;
    // A configuration the subject cannot serve (e.g. a head dim of one dtype only).
    let Some(mut be) = subject_for(subject, &cfg, &case.query_lens)? else {
        return Ok(Outcome::NotApplicable);
    };
    if be.batch_invariant().is_none() {
        return Ok(Outcome::NotApplicable);
    }
    let lse = [caps.returns_lse];
    let whole = run(be.as_mut(), &case, &lse)?;
    let (h, d, bs) = (cfg.num_heads, cfg.head_dim, cfg.block_size);
    let mut rng = Rng::new(spec.seed ^ 0x1A7A_u64);
    for variant in 0..VARIANTS {
        // Renumber the physical blocks (and move their contents).
        let pool = case.full.spec.num_blocks;
        let pi = rng.permutation(pool);
        let mut full = HostKv::filled(case.full.spec, f32::NAN);
        let n = bs * case.full.spec.slot_elems();
        for (b, &to) in pi.iter().enumerate() {
            let to = to as usize;
            for (s, dl) in case.full.layers.iter().zip(full.layers.iter_mut()) {
                dl.k[to * n..(to + 1) * n].copy_from_slice(&s.k[b * n..(b + 1) * n]);
                dl.v[to * n..(to + 1) * n].copy_from_slice(&s.v[b * n..(b + 1) * n]);
            }
        }
        let rows: Vec<Vec<u32>> = case
            .block_rows
            .iter()
            .map(|r| r.iter().map(|&b| pi[b as usize]).collect())
            .collect();
        // Re-cut every request and shuffle the pieces.
        let mut pieces = Vec::new();
        for r in 0..case.query_lens.len() {
            for (t0, t1) in cut(case.query_lens[r], caps.decode, caps.prefill, &mut rng) {
                pieces.push(Piece { req: r, t0, t1 });
            }
        }
        for i in (1..pieces.len()).rev() {
            pieces.swap(i, rng.below(i + 1));
        }
        // Deal them into 1..=3 batches.
        let batches = 1 + rng.below(3.min(pieces.len()));
        let mut dealt = vec![Vec::new(); batches];
        for (i, p) in pieces.into_iter().enumerate() {
            dealt[if i < batches { i } else { rng.below(batches) }].push(p);
        }
        for mut batch in dealt {
            // Decode rows first (a stable sort keeps the shuffled order otherwise).
            batch.sort_by_key(|p| p.t1 - p.t0 > 1);
            let (mut ql, mut sl, mut br, mut q) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for p in &batch {
                let context = case.seq_lens[p.req] - case.query_lens[p.req];
                let seq = context + p.t1;
                ql.push(p.t1 - p.t0);
                sl.push(seq);
                br.push(rows[p.req][..seq.div_ceil(bs)].to_vec());
                let t = case.tokens_of(p.req).start;
                q.extend_from_slice(&case.q[0][(t + p.t0) * h * d..(t + p.t1) * h * d]);
            }
            let part = Case::from_parts(cfg.clone(), ql, sl, br, full.clone(), vec![q])?;
            let threads = 1 + rng.below(MAX_THREADS);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| KitError::Protocol {
                    check: "batch invariance",
                    message: format!("thread pool: {e}"),
                })?;
            let got = pool.install(|| run(be.as_mut(), &part, &lse))?;
            let mut at = 0;
            for p in &batch {
                let t = case.tokens_of(p.req).start;
                let (a, b) = (t + p.t0, t + p.t1);
                let len = b - a;
                let what = format!(
                    "request {} tokens {}..{} (variant {variant}, {} rows in the batch, {threads} threads)",
                    p.req,
                    p.t0,
                    p.t1,
                    part.batch.num_tokens()
                );
                same_bits(
                    "out",
                    &got.out[0][at * h * d..(at + len) * h * d],
                    &whole.out[0][a * h * d..b * h * d],
                    &what,
                )?;
                if let (Some(x), Some(y)) = (&got.lse[0], &whole.lse[0]) {
                    same_bits("lse", &x[at * h..(at + len) * h], &y[a * h..b * h], &what)?;
                }
                at += len;
            }
        }
    }
    Ok(Outcome::Passed)
}
