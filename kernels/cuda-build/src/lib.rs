//! The build-script helper of every crate that owns CUDA kernels (`pagoda-cuda-kernels`,
//! `pagoda-cutlass`, and each CUDA backend crate): one place that knows how a `.cu`
//! file becomes something Rust links.
//!
//! * Always: [`host_build`] compiles `.cu` files as C++20 for the host through the SIMT
//!   emulator (`kernels/cuda/emu/simt.h`, reached through `common.cuh`), so plain
//!   `cargo test` runs every kernel with no CUDA anything.
//! * When the CUDA build is on: [`build_fatbins`] compiles each file to one fatbin (SASS
//!   sm_80 + sm_90, PTX compute_80) with the nvcc [`find_nvcc`] finds, writes ptxas's
//!   register report and fails the build on a register spill.
//!
//! A CUDA backend crate's whole `build.rs` is one call, [`backend`]: it reads where
//! the shared headers are and whether the CUDA build is on from `pagoda-cuda-kernels`'
//! build metadata (its `links = "pagoda_cuda_emu"`: `DEP_PAGODA_CUDA_EMU_INCLUDE`,
//! `DEP_PAGODA_CUDA_EMU_CUDA`), so the backend needs no `cuda` feature of its own: the
//! build that turns on `pagoda-cuda-kernels/cuda` (e.g. `pagoda-server --features
//! cuda`) builds its fatbins too, and its Rust code sees `cfg(pagoda_cuda)`.
//!
//! This crate runs inside build scripts, so it reports by panicking with the reason
//! (what cargo prints as the build failure), not with an error type.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `pagoda-cuda-kernels`' `links` name: its metadata reaches dependents' build scripts
/// as `DEP_PAGODA_CUDA_EMU_*`.
pub const LINKS: &str = "pagoda_cuda_emu";

/// The cfg a backend crate's Rust code sees when its fatbins were built
/// (`#[cfg(pagoda_cuda)]`).
pub const CFG: &str = "pagoda_cuda";

fn var(name: &str) -> String {
    env::var(name).unwrap_or_else(|_| panic!("cargo sets {name} for build scripts"))
}

/// The whole build script of a CUDA backend crate: compiles `cu/<k>.cu` for each
/// kernel file `k` into a host static library through the emulator (always) and, when
/// `pagoda-cuda-kernels` is built with `cuda`, to `$OUT_DIR/<k>.fatbin` (with
/// `$OUT_DIR/ptxas.txt`), then sets `cfg(pagoda_cuda)`. The crate must depend on
/// `pagoda-cuda-kernels` (that is where the shared headers and the emulator are).
pub fn backend(kernels: &[&str]) {
    println!("cargo:rustc-check-cfg=cfg({CFG})");
    let manifest = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(var("OUT_DIR"));
    let include = env::var_os("DEP_PAGODA_CUDA_EMU_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "pagoda-cuda-build: no DEP_PAGODA_CUDA_EMU_INCLUDE: a CUDA backend crate \
                 must depend on pagoda-cuda-kernels (its shared headers and the emulator)"
            )
        });
    println!("cargo:rerun-if-changed=cu");
    let srcs: Vec<(String, PathBuf)> = kernels
        .iter()
        .map(|k| {
            let src = manifest.join("cu").join(format!("{k}.cu"));
            assert!(
                src.is_file(),
                "pagoda-cuda-build: {} is missing",
                src.display()
            );
            println!("cargo:rerun-if-changed=cu/{k}.cu");
            (k.to_string(), src)
        })
        .collect();
    let mut b = host_build(&[manifest.join("cu"), include.clone()]);
    for (_, src) in &srcs {
        b.file(src);
    }
    // One static library per crate (its name is the crate's, so two backends never
    // collide); cc tells cargo to link it.
    b.compile(&format!("{}_emu", var("CARGO_PKG_NAME").replace('-', "_")));
    if env::var("DEP_PAGODA_CUDA_EMU_CUDA").is_ok_and(|v| v == "1") {
        let nvcc = find_nvcc(&var("CARGO_PKG_NAME"));
        let report = build_fatbins(&nvcc, &srcs, &[include], &out);
        std::fs::write(out.join("ptxas.txt"), report).expect("write OUT_DIR/ptxas.txt");
        println!("cargo:rustc-cfg={CFG}");
    }
}

/// A second host build of `cu/<kernel>.cu` with the macro `define` set, for a test
/// that needs a variant of the kernel (`cuda-flash`'s planted fragment-layout bug,
/// `PAGODA_PLANT_FRAGMENT_BUG`): the `.cu` must then rename its `extern "C"` symbols
/// (e.g. with a `_planted` suffix) so both copies link. Host only, never a fatbin;
/// called after [`backend`] in the same build script.
pub fn host_variant(kernel: &str, define: &str) {
    let manifest = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(var("OUT_DIR")).join(define.to_lowercase());
    std::fs::create_dir_all(&out).expect("create the variant's OUT_DIR");
    let include = PathBuf::from(var("DEP_PAGODA_CUDA_EMU_INCLUDE"));
    let mut b = host_build(&[manifest.join("cu"), include]);
    b.define(define, None)
        .out_dir(&out)
        .file(manifest.join("cu").join(format!("{kernel}.cu")));
    b.compile(&format!(
        "{}_{}",
        var("CARGO_PKG_NAME").replace('-', "_"),
        define.to_lowercase()
    ));
}

/// A cc build of `.cu` files as C++20 for the host (g++ 12 is what CI has), with
/// `includes` on the include path.
pub fn host_build(includes: &[PathBuf]) -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .debug(false)
        .opt_level(2)
        .flag("-x")
        .flag("c++")
        .flag("-std=c++20")
        .flag("-pthread")
        .flag("-Wno-unknown-pragmas")
        .warnings(true);
    for i in includes {
        b.include(i);
    }
    b
}

/// Where nvcc is: `NVCC`, the repo's venv (`PAGODA_CACHE` or `~/.cache/pagoda`, what
/// `scripts/cuda-venv.sh` installs), then `PATH`; `who` names the crate in the panic
/// when there is none.
pub fn find_nvcc(who: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=PAGODA_CACHE");
    if let Some(p) = env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    let cache = env::var_os("PAGODA_CACHE")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pagoda")));
    if let Some(lib) = cache.map(|c| c.join("cuda-venv/lib")) {
        for e in std::fs::read_dir(&lib).into_iter().flatten().flatten() {
            let nvcc = e.path().join("site-packages/nvidia/cu13/bin/nvcc");
            if nvcc.is_file() {
                return nvcc;
            }
        }
    }
    for dir in env::split_paths(&env::var_os("PATH").unwrap_or_default()) {
        if dir.join("nvcc").is_file() {
            return dir.join("nvcc");
        }
    }
    panic!(
        "{who}: the CUDA build needs nvcc 13.0 and none was found (looked at $NVCC, \
         $PAGODA_CACHE or ~/.cache/pagoda/cuda-venv, then PATH). Run scripts/cuda-venv.sh \
         (it installs the pinned CUDA 13.0 toolkit from PyPI and prints nvcc's path), or \
         set NVCC=/path/to/nvcc."
    );
}

/// One ptxas line of interest, per (kernel, arch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The entry function.
    pub kernel: String,
    /// `sm_80`, `sm_90`, ...
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores.
    pub spill_stores: u32,
    /// Bytes of spill loads.
    pub spill_loads: u32,
    /// The "Used N registers" line as ptxas printed it.
    pub line: String,
}

/// Parses nvcc's `-Xptxas -v` output: "Compiling entry function 'K' for 'sm_90'", then
/// "N bytes stack frame, S bytes spill stores, L bytes spill loads", then "Used R registers".
pub fn parse_ptxas(text: &str) -> Vec<Usage> {
    let mut out = Vec::new();
    let mut cur: Option<Usage> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            out.extend(cur.take());
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

/// Compiles each `(name, source)` to `out/<name>.fatbin` with `nvcc` (in parallel),
/// `includes` on the include path; returns ptxas's report (`kernel arch registers
/// spill_stores spill_loads | ptxas line`). Every kernel is on a hot path, so a spill is
/// a performance bug: it fails the build unless `PAGODA_ALLOW_SPILLS` is set.
pub fn build_fatbins(
    nvcc: &Path,
    srcs: &[(String, PathBuf)],
    includes: &[PathBuf],
    out: &Path,
) -> String {
    println!("cargo:rerun-if-env-changed=PAGODA_ALLOW_SPILLS");
    let handles: Vec<_> = srcs
        .iter()
        .map(|(name, src)| {
            let mut cmd = Command::new(nvcc);
            cmd.args(["--fatbin", "-O3", "-std=c++20", "-lineinfo"])
                .args(["-gencode", "arch=compute_80,code=sm_80"])
                .args(["-gencode", "arch=compute_90,code=sm_90"])
                .args(["-gencode", "arch=compute_80,code=compute_80"])
                .args(["-Xptxas", "-v"]);
            for i in includes {
                cmd.arg("-I").arg(i);
            }
            cmd.arg("-o")
                .arg(out.join(format!("{name}.fatbin")))
                .arg(src);
            let (src, nvcc) = (src.clone(), nvcc.to_path_buf());
            std::thread::spawn(move || {
                let output = cmd
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
    if !spills.is_empty() && env::var_os("PAGODA_ALLOW_SPILLS").is_none() {
        panic!(
            "ptxas reports register spills (set PAGODA_ALLOW_SPILLS=1 to build anyway):\n{}",
            spills.join("\n")
        );
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ptxas's `-v` lines as nvcc 13 prints them: one usage per (entry, arch), the
    /// spill figures read from the stack-frame line, the registers from "Used".
    #[test]
    fn ptxas_report_is_parsed_per_entry_and_arch() {
        let log = "ptxas info    : Compiling entry function 'pg_a_bf16' for 'sm_80'\n\
                   ptxas info    : Function properties for pg_a_bf16\n\
                   \x20   0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 64 registers, used 1 barriers, 392 bytes cmem[0]\n\
                   ptxas info    : Compiling entry function 'pg_a_bf16' for 'sm_90'\n\
                   \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 40 registers\n";
        let u = parse_ptxas(log);
        assert_eq!(u.len(), 2);
        assert_eq!(
            (u[0].kernel.as_str(), u[0].arch.as_str()),
            ("pg_a_bf16", "sm_80")
        );
        assert_eq!(
            (u[0].registers, u[0].spill_stores, u[0].spill_loads),
            (64, 8, 12)
        );
        assert_eq!(
            (u[1].arch.as_str(), u[1].registers, u[1].spill_stores),
            ("sm_90", 40, 0)
        );
        assert!(parse_ptxas("no ptxas output").is_empty());
    }
}
