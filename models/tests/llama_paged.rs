//! The Llama forward pass through the paged KV cache and the `naive` attention
//! backend, against a slow, obviously correct dense reference written here (plain
//! loops, f64, causal attention over the whole sequence, no paging).
//!
//! Tiny random models (2 layers, hidden 64, 4 heads, 2 KV heads, head dim 16,
//! vocab 100), with and without tied embeddings and llama3 RoPE scaling; prompts run
//! in one step and in chunks (prefill pieces + decodes, two requests interleaved)
//! over random physical blocks of a NaN-filled cache. Tolerance: 1e-4 relative +
//! 1e-5 absolute on every logit.

use pagoda_backend_naive::NaiveBackend;
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, KvCache, KvCacheSpec, StepBatch,
};
use pagoda_models::{
    ForwardScratch, LayerWeights, Llama, LlamaConfig, LlamaWeights, Mat, ModelError, RopeScaling,
};

const BLOCK: usize = 4;
const NUM_BLOCKS: usize = 40;

/// xorshift64*: deterministic test randomness without extra dependencies.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    fn mat(&mut self, rows: usize, cols: usize, amp: f32) -> Mat {
        Mat::new(rows, cols, self.vec(rows * cols, -amp, amp))
    }
}

fn tiny_config(tied: bool, scaled: bool) -> LlamaConfig {
    LlamaConfig {
        vocab_size: 100,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        // A small original context so the scaling changes most frequencies.
        rope_scaling: scaled.then_some(RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16,
        }),
        rope_freq_factors: None,
        max_position_embeddings: 128,
        tie_word_embeddings: tied,
        arch: Default::default(),
    }
}

fn random_weights(c: &LlamaConfig, seed: u64) -> LlamaWeights {
    let mut r = Rng(seed | 1);
    let (h, q, kv, i) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
    );
    let layers = (0..c.num_layers)
        .map(|_| LayerWeights {
            attn_norm: r.vec(h, 0.8, 1.2),
            wq: r.mat(q, h, 0.3),
            wk: r.mat(kv, h, 0.3),
            wv: r.mat(kv, h, 0.3),
            wo: r.mat(h, q, 0.2),
            ffn_norm: r.vec(h, 0.8, 1.2),
            w_gate: r.mat(i, h, 0.2),
            w_up: r.mat(i, h, 0.2),
            w_down: r.mat(h, i, 0.2),
            extra: Default::default(),
        })
        .collect();
    LlamaWeights {
        embed: r.mat(c.vocab_size, h, 1.0),
        layers,
        norm: r.vec(h, 0.8, 1.2),
        lm_head: (!c.tie_word_embeddings).then(|| r.mat(c.vocab_size, h, 0.3)),
    }
}

// ---------------------------------------------------------------- reference

fn linear(x: &[f64], w: &Mat) -> Vec<f64> {
    (0..w.rows)
        .map(|o| {
            (0..w.cols)
                .map(|c| x[c] * w.data[o * w.cols + c] as f64)
                .sum()
        })
        .collect()
}

fn rmsnorm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, g)| v * inv * *g as f64).collect()
}

/// Inverse frequency `i`, with the llama3 rule written out again, divided by the
/// frequency factor `i` when there are factors.
fn ref_inv_freq(c: &LlamaConfig, i: usize) -> f64 {
    let f = (c.rope_theta as f64).powf(-((2 * i) as f64) / c.head_dim as f64);
    let f = match &c.rope_freq_factors {
        Some(d) => f / d[i] as f64,
        None => f,
    };
    let Some(s) = c.rope_scaling else { return f };
    let old = s.original_max_position_embeddings as f64;
    let wavelen = 2.0 * std::f64::consts::PI / f;
    if wavelen < old / s.high_freq_factor as f64 {
        f
    } else if wavelen > old / s.low_freq_factor as f64 {
        f / s.factor as f64
    } else {
        let smooth = (old / wavelen - s.low_freq_factor as f64)
            / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
        (1.0 - smooth) * f / s.factor as f64 + smooth * f
    }
}

/// Rotate-half RoPE on one head at position `pos`.
fn rope(c: &LlamaConfig, x: &mut [f64], pos: usize) {
    let half = c.head_dim / 2;
    for i in 0..half {
        let a = pos as f64 * ref_inv_freq(c, i);
        let (x1, x2) = (x[i], x[i + half]);
        x[i] = x1 * a.cos() - x2 * a.sin();
        x[i + half] = x2 * a.cos() + x1 * a.sin();
    }
}

/// Logits at every position of `ids`, by a dense causal forward in f64.
fn reference_logits(c: &LlamaConfig, w: &LlamaWeights, ids: &[u32]) -> Vec<Vec<f64>> {
    let (n, hd) = (ids.len(), c.head_dim);
    let group = c.num_heads / c.num_kv_heads;
    let mut h: Vec<Vec<f64>> = ids
        .iter()
        .map(|&id| w.embed.row(id as usize).iter().map(|&v| v as f64).collect())
        .collect();
    for l in &w.layers {
        let xn: Vec<Vec<f64>> = h
            .iter()
            .map(|x| rmsnorm(x, &l.attn_norm, c.rms_norm_eps))
            .collect();
        let mut q: Vec<Vec<f64>> = xn.iter().map(|x| linear(x, &l.wq)).collect();
        let mut k: Vec<Vec<f64>> = xn.iter().map(|x| linear(x, &l.wk)).collect();
        let v: Vec<Vec<f64>> = xn.iter().map(|x| linear(x, &l.wv)).collect();
        for t in 0..n {
            for head in q[t].chunks_mut(hd) {
                rope(c, head, t);
            }
            for head in k[t].chunks_mut(hd) {
                rope(c, head, t);
            }
        }
        for t in 0..n {
            let mut out = vec![0.0; c.num_heads * hd];
            for head in 0..c.num_heads {
                let kvh = head / group;
                let qh = &q[t][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        qh.iter()
                            .zip(&k[j][kvh * hd..(kvh + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for d in 0..hd {
                        out[head * hd + d] += p / z * v[j][kvh * hd + d];
                    }
                }
            }
            let o = linear(&out, &l.wo);
            h[t].iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        }
        for x in h.iter_mut() {
            let xn = rmsnorm(x, &l.ffn_norm, c.rms_norm_eps);
            let g = linear(&xn, &l.w_gate);
            let u = linear(&xn, &l.w_up);
            let a: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = linear(&a, &l.w_down);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
    }
    let head = w.lm_head.as_ref().unwrap_or(&w.embed);
    h.iter()
        .map(|x| linear(&rmsnorm(x, &w.norm, c.rms_norm_eps), head))
        .collect()
}

// ---------------------------------------------------------------- paged runs

/// One step: `(request, new tokens)`; decode rows are ordered first automatically.
type Step = Vec<(usize, usize)>;

/// Runs `seqs` through the paged path on `schedule`, checking the logits of every
/// token (or only each row's last token when `last_only`) against the reference.
fn run_and_check(
    c: &LlamaConfig,
    w: &LlamaWeights,
    seqs: &[Vec<u32>],
    schedule: &[Step],
    seed: u64,
    last_only: bool,
) {
    let model = Llama::new(c.clone(), w.clone()).unwrap();
    let refs: Vec<_> = seqs.iter().map(|s| reference_logits(c, w, s)).collect();
    let spec = KvCacheSpec {
        num_layers: c.num_layers,
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        dtype: pagoda_core::DType::F32,
    };
    // NaN everywhere: a read of a slot nobody wrote poisons the logits.
    let mut kv = KvCache::filled(spec, f32::NAN);
    // Random distinct physical blocks for each request.
    let mut rng = Rng(seed | 1);
    let mut free: Vec<u32> = (0..NUM_BLOCKS as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let tables: Vec<Vec<u32>> = seqs
        .iter()
        .map(|s| {
            (0..s.len().div_ceil(BLOCK))
                .map(|_| free.pop().unwrap())
                .collect()
        })
        .collect();
    let mut backend = NaiveBackend::new(&AttentionConfig::cpu_f32(
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        BLOCK,
    ))
    .unwrap();
    let mut done = vec![0usize; seqs.len()];
    let (mut scratch, mut logits) = (ForwardScratch::default(), Vec::new());
    let mut checked = 0;
    for step in schedule {
        let mut rows = step.clone();
        rows.sort_by_key(|&(_, q)| q != 1);
        let (mut ids, mut pos, mut qlens, mut slens, mut brows) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut logits_rows, mut expect) = (vec![], vec![]);
        for &(r, q) in &rows {
            let start = done[r];
            for (p, &id) in seqs[r].iter().enumerate().skip(start).take(q) {
                if !last_only || p == start + q - 1 {
                    logits_rows.push(ids.len());
                    expect.push((r, p));
                }
                ids.push(id);
                pos.push(p as u32);
            }
            qlens.push(q);
            slens.push(start + q);
            brows.push(&tables[r][..(start + q).div_ceil(BLOCK)]);
            done[r] += q;
        }
        let batch = BatchDescriptor::new(BLOCK, &qlens, &slens, &brows).unwrap();
        backend.plan(&batch).unwrap();
        model
            .forward(
                &StepBatch {
                    input_ids: &ids,
                    positions: &pos,
                    batch: &batch,
                    logits_rows: &logits_rows,
                },
                &mut backend,
                &mut kv,
                &mut logits,
                &mut scratch,
            )
            .unwrap();
        assert_eq!(logits.len(), logits_rows.len() * c.vocab_size);
        for (i, &(r, p)) in expect.iter().enumerate() {
            let got = &logits[i * c.vocab_size..(i + 1) * c.vocab_size];
            for (tok, (&a, &b)) in got.iter().zip(&refs[r][p]).enumerate() {
                assert!(
                    ((a as f64) - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                    "request {r} position {p} token {tok}: {a} vs reference {b} (step {step:?})"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 0);
    for (r, s) in seqs.iter().enumerate() {
        assert_eq!(done[r], s.len(), "schedule must cover request {r}");
    }
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut r = Rng(seed | 1);
    (0..n).map(|_| (r.next() % 100) as u32).collect()
}

fn all_variants(f: impl Fn(&LlamaConfig, &LlamaWeights, u64)) {
    for (v, (tied, scaled)) in [(false, false), (true, false), (false, true), (true, true)]
        .into_iter()
        .enumerate()
    {
        let c = tiny_config(tied, scaled);
        let w = random_weights(&c, 1000 + v as u64);
        f(&c, &w, v as u64);
    }
}

/// Per-frequency RoPE divisors (a GGUF's `rope_freqs.weight`): the paged path
/// matches the reference that divides each frequency by its factor, and factors
/// made from the llama3 rule (as llama.cpp's converter makes them) give the logits
/// of the llama3-scaled config.
#[test]
fn rope_freq_factors_match_reference_and_llama3_scaling() {
    let scaled = tiny_config(false, true);
    let w = random_weights(&scaled, 77);
    let half = scaled.head_dim / 2;
    let mut factored = LlamaConfig {
        rope_scaling: None,
        rope_freq_factors: Some((0..half).map(|i| 1.0 + 0.75 * i as f32).collect()),
        ..scaled.clone()
    };
    let s = tokens(91, 12);
    let schedule: Vec<Step> = [7, 1, 3, 1].iter().map(|&q| vec![(0, q)]).collect();
    run_and_check(&factored, &w, std::slice::from_ref(&s), &schedule, 9, false);
    // The llama3 rule's factors (1, factor, or the blend in between).
    let plain = LlamaConfig {
        rope_scaling: None,
        ..scaled.clone()
    };
    let factors: Vec<f32> = (0..half)
        .map(|i| (ref_inv_freq(&plain, i) / ref_inv_freq(&scaled, i)) as f32)
        .collect();
    let near = |x: f32| factors.iter().any(|&f| (f - x).abs() < 1e-5);
    assert!(
        near(8.0) && factors.iter().any(|&f| f > 1.0 && f < 7.9),
        "{factors:?}"
    );
    factored.rope_freq_factors = Some(factors);
    // The references agree (so the paged runs of both configs check the same logits).
    let last = |c: &LlamaConfig| reference_logits(c, &w, &s).last().unwrap().clone();
    for (a, b) in last(&factored).iter().zip(last(&scaled)) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
    run_and_check(&factored, &w, &[s], &schedule, 10, false);
    // Wrong length: refused when the model is built.
    factored.rope_freq_factors = Some(vec![1.0; half + 1]);
    assert!(Llama::new(factored, w).is_err());
}

#[test]
fn whole_prompt_in_one_step_matches_reference() {
    all_variants(|c, w, seed| {
        let s = tokens(seed + 7, 11);
        run_and_check(c, w, &[s], &[vec![(0, 11)]], seed, false);
    });
}

#[test]
fn chunked_prefill_then_decodes_match_reference() {
    all_variants(|c, w, seed| {
        let s = tokens(seed + 11, 12);
        let schedule: Vec<Step> = [5, 3, 1, 1, 2].iter().map(|&q| vec![(0, q)]).collect();
        run_and_check(c, w, &[s], &schedule, seed + 3, false);
    });
}

#[test]
fn two_interleaved_requests_match_reference() {
    all_variants(|c, w, seed| {
        let a = tokens(seed + 21, 13);
        let b = tokens(seed + 22, 10);
        // Mixed batches: prefill + prefill, decode + prefill, decodes.
        let schedule: Vec<Step> = vec![
            vec![(0, 6), (1, 3)],
            vec![(0, 1), (1, 5)],
            vec![(0, 4), (1, 1)],
            vec![(0, 1)],
            vec![(1, 1), (0, 1)],
        ];
        run_and_check(c, w, &[a.clone(), b.clone()], &schedule, seed + 5, false);
        // Logits of only each row's last token (as the engine asks for them).
        run_and_check(c, w, &[a, b], &schedule, seed + 6, true);
    });
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let c = tiny_config(true, false);
    let w = random_weights(&c, 3);
    let model = Llama::new(c.clone(), w.clone()).unwrap();
    assert_eq!(model.config(), &c);
    let spec = KvCacheSpec {
        num_layers: 2,
        num_blocks: 4,
        block_size: BLOCK,
        num_kv_heads: 2,
        head_dim: 16,
        dtype: pagoda_core::DType::F32,
    };
    let mut kv = KvCache::new(spec);
    let mut backend = NaiveBackend::new(&AttentionConfig::cpu_f32(4, 2, 16, BLOCK)).unwrap();
    let batch = BatchDescriptor::new(BLOCK, &[2], &[2], &[&[1]]).unwrap();
    backend.plan(&batch).unwrap();
    let (mut s, mut logits) = (ForwardScratch::default(), Vec::new());
    let mut run = |ids: &[u32], pos: &[u32], rows: &[usize]| {
        model.forward(
            &StepBatch {
                input_ids: ids,
                positions: pos,
                batch: &batch,
                logits_rows: rows,
            },
            &mut backend,
            &mut kv,
            &mut logits,
            &mut s,
        )
    };
    assert!(
        matches!(
            run(&[1, 100], &[0, 1], &[1]),
            Err(ModelError::Forward { .. })
        ),
        "token id out of vocab"
    );
    assert!(
        run(&[1, 2], &[0, 1], &[2]).is_err(),
        "logits row out of range"
    );
    assert!(run(&[1, 2], &[0], &[1]).is_err(), "positions length");
    assert!(
        run(&[1, 2], &[0, 128], &[1]).is_err(),
        "position past max_position_embeddings"
    );
    assert!(run(&[1], &[0], &[0]).is_err(), "batch has 2 tokens");
    assert!(run(&[1, 2], &[0, 1], &[1]).is_ok());

    let mut bad = w.clone();
    bad.layers[1].wk = Mat::new(16, 64, vec![0.0; 16 * 64]);
    assert!(matches!(
        Llama::new(c.clone(), bad),
        Err(ModelError::TensorShape { .. })
    ));
    let mut bad = w.clone();
    bad.layers.pop();
    assert!(Llama::new(c.clone(), bad).is_err());
    let mut odd = c.clone();
    odd.num_kv_heads = 3;
    assert!(Llama::new(odd, w).is_err());
}

#[test]
fn logits_rows_may_be_unordered_and_repeated() {
    all_variants(|c, w, seed| {
        let s = tokens(seed + 31, 7);
        let refs = reference_logits(c, w, &s);
        let model = Llama::new(c.clone(), w.clone()).unwrap();
        let spec = KvCacheSpec {
            num_layers: 2,
            num_blocks: 2,
            block_size: BLOCK,
            num_kv_heads: 2,
            head_dim: 16,
            dtype: pagoda_core::DType::F32,
        };
        let mut kv = KvCache::filled(spec, f32::NAN);
        let mut backend = NaiveBackend::new(&AttentionConfig::cpu_f32(4, 2, 16, BLOCK)).unwrap();
        let batch = BatchDescriptor::new(BLOCK, &[7], &[7], &[&[1, 0]]).unwrap();
        backend.plan(&batch).unwrap();
        let (mut scratch, mut logits) = (ForwardScratch::default(), Vec::new());
        let pos: Vec<u32> = (0..7).collect();
        let rows = [5, 2, 5, 0];
        model
            .forward(
                &StepBatch {
                    input_ids: &s,
                    positions: &pos,
                    batch: &batch,
                    logits_rows: &rows,
                },
                &mut backend,
                &mut kv,
                &mut logits,
                &mut scratch,
            )
            .unwrap();
        assert_eq!(logits.len(), rows.len() * c.vocab_size);
        for (i, &t) in rows.iter().enumerate() {
            for (a, b) in logits[i * c.vocab_size..(i + 1) * c.vocab_size]
                .iter()
                .zip(&refs[t])
            {
                assert!(
                    ((*a as f64) - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                    "row {t}: {a} vs {b}"
                );
            }
        }
        // No logits wanted at all is fine too.
        let batch2 = BatchDescriptor::new(BLOCK, &[1], &[8], &[&[1, 0]]).unwrap();
        backend.plan(&batch2).unwrap();
        model
            .forward(
                &StepBatch {
                    input_ids: &[3],
                    positions: &[7],
                    batch: &batch2,
                    logits_rows: &[],
                },
                &mut backend,
                &mut kv,
                &mut logits,
                &mut scratch,
            )
            .unwrap();
        assert!(logits.is_empty());
    });
}
