//! Random case specifications: small plain descriptions of a batch that proptest
//! draws and shrinks. The floats themselves are expanded from `seed` by a tiny
//! deterministic PRNG, so shrinking works on shapes, not on thousands of values.

use crate::subject::Subject;
use pagoda_core::{AttentionConfig, DType, Device, DeviceKind};
use proptest::prelude::*;

/// Head dims drawn when a backend supports any.
pub const ANY_HEAD_DIMS: [usize; 6] = [8, 16, 32, 64, 80, 128];
/// Block sizes drawn (restricted to the backend's list when it has one).
pub const BLOCK_SIZES: [usize; 4] = [1, 8, 16, 32];
/// Largest context a case draws.
pub const MAX_CONTEXT: usize = 2048;
/// Largest query length of a prefill row.
pub const MAX_QUERY_LEN: usize = 64;
/// Work budget per case, in query-key-dim products summed over heads. The naive
/// reference accumulates in f64, so this bounds the suite's run time.
pub const WORK_BUDGET: u64 = 4_000_000;

/// One request of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpec {
    /// Tokens already in the cache.
    pub context: usize,
    /// New tokens this step (1 = a decode row).
    pub query_len: usize,
}

impl RowSpec {
    pub fn seq_len(&self) -> usize {
        self.context + self.query_len
    }
}

/// A whole case: shapes, options, rows (decode rows first) and a data seed.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseSpec {
    pub num_kv_heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub sliding_window: Option<usize>,
    pub soft_cap: Option<f32>,
    pub rows: Vec<RowSpec>,
    /// Unused blocks in the pool beyond what the rows need (left NaN).
    pub spare_blocks: usize,
    /// Magnitude of Q and K entries; larger makes softmax peakier.
    pub amplitude: f32,
    pub seed: u64,
}

impl CaseSpec {
    pub fn num_heads(&self) -> usize {
        self.num_kv_heads * self.group
    }

    /// The configuration this case runs under for `subject`: its placement if chosen,
    /// else CPU (then emu, then cuda:0) and f32 preferred.
    pub fn config(&self, subject: &Subject) -> AttentionConfig {
        let caps = &subject.capabilities;
        let mut cfg = AttentionConfig::cpu_f32(
            self.num_heads(),
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
        );
        match subject.placement {
            Some(p) => {
                cfg.device = p.device;
                cfg.q_dtype = p.q_dtype;
                cfg.kv_dtype = p.kv_dtype;
            }
            None => {
                cfg.device = [
                    (DeviceKind::Cpu, Device::Cpu),
                    (DeviceKind::Emu, Device::Emu),
                    (DeviceKind::Cuda, Device::Cuda(0)),
                ]
                .into_iter()
                .find(|(k, _)| caps.devices.contains(k))
                .map_or(Device::Cpu, |(_, d)| d);
                cfg.q_dtype = prefer_f32(&caps.q_dtypes);
                cfg.kv_dtype = prefer_f32(&caps.kv_dtypes);
            }
        }
        cfg.sliding_window = self.sliding_window;
        cfg.logits_soft_cap = self.soft_cap;
        cfg
    }

    /// Multiply-adds of the reference over the case (one layer).
    pub fn work(&self) -> u64 {
        let per_key = (self.num_heads() * self.head_dim) as u64;
        self.rows
            .iter()
            .map(|r| {
                (0..r.query_len)
                    .map(|i| {
                        let visible = r.context + i + 1;
                        self.sliding_window.map_or(visible, |w| visible.min(w)) as u64
                    })
                    .sum::<u64>()
                    * per_key
            })
            .sum()
    }

    /// Drops the most expensive rows until the case fits `budget` (by default
    /// [`WORK_BUDGET`]) or one row is left; a smaller budget ([`crate::CaseLimit`]) then
    /// also halves that row's context and query until it fits.
    fn fit_budget(mut self, budget: u64) -> Self {
        while self.work() > budget && self.rows.len() > 1 {
            let costly = (0..self.rows.len())
                .max_by_key(|&i| {
                    self.rows[i].query_len * (self.rows[i].context + self.rows[i].query_len)
                })
                .unwrap_or(0);
            self.rows.remove(costly);
        }
        if budget < WORK_BUDGET {
            while self.work() > budget && self.rows[0].context > 0 {
                self.rows[0].context /= 2;
            }
            while self.work() > budget && self.rows[0].query_len > 2 {
                self.rows[0].query_len /= 2;
            }
        }
        self
    }
}

fn prefer_f32(list: &[DType]) -> DType {
    if list.contains(&DType::F32) || list.is_empty() {
        DType::F32
    } else {
        list[0]
    }
}

/// Which rows a strategy may produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Only query length 1.
    Decode,
    /// Only query length >= 2.
    Prefill,
    /// Both, decode rows first.
    Mixed,
}

/// Shape constraints derived from a subject's capabilities.
#[derive(Debug, Clone)]
pub struct Shapes {
    pub head_dims: Vec<usize>,
    pub block_sizes: Vec<usize>,
    pub max_group: usize,
    pub rows: Rows,
    pub sliding_window: bool,
    pub soft_cap: bool,
    /// Every case has the window and cap above ([`crate::Subject::features_always`]).
    pub features_always: bool,
    /// Work budget per case ([`WORK_BUDGET`] unless the subject has a [`crate::CaseLimit`]).
    pub work_budget: u64,
}

impl Shapes {
    pub fn of(subject: &Subject) -> Self {
        let caps = &subject.capabilities;
        let head_dims = caps
            .head_dims
            .clone()
            .unwrap_or_else(|| ANY_HEAD_DIMS.to_vec());
        let block_sizes = match &caps.block_sizes {
            None => BLOCK_SIZES.to_vec(),
            Some(list) => {
                let common: Vec<usize> = BLOCK_SIZES
                    .iter()
                    .copied()
                    .filter(|b| list.contains(b))
                    .collect();
                if common.is_empty() {
                    list.clone()
                } else {
                    common
                }
            }
        };
        let rows = match (caps.decode, caps.prefill) {
            (true, true) => Rows::Mixed,
            (true, false) => Rows::Decode,
            _ => Rows::Prefill,
        };
        Shapes {
            head_dims,
            block_sizes,
            max_group: caps.max_gqa_ratio.unwrap_or(8).clamp(1, 8),
            rows,
            sliding_window: caps.sliding_window,
            soft_cap: caps.logits_soft_cap,
            features_always: subject.features_always,
            work_budget: subject
                .case_limit
                .map_or(WORK_BUDGET, |l| l.work.min(WORK_BUDGET)),
        }
    }
}

/// Contexts biased to block edges: mostly small, a few up to [`MAX_CONTEXT`].
fn context(block_size: usize) -> BoxedStrategy<usize> {
    let edge = move |max_blocks: usize| {
        (0..=max_blocks, -1i64..=1)
            .prop_map(move |(k, d)| (k as i64 * block_size as i64 + d).max(0) as usize)
    };
    let small_blocks = (96 / block_size).max(2);
    let large_blocks = MAX_CONTEXT / block_size;
    prop_oneof![
        5 => 0usize..=24,
        4 => edge(small_blocks),
        1 => edge(large_blocks).prop_map(|c| c.min(MAX_CONTEXT)),
    ]
    .boxed()
}

fn prefill_len(block_size: usize) -> BoxedStrategy<usize> {
    let edges = [block_size.saturating_sub(1), block_size, block_size + 1];
    let edges: Vec<usize> = edges
        .into_iter()
        .map(|q| q.clamp(2, MAX_QUERY_LEN))
        .collect();
    prop_oneof![4 => 2usize..=8, 2 => 2usize..=MAX_QUERY_LEN, 1 => proptest::sample::select(edges)]
        .boxed()
}

fn row(block_size: usize, decode: bool) -> BoxedStrategy<RowSpec> {
    let q = if decode {
        Just(1usize).boxed()
    } else {
        prefill_len(block_size)
    };
    (context(block_size), q)
        .prop_map(|(context, query_len)| RowSpec { context, query_len })
        .boxed()
}

fn rows(block_size: usize, kind: Rows) -> BoxedStrategy<Vec<RowSpec>> {
    match kind {
        Rows::Decode => proptest::collection::vec(row(block_size, true), 1..=8).boxed(),
        Rows::Prefill => proptest::collection::vec(row(block_size, false), 1..=8).boxed(),
        Rows::Mixed => (
            proptest::collection::vec(row(block_size, true), 0..=4),
            proptest::collection::vec(row(block_size, false), 0..=4),
        )
            .prop_filter_map("at least one row", |(mut d, p)| {
                d.extend(p);
                (!d.is_empty()).then_some(d)
            })
            .boxed(),
    }
}

/// Cases for `shapes`; `min_group` forces GQA (used by the GQA check).
pub fn case_spec(shapes: &Shapes, min_group: usize) -> BoxedStrategy<CaseSpec> {
    let s = shapes.clone();
    let groups = min_group.min(s.max_group)..=s.max_group;
    let budget = s.work_budget;
    (
        1usize..=4,
        groups,
        proptest::sample::select(s.head_dims.clone()),
        proptest::sample::select(s.block_sizes.clone()),
    )
        .prop_flat_map(move |(num_kv_heads, group, head_dim, block_size)| {
            // A window (cap) in a quarter of the cases, in all with `features_always`.
            let some_window = (1usize..=96).prop_map(Some);
            let window = match (s.sliding_window, s.features_always) {
                (false, _) => Just(None).boxed(),
                (true, true) => some_window.boxed(),
                (true, false) => prop_oneof![3 => Just(None), 1 => some_window].boxed(),
            };
            let some_cap = proptest::sample::select(vec![2.0f32, 30.0]).prop_map(Some);
            let cap = match (s.soft_cap, s.features_always) {
                (false, _) => Just(None).boxed(),
                (true, true) => some_cap.boxed(),
                (true, false) => prop_oneof![3 => Just(None), 1 => some_cap].boxed(),
            };
            (
                rows(block_size, s.rows),
                window,
                cap,
                0usize..=8,
                proptest::sample::select(vec![0.5f32, 1.0, 2.0]),
                any::<u64>(),
            )
                .prop_map(
                    move |(rows, sliding_window, soft_cap, spare_blocks, amplitude, seed)| {
                        CaseSpec {
                            num_kv_heads,
                            group,
                            head_dim,
                            block_size,
                            sliding_window,
                            soft_cap,
                            rows,
                            spare_blocks,
                            amplitude,
                            seed,
                        }
                        .fit_budget(budget)
                    },
                )
        })
        .boxed()
}

/// SplitMix64: a tiny deterministic generator for case data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[-1, 1)`.
    pub fn signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// A uniformly random permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
    pub fn fill(&mut self, n: usize, amplitude: f32) -> Vec<f32> {
        (0..n).map(|_| self.signed() * amplitude).collect()
    }
}
