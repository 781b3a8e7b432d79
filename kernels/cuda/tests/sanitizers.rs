//! Sanitizers over the emulator, built with g++ at test time (gcc 12's libtsan/libasan,
//! through `pagoda_cuda_testkit::sanitize`):
//! * ThreadSanitizer: a kernel missing its `__syncthreads()` is reported as a data race
//!   (and the same kernel with the barrier is not);
//! * both: the library's kernels (write_kv, paged + merge_states, model.cu's) run
//!   race-free and inside their buffers, shared memory included. The backend crates'
//!   kernels run under the same check in their own tests.

use pagoda_cuda_testkit::sanitize::{assert_clean, compile, gxx, run, scratch, RACE};
use std::path::PathBuf;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn missing_syncthreads_is_reported_as_a_race() {
    let dir = scratch("barrier");
    let src = crate_dir().join("emu/sanitize/barrier_probe.cu");
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    compile(
        gxx("thread")
            .arg("-x")
            .arg("c++")
            .arg(&src)
            .arg("-o")
            .arg(&good),
    );
    compile(
        gxx("thread")
            .arg("-DPLANT_MISSING_SYNC")
            .arg("-x")
            .arg("c++")
            .arg(&src)
            .arg("-o")
            .arg(&bad),
    );
    let (_, out, err) = run(&good);
    assert!(
        out.contains("ok") && !err.contains("ThreadSanitizer"),
        "with the barrier:\n{out}\n{err}"
    );
    let (_, _, err) = run(&bad);
    assert!(
        err.contains(RACE),
        "TSan missed the planted missing __syncthreads:\n{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_library_kernels_run_race_free_and_in_bounds() {
    let cu: Vec<PathBuf> = ["write_kv", "paged", "merge", "model"]
        .iter()
        .map(|k| crate_dir().join("cu").join(format!("{k}.cu")))
        .collect();
    let drivers =
        ["kernels_main.cpp", "model_driver.cpp"].map(|d| crate_dir().join("emu/sanitize").join(d));
    assert_clean("pagoda-cuda-kernels", &cu, &drivers);
}
