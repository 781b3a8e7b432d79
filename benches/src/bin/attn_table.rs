//! Prints the BENCHMARKS.md "Attention backends" table: every registered backend
//! that can serve the role, on the headline shapes, next to this machine's
//! ceilings. One plan, then timed `run` calls (best of up to 20 or ~2 s; a single
//! timed call for backends slower than that, e.g. naive on prefill).
//!
//! Decode and mixed cases also time the automatic selection (`auto`, what the
//! engine builds: decode rows on the best decode backend, prefill rows on the best
//! prefill backend, composed by the selector's `HybridBackend`).
//!
//! `--kv-dtype bf16|f16|fp8` puts every case's KV cache in that dtype (the
//! `--kv-cache-dtype` A/B; default f32); decode throughput counts its bytes.
//!
//! `cargo run --release -p pagoda-benches --bin attn_table [-- --skip-naive] [--kv-dtype bf16]`

use pagoda_backends as _;
use pagoda_benches::attn::{self, Case, ModelShape, LLAMA8B, SMOLLM2};
use pagoda_core::{registered_backends, AttentionBackend, DType, KvCacheDtype, Role};
use pagoda_selector::BackendOverride;
use std::time::Instant;

/// Best seconds per `run`, or None if the backend cannot serve the case.
fn time_backend(
    reg: &pagoda_core::BackendRegistration,
    case: &mut Case,
    role: Role,
) -> Option<f64> {
    if !reg.reasons(&case.cfg, role).is_empty() {
        return None;
    }
    time_run((reg.create)(&case.cfg).ok()?, case)
}

/// The automatic selection for the case's config (what the engine runs) and its
/// best seconds per `run`.
fn time_auto(case: &mut Case) -> Option<(String, f64)> {
    let sel = pagoda_selector::select(&case.cfg, &BackendOverride::default()).ok()?;
    let be = sel.build(&case.cfg).ok()?;
    Some((format!("auto ({})", sel.name()), time_run(be, case)?))
}

/// Plans once, then the best seconds per `run`.
fn time_run(mut be: Box<dyn AttentionBackend>, case: &mut Case) -> Option<f64> {
    be.plan(&case.batch).ok()?;
    let mut best = f64::MAX;
    let start = Instant::now();
    for i in 0..21 {
        let t = Instant::now();
        case.run(be.as_mut()).ok()?;
        let dt = t.elapsed().as_secs_f64();
        // The first call warms caches and pages; keep it only if it is all we get.
        if i > 0 || dt > 2.0 {
            best = best.min(dt);
        }
        if start.elapsed().as_secs_f64() > 2.0 && best < f64::MAX {
            break;
        }
    }
    Some(best)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let skip_naive = args.iter().any(|a| a == "--skip-naive");
    // `--only NAME` times one backend; `--no-ceilings` skips the ceilings (quick runs).
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let kv: DType = match args.iter().position(|a| a == "--kv-dtype") {
        Some(i) => args
            .get(i + 1)
            .ok_or("--kv-dtype needs a value")?
            .parse::<KvCacheDtype>()?
            .resolve(DType::F32),
        None => DType::F32,
    };
    let c = if args.iter().any(|a| a == "--no-ceilings") {
        pagoda_benches::ceilings::Ceilings {
            read_gbps: f64::NAN,
            copy_gbps: f64::NAN,
            gemm_gflops: f64::NAN,
        }
    } else {
        pagoda_benches::ceilings::measure()
    };
    println!(
        "threads {}, KV cache {kv}, read {:.1} GB/s, copy {:.1} GB/s, f32 GEMM {:.1} GFLOP/s",
        rayon::current_num_threads(),
        c.read_gbps,
        c.copy_gbps,
        c.gemm_gflops
    );
    println!();
    println!("| case | backend | time/layer | throughput | % of ceiling |");
    println!("|---|---|---|---|---|");
    let decode: [(ModelShape, usize, usize); 2] = [(LLAMA8B, 32, 2048), (SMOLLM2, 32, 2048)];
    for (shape, batch, ctx) in decode {
        let mut case = attn::build_with_kv(
            shape,
            &attn::decode_rows(batch, ctx),
            attn::DEFAULT_MAX_KV_BYTES,
            kv,
        )?;
        for reg in registered_backends() {
            if (skip_naive && reg.name == "naive") || only.as_ref().is_some_and(|o| o != reg.name) {
                continue;
            }
            if let Some(t) = time_backend(reg, &mut case, Role::Decode) {
                let gbps = case.decode_bytes() as f64 / t / 1e9;
                println!(
                    "| decode {} b{batch} x ctx{ctx} | {} | {:.3} ms | {gbps:.1} GB/s | {:.0}% of read BW |",
                    shape.name, reg.name, t * 1e3, 100.0 * gbps / c.read_gbps
                );
            }
        }
        if only.is_none() {
            if let Some((name, t)) = time_auto(&mut case) {
                let gbps = case.decode_bytes() as f64 / t / 1e9;
                println!(
                    "| decode {} b{batch} x ctx{ctx} | {name} | {:.3} ms | {gbps:.1} GB/s | {:.0}% of read BW |",
                    shape.name, t * 1e3, 100.0 * gbps / c.read_gbps
                );
            }
        }
    }
    // Mixed: 32 decode rows (ctx 2048) and one 512-token prefill after 1024 cached,
    // in one batch (decode rows first), on every backend that serves both kinds.
    let mut rows = attn::decode_rows(32, 2048);
    rows.extend(attn::prefill_rows(512, 1024));
    let mut case = attn::build_with_kv(LLAMA8B, &rows, attn::DEFAULT_MAX_KV_BYTES, kv)?;
    let mixed = format!(
        "mixed {} b32 x ctx2048 + prefill 512 tok + prefix 1024",
        LLAMA8B.name
    );
    for reg in registered_backends() {
        if (skip_naive && reg.name == "naive") || only.as_ref().is_some_and(|o| o != reg.name) {
            continue;
        }
        if let Some(t) = time_backend(reg, &mut case, Role::Both) {
            println!("| {mixed} | {} | {:.2} ms | | |", reg.name, t * 1e3);
        }
    }
    if only.is_none() {
        if let Some((name, t)) = time_auto(&mut case) {
            println!("| {mixed} | {name} | {:.2} ms | | |", t * 1e3);
        }
    }
    let prefill: [(ModelShape, usize, usize); 4] = [
        (LLAMA8B, 2048, 0),
        (LLAMA8B, 2048, 1024),
        (SMOLLM2, 2048, 0),
        (SMOLLM2, 2048, 1024),
    ];
    for (shape, tokens, prefix) in prefill {
        let mut case = attn::build_with_kv(
            shape,
            &attn::prefill_rows(tokens, prefix),
            attn::DEFAULT_MAX_KV_BYTES,
            kv,
        )?;
        for reg in registered_backends() {
            if (skip_naive && reg.name == "naive") || only.as_ref().is_some_and(|o| o != reg.name) {
                continue;
            }
            if let Some(t) = time_backend(reg, &mut case, Role::Prefill) {
                let gf = case.flops() as f64 / t / 1e9;
                println!(
                    "| prefill {} {tokens} tok + prefix {prefix} | {} | {:.2} ms | {gf:.1} GFLOP/s | {:.0}% of GEMM |",
                    shape.name, reg.name, t * 1e3, 100.0 * gf / c.gemm_gflops
                );
            }
        }
    }
    Ok(())
}
