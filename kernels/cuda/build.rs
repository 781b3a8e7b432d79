//! Build script of pagoda-cuda-kernels.
//!
//! Always: compiles every `cu/*.cu` for the host with g++ through the SIMT emulator
//! (`emu/simt.h`) into a static library of `extern "C"` launchers, so plain `cargo test`
//! runs the kernels with no CUDA anything. The attention kernels that one backend owns
//! (`naive.cu`, `flash.cu`, ...) are built by that backend crate's build script.
//!
//! With the `cuda` feature: compiles each `.cu` to one fatbin (SASS sm_80 + sm_90, PTX
//! compute_80) with nvcc from `NVCC`, the venv of `scripts/cuda-venv.sh`, or `PATH`, and
//! fails the build when ptxas reports a register spill. The fatbins and the ptxas report
//! land in `OUT_DIR` for `include_bytes!`/`include_str!`. The host build, nvcc's
//! discovery and the spill check are `pagoda-cuda-build`'s, shared with the CUDA
//! backend crates that own their kernels.

use std::env;
use std::path::{Path, PathBuf};

/// Kernel files, one per kernel family (and the mma probe).
const KERNELS: [&str; 5] = ["write_kv", "paged", "merge", "mma_probe", "model"];

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=cu");
    println!("cargo:rerun-if-changed=emu");
    for k in KERNELS {
        println!("cargo:rerun-if-changed=cu/{k}.cu");
    }
    // What a CUDA backend crate's build script (`pagoda_cuda_build::backend`) reads as
    // DEP_PAGODA_CUDA_EMU_INCLUDE and DEP_PAGODA_CUDA_EMU_CUDA: where `common.cuh`,
    // `params.h` (and through them the emulator) are, and whether fatbins are built.
    println!("cargo:include={}", manifest.join("cu").display());
    build_emu(&manifest);
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:cuda=1");
        build_fatbins(&manifest, &out);
    }
}

fn build_fatbins(manifest: &Path, out: &Path) {
    let nvcc = pagoda_cuda_build::find_nvcc("pagoda-cuda-kernels");
    let srcs: Vec<(String, PathBuf)> = KERNELS
        .iter()
        .map(|k| (k.to_string(), manifest.join("cu").join(format!("{k}.cu"))))
        .collect();
    let report = pagoda_cuda_build::build_fatbins(&nvcc, &srcs, &[], out);
    std::fs::write(out.join("ptxas.txt"), &report).expect("write ptxas.txt");
}

fn build_emu(manifest: &Path) {
    let mut b = pagoda_cuda_build::host_build(&[manifest.join("cu")]);
    for k in KERNELS {
        b.file(manifest.join("cu").join(format!("{k}.cu")));
    }
    // The emulator's own self-test kernels (host only).
    b.file(manifest.join("emu").join("selftest.cu"));
    b.compile("pagoda_cuda_emu");
}
