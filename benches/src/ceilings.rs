//! Roofline ceilings of this machine: multi-threaded read and copy bandwidth over
//! buffers far larger than the last-level cache, and the f32 GEMM rate of the
//! `gemm` crate on all threads. Each figure is the best of a few repetitions.

use rayon::prelude::*;
use std::time::Instant;

/// Bytes per parallel chunk: large enough to amortise the task, small enough to balance.
const CHUNK: usize = 1 << 20;

/// The sum of `x` (16 independent lanes, so the loop vectorises).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for c in x.chunks_exact(16) {
        for i in 0..16 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + x.chunks_exact(16).remainder().iter().sum::<f32>()
}

/// Read bandwidth in GB/s (10^9 B/s): parallel sum over a `bytes`-sized buffer.
pub fn read_gbps(bytes: usize, reps: usize) -> f64 {
    let mut buf = vec![0f32; bytes / 4];
    buf.par_chunks_mut(CHUNK / 4)
        .enumerate()
        .for_each(|(i, c)| c.fill(i as f32 * 1e-9));
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        let s: f32 = buf.par_chunks(CHUNK / 4).map(sum).sum();
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (buf.len() * 4) as f64 / best / 1e9
}

/// Copy bandwidth in GB/s, counting bytes read plus bytes written.
pub fn copy_gbps(bytes: usize, reps: usize) -> f64 {
    let n = bytes / 8;
    let src: Vec<f32> = (0..n).into_par_iter().map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        dst.par_chunks_mut(CHUNK / 4)
            .zip(src.par_chunks(CHUNK / 4))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (2 * n * 4) as f64 / best / 1e9
}

/// f32 GEMM GFLOP/s of an `n`×`n`×`n` product with the `gemm` crate on all threads.
pub fn gemm_gflops(n: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i % 97) as f32 - 48.0) / 97.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i % 89) as f32 - 44.0) / 89.0)
        .collect();
    let mut c = vec![0f32; n * n];
    let threads = rayon::current_num_threads();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        // SAFETY: all three buffers are n*n, row-major.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(threads),
            );
        }
        std::hint::black_box(&c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// The three ceilings.
#[derive(Debug, Clone, Copy)]
pub struct Ceilings {
    pub read_gbps: f64,
    pub copy_gbps: f64,
    pub gemm_gflops: f64,
}

/// Measures all ceilings: 1 GiB read, 1 GiB copy (512 MiB each side), 2048³ GEMM.
pub fn measure() -> Ceilings {
    Ceilings {
        read_gbps: read_gbps(1 << 30, 5),
        copy_gbps: copy_gbps(1 << 30, 5),
        gemm_gflops: gemm_gflops(2048, 3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_matches_sequential() {
        let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        assert_eq!(sum(&x), 499_500.0);
    }

    #[test]
    fn small_ceilings_are_positive() {
        assert!(read_gbps(1 << 22, 1) > 0.0);
        assert!(copy_gbps(1 << 22, 1) > 0.0);
        assert!(gemm_gflops(64, 1) > 0.0);
    }
}
