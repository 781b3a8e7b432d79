//! `flash.cu` under ThreadSanitizer and AddressSanitizer through the emulator
//! (`pagoda_cuda_testkit::sanitize`): race-free (its barriers between the cp.async
//! stages), inside its buffers and its dynamic shared memory.

use std::path::PathBuf;

#[test]
fn flash_runs_race_free_and_in_bounds() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    pagoda_cuda_testkit::sanitize::assert_clean(
        "flash",
        &[dir.join("cu/flash.cu")],
        &[dir.join("tests/sanitize/flash_main.cpp")],
    );
}
