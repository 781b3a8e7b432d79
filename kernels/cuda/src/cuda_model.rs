//! The model forward's kernels (`cu/model.cu`) on a CUDA device: launchers on
//! [`CudaKernels`] taking the same parameter structs as [`crate::emu_model`] builds, with
//! device pointers. Like the attention launchers they allocate nothing and never
//! synchronise with the host (CUDA-graph friendly); the geometry is the host code the
//! emulator runs ([`crate::Launch`]).

use crate::call::Call;
use crate::cuda::{CudaKernels, MODEL};
use crate::model_entries::{
    one, two, ADD_RMS_NORM, ARGMAX, CAST, EMBED, GATHER, GELU, MODEL_FUNCTIONS, MOE_ACC, MOE_ROUTE,
    QK_NORM, RMS_NORM, ROPE_KV, SILU, SOFT_CAP,
};
use crate::params::{
    ArgmaxParams, CastParams, EmbedParams, GatherParams, GluParams, MoeAccParams, MoeRouteParams,
    NormParams, QkNormParams, RopeKvParams, SoftCapParams,
};
use crate::{invalid, Dtype, Error};
use cudarc::driver::CudaStream;

impl CudaKernels {
    fn model_launch<P>(
        &self,
        stream: &CudaStream,
        name: &'static str,
        l: crate::Launch,
        p: &P,
    ) -> Result<(), Error> {
        let f = self.function(MODEL, name)?;
        // SAFETY: every public launcher below passes its caller's promise on: `p` holds
        // device pointers of this context sized as the kernel reads and writes them.
        unsafe { self.launch(f, l, stream, p) }
    }

    /// `out[t, :] = scale * table[ids[t], :]` (table `table_dtype`, out `out_dtype`).
    ///
    /// # Safety
    /// `p`'s pointers are device memory of this context: `ids` `num_tokens` i32 each in
    /// `0..vocab`, `table` `[vocab, hidden]`, `out` `[num_tokens, hidden]`.
    pub unsafe fn embed(
        &self,
        stream: &CudaStream,
        p: &EmbedParams,
        table_dtype: Dtype,
        out_dtype: Dtype,
    ) -> Result<(), Error> {
        let name = two(EMBED, table_dtype, out_dtype);
        self.model_launch(stream, name, p.launch(), p)
    }

    /// RMSNorm of `p.rows` rows (`p.residual` must be null).
    ///
    /// # Safety
    /// `x` and `out` hold `[rows, dim]` of their dtypes, `weight` `dim` f32, on this device.
    pub unsafe fn rms_norm(
        &self,
        stream: &CudaStream,
        p: &NormParams,
        x_dtype: Dtype,
        out_dtype: Dtype,
    ) -> Result<(), Error> {
        if !p.residual.is_null() {
            return Err(invalid(
                "residual",
                "rms_norm takes no residual (add_rms_norm does)",
            ));
        }
        let name = two(RMS_NORM, x_dtype, out_dtype);
        self.model_launch(stream, name, p.launch(), p)
    }

    /// `residual += x`, then RMSNorm of the residual into `out`.
    ///
    /// # Safety
    /// As [`CudaKernels::rms_norm`], and `residual` is `[rows, dim]` f32 (not null).
    pub unsafe fn add_rms_norm(
        &self,
        stream: &CudaStream,
        p: &NormParams,
        x_dtype: Dtype,
        out_dtype: Dtype,
    ) -> Result<(), Error> {
        if p.residual.is_null() {
            return Err(invalid("residual", "add_rms_norm needs the residual"));
        }
        let name = two(ADD_RMS_NORM, x_dtype, out_dtype);
        self.model_launch(stream, name, p.launch(), p)
    }

    /// RoPE on q and k of the fused QKV rows, q into `q_out`, k and v into the pools.
    ///
    /// # Safety
    /// `p`'s pointers are device memory of this context with the layouts of
    /// [`RopeKvParams`] (`qkv`/`q_out` of `dtype`, pools of `kv_dtype`); `head_dim` is even,
    /// positions are in `0..max_pos`, non-negative slots inside the pools.
    pub unsafe fn rope_write_kv(
        &self,
        stream: &CudaStream,
        p: &RopeKvParams,
        dtype: Dtype,
        kv_dtype: Dtype,
    ) -> Result<(), Error> {
        if p.head_dim <= 0 || p.head_dim % 2 != 0 {
            return Err(invalid(
                "head_dim",
                format!("{} must be even and > 0", p.head_dim),
            ));
        }
        let name = two(ROPE_KV, dtype, kv_dtype);
        self.model_launch(stream, name, p.launch(), p)
    }

    /// `out = silu(gate) * up` on rows `[gate | up]`.
    ///
    /// # Safety
    /// `gate_up` is `[rows, 2 inter]` and `out` `[rows, inter]` of `dtype` on this device.
    pub unsafe fn silu_mul(
        &self,
        stream: &CudaStream,
        p: &GluParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, one(SILU, dtype), p.launch(), p)
    }

    /// `out = gelu_tanh(gate) * up` on rows `[gate | up]`.
    ///
    /// # Safety
    /// As [`CudaKernels::silu_mul`].
    pub unsafe fn gelu_tanh_mul(
        &self,
        stream: &CudaStream,
        p: &GluParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, one(GELU, dtype), p.launch(), p)
    }

    /// `out[i, :] = x[rows[i], :]`.
    ///
    /// # Safety
    /// `rows` holds `num_rows` i32 row indices of `x`, `out` `[num_rows, dim]`, on this device.
    pub unsafe fn gather_rows(
        &self,
        stream: &CudaStream,
        p: &GatherParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, one(GATHER, dtype), p.launch(), p)
    }

    /// Per row: the first index of the largest non-NaN value and the value.
    ///
    /// # Safety
    /// `logits` is `[rows, vocab]` of `dtype`, `ids` `rows` i32, `values` `rows` f32.
    pub unsafe fn argmax(
        &self,
        stream: &CudaStream,
        p: &ArgmaxParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, one(ARGMAX, dtype), p.launch(), p)
    }

    /// `dst = src` converted from `src_dtype` to `dst_dtype`.
    ///
    /// # Safety
    /// `src` and `dst` hold `n` elements of their dtypes on this device.
    pub unsafe fn cast(
        &self,
        stream: &CudaStream,
        p: &CastParams,
        src_dtype: Dtype,
        dst_dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, two(CAST, src_dtype, dst_dtype), p.launch(), p)
    }
}

impl CudaKernels {
    /// Per-head RMSNorm in place on the q and k heads of fused QKV rows (Qwen3).
    ///
    /// # Safety
    /// `qkv` is `[num_tokens, (num_heads + 2 num_kv_heads) head_dim]` of `dtype`, the
    /// weights `head_dim` f32 each, on this device.
    pub unsafe fn qk_norm(
        &self,
        stream: &CudaStream,
        p: &QkNormParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, one(QK_NORM, dtype), p.launch(), p)
    }

    /// `x = cap * tanh(x / cap)` in place (f32).
    ///
    /// # Safety
    /// `x` holds `n` f32 on this device.
    pub unsafe fn soft_cap(&self, stream: &CudaStream, p: &SoftCapParams) -> Result<(), Error> {
        self.model_launch(stream, MODEL_FUNCTIONS[SOFT_CAP], p.launch(), p)
    }

    /// MoE routing: the dense `[tokens, experts]` weights of each token's top-k experts.
    ///
    /// # Safety
    /// `logits` and `weights` hold `[num_tokens, num_experts]` f32 on this device.
    pub unsafe fn moe_route(&self, stream: &CudaStream, p: &MoeRouteParams) -> Result<(), Error> {
        self.model_launch(stream, MODEL_FUNCTIONS[MOE_ROUTE], p.launch(), p)
    }

    /// One expert's weighted output into the f32 accumulator (and `out`, if not null).
    ///
    /// # Safety
    /// `y` (and `out`) `[num_tokens, hidden]` of `dtype`, `acc` the same f32, `weights`
    /// `[num_tokens, num_experts]` f32, on this device; `expert < num_experts`.
    pub unsafe fn moe_accumulate(
        &self,
        stream: &CudaStream,
        p: &MoeAccParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        self.model_launch(stream, one(MOE_ACC, dtype), p.launch(), p)
    }
}

impl CudaKernels {
    /// Launches `c` from its packed struct on `stream`: what `emu_launch::call` does on
    /// the emulator, here through the typed launchers above.
    ///
    /// # Safety
    /// Every pointer in the struct is device memory of this context of the sizes its
    /// fields imply, every index in it inside what it indexes.
    pub unsafe fn call(&self, stream: &CudaStream, c: &Call) -> Result<(), Error> {
        c.check()?;
        // SAFETY: (every arm) the caller's contract.
        unsafe {
            match *c {
                Call::Attn(k, ref p, d) => self.attn(stream, k, p, d),
                Call::MergeStates(ref p, d) => self.merge_states(stream, p, d),
                Call::WriteKv(ref p, d) => self.write_kv(stream, p, d),
                Call::Embed(ref p, w, o) => self.embed(stream, p, w, o),
                Call::RmsNorm(ref p, x, o) => self.rms_norm(stream, p, x, o),
                Call::AddRmsNorm(ref p, x, o) => self.add_rms_norm(stream, p, x, o),
                Call::RopeKv(ref p, t, kv) => self.rope_write_kv(stream, p, t, kv),
                Call::SiluMul(ref p, t) => self.silu_mul(stream, p, t),
                Call::GeluTanhMul(ref p, t) => self.gelu_tanh_mul(stream, p, t),
                Call::Gather(ref p, x) => self.gather_rows(stream, p, x),
                Call::Argmax(ref p, x) => self.argmax(stream, p, x),
                Call::Cast(ref p, s, d) => self.cast(stream, p, s, d),
                Call::QkNorm(ref p, t) => self.qk_norm(stream, p, t),
                Call::SoftCap(ref p) => self.soft_cap(stream, p),
                Call::MoeRoute(ref p) => self.moe_route(stream, p),
                Call::MoeAcc(ref p, t) => self.moe_accumulate(stream, p, t),
            }
        }
    }
}
