//! A kernel file under the sanitizers: its `.cu` built with g++ through the SIMT
//! emulator and `-fsanitize=thread` or `address` (gcc 12's libtsan/libasan), linked with
//! a small C++ driver that launches it on small shapes through its `pg_emu_*` entry, and
//! run. ThreadSanitizer reports a race between emulated threads (a kernel missing a
//! `__syncthreads()`); AddressSanitizer an access outside a buffer (shared memory too:
//! `__shared__` arrays are statics on the host, with redzones). Correctness is the
//! reference tests' job: the driver only launches.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `common.cuh` and `params.h` are (and through them the emulator).
pub fn include_dir() -> PathBuf {
    PathBuf::from(pagoda_cuda_kernels::INCLUDE_DIR)
}

/// A fresh scratch directory per (test process, name): tests run in parallel.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagoda-san-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// g++ for the emulator with `-fsanitize=<sanitizer>` and the shared headers.
pub fn gxx(sanitizer: &str) -> Command {
    let mut c = Command::new(std::env::var("CXX").unwrap_or_else(|_| "g++".into()));
    c.args([
        "-std=c++20",
        "-O1",
        "-g",
        "-pthread",
        "-Wno-unknown-pragmas",
    ]);
    c.arg(format!("-fsanitize={sanitizer}"));
    c.arg("-I").arg(include_dir());
    c
}

/// Runs `cmd` (a compiler), panicking with its stderr when it fails.
pub fn compile(cmd: &mut Command) {
    let out = cmd.output().expect("run g++");
    assert!(
        out.status.success(),
        "g++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the kernel files `cu` (as C++) and the `drivers` (`.cpp`, one with `main`)
/// with `sanitizer` into `dir`; returns the binary.
pub fn build(sanitizer: &str, dir: &Path, cu: &[PathBuf], drivers: &[PathBuf]) -> PathBuf {
    let mut objs = Vec::new();
    for src in cu {
        let stem = src.file_stem().expect("a kernel file").to_string_lossy();
        let obj = dir.join(format!("{stem}.o"));
        compile(
            gxx(sanitizer)
                .arg("-x")
                .arg("c++")
                .arg("-c")
                .arg(src)
                .arg("-o")
                .arg(&obj),
        );
        objs.push(obj);
    }
    let bin = dir.join("kernels");
    compile(gxx(sanitizer).args(drivers).args(&objs).arg("-o").arg(&bin));
    bin
}

/// Runs a sanitized binary; returns (success, stdout, stderr): the sanitizers report to
/// stderr. Kernels with high mmap entropy make gcc 12's TSan refuse to start
/// ("unexpected memory mapping"); then it runs again with ASLR off (setarch -R), as
/// TSan's docs advise.
pub fn run(bin: &Path) -> (bool, String, String) {
    let go = |cmd: &mut Command| {
        let out = cmd
            .env(
                "TSAN_OPTIONS",
                "halt_on_error=0 exitcode=0 report_signal_unsafe=0",
            )
            .env("ASAN_OPTIONS", "detect_leaks=0")
            .output()
            .expect("run the sanitized binary");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = go(&mut Command::new(bin));
    if err.contains("unexpected memory mapping") {
        let arch = if cfg!(target_arch = "aarch64") {
            "aarch64"
        } else {
            "x86_64"
        };
        return go(Command::new("setarch").arg(arch).arg("-R").arg(bin));
    }
    (ok, out, err)
}

/// ThreadSanitizer's report of a race.
pub const RACE: &str = "WARNING: ThreadSanitizer: data race";

/// Builds `cu` with `drivers` under ThreadSanitizer and under AddressSanitizer, runs
/// both, and panics with the report when either finds anything or a launch fails (the
/// driver prints `ok` when every launch returned 0).
pub fn assert_clean(name: &str, cu: &[PathBuf], drivers: &[PathBuf]) {
    for (sanitizer, report) in [
        ("thread", "ThreadSanitizer"),
        ("address", "AddressSanitizer"),
    ] {
        let dir = scratch(&format!("{name}-{sanitizer}"));
        let bin = build(sanitizer, &dir, cu, drivers);
        let (ok, out, err) = run(&bin);
        assert!(
            out.contains("ok") && !err.contains(report),
            "{name} under {report} (exit ok: {ok}):\n{out}\n{err}"
        );
        if sanitizer == "address" {
            assert!(ok, "{name} under {report} failed:\n{out}\n{err}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
