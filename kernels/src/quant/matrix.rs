//! [`QuantMatrix`]: a weight matrix held in panels of [`QP`] rows in its file's
//! [`Storage`], built from GGUF blocks (or quantized to Q8_0 at load) and read back
//! row by row, both through the panel codec of `pack`.

use super::layout::{Chunk, Layout, QuantFormat, Storage, QB, QP};
use super::pack;
use crate::error::KernelError;
use half::f16;
use rayon::prelude::*;

/// A weight matrix `[n, k]` in a quantized [`Storage`], packed in panels of [`QP`]
/// rows for [`matmul_quant`](super::matmul_quant).
#[derive(Clone)]
pub struct QuantMatrix {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) layout: Layout,
    /// The format it came from (`Q4_1`, ...; `Q8_0` when quantized at load).
    format_name: &'static str,
    /// `n.div_ceil(QP)` panels of `layout.panel_bytes(units)`.
    data: Vec<Chunk>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("storage", &self.layout.storage)
            .field("f16_scales", &self.layout.half)
            .finish_non_exhaustive()
    }
}

impl QuantMatrix {
    /// Rows of `w` (output columns).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns of `w` (the reduction length, a multiple of [`QB`]).
    pub fn k(&self) -> usize {
        self.k
    }

    pub fn storage(&self) -> Storage {
        self.layout.storage
    }

    /// Whether the scale fields are f16: always for a GGUF file's blocks; for Q8_0
    /// quantized at load, when every scale is an f16 exactly (else f32).
    pub fn f16_scales(&self) -> bool {
        self.layout.half
    }

    /// The format it came from (`Q4_1`, ...; `Q8_0` when quantized at load).
    pub fn format_name(&self) -> &'static str {
        self.format_name
    }

    /// Bytes held, padding included.
    pub fn num_bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// Units (blocks of 32, or super-blocks of 256) per row.
    fn units(&self) -> usize {
        self.k / self.layout.unit()
    }

    /// Panel `p`'s bytes.
    pub(super) fn panel(&self, p: usize) -> &[u8] {
        let pc = self.layout.panel_bytes(self.units()) / 64;
        let chunks = &self.data[p * pc..(p + 1) * pc];
        // SAFETY: `Chunk` is 64 plain bytes with no padding; the slice covers
        // exactly those chunks.
        unsafe { std::slice::from_raw_parts(chunks.as_ptr() as *const u8, chunks.len() * 64) }
    }

    /// Row `r` of `w` as stored, `s·u + mn` per element (bit-identical to the GGUF
    /// dequantization): the embedding lookup of a table tied to the LM head.
    pub fn row_into(&self, r: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        crate::packed::check_row(r, self.n, self.k, dst)?;
        let (panel, lane) = (self.panel(r / QP), r % QP);
        let per_unit = self.layout.unit() / QB;
        for (b, out) in dst.chunks_exact_mut(QB).enumerate() {
            let (meta, quant) = pack::block_parts(self.layout, panel, b);
            pack::decode_lane(self.layout, meta, quant, b % per_unit, lane, out);
        }
        Ok(())
    }

    /// The dequantized `w[n, k]`, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0.0; self.n * self.k];
        for (r, row) in w.chunks_exact_mut(self.k.max(1)).enumerate().take(self.n) {
            // r < n and row has k elements.
            let _ = self.row_into(r, row);
        }
        w
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
                pack::put_block(
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
                    pack::put_u(Storage::Bytes, quant, lane, e, u);
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
