//! Build script of pagoda-cutlass.
//!
//! Without the `cuda` feature: nothing (the crate is empty; no nvcc, no libclang).
//!
//! With it: compiles `cu/cutlass_gemm.cu` with nvcc (from `NVCC`, the venv of
//! `scripts/cuda-venv.sh`, or `PATH`) through the `cc` crate into a static library
//! (SASS for sm_80 and sm_90), links the static CUDA runtime of the same toolkit
//! (`libcudart_static.a`: it opens libcuda at its first call, so binaries start on
//! machines without a driver), and generates the Rust FFI of `cu/cutlass_gemm.h` with
//! bindgen. CUTLASS's headers come from `CUTLASS_DIR` or from the `nvidia-cutlass` wheel
//! in nvcc's venv (`site-packages/cutlass_library/source/include`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    cuda::build();
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::env;
    use std::path::{Path, PathBuf};

    pub fn build() {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let cu = manifest.join("cu");
        println!("cargo:rerun-if-changed=cu/cutlass_gemm.cu");
        println!("cargo:rerun-if-changed=cu/cutlass_gemm.h");

        let nvcc = pagoda_cuda_build::find_nvcc("pagoda-cutlass");
        let include = find_cutlass(&nvcc);
        let cudart_dir = find_cudart(&nvcc);

        // cc finds nvcc through `NVCC` only (setting `.compiler()` would make it pass
        // gcc's flags to nvcc).
        env::set_var("NVCC", &nvcc);
        cc::Build::new()
            .cuda(true)
            // The runtime is linked below from the toolkit's own lib folder, which cc's
            // guess (`bin/../targets/<arch>-linux/lib`) misses for the PyPI layout.
            .cudart("none")
            .debug(false)
            .opt_level(3)
            .warnings(false)
            .flag("-std=c++17")
            .flag("--expt-relaxed-constexpr")
            .flag("-gencode=arch=compute_80,code=sm_80")
            .flag("-gencode=arch=compute_90,code=sm_90")
            .define("NDEBUG", None)
            .include(&cu)
            .include(&include)
            .file(cu.join("cutlass_gemm.cu"))
            .compile("pagoda_cutlass");

        println!("cargo:rustc-link-search=native={}", cudart_dir.display());
        println!("cargo:rustc-link-lib=static=cudart_static");
        // What libcudart_static.a itself needs from the C library.
        for lib in ["dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }

        let bindings = bindgen::Builder::default()
            .header(cu.join("cutlass_gemm.h").to_string_lossy())
            .allowlist_function("pg_cutlass_.*")
            .allowlist_type("PgCutlass.*")
            .allowlist_var("PG_CUTLASS_.*")
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
            .generate()
            .unwrap_or_else(|e| {
                panic!(
                    "pagoda-cutlass: bindgen failed on cu/cutlass_gemm.h ({e}); it needs \
                     libclang (Debian: apt-get install libclang-dev)"
                )
            });
        bindings
            .write_to_file(out.join("cutlass_gemm.rs"))
            .expect("write OUT_DIR/cutlass_gemm.rs");
    }

    /// CUTLASS's include folder (the one holding `cutlass/` and `cute/`).
    fn find_cutlass(nvcc: &Path) -> PathBuf {
        println!("cargo:rerun-if-env-changed=CUTLASS_DIR");
        let mut tried = Vec::new();
        if let Some(dir) = env::var_os("CUTLASS_DIR").map(PathBuf::from) {
            // Either a CUTLASS checkout (with include/) or its include folder itself.
            tried.push(dir.join("include"));
            tried.push(dir);
        }
        // nvcc is site-packages/nvidia/cu13/bin/nvcc: the wheel sits beside `nvidia/`.
        if let Some(site) = nvcc.ancestors().nth(4) {
            tried.push(site.join("cutlass_library/source/include"));
        }
        for dir in &tried {
            if dir.join("cutlass/gemm/device/gemm.h").is_file() {
                return dir.clone();
            }
        }
        panic!(
            "pagoda-cutlass: CUTLASS's headers were not found (tried {tried:?}). Run \
             scripts/cuda-venv.sh (it installs nvidia-cutlass==4.2.0.0 beside nvcc), or set \
             CUTLASS_DIR to a CUTLASS tree."
        );
    }

    /// The folder of `libcudart_static.a`: the toolkit's `lib` beside nvcc's `bin`
    /// (PyPI's `nvidia-cuda-runtime` wheel), or a classic `lib64`.
    fn find_cudart(nvcc: &Path) -> PathBuf {
        let root = nvcc
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let tried = [
            root.join("lib"),
            root.join("lib64"),
            root.join("targets/x86_64-linux/lib"),
        ];
        for dir in &tried {
            if dir.join("libcudart_static.a").is_file() {
                return dir.clone();
            }
        }
        panic!(
            "pagoda-cutlass: libcudart_static.a not found (tried {tried:?}); the venv of \
             scripts/cuda-venv.sh has it (nvidia-cuda-runtime)."
        );
    }
}
