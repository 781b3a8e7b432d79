//! Quick interleaved A/B timing of matmul paths (rounds of every variant in turn,
//! median per variant), for tuning on a shared machine; criterion's
//! `benches/matmul.rs` gives the reported numbers.
//! `cargo run --release -p pagoda-benches --bin matmul_ab -- k n m [rounds]`;
//! without arguments it prints the machine's ceilings: one core's f32 FMA peak and
//! the parallel read bandwidth.

use half::bf16;
use pagoda_benches::unpacked::{matmul_t_bf16_with, matmul_t_with, to_bf16, Bf16Path, MatmulPath};
use pagoda_kernels::{matmul_packed, matmul_packed_bf16, PackedMatrix, PackedMatrixBf16};
use std::time::Instant;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    if a.is_empty() {
        fma_peak();
        return bandwidth();
    }
    let (k, n, m) = (a[0], a[1], a[2]);
    let rounds = a.get(3).copied().unwrap_or(41);
    let copies = (512usize << 20).div_ceil(n * k * 4).max(1);
    let ws: Vec<Vec<f32>> = (0..copies)
        .map(|c| {
            (0..n * k)
                .map(|i| ((i + c) % 17) as f32 * 0.01 - 0.08)
                .collect()
        })
        .collect();
    // PAGODA_ALIGN=1: start each copy on a 64-byte boundary.
    let align = std::env::var("PAGODA_ALIGN").is_ok();
    let ws: Vec<Vec<f32>> = ws
        .into_iter()
        .map(|w| {
            let mut v = vec![0.0f32; w.len() + 16];
            let off = if align {
                v.as_ptr().align_offset(64)
            } else {
                0
            };
            v[off..off + w.len()].copy_from_slice(&w);
            v
        })
        .collect();
    let offs: Vec<usize> = ws
        .iter()
        .map(|v| {
            if align {
                v.as_ptr().align_offset(64)
            } else {
                0
            }
        })
        .collect();
    let ws16: Vec<Vec<bf16>> = ws
        .iter()
        .zip(&offs)
        .map(|(w, &o)| to_bf16(&w[o..o + n * k]))
        .collect();
    let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut out = vec![0.0; m * n];
    let f32s = [
        MatmulPath::Gemm,
        MatmulPath::Gemv,
        MatmulPath::Avx512Gemv,
        MatmulPath::Avx512Gemm,
    ];
    let b16s = [Bf16Path::Avx512Gemv, Bf16Path::Avx512Gemm];
    let packed: Vec<PackedMatrix> = ws
        .iter()
        .zip(&offs)
        .map(|(w, &o)| PackedMatrix::pack(&w[o..o + n * k], n, k).unwrap())
        .collect();
    let packed16: Vec<PackedMatrixBf16> = ws
        .iter()
        .zip(&offs)
        .map(|(w, &o)| PackedMatrixBf16::pack(&w[o..o + n * k], n, k).unwrap())
        .collect();
    // The last two variants are the packed f32 and bf16 GEMMs.
    let nv = f32s.len() + b16s.len() + 2;
    let mut times = vec![Vec::new(); nv];
    let reps = (4_000_000 / (n * k)).clamp(1, 200);
    let mut ci = 0;
    for _ in 0..rounds {
        for v in 0..nv {
            let t = Instant::now();
            for _ in 0..reps {
                ci = (ci + 1) % copies;
                if v == nv - 1 {
                    matmul_packed_bf16(&x, &packed16[ci], &mut out, m).unwrap();
                } else if v == nv - 2 {
                    matmul_packed(&x, &packed[ci], &mut out, m).unwrap();
                } else if v < f32s.len() {
                    matmul_t_with(
                        f32s[v],
                        &x,
                        &ws[ci][offs[ci]..offs[ci] + n * k],
                        &mut out,
                        m,
                        k,
                        n,
                    )
                    .unwrap();
                } else {
                    matmul_t_bf16_with(b16s[v - f32s.len()], &x, &ws16[ci], &mut out, m, k, n)
                        .unwrap();
                }
            }
            times[v].push(t.elapsed().as_secs_f64() / reps as f64);
        }
    }
    for v in 0..nv {
        times[v].sort_by(|a, b| a.total_cmp(b));
        // The fastest round: on a shared machine the others mostly measure the
        // neighbours' memory traffic.
        let t = times[v][0];
        let name = if v == nv - 1 {
            "bf16-packed".to_string()
        } else if v == nv - 2 {
            "packed".to_string()
        } else if v < f32s.len() {
            format!("{:?}", f32s[v])
        } else {
            format!("bf16-{:?}", b16s[v - f32s.len()])
        };
        let bytes = (n * k * if v < f32s.len() || v == nv - 2 { 4 } else { 2 }) as f64;
        println!(
            "k={k} n={n} m={m} {name:18} {:9.1} us  {:6.1} GB/s  {:7.1} GFLOP/s",
            t * 1e6,
            bytes / t / 1e9,
            2.0 * (m * n * k) as f64 / t / 1e9
        );
    }
}

/// The core's f32 FMA peak: 12 independent chains of `vfmadd` on registers (no
/// memory), one thread, best of 3.
fn fma_peak() {
    #[cfg(target_arch = "x86_64")]
    if pagoda_kernels::Isa::detect().avx512() {
        let iters = 20_000_000usize;
        let mut best = 0.0f64;
        for _ in 0..3 {
            let t = Instant::now();
            // SAFETY: AVX-512 F detected.
            let r = unsafe { fma_chains(iters) };
            let gflops = (iters * 12 * 32) as f64 / t.elapsed().as_secs_f64() / 1e9;
            std::hint::black_box(r);
            best = best.max(gflops);
        }
        println!("f32 FMA peak, 1 thread: {best:.1} GFLOP/s");
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm512_set1_ps(1.0); 12];
    let (b, c) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(1e-7));
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = _mm512_fmadd_ps(*v, b, c);
        }
    }
    a.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
}

/// Read bandwidth: a parallel sum over 1 GiB, fastest of 15 rounds.
fn bandwidth() {
    use rayon::prelude::*;
    let buf: Vec<f32> = (0..(1usize << 28)).map(|i| (i % 7) as f32).collect();
    let mut best = f64::MAX;
    let mut total = 0.0;
    for _ in 0..15 {
        let t = Instant::now();
        total += buf.par_chunks(1 << 16).map(sum).sum::<f32>();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "threads {}: read bandwidth {:.1} GB/s (checksum {total})",
        rayon::current_num_threads(),
        (1u64 << 30) as f64 / best / 1e9
    );
}

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
