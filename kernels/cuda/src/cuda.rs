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
//! filled when a module is first used; [`CudaKernels::preload`] fills the library's,
//! [`CudaKernels::load_attn`] an attention kernel's, e.g. before capturing a CUDA graph).

/// The cudarc this crate was built with (allocate buffers and streams with it, so the
/// versions always match).
pub use cudarc;

use crate::attn::AttnKernel;
use crate::params::{AttnParams, Launch, MmaProbeParams, WriteKvParams};
use crate::{Dtype, Error};
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
const MERGE: usize = 1;
const MMA_PROBE: usize = 2;
/// `model.cu` (its launchers are in `cuda_model.rs`, its entry names in `model_entries.rs`).
pub(crate) const MODEL: usize = 3;

/// The library's kernel files but the attention kernels ([`AttnKernel`]s, loaded as
/// any backend crate's are).
static MODULES: [ModuleSpec; 4] = [
    ModuleSpec {
        fatbin: fatbin!("write_kv"),
        functions: &["pg_write_kv_f32", "pg_write_kv_bf16", "pg_write_kv_f16"],
    },
    ModuleSpec {
        fatbin: fatbin!("merge"),
        functions: &[
            "pg_merge_states_f32",
            "pg_merge_states_bf16",
            "pg_merge_states_f16",
        ],
    },
    ModuleSpec {
        fatbin: fatbin!("mma_probe"),
        functions: &["pg_mma_probe_bf16", "pg_mma_probe_f16"],
    },
    ModuleSpec {
        fatbin: fatbin!("model"),
        functions: &crate::model_entries::MODEL_FUNCTIONS,
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
    loaded: [OnceLock<Loaded>; 4],
    /// Attention kernels ([`AttnKernel`]), by the address of their static: the module,
    /// loaded at first use (or by [`CudaKernels::load_attn`]), and the entries looked
    /// up so far.
    attn: Mutex<HashMap<usize, AttnModule>>,
}

/// An [`AttnKernel`]'s loaded fatbin.
struct AttnModule {
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
            attn: Mutex::default(),
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

    /// `merge_states` (`merge.cu`): a split-KV kernel's partitions into `out`/`lse`.
    ///
    /// # Safety
    /// As [`CudaKernels::attn`]; `split_out`/`split_lse` hold `num_splits` partitions of
    /// every launched (sequence, head), written by a launch before it on `stream`.
    pub unsafe fn merge_states(
        &self,
        stream: &CudaStream,
        p: &AttnParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let name = match dtype {
            Dtype::F32 => "pg_merge_states_f32",
            Dtype::Bf16 => "pg_merge_states_bf16",
            Dtype::F16 => "pg_merge_states_f16",
        };
        let f = self.function(MERGE, name)?;
        // SAFETY: the caller's contract above.
        unsafe { self.launch(f, p.merge_states_launch(), stream, p) }
    }

    /// Loads `k`'s fatbin now (an attention backend does when it is created: a missing
    /// image is a construction error, and no module loads inside a graph capture).
    pub fn load_attn(&self, k: &'static AttnKernel) -> Result<(), Error> {
        self.with_attn_module(k, |_| Ok(()))
    }

    /// Runs `f` on `k`'s module, its fatbin loaded on first use.
    fn with_attn_module<R>(
        &self,
        k: &'static AttnKernel,
        f: impl FnOnce(&mut AttnModule) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut loaded = self
            .attn
            .lock()
            .map_err(|_| Error::Driver("the attention module table is poisoned".into()))?;
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
                e.insert(AttnModule {
                    module,
                    functions: HashMap::new(),
                })
            }
        };
        f(m)
    }

    /// `k`'s function `entry` (the dynamic shared memory it opts into raised once per
    /// function).
    fn attn_function(
        &self,
        k: &'static AttnKernel,
        entry: &'static str,
    ) -> Result<CudaFunction, Error> {
        self.with_attn_module(k, |m| {
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
        })
    }

    /// The attention kernel `k` in `dtype` (see [`AttnKernel`]): over
    /// `p.seq_begin..p.seq_end` (`p.num_rows` token rows); a split-KV kernel writes its
    /// partitions for [`CudaKernels::merge_states`] when `p.num_splits > 1`.
    ///
    /// # Safety
    /// As [`CudaKernels::write_kv`], for the layouts of [`AttnParams`] and the memory
    /// `k`'s kernel reads and writes: metadata in device memory, block ids inside the
    /// pools, 16-byte aligned rows where `k` loads vectors, the split workspace for
    /// `num_splits`.
    pub unsafe fn attn(
        &self,
        stream: &CudaStream,
        k: &'static AttnKernel,
        p: &AttnParams,
        dtype: Dtype,
    ) -> Result<(), Error> {
        let f = self.attn_function(k, k.entry_of(p, dtype)?)?;
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
