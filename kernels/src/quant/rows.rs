//! The x86 kernels for many activation rows (prefill, and decode at 6 or more
//! streams on AVX-512, 3 or more on AVX2): each block of a panel's weights is
//! decoded into registers once per pass and multiplied into every row of the
//! pass, whose accumulators live in a stack array. The register kernels
//! (`x86::vnni` up to `MR_VNNI` rows, `x86::avx2` up to `MR_AVX2`) decode the block
//! again for every tile of rows; at 16 rows that was 4 decodes (8 on AVX2, which
//! walked the panel once per half for tiles over 2 rows), and the decode (loads,
//! masks, shifts, and a K format's scales) took about a quarter of the vector
//! instructions. Each row's integer sums are exact and its float steps are the
//! register kernels' (`finish_vnni`, `finish_avx2`) in the same order: the bits are
//! those of every other kernel, whatever the pass height.

use super::act::ActBlock;
use super::layout::{Layout, Storage, QB, QP};
use super::tile::{QuantKernel, Tile, MAX_PASS_ROWS};
use super::x86::{
    finish_avx2, finish_vnni, storage_of, weights_avx2, weights_vnni, HalfMeta, UnitMeta, BY, K4,
    K5, K6, N0, N1,
};
use std::arch::x86_64::*;

/// Most rows per pass: the accumulator arrays' length.
const MAX_ROWS: usize = MAX_PASS_ROWS;

/// A pass of `t.h` (<= [`MAX_ROWS`]) rows with `kernel` (AVX-512 VNNI or AVX2).
///
/// # Safety
/// `kernel` is available and not the portable one; `t` as `run_tile` says.
pub(super) unsafe fn tile_rows(kernel: QuantKernel, t: Tile<'_>) {
    macro_rules! by_layout {
        ($f:ident) => {
            match (t.layout.storage, t.layout.half) {
                (Storage::Nibbles0, _) => $f::<N0, true>(t),
                (Storage::Nibbles, _) => $f::<N1, true>(t),
                (Storage::Bytes, false) => $f::<BY, false>(t),
                (Storage::Bytes, true) => $f::<BY, true>(t),
                (Storage::K4, _) => $f::<K4, true>(t),
                (Storage::K5, _) => $f::<K5, true>(t),
                (Storage::K6, _) => $f::<K6, true>(t),
            }
        };
    }
    // SAFETY: the caller's contract, forwarded (the kernel's features included).
    unsafe {
        match kernel {
            QuantKernel::Avx512Vnni => by_layout!(vnni),
            QuantKernel::Avx2 => by_layout!(avx2),
            QuantKernel::Portable => unreachable!("the portable kernel has no pass form"),
        }
    }
}

/// A pass's geometry, checked against its panel once, and its rows' slab.
struct Pass<'a> {
    t: Tile<'a>,
    lay: Layout,
    units: usize,
    per_unit: usize,
    /// The pass's int8 values and block scalars, row after row, `qs` values and
    /// `bs` blocks apart.
    qp: *const i8,
    bp: *const ActBlock,
    qs: usize,
    bs: usize,
}

impl<'a> Pass<'a> {
    fn new<const S: u8, const F: bool>(t: Tile<'a>) -> Self {
        let lay = Layout {
            storage: storage_of(S),
            half: F,
        };
        let k = t.acts.k();
        let units = k / lay.unit();
        assert!(t.h <= MAX_ROWS && t.recs.len() >= lay.panel_bytes(units));
        // Panics unless rows r0..r0 + h exist.
        let (q, blocks, qs, bs) = t.acts.rows_slab(t.r0, t.h);
        Pass {
            t,
            lay,
            units,
            per_unit: lay.unit() / QB,
            qp: q.as_ptr(),
            bp: blocks.as_ptr(),
            qs,
            bs,
        }
    }
}

/// # Safety
/// As [`tile_rows`], on AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
// Index loops over the 8 groups: the iterator form of the chain (`take`/`skip`)
// compiled to a loop that ran 5x slower.
#[allow(clippy::needless_range_loop)]
unsafe fn vnni<const S: u8, const F: bool>(t: Tile<'_>) {
    let Pass {
        t:
            Tile {
                recs,
                h,
                out,
                ldo,
                cols,
                ..
            },
        lay,
        units,
        per_unit,
        qp,
        bp,
        qs,
        bs,
    } = Pass::new::<S, F>(t);
    let mut acc = [_mm512_setzero_ps(); MAX_ROWS];
    for u in 0..units {
        // SAFETY: u < units: unit u's meta lies inside the panel (checked above).
        let meta = unsafe { UnitMeta::<S, F>::load(recs.as_ptr().add(lay.meta_offset(u))) };
        for j in 0..per_unit {
            let b = u * per_unit + j;
            // SAFETY: unit u's meta, sub-block j < per_unit.
            let (s, mn) = unsafe { meta.scales(j) };
            // SAFETY: block j of unit u's integers lies inside the panel.
            let w = unsafe {
                weights_vnni::<S>(
                    recs.as_ptr()
                        .add(lay.quant_offset(u) + j * lay.block_quant_bytes()),
                )
            };
            for (i, acc) in acc.iter_mut().enumerate().take(h) {
                // SAFETY: i < h and b < k / QB: inside the slab's rows (`rows_slab`).
                let (ab, ap) =
                    unsafe { (&*bp.add(i * bs + b), qp.add(i * qs + b * QB) as *const i32) };
                // SAFETY: group g (< 8) of the block: 4 bytes inside its 32.
                let av = |g: usize| _mm512_set1_epi32(unsafe { ap.add(g).read_unaligned() });
                // One chain a sum: the rows after this one keep the core busy while
                // it waits on vpdpbusd's latency. (Rows interleaved in groups of 4 or
                // 8, each its own chain, measured 10-20 % slower.)
                let isum = |g0: usize, g1: usize| {
                    let mut p = _mm512_setzero_si512();
                    for g in g0..g1 {
                        p = _mm512_dpbusd_epi32(p, w[g], av(g));
                    }
                    p
                };
                *acc = finish_vnni::<S>(*acc, ab, &s, &mn, isum);
            }
        }
    }
    let mask = if cols >= QP {
        u16::MAX
    } else {
        ((1u32 << cols) - 1) as u16
    };
    for (i, acc) in acc.iter().enumerate().take(h) {
        // SAFETY: row i of `out` has `cols` valid elements (caller's contract);
        // the mask stores only those.
        unsafe { _mm512_mask_storeu_ps(out.add(i * ldo), mask, *acc) };
    }
}

/// # Safety
/// As [`tile_rows`], on AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<const S: u8, const F: bool>(t: Tile<'_>) {
    let Pass {
        t:
            Tile {
                recs,
                h,
                out,
                ldo,
                cols,
                ..
            },
        lay,
        units,
        per_unit,
        qp,
        bp,
        qs,
        bs,
    } = Pass::new::<S, F>(t);
    // Both halves of each unit in turn (8 lanes a vector): one stream over the panel.
    let halves = if cols > 8 { 2 } else { 1 };
    let mut acc = [[_mm256_setzero_ps(); MAX_ROWS]; 2];
    for u in 0..units {
        for (half, acc) in acc.iter_mut().enumerate().take(halves) {
            // SAFETY: u < units: unit u's meta lies inside the panel (checked above).
            let meta =
                unsafe { HalfMeta::<S, F>::load(recs.as_ptr().add(lay.meta_offset(u)), half) };
            for j in 0..per_unit {
                let b = u * per_unit + j;
                // SAFETY: unit u's meta, block j < per_unit.
                let (s, mn) = unsafe { meta.scales(j) };
                // SAFETY: this half of block j of unit u's integers lies inside the
                // panel.
                let w = unsafe {
                    weights_avx2::<S>(
                        recs.as_ptr()
                            .add(lay.quant_offset(u) + j * lay.block_quant_bytes() + 32 * half),
                    )
                };
                for (i, acc) in acc.iter_mut().enumerate().take(h) {
                    // SAFETY: i < h and b < k / QB: inside the slab's rows; the block's
                    // 32 int8 values at `ap`.
                    *acc = unsafe {
                        let (ab, ap) = (&*bp.add(i * bs + b), qp.add(i * qs + b * QB));
                        finish_avx2::<S>(*acc, ab, &s, &mn, &w, ap as *const i32)
                    };
                }
            }
        }
    }
    for (half, acc) in acc.iter().enumerate().take(halves) {
        let n = (cols - 8 * half).min(8);
        for (i, acc) in acc.iter().enumerate().take(h) {
            let mut tmp = [0.0f32; 8];
            // SAFETY: `tmp` holds the 8 floats stored.
            unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), *acc) };
            // SAFETY: row i of `out` has `cols` valid elements (caller's contract),
            // of which this half writes `n` from column 8 * half.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(i * ldo + 8 * half), n) };
        }
    }
}
