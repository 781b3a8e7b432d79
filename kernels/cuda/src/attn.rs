//! Attention kernels, described by a struct wherever they are compiled.
//!
//! Every attention kernel, the library's own ([`PAGED`], `cu/paged.cu`, with its merge
//! `cu/merge.cu`) and a backend crate's (`cuda-naive`'s `naive.cu`, `cuda-flash`'s
//! `flash.cu`, any other crate's own), is a `static` [`AttnKernel`]: its host
//! launcher, its emulator entry, its fatbin and its entry points. A backend crate's
//! one-line `build.rs` (`pagoda_cuda_build::backend`) compiles its `.cu` for the host
//! through the SIMT emulator and, in the CUDA build, to a fatbin. A launch is
//! [`Call::Attn`](crate::Call::Attn); both drivers take it alike: the emulator through
//! [`crate::emu_launch::call`] (the same launch-limit checks, fault reporting and graph
//! recording), a GPU through `cuda::CudaKernels::call` (the fatbin loaded on first use,
//! the entry looked up by name). So nothing here, nor in `pagoda-cuda`, names a
//! backend: this crate knows only the struct.
//!
//! The kernel takes [`AttnParams`] (the `PgAttnParams` of `cu/params.h`, which
//! its `.cu` includes through `common.cuh`), so the device code path packs it once for
//! every kernel. A split-KV kernel writes its partitions in `merge.cu`'s layout and
//! the device code path launches [`Call::MergeStates`](crate::Call::MergeStates) after
//! it (`num_splits > 1`).

use crate::params::{AttnParams, Launch};
use crate::Dtype;

/// An attention kernel (see the module docs).
#[derive(Debug)]
pub struct AttnKernel {
    /// The kernel family's name (errors and recorded graphs name it).
    pub name: &'static str,
    /// The host launcher of the `.cu` file: grid, block and dynamic shared memory for
    /// the struct. It must only read the struct (never the memory it points at).
    pub launch: unsafe extern "C" fn(*const AttnParams) -> Launch,
    /// The emulator's entry of the `.cu` file: runs the kernel of dtype code
    /// (`PG_F32`, ...) on host memory; 0 on success, non-zero for a dtype or shape it
    /// has no instantiation for.
    pub emu: unsafe extern "C" fn(*const AttnParams, i32) -> i32,
    /// The fatbin (`None` in a build without CUDA).
    pub fatbin: Option<&'static [u8]>,
    /// The fatbin's entry point for (dtype, head dim), `None` where there is none: what
    /// both drivers refuse as [`crate::Error::Unsupported`] before launching.
    pub entry: fn(Dtype, usize) -> Option<&'static str>,
    /// Dynamic shared memory its entries opt into past the default 48 KiB (0: none).
    pub max_dyn_shared_bytes: u32,
}

impl AttnKernel {
    /// The launch geometry of `p` (the `.cu` file's host launcher).
    pub fn launch_of(&self, p: &AttnParams) -> Launch {
        // SAFETY: `launch` only reads the struct (the field's contract), which is alive
        // for the call.
        unsafe { (self.launch)(p) }
    }

    /// The entry for `dtype` and `p`'s head dim, or why there is none.
    pub fn entry_of(&self, p: &AttnParams, dtype: Dtype) -> Result<&'static str, crate::Error> {
        let head_dim = usize::try_from(p.head_dim).unwrap_or(0);
        (self.entry)(dtype, head_dim).ok_or(crate::Error::Unsupported {
            kernel: self.name,
            dtype,
            head_dim,
        })
    }

    /// Whether it has an entry for `dtype` at `head_dim`.
    pub fn supports(&self, dtype: Dtype, head_dim: usize) -> bool {
        (self.entry)(dtype, head_dim).is_some()
    }
}

#[cfg(feature = "cuda")]
const PAGED_FATBIN: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/paged.fatbin")));
#[cfg(not(feature = "cuda"))]
const PAGED_FATBIN: Option<&[u8]> = None;

fn paged_entry(dtype: Dtype, head_dim: usize) -> Option<&'static str> {
    Some(match (dtype, head_dim) {
        (Dtype::F32, 64) => "pg_paged_f32_d64",
        (Dtype::F32, 128) => "pg_paged_f32_d128",
        (Dtype::Bf16, 64) => "pg_paged_bf16_d64",
        (Dtype::Bf16, 128) => "pg_paged_bf16_d128",
        (Dtype::Bf16, 256) => "pg_paged_bf16_d256",
        (Dtype::F16, 64) => "pg_paged_f16_d64",
        (Dtype::F16, 128) => "pg_paged_f16_d128",
        (Dtype::F16, 256) => "pg_paged_f16_d256",
        _ => return None,
    })
}

/// `cu/paged.cu`: split-KV paged decode (flash-decoding), one CTA per (split, KV head
/// group, sequence), 16-byte loads; decode rows only. A library kernel: `cuda-paged`
/// serves it, and `cuda-flash` runs prompt tokens as its decode rows under batch
/// invariance (the same bits for the same row). Its head dims: [`crate::paged_head_dims`].
pub static PAGED: AttnKernel = AttnKernel {
    name: "paged",
    launch: crate::ffi::pg_paged_launch,
    emu: crate::ffi::pg_emu_paged,
    fatbin: PAGED_FATBIN,
    entry: paged_entry,
    max_dyn_shared_bytes: 0,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_has_an_entry_exactly_for_its_head_dims() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for d in [16, 32, 64, 80, 96, 128, 192, 256, 512] {
                assert_eq!(
                    PAGED.supports(dtype, d),
                    crate::paged_head_dims(dtype).contains(&d),
                    "{dtype:?} d{d}"
                );
            }
        }
    }
}
