//! The `cuda` device: the same kernels as fatbins (SASS sm_80/sm_90, PTX compute_80),
//! loaded through cudarc and launched with the same parameter structs as [`crate::emu`].
//!
//! A binary built with this feature starts on a machine with no CUDA at all: cudarc
//! opens libcuda at run time, and [`probe`] checks for it before anything that would
//! panic without it (`CudaContext::new`). "No driver" and "no device" are [`Error`]s.
//!
//! Launches take raw device pointers in the parameter structs (the caller owns the
//! memory), so they are `unsafe`; they do no host synchronisation and no allocation
//! (the argument array is on the stack, the function handles are looked up in maps
//! filled when a module is first used; [`CudaKernels::preload`] fills them all, e.g.
//! before capturing a CUDA graph).

/// The cudarc this crate was built with (allocate buffers and streams with it, so the
/// versions always match).
pub use cudarc;

use crate::params::{AttnParams, Launch, MmaProbeParams, WriteKvParams};
use crate::plugin::PluginKernel;
use crate::{flash_head_dims, paged_head_dims, Dtype, Error};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// ptxas's register/spill figures for every kernel and arch, written by build.rs
/// (`kernel arch registers spill_stores spill_loads | ptxas line`).
pub const PTXAS_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/ptxas.txt"));

macro_rules! fatbin {
    ($name:literal) => {
        include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".fatbin"))
    };
}

/// One kernel file: its fatbin and the entry points it defines.
struct ModuleSpec {
    fatbin: &'static [u8],
    functions: &'static [&'static str],
}

const WRITE_KV: usize = 0;
const NAIVE: usize = 1;
const PAGED: usize = 2;
const FLASH: usize = 3;
const MMA_PROBE: usize = 4;
/// `model.cu` (its launchers are in `cuda_model.rs`).
pub(crate) const MODEL: usize = 5;

static MODULES: [ModuleSpec; 6] = [
    ModuleSpec {
        fatbin: fatbin!("write_kv"),
        functions: &["pg_write_kv_f32", "pg_write_kv_bf16", "pg_write_kv_f16"],
    },
    ModuleSpec {
        fatbin: fatbin!("naive"),
        functions: &["pg_naive_f32", "pg_naive_bf16", "pg_naive_f16"],
    },
    ModuleSpec {
        fatbin: fatbin!("paged"),
        functions: &[
            "pg_paged_f32_d64",
            "pg_paged_f32_d128",
            "pg_paged_bf16_d64",
            "pg_paged_bf16_d128",
            "pg_paged_bf16_d256",
            "pg_paged_f16_d64",
            "pg_paged_f16_d128",
            "pg_paged_f16_d256",
            "pg_paged_merge_f32",
            "pg_paged_merge_bf16",
            "pg_paged_merge_f16",
        ],
    },
    ModuleSpec {
        fatbin: fatbin!("flash"),
        functions: &[
            "pg_flash_bf16_d64",
            "pg_flash_bf16_d128",
            "pg_flash_f16_d64",
            "pg_flash_f16_d128",
        ],
    },
    ModuleSpec {
        fatbin: fatbin!("mma_probe"),
        functions: &["pg_mma_probe_bf16", "pg_mma_probe_f16"],
    },
    ModuleSpec {
        fatbin: fatbin!("model"),
        functions: &crate::cuda_model::MODEL_FUNCTIONS,
    },
];

fn drv(e: DriverError) -> Error {
    match e.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => Error::NoDevice(String::new()),
        _ => Error::Driver(e.to_string()),
    }
}

/// Checks that libcuda loads and that device `ordinal` exists; returns the device count.
/// Never panics (cudarc's `CudaContext::new` does when libcuda is missing).
pub fn probe(ordinal: usize) -> Result<usize, Error> {
    // SAFETY: is_culib_present only tries to dlopen libcuda (and closes it again).
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoDriver);
    }
    let count = CudaContext::device_count().map_err(drv)?;
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(Error::NoDevice(String::new()));
    }
    if ordinal >= count {
        return Err(Error::NoDevice(format!(
            " {ordinal} (the driver sees {count})"
        )));
    }
    Ok(count)
}

/// A loaded kernel file: the module (kept alive) and its functions by name.
type Loaded = Result<(Arc<CudaModule>, HashMap<&'static str, CudaFunction>), Error>;

/// The loaded kernels of one device.
pub struct CudaKernels {
    ctx: Arc<CudaContext>,
    /// Per kernel file, its module and functions, loaded at first use.
    loaded: [OnceLock<Loaded>; 6],
    /// Backend crates' kernels ([`PluginKernel`]), by the address of their static:
    /// the module, loaded at first use, and the entries looked up so far.
    plugins: Mutex<HashMap<usize, PluginModule>>,
}

/// A [`PluginKernel`]'s loaded fatbin.
struct PluginModule {
    module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels")
            .field("ordinal", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

impl CudaKernels {
    /// Opens device `ordinal` ([`probe`] first, so no panic without a driver).
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        probe(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        Ok(CudaKernels {
            ctx,
            loaded: Default::default(),
            plugins: Mutex::default(),
        })
    }

    /// The device's context (allocate buffers and streams from it).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Loads every kernel file now, so no later launch loads anything.
    pub fn preload(&self) -> Result<(), Error> {
        for m in 0..MODULES.len() {
            self.module(m)?;
        }
        Ok(())
    }

    fn module(&self, m: usize) -> Result<&HashMap<&'static str, CudaFunction>, Error> {
        let entry = self.loaded[m].get_or_init(|| {
            let spec = &MODULES[m];
            let module = self
                .ctx
                .load_module(Ptx::from_binary(spec.fatbin.to_vec()))
                .map_err(drv)?;
            let mut fns = HashMap::new();
            for &name in spec.functions {
                let f = module.load_function(name).map_err(drv)?;
                if m == FLASH {
                    // Its d128 tile needs more than the default 48 KiB of dynamic shared
                    // memory; the limit is per function and must be raised before launch.
                    let p = AttnParams {
                        head_dim: 128,
                        ..AttnParams::default()
                    };
                    let bytes = i32::try_from(p.flash_launch().shared_bytes).unwrap_or(i32::MAX);
                    f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes,
                    )
                    .map_err(drv)?;
                }
                fns.insert(name, f);
            }
            Ok((module, fns))
        });
        match entry {
            Ok((_, fns)) => Ok(fns),
            Err(e) => Err(e.clone()),
        }
    }

    pub(crate) fn function(&self, m: usize, name: &'static str) -> Result<&CudaFunction, Error> {
        self.module(m)?
            .get(name)
            .ok_or_else(|| Error::Driver(format!("kernel {name} missing from its fatbin")))
    }

    /// # Safety
    /// `params` must be what the kernel expects: valid device pointers of this context,
    /// sized as the launch reads and writes them, alive until the stream has run it.
    pub(crate) unsafe fn launch<P>(
        &self,
        f: &CudaFunction,
        l: Launch,
        stream: &CudaStream,
        params: &P,
    ) -> Result<(), Error> {
        if l.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(drv)?;
        // The kernel's one argument is the struct, passed by value: the driver copies
        // `size_of::<P>()` bytes from this pointer during the call.
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: `f` comes from a module of this context; `args` points at a live,
        // #[repr(C)] struct matching the kernel's parameter (the sizes are tested); the
        // memory it names is the caller's promise.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (l.grid[0], l.grid[1], l.grid[2]),
                (l.block[0], l.block[1], l.block[2]),
                l.shared_bytes,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(drv)
    }

    /// write_kv (reshape_and_cache) into pools of `dtype`.
    ///
    /// # Safety
    /// The pointers in `p` are device memory of this context with the sizes its fields
    /// say (see [`WriteKvParams`]); every slot is -1 or inside the pools.
    pub unsafe fn write_kv(
        &self,
        stream: &CudaStream,
        p: &WriteKvParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let name = match dtype {
            Dtype::F32 => "pg_write_kv_f32",
            Dtype::Bf16 => "pg_write_kv_bf16",
            Dtype::F16 => "pg_write_kv_f16",
        };
        let f = self.function(WRITE_KV, name)?;
        // SAFETY: the caller's contract above.
        unsafe { self.launch(f, p.launch(), stream, p) }
    }

    /// naive attention over `p.seq_begin..p.seq_end` (`p.num_rows` token rows).
    ///
    /// # Safety
    /// As [`CudaKernels::write_kv`], for the layouts of [`AttnParams`]: metadata in
    /// device memory, block ids inside the pools, 16-byte aligned rows.
    pub unsafe fn naive(
        &self,
        stream: &CudaStream,
        p: &AttnParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let name = match dtype {
            Dtype::F32 => "pg_naive_f32",
            Dtype::Bf16 => "pg_naive_bf16",
            Dtype::F16 => "pg_naive_f16",
        };
        let f = self.function(NAIVE, name)?;
        // SAFETY: the caller's contract above.
        unsafe { self.launch(f, p.naive_launch(), stream, p) }
    }

    /// Paged decode, plus the merge kernel when `p.num_splits > 1` (then `split_out` and
    /// `split_lse` must hold `SplitPlan::workspace_len` floats).
    ///
    /// # Safety
    /// As [`CudaKernels::naive`]; every launched sequence has exactly one new token and
    /// `num_splits * partition_size` covers its keys (under a sliding window the last
    /// `sliding_window` of them: [`crate::SplitPlan::keys`]).
    pub unsafe fn paged(
        &self,
        stream: &CudaStream,
        p: &AttnParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let d = usize::try_from(p.head_dim).unwrap_or(0);
        let name = match (dtype, d) {
            (Dtype::F32, 64) => "pg_paged_f32_d64",
            (Dtype::F32, 128) => "pg_paged_f32_d128",
            (Dtype::Bf16, 64) => "pg_paged_bf16_d64",
            (Dtype::Bf16, 128) => "pg_paged_bf16_d128",
            (Dtype::Bf16, 256) => "pg_paged_bf16_d256",
            (Dtype::F16, 64) => "pg_paged_f16_d64",
            (Dtype::F16, 128) => "pg_paged_f16_d128",
            (Dtype::F16, 256) => "pg_paged_f16_d256",
            _ => {
                debug_assert!(!paged_head_dims(dtype).contains(&d));
                return Err(Error::Unsupported {
                    kernel: "paged",
                    dtype,
                    head_dim: d,
                });
            }
        };
        let f = self.function(PAGED, name)?;
        // SAFETY: the caller's contract above.
        unsafe { self.launch(f, p.paged_launch(), stream, p)? };
        if p.num_splits > 1 {
            let merge = match dtype {
                Dtype::F32 => "pg_paged_merge_f32",
                Dtype::Bf16 => "pg_paged_merge_bf16",
                Dtype::F16 => "pg_paged_merge_f16",
            };
            let f = self.function(PAGED, merge)?;
            // SAFETY: the caller's contract above; the partials are written by the launch
            // before it on the same stream.
            unsafe { self.launch(f, p.paged_merge_launch(), stream, p)? };
        }
        Ok(())
    }

    /// Flash prefill (bf16/f16, head dims 64/128); `p.max_q_len` sets the grid.
    ///
    /// # Safety
    /// As [`CudaKernels::naive`].
    pub unsafe fn flash(
        &self,
        stream: &CudaStream,
        p: &AttnParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let d = usize::try_from(p.head_dim).unwrap_or(0);
        let name = match (dtype, d) {
            (Dtype::Bf16, 64) => "pg_flash_bf16_d64",
            (Dtype::Bf16, 128) => "pg_flash_bf16_d128",
            (Dtype::F16, 64) => "pg_flash_f16_d64",
            (Dtype::F16, 128) => "pg_flash_f16_d128",
            _ => {
                debug_assert!(!flash_head_dims(dtype).contains(&d));
                return Err(Error::Unsupported {
                    kernel: "flash",
                    dtype,
                    head_dim: d,
                });
            }
        };
        let f = self.function(FLASH, name)?;
        // SAFETY: the caller's contract above.
        unsafe { self.launch(f, p.flash_launch(), stream, p) }
    }

    /// `k`'s function `entry`, its fatbin loaded on first use (and the dynamic shared
    /// memory it opts into raised once per function).
    fn plugin_function(
        &self,
        k: &'static PluginKernel,
        entry: &'static str,
    ) -> Result<CudaFunction, Error> {
        let mut loaded = self
            .plugins
            .lock()
            .map_err(|_| Error::Driver("the plug-in module table is poisoned".into()))?;
        let key = std::ptr::from_ref(k) as usize;
        let m = match loaded.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let fatbin = k.fatbin.ok_or_else(|| {
                    Error::Driver(format!(
                        "kernel {}: its crate was built without its fatbin (no CUDA build)",
                        k.name
                    ))
                })?;
                let module = self
                    .ctx
                    .load_module(Ptx::from_binary(fatbin.to_vec()))
                    .map_err(drv)?;
                e.insert(PluginModule {
                    module,
                    functions: HashMap::new(),
                })
            }
        };
        if let Some(f) = m.functions.get(entry) {
            return Ok(f.clone());
        }
        let f = m.module.load_function(entry).map_err(drv)?;
        if k.max_dyn_shared_bytes > 0 {
            let bytes = i32::try_from(k.max_dyn_shared_bytes).unwrap_or(i32::MAX);
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
            .map_err(drv)?;
        }
        m.functions.insert(entry, f.clone());
        Ok(f)
    }

    /// A backend crate's attention kernel `k` in `dtype` (see [`PluginKernel`]).
    ///
    /// # Safety
    /// As [`CudaKernels::naive`], for the memory `k`'s kernel reads and writes.
    pub unsafe fn plugin(
        &self,
        stream: &CudaStream,
        k: &'static PluginKernel,
        p: &AttnParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let f = self.plugin_function(k, k.entry_of(p, dtype)?)?;
        // SAFETY: the caller's contract above.
        unsafe { self.launch(&f, k.launch_of(p), stream, p) }
    }

    /// One warp's m16n8k16 mma on the tensor cores (compare with [`crate::emu::mma_probe`]).
    ///
    /// # Safety
    /// `p`'s pointers are device memory: a 256 and b 128 elements of `dtype`, c and d 128 f32.
    pub unsafe fn mma_probe(
        &self,
        stream: &CudaStream,
        p: &MmaProbeParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let name = match dtype {
            Dtype::Bf16 => "pg_mma_probe_bf16",
            Dtype::F16 => "pg_mma_probe_f16",
            Dtype::F32 => {
                return Err(Error::Unsupported {
                    kernel: "mma_probe",
                    dtype,
                    head_dim: 0,
                })
            }
        };
        let f = self.function(MMA_PROBE, name)?;
        let l = Launch {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
        };
        // SAFETY: the caller's contract above.
        unsafe { self.launch(f, l, stream, p) }
    }
}
