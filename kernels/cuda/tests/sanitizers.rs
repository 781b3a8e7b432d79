//! Sanitizers over the emulator, built with g++ at test time (gcc 12's libtsan/libasan):
//! * ThreadSanitizer: a kernel missing its `__syncthreads()` is reported as a data race
//!   (and the same kernel with the barrier is not), and the real kernels run race-free;
//! * AddressSanitizer: the real kernels stay inside their buffers, shared memory
//!   included (`__shared__` arrays are statics on the host, with redzones).

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh scratch directory per test (tests run in parallel).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagoda-tsan-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// g++ for the emulator with `-fsanitize=<sanitizer>`.
fn gxx_with(sanitizer: &str) -> Command {
    let mut c = Command::new(std::env::var("CXX").unwrap_or_else(|_| "g++".into()));
    c.args([
        "-std=c++20",
        "-O1",
        "-g",
        "-pthread",
        "-Wno-unknown-pragmas",
    ]);
    c.arg(format!("-fsanitize={sanitizer}"));
    c
}

fn gxx() -> Command {
    gxx_with("thread")
}

fn compile(cmd: &mut Command) {
    let out = cmd.output().expect("run g++");
    assert!(
        out.status.success(),
        "g++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a TSan binary; returns (stdout, stderr). TSan's reports go to stderr. Kernels
/// with high mmap entropy make gcc 12's TSan refuse to start ("unexpected memory
/// mapping"); then it runs again with ASLR off (setarch -R), as TSan's docs advise.
fn run(bin: &Path) -> (String, String) {
    let go = |cmd: &mut Command| {
        let out = cmd
            .env(
                "TSAN_OPTIONS",
                "halt_on_error=0 exitcode=0 report_signal_unsafe=0",
            )
            .output()
            .expect("run the TSan binary");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (out, err) = go(&mut Command::new(bin));
    if err.contains("unexpected memory mapping") {
        let arch = if cfg!(target_arch = "aarch64") {
            "aarch64"
        } else {
            "x86_64"
        };
        return go(Command::new("setarch").arg(arch).arg("-R").arg(bin));
    }
    (out, err)
}

const RACE: &str = "WARNING: ThreadSanitizer: data race";

#[test]
fn missing_syncthreads_is_reported_as_a_race() {
    let dir = scratch("barrier");
    let src = crate_dir().join("emu/sanitize/barrier_probe.cu");
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    compile(gxx().arg("-x").arg("c++").arg(&src).arg("-o").arg(&good));
    compile(
        gxx()
            .arg("-DPLANT_MISSING_SYNC")
            .arg("-x")
            .arg("c++")
            .arg(&src)
            .arg("-o")
            .arg(&bad),
    );
    let (out, err) = run(&good);
    assert!(
        out.contains("ok") && !err.contains("ThreadSanitizer"),
        "with the barrier:\n{out}\n{err}"
    );
    let (_, err) = run(&bad);
    assert!(
        err.contains(RACE),
        "TSan missed the planted missing __syncthreads:\n{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Builds the kernels and their driver with `sanitizer`; returns the binary.
fn build_kernels(sanitizer: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(sanitizer);
    let cu = crate_dir().join("cu");
    let mut objs = Vec::new();
    for k in ["write_kv", "naive", "paged", "flash", "model"] {
        let obj = dir.join(format!("{k}.o"));
        compile(
            gxx_with(sanitizer)
                .arg("-x")
                .arg("c++")
                .arg("-c")
                .arg(cu.join(format!("{k}.cu")))
                .arg("-o")
                .arg(&obj),
        );
        objs.push(obj);
    }
    let bin = dir.join("kernels");
    compile(
        gxx_with(sanitizer)
            .arg(crate_dir().join("emu/sanitize/kernels_main.cpp"))
            .arg(crate_dir().join("emu/sanitize/model_driver.cpp"))
            .args(&objs)
            .arg("-o")
            .arg(&bin),
    );
    (dir, bin)
}

#[test]
fn kernels_run_race_free_under_tsan() {
    let (dir, bin) = build_kernels("thread");
    let (out, err) = run(&bin);
    assert!(out.contains("ok"), "kernel launches failed:\n{out}\n{err}");
    assert!(
        !err.contains("ThreadSanitizer"),
        "TSan reports in the kernels:\n{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn kernels_stay_in_bounds_under_asan() {
    let (dir, bin) = build_kernels("address");
    let out = Command::new(&bin)
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .output()
        .expect("run");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("ok") && !stderr.contains("AddressSanitizer"),
        "ASan reports in the kernels:\n{stdout}\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
