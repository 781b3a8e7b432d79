//! Times the quantized GEMM (`matmul_quant_acts`) at prefill and many-stream decode
//! heights on one weight matrix in a GGUF format, with the CPU's best x86 kernel
//! (or `--kernel avx2|vnni|portable`): the multi-row pass kernels (`quant::rows`)
//! that a 1B-8B model's prompt steps spend their time in. Prints the best of
//! several calls per height in ms and GMAC/s. For A/B of two trees: build each and
//! run them in turn.
//!
//! `cargo run --release -p pagoda-benches --bin quant_passes -- FORMAT K N [--kernel K]`
//! (FORMAT: q4_0, q4_1, q8_0, q4_k, q5_k, q6_k; e.g. `q4_k 2048 16384`, the 1B
//! shape's gate_up; `q6_k 8192 2048`, its down).

use pagoda_kernels::quant::{matmul_quant_acts, QuantActs};
use pagoda_kernels::{QuantFormat, QuantKernel, QuantMatrix};
use std::time::Instant;

/// GGUF blocks of `fmt` with f16 scales of 0.01 and varied integers (as
/// `benches/quant.rs`).
fn gguf_blocks(fmt: QuantFormat, n: usize, k: usize) -> Vec<u8> {
    let (be, bb) = fmt.block_layout();
    let mut d: Vec<u8> = (0..n * k / be * bb)
        .map(|i| ((i * 131 + 7) % 251) as u8)
        .collect();
    let s = half::f16::from_f32(0.01).to_le_bytes();
    for b in d.chunks_exact_mut(bb) {
        let o = if fmt == QuantFormat::Q6K { 208 } else { 0 };
        b[o..o + 2].copy_from_slice(&s);
    }
    d
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: quant_passes FORMAT K N [--kernel avx2|vnni|portable]";
    let fmt = args
        .first()
        .and_then(|f| {
            QuantFormat::ALL
                .into_iter()
                .find(|q| q.name().eq_ignore_ascii_case(f))
        })
        .expect(usage);
    let k: usize = args.get(1).and_then(|s| s.parse().ok()).expect(usage);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).expect(usage);
    let kernel = match args.iter().position(|a| a == "--kernel") {
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("avx2") => QuantKernel::Avx2,
            Some("vnni") => QuantKernel::Avx512Vnni,
            Some("portable") => QuantKernel::Portable,
            _ => panic!("{usage}"),
        },
        None => [QuantKernel::Avx512Vnni, QuantKernel::Avx2]
            .into_iter()
            .find(|q| q.available())
            .unwrap_or(QuantKernel::Portable),
    };
    assert!(kernel.available(), "{kernel:?} does not run on this CPU");
    let w = QuantMatrix::from_gguf(fmt, &gguf_blocks(fmt, n, k), n, k).expect("shape");
    println!(
        "{} k={k} n={n} kernel={kernel:?} threads={}",
        fmt.name(),
        rayon::current_num_threads()
    );
    for m in [16usize, 64, 256, 1024] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01 - 0.05).collect();
        let mut out = vec![0.0; m * n];
        let mut acts = QuantActs::default();
        acts.quantize(&x, m, k).expect("k a multiple of 32");
        let mut best = f64::MAX;
        for _ in 0..(4096 / m).max(4) {
            let t = Instant::now();
            matmul_quant_acts(&acts, &w, &mut out, n, kernel).expect("shapes agree");
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "m={m:5}: {:8.2} ms {:7.1} GMAC/s",
            best * 1e3,
            (m * n * k) as f64 / best / 1e9
        );
    }
}
