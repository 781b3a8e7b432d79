//! Repacking GGUF blocks (and quantizing f32 to Q8_0) into the panel records of
//! [`QuantMatrix`], and reading one lane back.
//!
//! A record (one panel of [`QP`] rows, one block of [`QB`] elements) is: per scale
//! sub-block, a 16-lane vector of scales then one of offsets (f32, or f16 when the
//! whole matrix's values are f16s exactly: `Layout`); then the integers.
//! Integers come in groups of 4 elements (`g = e / 4`), 4 bytes per lane, a lane
//! per row: `vpdpbusd` multiplies such a 64-byte vector by one broadcast group of
//! the activation. With bytes, group `g` is the `g`-th 64-byte vector; with
//! nibbles, vector `t` (0..4) holds group `t` in its low nibbles and group `t + 4`
//! in its high ones (one shift and two masks unpack it).

use super::{Chunk, Layout, QuantFormat, QuantMatrix, Storage, QB, QP};
use crate::error::KernelError;
use half::f16;
use rayon::prelude::*;

/// One block of 32 elements of one row, in the common form `w = s·u + mn`
/// (`s`/`mn` per 16 elements for [`Storage::Bytes16`], else only index 0 is used).
#[derive(Clone, Copy, Default)]
pub(crate) struct Canon {
    pub u: [u8; QB],
    pub s: [f32; 2],
    pub mn: [f32; 2],
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q4_0/Q4_1's nibble order: byte `j` holds element `j` (low) and `j + 16` (high).
fn nibbles32(qs: &[u8], u: &mut [u8; QB]) {
    for j in 0..16 {
        u[j] = qs[j] & 0xF;
        u[j + 16] = qs[j] >> 4;
    }
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

/// Sub-block `sb` (32 elements) of one GGUF block of `fmt`.
pub(crate) fn canon(fmt: QuantFormat, b: &[u8], sb: usize) -> Canon {
    let mut c = Canon::default();
    match fmt {
        QuantFormat::Q4_0 => {
            let d = f16_at(b, 0);
            nibbles32(&b[2..18], &mut c.u);
            c.s[0] = d;
            c.mn[0] = -8.0 * d;
        }
        QuantFormat::Q4_1 => {
            nibbles32(&b[4..20], &mut c.u);
            c.s[0] = f16_at(b, 0);
            c.mn[0] = f16_at(b, 2);
        }
        QuantFormat::Q8_0 => {
            let d = f16_at(b, 0);
            for (u, &q) in c.u.iter_mut().zip(&b[2..34]) {
                *u = (q as i8 as i16 + 128) as u8;
            }
            c.s[0] = d;
            c.mn[0] = -128.0 * d;
        }
        QuantFormat::Q4K => {
            // Sub-blocks 2g and 2g+1 share 32 bytes: low nibbles, then high nibbles.
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = scale_min_k4(sb, &b[4..16]);
            let q = &b[16 + 32 * (sb / 2)..16 + 32 * (sb / 2) + 32];
            for (u, &v) in c.u.iter_mut().zip(q) {
                *u = if sb.is_multiple_of(2) {
                    v & 0xF
                } else {
                    v >> 4
                };
            }
            c.s[0] = d * sc as f32;
            c.mn[0] = -(dmin * m as f32);
        }
        QuantFormat::Q6K => {
            // Element e: half n = e / 128, quarter = e % 128 / 32, l = e % 32; its
            // low 4 bits in ql, high 2 in qh, scale index e / 16.
            let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208));
            for (i, u) in c.u.iter_mut().enumerate() {
                let e = sb * QB + i;
                let (n, quarter, l) = (e / 128, e % 128 / 32, e % 32);
                let lo = (ql[64 * n + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0xF;
                let hi = (qh[32 * n + l] >> (2 * quarter)) & 3;
                *u = lo | (hi << 4);
            }
            for h in 0..2 {
                c.s[h] = d * (sc[2 * sb + h] as i8) as f32;
                c.mn[h] = -32.0 * c.s[h];
            }
        }
    }
    c
}

impl Canon {
    /// Whether its scales and offsets are f16s exactly (then an f16 record holds them).
    fn f16_exact(&self, storage: Storage) -> bool {
        let exact = |v: f32| f16::from_f32(v).to_f32().to_bits() == v.to_bits();
        (0..storage.subs()).all(|h| exact(self.s[h]) && exact(self.mn[h]))
    }
}

/// Writes `c` as lane `lane` of a record.
fn put(layout: Layout, rec: &mut [u8], lane: usize, c: &Canon) {
    let storage = layout.storage;
    for h in 0..storage.subs() {
        let (so, mo) = (layout.scale_offset(h), layout.min_offset(h));
        if layout.half {
            rec[so + 2 * lane..][..2].copy_from_slice(&f16::from_f32(c.s[h]).to_le_bytes());
            rec[mo + 2 * lane..][..2].copy_from_slice(&f16::from_f32(c.mn[h]).to_le_bytes());
        } else {
            rec[so + 4 * lane..][..4].copy_from_slice(&c.s[h].to_le_bytes());
            rec[mo + 4 * lane..][..4].copy_from_slice(&c.mn[h].to_le_bytes());
        }
    }
    let q = &mut rec[layout.quant_offset()..];
    for (e, &u) in c.u.iter().enumerate() {
        let (g, byte) = (e / 4, e % 4);
        match storage {
            Storage::Nibbles => q[64 * (g % 4) + 4 * lane + byte] |= u << (4 * (g / 4)),
            _ => q[64 * g + 4 * lane + byte] = u,
        }
    }
}

/// Lane `lane` of a record, dequantized (`u·s + mn`, rounded once per step as
/// the GGUF dequantizer does) into `out` (32 elements).
pub(crate) fn decode_lane(layout: Layout, rec: &[u8], lane: usize, out: &mut [f32]) {
    for (e, o) in out.iter_mut().enumerate() {
        let h = if layout.storage == Storage::Bytes16 {
            e / 16
        } else {
            0
        };
        let s = layout.value(rec, layout.scale_offset(h), lane);
        let mn = layout.value(rec, layout.min_offset(h), lane);
        *o = lane_u(layout, rec, lane, e) as f32 * s + mn;
    }
}

/// The integer `u` of element `e` (0..32) of lane `lane` of a record.
pub(crate) fn lane_u(layout: Layout, rec: &[u8], lane: usize, e: usize) -> u8 {
    let storage = layout.storage;
    let q = &rec[layout.quant_offset()..];
    let (g, byte) = (e / 4, e % 4);
    match storage {
        Storage::Nibbles => (q[64 * (g % 4) + 4 * lane + byte] >> (4 * (g / 4))) & 0xF,
        _ => q[64 * g + 4 * lane + byte],
    }
}

/// The f32 at byte `o` of a record.
pub(crate) fn f32_at(rec: &[u8], o: usize) -> f32 {
    f32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]])
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
        Ok(Self::build(fmt.storage(), fmt.name(), n, k, |r, sb| {
            let blk = &data[r * row_bytes + sb * QB / be * bb..][..bb];
            canon(fmt, blk, sb % (be / QB))
        }))
    }

    /// Quantizes `w[n, k]` (row-major f32) to Q8_0's scheme (per block of 32:
    /// `d = max|w| / 127`, kept in f32, and `round(w / d)`): `--quantization q8_0`.
    pub fn quantize_q8_0(w: &[f32], n: usize, k: usize) -> Result<Self, KernelError> {
        if !k.is_multiple_of(QB) {
            return Err(KernelError::InvalidArgument {
                name: "k",
                message: format!("{k} columns are not whole blocks of {QB}"),
            });
        }
        crate::error::check_len("w", w.len(), n * k)?;
        Ok(Self::build(Storage::Bytes, "Q8_0", n, k, |r, sb| {
            let x = &w[r * k + sb * QB..][..QB];
            let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut c = Canon::default();
            for (u, &v) in c.u.iter_mut().zip(x) {
                *u = ((v * id).round().clamp(-127.0, 127.0) as i16 + 128) as u8;
            }
            c.s[0] = d;
            c.mn[0] = -128.0 * d;
            c
        }))
    }

    /// Packs `n` rows, block `sb` of row `r` given by `block(r, sb)`; with f16
    /// scales when every block's are f16s exactly.
    fn build(
        storage: Storage,
        format_name: &'static str,
        n: usize,
        k: usize,
        block: impl Fn(usize, usize) -> Canon + Sync,
    ) -> Self {
        let kb = k / QB;
        let half = (0..n)
            .into_par_iter()
            .all(|r| (0..kb).all(|sb| block(r, sb).f16_exact(storage)));
        let layout = Layout { storage, half };
        let (panels, rb) = (n.div_ceil(QP), layout.record_bytes());
        let mut data = vec![Chunk([0; 64]); panels * kb * rb / 64];
        if kb > 0 {
            data.par_chunks_mut(kb * rb / 64)
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
                        for (sb, rec) in bytes.chunks_exact_mut(rb).enumerate() {
                            put(layout, rec, lane, &block(p * QP + lane, sb));
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
