//! Criterion benches of the linear layers' GEMM on `cuda:0`: cuBLAS against the CUTLASS
//! kernel (`pagoda_cuda::DeviceGemm`), bf16 in and out, f32 accumulation.
//!
//! * shapes: Llama-3-8B's linear layers (n x k): qkv 6144x4096, o 4096x4096, gate_up
//!   28672x4096, down 4096x14336, lm_head 128256x4096;
//! * m (tokens) = 1, 32, 128, 8192 (`PAGODA_BENCH_QUICK=1`: 1 and 8192, what
//!   scripts/device-check.sh runs).
//!
//! After criterion a table gives each case's mean time, TFLOP/s and its share of the
//! cuBLAS bf16 8192³ rate, and for m <= 32 (weight-bound) the weight bytes read per
//! second against the device copy bandwidth (both measured in this process,
//! `pagoda_benches::cuda_ceilings`). Without the `cuda` feature, a driver or a device it
//! prints why and exits 0.

use pagoda_core::Device;
use pagoda_cuda as _; // registers the `cuda` device family

fn main() {
    match pagoda_core::device_unavailable(Device::Cuda(0)) {
        Some(why) => println!("cuda gemm benches skipped: {why}"),
        #[cfg(feature = "cuda")]
        None => gpu::main(),
        // Without the feature the device is never available ("not compiled with CUDA").
        #[cfg(not(feature = "cuda"))]
        None => unreachable!("cuda:0 is unavailable without the `cuda` feature"),
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use criterion::{BenchmarkId, Criterion, Throughput};
    use cudarc::driver::{CudaSlice, CudaStream, DevicePtr as _};
    use pagoda_benches::cuda_ceilings::ceilings;
    use pagoda_core::bf16;
    use pagoda_cuda::gemm::{DeviceGemm, Dtype, GemmImpl};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Llama-3-8B's linear layers: (name, n = out features, k = in features).
    const SHAPES: [(&str, usize, usize); 5] = [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
        ("lm_head", 128256, 4096),
    ];

    fn quick() -> bool {
        std::env::var("PAGODA_BENCH_QUICK").is_ok_and(|v| v != "0")
    }

    fn filled(stream: &Arc<CudaStream>, len: usize) -> CudaSlice<bf16> {
        pagoda_benches::cuda_ceilings::filled_bf16(stream, len).expect("device memory")
    }

    /// Per case: (seconds per call, FLOPs, weight bytes, m).
    type Results = BTreeMap<String, (f64, f64, f64, usize)>;

    pub fn main() {
        let gemms: Vec<DeviceGemm> = [GemmImpl::Cublas, GemmImpl::Cutlass]
            .into_iter()
            .filter_map(|imp| match DeviceGemm::new(0, imp) {
                Ok(g) => Some(g),
                Err(e) => {
                    println!("{imp:?} skipped: {e}");
                    None
                }
            })
            .collect();
        let Some(stream) = gemms.first().map(|g| g.stream().clone()) else {
            return;
        };
        let ceil = ceilings(&stream);
        println!(
            "ceilings: device copy {:.0} GB/s (read + write), cuBLAS bf16 GEMM {:.1} TFLOP/s",
            ceil.copy_bytes_per_s / 1e9,
            ceil.gemm_flops / 1e12
        );
        let ms: &[usize] = if quick() {
            &[1, 8192]
        } else {
            &[1, 32, 128, 8192]
        };
        let m_max = *ms.iter().max().expect("some m");
        let mut c = Criterion::default().configure_from_args();
        let mut results = Results::new();
        for (name, n, k) in SHAPES {
            // The largest m's buffers; smaller m use their first rows.
            let x = filled(&stream, m_max * k);
            let w = filled(&stream, n * k);
            let out = stream
                .alloc_zeros::<bf16>(m_max * n)
                .expect("device memory");
            let addr = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
            let (xa, wa, oa) = (addr(&x), addr(&w), addr(&out));
            for &m in ms {
                let flops = 2.0 * (m * n * k) as f64;
                let mut g = c.benchmark_group(format!("cuda-gemm/{name}"));
                g.sample_size(10)
                    .warm_up_time(Duration::from_millis(if quick() { 100 } else { 300 }))
                    .measurement_time(Duration::from_millis(if quick() { 400 } else { 1000 }))
                    .throughput(Throughput::Elements(flops as u64));
                for gemm in &gemms {
                    // SAFETY: x, w, out are live bf16 buffers of this device holding
                    // m_max·k >= m·k, n·k and m_max·n >= m·n elements; out overlaps neither.
                    let run = || unsafe {
                        gemm.gemm_raw(
                            (xa, wa, oa),
                            (m, n, k),
                            Dtype::Bf16,
                            Dtype::Bf16,
                            Dtype::Bf16,
                        )
                    };
                    if let Err(e) = run() {
                        println!("{name} m={m} {:?} skipped: {e}", gemm.implementation());
                        continue;
                    }
                    let (mut total, mut calls) = (0.0f64, 0u64);
                    let id =
                        BenchmarkId::new(format!("{:?}", gemm.implementation()), format!("m{m}"));
                    g.bench_function(id, |b| {
                        b.iter_custom(|iters| {
                            // Launches queue back to back; one synchronize per sample.
                            let t = Instant::now();
                            for _ in 0..iters {
                                run().expect("gemm");
                            }
                            stream.synchronize().expect("synchronize");
                            let e = t.elapsed();
                            total += e.as_secs_f64();
                            calls += iters;
                            e
                        })
                    });
                    if calls > 0 {
                        let key = format!("{name:<8} m={m:<5} {:?}", gemm.implementation());
                        results.insert(key, (total / calls as f64, flops, (n * k * 2) as f64, m));
                    }
                }
                g.finish();
            }
        }
        c.final_summary();
        println!(
            "\n{:<30} {:>10} {:>10} {:>8} {:>12} {:>8}",
            "case (bf16)", "us", "TFLOP/s", "% cuBLAS", "weight GB/s", "% copy"
        );
        for (key, (secs, flops, wbytes, m)) in &results {
            let rate = flops / secs;
            let bw = if *m <= 32 {
                let b = wbytes / secs;
                format!(
                    "{:>12.0} {:>7.0}%",
                    b / 1e9,
                    100.0 * b / ceil.copy_bytes_per_s
                )
            } else {
                String::new()
            };
            println!(
                "{key:<30} {:>10.1} {:>10.1} {:>7.0}% {bw}",
                secs * 1e6,
                rate / 1e12,
                100.0 * rate / ceil.gemm_flops
            );
        }
    }
}
