//! Matmul paths (the packed GEMMs the model runs, and the unpacked `matmul_t`
//! paths they replaced) for SmolLM2-135M's projection shapes at decode (`m` = 1..8) and
//! prefill (`m` = 32..512) sizes, plus the machine's read bandwidth (a parallel sum
//! over 1 GiB) as the ceiling of the memory-bound decode shapes.
//!
//! Weights are cold as in a real step (each layer's matrix is read once per step
//! from DRAM): every iteration uses the next of enough weight copies to overflow
//! the last-level cache. The machine is shared with other work, so the paths of one
//! shape and `m` run back to back and only their ratios are meaningful.
//! Throughput is weight bytes/s for `m <= 8` and FLOP/s (2·m·n·k) above.
//!
//! `cargo bench -p pagoda-benches --bench matmul -- 'qkv/'` runs one shape.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use pagoda_benches::unpacked::{matmul_t_bf16_with, matmul_t_with, to_bf16, Bf16Path, MatmulPath};
use pagoda_kernels::{matmul_packed, matmul_packed_bf16, PackedMatrix, PackedMatrixBf16};
use rayon::prelude::*;
use std::time::Duration;

/// Bytes of weight copies per shape: far above a 32 MiB L3 (whose replacement policy keeps part of a
/// smaller working set across rounds).
const COLD_BYTES: usize = 512 << 20;

/// The read ceiling: all threads summing disjoint parts of a 1 GiB buffer.
fn bandwidth(c: &mut Criterion) {
    let buf: Vec<f32> = (0..(1usize << 28)).map(|i| (i % 7) as f32).collect();
    let mut g = c.benchmark_group("bandwidth");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .throughput(Throughput::Bytes((buf.len() * 4) as u64));
    g.bench_function("sum_1GiB", |b| {
        b.iter(|| buf.par_chunks(1 << 16).map(sum).sum::<f32>())
    });
    g.finish();
}

#[derive(Clone, Copy, Debug)]
enum Variant {
    F32(MatmulPath),
    Bf16(Bf16Path),
    /// The packed GEMMs the model runs (`kernels::packed`, `kernels::packed_bf16`).
    Packed,
    PackedBf16,
}

fn bench(c: &mut Criterion) {
    // (name, k, n, largest m): fused QKV, o, fused gate/up, down, LM head (only the
    // logits rows, so at most a batch of them).
    let shapes = [
        ("qkv", 576, 960, 512),
        ("o", 576, 576, 512),
        ("gate_up", 576, 3072, 512),
        ("down", 1536, 576, 512),
        ("lm_head", 576, 49152, 32),
    ];
    let mut g = c.benchmark_group("matmul_t");
    g.warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(700))
        .sample_size(10);
    for (name, k, n, max_m) in shapes {
        let copies = COLD_BYTES.div_ceil(n * k * 4).max(1);
        let ws: Vec<Vec<f32>> = (0..copies)
            .map(|c| {
                (0..n * k)
                    .map(|i| ((i + c) % 17) as f32 * 0.01 - 0.08)
                    .collect()
            })
            .collect();
        let ws16: Vec<Vec<bf16>> = ws.iter().map(|w| to_bf16(w)).collect();
        let packed: Vec<PackedMatrix> = ws
            .iter()
            .map(|w| PackedMatrix::pack(w, n, k).unwrap())
            .collect();
        let packed16: Vec<PackedMatrixBf16> = ws
            .iter()
            .map(|w| PackedMatrixBf16::pack(w, n, k).unwrap())
            .collect();
        for m in [1usize, 4, 8, 32, 128, 512]
            .into_iter()
            .filter(|&m| m <= max_m)
        {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut out = vec![0.0; m * n];
            let variants: Vec<Variant> = if m <= 8 {
                vec![
                    Variant::F32(MatmulPath::Gemm),
                    Variant::F32(MatmulPath::Gemv),
                    Variant::F32(MatmulPath::Avx512Gemv),
                    Variant::F32(MatmulPath::Avx512Gemm),
                    Variant::Bf16(Bf16Path::Avx512Gemv),
                    Variant::Packed,
                    Variant::PackedBf16,
                ]
            } else {
                vec![
                    Variant::F32(MatmulPath::Gemm),
                    Variant::F32(MatmulPath::Avx512Gemm),
                    Variant::Bf16(Bf16Path::Avx512Gemm),
                    Variant::Packed,
                    Variant::PackedBf16,
                ]
            };
            for v in variants {
                let bytes = match v {
                    Variant::F32(_) | Variant::Packed => n * k * 4,
                    Variant::Bf16(_) | Variant::PackedBf16 => n * k * 2,
                };
                g.throughput(if m <= 8 {
                    Throughput::Bytes(bytes as u64)
                } else {
                    Throughput::Elements((2 * m * n * k) as u64)
                });
                let mut i = 0;
                let id = match v {
                    Variant::F32(p) => format!("{name}/{p:?}"),
                    Variant::Bf16(p) => format!("{name}/bf16-{p:?}"),
                    Variant::Packed => format!("{name}/Packed"),
                    Variant::PackedBf16 => format!("{name}/bf16-Packed"),
                };
                g.bench_with_input(BenchmarkId::new(id, m), &m, |b, &m| {
                    b.iter(|| {
                        i = (i + 1) % copies;
                        match v {
                            Variant::F32(p) => {
                                matmul_t_with(p, &x, &ws[i], &mut out, m, k, n).unwrap()
                            }
                            Variant::Bf16(p) => {
                                matmul_t_bf16_with(p, &x, &ws16[i], &mut out, m, k, n).unwrap()
                            }
                            Variant::Packed => matmul_packed(&x, &packed[i], &mut out, m).unwrap(),
                            Variant::PackedBf16 => {
                                matmul_packed_bf16(&x, &packed16[i], &mut out, m).unwrap()
                            }
                        }
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bandwidth, bench);
criterion_main!(benches);

/// A read-only pass at full vector width (8 independent AVX-512 sums), portable
/// lanes without AVX-512.
fn sum(c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if pagoda_kernels::Isa::detect().avx512() {
        // SAFETY: AVX-512 F detected.
        return unsafe { sum512(c) };
    }
    let mut acc = [0.0f32; 16];
    for v in c.chunks_exact(16) {
        for l in 0..16 {
            acc[l] += v[l];
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum512(c: &[f32]) -> f32 {
    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [_mm512_setzero_ps(); 8];
        let p = c.as_ptr();
        let mut i = 0;
        while i + 128 <= c.len() {
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm512_add_ps(*a, _mm512_loadu_ps(p.add(i + 16 * u)));
            }
            i += 128;
        }
        let mut s = 0.0;
        for a in acc {
            s += _mm512_reduce_add_ps(a);
        }
        s + c[i..].iter().sum::<f32>()
    }
}
