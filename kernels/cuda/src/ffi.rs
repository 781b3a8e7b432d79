//! The host static library's `extern "C"` symbols (built by build.rs from `cu/*.cu`).
//! Hand-written: the header is four structs and a dozen functions.

use crate::params::{
    ArgmaxParams, AttnParams, CastParams, EmbedParams, GatherParams, GluParams, Launch,
    MmaProbeParams, MoeAccParams, MoeRouteParams, NormParams, QkNormParams, RopeKvParams,
    SoftCapParams, WriteKvParams,
};

extern "C" {
    pub fn pg_write_kv_launch(p: *const WriteKvParams) -> Launch;
    pub fn pg_paged_launch(p: *const AttnParams) -> Launch;
    pub fn pg_merge_states_launch(p: *const AttnParams) -> Launch;

    pub fn pg_emu_write_kv(p: *const WriteKvParams, dtype: i32) -> i32;
    pub fn pg_emu_paged(p: *const AttnParams, dtype: i32) -> i32;
    pub fn pg_emu_merge_states(p: *const AttnParams, dtype: i32) -> i32;
    pub fn pg_emu_mma_probe(p: *const MmaProbeParams, dtype: i32) -> i32;
    pub fn pg_params_sizes(out: *mut u64);
    /// The emulator's fault since the last call (1: a misaligned 16-byte access), cleared.
    pub fn pg_emu_take_fault() -> i32;

    // model.cu
    pub fn pg_embed_launch(p: *const EmbedParams) -> Launch;
    pub fn pg_norm_launch(p: *const NormParams) -> Launch;
    pub fn pg_rope_kv_launch(p: *const RopeKvParams) -> Launch;
    pub fn pg_glu_launch(p: *const GluParams) -> Launch;
    pub fn pg_gather_launch(p: *const GatherParams) -> Launch;
    pub fn pg_argmax_launch(p: *const ArgmaxParams) -> Launch;
    pub fn pg_cast_launch(p: *const CastParams) -> Launch;
    pub fn pg_emu_embed(p: *const EmbedParams, w: i32, o: i32) -> i32;
    pub fn pg_emu_rms_norm(p: *const NormParams, x: i32, o: i32) -> i32;
    pub fn pg_emu_add_rms_norm(p: *const NormParams, x: i32, o: i32) -> i32;
    pub fn pg_emu_rope_kv(p: *const RopeKvParams, t: i32, kv: i32) -> i32;
    pub fn pg_emu_silu_mul(p: *const GluParams, t: i32) -> i32;
    pub fn pg_emu_gelu_tanh_mul(p: *const GluParams, t: i32) -> i32;
    pub fn pg_emu_gather_rows(p: *const GatherParams, x: i32) -> i32;
    pub fn pg_emu_argmax(p: *const ArgmaxParams, x: i32) -> i32;
    pub fn pg_emu_cast(p: *const CastParams, s: i32, d: i32) -> i32;
    pub fn pg_model_params_sizes(out: *mut u64);
    pub fn pg_qk_norm_launch(p: *const QkNormParams) -> Launch;
    pub fn pg_soft_cap_launch(p: *const SoftCapParams) -> Launch;
    pub fn pg_moe_route_launch(p: *const MoeRouteParams) -> Launch;
    pub fn pg_moe_acc_launch(p: *const MoeAccParams) -> Launch;
    pub fn pg_emu_qk_norm(p: *const QkNormParams, t: i32) -> i32;
    pub fn pg_emu_soft_cap(p: *const SoftCapParams, x: i32) -> i32;
    pub fn pg_emu_moe_route(p: *const MoeRouteParams, x: i32) -> i32;
    pub fn pg_emu_moe_acc(p: *const MoeAccParams, t: i32) -> i32;
}
