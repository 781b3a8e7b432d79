//! GEMM vs GEMV for SmolLM2-135M's projection shapes at decode-sized `m` and a
//! small prefill. Weights are cold as in a real step (each layer's matrix is read
//! once per step from DRAM): every iteration uses the next of enough weight copies
//! to overflow the last-level cache. `matmul_t` picks its path from these numbers.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pagoda_kernels::{matmul_t_with, MatmulPath};
use std::time::Duration;

/// Bytes of weight copies per shape: above a 32 MiB L3.
const COLD_BYTES: usize = 96 << 20;

fn bench(c: &mut Criterion) {
    // (name, k, n): fused QKV, fused gate/up, down, LM head.
    let shapes = [
        ("qkv", 576, 960),
        ("gate_up", 576, 3072),
        ("down", 1536, 576),
        ("lm_head", 576, 49152),
    ];
    let mut g = c.benchmark_group("matmul_t");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(15);
    for (name, k, n) in shapes {
        let copies = COLD_BYTES.div_ceil(n * k * 4).max(1);
        let ws: Vec<Vec<f32>> = (0..copies)
            .map(|c| (0..n * k).map(|i| ((i + c) % 17) as f32 * 0.01).collect())
            .collect();
        for m in [1usize, 2, 4, 8, 32] {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut out = vec![0.0; m * n];
            for path in [MatmulPath::Gemm, MatmulPath::Gemv] {
                let mut i = 0;
                g.bench_with_input(
                    BenchmarkId::new(format!("{name}/{path:?}"), m),
                    &m,
                    |b, &m| {
                        b.iter(|| {
                            i = (i + 1) % copies;
                            matmul_t_with(path, &x, &ws[i], &mut out, m, k, n).unwrap()
                        })
                    },
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
