//! Helpers for a backend crate's own kernel tests, beside the conformance suite:
//! one-layer cases with the whole cache filled up front (no `write_kv`), a runner
//! that calls a backend directly, the naive reference on the same case, and an
//! element-wise comparison that panics with the first bad element.
//!
//! ```ignore
//! use pagoda_backend_testkit::{direct, Tolerance};
//! let case = direct::rows_case(&cfg, &[(1, 700), (5, 9)], seed).unwrap();
//! let (want_o, want_l) = direct::reference(&case).unwrap();
//! let (o, l) = direct::run_twice(&mut my_backend, &case, true).unwrap();
//! direct::assert_close("out", &o, &want_o, &case, Tolerance::F32);
//! ```

use crate::case::Case;
use crate::error::{KitError, Tolerance};
use crate::gen::{CaseSpec, RowSpec};
use crate::judge::naive;
use crate::place::host_vec;
use pagoda_core::{
    AttentionBackend, AttentionConfig, CoreError, LayerIo, Shape, Storage, TensorMut, TensorRef,
};

/// `(num_heads, num_kv_heads, head_dim)` worth testing a CPU kernel on: GQA 3
/// (SmolLM2), MQA, MHA, Llama-8B, and the widest head.
pub const HEAD_SHAPES: [(usize, usize, usize); 5] = [
    (9, 3, 64),
    (4, 1, 16),
    (8, 8, 32),
    (32, 8, 128),
    (2, 2, 256),
];

/// Unused blocks in a [`rows_case`] pool beyond what its rows need (left NaN).
pub const SPARE_BLOCKS: usize = 3;

/// A one-layer case for `cfg` with `rows` = `(query_len, seq_len)` per request,
/// decode rows first. Physical blocks are a random permutation of a pool with
/// [`SPARE_BLOCKS`] extra blocks; every slot no request owns, and every owned slot
/// past a request's length, stays NaN. Q, K and V are uniform in `[-1, 1)`, drawn
/// from `seed`. All K/V (this step's too) are in `case.full.layers[0]`.
pub fn rows_case(
    cfg: &AttentionConfig,
    rows: &[(usize, usize)],
    seed: u64,
) -> Result<Case, KitError> {
    let rows = rows
        .iter()
        .map(|&(query_len, seq_len)| {
            let context = seq_len.checked_sub(query_len).ok_or(KitError::Protocol {
                check: "rows_case",
                message: format!("query length {query_len} exceeds sequence length {seq_len}"),
            })?;
            Ok(RowSpec { context, query_len })
        })
        .collect::<Result<Vec<_>, KitError>>()?;
    let spec = CaseSpec {
        num_kv_heads: cfg.num_kv_heads,
        group: cfg.gqa_ratio(),
        head_dim: cfg.head_dim,
        block_size: cfg.block_size,
        sliding_window: cfg.sliding_window,
        soft_cap: cfg.logits_soft_cap,
        rows,
        spare_blocks: SPARE_BLOCKS,
        amplitude: 1.0,
        seed,
    };
    Case::from_spec(&spec, cfg.clone(), 1)
}

/// One layer of `case` through `be` over the full cache (pools of the case's
/// `kv_dtype`, queries and outputs f32, on its host device): `plan`, then `run` as
/// many times as `runs` (later runs must not depend on leftovers of earlier ones).
/// Returns `(out, lse)`; outputs start as NaN and `lse` stays NaN unless `with_lse`.
pub fn run_layer(
    be: &mut dyn AttentionBackend,
    case: &Case,
    with_lse: bool,
    runs: usize,
) -> Result<(Vec<f32>, Vec<f32>), CoreError> {
    be.plan(&case.batch)?;
    let layer = &case.full.layers[0];
    // The pools in the configuration's KV dtype (the case's values are already
    // representable in it), on its host device.
    let (dtype, device) = (case.cfg.kv_dtype, case.cfg.device);
    let pool = |x: &[f32]| Storage::from_host(device, host_vec(dtype, x), Shape::flat(x.len()));
    let (k, v) = (pool(&layer.k)?, pool(&layer.v)?);
    let mut out = vec![f32::NAN; case.out_elems()];
    let mut lse = vec![f32::NAN; case.batch.num_tokens() * case.cfg.num_heads];
    for _ in 0..runs {
        be.run(LayerIo {
            q: TensorRef::host(device, &case.q[0])?,
            k_cache: k.view(),
            v_cache: v.view(),
            out: TensorMut::host(device, &mut out)?,
            lse: match with_lse {
                true => Some(TensorMut::host(device, &mut lse[..])?),
                false => None,
            },
        })?;
    }
    Ok((out, lse))
}

/// [`run_layer`] with two runs: the check that a layer call keeps no state.
pub fn run_twice(
    be: &mut dyn AttentionBackend,
    case: &Case,
    with_lse: bool,
) -> Result<(Vec<f32>, Vec<f32>), CoreError> {
    run_layer(be, case, with_lse, 2)
}

/// The naive (f64-accumulated) backend's `(out, lse)` for `case`.
pub fn reference(case: &Case) -> Result<(Vec<f32>, Vec<f32>), KitError> {
    let mut be = naive(&case.cfg)?;
    run_layer(be.as_mut(), case, true, 1).map_err(|source| KitError::Backend {
        backend: "naive".into(),
        stage: "run",
        source,
    })
}

/// Panics unless every element of `actual` is within `tol` of `expected` (NaN
/// fails). `what` names the buffer in the message; an `out` buffer is read as
/// `[tokens, heads, head_dim]`, anything else as `[tokens, heads]`.
#[track_caller]
pub fn assert_close(what: &str, actual: &[f32], expected: &[f32], case: &Case, tol: Tolerance) {
    let heads = case.cfg.num_heads;
    let width = if actual.len() == case.out_elems() {
        case.cfg.head_dim
    } else {
        1
    };
    if let Err(e) = tol.compare("direct", "buffer", actual, expected, heads, width) {
        panic!("{what}: {e}");
    }
}

/// `LayerIo` with the same pool for K and V and no LSE, for misuse tests.
pub fn layer_io<'a>(q: &'a [f32], kv: &'a [f32], out: &'a mut [f32]) -> LayerIo<'a> {
    LayerIo::cpu(q, kv, kv, out, None)
}

/// What a backend answered to three misuses of `case` (first two on a fresh plan).
#[derive(Debug)]
pub struct Misuse {
    /// `run` before any `plan`.
    pub before_plan: Result<(), CoreError>,
    /// After `plan`: a `q` buffer one element short.
    pub short_q: Result<(), CoreError>,
    /// After `plan`: a pool of one block, too small for the case's block ids.
    pub one_block_pool: Result<(), CoreError>,
}

impl Misuse {
    /// Panics unless every misuse was refused, the short `q` as a
    /// [`CoreError::ShapeMismatch`] naming `q` (what [`LayerIo::validate`] reports).
    #[track_caller]
    pub fn assert_refused(&self) {
        assert!(self.before_plan.is_err(), "run before plan was accepted");
        assert!(
            matches!(
                self.short_q,
                Err(CoreError::ShapeMismatch { name: "q", .. })
            ),
            "short q: {:?}",
            self.short_q
        );
        assert!(
            self.one_block_pool.is_err(),
            "a pool too small for the block table was accepted"
        );
    }
}

/// Feeds `be` (freshly created, never planned) the misuses of [`Misuse`].
/// Fails only if `plan` itself fails.
pub fn misuse(be: &mut dyn AttentionBackend, case: &Case) -> Result<Misuse, CoreError> {
    let (q, k) = (&case.q[0], &case.full.layers[0].k);
    let mut out = vec![0f32; case.out_elems()];
    let before_plan = be.run(layer_io(q, k, &mut out));
    be.plan(&case.batch)?;
    let short_q = be.run(layer_io(&q[1..], k, &mut out));
    let block = case.cfg.block_size * case.cfg.num_kv_heads * case.cfg.head_dim;
    let one_block_pool = be.run(layer_io(q, &k[..block], &mut out));
    Ok(Misuse {
        before_plan,
        short_q,
        one_block_pool,
    })
}
