//! The x86 quantized kernels: AVX-512 VNNI (`vpdpbusd`, 16 rows of `w` per vector)
//! and AVX2 (`vpmaddubsw` + `vpmaddwd`, 8 rows per vector, the panel in two
//! halves). Both compute the same exact integer sums as `portable.rs` and then
//! the same fused multiply-adds, so the three agree bit for bit.
//!
//! AVX2's `vpmaddubsw` adds two u8·i8 products into a saturating i16. With nibbles
//! (u <= 15) even eight groups summed in i16 stay below 2^15 (8 · 2 · 15 · 127 =
//! 30480). With bytes (u up to 255) a pair could reach 64770, so the kernel
//! multiplies `q = u - 128` instead, as `|q|` times `a` carrying `q`'s sign (each
//! pair then stays within 2 · 128 · 127), and adds `128·Σa` back.

use super::act::{ActBlock, QuantActs};
use super::{Layout, Storage, QB, QP};
use std::arch::x86_64::*;

const NIB: u8 = 0;
const BYT: u8 = 1;
const B16: u8 = 2;

const fn storage_of(s: u8) -> Storage {
    match s {
        NIB => Storage::Nibbles,
        BYT => Storage::Bytes,
        _ => Storage::Bytes16,
    }
}

/// Picks the monomorphized kernel for (`layout`, `h` in 1..=4).
macro_rules! dispatch {
    ($f:ident, $layout:expr, $h:expr, $($arg:expr),*) => {{
        let l: Layout = $layout;
        macro_rules! by_h {
            ($s:expr, $half:expr) => {
                match $h {
                    1 => $f::<$s, $half, 1>($($arg),*),
                    2 => $f::<$s, $half, 2>($($arg),*),
                    3 => $f::<$s, $half, 3>($($arg),*),
                    _ => $f::<$s, $half, 4>($($arg),*),
                }
            };
        }
        match (l.storage, l.half) {
            (Storage::Nibbles, false) => by_h!(NIB, false),
            (Storage::Nibbles, true) => by_h!(NIB, true),
            (Storage::Bytes, false) => by_h!(BYT, false),
            (Storage::Bytes, true) => by_h!(BYT, true),
            (Storage::Bytes16, false) => by_h!(B16, false),
            (Storage::Bytes16, true) => by_h!(B16, true),
        }
    }};
}

/// `h` (1..=4) rows of `acts` from `r0` times one panel, on AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VNNI available; `recs` holds the panel's `k / QB` records;
/// `out` is valid for `h` rows of `cols <= QP` at stride `ldo`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_vnni(
    layout: Layout,
    recs: &[u8],
    acts: &QuantActs,
    r0: usize,
    h: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    // SAFETY: the caller's contract, forwarded.
    unsafe { dispatch!(vnni, layout, h, recs, acts, r0, out, ldo, cols) }
}

/// As [`tile_vnni`], on AVX2 + FMA.
///
/// # Safety
/// AVX2 and FMA available; otherwise as [`tile_vnni`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_avx2(
    layout: Layout,
    recs: &[u8],
    acts: &QuantActs,
    r0: usize,
    h: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    // SAFETY: the caller's contract, forwarded.
    unsafe { dispatch!(avx2, layout, h, recs, acts, r0, out, ldo, cols) }
}

type Rows<'a, const H: usize> = [(&'a [i8], &'a [ActBlock]); H];

fn rows<const H: usize>(acts: &QuantActs, r0: usize) -> Rows<'_, H> {
    std::array::from_fn(|i| (acts.row(r0 + i), acts.row_blocks(r0 + i)))
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
    let (rb, qo) = (lay.record_bytes(), lay.quant_offset());
    let kb = recs.len() / rb;
    let rows = rows::<H>(acts, r0);
    // Every row has kb blocks of QB int8 (QuantActs' layout), checked once here.
    for (a, blocks) in &rows {
        assert!(a.len() >= kb * QB && blocks.len() >= kb);
    }
    let mut acc = [_mm512_setzero_ps(); H];
    let m4 = _mm512_set1_epi8(0x0F);
    for b in 0..kb {
        // SAFETY: record b of kb lies inside `recs`; every offset below (scale and
        // offset vectors at `lay`'s offsets, 16 lanes of 2 or 4 bytes; integers at
        // qo + 64·g, 64 bytes) stays inside its `rb` bytes.
        let r = unsafe { recs.as_ptr().add(b * rb) };
        // SAFETY: `o` is one of the offsets above: 64 bytes inside the record.
        let ld = |o: usize| unsafe { _mm512_loadu_si512(r.add(o) as *const __m512i) };
        // SAFETY: as for `ld`: 16 f16 (32 bytes) or 16 f32 (64 bytes).
        let ldf = |o: usize| unsafe {
            if F {
                _mm512_cvtph_ps(_mm256_loadu_si256(r.add(o) as *const __m256i))
            } else {
                _mm512_loadu_ps(r.add(o) as *const f32)
            }
        };
        let mut w = [_mm512_setzero_si512(); 8];
        if S == NIB {
            for t in 0..4 {
                let c = ld(qo + 64 * t);
                w[t] = _mm512_and_si512(c, m4);
                w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
            }
        } else {
            for g in 0..8 {
                w[g] = ld(qo + 64 * g);
            }
        }
        for i in 0..H {
            // SAFETY: b < kb, checked against both row buffers above.
            let (ab, ap) = unsafe {
                (
                    &*rows[i].1.as_ptr().add(b),
                    rows[i].0.as_ptr().add(b * QB) as *const i32,
                )
            };
            // SAFETY: group g (< 8) of the block: 4 bytes inside its 32.
            let av = |g: usize| _mm512_set1_epi32(unsafe { ap.add(g).read_unaligned() });
            let d = _mm512_set1_ps(ab.d);
            if S == B16 {
                for hh in 0..2 {
                    let mut s = _mm512_setzero_si512();
                    for g in 4 * hh..4 * hh + 4 {
                        s = _mm512_dpbusd_epi32(s, w[g], av(g));
                    }
                    let (sc, mn) = (ldf(lay.scale_offset(hh)), ldf(lay.min_offset(hh)));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, d), acc[i]);
                    acc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(ab.a16[hh]), acc[i]);
                }
            } else {
                let mut s = _mm512_setzero_si512();
                for g in 0..8 {
                    s = _mm512_dpbusd_epi32(s, w[g], av(g));
                }
                let (sc, mn) = (ldf(lay.scale_offset(0)), ldf(lay.min_offset(0)));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, d), acc[i]);
                acc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(ab.a32), acc[i]);
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
    let (rb, qo) = (lay.record_bytes(), lay.quant_offset());
    let kb = recs.len() / rb;
    let rows = rows::<H>(acts, r0);
    // Every row has kb blocks of QB int8 (QuantActs' layout), checked once here.
    for (a, blocks) in &rows {
        assert!(a.len() >= kb * QB && blocks.len() >= kb);
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    for half in 0..2 {
        let lo = 32 * half;
        if 8 * half >= cols {
            break;
        }
        let mut acc = [_mm256_setzero_ps(); H];
        for b in 0..kb {
            // SAFETY: record b of kb lies inside `recs`; every offset below (lanes
            // 8·half.. of the scale and offset vectors at `lay`'s offsets, 8 lanes
            // of 2 or 4 bytes; integers at qo + 64·g + lo, 32 bytes) stays inside
            // its `rb` bytes.
            let r = unsafe { recs.as_ptr().add(b * rb) };
            // SAFETY: `o` is one of the offsets above: 32 bytes inside the record.
            let ld = |o: usize| unsafe { _mm256_loadu_si256(r.add(o) as *const __m256i) };
            // SAFETY: as for `ld`: 8 f16 (16 bytes) or 8 f32 (32 bytes) from `o`,
            // this half's lanes of the vector.
            let ldf = |o: usize| unsafe {
                let o = o + 8 * half * lay.scale_bytes();
                if F {
                    _mm256_cvtph_ps(_mm_loadu_si128(r.add(o) as *const __m128i))
                } else {
                    _mm256_loadu_ps(r.add(o) as *const f32)
                }
            };
            let mut w = [_mm256_setzero_si256(); 8];
            let mut wa = [_mm256_setzero_si256(); 8];
            if S == NIB {
                for t in 0..4 {
                    let c = ld(qo + 64 * t + lo);
                    w[t] = _mm256_and_si256(c, m4);
                    w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
                }
            } else {
                for g in 0..8 {
                    w[g] = _mm256_xor_si256(ld(qo + 64 * g + lo), flip); // q = u - 128
                    wa[g] = _mm256_abs_epi8(w[g]);
                }
            }
            for i in 0..H {
                // SAFETY: b < kb, checked against both row buffers above.
                let (ab, ap) = unsafe {
                    (
                        &*rows[i].1.as_ptr().add(b),
                        rows[i].0.as_ptr().add(b * QB) as *const i32,
                    )
                };
                // SAFETY: group g (< 8) of the block: 4 bytes inside its 32.
                let av = |g: usize| _mm256_set1_epi32(unsafe { ap.add(g).read_unaligned() });
                let d = _mm256_set1_ps(ab.d);
                // Exact Σ u·a over groups g0..g1 as 8 i32 lanes.
                let isum = |g0: usize, g1: usize, s: i32| {
                    if S == NIB {
                        let mut p = _mm256_maddubs_epi16(w[g0], av(g0));
                        for g in g0 + 1..g1 {
                            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[g], av(g)));
                        }
                        _mm256_madd_epi16(p, ones)
                    } else {
                        let mut p = _mm256_set1_epi32(128 * s);
                        for g in g0..g1 {
                            let sa = _mm256_sign_epi8(av(g), w[g]);
                            let pg = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[g], sa), ones);
                            p = _mm256_add_epi32(p, pg);
                        }
                        p
                    }
                };
                if S == B16 {
                    for hh in 0..2 {
                        let s = isum(4 * hh, 4 * hh + 4, ab.s16[hh]);
                        let (sc, mn) = (ldf(lay.scale_offset(hh)), ldf(lay.min_offset(hh)));
                        acc[i] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sc, d), acc[i]);
                        acc[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(ab.a16[hh]), acc[i]);
                    }
                } else {
                    let s = isum(0, 8, ab.s16[0] + ab.s16[1]);
                    let (sc, mn) = (ldf(lay.scale_offset(0)), ldf(lay.min_offset(0)));
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sc, d), acc[i]);
                    acc[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(ab.a32), acc[i]);
                }
            }
        }
        let n = (cols - 8 * half).min(8);
        for i in 0..H {
            let mut tmp = [0.0f32; 8];
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc[i]);
            // SAFETY: row i of `out` has `cols` valid elements (caller's contract),
            // of which this half writes `n` from column 8 * half.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(i * ldo + 8 * half), n) };
        }
    }
}
