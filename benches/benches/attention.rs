//! Criterion comparison of every registered attention backend on the same shapes.
//!
//! * decode: batch 1/8/32/128 × context 512/2048/8192 (throughput = bytes of Q, K,
//!   V and O moved, [`Case::decode_bytes`]);
//! * prefill: 128/512/2048 new tokens, with no cached prefix and with 1024 cached
//!   tokens (throughput = attention FLOPs, [`Case::flops`], shown as elements/s);
//! * shapes: SmolLM2 (9/3 heads, dim 64) and Llama-8B-like (32/8 heads, dim 128),
//!   block size 16.
//!
//! Backends whose `reasons` are non-empty for a shape/role are skipped. `naive`
//! (single-threaded f64) only runs where its work is small (see [`naive_fits`]).
//! The K+V pool is capped at 2 GiB: bigger batches share physical blocks between
//! requests (see `pagoda_benches::attn`), which keeps the bytes moved and a
//! working set 60× the L3.
//!
//! Env: `PAGODA_BENCH_QUICK=1` runs a reduced set (batch 1/32, context 2048,
//! prefill 512/2048); `PAGODA_BENCH_BACKENDS=paged,flash` filters backends.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pagoda_backends as _;
use pagoda_benches::attn::{self, Case, ModelShape, LLAMA8B, SMOLLM2};
use pagoda_core::{registered_backends, BackendRegistration, Role};
use std::time::Duration;

fn quick() -> bool {
    std::env::var("PAGODA_BENCH_QUICK").is_ok_and(|v| v != "0")
}

fn backends() -> Vec<&'static BackendRegistration> {
    let filter = std::env::var("PAGODA_BENCH_BACKENDS").ok();
    registered_backends()
        .into_iter()
        .filter(|r| {
            filter
                .as_ref()
                .is_none_or(|f| f.split(',').any(|n| n == r.name))
        })
        .collect()
}

/// Whether the single-threaded f64 reference finishes a call in well under a second.
fn naive_fits(case: &Case) -> bool {
    case.flops() <= 300_000_000
}

fn bench_case(
    c: &mut Criterion,
    group: &str,
    id: &str,
    case: &mut Case,
    role: Role,
    tput: Throughput,
) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.throughput(tput);
    for reg in backends() {
        if !reg.reasons(&case.cfg, role).is_empty() || (reg.name == "naive" && !naive_fits(case)) {
            continue;
        }
        let Ok(mut be) = (reg.create)(&case.cfg) else {
            continue;
        };
        if be.plan(&case.batch).is_err() {
            continue;
        }
        g.bench_function(BenchmarkId::new(reg.name, id), |b| {
            b.iter(|| case.run(be.as_mut()).expect("run"))
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let (batches, contexts): (&[usize], &[usize]) = if quick() {
        (&[1, 32], &[2048])
    } else {
        (&[1, 8, 32, 128], &[512, 2048, 8192])
    };
    for shape in [SMOLLM2, LLAMA8B] {
        for &b in batches {
            for &ctx in contexts {
                let mut case = attn::build(
                    shape,
                    &attn::decode_rows(b, ctx),
                    attn::DEFAULT_MAX_KV_BYTES,
                )
                .expect("case");
                let tput = Throughput::Bytes(case.decode_bytes());
                bench_case(
                    c,
                    &format!("decode/{}", shape.name),
                    &format!("b{b}xctx{ctx}"),
                    &mut case,
                    Role::Decode,
                    tput,
                );
            }
        }
    }
}

fn prefill(c: &mut Criterion) {
    let tokens: &[usize] = if quick() {
        &[512, 2048]
    } else {
        &[128, 512, 2048]
    };
    let shapes: [ModelShape; 2] = [SMOLLM2, LLAMA8B];
    for shape in shapes {
        for &t in tokens {
            for prefix in [0, 1024] {
                let mut case = attn::build(
                    shape,
                    &attn::prefill_rows(t, prefix),
                    attn::DEFAULT_MAX_KV_BYTES,
                )
                .expect("case");
                let tput = Throughput::Elements(case.flops());
                let id = format!("{t}tok+{prefix}");
                bench_case(
                    c,
                    &format!("prefill/{}", shape.name),
                    &id,
                    &mut case,
                    Role::Prefill,
                    tput,
                );
            }
        }
    }
}

criterion_group!(benches, decode, prefill);
criterion_main!(benches);
