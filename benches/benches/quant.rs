//! The quantized matmul (`kernels::quant`) against the packed f32 and bf16 GEMMs
//! the model runs otherwise, for SmolLM2-135M's projection shapes at decode
//! (`m` = 1, 4) and prefill (`m` = 32, 256) sizes; for Q4_1 (the default model's
//! layers), Q8_0 (its LM head), Q4_K, Q5_K and Q6_K, with each quantized kernel this CPU
//! runs (AVX-512 VNNI, AVX2), the activation quantization included.
//!
//! Weights are cold as in a real step: every iteration uses the next of enough
//! copies to overflow the last-level cache. Throughput is weight bytes/s of the
//! f32 matrix (the same figure for every path, so higher is faster) for `m <= 4`
//! and multiply-adds·2/s above.
//!
//! `cargo bench -p pagoda-benches --bench quant -- 'lm_head/'` runs one shape.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pagoda_kernels::quant::{matmul_quant_acts, QuantActs};
use pagoda_kernels::{
    matmul_packed, matmul_packed_bf16, PackedMatrix, PackedMatrixBf16, QuantFormat, QuantKernel,
    QuantMatrix,
};
use std::time::Duration;

/// Bytes of f32 weight copies per shape: far above a 32 MiB L3.
const COLD_BYTES: usize = 384 << 20;

enum W {
    F32(PackedMatrix),
    Bf16(PackedMatrixBf16),
    Quant(QuantMatrix, QuantKernel),
}

/// GGUF blocks of `fmt` with plausible scales (f16 0.01) and varied integers.
fn gguf_blocks(fmt: QuantFormat, n: usize, k: usize, seed: usize) -> Vec<u8> {
    let (be, bb) = fmt.block_layout();
    let mut d: Vec<u8> = (0..n * k / be * bb)
        .map(|i| ((i * 131 + seed * 7) % 251) as u8)
        .collect();
    let s = half::f16::from_f32(0.01).to_le_bytes();
    for b in d.chunks_exact_mut(bb) {
        let o = if fmt == QuantFormat::Q6K { 208 } else { 0 };
        b[o..o + 2].copy_from_slice(&s);
    }
    d
}

fn bench(c: &mut Criterion) {
    let shapes = [
        ("qkv", 576, 960),
        ("gate_up", 576, 3072),
        ("down", 1536, 576),
        ("lm_head", 576, 49152),
    ];
    let mut g = c.benchmark_group("quant");
    g.warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800))
        .sample_size(10);
    let kernels: Vec<QuantKernel> = [QuantKernel::Avx512Vnni, QuantKernel::Avx2]
        .into_iter()
        .filter(|k| k.available())
        .collect();
    for (name, k, n) in shapes {
        let copies = COLD_BYTES.div_ceil(n * k * 4).max(1);
        let w0: Vec<f32> = (0..n * k).map(|i| (i % 17) as f32 * 0.01 - 0.08).collect();
        let mut paths: Vec<(String, Vec<W>)> = vec![
            (
                "f32".into(),
                (0..copies)
                    .map(|_| W::F32(PackedMatrix::pack(&w0, n, k).unwrap()))
                    .collect(),
            ),
            (
                "bf16".into(),
                (0..copies)
                    .map(|_| W::Bf16(PackedMatrixBf16::pack(&w0, n, k).unwrap()))
                    .collect(),
            ),
        ];
        for fmt in QuantFormat::ALL {
            if k % fmt.block_layout().0 != 0 || fmt == QuantFormat::Q4_0 {
                continue;
            }
            for &kernel in &kernels {
                let ws = (0..copies)
                    .map(|c| {
                        W::Quant(
                            QuantMatrix::from_gguf(fmt, &gguf_blocks(fmt, n, k, c), n, k).unwrap(),
                            kernel,
                        )
                    })
                    .collect();
                paths.push((
                    format!(
                        "{}-{}",
                        fmt.name(),
                        if kernel == QuantKernel::Avx2 {
                            "avx2"
                        } else {
                            "vnni"
                        }
                    ),
                    ws,
                ));
            }
        }
        // m = 5: one verify row of 4 drafts; m = 8: a decode batch of 8.
        for m in [1usize, 4, 5, 8, 32, 256] {
            if name == "lm_head" && m > 32 {
                continue;
            }
            let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01 - 0.05).collect();
            let mut out = vec![0.0; m * n];
            let mut acts = QuantActs::default();
            g.throughput(if m <= 8 {
                Throughput::Bytes((n * k * 4) as u64)
            } else {
                Throughput::Elements((2 * m * n * k) as u64)
            });
            for (label, ws) in &paths {
                let mut i = 0;
                g.bench_function(format!("{name}/m{m}/{label}"), |b| {
                    b.iter(|| {
                        i = (i + 1) % ws.len();
                        match &ws[i] {
                            W::F32(w) => matmul_packed(&x, w, &mut out, m).unwrap(),
                            W::Bf16(w) => matmul_packed_bf16(&x, w, &mut out, m).unwrap(),
                            W::Quant(w, kernel) => {
                                acts.quantize(&x, m, k).unwrap();
                                matmul_quant_acts(&acts, w, &mut out, n, *kernel).unwrap()
                            }
                        }
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
