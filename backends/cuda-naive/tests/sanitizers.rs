//! `naive.cu` under ThreadSanitizer and AddressSanitizer through the emulator
//! (`pagoda_cuda_testkit::sanitize`): race-free, inside its buffers.

use std::path::PathBuf;

#[test]
fn naive_runs_race_free_and_in_bounds() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    pagoda_cuda_testkit::sanitize::assert_clean(
        "naive",
        &[dir.join("cu/naive.cu")],
        &[dir.join("tests/sanitize/naive_main.cpp")],
    );
}
