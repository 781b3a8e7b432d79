//! Quantized linear layers: `out = x · wᵀ` with `w` kept at (about) the bits of its
//! GGUF file and `x` quantized to int8 per block of 32 on the fly.
//!
//! **Storage.** Every supported GGUF format (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K; see
//! [`QuantFormat`]) is repacked at load, bit for bit, into one of three
//! [`Storage`] kinds sharing one formula: each weight is an unsigned integer `u`
//! (4 or 8 bits) with a per-sub-block scale `s` and offset `mn`, `w = s·u + mn`
//! (Q4_0: `mn = -8s`; Q8_0: `u = q + 128`, `mn = -128s`; Q6_K: its raw 6-bit `u`,
//! `mn = -32s`, sub-blocks of 16). Rows are grouped into panels of [`QP`] = 16
//! (one 16-lane vector of outputs); per block of 32 elements a panel holds its
//! scales and offsets as 16-lane vectors (f16 where every value is an f16 exactly,
//! as a Q4_0/Q4_1/Q8_0 file's are, else f32), then the integers in groups of 4
//! elements per lane (`vpdpbusd`'s shape): the broadcast form of `crate::packed`,
//! with no horizontal sums.
//!
//! **Arithmetic.** With `x ≈ d·a` (`a` int8 per block of 32, see [`QuantActs`]),
//! `Σ w·x ≈ Σ_blocks (s·d)·Σ u·a + mn·(d·Σ a)`. The integer sums are exact on every
//! path (`vpdpbusd` on AVX-512 VNNI, `vpmaddubsw`/`vpmaddwd` on AVX2, plain
//! integers in the portable code) and the float steps are the same fused
//! multiply-adds in the same order, so all three paths give bit-identical
//! results, and a row's result never depends on the rows beside it.
//! The only error against the f32 path on the same (dequantized) weights is the
//! activation rounding: at most `d/2 = max|x_block|/254` per element.

mod act;
mod pack;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use act::QuantActs;

use crate::error::{check_len, KernelError};
use crate::matmul::OutPtr;

/// Output rows (rows of `w`) per panel: one 16-lane vector.
pub const QP: usize = 16;
/// Elements per block (the activation quantization block).
pub const QB: usize = 32;

/// The GGUF block formats that [`QuantMatrix::from_gguf`] takes (llama.cpp's
/// layouts; the same bits the loader would dequantize).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q6K,
}

impl QuantFormat {
    /// Every format.
    pub const ALL: [QuantFormat; 5] = [Self::Q4_0, Self::Q4_1, Self::Q8_0, Self::Q4K, Self::Q6K];

    /// `(elements, bytes)` of one GGUF block.
    pub fn block_layout(self) -> (usize, usize) {
        match self {
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q6K => (256, 210),
        }
    }

    /// llama.cpp's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q6K => "Q6_K",
        }
    }

    /// The storage kind it repacks into.
    pub fn storage(self) -> Storage {
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Q4K => Storage::Nibbles,
            Self::Q8_0 => Storage::Bytes,
            Self::Q6K => Storage::Bytes16,
        }
    }
}

/// How a [`QuantMatrix`] holds its integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// 4-bit `u`, one (scale, offset) per 32 elements: 5 bits per weight with f16
    /// scales, 6 with f32 (see `Layout`).
    Nibbles,
    /// 8-bit `u`, one (scale, offset) per 32 elements: 9 (f16) or 10 bits per weight.
    Bytes,
    /// 8-bit `u`, one (scale, offset) per 16 elements: 10 (f16) or 12 bits per weight.
    Bytes16,
}

impl Storage {
    /// Scale sub-blocks per block of 32.
    pub(crate) const fn subs(self) -> usize {
        match self {
            Self::Bytes16 => 2,
            _ => 1,
        }
    }

    const fn per_byte(self) -> usize {
        match self {
            Self::Nibbles => 2,
            _ => 1,
        }
    }
}

/// Where things sit in a (panel, block) record: per scale sub-block `h`, a 16-lane
/// vector of scales then one of offsets, as f32, or as f16 when every value of the
/// matrix is an f16 exactly (Q4_0, Q4_1 and Q8_0 files store theirs as f16: half
/// the scale bytes, 6 -> 5 bits a weight for nibbles, and the same results bit for
/// bit); then the integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    pub storage: Storage,
    /// Scales and offsets as f16.
    pub half: bool,
}

impl Layout {
    /// Bytes of one scale (or offset).
    pub(crate) const fn scale_bytes(self) -> usize {
        if self.half {
            2
        } else {
            4
        }
    }

    /// Where sub-block `h`'s vector of scales starts; its offsets follow it.
    pub(crate) const fn scale_offset(self, h: usize) -> usize {
        2 * h * QP * self.scale_bytes()
    }

    /// Where sub-block `h`'s vector of offsets starts.
    pub(crate) const fn min_offset(self, h: usize) -> usize {
        self.scale_offset(h) + QP * self.scale_bytes()
    }

    /// Where the integers start (after `subs` scale/offset vector pairs).
    pub(crate) const fn quant_offset(self) -> usize {
        self.scale_offset(self.storage.subs())
    }

    /// Bytes per record: a multiple of 64 in every layout.
    pub(crate) const fn record_bytes(self) -> usize {
        self.quant_offset() + QP * QB / self.storage.per_byte()
    }

    /// Lane `lane`'s value in the scale (or offset) vector at byte `o` of `rec`.
    pub(crate) fn value(self, rec: &[u8], o: usize, lane: usize) -> f32 {
        if self.half {
            half::f16::from_le_bytes([rec[o + 2 * lane], rec[o + 2 * lane + 1]]).to_f32()
        } else {
            pack::f32_at(rec, o + 4 * lane)
        }
    }
}

/// One 64-byte piece of a record, so vector loads never split a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Chunk(pub(crate) [u8; 64]);

/// A weight matrix `[n, k]` in a quantized [`Storage`], packed in panels of [`QP`]
/// rows for [`matmul_quant`].
#[derive(Clone)]
pub struct QuantMatrix {
    n: usize,
    k: usize,
    layout: Layout,
    /// The format it came from (`Q4_1`, ...; `Q8_0` when quantized at load).
    format_name: &'static str,
    /// `n.div_ceil(QP) * k / QB` records of `layout.record_bytes()`.
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

    /// Whether scales and offsets are held as f16 (every one of them is an f16
    /// exactly; see `Layout`), else f32.
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

    fn blocks(&self) -> usize {
        self.k / QB
    }

    /// The records of panel `p`.
    fn panel(&self, p: usize) -> &[u8] {
        let rb = self.layout.record_bytes() / 64;
        let chunks = &self.data[p * self.blocks() * rb..(p + 1) * self.blocks() * rb];
        // SAFETY: `Chunk` is 64 plain bytes with no padding; the slice covers
        // exactly those chunks.
        unsafe { std::slice::from_raw_parts(chunks.as_ptr() as *const u8, chunks.len() * 64) }
    }

    /// Row `r` of `w` as stored, `s·u + mn` per element (bit-identical to the GGUF
    /// dequantization): the embedding lookup of a table tied to the LM head.
    pub fn row_into(&self, r: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        crate::packed::check_row(r, self.n, self.k, dst)?;
        let (panel, lane) = (self.panel(r / QP), r % QP);
        let rb = self.layout.record_bytes();
        for (b, out) in dst.chunks_exact_mut(QB).enumerate() {
            pack::decode_lane(self.layout, &panel[b * rb..(b + 1) * rb], lane, out);
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

/// Which code runs [`matmul_quant`] on this CPU (under `PAGODA_DISABLE_AVX512`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuantKernel {
    /// Plain integer loops; any CPU.
    Portable,
    /// `vpmaddubsw` + `vpmaddwd` on 8-lane vectors (AVX2 + FMA).
    Avx2,
    /// `vpdpbusd` on 16-lane vectors (AVX-512 F/BW/VNNI).
    Avx512Vnni,
}

impl QuantKernel {
    /// The best kernel this CPU runs.
    pub fn detect() -> QuantKernel {
        let isa = crate::Isa::detect();
        if isa.avx512() && crate::isa::avx512_vnni() {
            QuantKernel::Avx512Vnni
        } else if isa.avx2_fma() {
            QuantKernel::Avx2
        } else {
            QuantKernel::Portable
        }
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        self <= QuantKernel::detect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2 (vpmaddubsw)",
            Self::Avx512Vnni => "avx512-vnni (vpdpbusd)",
        }
    }
}

/// `out[m, n] = x[m, k] · wᵀ`: quantizes `x` (into a per-thread buffer reused
/// across calls) and runs [`matmul_quant_acts`] with the detected kernel.
pub fn matmul_quant(
    x: &[f32],
    w: &QuantMatrix,
    out: &mut [f32],
    m: usize,
) -> Result<(), KernelError> {
    matmul_quant_fused(x, std::slice::from_ref(w), out, m)
}

/// [`matmul_quant`] for a matrix stored as consecutive row ranges `parts` (a
/// fused projection whose parts have different formats): `x` is quantized once,
/// each part writes its columns of `out[m, Σ n]`.
pub fn matmul_quant_fused(
    x: &[f32],
    parts: &[QuantMatrix],
    out: &mut [f32],
    m: usize,
) -> Result<(), KernelError> {
    thread_local! {
        static ACTS: std::cell::RefCell<QuantActs> = std::cell::RefCell::new(QuantActs::default());
    }
    let n: usize = parts.iter().map(|p| p.n).sum();
    let k = parts.first().map_or(0, |p| p.k);
    check_len("out", out.len(), m * n)?;
    if let Some(p) = parts.iter().find(|p| p.k != k) {
        return Err(KernelError::ShapeMismatch {
            name: "parts",
            expected: k,
            actual: p.k,
        });
    }
    if m == 0 {
        return Ok(());
    }
    let kernel = QuantKernel::detect();
    ACTS.with_borrow_mut(|acts| {
        acts.quantize(x, m, k)?;
        let mut col = 0;
        for p in parts {
            // Rows at stride n from column `col`: the last row ends at col + p.n.
            let end = (m - 1) * n + col + p.n;
            matmul_quant_acts(acts, p, &mut out[col..end], n, kernel)?;
            col += p.n;
        }
        Ok(())
    })
}

/// Rows of activations per micro-kernel call.
const MR: usize = 4;

/// Below this many multiply-adds a call runs on the calling thread only.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// `out[i * ldo + j] = acts[i] · w[j]` for `j < w.n()`, with `kernel` (refused when
/// this CPU cannot run it). `ldo >= w.n()` lets several matrices write side by side
/// into one output (a fused projection whose parts have different formats).
pub fn matmul_quant_acts(
    acts: &QuantActs,
    w: &QuantMatrix,
    out: &mut [f32],
    ldo: usize,
    kernel: QuantKernel,
) -> Result<(), KernelError> {
    let (m, k, n) = (acts.m(), w.k, w.n);
    if acts.k() != k {
        return Err(KernelError::ShapeMismatch {
            name: "acts",
            expected: k,
            actual: acts.k(),
        });
    }
    if m > 0 && (ldo < n || out.len() < (m - 1) * ldo + n) {
        return Err(KernelError::InvalidArgument {
            name: "out",
            message: format!("{} elements at stride {ldo} for {m} x {n}", out.len()),
        });
    }
    if !kernel.available() {
        return Err(KernelError::InvalidArgument {
            name: "kernel",
            message: format!("{} is not available on this CPU", kernel.name()),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            out[i * ldo..i * ldo + n].fill(0.0);
        }
        return Ok(());
    }
    let panels = n.div_ceil(QP);
    let threads = rayon::current_num_threads();
    let parallel = threads > 1 && m * k * n >= PARALLEL_MIN_MACS;
    let per_task = if parallel {
        panels.div_ceil(threads * 8).max(1)
    } else {
        panels
    };
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |t: usize| {
        for p in t * per_task..((t + 1) * per_task).min(panels) {
            let cols = QP.min(n - p * QP);
            let recs = w.panel(p);
            let mut r0 = 0;
            while r0 < m {
                let h = MR.min(m - r0);
                // SAFETY: rows r0..r0+h < m and columns p*QP..p*QP+cols < n lie
                // inside `out` (checked above); tasks write disjoint panels.
                let o = unsafe { out_ptr.get().add(r0 * ldo + p * QP) };
                // SAFETY: `kernel` is available (checked above); `recs` is the
                // panel's `k / QB` records; `o` is valid for h rows of `cols` at `ldo`.
                unsafe { run_tile(kernel, w.layout, recs, acts, r0, h, o, ldo, cols) };
                r0 += h;
            }
        }
    };
    let tasks = panels.div_ceil(per_task);
    if parallel {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    Ok(())
}

/// `h <= MR` rows of `acts` from `r0` times one panel.
///
/// # Safety
/// `kernel` is available; `recs` holds the panel's records; `out` is valid for `h`
/// rows of `cols` elements at stride `ldo`.
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile(
    kernel: QuantKernel,
    layout: Layout,
    recs: &[u8],
    acts: &QuantActs,
    r0: usize,
    h: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match kernel {
        QuantKernel::Avx512Vnni => {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { x86::tile_vnni(layout, recs, acts, r0, h, out, ldo, cols) };
        }
        QuantKernel::Avx2 => {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { x86::tile_avx2(layout, recs, acts, r0, h, out, ldo, cols) };
        }
        QuantKernel::Portable => {}
    }
    let _ = kernel;
    // SAFETY: the caller's contract, forwarded.
    unsafe { portable::tile(layout, recs, acts, r0, h, out, ldo, cols) }
}
