//! Hand-computed cases for the reference backend.

use super::*;
use pagoda_core::{registered_backends, KvCache, KvCacheSpec};

/// Runs `naive` on one batch whose cache holds `keys`/`vals` (per request, per
/// position, `[kv_heads * head_dim]`) at the batch's slots; unused slots are NaN.
struct Case {
    cfg: AttentionConfig,
    batch: BatchDescriptor,
    cache: KvCache,
}

impl Case {
    fn new(
        cfg: AttentionConfig,
        query_lens: &[usize],
        seq_lens: &[usize],
        rows: &[&[u32]],
        num_blocks: usize,
    ) -> Self {
        let batch = BatchDescriptor::new(cfg.block_size, query_lens, seq_lens, rows).unwrap();
        let spec = KvCacheSpec {
            num_layers: 1,
            num_blocks,
            block_size: cfg.block_size,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            dtype: pagoda_core::DType::F32,
        };
        Case {
            cfg,
            batch,
            cache: KvCache::filled(spec, f32::NAN),
        }
    }

    /// Stores K/V of request `r` at position `pos`.
    fn put(&mut self, r: usize, pos: usize, k: &[f32], v: &[f32]) {
        let bs = self.cfg.block_size;
        let slot = self.batch.blocks(r)[pos / bs] as usize * bs + pos % bs;
        let e = self.cache.spec.slot_elems();
        let l = &mut self.cache.layers[0];
        l.k.host_mut::<f32>().unwrap()[slot * e..(slot + 1) * e].copy_from_slice(k);
        l.v.host_mut::<f32>().unwrap()[slot * e..(slot + 1) * e].copy_from_slice(v);
    }

    fn run(&self, q: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let mut be = NaiveBackend::new(&self.cfg).unwrap();
        be.plan(&self.batch).unwrap();
        let t = self.batch.num_tokens();
        let mut out = vec![f32::NAN; t * self.cfg.num_heads * self.cfg.head_dim];
        let mut lse = vec![f32::NAN; t * self.cfg.num_heads];
        let l = &self.cache.layers[0];
        let (k, v) = (l.k.host::<f32>().unwrap(), l.v.host::<f32>().unwrap());
        be.run(LayerIo::cpu(q, k, v, &mut out, Some(&mut lse)))
            .unwrap();
        (out, lse)
    }
}

fn close(a: f32, b: f64) -> bool {
    (a as f64 - b).abs() <= 1e-6 + 1e-6 * b.abs()
}

#[test]
fn one_key_gives_its_value_and_lse_is_the_score() {
    let mut c = Case::new(AttentionConfig::cpu_f32(1, 1, 2, 4), &[1], &[1], &[&[3]], 5);
    c.put(0, 0, &[1.0, 2.0], &[7.0, -3.0]);
    let (out, lse) = c.run(&[0.5, 0.25]);
    assert_eq!(out, vec![7.0, -3.0]);
    // One key: lse = its scaled score = (0.5 + 0.5) / sqrt(2).
    assert!(close(lse[0], 1.0 / 2f64.sqrt()), "{lse:?}");
}

#[test]
fn equal_scores_average_the_values() {
    let mut c = Case::new(
        AttentionConfig::cpu_f32(1, 1, 2, 1),
        &[1],
        &[2],
        &[&[4, 1]],
        6,
    );
    c.put(0, 0, &[1.0, 1.0], &[2.0, 4.0]);
    c.put(0, 1, &[-1.0, -1.0], &[6.0, 0.0]);
    // q = 0 makes both scores 0.
    let (out, lse) = c.run(&[0.0, 0.0]);
    assert_eq!(out, vec![4.0, 2.0]);
    assert!(close(lse[0], 2f64.ln()));
}

#[test]
fn softmax_weights_and_lse_match_hand_computation() {
    let mut cfg = AttentionConfig::cpu_f32(1, 1, 1, 2);
    cfg.scale = 1.0;
    let mut c = Case::new(cfg, &[1], &[2], &[&[0]], 1);
    c.put(0, 0, &[1.0], &[10.0]);
    c.put(0, 1, &[2.0], &[20.0]);
    let (out, lse) = c.run(&[1.0]);
    // scores 1 and 2: weights e/(e+e^2), e^2/(e+e^2).
    let (e1, e2) = (1f64.exp(), 2f64.exp());
    assert!(
        close(out[0], (10.0 * e1 + 20.0 * e2) / (e1 + e2)),
        "{out:?}"
    );
    assert!(close(lse[0], (e1 + e2).ln()));
}

#[test]
fn prefill_rows_are_causal_with_the_context_offset() {
    // Context of 1 plus 2 new tokens: query 0 sees positions 0..=1, query 1 sees 0..=2.
    let mut cfg = AttentionConfig::cpu_f32(1, 1, 1, 2);
    cfg.scale = 1.0;
    let mut c = Case::new(cfg, &[2], &[3], &[&[1, 0]], 2);
    c.put(0, 0, &[0.0], &[1.0]);
    c.put(0, 1, &[0.0], &[3.0]);
    c.put(0, 2, &[0.0], &[8.0]);
    let (out, lse) = c.run(&[1.0, 1.0]);
    assert_eq!(out, vec![2.0, 4.0]);
    assert!(close(lse[0], 2f64.ln()) && close(lse[1], 3f64.ln()));
}

#[test]
fn gqa_heads_read_their_group_kv_head() {
    // 4 query heads over 2 KV heads: heads 0,1 -> kv 0; heads 2,3 -> kv 1.
    let mut c = Case::new(AttentionConfig::cpu_f32(4, 2, 1, 1), &[1], &[1], &[&[0]], 1);
    c.put(0, 0, &[0.0, 0.0], &[5.0, -5.0]);
    let (out, _) = c.run(&[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(out, vec![5.0, 5.0, -5.0, -5.0]);
}

#[test]
fn decode_rows_come_first_and_each_reads_its_own_blocks() {
    let cfg = AttentionConfig::cpu_f32(1, 1, 1, 2);
    let mut c = Case::new(cfg, &[1, 2], &[1, 2], &[&[2], &[0]], 3);
    c.put(0, 0, &[0.0], &[9.0]);
    c.put(1, 0, &[0.0], &[1.0]);
    c.put(1, 1, &[0.0], &[3.0]);
    let (out, _) = c.run(&[1.0, 1.0, 1.0]);
    assert_eq!(out, vec![9.0, 1.0, 2.0]);
}

#[test]
fn sliding_window_keeps_the_last_w_positions() {
    let mut cfg = AttentionConfig::cpu_f32(1, 1, 1, 4);
    cfg.sliding_window = Some(2);
    let mut c = Case::new(cfg, &[1], &[4], &[&[0]], 1);
    for (p, v) in [100.0, 200.0, 1.0, 3.0].into_iter().enumerate() {
        c.put(0, p, &[0.0], &[v]);
    }
    let (out, lse) = c.run(&[1.0]);
    assert_eq!(out, vec![2.0]);
    assert!(close(lse[0], 2f64.ln()));
}

#[test]
fn soft_cap_squashes_scores() {
    let mut cfg = AttentionConfig::cpu_f32(1, 1, 1, 2);
    cfg.scale = 1.0;
    cfg.logits_soft_cap = Some(1.0);
    let mut c = Case::new(cfg, &[1], &[2], &[&[0]], 1);
    c.put(0, 0, &[0.0], &[0.0]);
    c.put(0, 1, &[10.0], &[1.0]);
    let (out, lse) = c.run(&[1.0]);
    // Scores 0 and tanh(10).
    let s = 10f64.tanh();
    let w = s.exp() / (1.0 + s.exp());
    assert!(close(out[0], w), "{out:?}");
    assert!(close(lse[0], (1.0 + s.exp()).ln()));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let cfg = AttentionConfig::cpu_f32(2, 1, 4, 2);
    let mut be = NaiveBackend::new(&cfg).unwrap();
    let k = vec![0.0; 2 * 2 * 4];
    let mut out = vec![0.0; 2 * 4];
    fn io<'a>(q: &'a [f32], k: &'a [f32], out: &'a mut [f32]) -> LayerIo<'a> {
        LayerIo::cpu(q, k, k, out, None)
    }
    // run before plan
    assert!(be.run(io(&[0.0; 8], &k, &mut out)).is_err());
    // wrong block size
    let other = BatchDescriptor::new(4, &[1], &[1], &[&[0]]).unwrap();
    assert!(matches!(
        be.plan(&other),
        Err(CoreError::BlockSizeMismatch { .. })
    ));
    // block id past the pool
    let b = BatchDescriptor::new(2, &[1], &[1], &[&[7]]).unwrap();
    be.plan(&b).unwrap();
    assert!(matches!(
        be.run(io(&[0.0; 8], &k, &mut out)),
        Err(CoreError::BlockOutOfRange { block: 7, .. })
    ));
    // wrong q / out / lse lengths
    let b = BatchDescriptor::new(2, &[1], &[1], &[&[1]]).unwrap();
    be.plan(&b).unwrap();
    assert!(matches!(
        be.run(io(&[0.0; 7], &k, &mut out)),
        Err(CoreError::ShapeMismatch { name: "q", .. })
    ));
    let mut short = vec![0.0; 3];
    assert!(matches!(
        be.run(io(&[0.0; 8], &k, &mut short)),
        Err(CoreError::ShapeMismatch { name: "out", .. })
    ));
    let mut lse = vec![0.0; 1];
    let r = be.run(LayerIo::cpu(&[0.0; 8], &k, &k, &mut out, Some(&mut lse)));
    assert!(matches!(
        r,
        Err(CoreError::ShapeMismatch { name: "lse", .. })
    ));
    assert!(be.run(io(&[0.0; 8], &k, &mut out)).is_ok());
    // unsupported config
    let mut gpu = cfg.clone();
    gpu.device = pagoda_core::Device::Cuda(0);
    assert!(matches!(
        NaiveBackend::new(&gpu),
        Err(CoreError::BackendInvalid { .. })
    ));
}

#[test]
fn registered_under_its_name() {
    let reg = registered_backends()
        .into_iter()
        .find(|r| r.name == NAME)
        .expect("naive is registered");
    assert!(reg
        .reasons(&AttentionConfig::cpu_f32(9, 3, 80, 7), Role::Both)
        .is_empty());
    let be = (reg.create)(&AttentionConfig::cpu_f32(9, 3, 64, 16)).unwrap();
    assert_eq!(be.name(), "naive");
}
