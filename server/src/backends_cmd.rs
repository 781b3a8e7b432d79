//! `pagoda backends [--model PATH] [--device DEV] [--kv-cache-dtype DT]`: the devices
//! this binary can use, the registry (each backend's devices, query and KV cache
//! dtypes and rows), and for a model on a device each backend's verdict (with
//! reasons) and the selector's choice.

use anyhow::Context;
use clap::Args;
use pagoda_core::{device_unavailable, Device, KvCacheDtype, Role};
use pagoda_selector::{select, verdicts, BackendOverride};
use std::path::PathBuf;

/// Flags of `pagoda backends`.
#[derive(Args, Debug, Clone)]
pub struct BackendsArgs {
    /// Model whose attention shape to check (GGUF file or HF directory).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Device to check the backends for: `cpu`, `emu`, `cuda`, `cuda:N`. The
    /// queries' dtype is what `serve` would compute in there: f32 on the CPU, the
    /// device forward's dtype for `--dtype` on `emu` and CUDA (bf16 by default).
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// As `serve --dtype` (on `emu` and CUDA it sets the queries' dtype).
    #[arg(long, default_value = "auto", value_parser = crate::args::parse_dtype)]
    pub dtype: pagoda_models::WeightDtype,
    /// KV cache dtype to check the backends for, as `serve --kv-cache-dtype`:
    /// `auto` (the queries' dtype), `bfloat16`/`bf16`, `float16`/`fp16`, `float32`.
    #[arg(long, default_value = "auto", value_parser = parse_kv)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Override to try: `NAME` or `decode=NAME,prefill=NAME`.
    #[arg(long, env = "PAGODA_ATTENTION_BACKEND")]
    pub attention_backend: Option<String>,
}

fn parse_kv(s: &str) -> Result<KvCacheDtype, String> {
    s.parse().map_err(|e: pagoda_core::CoreError| e.to_string())
}

fn list<T: ToString>(x: &[T]) -> String {
    x.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

pub fn run(args: BackendsArgs) -> anyhow::Result<()> {
    println!("devices:");
    for d in [Device::Cpu, Device::Emu, Device::Cuda(0)] {
        let state = device_unavailable(d).unwrap_or_else(|| "available".into());
        println!("  {:<12} {state}", d.to_string());
    }
    let all = pagoda_core::registered_backends();
    println!();
    println!("registered attention backends ({}):", all.len());
    for r in &all {
        println!(
            "  {:<12} priority {:>4}  {}",
            r.name, r.priority, r.description
        );
    }
    // Which backend takes which KV cache dtype (and the rest of what it declares).
    println!();
    println!(
        "  {:<12} {:<10} {:<14} {:<14} rows",
        "backend", "devices", "q dtypes", "kv dtypes"
    );
    for r in &all {
        let c = (r.capabilities)();
        let rows = c.role().map_or("none".to_string(), |r| r.to_string());
        println!(
            "  {:<12} {:<10} {:<14} {:<14} {rows}",
            r.name,
            list(&c.devices),
            list(&c.q_dtypes),
            list(&c.kv_dtypes)
        );
    }
    let Some(path) = args.model else {
        println!("\n(pass --model PATH to see each backend's verdict for a model)");
        return Ok(());
    };
    let (cfg, name) = pagoda_models::inspect_model(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    // The engine's own plan (`pagoda_engine::startup::plan_attention`, what `serve` and
    // `generate` run): every layer's attention merged (Gemma 2: sliding and global),
    // f32 on the CPU, the device forward's compute dtype elsewhere, the cache dtype
    // resolved from it; so this command and the engine report the same dtypes.
    let attn_config = pagoda_engine::startup::plan_attention(
        &cfg,
        args.device,
        args.dtype,
        args.kv_cache_dtype,
        args.block_size,
    )
    .with_context(|| format!("planning attention for {name} on {}", args.device))?
    .merged;
    let features = cfg.arch.features();
    println!(
        "\nmodel {name}: architecture {}, {} q heads, {} kv heads, head dim {}, block size {}, device {}, q {}, kv cache {}",
        cfg.arch.architecture,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        args.block_size,
        args.device,
        attn_config.q_dtype,
        attn_config.kv_dtype
    );
    println!(
        "needs: {}",
        if features.is_empty() {
            "nothing beyond Llama".to_string()
        } else {
            features.join(", ")
        }
    );
    for v in verdicts(&attn_config) {
        for (role, reasons) in [
            (Role::Decode, &v.decode_reasons),
            (Role::Prefill, &v.prefill_reasons),
        ] {
            let verdict = if reasons.is_empty() {
                "ok".to_string()
            } else {
                reasons
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            println!("  {:<12} {:<8} {}", v.name, role.to_string(), verdict);
        }
    }
    let backend_override = BackendOverride::parse(args.attention_backend.as_deref().unwrap_or(""))?;
    match select(&attn_config, &backend_override) {
        Ok(sel) => println!("\nchoice: {sel}"),
        Err(e) => {
            println!("\nchoice: none: {e}");
            anyhow::bail!(e);
        }
    }
    Ok(())
}
