//! The launch geometry of each parameter struct: the `.cu` files' host launchers
//! (`pg_*_launch`, in the host library build.rs makes), read by both drivers. Apart from
//! `params.rs` so that the structs do not depend on the symbols that take them.

use crate::ffi;
use crate::params::{
    ArgmaxParams, AttnParams, CastParams, EmbedParams, GatherParams, GluParams, Launch,
    MoeAccParams, MoeRouteParams, NormParams, QkNormParams, RopeKvParams, SoftCapParams,
    WriteKvParams,
};

impl AttnParams {
    /// Grid of `merge_states` (`cu/merge.cu`, launched after a split-KV kernel when
    /// `num_splits > 1`).
    pub fn merge_states_launch(&self) -> Launch {
        // SAFETY: the geometry functions read only scalar fields, never through pointers.
        unsafe { ffi::pg_merge_states_launch(self) }
    }
}

impl WriteKvParams {
    /// Grid of the `write_kv` kernel.
    pub fn launch(&self) -> Launch {
        // SAFETY: as in `AttnParams::merge_states_launch`.
        unsafe { ffi::pg_write_kv_launch(self) }
    }
}

macro_rules! model_launch {
    ($ty:ty, $ffi:ident, $doc:literal) => {
        impl $ty {
            #[doc = $doc]
            pub fn launch(&self) -> Launch {
                // SAFETY: the geometry functions read only scalar fields, never through
                // pointers.
                unsafe { ffi::$ffi(self) }
            }
        }
    };
}
model_launch!(EmbedParams, pg_embed_launch, "Grid of the `embed` kernel.");
model_launch!(
    NormParams,
    pg_norm_launch,
    "Grid of `rms_norm` / `add_rms_norm`."
);
model_launch!(
    RopeKvParams,
    pg_rope_kv_launch,
    "Grid of the `rope_write_kv` kernel."
);
model_launch!(
    GluParams,
    pg_glu_launch,
    "Grid of `silu_mul` / `gelu_tanh_mul`."
);
model_launch!(GatherParams, pg_gather_launch, "Grid of `gather_rows`.");
model_launch!(ArgmaxParams, pg_argmax_launch, "Grid of `argmax`.");
model_launch!(CastParams, pg_cast_launch, "Grid of `cast`.");
model_launch!(QkNormParams, pg_qk_norm_launch, "Grid of `qk_norm`.");
model_launch!(SoftCapParams, pg_soft_cap_launch, "Grid of `soft_cap`.");
model_launch!(MoeRouteParams, pg_moe_route_launch, "Grid of `moe_route`.");
model_launch!(MoeAccParams, pg_moe_acc_launch, "Grid of `moe_accumulate`.");
