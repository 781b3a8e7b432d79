//! The panel codec: one GGUF block written as one lane of a panel, and one lane
//! read back: the slow, obviously-correct side the kernels are checked against.
//! `matrix.rs` builds and reads a `QuantMatrix` through it; it knows only the
//! layout types.
//!
//! A panel (16 rows) holds per unit (one GGUF block: 32 elements, or 256 for the K
//! formats) its *meta*, the scale fields as 16-lane vectors (byte offsets for lane
//! `l`):
//! - Q4_0: f16 `d` at `2l`. Q4_1: f16 `d` at `2l`, f16 `m` at `32 + 2l`.
//! - Q8_0: `d` at `2l` (f16) or `4l` (f32, when quantized at load).
//! - Q4_K and Q5_K: f16 `d` at `2l`, f16 `dmin` at `32 + 2l`; sub-block `j`'s
//!   6-bit scale at `64 + 16j + l` and min at `192 + 16j + l`, as u8.
//! - Q6_K: f16 `d` at `2l`; 16-element sub-block `i`'s i8 scale at `32 + 16i + l`.
//!
//! and per block of 32 its integers in groups of 4 elements (`g = e / 4`), 4 bytes
//! per lane: `vpdpbusd` multiplies such a 64-byte vector by one broadcast group of
//! the activation. With bytes, group `g` is the `g`-th 64-byte vector; with
//! nibbles, vector `t` (0..4) holds group `t` in its low nibbles and group `t + 4`
//! in its high ones (one shift and two masks unpack it). Q6_K's `u` is its low 4
//! bits in that nibble form, then its high 2 bits in two more vectors: vector `c`
//! holds group `4c + s` at bits `2s..2s+2` of each byte. Q5_K's `u` is its low 4
//! bits in the nibble form, then its high bit in one more vector (bytes 256..320
//! of the block) holding group `g` at bit `g` of each byte: element `4g + i` of
//! lane `l` has its high bit at bit `g` of byte `256 + 4l + i`. Group `g` then
//! unpacks with one shift (by `4 - g`), one mask (`0x10`) and one OR into its
//! nibble vector; no shift for group 4.

use super::layout::{Layout, QuantFormat, Storage, QB};
use half::f16;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 6-bit (scale, min) pair `j` (0..8) of a Q4_K or Q5_K block's 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The unsigned integer `u` of element `e` of one GGUF block of `fmt`.
fn block_u(fmt: QuantFormat, b: &[u8], e: usize) -> u8 {
    match fmt {
        // Byte j holds element j (low nibble) and j + 16 (high).
        QuantFormat::Q4_0 => (b[2 + e % 16] >> (4 * (e / 16))) & 0xF,
        QuantFormat::Q4_1 => (b[4 + e % 16] >> (4 * (e / 16))) & 0xF,
        QuantFormat::Q8_0 => (b[2 + e] as i8 as i16 + 128) as u8,
        QuantFormat::Q4K => {
            // Sub-blocks 2g and 2g+1 share 32 bytes: low nibbles, then high nibbles.
            let sb = e / QB;
            (b[16 + 32 * (sb / 2) + e % QB] >> (4 * (sb % 2))) & 0xF
        }
        QuantFormat::Q5K => {
            // e = 64c + 32h + l: the low 4 bits as Q4_K's (from byte 48), the high
            // bit at bit e / 32 of qh[l].
            let (sb, l) = (e / QB, e % QB);
            let lo = (b[48 + 32 * (sb / 2) + l] >> (4 * (sb % 2))) & 0xF;
            lo | (((b[16 + l] >> sb) & 1) << 4)
        }
        QuantFormat::Q6K => {
            // Half n = e / 128, quarter = e % 128 / 32, l = e % 32: the low 4 bits
            // in ql, the high 2 in qh.
            let (n, quarter, l) = (e / 128, e % 128 / 32, e % 32);
            let lo = (b[64 * n + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0xF;
            let hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
            lo | (hi << 4)
        }
    }
}

/// Writes `u` as element `e` (0..32) of lane `lane` into one block's integers.
pub(super) fn put_u(storage: Storage, q: &mut [u8], lane: usize, e: usize, u: u8) {
    let (g, byte) = (e / 4, e % 4);
    match storage {
        Storage::Bytes => q[64 * g + 4 * lane + byte] = u,
        _ => {
            q[64 * (g % 4) + 4 * lane + byte] |= (u & 0xF) << (4 * (g / 4));
            match storage {
                Storage::K5 => q[256 + 4 * lane + byte] |= (u >> 4) << g,
                Storage::K6 => q[256 + 64 * (g / 4) + 4 * lane + byte] |= (u >> 4) << (2 * (g % 4)),
                _ => {}
            }
        }
    }
}

/// The integer `u` of element `e` (0..32) of lane `lane` in one block's integers.
pub(crate) fn lane_u(storage: Storage, q: &[u8], lane: usize, e: usize) -> u8 {
    let (g, byte) = (e / 4, e % 4);
    match storage {
        Storage::Bytes => q[64 * g + 4 * lane + byte],
        _ => {
            let lo = (q[64 * (g % 4) + 4 * lane + byte] >> (4 * (g / 4))) & 0xF;
            match storage {
                Storage::K5 => lo | (((q[256 + 4 * lane + byte] >> g) & 1) << 4),
                Storage::K6 => {
                    lo | (((q[256 + 64 * (g / 4) + 4 * lane + byte] >> (2 * (g % 4))) & 3) << 4)
                }
                _ => lo,
            }
        }
    }
}

/// Lane `lane`'s `(s, mn)` for block `j` of a unit whose meta is `meta`, per
/// sub-block of 16 (index 1 used only by [`Storage::K6`]). The f32 operations are
/// those of the GGUF dequantizer, which the kernels repeat in vector form.
pub(crate) fn lane_scales(
    layout: Layout,
    meta: &[u8],
    j: usize,
    lane: usize,
) -> ([f32; 2], [f32; 2]) {
    let d = || f16_at(meta, 2 * lane);
    match layout.storage {
        Storage::Nibbles0 => ([d(); 2], [-8.0 * d(); 2]),
        Storage::Nibbles => ([d(); 2], [f16_at(meta, 32 + 2 * lane); 2]),
        Storage::Bytes => {
            let s = if layout.half {
                d()
            } else {
                f32::from_le_bytes(meta[4 * lane..4 * lane + 4].try_into().expect("4 bytes"))
            };
            ([s; 2], [-128.0 * s; 2])
        }
        Storage::K4 | Storage::K5 => {
            let (sc, m) = (meta[64 + 16 * j + lane], meta[192 + 16 * j + lane]);
            let s = d() * sc as f32;
            ([s; 2], [-(f16_at(meta, 32 + 2 * lane) * m as f32); 2])
        }
        Storage::K6 => {
            let s = |h: usize| d() * (meta[32 + 16 * (2 * j + h) + lane] as i8) as f32;
            ([s(0), s(1)], [-32.0 * s(0), -32.0 * s(1)])
        }
    }
}

/// Block `b` (of 32 elements) of a panel: its unit's meta and its own integers.
pub(crate) fn block_parts(layout: Layout, panel: &[u8], b: usize) -> (&[u8], &[u8]) {
    let per_unit = layout.unit() / QB;
    let (unit, j) = (b / per_unit, b % per_unit);
    let mo = layout.meta_offset(unit);
    let q0 = layout.quant_offset(unit) + j * layout.block_quant_bytes();
    (
        &panel[mo..mo + layout.meta_bytes()],
        &panel[q0..q0 + layout.block_quant_bytes()],
    )
}

/// Lane `lane` of block `j` of a unit, dequantized (`u·s + mn`, rounded once per
/// step as the GGUF dequantizer does) into `out` (32 elements).
pub(crate) fn decode_lane(
    layout: Layout,
    meta: &[u8],
    q: &[u8],
    j: usize,
    lane: usize,
    out: &mut [f32],
) {
    let (s, mn) = lane_scales(layout, meta, j, lane);
    for (e, o) in out.iter_mut().enumerate() {
        *o = lane_u(layout.storage, q, lane, e) as f32 * s[e / 16] + mn[e / 16];
    }
}

/// Writes one GGUF block of `fmt` (one unit) as lane `lane` of a panel: its meta
/// fields into `meta`, its integers into `quant` (the unit's blocks in order).
pub(super) fn put_block(
    fmt: QuantFormat,
    layout: Layout,
    b: &[u8],
    meta: &mut [u8],
    quant: &mut [u8],
    lane: usize,
) {
    let copy16 = |meta: &mut [u8], at: usize, from: usize| {
        meta[at + 2 * lane..at + 2 * lane + 2].copy_from_slice(&b[from..from + 2]);
    };
    match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q8_0 => copy16(meta, 0, 0),
        QuantFormat::Q4_1 => {
            copy16(meta, 0, 0);
            copy16(meta, 32, 2);
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            copy16(meta, 0, 0);
            copy16(meta, 32, 2);
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &b[4..16]);
                meta[64 + 16 * j + lane] = sc;
                meta[192 + 16 * j + lane] = m;
            }
        }
        QuantFormat::Q6K => {
            copy16(meta, 0, 208);
            for i in 0..16 {
                meta[32 + 16 * i + lane] = b[192 + i];
            }
        }
    }
    let bq = layout.block_quant_bytes();
    for e in 0..layout.unit() {
        put_u(
            layout.storage,
            &mut quant[e / QB * bq..][..bq],
            lane,
            e % QB,
            block_u(fmt, b, e),
        );
    }
}
