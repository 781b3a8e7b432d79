//! The x86 quantized kernels: AVX-512 VNNI (`vpdpbusd`, 16 rows of `w` per vector;
//! up to `MR_VNNI` activation rows in registers, the unit's scales, a block's
//! integers and a row's float steps in helpers that `rows` shares)
//! and AVX2 (`vpmaddubsw` + `vpmaddwd`, 8 rows per vector: up to 2 activation rows
//! walk the panel once, both halves of each unit in turn; 3-4 rows walk it once
//! per half, the second time from cache; more rows go to `rows`). Both compute the same exact integer sums as `portable.rs` and then
//! the same fused multiply-adds, so the three agree bit for bit. The scales come
//! from the stored fields by the f32 operations of `pack::lane_scales`, once per
//! block of 32 for the whole panel (shared by the `H` activation rows).
//!
//! AVX2's `vpmaddubsw` adds two u8·i8 products into a saturating i16. With nibbles
//! (u <= 15) even eight groups summed in i16 stay below 2^15 (8 · 2 · 15 · 127 =
//! 30480). With bytes (u up to 255) a pair could reach 64770, so the kernel
//! multiplies `q = u - 128` instead, as `|q|` times `a` carrying `q`'s sign (each
//! pair then stays within 2 · 128 · 127), and adds `128·Σa` back. Q5_K's 5-bit `u`
//! (<= 31) reaches 4 · 2 · 31 · 127 = 31496 over four groups, so it widens to i32
//! every four groups; Q6_K's 6-bit `u` (<= 63) reaches 2 · 2 · 63 · 127 = 32004
//! over two groups, so it widens every two.

use super::act::{ActBlock, QuantActs};
use super::layout::{Layout, Storage, QB, QP};
use super::tile::Tile;
use std::arch::x86_64::*;

pub(super) const N0: u8 = 0;
pub(super) const N1: u8 = 1;
pub(super) const BY: u8 = 2;
pub(super) const K4: u8 = 3;
pub(super) const K6: u8 = 4;
pub(super) const K5: u8 = 5;

/// Whether `S` has Q4_K's meta (f16 `d` and `dmin`, u8 scales and mins): K4 and K5.
const fn k4_meta(s: u8) -> bool {
    s == K4 || s == K5
}

pub(super) const fn storage_of(s: u8) -> Storage {
    match s {
        N0 => Storage::Nibbles0,
        N1 => Storage::Nibbles,
        BY => Storage::Bytes,
        K4 => Storage::K4,
        K5 => Storage::K5,
        _ => Storage::K6,
    }
}

/// Most rows of activations per call of the AVX-512 kernel: 5 rows (a verify row
/// of 4 drafts) share one decoding of each weight block. Measured on this EPYC (min of
/// 400 calls, A B A B, loaded machine): 5 rows in one call 1.2-1.4x faster than
/// 4 + 1 for Q4_1 (SmolLM2's gate_up and LM head, the 1B gate_up), equal for Q8_0
/// and Q4_K; 6 and 8 rows in one call were no faster than 4 + 2 and 4 + 4, and
/// slower at the 1B shapes. More rows go to `rows`, which decodes each block
/// once for a whole pass of rows.
pub(super) const MR_VNNI: usize = 5;
/// Rows per call of the AVX2 kernel (16 registers: 4 accumulators beside the 8
/// weight vectors).
pub(super) const MR_AVX2: usize = 4;

/// Picks the monomorphized kernel for `layout` and tile height `h`, one of the
/// listed heights.
macro_rules! dispatch {
    ($f:ident, $layout:expr, $h:expr, [$($n:literal),*], $args:tt) => {{
        let l: Layout = $layout;
        macro_rules! by_h {
            ($s:expr, $half:expr) => {{
                let h: usize = $h;
                $(if h == $n {
                    $f::<$s, $half, $n> $args
                } else)* {
                    unreachable!("tile height {h} above the kernel's")
                }
            }};
        }
        match (l.storage, l.half) {
            (Storage::Nibbles0, _) => by_h!(N0, true),
            (Storage::Nibbles, _) => by_h!(N1, true),
            (Storage::Bytes, false) => by_h!(BY, false),
            (Storage::Bytes, true) => by_h!(BY, true),
            (Storage::K4, _) => by_h!(K4, true),
            (Storage::K5, _) => by_h!(K5, true),
            (Storage::K6, _) => by_h!(K6, true),
        }
    }};
}

/// `h` (1..=[`MR_VNNI`]) rows of `acts` from `r0` times one panel, on AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VNNI available; `t` as `run_tile` says.
pub(super) unsafe fn tile_vnni(t: Tile<'_>) {
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        dispatch!(
            vnni,
            t.layout,
            t.h,
            [1, 2, 3, 4, 5],
            (t.recs, t.acts, t.r0, t.out, t.ldo, t.cols)
        )
    }
}

/// As [`tile_vnni`] for `h` in 1..=[`MR_AVX2`], on AVX2 + FMA.
///
/// # Safety
/// AVX2 and FMA available; otherwise as [`tile_vnni`].
pub(super) unsafe fn tile_avx2(t: Tile<'_>) {
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        dispatch!(
            avx2,
            t.layout,
            t.h,
            [1, 2, 3, 4],
            (t.recs, t.acts, t.r0, t.out, t.ldo, t.cols)
        )
    }
}

type Rows<'a, const H: usize> = [(&'a [i8], &'a [ActBlock]); H];

/// The activation rows `r0..r0 + H`, each checked to hold `kb` blocks.
fn rows<const H: usize>(acts: &QuantActs, r0: usize, kb: usize) -> Rows<'_, H> {
    let rows: Rows<'_, H> = std::array::from_fn(|i| (acts.row(r0 + i), acts.row_blocks(r0 + i)));
    for (a, blocks) in &rows {
        assert!(a.len() >= kb * QB && blocks.len() >= kb);
    }
    rows
}

/// The panel's geometry for `k` columns, checked against its length once.
struct Geom {
    units: usize,
    per_unit: usize,
    block_quant_bytes: usize,
}

fn geom(lay: Layout, recs: &[u8], k: usize) -> Geom {
    let units = k / lay.unit();
    assert!(recs.len() >= lay.panel_bytes(units));
    Geom {
        units,
        per_unit: lay.unit() / QB,
        block_quant_bytes: lay.block_quant_bytes(),
    }
}

/// # Safety
/// As [`tile_vnni`] with `h = H`.
///
/// The hot loop reads through raw pointers, as `avx2` does (bounds-checked slices
/// cost 2.6-4x there).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn vnni<const S: u8, const F: bool, const H: usize>(
    recs: &[u8],
    acts: &QuantActs,
    r0: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let lay = Layout {
        storage: storage_of(S),
        half: F,
    };
    let g = geom(lay, recs, acts.k());
    let rows = rows::<H>(acts, r0, g.units * g.per_unit);
    let mut acc = [_mm512_setzero_ps(); H];
    for u in 0..g.units {
        // SAFETY: u < units: unit u's meta lies inside the panel (its length is
        // checked in `geom`).
        let meta = unsafe { UnitMeta::<S, F>::load(recs.as_ptr().add(lay.meta_offset(u))) };
        for j in 0..g.per_unit {
            let b = u * g.per_unit + j;
            // SAFETY: unit u's meta (above), sub-block j < per_unit.
            let (s, mn) = unsafe { meta.scales(j) };
            // SAFETY: block j of unit u's integers, `block_quant_bytes` long,
            // lies inside the panel (checked in `geom`).
            let w = unsafe {
                weights_vnni::<S>(
                    recs.as_ptr()
                        .add(lay.quant_offset(u) + j * g.block_quant_bytes),
                )
            };
            for i in 0..H {
                // SAFETY: b < kb, checked against both row buffers in `rows`.
                let (ab, ap) = unsafe {
                    (
                        &*rows[i].1.as_ptr().add(b),
                        rows[i].0.as_ptr().add(b * QB) as *const i32,
                    )
                };
                // SAFETY: group g (< 8) of the block: 4 bytes inside its 32.
                let av = |g: usize| _mm512_set1_epi32(unsafe { ap.add(g).read_unaligned() });
                // Exact Σ u·a over groups g0..g1 in two independent chains (the
                // integer sum is the same; a decode step waits on vpdpbusd's latency,
                // so one chain of 8 ran up to 1.7x slower).
                let isum = |g0: usize, g1: usize| {
                    let (mut p0, mut p1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    let mid = (g0 + g1) / 2;
                    for (g, h) in (g0..mid).zip(mid..g1) {
                        p0 = _mm512_dpbusd_epi32(p0, w[g], av(g));
                        p1 = _mm512_dpbusd_epi32(p1, w[h], av(h));
                    }
                    _mm512_add_epi32(p0, p1)
                };
                acc[i] = finish_vnni::<S>(acc[i], ab, &s, &mn, isum);
            }
        }
    }
    let mask = if cols >= QP {
        u16::MAX
    } else {
        ((1u32 << cols) - 1) as u16
    };
    for i in 0..H {
        // SAFETY: row i of `out` has `cols` valid elements (caller's contract);
        // the mask stores only those.
        unsafe { _mm512_mask_storeu_ps(out.add(i * ldo), mask, acc[i]) };
    }
}

/// One unit's scale fields as read once per unit: `d` (Q8_0 with f32 scales: f32,
/// else f16) and the second field (Q4_1's `m`, Q4_K's and Q5_K's `dmin`), with the
/// meta's address for the per-sub-block bytes.
pub(super) struct UnitMeta<const S: u8, const F: bool> {
    meta: *const u8,
    d: __m512,
    second: __m512,
}

impl<const S: u8, const F: bool> UnitMeta<S, F> {
    /// # Safety
    /// AVX-512 F available; `meta` is a unit's meta of `Layout { storage_of(S), F }`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    pub(super) unsafe fn load(meta: *const u8) -> Self {
        // SAFETY: 16 f16 (32 bytes) at `o` inside the meta (`pack.rs`' offsets).
        let ldh = |o: usize| unsafe {
            _mm512_cvtph_ps(_mm256_loadu_si256(meta.add(o) as *const __m256i))
        };
        let d = if S == BY && !F {
            // SAFETY: 16 f32 at the start of the meta.
            unsafe { _mm512_loadu_ps(meta as *const f32) }
        } else {
            ldh(0)
        };
        let second = if S == N1 || k4_meta(S) { ldh(32) } else { d };
        UnitMeta { meta, d, second }
    }

    /// Block `j`'s `(s, mn)` per sub-block of 16: `pack::lane_scales`' operations.
    ///
    /// # Safety
    /// AVX-512 F available; `j` is a block of the unit.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    pub(super) unsafe fn scales(&self, j: usize) -> ([__m512; 2], [__m512; 2]) {
        let (d, second, meta) = (self.d, self.second, self.meta);
        // SAFETY: 16 bytes at `o` inside the meta: u8 (or i8) values as f32.
        let ldb = |o: usize, signed: bool| unsafe {
            let v = _mm_loadu_si128(meta.add(o) as *const __m128i);
            _mm512_cvtepi32_ps(if signed {
                _mm512_cvtepi8_epi32(v)
            } else {
                _mm512_cvtepu8_epi32(v)
            })
        };
        match S {
            N0 => ([d; 2], [_mm512_mul_ps(_mm512_set1_ps(-8.0), d); 2]),
            N1 => ([d; 2], [second; 2]),
            BY => ([d; 2], [_mm512_mul_ps(_mm512_set1_ps(-128.0), d); 2]),
            K4 | K5 => {
                let s = _mm512_mul_ps(d, ldb(64 + 16 * j, false));
                let m = _mm512_mul_ps(second, ldb(192 + 16 * j, false));
                let sign = _mm512_set1_epi32(i32::MIN);
                let mn = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), sign));
                ([s; 2], [mn; 2])
            }
            _ => {
                let s = |h: usize| _mm512_mul_ps(d, ldb(32 + 16 * (2 * j + h), true));
                let (s0, s1) = (s(0), s(1));
                let m32 = _mm512_set1_ps(-32.0);
                ([s0, s1], [_mm512_mul_ps(m32, s0), _mm512_mul_ps(m32, s1)])
            }
        }
    }
}

/// The 8 groups of one block's integers for the 16 lanes (`u` as u8), from `q`,
/// the block's start.
///
/// # Safety
/// AVX-512 F/BW available; `q` is a block of `S`'s integers (`block_quant_bytes`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn weights_vnni<const S: u8>(q: *const u8) -> [__m512i; 8] {
    // SAFETY: `o` + 64 <= block_quant_bytes: inside the block's integers.
    let ld = |o: usize| unsafe { _mm512_loadu_si512(q.add(o) as *const __m512i) };
    let (m4, m10, m30) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x10),
        _mm512_set1_epi8(0x30),
    );
    let mut w = [_mm512_setzero_si512(); 8];
    if S == BY {
        for g in 0..8 {
            w[g] = ld(64 * g);
        }
        return w;
    }
    for t in 0..4 {
        let c = ld(64 * t);
        w[t] = _mm512_and_si512(c, m4);
        w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
    }
    if S == K5 {
        let hv = ld(256);
        // Bit g of each byte to bit 4 (the mask drops what the 16-bit shifts carry
        // in from the neighbouring byte).
        let hs = [
            _mm512_slli_epi16(hv, 4),
            _mm512_slli_epi16(hv, 3),
            _mm512_slli_epi16(hv, 2),
            _mm512_slli_epi16(hv, 1),
            hv,
            _mm512_srli_epi16(hv, 1),
            _mm512_srli_epi16(hv, 2),
            _mm512_srli_epi16(hv, 3),
        ];
        for (g, v) in hs.into_iter().enumerate() {
            w[g] = _mm512_or_si512(w[g], _mm512_and_si512(v, m10));
        }
    }
    if S == K6 {
        for c in 0..2 {
            let hv = ld(256 + 64 * c);
            // Bits 2s..2s+2 of each byte to bits 4..6 (the mask drops what the
            // 16-bit shifts carry in from the neighbouring byte).
            let hs = [
                _mm512_slli_epi16(hv, 4),
                _mm512_slli_epi16(hv, 2),
                hv,
                _mm512_srli_epi16(hv, 2),
            ];
            for (sh, v) in hs.into_iter().enumerate() {
                w[4 * c + sh] = _mm512_or_si512(w[4 * c + sh], _mm512_and_si512(v, m30));
            }
        }
    }
    w
}

/// One activation row's block into its accumulator: `isum(g0, g1)` is the exact
/// `Σ u·a` over groups `g0..g1`; then per sub-block the two fused multiply-adds
/// of `portable.rs`, in its order.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
pub(super) fn finish_vnni<const S: u8>(
    mut acc: __m512,
    ab: &ActBlock,
    s: &[__m512; 2],
    mn: &[__m512; 2],
    isum: impl Fn(usize, usize) -> __m512i,
) -> __m512 {
    let da = _mm512_set1_ps(ab.d);
    if S == K6 {
        for hh in 0..2 {
            let p = isum(4 * hh, 4 * hh + 4);
            let sd = _mm512_mul_ps(s[hh], da);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sd, acc);
            acc = _mm512_fmadd_ps(mn[hh], _mm512_set1_ps(ab.a16[hh]), acc);
        }
    } else {
        let p = isum(0, 8);
        let sd = _mm512_mul_ps(s[0], da);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sd, acc);
        acc = _mm512_fmadd_ps(mn[0], _mm512_set1_ps(ab.a32), acc);
    }
    acc
}

/// # Safety
/// As [`tile_avx2`] with `h = H`.
///
/// The hot loop reads through raw pointers (bounds-checked slices cost ~40 % here).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn avx2<const S: u8, const F: bool, const H: usize>(
    recs: &[u8],
    acts: &QuantActs,
    r0: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let lay = Layout {
        storage: storage_of(S),
        half: F,
    };
    let g = geom(lay, recs, acts.k());
    let rows = rows::<H>(acts, r0, g.units * g.per_unit);
    let store = |acc: &[__m256; H], half: usize| {
        let n = (cols - 8 * half).min(8);
        for i in 0..H {
            let mut tmp = [0.0f32; 8];
            // SAFETY: `tmp` holds the 8 floats stored.
            unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), acc[i]) };
            // SAFETY: row i of `out` has `cols` valid elements (caller's contract),
            // of which this half writes `n` from column 8 * half.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(i * ldo + 8 * half), n) };
        }
    };
    if H <= 2 && cols > 8 {
        // Both halves of each unit in turn: one stream over the panel. Two
        // accumulator sets (2·H registers) beside the 8 weight vectors fit the 16
        // registers for H <= 2; each lane's operations are those of the two-pass
        // walk below, in the same order, so the bits are too.
        let mut acc = [[_mm256_setzero_ps(); H]; 2];
        for u in 0..g.units {
            for (half, acc) in acc.iter_mut().enumerate() {
                // SAFETY: AVX2 is available (this function's contract); `u` is a
                // unit of the panel checked by `geom`, the rows by `rows`.
                unsafe { unit_avx2::<S, F, H>(lay, &g, recs, &rows, u, half, acc) };
            }
        }
        store(&acc[0], 0);
        store(&acc[1], 1);
        return;
    }
    // Larger tiles: the panel in two walks, one per half of its lanes (the second
    // reads the panel from cache).
    for half in 0..2 {
        if 8 * half >= cols {
            break;
        }
        let mut acc = [_mm256_setzero_ps(); H];
        for u in 0..g.units {
            // SAFETY: as above.
            unsafe { unit_avx2::<S, F, H>(lay, &g, recs, &rows, u, half, &mut acc) };
        }
        store(&acc, half);
    }
}

/// Unit `u`'s blocks for lanes `8·half..8·half + 8` of the panel, added into `acc`
/// (one 8-lane accumulator per activation row).
///
/// # Safety
/// AVX2, FMA and F16C available; `u < g.units` of the panel `recs` of `lay`
/// (checked against its length by `geom`); `rows` checked by `rows`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn unit_avx2<const S: u8, const F: bool, const H: usize>(
    lay: Layout,
    g: &Geom,
    recs: &[u8],
    rows: &Rows<'_, H>,
    u: usize,
    half: usize,
    acc: &mut [__m256; H],
) {
    // SAFETY: as in `vnni`: unit u's meta inside the panel; this half reads lanes
    // 8·half.. of each field.
    let meta = unsafe { HalfMeta::<S, F>::load(recs.as_ptr().add(lay.meta_offset(u)), half) };
    for j in 0..g.per_unit {
        let b = u * g.per_unit + j;
        // SAFETY: unit u's meta, block j < per_unit.
        let (s, mn) = unsafe { meta.scales(j) };
        // SAFETY: as in `vnni`: block b's integers inside the panel.
        let q = unsafe {
            recs.as_ptr()
                .add(lay.quant_offset(u) + j * g.block_quant_bytes + 32 * half)
        };
        // SAFETY: AVX2 is available (this function's contract); `q` is this half
        // of block b's integers (above).
        let w = unsafe { weights_avx2::<S>(q) };
        for i in 0..H {
            // SAFETY: b < kb, checked against both row buffers in `rows`.
            let (ab, ap) = unsafe {
                (
                    &*rows[i].1.as_ptr().add(b),
                    rows[i].0.as_ptr().add(b * QB) as *const i32,
                )
            };
            // SAFETY: b < kb: the block's 32 bytes lie inside the row.
            acc[i] = unsafe { finish_avx2::<S>(acc[i], ab, &s, &mn, &w, ap) };
        }
    }
}

/// One unit's scale fields for the 8 lanes of one half of the panel, read once
/// per unit (see [`UnitMeta`]).
pub(super) struct HalfMeta<const S: u8, const F: bool> {
    meta: *const u8,
    half: usize,
    d: __m256,
    second: __m256,
}

impl<const S: u8, const F: bool> HalfMeta<S, F> {
    /// # Safety
    /// AVX2, FMA and F16C available; `meta` is a unit's meta of
    /// `Layout { storage_of(S), F }`; `half` is 0 or 1.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn load(meta: *const u8, half: usize) -> Self {
        // SAFETY: 8 f16 (16 bytes) of a 16-lane field at `o` inside the meta.
        let ldh = |o: usize| unsafe {
            _mm256_cvtph_ps(_mm_loadu_si128(meta.add(o + 16 * half) as *const __m128i))
        };
        let d = if S == BY && !F {
            // SAFETY: 8 of the 16 f32 at the start of the meta.
            unsafe { _mm256_loadu_ps((meta as *const f32).add(8 * half)) }
        } else {
            ldh(0)
        };
        let second = if S == N1 || k4_meta(S) { ldh(32) } else { d };
        HalfMeta {
            meta,
            half,
            d,
            second,
        }
    }

    /// Block `j`'s `(s, mn)` for this half's lanes ([`scales_avx2`]).
    ///
    /// # Safety
    /// AVX2 available; `j` is a block of the unit.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn scales(&self, j: usize) -> ([__m256; 2], [__m256; 2]) {
        let (meta, half) = (self.meta, self.half);
        // SAFETY: 8 bytes of a 16-lane u8 (or i8) field at `o` inside the meta.
        let ldb = |o: usize, signed: bool| unsafe {
            let v = _mm_loadl_epi64(meta.add(o + 8 * half) as *const __m128i);
            _mm256_cvtepi32_ps(if signed {
                _mm256_cvtepi8_epi32(v)
            } else {
                _mm256_cvtepu8_epi32(v)
            })
        };
        scales_avx2::<S>(self.d, self.second, j, ldb)
    }
}

/// One activation row's block (scalars `ab`, int8 values at `ap`) times the
/// block's weights `w` for 8 lanes, into `acc`: the exact integer sums, then
/// `portable.rs`' two fused multiply-adds per sub-block, in its order.
///
/// # Safety
/// AVX2, FMA and F16C available; `ap` points at the block's 32 int8 values.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn finish_avx2<const S: u8>(
    mut acc: __m256,
    ab: &ActBlock,
    s: &[__m256; 2],
    mn: &[__m256; 2],
    w: &[__m256i; 8],
    ap: *const i32,
) -> __m256 {
    // SAFETY: the caller's contract.
    let isum = |g0: usize, g1: usize, sa: i32| unsafe { isum_avx2::<S>(w, ap, g0, g1, sa) };
    let da = _mm256_set1_ps(ab.d);
    if S == K6 {
        for hh in 0..2 {
            let p = isum(4 * hh, 4 * hh + 4, ab.s16[hh]);
            let sd = _mm256_mul_ps(s[hh], da);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sd, acc);
            acc = _mm256_fmadd_ps(mn[hh], _mm256_set1_ps(ab.a16[hh]), acc);
        }
    } else {
        let p = isum(0, 8, ab.s16[0] + ab.s16[1]);
        let sd = _mm256_mul_ps(s[0], da);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sd, acc);
        acc = _mm256_fmadd_ps(mn[0], _mm256_set1_ps(ab.a32), acc);
    }
    acc
}

/// Block `j`'s `(s, mn)` per sub-block of 16 for 8 lanes: `pack::lane_scales`'
/// operations. `d` is the unit's first scale field, `second` its second (Q4_1's
/// `m`, Q4_K's and Q5_K's `dmin`); `ldb(o, signed)` reads 8 lanes of a byte field.
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_avx2<const S: u8>(
    d: __m256,
    second: __m256,
    j: usize,
    ldb: impl Fn(usize, bool) -> __m256,
) -> ([__m256; 2], [__m256; 2]) {
    match S {
        N0 => ([d; 2], [_mm256_mul_ps(_mm256_set1_ps(-8.0), d); 2]),
        N1 => ([d; 2], [second; 2]),
        BY => ([d; 2], [_mm256_mul_ps(_mm256_set1_ps(-128.0), d); 2]),
        K4 | K5 => {
            let s = _mm256_mul_ps(d, ldb(64 + 16 * j, false));
            let m = _mm256_mul_ps(second, ldb(192 + 16 * j, false));
            ([s; 2], [_mm256_xor_ps(m, _mm256_set1_ps(-0.0)); 2])
        }
        _ => {
            let s = |h: usize| _mm256_mul_ps(d, ldb(32 + 16 * (2 * j + h), true));
            let (s0, s1) = (s(0), s(1));
            let m32 = _mm256_set1_ps(-32.0);
            ([s0, s1], [_mm256_mul_ps(m32, s0), _mm256_mul_ps(m32, s1)])
        }
    }
}

/// The 8 groups of one block's integers for 8 lanes, from `q` (the block's start
/// plus this half's 32 bytes): `u`, except bytes as `q = u - 128`.
///
/// # Safety
/// AVX2 available; `q` is inside a block of `S`'s integers as said.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn weights_avx2<const S: u8>(q: *const u8) -> [__m256i; 8] {
    // SAFETY: `o` + 32 bytes inside the block (the caller's contract).
    let ld = |o: usize| unsafe { _mm256_loadu_si256(q.add(o) as *const __m256i) };
    let (m4, m10, m30) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x10),
        _mm256_set1_epi8(0x30),
    );
    let mut w = [_mm256_setzero_si256(); 8];
    if S == BY {
        for g in 0..8 {
            w[g] = _mm256_xor_si256(ld(64 * g), _mm256_set1_epi8(-128));
        }
        return w;
    }
    for t in 0..4 {
        let c = ld(64 * t);
        w[t] = _mm256_and_si256(c, m4);
        w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
    }
    if S == K5 {
        // As `weights_vnni`: bit g of each byte to bit 4.
        let hv = ld(256);
        let hs = [
            _mm256_slli_epi16(hv, 4),
            _mm256_slli_epi16(hv, 3),
            _mm256_slli_epi16(hv, 2),
            _mm256_slli_epi16(hv, 1),
            hv,
            _mm256_srli_epi16(hv, 1),
            _mm256_srli_epi16(hv, 2),
            _mm256_srli_epi16(hv, 3),
        ];
        for (g, v) in hs.into_iter().enumerate() {
            w[g] = _mm256_or_si256(w[g], _mm256_and_si256(v, m10));
        }
    }
    if S == K6 {
        for c in 0..2 {
            let hv = ld(256 + 64 * c);
            let hs = [
                _mm256_slli_epi16(hv, 4),
                _mm256_slli_epi16(hv, 2),
                hv,
                _mm256_srli_epi16(hv, 2),
            ];
            for (sh, v) in hs.into_iter().enumerate() {
                w[4 * c + sh] = _mm256_or_si256(w[4 * c + sh], _mm256_and_si256(v, m30));
            }
        }
    }
    w
}

/// Exact `Σ u·a` over groups `g0..g1` as 8 i32 lanes; `sa` is `Σa` over them (the
/// bytes' correction).
///
/// # Safety
/// AVX2 available; `ap` points at a block of 32 int8 activations.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn isum_avx2<const S: u8>(
    w: &[__m256i; 8],
    ap: *const i32,
    g0: usize,
    g1: usize,
    sa: i32,
) -> __m256i {
    // SAFETY: group g (< 8) of the block: 4 bytes inside its 32.
    let av = |g: usize| _mm256_set1_epi32(unsafe { ap.add(g).read_unaligned() });
    let ones = _mm256_set1_epi16(1);
    match S {
        BY => {
            let mut p = _mm256_set1_epi32(128 * sa);
            for g in g0..g1 {
                let wa = _mm256_abs_epi8(w[g]);
                let s = _mm256_sign_epi8(av(g), w[g]);
                p = _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(wa, s), ones));
            }
            p
        }
        K5 | K6 => {
            // Groups per i16 sum (see the module doc): Q5_K's 5-bit `u` four,
            // Q6_K's 6-bit two.
            let per = if S == K5 { 4 } else { 2 };
            let mut p = _mm256_setzero_si256();
            for g in (g0..g1).step_by(per) {
                let mut s = _mm256_maddubs_epi16(w[g], av(g));
                for h in g + 1..g + per {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[h], av(h)));
                }
                p = _mm256_add_epi32(p, _mm256_madd_epi16(s, ones));
            }
            p
        }
        _ => {
            let mut p = _mm256_maddubs_epi16(w[g0], av(g0));
            for g in g0 + 1..g1 {
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[g], av(g)));
            }
            _mm256_madd_epi16(p, ones)
        }
    }
}
