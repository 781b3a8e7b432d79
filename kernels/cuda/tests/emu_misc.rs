//! `write_kv`, the mma fragment layout, the C/Rust parameter layouts, and bad input
//! (always an error, never a panic).

use half::{bf16, f16};
use pagoda_cuda_kernels::emu::{self, Batch, Io, Shape};
use pagoda_cuda_kernels::{AttnParams, Launch, SplitPlan, WriteKvParams, PAGED};
use pagoda_cuda_testkit::*;

/// Source rows of type S into pools of type T.
fn write_kv_case<S: Conv, T: Conv>(slots: &[i64], kvh: usize, d: usize, bs: usize, blocks: usize) {
    let shape = Shape::new(kvh, kvh, d, bs, 1.0);
    let mut rng = Rng(7);
    let row = kvh * d;
    let key: Vec<S> = (0..slots.len() * row)
        .map(|_| S::from_f32(rng.unit()))
        .collect();
    let value: Vec<S> = (0..slots.len() * row)
        .map(|_| S::from_f32(rng.unit()))
        .collect();
    let fill = T::from_f32(9.0);
    let mut kc = vec![fill; blocks * bs * row];
    let mut vc = vec![fill; blocks * bs * row];
    emu::write_kv(&key, &value, &mut kc, &mut vc, slots, &shape).unwrap();
    let mut want_k = vec![9.0f64; kc.len()];
    let mut want_v = vec![9.0f64; vc.len()];
    for (t, &s) in slots.iter().enumerate() {
        if s >= 0 {
            for i in 0..row {
                let conv = |x: S| T::from_f32(x.to_f64() as f32).to_f64();
                want_k[s as usize * row + i] = conv(key[t * row + i]);
                want_v[s as usize * row + i] = conv(value[t * row + i]);
            }
        }
    }
    // Conversion is round-to-nearest-even on both sides: bit-exact.
    assert_eq!(kc.iter().map(|x| x.to_f64()).collect::<Vec<_>>(), want_k);
    assert_eq!(vc.iter().map(|x| x.to_f64()).collect::<Vec<_>>(), want_v);
}

#[test]
fn write_kv_all_dtypes() {
    let slots = [3i64, -1, 0, 17, 9];
    write_kv_case::<f32, f32>(&slots, 2, 8, 4, 5);
    write_kv_case::<f32, bf16>(&slots, 2, 64, 16, 2);
    write_kv_case::<f32, f16>(&slots, 3, 24, 6, 3);
    write_kv_case::<bf16, bf16>(&slots, 2, 64, 16, 2);
    write_kv_case::<f16, f16>(&slots, 1, 16, 16, 2);
    write_kv_case::<bf16, f32>(&slots, 1, 16, 4, 5);
    write_kv_case::<f16, bf16>(&slots, 1, 16, 4, 5);
}

#[test]
fn write_kv_rejects_bad_slots_and_lengths() {
    let shape = Shape::new(1, 1, 4, 2, 1.0);
    let (k, v) = (vec![0.0f32; 4], vec![0.0f32; 4]);
    let mut kc = vec![bf16::ZERO; 8];
    let mut vc = vec![bf16::ZERO; 8];
    assert!(emu::write_kv(&k, &v, &mut kc, &mut vc, &[2], &shape).is_err()); // 2 slots in the pool
    assert!(emu::write_kv(&k, &v, &mut kc, &mut vc, &[-2], &shape).is_err());
    assert!(emu::write_kv(&k, &v, &mut kc, &mut vc, &[0, 1], &shape).is_err()); // 2 rows, 1 given
    let mut short = vec![bf16::ZERO; 7];
    assert!(emu::write_kv(&k, &v, &mut kc, &mut short, &[0], &shape).is_err());
    assert!(emu::write_kv(&k, &v, &mut kc, &mut vc, &[1], &shape).is_ok());
}

fn mma_case<T: Conv>(seed: u64) {
    let mut rng = Rng(seed);
    let a: Vec<T> = (0..256).map(|_| T::from_f32(rng.unit())).collect();
    let b: Vec<T> = (0..128).map(|_| T::from_f32(rng.unit())).collect();
    let c: Vec<f32> = (0..128).map(|_| rng.unit()).collect();
    let d = emu::mma_probe(&a, &b, &c).unwrap();
    for m in 0..16 {
        for n in 0..8 {
            let want = f64::from(c[m * 8 + n])
                + (0..16)
                    .map(|k| a[m * 16 + k].to_f64() * b[k * 8 + n].to_f64())
                    .sum::<f64>();
            // 16 exact products summed in f32: |error| <= 17 * 2^-24 * sum|terms| < 1e-5.
            assert!(
                (f64::from(d[m * 8 + n]) - want).abs() < 1e-5,
                "D[{m}][{n}] = {}, want {want}",
                d[m * 8 + n]
            );
        }
    }
}

#[test]
fn mma_fragment_layout_matches_a_matmul() {
    mma_case::<bf16>(3);
    mma_case::<f16>(4);
    assert!(emu::mma_probe(&[0.0f32; 256], &[0.0f32; 128], &[0.0; 128]).is_err());
}

#[test]
fn param_structs_match_the_c_side() {
    let c = emu::c_param_sizes();
    assert_eq!(c[0], std::mem::size_of::<WriteKvParams>() as u64);
    assert_eq!(c[1], std::mem::size_of::<AttnParams>() as u64);
    assert_eq!(c[2], std::mem::size_of::<Launch>() as u64);
    assert_eq!(c[3], 32);
}

#[test]
fn geometry_reads_only_scalars() {
    // Dangling pointers are fine: the launch functions never dereference them.
    let p = AttnParams {
        q: 16 as *const _,
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 128,
        seq_begin: 2,
        seq_end: 5,
        max_q_len: 130,
        num_splits: 4,
        num_rows: 7,
        ..AttnParams::default()
    };
    assert_eq!(PAGED.launch_of(&p).grid, [4, 2, 3]);
    assert_eq!(p.merge_states_launch().grid, [3, 8, 1]);
    assert_eq!(p.merge_states_launch().block, [128, 1, 1]);
}

/// Mutations of a valid batch that must each be refused.
fn broken(case: &Case<bf16>, which: u8) -> Result<(), pagoda_cuda_kernels::Error> {
    let mut qsl = case.qsl.clone();
    let mut seq_lens = case.seq_lens.clone();
    let mut table = case.block_table.clone();
    let mut shape = case.shape;
    let mut seqs = 0..case.seq_lens.len();
    let mut out_len = case.q.len();
    match which {
        0 => qsl[0] = 1,
        1 => seq_lens[0] = 0,
        2 => table[0] = 10_000,
        3 => shape.num_kv_heads = 3,
        4 => seqs = 0..9,
        5 => out_len -= 1,
        6 => shape.block_size = 1, // rows now need more blocks than the table has
        7 => shape.sliding_window = Some(0),
        8 => shape.soft_cap = Some(0.0),
        9 => shape.soft_cap = Some(f32::INFINITY),
        _ => shape.scale = f32::NAN,
    }
    let mut out = vec![bf16::ZERO; out_len];
    let batch = Batch {
        query_start_loc: &qsl,
        seq_lens: &seq_lens,
        block_table: &table,
        max_blocks_per_seq: case.max_blocks,
        seqs,
    };
    let io = Io {
        q: &case.q,
        key_cache: &case.k,
        value_cache: &case.v,
        out: &mut out,
        lse: None,
    };
    emu::paged(
        io,
        &batch,
        &shape,
        SplitPlan::single(64, case.shape.block_size),
    )
}

#[test]
fn bad_batches_are_errors() {
    let case = Case::<bf16>::new(&[SeqSpec { q_len: 1, ctx: 31 }], 4, 2, 64, 16, 1);
    for which in 0u8..11 {
        assert!(
            broken(&case, which).is_err(),
            "mutation {which} was accepted"
        );
    }
}
