//! One kernel launch as both devices take it: the kernel family, its packed parameter
//! struct (the `#[repr(C)]` mirror of `cu/params.h`) and its dtypes.
//!
//! `pagoda-cuda`'s device code path builds a [`Call`] once and hands it to its driver:
//! [`crate::emu_launch::call`] on `emu`, `cuda::CudaKernels::call` on `cuda:N` (feature
//! `cuda`). Both take the same bytes and the same geometry ([`Call::launch`], the host
//! code `cu/*.cu` shares), so a wrong pointer, stride or scalar in the struct reaches the
//! emulated kernel exactly as it reaches the GPU's, and the emulator refuses the
//! geometries a GPU refuses ([`crate::emu_launch::check_launch`]).

use crate::attn::AttnKernel;
use crate::params::{
    ArgmaxParams, AttnParams, CastParams, EmbedParams, GatherParams, GluParams, Launch,
    MoeAccParams, MoeRouteParams, NormParams, QkNormParams, RopeKvParams, SoftCapParams,
    WriteKvParams, MOE_MAX_TOP_K,
};
use crate::Dtype;

/// A kernel launch: the family, the packed parameters, the dtypes that pick the
/// instantiation (see the module docs).
#[derive(Debug, Clone, Copy)]
pub enum Call {
    /// An attention kernel ([`AttnKernel`]: the library's `paged` or a backend
    /// crate's own) in the element dtype.
    Attn(&'static AttnKernel, AttnParams, Dtype),
    /// `merge_states`: a split-KV kernel's partitions (`split_out`, `split_lse`) into
    /// `out` (and `lse`), in the element dtype.
    MergeStates(AttnParams, Dtype),
    /// `write_kv` into pools of the dtype (the source dtype is in the struct).
    WriteKv(WriteKvParams, Dtype),
    /// `embed`: table dtype, output dtype.
    Embed(EmbedParams, Dtype, Dtype),
    /// `rms_norm` (no residual): input dtype, output dtype.
    RmsNorm(NormParams, Dtype, Dtype),
    /// `add_rms_norm` (residual f32): input dtype, output dtype.
    AddRmsNorm(NormParams, Dtype, Dtype),
    /// `rope_write_kv`: qkv/q dtype, pool dtype.
    RopeKv(RopeKvParams, Dtype, Dtype),
    /// `silu_mul`.
    SiluMul(GluParams, Dtype),
    /// `gelu_tanh_mul`.
    GeluTanhMul(GluParams, Dtype),
    /// `gather_rows`.
    Gather(GatherParams, Dtype),
    /// `argmax` of logits of the dtype.
    Argmax(ArgmaxParams, Dtype),
    /// `cast`: source dtype, destination dtype.
    Cast(CastParams, Dtype, Dtype),
    /// `qk_norm` on fused QKV rows of the dtype.
    QkNorm(QkNormParams, Dtype),
    /// `soft_cap` (f32).
    SoftCap(SoftCapParams),
    /// `moe_route` (f32).
    MoeRoute(MoeRouteParams),
    /// `moe_accumulate`: the expert output's (and `out`'s) dtype.
    MoeAcc(MoeAccParams, Dtype),
}

impl Call {
    /// The kernel family's name (what errors and recorded graphs name).
    pub fn name(&self) -> &'static str {
        match self {
            Call::Attn(k, ..) => k.name,
            Call::MergeStates(..) => "merge_states",
            Call::WriteKv(..) => "write_kv",
            Call::Embed(..) => "embed",
            Call::RmsNorm(..) => "rms_norm",
            Call::AddRmsNorm(..) => "add_rms_norm",
            Call::RopeKv(..) => "rope_write_kv",
            Call::SiluMul(..) => "silu_mul",
            Call::GeluTanhMul(..) => "gelu_tanh_mul",
            Call::Gather(..) => "gather_rows",
            Call::Argmax(..) => "argmax",
            Call::Cast(..) => "cast",
            Call::QkNorm(..) => "qk_norm",
            Call::SoftCap(..) => "soft_cap",
            Call::MoeRoute(..) => "moe_route",
            Call::MoeAcc(..) => "moe_accumulate",
        }
    }

    /// The launch's grid, block and dynamic shared memory.
    pub fn launch(&self) -> Launch {
        match self {
            Call::Attn(k, p, _) => k.launch_of(p),
            Call::MergeStates(p, _) => p.merge_states_launch(),
            Call::WriteKv(p, _) => p.launch(),
            Call::Embed(p, ..) => p.launch(),
            Call::RmsNorm(p, ..) | Call::AddRmsNorm(p, ..) => p.launch(),
            Call::RopeKv(p, ..) => p.launch(),
            Call::SiluMul(p, _) | Call::GeluTanhMul(p, _) => p.launch(),
            Call::Gather(p, _) => p.launch(),
            Call::Argmax(p, _) => p.launch(),
            Call::Cast(p, ..) => p.launch(),
            Call::QkNorm(p, _) => p.launch(),
            Call::SoftCap(p) => p.launch(),
            Call::MoeRoute(p) => p.launch(),
            Call::MoeAcc(p, _) => p.launch(),
        }
    }

    /// What both launchers refuse before launching (the kernels trust their structs):
    /// a norm's residual that does not match its family, an odd RoPE head dim, a
    /// non-positive or non-finite soft cap, a routing `top_k` outside `1..=min(experts,
    /// 32)`, an accumulated expert outside the weights' columns.
    pub fn check(&self) -> Result<(), crate::Error> {
        match self {
            Call::RmsNorm(p, ..) if !p.residual.is_null() => Err(crate::invalid(
                "residual",
                "rms_norm takes no residual (add_rms_norm does)",
            )),
            Call::AddRmsNorm(p, ..) if p.residual.is_null() => Err(crate::invalid(
                "residual",
                "add_rms_norm needs the residual",
            )),
            Call::RopeKv(p, ..) if p.head_dim <= 0 || p.head_dim % 2 != 0 => Err(crate::invalid(
                "head_dim",
                format!("{} must be even and > 0", p.head_dim),
            )),
            Call::SoftCap(p) if !(p.cap.is_finite() && p.cap > 0.0) => Err(crate::invalid(
                "cap",
                format!("{} must be positive and finite", p.cap),
            )),
            Call::MoeRoute(p)
                if p.top_k < 1 || p.top_k > p.num_experts || p.top_k as usize > MOE_MAX_TOP_K =>
            {
                Err(crate::invalid(
                    "top_k",
                    format!(
                        "{} must be in 1..={} (experts {}, kernel limit {MOE_MAX_TOP_K})",
                        p.top_k,
                        p.num_experts.min(MOE_MAX_TOP_K as i32),
                        p.num_experts
                    ),
                ))
            }
            Call::MoeAcc(p, _) if p.expert < 0 || p.expert >= p.num_experts => Err(crate::invalid(
                "expert",
                format!("{} outside 0..{}", p.expert, p.num_experts),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu_launch::call;
    use std::ptr;

    fn norm(residual: *mut f32, x: &[f32], w: &[f32], out: &mut [f32]) -> NormParams {
        NormParams {
            x: x.as_ptr().cast(),
            residual,
            weight: w.as_ptr(),
            out: out.as_mut_ptr().cast(),
            rows: 1,
            dim: 4,
            eps: 1e-6,
            w_offset: 0.0,
        }
    }

    /// The struct a device path packs runs on the emulator as on a GPU: a cast through
    /// `call` equals the checked host wrapper's; a norm whose residual does not match
    /// its family and an odd RoPE head dim are refused before any launch.
    #[test]
    fn a_packed_call_runs_and_a_malformed_one_is_refused() {
        let src = [1.0f32, -2.5, 3.25, 1e-3];
        let (mut a, mut b) = ([half::bf16::ZERO; 4], [half::bf16::ZERO; 4]);
        let p = CastParams {
            src: src.as_ptr().cast(),
            dst: a.as_mut_ptr().cast(),
            n: 4,
        };
        // SAFETY: src and dst hold 4 elements each.
        unsafe { call(&Call::Cast(p, Dtype::F32, Dtype::Bf16)) }.unwrap();
        crate::emu_model::cast(&src, &mut b).unwrap();
        assert_eq!(a, b);

        let (x, w) = ([1.0f32; 4], [1.0f32; 4]);
        let (mut out, mut res) = ([0.0f32; 4], [0.0f32; 4]);
        let with_res = norm(res.as_mut_ptr(), &x, &w, &mut out);
        // SAFETY: refused before launching (and every buffer is valid anyway).
        let e = unsafe { call(&Call::RmsNorm(with_res, Dtype::F32, Dtype::F32)) };
        assert!(e.unwrap_err().to_string().contains("residual"));
        let without = norm(ptr::null_mut(), &x, &w, &mut out);
        // SAFETY: refused before launching: the null residual is never dereferenced.
        let e = unsafe { call(&Call::AddRmsNorm(without, Dtype::F32, Dtype::F32)) };
        assert!(e.unwrap_err().to_string().contains("residual"));
        // SAFETY: x, w and out hold one row of 4.
        unsafe { call(&Call::RmsNorm(without, Dtype::F32, Dtype::F32)) }.unwrap();
        assert!(out.iter().all(|&v| (v - 1.0).abs() < 1e-5), "{out:?}");
        let rope = RopeKvParams {
            qkv: ptr::null(),
            bias: ptr::null(),
            positions: ptr::null(),
            cos: ptr::null(),
            sin: ptr::null(),
            slot_mapping: ptr::null(),
            q_out: ptr::null_mut(),
            k_pool: ptr::null_mut(),
            v_pool: ptr::null_mut(),
            num_tokens: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 5,
        };
        // SAFETY: refused before launching: no pointer is read.
        let e = unsafe { call(&Call::RopeKv(rope, Dtype::F32, Dtype::F32)) };
        assert!(e.unwrap_err().to_string().contains("head_dim"));
        assert_eq!(
            Call::RopeKv(rope, Dtype::F32, Dtype::F32).name(),
            "rope_write_kv"
        );
    }
}
