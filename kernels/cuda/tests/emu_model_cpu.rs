//! model.cu against the CPU kernels the model runs today (`pagoda_kernels`), on f32: the
//! semantics must be the same (same formulas, same RoPE convention and tables, same argmax
//! contract). Also: bad input is an error (never a panic), the C/Rust struct sizes, and
//! the launch geometry.

use pagoda_cuda_kernels::emu_model::{self as em, RopeKvIo, RopeKvShape};
use pagoda_cuda_kernels::{
    ArgmaxParams, CastParams, EmbedParams, Error, GatherParams, GluParams, NormParams, RopeKvParams,
};
use pagoda_cuda_testkit::Rng;
use pagoda_kernels::{Llama3Scaling, RopeCache};
use proptest::prelude::*;
use std::mem::size_of;
use std::ptr;

fn rand(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * scale).collect()
}

/// `RopeCache`'s cos/sin tables `[max_pos, head_dim / 2]`, read back through `apply` on
/// unit vectors (x1 = 1, x2 = 0 gives exactly cos and sin): what the integrator uploads.
fn rope_tables(cache: &RopeCache) -> (Vec<f32>, Vec<f32>) {
    let (d, max_pos) = (cache.head_dim(), cache.max_position());
    let half = d / 2;
    let mut x = vec![0.0f32; max_pos * d];
    for p in 0..max_pos {
        x[p * d..p * d + half].fill(1.0);
    }
    let positions: Vec<u32> = (0..max_pos as u32).collect();
    cache.apply(&mut x, 1, &positions).unwrap();
    let cos = (0..max_pos)
        .flat_map(|p| x[p * d..p * d + half].to_vec())
        .collect();
    let sin = (0..max_pos)
        .flat_map(|p| x[p * d + half..(p + 1) * d].to_vec())
        .collect();
    (cos, sin)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// f32 q and k rotated exactly as RopeCache::apply does (same products, same order:
    /// bit-equal), with Llama 3 scaling, and v copied; GQA and padded rows.
    #[test]
    fn rope_is_rope_cache_apply(tokens in 1..5usize, kv_heads in 1..3usize, group in 1..4usize,
                                half_d in 1..33usize, llama3 in any::<bool>(), seed in any::<u64>()) {
        let (nkv, nh, d) = (kv_heads, kv_heads * group, 2 * half_d);
        let scaling = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16,
        };
        let max_pos = 40;
        let cache = RopeCache::new(d, max_pos, 10_000.0, llama3.then_some(&scaling)).unwrap();
        let (cos, sin) = rope_tables(&cache);
        let mut rng = Rng(seed | 1);
        let width = (nh + 2 * nkv) * d;
        let qkv = rand(&mut rng, tokens * width, 3.0);
        let positions: Vec<i32> = (0..tokens).map(|_| (rng.next() % max_pos as u64) as i32).collect();
        let slots: Vec<i32> = (0..tokens).map(|t| if t == 1 { -1 } else { t as i32 }).collect();
        let mut q_out = vec![0.0f32; tokens * nh * d];
        let mut k_pool = vec![0.0f32; tokens * nkv * d];
        let mut v_pool = k_pool.clone();
        let io = RopeKvIo {
            qkv: &qkv, bias: None, positions: &positions, cos: &cos, sin: &sin,
            slot_mapping: &slots, q_out: &mut q_out, k_pool: &mut k_pool, v_pool: &mut v_pool,
        };
        let shape = RopeKvShape { num_heads: nh, num_kv_heads: nkv, head_dim: d, block_size: 1 };
        em::rope_write_kv(io, &shape).unwrap();
        let pos_u: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let mut q: Vec<f32> = (0..tokens).flat_map(|t| qkv[t * width..][..nh * d].to_vec()).collect();
        let mut k: Vec<f32> = (0..tokens).flat_map(|t| qkv[t * width + nh * d..][..nkv * d].to_vec()).collect();
        cache.apply(&mut q, nh, &pos_u).unwrap();
        cache.apply(&mut k, nkv, &pos_u).unwrap();
        prop_assert_eq!(&q_out, &q);
        for t in 0..tokens {
            let row = nkv * d;
            let (k_got, v_got) = (&k_pool[t * row..][..row], &v_pool[t * row..][..row]);
            if slots[t] < 0 {
                prop_assert!(k_got.iter().chain(v_got).all(|&x| x == 0.0), "padded row {t} written");
            } else {
                prop_assert_eq!(k_got, &k[t * row..][..row]);
                prop_assert_eq!(v_got, &qkv[t * width + (nh + nkv) * d..][..row]);
            }
        }
    }

    /// rms_norm / add_rms_norm vs pagoda_kernels: only the order of the sum of squares
    /// differs, so 4e-6 relative (a few f32 roundings of a <= 256-term sum); the
    /// residual is bit-equal.
    #[test]
    fn norms_match_pagoda_kernels(rows in 1..4usize, dim in 1..257usize, seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let x = rand(&mut rng, rows * dim, 2.0);
        let w = rand(&mut rng, dim, 1.5);
        let res = rand(&mut rng, rows * dim, 3.0);
        let (mut got, mut want) = (vec![0.0f32; rows * dim], vec![0.0f32; rows * dim]);
        em::rms_norm(&x, &w, 1e-6, 0.0, &mut got).unwrap();
        pagoda_kernels::rms_norm(&x, &w, 1e-6, &mut want).unwrap();
        for (g, e) in got.iter().zip(&want) {
            prop_assert!((g - e).abs() <= 4e-6 * e.abs(), "rms_norm {} vs {}", g, e);
        }
        let (mut r_got, mut r_want) = (res.clone(), res.clone());
        em::add_rms_norm(&mut r_got, &x, &w, 1e-6, 0.0, &mut got).unwrap();
        pagoda_kernels::add_rms_norm(&mut r_want, &x, &w, 1e-6, &mut want).unwrap();
        prop_assert_eq!(&r_got, &r_want);
        for (g, e) in got.iter().zip(&want) {
            prop_assert!((g - e).abs() <= 4e-6 * e.abs(), "add_rms_norm {} vs {}", g, e);
        }
    }

    /// SwiGLU / GeGLU vs pagoda_kernels (its exp is 2 ulp from expf: 1e-6 relative; GeGLU's
    /// tanh cancels for negative gates, hence the absolute term in |gate up|).
    #[test]
    fn glu_match_pagoda_kernels(rows in 1..4usize, inter in 1..100usize, seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let gu = rand(&mut rng, rows * 2 * inter, 6.0);
        let (mut got, mut want) = (vec![0.0f32; rows * inter], vec![0.0f32; rows * inter]);
        em::silu_mul(&gu, inter, &mut got).unwrap();
        pagoda_kernels::silu_mul_fused(&gu, inter, &mut want).unwrap();
        for (g, e) in got.iter().zip(&want) {
            prop_assert!((g - e).abs() <= 1e-6 * e.abs(), "silu {} vs {}", g, e);
        }
        em::gelu_tanh_mul(&gu, inter, &mut got).unwrap();
        pagoda_kernels::gelu_tanh_mul_fused(&gu, inter, &mut want).unwrap();
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            let (r, c) = (i / inter, i % inter);
            let gate_up = (gu[r * 2 * inter + c] * gu[r * 2 * inter + inter + c]).abs();
            prop_assert!((g - e).abs() <= 1e-6 * e.abs() + 2e-6 * gate_up, "gelu {} vs {}", g, e);
        }
    }

    /// argmax is pagoda_kernels::argmax (None -> index 0), and on NaN-free rows also
    /// max_index's (index, value).
    #[test]
    fn argmax_is_pagoda_argmax(rows in 1..4usize, vocab in 1..300usize, nans in any::<bool>(),
                               seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|_| match rng.next() % 16 {
                0 if nans => f32::NAN,
                1 => f32::NEG_INFINITY,
                k => (k % 4) as f32,
            })
            .collect();
        let (mut ids, mut values) = (vec![0i32; rows], vec![0.0f32; rows]);
        em::argmax(&logits, vocab, &mut ids, &mut values).unwrap();
        for r in 0..rows {
            let row = &logits[r * vocab..][..vocab];
            prop_assert_eq!(ids[r] as usize, pagoda_kernels::argmax(row).unwrap_or(0));
            if !nans {
                prop_assert_eq!((ids[r] as usize, values[r]), pagoda_kernels::max_index(row));
            }
        }
    }
}

/// The embedding of a 16-bit table is the f32 value times the scale, and an argmax over a
/// row of only NaNs or of length 0 is (0, -inf).
#[test]
fn argmax_edge_rows() {
    let (mut ids, mut values) = (vec![5i32; 2], vec![1.0f32; 2]);
    em::argmax(
        &[f32::NAN, f32::NAN, f32::NAN, 1.0],
        2,
        &mut ids,
        &mut values,
    )
    .unwrap();
    assert_eq!((ids, values), (vec![0, 1], vec![f32::NEG_INFINITY, 1.0]));
    let (mut ids, mut values) = (vec![5i32; 3], vec![1.0f32; 3]);
    em::argmax::<f32>(&[], 0, &mut ids, &mut values).unwrap();
    assert_eq!((ids, values), (vec![0; 3], vec![f32::NEG_INFINITY; 3]));
    // [NaN, -inf]: -inf is a value (argmax's contract), not "none".
    let (mut ids, mut values) = (vec![5i32; 1], vec![1.0f32; 1]);
    em::argmax(&[f32::NAN, f32::NEG_INFINITY], 2, &mut ids, &mut values).unwrap();
    assert_eq!((ids[0], values[0]), (1, f32::NEG_INFINITY));
}

fn is_invalid(r: Result<(), Error>, what: &str) {
    match r {
        Err(Error::Invalid { what: w, .. }) if w == what => {}
        other => panic!("expected Invalid {{ what: {what} }}, got {other:?}"),
    }
}

#[test]
fn bad_input_is_an_error() {
    let x = vec![1.0f32; 8];
    let mut out = vec![0.0f32; 8];
    // embed: id out of range, negative id, ragged table, wrong out length, zero hidden.
    is_invalid(em::embed(&[0, 2], &x, 4, 1.0, &mut out), "ids");
    is_invalid(em::embed(&[-1, 0], &x, 4, 1.0, &mut out), "ids");
    is_invalid(em::embed(&[0, 0], &x, 3, 1.0, &mut out), "table");
    is_invalid(em::embed(&[0], &x, 4, 1.0, &mut out), "out");
    is_invalid(em::embed(&[0], &x, 0, 1.0, &mut out), "hidden");
    is_invalid(em::embed(&[0, 1], &x, 4, f32::NAN, &mut out), "scale");
    // norms: empty weight, ragged x, out length, eps, residual vs x.
    is_invalid(em::rms_norm(&x, &[], 1e-5, 0.0, &mut out), "weight");
    is_invalid(em::rms_norm(&x, &[1.0; 3], 1e-5, 0.0, &mut out), "x");
    is_invalid(em::rms_norm(&x, &[1.0; 4], 1e-5, 0.0, &mut out[..4]), "out");
    is_invalid(em::rms_norm(&x, &[1.0; 4], -1.0, 0.0, &mut out), "eps");
    is_invalid(
        em::rms_norm(&x, &[1.0; 4], 1e-5, f32::INFINITY, &mut out),
        "w_offset",
    );
    let mut res = vec![0.0f32; 8];
    is_invalid(
        em::add_rms_norm(&mut res, &x[..4], &[1.0; 4], 1e-5, 0.0, &mut out),
        "x",
    );
    // glu: inter 0, ragged out, gate_up length.
    is_invalid(em::silu_mul(&x, 0, &mut out), "inter");
    is_invalid(em::silu_mul(&x, 3, &mut out), "out");
    is_invalid(em::gelu_tanh_mul(&x, 4, &mut out), "gate_up");
    // gather: row out of range, negative row, out length.
    is_invalid(em::gather_rows(&x, 4, &[2], &mut out[..4]), "rows");
    is_invalid(em::gather_rows(&x, 4, &[-1], &mut out[..4]), "rows");
    is_invalid(em::gather_rows(&x, 4, &[1], &mut out), "out");
    // argmax: lengths.
    let (mut ids, mut vals) = (vec![0i32; 2], vec![0.0f32; 2]);
    is_invalid(em::argmax(&x, 3, &mut ids, &mut vals), "logits");
    is_invalid(em::argmax(&x, 4, &mut ids, &mut vals[..1]), "values");
    // cast: lengths.
    is_invalid(em::cast(&x, &mut out[..7]), "dst");
}

#[test]
fn bad_rope_input_is_an_error() {
    // 2 q heads, 1 kv head, d 4: qkv rows of 16; tables for 3 positions; 2 blocks of 2.
    let (nh, nkv, d, bs) = (2, 1, 4, 2);
    let shape = RopeKvShape {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: d,
        block_size: bs,
    };
    let qkv = [0.5f32; 2 * 16];
    let tab = [0.5f32; 3 * 2];
    let run = |shape: &RopeKvShape,
               positions: &[i32],
               slots: &[i32],
               bias: Option<&[f32]>,
               q_len: usize,
               pool: usize,
               cos_len: usize| {
        let mut q_out = vec![0.0f32; q_len];
        let (mut k, mut v) = (vec![0.0f32; pool], vec![0.0f32; pool]);
        let io = RopeKvIo {
            qkv: &qkv,
            bias,
            positions,
            cos: &tab[..cos_len],
            sin: &tab[..cos_len],
            slot_mapping: slots,
            q_out: &mut q_out,
            k_pool: &mut k,
            v_pool: &mut v,
        };
        em::rope_write_kv(io, shape)
    };
    let pool = 2 * bs * nkv * d;
    // The valid call works (slot -1 allowed).
    run(&shape, &[0, 2], &[3, -1], None, 16, pool, 6).unwrap();
    is_invalid(
        run(&shape, &[0, 3], &[3, 0], None, 16, pool, 6),
        "positions",
    );
    is_invalid(
        run(&shape, &[-1, 0], &[3, 0], None, 16, pool, 6),
        "positions",
    );
    is_invalid(
        run(&shape, &[0, 1], &[4, 0], None, 16, pool, 6),
        "slot_mapping",
    );
    is_invalid(
        run(&shape, &[0, 1], &[0], None, 16, pool, 6),
        "slot_mapping",
    );
    is_invalid(
        run(&shape, &[0, 1], &[0, 1], Some(&[0.0; 15]), 16, pool, 6),
        "bias",
    );
    is_invalid(run(&shape, &[0, 1], &[0, 1], None, 15, pool, 6), "q_out");
    is_invalid(
        run(&shape, &[0, 1], &[0, 1], None, 16, pool - 1, 6),
        "k_pool",
    );
    is_invalid(run(&shape, &[0, 1], &[0, 1], None, 16, pool, 5), "cos");
    is_invalid(run(&shape, &[0], &[0], None, 8, pool, 6), "qkv");
    let odd = RopeKvShape {
        head_dim: 3,
        ..shape
    };
    is_invalid(run(&odd, &[0, 1], &[0, 1], None, 16, pool, 6), "head_dim");
    let gqa = RopeKvShape {
        num_heads: 3,
        num_kv_heads: 2,
        ..shape
    };
    is_invalid(run(&gqa, &[0, 1], &[0, 1], None, 16, pool, 6), "heads");
    let no_blocks = RopeKvShape {
        block_size: 0,
        ..shape
    };
    is_invalid(
        run(&no_blocks, &[0, 1], &[0, 1], None, 16, pool, 6),
        "block_size",
    );
}

#[test]
fn c_and_rust_structs_match() {
    let want = [
        size_of::<EmbedParams>(),
        size_of::<NormParams>(),
        size_of::<RopeKvParams>(),
        size_of::<GluParams>(),
        size_of::<GatherParams>(),
        size_of::<ArgmaxParams>(),
        size_of::<CastParams>(),
        size_of::<pagoda_cuda_kernels::QkNormParams>(),
        size_of::<pagoda_cuda_kernels::SoftCapParams>(),
        size_of::<pagoda_cuda_kernels::MoeRouteParams>(),
        size_of::<pagoda_cuda_kernels::MoeAccParams>(),
    ]
    .map(|s| s as u64);
    assert_eq!(em::c_param_sizes(), want);
}

#[test]
fn launch_geometry() {
    // One block per row, 128..=1024 threads (multiples of 32), none for empty work.
    let norm = |rows, dim| {
        NormParams {
            x: ptr::null(),
            residual: ptr::null_mut(),
            weight: ptr::null(),
            out: ptr::null_mut(),
            rows,
            dim,
            eps: 0.0,
            w_offset: 0.0,
        }
        .launch()
    };
    assert_eq!(
        (norm(7, 64).grid, norm(7, 64).block),
        ([7, 1, 1], [128, 1, 1])
    );
    assert_eq!(norm(3, 4096).block, [512, 1, 1]);
    assert_eq!(norm(3, 16384).block, [1024, 1, 1]);
    assert!(norm(0, 64).is_empty());
    let argmax = ArgmaxParams {
        logits: ptr::null(),
        ids: ptr::null_mut(),
        values: ptr::null_mut(),
        rows: 2,
        vocab: 262_144,
    };
    assert_eq!(
        (argmax.launch().grid, argmax.launch().block),
        ([2, 1, 1], [1024, 1, 1])
    );
    let rope = RopeKvParams {
        qkv: ptr::null(),
        bias: ptr::null(),
        positions: ptr::null(),
        cos: ptr::null(),
        sin: ptr::null(),
        slot_mapping: ptr::null(),
        q_out: ptr::null_mut(),
        k_pool: ptr::null_mut(),
        v_pool: ptr::null_mut(),
        num_tokens: 5,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
    };
    // Llama 3 8B: 40 rotated heads x 64 pairs = 2560 pairs -> 1024 threads.
    assert_eq!(
        (rope.launch().grid, rope.launch().block),
        ([5, 1, 1], [1024, 1, 1])
    );
    let cast = CastParams {
        src: ptr::null(),
        dst: ptr::null_mut(),
        n: 1 << 30,
    };
    assert_eq!(
        (cast.launch().grid, cast.launch().block),
        ([4096, 1, 1], [256, 1, 1])
    );
    let glu = GluParams {
        gate_up: ptr::null(),
        out: ptr::null_mut(),
        rows: 4,
        inter: 14336,
    };
    assert_eq!(glu.launch().block, [1024, 1, 1]);
    let gather = GatherParams {
        x: ptr::null(),
        rows: ptr::null(),
        out: ptr::null_mut(),
        num_rows: 0,
        dim: 8,
    };
    assert!(gather.launch().is_empty());
    let embed = EmbedParams {
        ids: ptr::null(),
        table: ptr::null(),
        out: ptr::null_mut(),
        num_tokens: 9,
        hidden: 2048,
        scale: 1.0,
        pad: 0,
    };
    assert_eq!(
        (embed.launch().grid, embed.launch().block),
        ([9, 1, 1], [256, 1, 1])
    );
}
