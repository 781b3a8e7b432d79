//! Launches on the `emu` device from packed parameter structs, as a GPU takes them.
//!
//! [`crate::emu`] takes host slices and checks every length and index first (the
//! kernels' own tests use it). This module is the other entry: the parameter struct
//! the device code path of `pagoda-cuda` packed (the same bytes it hands to
//! `cuda::CudaKernels` on a GPU), launched by kernel family. So a value that a
//! GPU would get wrong (a block table entry, a stride, an address) reaches the
//! emulated kernel exactly as it would reach the GPU's. On top of the emulator's own
//! checks it refuses what a GPU's launch refuses: a block of more than
//! [`MAX_THREADS_PER_BLOCK`] threads, more dynamic shared memory than an sm_90 block
//! may opt into ([`MAX_DYN_SHARED_BYTES`]), a grid's y or z past [`MAX_GRID_YZ`]; and
//! a misaligned 16-byte access inside the kernel is an error after it
//! ([`crate::graph::FAULT_MISALIGNED`]).

use crate::attn::AttnKernel;
use crate::call::Call;
use crate::params::{AttnParams, Launch, WriteKvParams};
use crate::{ffi, graph, invalid, Dtype, Error};

/// Threads per block a GPU launches at most.
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;
/// Dynamic shared memory an sm_90 block may opt into (227 KiB).
pub const MAX_DYN_SHARED_BYTES: u32 = 227 * 1024;
/// Largest grid dimension y and z.
pub const MAX_GRID_YZ: u32 = 65_535;

/// What a GPU's launch of `l` would refuse, as an error naming `kernel`.
pub fn check_launch(kernel: &'static str, l: &Launch) -> Result<(), Error> {
    let threads: u64 = l.block.iter().map(|&b| u64::from(b)).product();
    if threads > MAX_THREADS_PER_BLOCK {
        return Err(invalid(
            "launch",
            format!("{kernel}: {threads} threads per block (a GPU launches at most 1024)"),
        ));
    }
    if l.shared_bytes > MAX_DYN_SHARED_BYTES {
        return Err(invalid(
            "launch",
            format!(
                "{kernel}: {} bytes of dynamic shared memory (an sm_90 block may opt into {MAX_DYN_SHARED_BYTES})",
                l.shared_bytes
            ),
        ));
    }
    if l.grid[1] > MAX_GRID_YZ || l.grid[2] > MAX_GRID_YZ {
        return Err(invalid(
            "launch",
            format!("{kernel}: grid {:?} (y and z are at most 65535)", l.grid),
        ));
    }
    Ok(())
}

/// Launches the attention kernel `k` in `dtype` with the packed `p` (recorded when
/// this thread is capturing, [`crate::graph`]): refused when `k` has no entry for the
/// dtype and head dim or when a GPU would refuse its geometry.
///
/// # Safety
/// As `cuda::CudaKernels::attn` (feature `cuda`), with host addresses: every pointer in
/// `p` names host memory of the sizes its fields imply (metadata as the kernels'
/// `i32`/`i64`, block ids inside the pools for the blocks the sequences use, the split
/// workspace for `num_splits`), alive and unaliased until the launch ran (captured:
/// until the last replay).
pub unsafe fn attn(k: &'static AttnKernel, p: &AttnParams, dtype: Dtype) -> Result<(), Error> {
    k.entry_of(p, dtype)?;
    let l = k.launch_of(p);
    check_launch(k.name, &l)?;
    if l.is_empty() {
        return Ok(());
    }
    let (params, t, run) = (*p, dtype as i32, k.emu);
    // SAFETY: the caller's contract above; the launch copies the struct.
    let rc = graph::launch(k.name, move || unsafe { run(&params, t) });
    let head_dim = usize::try_from(p.head_dim).unwrap_or(0);
    crate::emu::status(k.name, rc, dtype, head_dim)
}

/// Launches `merge_states` in `dtype` with the packed `p`: the partitions a split-KV
/// kernel wrote to `split_out`/`split_lse` (`cu/merge.cu`'s layout) into `out` and `lse`.
///
/// # Safety
/// As [`attn`]; `split_out` and `split_lse` hold `num_splits` partitions of every
/// launched (sequence, head), written before this launch.
pub unsafe fn merge_states(p: &AttnParams, dtype: Dtype) -> Result<(), Error> {
    let l = p.merge_states_launch();
    check_launch("merge_states", &l)?;
    if l.is_empty() {
        return Ok(());
    }
    let (params, t) = (*p, dtype as i32);
    // SAFETY: the caller's contract above; the launch copies the struct.
    let rc = graph::launch("merge_states", move || unsafe {
        ffi::pg_emu_merge_states(&params, t)
    });
    crate::emu::status("merge_states", rc, dtype, 0)
}

/// Launches `write_kv` into pools of `dtype` with the packed `p`.
///
/// # Safety
/// As `cuda::CudaKernels::write_kv`, with host addresses.
pub unsafe fn write_kv(p: &WriteKvParams, dtype: Dtype) -> Result<(), Error> {
    let l = p.launch();
    check_launch("write_kv", &l)?;
    if l.is_empty() {
        return Ok(());
    }
    let (params, t) = (*p, dtype as i32);
    // SAFETY: the caller's contract above.
    let rc = graph::launch("write_kv", move || unsafe {
        ffi::pg_emu_write_kv(&params, t)
    });
    crate::emu::status("write_kv", rc, dtype, 0)
}

/// Launches `c` on the emulator from its packed struct, as `cuda::CudaKernels::call`
/// does on a GPU (recorded when this thread is capturing): the geometry is checked
/// against a GPU's limits first ([`check_launch`]), a misaligned 16-byte access inside
/// the kernel is an error after it.
///
/// # Safety
/// As the GPU launch of `c`, with host addresses: every pointer in the struct names host
/// memory of the sizes its fields imply, every index in it (ids, positions, slots, rows,
/// block ids) inside what it indexes, alive and unaliased until the launch ran
/// (captured: until the last replay).
pub unsafe fn call(c: &Call) -> Result<(), Error> {
    /// A model.cu entry: the struct and two dtype codes (one-dtype kernels ignore the second).
    unsafe fn run_model<P: Copy + 'static>(
        name: &'static str,
        l: Launch,
        p: P,
        (a, b): (Dtype, Dtype),
        f: unsafe extern "C" fn(*const P, i32, i32) -> i32,
    ) -> Result<(), Error> {
        check_launch(name, &l)?;
        if l.is_empty() {
            return Ok(());
        }
        let (a_i, b_i) = (a as i32, b as i32);
        // SAFETY: the caller's contract; the launch copies the struct.
        let rc = graph::launch(name, move || unsafe { f(&p, a_i, b_i) });
        crate::emu::status(name, rc, b, 0)
    }
    /// One-dtype entries in the two-dtype shape of `run_model`.
    macro_rules! one {
        ($f:path, $P:ty) => {{
            unsafe extern "C" fn g(p: *const $P, a: i32, _: i32) -> i32 {
                // SAFETY: forwarded as is.
                unsafe { $f(p, a) }
            }
            g
        }};
    }
    c.check()?;
    let (name, l) = (c.name(), c.launch());
    // SAFETY: (every arm) the caller's contract.
    unsafe {
        match *c {
            Call::Attn(k, ref p, d) => attn(k, p, d),
            Call::MergeStates(ref p, d) => merge_states(p, d),
            Call::WriteKv(ref p, d) => write_kv(p, d),
            Call::Embed(p, w, o) => run_model(name, l, p, (w, o), ffi::pg_emu_embed),
            Call::RmsNorm(p, x, o) => run_model(name, l, p, (x, o), ffi::pg_emu_rms_norm),
            Call::AddRmsNorm(p, x, o) => run_model(name, l, p, (x, o), ffi::pg_emu_add_rms_norm),
            Call::RopeKv(p, t, kv) => run_model(name, l, p, (t, kv), ffi::pg_emu_rope_kv),
            Call::SiluMul(p, t) => run_model(
                name,
                l,
                p,
                (t, t),
                one!(ffi::pg_emu_silu_mul, crate::GluParams),
            ),
            Call::GeluTanhMul(p, t) => run_model(
                name,
                l,
                p,
                (t, t),
                one!(ffi::pg_emu_gelu_tanh_mul, crate::GluParams),
            ),
            Call::Gather(p, x) => run_model(
                name,
                l,
                p,
                (x, x),
                one!(ffi::pg_emu_gather_rows, crate::GatherParams),
            ),
            Call::Argmax(p, x) => run_model(
                name,
                l,
                p,
                (x, x),
                one!(ffi::pg_emu_argmax, crate::ArgmaxParams),
            ),
            Call::Cast(p, s, d) => run_model(name, l, p, (s, d), ffi::pg_emu_cast),
            Call::QkNorm(p, t) => run_model(
                name,
                l,
                p,
                (t, t),
                one!(ffi::pg_emu_qk_norm, crate::QkNormParams),
            ),
            Call::SoftCap(p) => run_model(
                name,
                l,
                p,
                (Dtype::F32, Dtype::F32),
                one!(ffi::pg_emu_soft_cap, crate::SoftCapParams),
            ),
            Call::MoeRoute(p) => run_model(
                name,
                l,
                p,
                (Dtype::F32, Dtype::F32),
                one!(ffi::pg_emu_moe_route, crate::MoeRouteParams),
            ),
            Call::MoeAcc(p, t) => run_model(
                name,
                l,
                p,
                (t, t),
                one!(ffi::pg_emu_moe_acc, crate::MoeAccParams),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One paged decode (1 head of dim 64, one block of 16, f32) with its pools at
    /// `offset` floats into their buffers: `Ok` when aligned, the emulator's fault
    /// otherwise (`paged` loads K/V rows as 16-byte vectors).
    fn paged_with_pools_at(offset: usize) -> Result<Vec<f32>, Error> {
        let (d, bs) = (64usize, 16usize);
        let q = vec![0.5f32; d];
        // The same pool contents whatever the offset.
        let pool = |m: usize| -> Vec<f32> {
            let vals = (0..bs * d).map(|i| (i % m) as f32 * 0.1);
            std::iter::repeat_n(0.0, offset).chain(vals).collect()
        };
        let (kbuf, vbuf) = (pool(7), pool(5));
        for b in [&kbuf, &vbuf] {
            // The system allocator (malloc) aligns to 16 bytes on the targets we build.
            assert_eq!(
                b.as_ptr() as usize % 16,
                0,
                "the test assumes 16-byte aligned Vecs"
            );
        }
        let mut out = vec![0.0f32; d];
        let (qsl, lens, table) = ([0i32, 1], [5i32], [0i32]);
        let p = AttnParams {
            q: q.as_ptr().cast(),
            key_cache: kbuf[offset..].as_ptr().cast(),
            value_cache: vbuf[offset..].as_ptr().cast(),
            out: out.as_mut_ptr().cast(),
            query_start_loc: qsl.as_ptr(),
            seq_lens: lens.as_ptr(),
            block_table: table.as_ptr(),
            seq_begin: 0,
            seq_end: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: d as i32,
            block_size: bs as i32,
            max_blocks_per_seq: 1,
            max_q_len: 1,
            num_splits: 1,
            partition_size: bs as i32,
            scale: 0.125,
            num_rows: 1,
            ..AttnParams::default()
        };
        // SAFETY: every pointer names a live buffer of the sizes the fields imply (one
        // sequence of 5 keys in block 0 of a one-block pool, one row of q and out).
        unsafe { attn(&crate::attn::PAGED, &p, Dtype::F32) }?;
        Ok(out)
    }

    #[test]
    fn a_misaligned_vector_load_fails_as_on_a_gpu() {
        // Vec<f32> from the system allocator is 16-byte aligned: offset 0 and 4 floats
        // keep the rows aligned, 1 float (4 bytes) does not.
        let aligned = paged_with_pools_at(0).unwrap();
        assert!(aligned.iter().all(|x| x.is_finite() && *x != 0.0));
        assert_eq!(paged_with_pools_at(4).unwrap(), aligned);
        let e = paged_with_pools_at(1).unwrap_err().to_string();
        assert!(e.contains("16-byte"), "{e}");
        // The fault was taken by that launch: the next aligned one is clean.
        assert_eq!(paged_with_pools_at(0).unwrap(), aligned);
    }

    #[test]
    fn launches_a_gpu_refuses_are_errors() {
        let ok = Launch {
            grid: [4, 2, 1],
            block: [128, 1, 1],
            shared_bytes: 48 << 10,
        };
        check_launch("k", &ok).unwrap();
        for bad in [
            Launch {
                block: [1025, 1, 1],
                ..ok
            },
            Launch {
                block: [32, 32, 2],
                ..ok
            },
            Launch {
                shared_bytes: MAX_DYN_SHARED_BYTES + 1,
                ..ok
            },
            Launch {
                grid: [1, 65_536, 1],
                ..ok
            },
        ] {
            assert!(check_launch("k", &bad).is_err(), "{bad:?}");
        }
        check_launch(
            "k",
            &Launch {
                shared_bytes: MAX_DYN_SHARED_BYTES,
                block: [1024, 1, 1],
                ..ok
            },
        )
        .unwrap();
    }
}
