//! Attention kernels that live in their backend's crate, not in this one.
//!
//! A CUDA backend crate owns its `.cu` file(s): its one-line `build.rs`
//! (`pagoda_cuda_build::backend`) compiles them for the host through the SIMT emulator
//! and, in the CUDA build, to a fatbin; the crate describes the result as a
//! `static` [`PluginKernel`] and launches it as [`Call::Plugin`](crate::Call::Plugin).
//! Both drivers take that call as they take this crate's own kernels: the emulator
//! through [`crate::emu_launch::call`] (the same launch-limit checks, fault reporting and
//! graph recording), a GPU through `cuda::CudaKernels::call` (the fatbin loaded on first
//! use, the entry looked up by name). So nothing here, nor in `pagoda-cuda`, names the
//! backend: this crate knows only the struct.
//!
//! The kernel takes [`AttnParams`] (the `PgAttnParams` of `cu/params.h`, which
//! its `.cu` includes through `common.cuh`), so the device code path packs it as it
//! packs the built-in kernels' parameters.

use crate::params::{AttnParams, Launch};
use crate::Dtype;

/// An attention kernel compiled in another crate (see the module docs).
#[derive(Debug)]
pub struct PluginKernel {
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

impl PluginKernel {
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
}
