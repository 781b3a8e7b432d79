//! The CUDA attention backends' device code path on `emu`: the conversions, uploads,
//! parameter packing and launches that `cuda:N` runs (`pagoda_cuda::device`), with
//! the emulator as the driver.
//!
//! Regression (issue 22): core pads a block table's short rows and a graph's padding
//! rows with `BatchDescriptor::PAD_BLOCK` (`u32::MAX`); the GPU path converted it with
//! `i32::try_from` and failed every step with two requests of different block counts
//! and every graph capture, while the old emu path passed the `u32`s through and never
//! saw it. Here both kinds of padding go through the one conversion, into the
//! kernels, against an f64 reference (tolerance: the bf16 output's rounding, 2^-8,
//! doubled for flash's P rounding, + 1e-5; outputs lie in [-1, 1]).

use half::bf16;
use pagoda_backend_cuda_flash::KERNEL as FLASH;
use pagoda_backend_cuda_naive::KERNEL as NAIVE;
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, DType, Device, GraphLimits, LayerIo,
    TensorMut, TensorRef,
};
use pagoda_cuda::attn::{CudaAttention, Kernel, PAGED};
use pagoda_cuda_kernels::graph;

const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const D: usize = 64;
const BS: usize = 4;
const BLOCKS: usize = 8;
const TOL: f64 = 2.0 * (1.0 / 256.0) + 1e-5;

fn cfg() -> AttentionConfig {
    AttentionConfig {
        device: Device::Emu,
        q_dtype: DType::BF16,
        kv_dtype: DType::BF16,
        num_heads: HEADS,
        num_kv_heads: KV_HEADS,
        head_dim: D,
        block_size: BS,
        scale: 1.0 / (D as f32).sqrt(),
        sliding_window: None,
        logits_soft_cap: None,
    }
}

/// Deterministic values in [-1, 1), rounded to bf16.
fn values(n: usize, seed: u64) -> Vec<bf16> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf16::from_f64((s >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
        })
        .collect()
}

struct Pools {
    k: Vec<bf16>,
    v: Vec<bf16>,
}

fn pools() -> Pools {
    let n = BLOCKS * BS * KV_HEADS * D;
    Pools {
        k: values(n, 1),
        v: values(n, 2),
    }
}

/// f64 causal attention of every token of `batch` (rows `[tokens, heads, D]`).
fn reference(batch: &BatchDescriptor, q: &[bf16], p: &Pools) -> Vec<f64> {
    let mut out = vec![0.0; q.len()];
    let qsl = batch.query_start_loc();
    let scale = 1.0 / (D as f64).sqrt();
    for r in 0..batch.num_reqs() {
        let row = &batch.block_table()[r * batch.block_table_stride()..];
        let (start, end) = (qsl[r] as usize, qsl[r + 1] as usize);
        let seq_len = batch.seq_lens()[r] as usize;
        for t in start..end {
            let pos = seq_len - (end - start) + (t - start);
            for h in 0..HEADS {
                let kvh = h / (HEADS / KV_HEADS);
                let at = |pool: &[bf16], key: usize, i: usize| {
                    let slot = row[key / BS] as usize * BS + key % BS;
                    pool[(slot * KV_HEADS + kvh) * D + i].to_f64()
                };
                let qv = |i: usize| q[(t * HEADS + h) * D + i].to_f64();
                let s: Vec<f64> = (0..=pos)
                    .map(|key| (0..D).map(|i| qv(i) * at(&p.k, key, i)).sum::<f64>() * scale)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = w.iter().sum();
                for i in 0..D {
                    let o: f64 = (0..=pos).map(|key| w[key] * at(&p.v, key, i)).sum();
                    out[(t * HEADS + h) * D + i] = o / l;
                }
            }
        }
    }
    out
}

fn io<'a>(q: &'a [bf16], p: &'a Pools, out: &'a mut [bf16]) -> LayerIo<'a> {
    LayerIo {
        q: TensorRef::host(Device::Emu, q).unwrap(),
        k_cache: TensorRef::host(Device::Emu, &p.k).unwrap(),
        v_cache: TensorRef::host(Device::Emu, &p.v).unwrap(),
        out: TensorMut::host(Device::Emu, out).unwrap(),
        lse: None,
    }
}

fn assert_close(what: &str, got: &[bf16], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g.to_f64() - w).abs();
        assert!(
            e <= TOL,
            "{what}: element {i}: {} vs {w} (|e| {e})",
            g.to_f64()
        );
    }
}

fn backend(kernel: &'static Kernel) -> CudaAttention {
    let name = match kernel.name {
        "naive" => "cuda-naive",
        "paged" => "cuda-paged",
        _ => "cuda-flash",
    };
    CudaAttention::new(name, kernel, &cfg()).unwrap()
}

/// Two decode requests of 3 and 10 tokens: one block and three, so the first row of
/// the table is padded twice.
fn two_decodes() -> BatchDescriptor {
    BatchDescriptor::new(BS, &[1, 1], &[3, 10], &[&[5], &[1, 6, 2]]).unwrap()
}

#[test]
fn short_rows_of_an_eager_step_reach_the_kernels() {
    let p = pools();
    let decode = two_decodes();
    assert_eq!(decode.block_table()[1], BatchDescriptor::PAD_BLOCK);
    // Two prefills (chunks of 5 and 2 new tokens over 7 and 14) for flash.
    let prefill = BatchDescriptor::new(BS, &[5, 2], &[7, 14], &[&[3, 7], &[0, 4, 1, 6]]).unwrap();
    assert_eq!(prefill.block_table()[2], BatchDescriptor::PAD_BLOCK);
    for (kernel, batch) in [
        (&NAIVE, &decode),
        (&PAGED, &decode),
        (&NAIVE, &prefill),
        (&FLASH, &prefill),
    ] {
        let mut b = backend(kernel);
        let q = values(batch.num_tokens() * HEADS * D, 3);
        let mut out = vec![bf16::ZERO; q.len()];
        b.plan(batch).unwrap();
        b.run(io(&q, &p, &mut out))
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        assert_close(kernel.name, &out, &reference(batch, &q, &p));
    }
}

#[test]
fn graph_padding_rows_reach_the_kernels_and_replay() {
    let p = pools();
    let limits = GraphLimits {
        max_seq_len: BLOCKS * BS,
        max_num_reqs: 4,
        max_num_tokens: 4,
        max_blocks_per_seq: BLOCKS,
    };
    let real = two_decodes();
    let want = reference(&real, &values(2 * HEADS * D, 4), &p);
    let mut padded = real.clone();
    padded.pad_decode(4, BLOCKS).unwrap();
    // Padding rows: one key of block 0, the rest of each row no block.
    assert_eq!(
        padded.block_table()[2 * BLOCKS..3 * BLOCKS][..2],
        [0, BatchDescriptor::PAD_BLOCK]
    );
    for kernel in [&NAIVE, &PAGED] {
        let mut b = backend(kernel);
        let mut q = values(2 * HEADS * D, 4);
        q.resize(4 * HEADS * D, bf16::ZERO);
        let mut out = vec![bf16::ZERO; q.len()];
        b.plan_graph(&padded, &limits).unwrap();
        b.run(io(&q, &p, &mut out))
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        assert_close(
            &format!("{} eager", kernel.name),
            &out[..2 * HEADS * D],
            &want,
        );

        // Captured, then replayed into a cleared output: the same values.
        let mut replayed = vec![bf16::ZERO; q.len()];
        graph::begin_capture().unwrap();
        let captured = b.run(io(&q, &p, &mut replayed));
        let g = graph::end_capture().unwrap();
        captured.unwrap();
        assert!(
            replayed.iter().all(|x| *x == bf16::ZERO),
            "a capture records, runs nothing"
        );
        // SAFETY: q, the pools, `replayed` and the backend's buffers are alive and
        // unmoved since the capture, and nothing else borrows them now.
        unsafe { g.replay() }.unwrap();
        assert_eq!(replayed, out, "{}: replay vs eager", kernel.name);
    }
}

#[test]
fn a_graph_plan_covers_the_limit_in_short_partitions() {
    let limits = GraphLimits {
        max_seq_len: 4096,
        max_num_reqs: 4,
        max_num_tokens: 4,
        max_blocks_per_seq: 4096 / BS,
    };
    // The fixed plan (the default) and the adaptive one's graph plan.
    for mut b in [backend(&PAGED), backend(&PAGED).with_adaptive_splits()] {
        let mut padded = two_decodes();
        padded.pad_decode(2, limits.max_blocks_per_seq).unwrap();
        b.plan_graph(&padded, &limits).unwrap();
        let graph = b.planned_split().unwrap();
        assert!(graph.num_splits * graph.partition_size >= 4096, "{graph:?}");
        assert_eq!(graph.partition_size, 256, "{graph:?}");
    }
    // The plan chosen for the limit (what graphs used before) is one partition of all
    // 4096 keys on the emulator's 2 SMs (2 requests x 2 KV heads already make 2 CTAs
    // per SM), so a short context ran on 4 CTAs whatever its length; both graph plans
    // keep partitions at the minimum.
    let at_limit = pagoda_cuda_kernels::SplitPlan::choose(4096, BS, 2 * KV_HEADS, 2);
    assert_eq!(at_limit.num_splits, 1, "{at_limit:?}");
}

#[test]
fn paged_cuts_fixed_partitions_and_declares_invariance_unless_adaptive() {
    let mut b = backend(&PAGED);
    assert_eq!(
        b.batch_invariant(),
        Some(pagoda_cuda::attn::PAGED_FIXED_SPLITS)
    );
    // 600 keys: three partitions of 256 whatever the batch (one request or three).
    for lens in [&[600usize][..], &[600, 3, 40]] {
        let tables: Vec<Vec<u32>> = lens
            .iter()
            .map(|&l| (0..l.div_ceil(BS) as u32).collect())
            .collect();
        let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
        let batch = BatchDescriptor::new(BS, &vec![1; lens.len()], lens, &refs).unwrap();
        b.plan(&batch).unwrap();
        let p = b.planned_split().unwrap();
        assert_eq!((p.num_splits, p.partition_size), (3, 256), "{lens:?}");
    }
    let a = backend(&PAGED).with_adaptive_splits();
    assert_eq!(a.batch_invariant(), None);
    for k in [&NAIVE, &FLASH] {
        assert_eq!(backend(k).batch_invariant(), None, "{}", k.name);
    }
}

#[test]
fn misaligned_buffers_are_refused_before_a_vector_kernel_launches() {
    let p = pools();
    let batch = two_decodes();
    let n = batch.num_tokens() * HEADS * D;
    let qbuf = values(n + 1, 3);
    for (kernel, refused) in [(&PAGED, true), (&NAIVE, false)] {
        let mut b = backend(kernel);
        let mut out = vec![bf16::ZERO; n];
        b.plan(&batch).unwrap();
        // One bf16 past a 16-byte boundary.
        let r = b.run(io(&qbuf[1..], &p, &mut out));
        assert_eq!(r.is_err(), refused, "{}: {r:?}", kernel.name);
        if let Err(e) = r {
            assert!(e.to_string().contains("16-byte aligned"), "{e}");
        }
    }
}

#[test]
fn the_kernels_no_block_value_is_what_padding_becomes() {
    let mut out = Vec::new();
    pagoda_cuda::device::pack_block_table(two_decodes().block_table(), &mut out).unwrap();
    assert_eq!(
        out,
        [
            5,
            pagoda_cuda::device::NO_BLOCK,
            pagoda_cuda::device::NO_BLOCK,
            1,
            6,
            2
        ]
    );
}

/// Issue 27: a 600-key decode row (three fixed partitions) gives the same bits alone,
/// beside a longer row (more partitions in the step: its own extra ones are empty
/// and merge as exact zeros), beside a 3-key row (one partition) and in either order;
/// and it is still right against the f64 reference.
#[test]
fn a_long_decode_row_has_the_same_bits_in_any_batch() {
    const LONG_BLOCKS: usize = 400;
    let n = LONG_BLOCKS * BS * KV_HEADS * D;
    let p = Pools {
        k: values(n, 11),
        v: values(n, 12),
    };
    let a_table: Vec<u32> = (0..150).map(|i| (i * 7 % 150) as u32).collect();
    let b_table: Vec<u32> = (150..400).collect();
    let c_table: Vec<u32> = vec![399];
    let qa = values(HEADS * D, 13);
    let qb = values(HEADS * D, 14);
    let qc = values(HEADS * D, 15);
    let run = |lens: &[usize], tables: &[&[u32]], qs: &[&[bf16]]| -> Vec<bf16> {
        let batch = BatchDescriptor::new(BS, &vec![1; lens.len()], lens, tables).unwrap();
        let q: Vec<bf16> = qs.concat();
        let mut out = vec![bf16::ZERO; q.len()];
        let mut b = backend(&PAGED);
        b.plan(&batch).unwrap();
        b.run(io(&q, &p, &mut out)).unwrap();
        if lens == [600] {
            assert_close("600 keys alone", &out, &reference(&batch, &q, &p));
        }
        out
    };
    let row = HEADS * D;
    let alone = run(&[600], &[&a_table], &[&qa]);
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let with_long = run(&[1000, 600], &[&b_table, &a_table], &[&qb, &qa]);
    assert_eq!(
        bits(&with_long[row..]),
        bits(&alone),
        "beside a 1000-key row"
    );
    let first = run(&[600, 1000], &[&a_table, &b_table], &[&qa, &qb]);
    assert_eq!(
        bits(&first[..row]),
        bits(&alone),
        "first, beside a 1000-key row"
    );
    let with_short = run(&[3, 600], &[&c_table, &a_table], &[&qc, &qa]);
    assert_eq!(bits(&with_short[row..]), bits(&alone), "beside a 3-key row");
}

/// Issue 27: with paged rows (`VLLM_BATCH_INVARIANT=1`), `cuda-flash` computes a
/// prompt chunk's rows with `cuda-paged`'s arithmetic: two prefill chunks (5 new
/// tokens over 7 keys, 2 over 14, in permuted blocks) give, row for row, the bits
/// of the same query rows run as decode rows by `cuda-paged`, close to the f64
/// reference; it declares `cuda-paged`'s invariance, plain `cuda-flash` none.
#[test]
fn flash_with_paged_rows_gives_a_decode_rows_bits() {
    let p = pools();
    let prefill = BatchDescriptor::new(BS, &[5, 2], &[7, 14], &[&[3, 7], &[0, 4, 1, 6]]).unwrap();
    let q = values(prefill.num_tokens() * HEADS * D, 21);
    let mut flash = backend(&FLASH).with_paged_rows();
    assert_eq!(
        flash.batch_invariant(),
        Some(pagoda_cuda::attn::PAGED_FIXED_SPLITS)
    );
    assert_eq!(backend(&FLASH).batch_invariant(), None);
    let mut out = vec![bf16::ZERO; q.len()];
    flash.plan(&prefill).unwrap();
    flash.run(io(&q, &p, &mut out)).unwrap();
    assert_close("flash, paged rows", &out, &reference(&prefill, &q, &p));
    // The same rows as decode rows of cuda-paged: keys 3..=7 of the first request,
    // 13..=14 of the second.
    let rows = pagoda_cuda::attn::as_decode_rows(&prefill).unwrap();
    assert_eq!(rows.seq_lens(), &[3, 4, 5, 6, 7, 13, 14]);
    let mut paged = backend(&PAGED);
    let mut want = vec![bf16::ZERO; q.len()];
    paged.plan(&rows).unwrap();
    paged.run(io(&q, &p, &mut want)).unwrap();
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&want));
}
