//! Times quantized matmuls at a Llama-3.2-1B shape, weights cold (the next of
//! enough copies to overflow the L3 each call): the kernel-only A/B of a layout or
//! kernel change. `cargo run --release -p pagoda-kernels --example quant_time`;
//! `M=16` sets the activation rows (1: decode), `ONLY=Q4_K` one case. Every kernel
//! this CPU runs is timed in turn, round after round (A B A B), on the same
//! quantized activations; prints µs per call, the weight bytes read per second and
//! the multiply-adds per second.

use pagoda_kernels::quant::{matmul_quant_acts, QuantActs};
use pagoda_kernels::{QuantFormat, QuantKernel, QuantMatrix};
use std::time::Instant;

fn blocks(fmt: QuantFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let (be, bb) = fmt.block_layout();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut d: Vec<u8> = (0..n * k / be * bb)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let sc = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match fmt {
        QuantFormat::Q6K => &[208],
        QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q4_1 => &[0, 2],
        _ => &[0],
    };
    for b in d.chunks_exact_mut(bb) {
        for &o in fields {
            b[o..o + 2].copy_from_slice(&sc);
        }
    }
    d
}

fn main() {
    // (name, format, n, k): the fused gate/up and the down projection of the 1B shape.
    let cases = [
        ("gate_up Q4_K", QuantFormat::Q4K, 16384, 2048),
        ("gate_up Q5_K", QuantFormat::Q5K, 16384, 2048),
        ("down Q6_K", QuantFormat::Q6K, 2048, 8192),
        ("gate_up Q4_0", QuantFormat::Q4_0, 16384, 2048),
        ("gate_up Q4_1", QuantFormat::Q4_1, 16384, 2048),
        ("gate_up Q8_0", QuantFormat::Q8_0, 16384, 2048),
    ];
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let only = std::env::var("ONLY").unwrap_or_default();
    for (name, fmt, n, k) in cases {
        if !name.contains(only.as_str()) {
            continue;
        }
        let copies: usize = std::env::var("COPIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4);
        let ws: Vec<QuantMatrix> = (0..copies)
            .map(|c| QuantMatrix::from_gguf(fmt, &blocks(fmt, n, k, c as u64 + 1), n, k).unwrap())
            .collect();
        let m: usize = std::env::var("M")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        let mut acts = QuantActs::default();
        acts.quantize(&x, m, k).unwrap();
        let kernels: Vec<QuantKernel> = QuantKernel::ALL
            .into_iter()
            .filter(|q| q.available() && *q != QuantKernel::Portable)
            .collect();
        let mut out = vec![0.0f32; m * n];
        let mut best = vec![f64::MAX; kernels.len()];
        let mut sums = vec![0.0f64; kernels.len()];
        // The best of many short rounds, kernels in turn: the machine is shared.
        for _ in 0..25 {
            for (ki, &kernel) in kernels.iter().enumerate() {
                let t = Instant::now();
                for r in 0..reps {
                    matmul_quant_acts(&acts, &ws[r % copies], &mut out, n, kernel).unwrap();
                }
                best[ki] = best[ki].min(t.elapsed().as_secs_f64() / reps as f64);
                sums[ki] = out.iter().map(|v| *v as f64).sum::<f64>();
            }
        }
        let bytes = ws[0].num_bytes() as f64;
        for (ki, kernel) in kernels.iter().enumerate() {
            let t = best[ki];
            println!(
                "{name:<14} m {m:>3} n {n:>5} k {k:>5} {:<24}: {:>8.1} µs/call, held {:>6.1} MiB, {:>5.1} GB/s, {:>6.1} GMAC/s (checksum {:.3})",
                kernel.name(),
                t * 1e6,
                bytes / (1 << 20) as f64,
                bytes / t / 1e9,
                (m * n * k) as f64 / t / 1e9,
                sums[ki]
            );
        }
    }
}
