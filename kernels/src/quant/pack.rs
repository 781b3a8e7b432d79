//! Repacking GGUF blocks (and quantizing f32 to Q8_0) into the panels of
//! [`QuantMatrix`], and reading one lane back: the slow, obviously-correct side
//! the kernels are checked against.
//!
//! A panel (16 rows) holds per unit (one GGUF block: 32 elements, or 256 for the K
//! formats) its *meta*, the scale fields as 16-lane vectors (byte offsets for lane
//! `l`):
//! - Q4_0: f16 `d` at `2l`. Q4_1: f16 `d` at `2l`, f16 `m` at `32 + 2l`.
//! - Q8_0: `d` at `2l` (f16) or `4l` (f32, when quantized at load).
//! - Q4_K: f16 `d` at `2l`, f16 `dmin` at `32 + 2l`; sub-block `j`'s 6-bit scale
//!   at `64 + 16j + l` and min at `192 + 16j + l`, as u8.
//! - Q6_K: f16 `d` at `2l`; 16-element sub-block `i`'s i8 scale at `32 + 16i + l`.
//!
//! and per block of 32 its integers in groups of 4 elements (`g = e / 4`), 4 bytes
//! per lane: `vpdpbusd` multiplies such a 64-byte vector by one broadcast group of
//! the activation. With bytes, group `g` is the `g`-th 64-byte vector; with
//! nibbles, vector `t` (0..4) holds group `t` in its low nibbles and group `t + 4`
//! in its high ones (one shift and two masks unpack it). Q6_K's `u` is its low 4
//! bits in that nibble form, then its high 2 bits in two more vectors: vector `c`
//! holds group `4c + s` at bits `2s..2s+2` of each byte.

use super::{Chunk, Layout, QuantFormat, QuantMatrix, Storage, QB, QP};
use crate::error::KernelError;
use half::f16;
use rayon::prelude::*;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 6-bit (scale, min) pair `j` (0..8) of a Q4_K block's 12 packed bytes.
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
fn put_u(storage: Storage, q: &mut [u8], lane: usize, e: usize, u: u8) {
    let (g, byte) = (e / 4, e % 4);
    match storage {
        Storage::Bytes => q[64 * g + 4 * lane + byte] = u,
        _ => {
            q[64 * (g % 4) + 4 * lane + byte] |= (u & 0xF) << (4 * (g / 4));
            if storage == Storage::K6 {
                q[256 + 64 * (g / 4) + 4 * lane + byte] |= (u >> 4) << (2 * (g % 4));
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
            if storage == Storage::K6 {
                lo | (((q[256 + 64 * (g / 4) + 4 * lane + byte] >> (2 * (g % 4))) & 3) << 4)
            } else {
                lo
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
        Storage::K4 => {
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
fn put_block(
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
        QuantFormat::Q4K => {
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

impl QuantMatrix {
    /// Repacks `n` rows of `k` elements of `fmt`'s GGUF blocks (`data`, row-major,
    /// as in the file) without changing a bit of what they encode.
    pub fn from_gguf(
        fmt: QuantFormat,
        data: &[u8],
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        let (be, bb) = fmt.block_layout();
        if !k.is_multiple_of(be) {
            return Err(KernelError::InvalidArgument {
                name: "k",
                message: format!("{k} columns are not whole {} blocks of {be}", fmt.name()),
            });
        }
        let row_bytes = k / be * bb;
        crate::error::check_len("data", data.len(), n * row_bytes)?;
        let layout = Layout {
            storage: fmt.storage(),
            half: true,
        };
        Ok(Self::build(
            layout,
            fmt.name(),
            n,
            k,
            |r, unit, meta, quant, lane| {
                put_block(
                    fmt,
                    layout,
                    &data[r * row_bytes + unit * bb..][..bb],
                    meta,
                    quant,
                    lane,
                )
            },
        ))
    }

    /// Quantizes `w[n, k]` (row-major f32) to Q8_0's scheme (per block of 32:
    /// `d = max|w| / 127`, kept in f32 unless every `d` is an f16 exactly, and
    /// `round(w / d)`): `--quantization q8_0`.
    pub fn quantize_q8_0(w: &[f32], n: usize, k: usize) -> Result<Self, KernelError> {
        if !k.is_multiple_of(QB) {
            return Err(KernelError::InvalidArgument {
                name: "k",
                message: format!("{k} columns are not whole blocks of {QB}"),
            });
        }
        crate::error::check_len("w", w.len(), n * k)?;
        let scale = |x: &[f32]| x.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
        let exact = |v: f32| f16::from_f32(v).to_f32().to_bits() == v.to_bits();
        let half = w.par_chunks(QB).all(|x| exact(scale(x)));
        let layout = Layout {
            storage: Storage::Bytes,
            half,
        };
        Ok(Self::build(
            layout,
            "Q8_0",
            n,
            k,
            |r, unit, meta, quant, lane| {
                let x = &w[r * k + unit * QB..][..QB];
                let d = scale(x);
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                if half {
                    meta[2 * lane..2 * lane + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                } else {
                    meta[4 * lane..4 * lane + 4].copy_from_slice(&d.to_le_bytes());
                }
                for (e, &v) in x.iter().enumerate() {
                    let u = ((v * id).round().clamp(-127.0, 127.0) as i16 + 128) as u8;
                    put_u(Storage::Bytes, quant, lane, e, u);
                }
            },
        ))
    }

    /// Packs `n` rows: `put(r, unit, meta, quant, lane)` writes unit `unit` of row
    /// `r` as lane `lane` into that unit's meta and integer bytes.
    fn build(
        layout: Layout,
        format_name: &'static str,
        n: usize,
        k: usize,
        put: impl Fn(usize, usize, &mut [u8], &mut [u8], usize) + Sync,
    ) -> Self {
        let units = k / layout.unit();
        let pb = layout.panel_bytes(units);
        let (mb, qb) = (layout.meta_bytes(), layout.quant_bytes());
        let mut data = vec![Chunk([0; 64]); n.div_ceil(QP) * pb / 64];
        if units > 0 {
            data.par_chunks_mut(pb / 64)
                .enumerate()
                .for_each(|(p, chunks)| {
                    // SAFETY: `Chunk` is 64 plain bytes; the view covers exactly `chunks`,
                    // which this closure borrows mutably and alone.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(
                            chunks.as_mut_ptr() as *mut u8,
                            chunks.len() * 64,
                        )
                    };
                    for lane in 0..QP.min(n - p * QP) {
                        for unit in 0..units {
                            // A unit's meta precedes its integers in its group.
                            let (mo, qo) = (layout.meta_offset(unit), layout.quant_offset(unit));
                            let (head, tail) = bytes.split_at_mut(qo);
                            put(
                                p * QP + lane,
                                unit,
                                &mut head[mo..mo + mb],
                                &mut tail[..qb],
                                lane,
                            );
                        }
                    }
                });
        }
        QuantMatrix {
            n,
            k,
            layout,
            format_name,
            data,
        }
    }
}
