//! The portable quantized kernel: plain integer dot products per lane, then the
//! same two fused multiply-adds per sub-block as the vector kernels, so its
//! results are bit-identical to theirs (and it is their executable spec).

use super::layout::{Storage, QB, QP};
use super::pack::{block_parts, lane_scales, lane_u};
use super::tile::Tile;

/// `t.h` rows of `t.acts` from `t.r0` times one panel.
///
/// # Safety
/// `t.out` is valid for `t.h` rows of `t.cols <= QP` elements at stride `t.ldo`.
pub(super) unsafe fn tile(t: Tile<'_>) {
    let Tile {
        layout,
        recs,
        acts,
        r0,
        h,
        out,
        ldo,
        cols,
    } = t;
    let storage = layout.storage;
    let per_unit = layout.unit() / QB;
    for i in 0..h {
        let (a, blocks) = (acts.row(r0 + i), acts.row_blocks(r0 + i));
        let mut acc = [0.0f32; QP];
        for (b, ab) in blocks.iter().enumerate() {
            let (meta, q) = block_parts(layout, recs, b);
            let aq = &a[b * QB..(b + 1) * QB];
            for (lane, acc) in acc.iter_mut().enumerate() {
                let mut isum = [0i32; 2];
                for (e, &av) in aq.iter().enumerate() {
                    isum[e / 16] += lane_u(storage, q, lane, e) as i32 * av as i32;
                }
                let (s, mn) = lane_scales(layout, meta, b % per_unit, lane);
                if storage == Storage::K6 {
                    for (hh, &is) in isum.iter().enumerate() {
                        *acc = (is as f32).mul_add(s[hh] * ab.d, *acc);
                        *acc = mn[hh].mul_add(ab.a16[hh], *acc);
                    }
                } else {
                    *acc = ((isum[0] + isum[1]) as f32).mul_add(s[0] * ab.d, *acc);
                    *acc = mn[0].mul_add(ab.a32, *acc);
                }
            }
        }
        // SAFETY: the caller's contract: row i of `out` has `cols` elements.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), out.add(i * ldo), cols) };
    }
}
