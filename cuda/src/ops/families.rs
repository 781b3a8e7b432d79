//! The families' extra ops (Qwen3's Q/K norms, Gemma 2's final-logit soft cap,
//! Mixtral's routing and expert sum): each checks its views, packs the parameter
//! struct and hands the [`Call`] to the driver, as `kernels.rs` does for the others.

use super::{dims2, dt, i32_of, p, DeviceOps};
use crate::driver::Driver;
use pagoda_core::{CoreError, DType, RopeShape, TensorMut, TensorRef};
use pagoda_cuda_kernels::{
    Call, MoeAccParams, MoeRouteParams, QkNormParams, SoftCapParams, MOE_MAX_TOP_K,
};
use std::ffi::c_void;

// The limit the models crate refuses by is the kernel's.
const _: () = assert!(pagoda_core::MOE_MAX_TOP_K == MOE_MAX_TOP_K);

fn bad(message: String) -> CoreError {
    CoreError::InvalidShape { message }
}

impl<D: Driver> DeviceOps<D> {
    pub(super) fn qk_norm_inner(
        &mut self,
        qkv: TensorMut<'_>,
        (q_w, k_w): (TensorRef<'_>, TensorRef<'_>),
        eps: f32,
        shape: RopeShape,
    ) -> Result<(), CoreError> {
        let d = shape.head_dim;
        let width = shape.qkv_dim();
        let ok = d > 0
            && shape.num_heads > 0
            && shape.num_kv_heads > 0
            && q_w.len() == d
            && k_w.len() == d
            && q_w.dtype() == DType::F32
            && k_w.dtype() == DType::F32
            && qkv.len().is_multiple_of(width)
            && eps.is_finite()
            && eps >= 0.0;
        if !ok {
            return Err(bad(format!(
                "qk_norm: qkv {} ({}), weights {} ({}) and {} ({}), eps {eps}, shape {shape:?}",
                qkv.len(),
                qkv.dtype(),
                q_w.len(),
                q_w.dtype(),
                k_w.len(),
                k_w.dtype()
            )));
        }
        let tokens = qkv.len() / width;
        let d_t = dt(qkv.dtype())?;
        let prm = QkNormParams {
            qkv: p::<c_void>(self.addr_mut("qkv", qkv)?),
            q_weight: p(self.addr("q norm weight", &q_w)?),
            k_weight: p(self.addr("k norm weight", &k_w)?),
            num_tokens: i32_of("tokens", tokens)?,
            num_heads: i32_of("heads", shape.num_heads)?,
            num_kv_heads: i32_of("kv heads", shape.num_kv_heads)?,
            head_dim: i32_of("head dim", d)?,
            eps,
            pad: 0,
        };
        // SAFETY: qkv holds whole rows of `width` (checked), the weights `head_dim` f32s,
        // all on this device.
        unsafe { self.launch("qk_norm", Call::QkNorm(prm, d_t)) }
    }

    pub(super) fn soft_cap_inner(&mut self, x: TensorMut<'_>, cap: f32) -> Result<(), CoreError> {
        if x.dtype() != DType::F32 || !(cap.is_finite() && cap > 0.0) {
            return Err(bad(format!(
                "soft_cap: x ({}) must be f32 and the cap ({cap}) positive and finite",
                x.dtype()
            )));
        }
        let n = x.len();
        let prm = SoftCapParams {
            x: p(self.addr_mut("soft cap x", x)?),
            n: n as i64,
            cap,
            pad: 0,
        };
        // SAFETY: x holds n f32s on this device.
        unsafe { self.launch("soft_cap", Call::SoftCap(prm)) }
    }

    pub(super) fn moe_route_inner(
        &mut self,
        logits: TensorRef<'_>,
        top_k: usize,
        weights: TensorMut<'_>,
    ) -> Result<(), CoreError> {
        let (tokens, experts) = dims2("router logits", logits.shape().dims())?;
        let ok = logits.dtype() == DType::F32
            && weights.dtype() == DType::F32
            && weights.shape() == logits.shape()
            && (1..=experts.min(MOE_MAX_TOP_K)).contains(&top_k);
        if !ok {
            return Err(bad(format!(
                "moe_route: logits {:?} ({}), weights {:?} ({}), top {top_k} (at most {} \
                 of {experts} experts)",
                logits.shape().dims(),
                logits.dtype(),
                weights.shape().dims(),
                weights.dtype(),
                experts.min(MOE_MAX_TOP_K)
            )));
        }
        let prm = MoeRouteParams {
            logits: p(self.addr("router logits", &logits)?),
            weights: p(self.addr_mut("routing weights", weights)?),
            num_tokens: i32_of("tokens", tokens)?,
            num_experts: i32_of("experts", experts)?,
            top_k: i32_of("top_k", top_k)?,
            pad: 0,
        };
        // SAFETY: both views are `[tokens, experts]` f32 on this device (checked).
        unsafe { self.launch("moe_route", Call::MoeRoute(prm)) }
    }

    pub(super) fn moe_acc_inner(
        &mut self,
        (y, weights): (TensorRef<'_>, TensorRef<'_>),
        (expert, first): (usize, bool),
        acc: TensorMut<'_>,
        out: Option<TensorMut<'_>>,
    ) -> Result<(), CoreError> {
        let (tokens, hidden) = dims2("expert output", y.shape().dims())?;
        let (wt, experts) = dims2("routing weights", weights.shape().dims())?;
        let ok = wt == tokens
            && expert < experts
            && weights.dtype() == DType::F32
            && acc.dtype() == DType::F32
            && acc.shape() == y.shape()
            && out
                .as_ref()
                .is_none_or(|o| o.shape() == y.shape() && o.dtype() == y.dtype());
        if !ok {
            return Err(bad(format!(
                "moe_accumulate: y {:?} ({}), weights {:?} ({}), expert {expert}, acc {:?} \
                 ({}), out {:?}",
                y.shape().dims(),
                y.dtype(),
                weights.shape().dims(),
                weights.dtype(),
                acc.shape().dims(),
                acc.dtype(),
                out.as_ref().map(|o| (o.shape().dims().to_vec(), o.dtype()))
            )));
        }
        let d = dt(y.dtype())?;
        let out_addr = match out {
            Some(o) => p(self.addr_mut("moe out", o)?),
            None => std::ptr::null_mut(),
        };
        let prm = MoeAccParams {
            y: p::<c_void>(self.addr("expert output", &y)?),
            weights: p(self.addr("routing weights", &weights)?),
            acc: p(self.addr_mut("moe accumulator", acc)?),
            out: out_addr,
            num_tokens: i32_of("tokens", tokens)?,
            hidden: i32_of("hidden", hidden)?,
            num_experts: i32_of("experts", experts)?,
            expert: i32_of("expert", expert)?,
            first: i32::from(first),
            pad: 0,
        };
        // SAFETY: y, acc (and out) are `[tokens, hidden]`, weights `[tokens, experts]`
        // with expert < experts (checked), all on this device.
        unsafe { self.launch("moe_accumulate", Call::MoeAcc(prm, d)) }
    }
}
