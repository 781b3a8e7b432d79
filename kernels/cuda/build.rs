//! Build script of pagoda-cuda-kernels.
//!
//! Always: compiles every `cu/*.cu` for the host with g++ through the SIMT emulator
//! (`emu/simt.h`) into a static library of `extern "C"` launchers, so plain `cargo test`
//! runs the kernels with no CUDA anything. `flash.cu` is compiled a second time with a
//! planted fragment-layout bug (`PAGODA_PLANT_FRAGMENT_BUG`, symbols `*_planted`) for the
//! test that proves the emulator catches such bugs.
//!
//! With the `cuda` feature: compiles each `.cu` to one fatbin (SASS sm_80 + sm_90, PTX
//! compute_80) with nvcc from `NVCC`, the venv of `scripts/cuda-venv.sh`, or `PATH`, and
//! fails the build when ptxas reports a register spill. The fatbins and the ptxas report
//! land in `OUT_DIR` for `include_bytes!`/`include_str!`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Kernel files, one per kernel family (and the mma probe).
const KERNELS: [&str; 6] = ["write_kv", "naive", "paged", "flash", "mma_probe", "model"];

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=cu");
    println!("cargo:rerun-if-changed=emu");
    for k in KERNELS {
        println!("cargo:rerun-if-changed=cu/{k}.cu");
    }
    build_emu(&manifest, &out);
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_fatbins(&manifest, &out);
    }
}

/// A cc build of `.cu` files as C++20 for the host (g++ 12 is what CI has).
fn host_build(manifest: &Path) -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .debug(false)
        .opt_level(2)
        .flag("-x")
        .flag("c++")
        .flag("-std=c++20")
        .flag("-pthread")
        .flag("-Wno-unknown-pragmas")
        .include(manifest.join("cu"))
        .warnings(true);
    b
}

fn build_emu(manifest: &Path, out: &Path) {
    let mut b = host_build(manifest);
    for k in KERNELS {
        b.file(manifest.join("cu").join(format!("{k}.cu")));
    }
    // The emulator's own self-test kernels (host only).
    b.file(manifest.join("emu").join("selftest.cu"));
    b.compile("pagoda_cuda_emu");

    let planted_dir = out.join("planted");
    std::fs::create_dir_all(&planted_dir).expect("create OUT_DIR/planted");
    let mut p = host_build(manifest);
    p.define("PAGODA_PLANT_FRAGMENT_BUG", None)
        .out_dir(&planted_dir)
        .file(manifest.join("cu").join("flash.cu"));
    p.compile("pagoda_cuda_emu_planted");
    // compile() points the linker at planted_dir only for that lib; both are found.
}

/// Where nvcc is: `NVCC`, the repo's venv, then `PATH`.
fn find_nvcc() -> PathBuf {
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=PAGODA_CACHE");
    if let Some(p) = env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    let cache = env::var_os("PAGODA_CACHE")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pagoda")));
    if let Some(cache) = cache {
        let lib = cache.join("cuda-venv/lib");
        if let Ok(entries) = std::fs::read_dir(&lib) {
            for e in entries.flatten() {
                let nvcc = e.path().join("site-packages/nvidia/cu13/bin/nvcc");
                if nvcc.is_file() {
                    return nvcc;
                }
            }
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let nvcc = dir.join("nvcc");
            if nvcc.is_file() {
                return nvcc;
            }
        }
    }
    panic!(
        "pagoda-cuda-kernels: the `cuda` feature needs nvcc 13.0 and none was found \
         (looked at $NVCC, $PAGODA_CACHE or ~/.cache/pagoda/cuda-venv, then PATH). \
         Run scripts/cuda-venv.sh (it installs the pinned CUDA 13.0 toolkit from PyPI \
         and prints nvcc's path), or set NVCC=/path/to/nvcc."
    );
}

/// One ptxas line of interest, per (kernel, arch).
struct Usage {
    kernel: String,
    arch: String,
    registers: u32,
    spill_stores: u32,
    spill_loads: u32,
    line: String,
}

/// Parses nvcc's `-Xptxas -v` output: "Compiling entry function 'K' for 'sm_90'", then
/// "N bytes stack frame, S bytes spill stores, L bytes spill loads", then "Used R registers".
fn parse_ptxas(text: &str) -> Vec<Usage> {
    let mut out = Vec::new();
    let mut cur: Option<Usage> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            if let Some(u) = cur.take() {
                out.push(u);
            }
            let kernel = rest.split('\'').next().unwrap_or("").to_string();
            let arch = line
                .rsplit("for '")
                .next()
                .unwrap_or("")
                .trim_end_matches('\'')
                .to_string();
            cur = Some(Usage {
                kernel,
                arch,
                registers: 0,
                spill_stores: 0,
                spill_loads: 0,
                line: String::new(),
            });
        } else if let Some(u) = cur.as_mut() {
            let num_before = |key: &str| -> Option<u32> {
                let i = line.find(key)?;
                line[..i].split_whitespace().last()?.parse().ok()
            };
            if line.contains("spill stores") {
                u.spill_stores = num_before(" bytes spill stores").unwrap_or(0);
                u.spill_loads = num_before(" bytes spill loads").unwrap_or(0);
            }
            if line.contains("Used") && line.contains("registers") {
                u.registers = num_before(" registers").unwrap_or(0);
                u.line = line.trim().to_string();
            }
        }
    }
    out.extend(cur);
    out
}

fn build_fatbins(manifest: &Path, out: &Path) {
    let nvcc = find_nvcc();
    let handles: Vec<_> = KERNELS
        .iter()
        .map(|k| {
            let (nvcc, src, dst) = (
                nvcc.clone(),
                manifest.join("cu").join(format!("{k}.cu")),
                out.join(format!("{k}.fatbin")),
            );
            std::thread::spawn(move || {
                let output = Command::new(&nvcc)
                    .args(["--fatbin", "-O3", "-std=c++20", "-lineinfo"])
                    .args(["-gencode", "arch=compute_80,code=sm_80"])
                    .args(["-gencode", "arch=compute_90,code=sm_90"])
                    .args(["-gencode", "arch=compute_80,code=compute_80"])
                    .args(["-Xptxas", "-v", "-o"])
                    .arg(&dst)
                    .arg(&src)
                    .output()
                    .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
                let log = String::from_utf8_lossy(&output.stderr).into_owned()
                    + &String::from_utf8_lossy(&output.stdout);
                if !output.status.success() {
                    panic!("nvcc failed on {}:\n{log}", src.display());
                }
                log
            })
        })
        .collect();
    let mut report =
        String::from("# kernel arch registers spill_stores spill_loads | ptxas line\n");
    let mut spills = Vec::new();
    for h in handles {
        let log = h
            .join()
            .unwrap_or_else(|_| panic!("an nvcc thread panicked"));
        for u in parse_ptxas(&log) {
            report += &format!(
                "{} {} {} {} {} | {}\n",
                u.kernel, u.arch, u.registers, u.spill_stores, u.spill_loads, u.line
            );
            if u.spill_stores > 0 || u.spill_loads > 0 {
                spills.push(format!(
                    "{} ({}): {} B stores, {} B loads",
                    u.kernel, u.arch, u.spill_stores, u.spill_loads
                ));
            }
        }
    }
    std::fs::write(out.join("ptxas.txt"), &report).expect("write ptxas.txt");
    // Every kernel here is on a hot path; a spill is a performance bug, so it fails the build.
    if !spills.is_empty() && env::var_os("PAGODA_ALLOW_SPILLS").is_none() {
        panic!(
            "ptxas reports register spills (set PAGODA_ALLOW_SPILLS=1 to build anyway):\n{}",
            spills.join("\n")
        );
    }
    println!("cargo:rerun-if-env-changed=PAGODA_ALLOW_SPILLS");
}
