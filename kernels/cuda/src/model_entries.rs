//! The entry points of `cu/model.cu` by family and dtype (feature `cuda`): the name table
//! the loader (`cuda.rs`) loads `model.cu`'s functions from, and the offsets the model
//! launchers (`cuda_model.rs`) pick a name with.
//!
//! Apart from both so that the loader needs nothing of the launchers: `cuda_model.rs`
//! builds on `cuda.rs` (its launchers are methods of [`CudaKernels`](crate::cuda::CudaKernels)),
//! and this table is what both of them read.

use crate::Dtype;

/// Entry points of `model.cu`, per family in `PG_F32, PG_BF16, PG_F16` order (two-dtype
/// families: `first * 3 + second`). Offsets below.
pub(crate) const MODEL_FUNCTIONS: [&str; 65] = [
    "pg_embed_f32_f32",
    "pg_embed_f32_bf16",
    "pg_embed_f32_f16",
    "pg_embed_bf16_f32",
    "pg_embed_bf16_bf16",
    "pg_embed_bf16_f16",
    "pg_embed_f16_f32",
    "pg_embed_f16_bf16",
    "pg_embed_f16_f16",
    "pg_rms_norm_f32_f32",
    "pg_rms_norm_f32_bf16",
    "pg_rms_norm_f32_f16",
    "pg_rms_norm_bf16_f32",
    "pg_rms_norm_bf16_bf16",
    "pg_rms_norm_bf16_f16",
    "pg_rms_norm_f16_f32",
    "pg_rms_norm_f16_bf16",
    "pg_rms_norm_f16_f16",
    "pg_add_rms_norm_f32_f32",
    "pg_add_rms_norm_f32_bf16",
    "pg_add_rms_norm_f32_f16",
    "pg_add_rms_norm_bf16_f32",
    "pg_add_rms_norm_bf16_bf16",
    "pg_add_rms_norm_bf16_f16",
    "pg_add_rms_norm_f16_f32",
    "pg_add_rms_norm_f16_bf16",
    "pg_add_rms_norm_f16_f16",
    "pg_rope_kv_f32_f32",
    "pg_rope_kv_f32_bf16",
    "pg_rope_kv_f32_f16",
    "pg_rope_kv_bf16_f32",
    "pg_rope_kv_bf16_bf16",
    "pg_rope_kv_bf16_f16",
    "pg_rope_kv_f16_f32",
    "pg_rope_kv_f16_bf16",
    "pg_rope_kv_f16_f16",
    "pg_cast_f32_f32",
    "pg_cast_f32_bf16",
    "pg_cast_f32_f16",
    "pg_cast_bf16_f32",
    "pg_cast_bf16_bf16",
    "pg_cast_bf16_f16",
    "pg_cast_f16_f32",
    "pg_cast_f16_bf16",
    "pg_cast_f16_f16",
    "pg_silu_mul_f32",
    "pg_silu_mul_bf16",
    "pg_silu_mul_f16",
    "pg_gelu_tanh_mul_f32",
    "pg_gelu_tanh_mul_bf16",
    "pg_gelu_tanh_mul_f16",
    "pg_gather_rows_f32",
    "pg_gather_rows_bf16",
    "pg_gather_rows_f16",
    "pg_argmax_f32",
    "pg_argmax_bf16",
    "pg_argmax_f16",
    "pg_qk_norm_f32",
    "pg_qk_norm_bf16",
    "pg_qk_norm_f16",
    "pg_moe_acc_f32",
    "pg_moe_acc_bf16",
    "pg_moe_acc_f16",
    "pg_soft_cap_f32",
    "pg_moe_route_f32",
];

pub(crate) const EMBED: usize = 0;
pub(crate) const RMS_NORM: usize = 9;
pub(crate) const ADD_RMS_NORM: usize = 18;
pub(crate) const ROPE_KV: usize = 27;
pub(crate) const CAST: usize = 36;
pub(crate) const SILU: usize = 45;
pub(crate) const GELU: usize = 48;
pub(crate) const GATHER: usize = 51;
pub(crate) const ARGMAX: usize = 54;
pub(crate) const QK_NORM: usize = 57;
pub(crate) const MOE_ACC: usize = 60;
pub(crate) const SOFT_CAP: usize = 63;
pub(crate) const MOE_ROUTE: usize = 64;

/// The entry of one-dtype family `base` for `a`.
pub(crate) fn one(base: usize, a: Dtype) -> &'static str {
    MODEL_FUNCTIONS[base + a as usize]
}

/// The entry of two-dtype family `base` for `a` then `b` (`first * 3 + second`).
pub(crate) fn two(base: usize, a: Dtype, b: Dtype) -> &'static str {
    MODEL_FUNCTIONS[base + a as usize * 3 + b as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

    #[test]
    fn names_follow_the_dtype_order() {
        for (base, fam) in [
            (EMBED, "embed"),
            (RMS_NORM, "rms_norm"),
            (ADD_RMS_NORM, "add_rms_norm"),
            (ROPE_KV, "rope_kv"),
            (CAST, "cast"),
        ] {
            for a in DTYPES {
                for b in DTYPES {
                    let want = format!("pg_{fam}_{}_{}", a.kernel_suffix(), b.kernel_suffix());
                    assert_eq!(two(base, a, b), want);
                }
            }
        }
        for (base, fam) in [
            (SILU, "silu_mul"),
            (GELU, "gelu_tanh_mul"),
            (GATHER, "gather_rows"),
            (ARGMAX, "argmax"),
            (QK_NORM, "qk_norm"),
            (MOE_ACC, "moe_acc"),
        ] {
            for a in DTYPES {
                assert_eq!(one(base, a), format!("pg_{fam}_{}", a.kernel_suffix()));
            }
        }
        assert_eq!(MODEL_FUNCTIONS[SOFT_CAP], "pg_soft_cap_f32");
        assert_eq!(MODEL_FUNCTIONS[MOE_ROUTE], "pg_moe_route_f32");
    }
}
