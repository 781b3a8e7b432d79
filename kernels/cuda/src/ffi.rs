//! The host static library's `extern "C"` symbols (built by build.rs from `cu/*.cu`).
//! Hand-written: the header is four structs and a dozen functions.

use crate::params::{AttnParams, Launch, MmaProbeParams, WriteKvParams};

extern "C" {
    pub fn pg_write_kv_launch(p: *const WriteKvParams) -> Launch;
    pub fn pg_naive_launch(p: *const AttnParams) -> Launch;
    pub fn pg_paged_launch(p: *const AttnParams) -> Launch;
    pub fn pg_paged_merge_launch(p: *const AttnParams) -> Launch;
    pub fn pg_flash_launch(p: *const AttnParams) -> Launch;

    pub fn pg_emu_write_kv(p: *const WriteKvParams, dtype: i32) -> i32;
    pub fn pg_emu_naive(p: *const AttnParams, dtype: i32) -> i32;
    pub fn pg_emu_paged(p: *const AttnParams, dtype: i32) -> i32;
    pub fn pg_emu_flash(p: *const AttnParams, dtype: i32) -> i32;
    pub fn pg_emu_flash_planted(p: *const AttnParams, dtype: i32) -> i32;
    pub fn pg_emu_mma_probe(p: *const MmaProbeParams, dtype: i32) -> i32;
    pub fn pg_params_sizes(out: *mut u64);
}
