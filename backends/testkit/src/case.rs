//! Concrete cases: a batch, its paged cache and its queries, built from a
//! [`CaseSpec`] or from explicit parts, and a runner that drives a backend through
//! the step protocol (plan once, then per layer: `write_kv`, `run`).

use crate::error::KitError;
use crate::gen::{CaseSpec, Rng};
use crate::place::{download, round_to, runtime, upload, HostKv, HostLayer, Placement};
use pagoda_core::{AttentionBackend, AttentionConfig, BatchDescriptor, KvCacheSpec, LayerIo};

/// One step of one batch, ready to run.
#[derive(Debug, Clone)]
pub struct Case {
    pub cfg: AttentionConfig,
    pub query_lens: Vec<usize>,
    pub seq_lens: Vec<usize>,
    pub block_rows: Vec<Vec<u32>>,
    pub batch: BatchDescriptor,
    /// Every position's K/V of every request at its slot (values of the config's KV
    /// dtype); unused slots NaN.
    pub full: HostKv,
    /// `full` with this step's slots poisoned again: backends write them with `write_kv`.
    pub cache: HostKv,
    /// Per layer, `[tokens, num_kv_heads, head_dim]`: the step's new K and V.
    pub new_k: Vec<Vec<f32>>,
    pub new_v: Vec<Vec<f32>>,
    /// Per layer, `[tokens, num_heads, head_dim]` (values of the config's q dtype).
    pub q: Vec<Vec<f32>>,
}

/// What one backend produced for a case.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// Per layer, `[tokens, num_heads, head_dim]`.
    pub out: Vec<Vec<f32>>,
    /// Per layer, `[tokens, num_heads]` where LSE was asked for.
    pub lse: Vec<Option<Vec<f32>>>,
    /// The cache after the backend's `write_kv` calls, widened to f32.
    pub cache: HostKv,
}

/// The cache shape for `cfg` with `num_blocks` blocks.
pub fn cache_spec(cfg: &AttentionConfig, layers: usize, num_blocks: usize) -> KvCacheSpec {
    KvCacheSpec {
        num_layers: layers,
        num_blocks,
        block_size: cfg.block_size,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        dtype: cfg.kv_dtype,
    }
}

/// The slot of position `pos` of a request with physical blocks `row`.
pub fn slot(row: &[u32], block_size: usize, pos: usize) -> usize {
    row[pos / block_size] as usize * block_size + pos % block_size
}

impl Case {
    /// Builds the case a spec describes, with `layers` layers of independent data.
    pub fn from_spec(
        spec: &CaseSpec,
        cfg: AttentionConfig,
        layers: usize,
    ) -> Result<Case, KitError> {
        let mut rng = Rng::new(spec.seed);
        let bs = spec.block_size;
        let needed: usize = spec.rows.iter().map(|r| r.seq_len().div_ceil(bs)).sum();
        let pool = needed + spec.spare_blocks;
        // Physical ids are a random permutation of a larger pool, so a backend that
        // reads block i instead of block_table[i] reads NaN or someone else's data.
        let perm = rng.permutation(pool);
        let mut next = 0;
        let block_rows: Vec<Vec<u32>> = spec
            .rows
            .iter()
            .map(|r| {
                let n = r.seq_len().div_ceil(bs);
                next += n;
                perm[next - n..next].to_vec()
            })
            .collect();
        let mut full = HostKv::filled(cache_spec(&cfg, layers, pool), f32::NAN);
        let e = cfg.num_kv_heads * cfg.head_dim;
        for layer in full.layers.iter_mut() {
            for (r, row) in spec.rows.iter().enumerate() {
                for pos in 0..row.seq_len() {
                    let s = slot(&block_rows[r], bs, pos);
                    layer.k[s * e..(s + 1) * e].copy_from_slice(&rng.fill(e, spec.amplitude));
                    layer.v[s * e..(s + 1) * e].copy_from_slice(&rng.fill(e, 1.0));
                }
            }
        }
        // The truth is made of values the subject's dtypes can hold.
        for layer in full.layers.iter_mut() {
            round_to(cfg.kv_dtype, &mut layer.k);
            round_to(cfg.kv_dtype, &mut layer.v);
        }
        let tokens: usize = spec.rows.iter().map(|r| r.query_len).sum();
        let q = (0..layers)
            .map(|_| {
                let mut q = rng.fill(tokens * cfg.num_heads * cfg.head_dim, spec.amplitude);
                round_to(cfg.q_dtype, &mut q);
                q
            })
            .collect();
        let query_lens = spec.rows.iter().map(|r| r.query_len).collect();
        let seq_lens = spec.rows.iter().map(|r| r.seq_len()).collect();
        Case::from_parts(cfg, query_lens, seq_lens, block_rows, full, q)
    }

    /// Builds a case from its parts; `full` must hold every position of every request.
    pub fn from_parts(
        cfg: AttentionConfig,
        query_lens: Vec<usize>,
        seq_lens: Vec<usize>,
        block_rows: Vec<Vec<u32>>,
        full: HostKv,
        q: Vec<Vec<f32>>,
    ) -> Result<Case, KitError> {
        let rows: Vec<&[u32]> = block_rows.iter().map(|r| r.as_slice()).collect();
        let batch = BatchDescriptor::new(cfg.block_size, &query_lens, &seq_lens, &rows).map_err(
            |source| KitError::Backend {
                backend: "kit".into(),
                stage: "BatchDescriptor::new",
                source,
            },
        )?;
        let e = full.spec.slot_elems();
        let mut cache = full.clone();
        let mut new_k = Vec::new();
        let mut new_v = Vec::new();
        for (layer, poisoned) in full.layers.iter().zip(cache.layers.iter_mut()) {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            for &s in batch.slot_mapping() {
                let s = s as usize;
                k.extend_from_slice(&layer.k[s * e..(s + 1) * e]);
                v.extend_from_slice(&layer.v[s * e..(s + 1) * e]);
                poisoned.k[s * e..(s + 1) * e].fill(f32::NAN);
                poisoned.v[s * e..(s + 1) * e].fill(f32::NAN);
            }
            new_k.push(k);
            new_v.push(v);
        }
        Ok(Case {
            cfg,
            query_lens,
            seq_lens,
            block_rows,
            batch,
            full,
            cache,
            new_k,
            new_v,
            q,
        })
    }

    pub fn layers(&self) -> usize {
        self.full.layers.len()
    }

    /// `[tokens, heads, dim]` elements of one layer's output.
    pub fn out_elems(&self) -> usize {
        self.batch.num_tokens() * self.cfg.num_heads * self.cfg.head_dim
    }

    /// Token range of request `r`.
    pub fn tokens_of(&self, r: usize) -> std::ops::Range<usize> {
        self.batch.tokens(r)
    }
}

/// Drives `be` through one step of `case`: `plan`, then per layer `write_kv` and
/// `run` (asking for LSE on the layers where `want_lse[layer]`), with every buffer
/// placed on the case's device in its dtypes. Outputs start as NaN so that an element
/// the backend forgets to write fails the comparison; they come back widened to f32.
pub fn run(
    be: &mut dyn AttentionBackend,
    case: &Case,
    want_lse: &[bool],
) -> Result<Outputs, KitError> {
    let name = be.name().to_string();
    let err = |stage: &'static str| {
        let name = name.clone();
        move |source| KitError::Backend {
            backend: name,
            stage,
            source,
        }
    };
    let place = Placement::of(&case.cfg);
    let rt = runtime(&place).map_err(err("open device"))?;
    let rt = rt.as_ref();
    let e = case.cache.spec.slot_elems();
    let h = case.cfg.num_heads;
    be.plan(&case.batch).map_err(err("plan"))?;
    let (mut all_out, mut all_lse, mut layers) = (Vec::new(), Vec::new(), Vec::new());
    for (l, layer) in case.cache.layers.iter().enumerate() {
        let placed = |dtype, data: &[f32]| upload(rt, dtype, data).map_err(err("upload"));
        let mut k_pool = placed(place.kv_dtype, &layer.k)?;
        let mut v_pool = placed(place.kv_dtype, &layer.v)?;
        // New K/V arrive as activations, in the query's dtype.
        let new_k = placed(place.q_dtype, &case.new_k[l])?;
        let new_v = placed(place.q_dtype, &case.new_v[l])?;
        let q = placed(place.q_dtype, &case.q[l])?;
        let mut out = placed(place.q_dtype, &vec![f32::NAN; case.out_elems()])?;
        let mut lse = match want_lse.get(l).copied().unwrap_or(false) {
            true => Some(placed(
                pagoda_core::DType::F32,
                &vec![f32::NAN; case.batch.num_tokens() * h],
            )?),
            false => None,
        };
        be.write_kv(
            k_pool.view_mut(),
            v_pool.view_mut(),
            new_k.view(),
            new_v.view(),
            case.batch.slot_mapping(),
            e,
        )
        .map_err(err("write_kv"))?;
        be.run(LayerIo {
            q: q.view(),
            k_cache: k_pool.view(),
            v_cache: v_pool.view(),
            out: out.view_mut(),
            lse: lse.as_mut().map(|l| l.view_mut()),
        })
        .map_err(err("run"))?;
        let back = |s: &pagoda_core::Storage| download(rt, s.view()).map_err(err("download"));
        all_out.push(back(&out)?);
        all_lse.push(lse.as_ref().map(back).transpose()?);
        layers.push(HostLayer {
            k: back(&k_pool)?,
            v: back(&v_pool)?,
        });
    }
    Ok(Outputs {
        out: all_out,
        lse: all_lse,
        cache: HostKv {
            spec: case.cache.spec,
            layers,
        },
    })
}
