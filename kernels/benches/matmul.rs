//! GEMM vs GEMV for SmolLM2-135M's projection shapes at decode (m = 1..4) and
//! prefill sizes; `matmul_t` picks GEMV for m <= GEMV_MAX_M from these numbers.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pagoda_kernels::{matmul_t_with, MatmulPath};
use std::time::Duration;

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
        .sample_size(20);
    for (name, k, n) in shapes {
        let w: Vec<f32> = (0..n * k).map(|i| (i % 17) as f32 * 0.01).collect();
        for m in [1usize, 4, 16] {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut out = vec![0.0; m * n];
            for path in [MatmulPath::Gemm, MatmulPath::Gemv] {
                if m > 4 && path == MatmulPath::Gemv {
                    continue;
                }
                g.bench_with_input(
                    BenchmarkId::new(format!("{name}/{path:?}"), m),
                    &m,
                    |b, &m| b.iter(|| matmul_t_with(path, &x, &w, &mut out, m, k, n).unwrap()),
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
