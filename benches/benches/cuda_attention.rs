//! Criterion benches of the CUDA attention backends on `cuda:0`, against ceilings
//! measured in the same process.
//!
//! * ceilings: device-to-device copy bandwidth (1 GiB, read + write bytes) and the
//!   cuBLAS bf16 GEMM rate (8192³, f32 accumulation);
//! * decode (every registered CUDA backend that serves decode rows: `cuda-paged`,
//!   `cuda-naive`, and any backend crate's own): batch 1/32/64/128 ×
//!   context 512/2048/4096/8192, bf16 q and KV (throughput = bytes of Q, K, V and O
//!   moved);
//! * prefill (every one that serves prompt chunks: `cuda-flash`, `cuda-naive`):
//!   512/2048/8192 causal tokens, no cached prefix (throughput = attention FLOPs);
//!
//! `PAGODA_BENCH_BACKENDS=a,b` runs only the backends named.
//! * shapes: SmolLM2 (9/3 heads, dim 64) and Llama-8B-like (32/8 heads, dim 128),
//!   block size 16, the K+V pool capped at 2 GiB as in the CPU benches.
//!
//! After criterion, a table gives each case's mean time, GB/s or TFLOP/s and the
//! share of the ceiling (issue 12's targets: paged b64 × ctx 4096 >= 80 % of the copy
//! bandwidth; flash 8192 tokens Llama-8B >= 45 % of the cuBLAS rate).
//!
//! Without the `cuda` feature (`cargo bench -p pagoda-benches --features cuda --bench
//! cuda_attention`), a driver or a device it prints why and exits: no GPU is
//! needed to build or run it. `PAGODA_BENCH_QUICK=1` runs the two target cases and a
//! few others (what scripts/device-check.sh runs).

use pagoda_backends as _;
use pagoda_core::Device;

fn main() {
    match pagoda_core::device_unavailable(Device::Cuda(0)) {
        Some(why) => println!("cuda attention benches skipped: {why}"),
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
    use cudarc::driver::CudaStream;
    use pagoda_benches::attn::{self, Case, ModelShape, LLAMA8B, SMOLLM2};
    use pagoda_benches::cuda_ceilings::ceilings;
    use pagoda_core::{
        bf16, open_device, registered_backends, AttentionBackend, AttentionConfig, DType, Device,
        DeviceKind, DeviceRuntime, HostSlice, LayerIo, Shape, Storage,
    };
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// The registered backends for `cuda` devices serving decode rows (`decode`) or
    /// prompt chunks, in priority order; only those of `PAGODA_BENCH_BACKENDS` if set;
    /// in a quick run only those serving one role.
    fn cuda_backends(decode: bool) -> Vec<&'static str> {
        let only = std::env::var("PAGODA_BENCH_BACKENDS").ok();
        registered_backends()
            .into_iter()
            .filter(|r| {
                let c = (r.capabilities)();
                let serves = if decode { c.decode } else { c.prefill };
                // Quick runs skip the both-roles reference (`cuda-naive`): the device
                // check's time goes to the kernels specialised for the role.
                c.devices.contains(&DeviceKind::Cuda)
                    && serves
                    && !(quick() && c.decode && c.prefill)
            })
            .filter(|r| {
                only.as_ref()
                    .is_none_or(|o| o.split(',').any(|n| n == r.name))
            })
            .map(|r| r.name)
            .collect()
    }

    fn quick() -> bool {
        std::env::var("PAGODA_BENCH_QUICK").is_ok_and(|v| v != "0")
    }

    /// A case's buffers on the device, as bf16.
    struct DeviceCase {
        case: Case,
        q: Storage,
        k: Storage,
        v: Storage,
        out: Storage,
        backend: Box<dyn AttentionBackend>,
    }

    fn upload(rt: &dyn DeviceRuntime, host: &[f32]) -> Storage {
        let data: Vec<bf16> = host.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut s = rt
            .alloc_zeroed(DType::BF16, Shape::flat(data.len()))
            .expect("device memory");
        rt.upload(s.view_mut(), HostSlice::BF16(&data))
            .expect("upload");
        s
    }

    fn device_case(
        rt: &dyn DeviceRuntime,
        shape: ModelShape,
        rows: &[(usize, usize)],
        backend: &str,
    ) -> Option<DeviceCase> {
        let mut case = attn::build(shape, rows, attn::DEFAULT_MAX_KV_BYTES).expect("case");
        case.cfg = AttentionConfig {
            device: Device::Cuda(0),
            q_dtype: DType::BF16,
            kv_dtype: DType::BF16,
            ..case.cfg.clone()
        };
        let reg = registered_backends()
            .into_iter()
            .find(|r| r.name == backend)?;
        let mut be = match (reg.create)(&case.cfg) {
            Ok(b) => b,
            Err(e) => {
                println!("{backend} skipped for {}: {e}", shape.name);
                return None;
            }
        };
        be.plan(&case.batch).expect("plan");
        let (q, k, v) = (
            upload(rt, &case.q),
            upload(rt, case.k_cache.host::<f32>().expect("an f32 pool")),
            upload(rt, case.v_cache.host::<f32>().expect("an f32 pool")),
        );
        let out = rt
            .alloc_zeroed(DType::BF16, Shape::flat(case.out.len()))
            .expect("device memory");
        Some(DeviceCase {
            case,
            q,
            k,
            v,
            out,
            backend: be,
        })
    }

    impl DeviceCase {
        fn run(&mut self) {
            let io = LayerIo {
                q: self.q.view(),
                k_cache: self.k.view(),
                v_cache: self.v.view(),
                out: self.out.view_mut(),
                lse: None,
            };
            self.backend.run(io).expect("run");
        }
    }

    /// What the table reports per case: (seconds per call, work per call, is_bytes).
    type Results = Arc<Mutex<BTreeMap<String, (f64, f64, bool)>>>;

    fn bench(
        c: &mut Criterion,
        stream: &Arc<CudaStream>,
        results: &Results,
        group: &str,
        id: String,
        dc: &mut DeviceCase,
        work: (f64, bool),
    ) {
        let mut g = c.benchmark_group(group);
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(800));
        g.throughput(if work.1 {
            Throughput::Bytes(work.0 as u64)
        } else {
            Throughput::Elements(work.0 as u64)
        });
        let (mut total, mut calls) = (0.0f64, 0u64);
        g.bench_function(BenchmarkId::new(dc.backend.name().to_string(), &id), |b| {
            b.iter_custom(|iters| {
                // Launches queue back to back; one synchronize per sample.
                let t = Instant::now();
                for _ in 0..iters {
                    dc.run();
                }
                stream.synchronize().expect("synchronize");
                let e = t.elapsed();
                total += e.as_secs_f64();
                calls += iters;
                e
            })
        });
        g.finish();
        if calls > 0 {
            let key = format!("{group}/{}/{id}", dc.backend.name());
            results
                .lock()
                .unwrap()
                .insert(key, (total / calls as f64, work.0, work.1));
        }
    }

    pub fn main() {
        let rt = open_device(Device::Cuda(0)).expect("the cuda:0 runtime");
        // The backends launch on the engine's stream (non-blocking, not the legacy
        // default stream): synchronising any other one would time the launches only.
        let stream = pagoda_cuda::engine_stream(0).expect("the engine stream of cuda:0");
        let ceil = ceilings(&stream);
        let (copy_bw, gemm_rate) = (ceil.copy_bytes_per_s, ceil.gemm_flops);
        println!(
            "ceilings: device copy {:.0} GB/s (read + write), cuBLAS bf16 GEMM {:.1} TFLOP/s",
            copy_bw / 1e9,
            gemm_rate / 1e12
        );
        let mut c = Criterion::default().configure_from_args();
        let results: Results = Arc::default();
        let (batches, contexts): (&[usize], &[usize]) = if quick() {
            (&[1, 64], &[4096])
        } else {
            (&[1, 32, 64, 128], &[512, 2048, 4096, 8192])
        };
        for (shape, backend) in [SMOLLM2, LLAMA8B]
            .into_iter()
            .flat_map(|s| cuda_backends(true).into_iter().map(move |b| (s, b)))
        {
            for &b in batches {
                for &ctx in contexts {
                    let rows = attn::decode_rows(b, ctx);
                    let Some(mut dc) = device_case(&*rt, shape, &rows, backend) else {
                        continue;
                    };
                    // At the case's element sizes (bf16 q, o and KV).
                    let bytes = dc.case.decode_bytes() as f64;
                    let group = format!("cuda-decode/{}", shape.name);
                    bench(
                        &mut c,
                        &stream,
                        &results,
                        &group,
                        format!("b{b}xctx{ctx}"),
                        &mut dc,
                        (bytes, true),
                    );
                }
            }
        }
        for (shape, backend) in [SMOLLM2, LLAMA8B]
            .into_iter()
            .flat_map(|s| cuda_backends(false).into_iter().map(move |b| (s, b)))
        {
            let tokens: &[usize] = if quick() { &[8192] } else { &[512, 2048, 8192] };
            for &t in tokens {
                let rows = attn::prefill_rows(t, 0);
                let Some(mut dc) = device_case(&*rt, shape, &rows, backend) else {
                    continue;
                };
                let flops = dc.case.flops() as f64;
                let group = format!("cuda-prefill/{}", shape.name);
                bench(
                    &mut c,
                    &stream,
                    &results,
                    &group,
                    format!("{t}tok"),
                    &mut dc,
                    (flops, false),
                );
            }
        }
        c.final_summary();
        println!(
            "\n{:<52} {:>10} {:>12} {:>8}",
            "case", "us", "rate", "ceiling"
        );
        for (key, (secs, work, is_bytes)) in results.lock().unwrap().iter() {
            let rate = work / secs;
            let (shown, share) = if *is_bytes {
                (format!("{:.0} GB/s", rate / 1e9), rate / copy_bw)
            } else {
                (format!("{:.1} TF/s", rate / 1e12), rate / gemm_rate)
            };
            println!(
                "{key:<52} {:>10.1} {shown:>12} {:>7.0}%",
                secs * 1e6,
                share * 100.0
            );
        }
    }
}
