//! Quantized linear layers: `out = x · wᵀ` with `w` kept at the bits of its GGUF
//! file and `x` quantized to int8 per block of 32 on the fly.
//!
//! **Storage.** Every supported GGUF format (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K; see
//! [`QuantFormat`]) is repacked at load, bit for bit and without widening, into its
//! [`Storage`] kind. All share one formula: each weight is an unsigned integer `u`
//! (4, 6 or 8 bits) with a per-sub-block scale `s` and offset `mn`, `w = s·u + mn`
//! (Q4_0: `mn = -8s`; Q8_0: `u = q + 128`, `mn = -128s`; Q4_K: `s = d·sc`,
//! `mn = -(dmin·m)`; Q6_K: its raw 6-bit `u`, `s = d·sc`, `mn = -32s`, sub-blocks
//! of 16). The kernels derive `s` and `mn` from the stored fields (f16 super-block
//! scales, 6-bit sub-block scales as u8) with the same f32 operations the GGUF
//! dequantizer uses, so the values are those of the file exactly. Rows are grouped
//! into panels of [`QP`] = 16 (one 16-lane vector of outputs); a panel holds the
//! scale fields of every unit as 16-lane vectors, then the integers in groups of 4
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
mod rows;
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
            Self::Q4_0 => Storage::Nibbles0,
            Self::Q4_1 => Storage::Nibbles,
            Self::Q8_0 => Storage::Bytes,
            Self::Q4K => Storage::K4,
            Self::Q6K => Storage::K6,
        }
    }
}

/// How a [`QuantMatrix`] holds its integers and scales, per panel of [`QP`] rows and
/// one *unit* (a block of 32, or a K format's super-block of 256). None widens the
/// file's integers; the bits per weight are the file's except where noted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// Q4_0: 4-bit `u`, an f16 scale per 32, offset `-8·s` (4.5 bits a weight).
    Nibbles0,
    /// Q4_1: 4-bit `u`, an f16 scale and an f16 offset per 32 (5 bits).
    Nibbles,
    /// Q8_0: 8-bit `u = q + 128`, a scale per 32 (f16 from a file: 8.5 bits; f32 when
    /// quantized at load: 9), offset `-128·s`.
    Bytes,
    /// Q4_K: per 256, f16 `d` and `dmin`; per 32, the 6-bit scale and min as u8
    /// (`s = d·sc`, `mn = -(dmin·m)`); 4-bit `u` (4.625 bits against the file's 4.5).
    K4,
    /// Q6_K: per 256, an f16 `d`; per 16, an i8 scale (`s = d·sc`, `mn = -32·s`);
    /// 6-bit `u` as a 4-bit plane and a 2-bit plane (6.5625 bits, the file's).
    K6,
}

/// Where things sit in a panel: units in groups of [`Layout::group`] (1 or 2, so a
/// group is a multiple of 64 bytes), each group the *meta* (scale fields) of its
/// units, padded to 64, then their integers. One sequential stream per panel (a
/// separate meta area read beside the integers measured up to 2x slower), no
/// vector load splitting a cache line, and no byte of padding beyond the group's
/// meta. In a unit's meta every field is a 16-lane vector (one value per row of
/// the panel); see [`Storage`] and `pack.rs` for the fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    pub storage: Storage,
    /// [`Storage::Bytes`] only: scales as f16 (every one is an f16 exactly, as a
    /// Q8_0 file's are), else f32. Every other kind is f16 (K: plus integers).
    pub half: bool,
}

impl Layout {
    /// Elements per unit.
    pub(crate) const fn unit(self) -> usize {
        match self.storage {
            Storage::K4 | Storage::K6 => 256,
            _ => QB,
        }
    }

    /// Meta bytes per unit.
    pub(crate) const fn meta_bytes(self) -> usize {
        match self.storage {
            Storage::Nibbles0 => 2 * QP,
            Storage::Nibbles => 4 * QP,
            Storage::Bytes if self.half => 2 * QP,
            Storage::Bytes => 4 * QP,
            // d, dmin; 8 scales, 8 mins.
            Storage::K4 => 4 * QP + 16 * QP,
            // d; 16 scales.
            Storage::K6 => 2 * QP + 16 * QP,
        }
    }

    /// Integer bytes per block of 32 (a unit holds `unit / 32` of them in order).
    pub(crate) const fn block_quant_bytes(self) -> usize {
        match self.storage {
            Storage::Bytes => QP * QB,
            // The 4-bit plane, then the 2-bit plane.
            Storage::K6 => QP * QB / 2 + QP * QB / 4,
            _ => QP * QB / 2,
        }
    }

    /// Integer bytes per unit (a multiple of 64).
    pub(crate) const fn quant_bytes(self) -> usize {
        self.unit() / QB * self.block_quant_bytes()
    }

    /// Units per group: 2 where one unit's meta is not a multiple of 64 bytes
    /// (32 for Q4_0 and a file's Q8_0, 288 for Q6_K), else 1.
    pub(crate) const fn group(self) -> usize {
        if self.meta_bytes().is_multiple_of(64) {
            1
        } else {
            2
        }
    }

    /// Bytes of a group's meta, padded to 64.
    const fn group_meta(self) -> usize {
        (self.group() * self.meta_bytes()).next_multiple_of(64)
    }

    /// Bytes of a full group.
    const fn group_bytes(self) -> usize {
        self.group_meta() + self.group() * self.quant_bytes()
    }

    /// Where unit `u`'s meta starts in its panel.
    pub(crate) const fn meta_offset(self, u: usize) -> usize {
        u / self.group() * self.group_bytes() + u % self.group() * self.meta_bytes()
    }

    /// Where unit `u`'s integers start in its panel (64-aligned).
    pub(crate) const fn quant_offset(self, u: usize) -> usize {
        u / self.group() * self.group_bytes()
            + self.group_meta()
            + u % self.group() * self.quant_bytes()
    }

    /// Bytes of a panel of `units` units (a multiple of 64): a last group with
    /// fewer units holds only those.
    pub(crate) const fn panel_bytes(self, units: usize) -> usize {
        let rest = units % self.group();
        units / self.group() * self.group_bytes()
            + if rest > 0 {
                self.group_meta() + rest * self.quant_bytes()
            } else {
                0
            }
    }
}

/// One 64-byte piece of a panel, so vector loads never split a cache line.
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
    fn panel(&self, p: usize) -> &[u8] {
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
    /// Every kernel, slowest first.
    pub const ALL: [QuantKernel; 3] = [Self::Portable, Self::Avx2, Self::Avx512Vnni];

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

/// Most rows of activations per register-kernel call (each row's arithmetic is the
/// same whatever the tile height, so this is a speed choice only); longer runs of
/// rows go to `rows` on x86, 4 at a time in the portable kernel.
fn tile_rows(kernel: QuantKernel) -> usize {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        QuantKernel::Avx512Vnni => x86::MR_VNNI,
        #[cfg(target_arch = "x86_64")]
        QuantKernel::Avx2 => x86::MR_AVX2,
        _ => 4,
    }
}

/// Most rows per pass of the x86 pass kernels (`rows.rs`; their accumulators: 64 x
/// 64 bytes on the stack).
const MAX_PASS_ROWS: usize = 64;

/// Rows per pass for rows of `k` elements: a pass's int8 rows and block scalars
/// (`h · k · (1 + 24/32)` bytes) are re-read for every panel, so they stay within
/// about a quarter of a 2 MiB L2.
fn pass_rows(k: usize) -> usize {
    (256 * 1024 / k.max(1)).clamp(8, MAX_PASS_ROWS)
}

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
    let mr = tile_rows(kernel);
    let task = |t: usize| {
        for p in t * per_task..((t + 1) * per_task).min(panels) {
            let cols = QP.min(n - p * QP);
            let recs = w.panel(p);
            let mut r0 = 0;
            while r0 < m {
                // Past the register kernel's tile, the x86 kernels run passes of many
                // rows (each block decoded once per pass); the portable one takes the
                // rest in one call when it fits, else in calls of 4 rows.
                let pass = cfg!(target_arch = "x86_64") && kernel != QuantKernel::Portable;
                let rest = m - r0;
                let h = if rest <= mr {
                    rest
                } else if pass {
                    rest.min(pass_rows(k))
                } else {
                    4
                };
                let t = Tile {
                    layout: w.layout,
                    recs,
                    acts,
                    r0,
                    h,
                    // SAFETY: rows r0..r0+h < m and columns p*QP..p*QP+cols < n lie
                    // inside `out` (checked above); tasks write disjoint panels.
                    out: unsafe { out_ptr.get().add(r0 * ldo + p * QP) },
                    ldo,
                    cols,
                };
                // SAFETY: `kernel` is available (checked above); `recs` is the
                // panel of `w.layout` for `k` columns; `t.out` is valid for h rows
                // of `cols` at `ldo`.
                unsafe {
                    if h > mr {
                        run_pass(kernel, t)
                    } else {
                        run_tile(kernel, t)
                    }
                };
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

/// One micro-kernel call: `h` rows of `acts` from `r0` times one panel `recs` (of
/// `layout`, for `acts.k()` columns), into `h` rows of `cols <= QP` elements at
/// stride `ldo` from `out`.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'a> {
    pub layout: Layout,
    pub recs: &'a [u8],
    pub acts: &'a QuantActs,
    pub r0: usize,
    pub h: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub cols: usize,
}

/// A tile of `h <= tile_rows(kernel)` rows.
///
/// # Safety
/// `kernel` is available; `t.recs` is one panel of `t.layout` for `t.acts.k()`
/// columns; `t.out` is valid for `t.h` rows of `t.cols` elements at stride `t.ldo`.
unsafe fn run_tile(kernel: QuantKernel, t: Tile<'_>) {
    #[cfg(target_arch = "x86_64")]
    match kernel {
        QuantKernel::Avx512Vnni => {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { x86::tile_vnni(t) };
        }
        QuantKernel::Avx2 => {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { x86::tile_avx2(t) };
        }
        QuantKernel::Portable => {}
    }
    let _ = kernel;
    // SAFETY: the caller's contract, forwarded.
    unsafe { portable::tile(t) }
}

/// A pass of more rows than `tile_rows(kernel)` (x86 kernels only; elsewhere
/// never called).
///
/// # Safety
/// As [`run_tile`], and `kernel` is not the portable one.
unsafe fn run_pass(kernel: QuantKernel, t: Tile<'_>) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        rows::tile_rows(kernel, t)
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("{} has no pass form ({} rows)", kernel.name(), t.h);
}
