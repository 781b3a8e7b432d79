//! Dequantization of GGML tensor data (as stored in GGUF files) to dense f32.
//!
//! Each supported format has two implementations: a block-wise decoder used by the
//! loader (`decode_block_*`, run in parallel over chunks of blocks with rayon), and a
//! slow per-element reference ([`reference_value`]) that follows the format's formula
//! for one element in isolation. Property tests check the two agree bit for bit.

use crate::error::ModelError;
use half::{bf16, f16};
use rayon::prelude::*;

/// The GGML tensor types (ids as in ggml.h). Only some can be dequantized here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
}

impl GgmlType {
    /// Maps a GGML type id to a type; `None` for ids this crate does not know at all.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The name llama.cpp uses for the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::BF16 => "BF16",
        }
    }

    /// The format of the quantized kernels (`pagoda_kernels::quant`) that runs
    /// this type as stored, if one does.
    pub fn quant_format(self) -> Option<pagoda_kernels::QuantFormat> {
        use pagoda_kernels::QuantFormat as Q;
        Some(match self {
            Self::Q4_0 => Q::Q4_0,
            Self::Q4_1 => Q::Q4_1,
            Self::Q8_0 => Q::Q8_0,
            Self::Q4K => Q::Q4K,
            Self::Q5K => Q::Q5K,
            Self::Q6K => Q::Q6K,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block_layout(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q8_1 => (32, 36),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Q8K => (256, 292),
        }
    }

    /// Whether [`dequantize`] can decode this type.
    pub fn is_supported(self) -> bool {
        !matches!(self, Self::Q8_1 | Self::Q2K | Self::Q3K)
    }
}

/// The raw GGML type id of a quantized kernel's format (the inverse of
/// [`GgmlType::quant_format`]).
pub fn ggml_type_of(fmt: pagoda_kernels::QuantFormat) -> u32 {
    use pagoda_kernels::QuantFormat as Q;
    match fmt {
        Q::Q4_0 => 2,
        Q::Q4_1 => 3,
        Q::Q8_0 => 8,
        Q::Q4K => 12,
        Q::Q5K => 13,
        Q::Q6K => 14,
    }
}

/// A printable name for a raw type id (known name, or `type id N`).
pub fn type_name(id: u32) -> String {
    match GgmlType::from_id(id) {
        Some(t) => t.name().to_string(),
        None => format!("unknown GGML type id {id}"),
    }
}

/// Bytes needed for `n_elems` elements of `ty`, or `None` if `n_elems` is not a whole
/// number of blocks or the size overflows.
pub fn byte_size(ty: GgmlType, n_elems: u64) -> Option<u64> {
    let (bs, ts) = ty.block_layout();
    if !n_elems.is_multiple_of(bs as u64) {
        return None;
    }
    (n_elems / bs as u64).checked_mul(ts as u64)
}

fn unsupported(tensor: &str, ggml_type: u32) -> ModelError {
    ModelError::UnsupportedTensorType {
        tensor: tensor.to_string(),
        ggml_type: type_name(ggml_type),
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Blocks per rayon task: big enough to amortise scheduling, small enough to balance.
const BLOCKS_PER_TASK: usize = 1024;

/// Dequantizes `n_elems` elements of raw type `ggml_type` from `data` (the tensor's
/// bytes). `tensor` names the tensor in errors.
pub fn dequantize(
    tensor: &str,
    ggml_type: u32,
    data: &[u8],
    n_elems: usize,
) -> Result<Vec<f32>, ModelError> {
    let ty = GgmlType::from_id(ggml_type)
        .filter(|t| t.is_supported())
        .ok_or_else(|| unsupported(tensor, ggml_type))?;
    let (bs, ts) = ty.block_layout();
    let need = byte_size(ty, n_elems as u64).ok_or_else(|| ModelError::TensorShape {
        name: tensor.to_string(),
        expected: vec![n_elems.div_ceil(bs) * bs],
        actual: vec![n_elems],
    })?;
    if (data.len() as u64) < need {
        return Err(ModelError::TensorShape {
            name: format!("{tensor} (bytes)"),
            expected: vec![need as usize],
            actual: vec![data.len()],
        });
    }
    let data = &data[..need as usize];
    let mut out = vec![0f32; n_elems];
    let decode = block_decoder(ty);
    out.par_chunks_mut(bs * BLOCKS_PER_TASK)
        .zip(data.par_chunks(ts * BLOCKS_PER_TASK))
        .for_each(|(o, d)| {
            for (ob, db) in o.chunks_exact_mut(bs).zip(d.chunks_exact(ts)) {
                decode(db, ob);
            }
        });
    Ok(out)
}

/// Slow reference: decodes every element on its own with [`reference_value`].
pub fn dequantize_reference(
    tensor: &str,
    ggml_type: u32,
    data: &[u8],
    n_elems: usize,
) -> Result<Vec<f32>, ModelError> {
    let ty = GgmlType::from_id(ggml_type)
        .filter(|t| t.is_supported())
        .ok_or_else(|| unsupported(tensor, ggml_type))?;
    let (bs, ts) = ty.block_layout();
    if !n_elems.is_multiple_of(bs) || data.len() < n_elems / bs * ts {
        return Err(ModelError::TensorShape {
            name: tensor.to_string(),
            expected: vec![n_elems],
            actual: vec![data.len()],
        });
    }
    Ok((0..n_elems)
        .map(|i| reference_value(ty, &data[(i / bs) * ts..(i / bs + 1) * ts], i % bs))
        .collect())
}

type BlockFn = fn(&[u8], &mut [f32]);

fn block_decoder(ty: GgmlType) -> BlockFn {
    match ty {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, o| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q4_0 => decode_q4_0,
        GgmlType::Q4_1 => decode_q4_1,
        GgmlType::Q5_0 => decode_q5_0,
        GgmlType::Q5_1 => decode_q5_1,
        GgmlType::Q8_0 => decode_q8_0,
        GgmlType::Q4K => decode_q4_k,
        GgmlType::Q5K => decode_q5_k,
        GgmlType::Q6K => decode_q6_k,
        GgmlType::Q8K => decode_q8_k,
        _ => unreachable!("dequantize filters unsupported types first"),
    }
}

// Block layouts below are the ggml ones: little-endian, scales first.

fn decode_q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        o[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
        o[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn decode_q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        o[j] = (qs[j] & 0xF) as f32 * d + m;
        o[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

fn decode_q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        o[j] = (((qs[j] & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
        o[j + 16] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

fn decode_q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        o[j] = ((qs[j] & 0xF) as u32 | h0) as f32 * d + m;
        o[j + 16] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
    }
}

fn decode_q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        o[j] = b[2 + j] as i8 as f32 * d;
    }
}

fn decode_q8_k(b: &[u8], o: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..256 {
        o[j] = b[4 + j] as i8 as f32 * d;
    }
}

/// The 6-bit (scale, min) pair `j` (0..8) of a Q4_K/Q5_K block's 12 packed bytes.
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

fn decode_q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Four groups of 64 outputs; each group reads 32 bytes: low nibbles then high nibbles.
    for g in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * g, scales);
        let (sc1, m1) = scale_min_k4(2 * g + 1, scales);
        let (d0, mm0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
        let q = &qs[32 * g..32 * g + 32];
        let out = &mut o[64 * g..64 * g + 64];
        for l in 0..32 {
            out[l] = d0 * (q[l] & 0xF) as f32 - mm0;
            out[l + 32] = d1 * (q[l] >> 4) as f32 - mm1;
        }
    }
}

fn decode_q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    // As Q4_K, plus the 5th bit of output 64g + l (+ 32) at bit 2g (2g + 1) of qh[l].
    for g in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * g, scales);
        let (sc1, m1) = scale_min_k4(2 * g + 1, scales);
        let (d0, mm0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
        let q = &qs[32 * g..32 * g + 32];
        let out = &mut o[64 * g..64 * g + 64];
        for l in 0..32 {
            let h0 = ((qh[l] >> (2 * g)) & 1) << 4;
            let h1 = ((qh[l] >> (2 * g + 1)) & 1) << 4;
            out[l] = d0 * ((q[l] & 0xF) | h0) as f32 - mm0;
            out[l + 32] = d1 * ((q[l] >> 4) | h1) as f32 - mm1;
        }
    }
}

fn decode_q6_k(b: &[u8], o: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = f16_at(b, 208);
    // Two halves of 128 outputs; each uses 64 bytes of ql, 32 of qh, 8 scales.
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        let out = &mut o[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * (sc[is] as i8 as f32) * q1 as f32;
            out[l + 32] = d * (sc[is + 2] as i8 as f32) * q2 as f32;
            out[l + 64] = d * (sc[is + 4] as i8 as f32) * q3 as f32;
            out[l + 96] = d * (sc[is + 6] as i8 as f32) * q4 as f32;
        }
    }
}

/// Slow reference: element `i` of one block of `ty`, derived from the format's
/// definition with no loop structure shared with the block decoders.
pub fn reference_value(ty: GgmlType, b: &[u8], i: usize) -> f32 {
    // Nibble `k` (0..) of a packed array where, within each run of `run` bytes, the
    // first `run` elements are the low nibbles and the next `run` the high nibbles.
    let nib = |qs: &[u8], run: usize, k: usize| -> u32 {
        let byte = qs[(k / (2 * run)) * run + k % run];
        if (k / run).is_multiple_of(2) {
            (byte & 0xF) as u32
        } else {
            (byte >> 4) as u32
        }
    };
    match ty {
        GgmlType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => f16_at(b, 0),
        GgmlType::BF16 => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        GgmlType::Q4_0 => (nib(&b[2..], 16, i) as f32 - 8.0) * f16_at(b, 0),
        GgmlType::Q4_1 => nib(&b[4..], 16, i) as f32 * f16_at(b, 0) + f16_at(b, 2),
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let off = if ty == GgmlType::Q5_0 { 2 } else { 4 };
            // Bit i of qh is the 5th bit of element i.
            let qh = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
            let q = nib(&b[off + 4..], 16, i) | (((qh >> i) & 1) << 4);
            if ty == GgmlType::Q5_0 {
                (q as f32 - 16.0) * f16_at(b, 0)
            } else {
                q as f32 * f16_at(b, 0) + f16_at(b, 2)
            }
        }
        GgmlType::Q8_0 => b[2 + i] as i8 as f32 * f16_at(b, 0),
        GgmlType::Q8K => b[4 + i] as i8 as f32 * f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::Q4K => {
            // 8 sub-blocks of 32, each with its own 6-bit scale and min.
            let sub = i / 32;
            let (sc, m) = scale_min_k4(sub, &b[4..16]);
            let q = nib(&b[16..], 32, i);
            f16_at(b, 0) * sc as f32 * q as f32 - f16_at(b, 2) * m as f32
        }
        GgmlType::Q5K => {
            // Q4_K's scales and 4-bit values (from byte 48), plus a 5th bit: bit i / 32
            // of qh[i % 32] (qh at 16).
            let sub = i / 32;
            let (sc, m) = scale_min_k4(sub, &b[4..16]);
            let q = nib(&b[48..], 32, i) | ((((b[16 + i % 32] >> sub) & 1) as u32) << 4);
            f16_at(b, 0) * sc as f32 * q as f32 - f16_at(b, 2) * m as f32
        }
        GgmlType::Q6K => {
            // Element i: half h = i/128; within it, quarter k = (i%128)/32 and lane l = i%32.
            let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
            let ql = b[64 * h + l + 32 * (k % 2)];
            let lo = if k < 2 { ql & 0xF } else { ql >> 4 };
            let hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
            let q = (lo | (hi << 4)) as i32 - 32;
            let scale = b[192 + 8 * h + l / 16 + 2 * k] as i8;
            f16_at(b, 208) * (scale as f32) * q as f32
        }
        _ => f32::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SUPPORTED: [u32; 12] = [0, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14, 15];

    fn same(a: &[f32], b: &[f32]) -> bool {
        // Bitwise: random bytes may contain NaN scales, which must decode identically.
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Fast block decoders equal the per-element reference exactly on random bytes.
        #[test]
        fn fast_matches_reference(ty_idx in 0usize..SUPPORTED.len(), n_blocks in 1usize..40, seed in any::<u64>()) {
            let id = SUPPORTED[ty_idx];
            let ty = GgmlType::from_id(id).unwrap();
            let (bs, ts) = ty.block_layout();
            let mut s = seed | 1;
            let data: Vec<u8> = (0..n_blocks * ts).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s as u8 }).collect();
            let fast = dequantize("t", id, &data, n_blocks * bs).unwrap();
            let slow = dequantize_reference("t", id, &data, n_blocks * bs).unwrap();
            prop_assert!(same(&fast, &slow), "type {}", ty.name());
        }
    }

    /// A hand-made Q5_K block: each element's value worked out from the format's
    /// definition (`y = d·sc·u - dmin·m`, `u` = 4 low bits | 5th bit << 4).
    #[test]
    fn q5_k_known_block() {
        let mut b = [0u8; 176];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes()); // d
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes()); // dmin
                                                                     // Sub-block 0: sc 3, m 4; sub-block 1: sc 5, m 0 (low 6 bits of bytes 0..8).
        (b[4], b[8], b[5], b[9]) = (3, 4, 5, 0);
        // Sub-block 5: sc = (b[13] & 0xF) | (b[5] >> 6) << 4 = 2 | 16 = 18,
        // m = (b[13] >> 4) | (b[9] >> 6) << 4 = 1 | 32 = 33.
        b[13] = 0x12;
        b[5] |= 1 << 6;
        b[9] |= 2 << 6;
        // qs at 48: element 64c + 32h + l has its low bits in nibble h of qs[32c + l].
        b[48] = 0x9 | (0x6 << 4); // elements 0 (low 9) and 32 (low 6)
        b[48 + 7] = 0xF; // element 7: low 15, high nibble 0 (element 39)
        b[48 + 64 + 3] = 0xA << 4; // element 128 + 32 + 3 = 163 (sub-block 5): low 10
                                   // qh at 16: bit e / 32 of qh[e % 32] is element e's 5th bit.
        b[16] = 1 << 1; // element 32: high bit set; element 0: clear
        b[16 + 7] = 0b11; // elements 7 and 39
        b[16 + 3] = 1 << 5; // element 163
        let y = dequantize("t", 13, &b, 256).unwrap();
        assert_eq!(y[0], 0.5 * 3.0 * 9.0 - 0.25 * 4.0); // 12.5
        assert_eq!(y[7], 0.5 * 3.0 * 31.0 - 0.25 * 4.0); // u = 15 | 16
        assert_eq!(y[32], 0.5 * 5.0 * 22.0); // u = 6 | 16, m = 0
        assert_eq!(y[39], 0.5 * 5.0 * 16.0); // u = 0 | 16
        assert_eq!(y[1], -1.0); // u = 0: -dmin·m
        assert_eq!(y[163], 0.5 * 18.0 * 26.0 - 0.25 * 33.0); // u = 10 | 16
        assert_eq!(y[164], -0.25 * 33.0);
        assert_eq!(y, dequantize_reference("t", 13, &b, 256).unwrap());
    }

    #[test]
    fn unsupported_types_are_named() {
        for (id, name) in [(10u32, "Q2_K"), (99, "99")] {
            match dequantize("blk.0.x", id, &[0; 1024], 256) {
                Err(ModelError::UnsupportedTensorType { tensor, ggml_type }) => {
                    assert_eq!(tensor, "blk.0.x");
                    assert!(ggml_type.contains(name), "{ggml_type}");
                }
                other => panic!("expected UnsupportedTensorType, got {other:?}"),
            }
        }
    }

    #[test]
    fn short_data_is_an_error_not_a_panic() {
        assert!(dequantize("t", 3, &[0; 19], 32).is_err());
        assert!(dequantize("t", 3, &[0; 40], 33).is_err());
    }
}
