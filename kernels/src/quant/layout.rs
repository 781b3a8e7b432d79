//! The quantized weights' data layout: the GGUF formats taken ([`QuantFormat`]), the
//! storage kind each repacks into ([`Storage`]), and where a panel keeps each
//! unit's scale fields and integers ([`Layout`]). Plain types and offsets: the
//! packing code, the matrix and every kernel read them; they read nothing back.

/// Output rows (rows of `w`) per panel: one 16-lane vector.
pub const QP: usize = 16;
/// Elements per block (the activation quantization block).
pub const QB: usize = 32;

/// The GGUF block formats that
/// [`QuantMatrix::from_gguf`](super::QuantMatrix::from_gguf) takes (llama.cpp's
/// layouts; the same bits the loader would dequantize).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl QuantFormat {
    /// Every format.
    pub const ALL: [QuantFormat; 6] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];

    /// `(elements, bytes)` of one GGUF block.
    pub fn block_layout(self) -> (usize, usize) {
        match self {
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
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
            Self::Q5K => "Q5_K",
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
            Self::Q5K => Storage::K5,
            Self::Q6K => Storage::K6,
        }
    }
}

/// How a [`QuantMatrix`](super::QuantMatrix) holds its integers and scales, per
/// panel of [`QP`] rows and one *unit* (a block of 32, or a K format's super-block
/// of 256). None widens the file's integers; the bits per weight are the file's
/// except where noted.
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
    /// Q5_K: [`Storage::K4`]'s meta; 5-bit `u` as K4's 4-bit plane and a 1-bit
    /// plane (5.625 bits against the file's 5.5).
    K5,
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
    #[inline]
    pub(crate) const fn unit(self) -> usize {
        match self.storage {
            Storage::K4 | Storage::K5 | Storage::K6 => 256,
            _ => QB,
        }
    }

    /// Meta bytes per unit.
    #[inline]
    pub(crate) const fn meta_bytes(self) -> usize {
        match self.storage {
            Storage::Nibbles0 => 2 * QP,
            Storage::Nibbles => 4 * QP,
            Storage::Bytes if self.half => 2 * QP,
            Storage::Bytes => 4 * QP,
            // d, dmin; 8 scales, 8 mins.
            Storage::K4 | Storage::K5 => 4 * QP + 16 * QP,
            // d; 16 scales.
            Storage::K6 => 2 * QP + 16 * QP,
        }
    }

    /// Integer bytes per block of 32 (a unit holds `unit / 32` of them in order).
    #[inline]
    pub(crate) const fn block_quant_bytes(self) -> usize {
        match self.storage {
            Storage::Bytes => QP * QB,
            // The 4-bit plane, then the 1-bit plane.
            Storage::K5 => QP * QB / 2 + QP * QB / 8,
            // The 4-bit plane, then the 2-bit plane.
            Storage::K6 => QP * QB / 2 + QP * QB / 4,
            _ => QP * QB / 2,
        }
    }

    /// Integer bytes per unit (a multiple of 64).
    #[inline]
    pub(crate) const fn quant_bytes(self) -> usize {
        self.unit() / QB * self.block_quant_bytes()
    }

    /// Units per group: 2 where one unit's meta is not a multiple of 64 bytes
    /// (32 for Q4_0 and a file's Q8_0, 288 for Q6_K), else 1.
    #[inline]
    pub(crate) const fn group(self) -> usize {
        if self.meta_bytes().is_multiple_of(64) {
            1
        } else {
            2
        }
    }

    /// Bytes of a group's meta, padded to 64.
    #[inline]
    const fn group_meta(self) -> usize {
        (self.group() * self.meta_bytes()).next_multiple_of(64)
    }

    /// Bytes of a full group.
    #[inline]
    const fn group_bytes(self) -> usize {
        self.group_meta() + self.group() * self.quant_bytes()
    }

    /// Where unit `u`'s meta starts in its panel.
    #[inline]
    pub(crate) const fn meta_offset(self, u: usize) -> usize {
        u / self.group() * self.group_bytes() + u % self.group() * self.meta_bytes()
    }

    /// Where unit `u`'s integers start in its panel (64-aligned).
    #[inline]
    pub(crate) const fn quant_offset(self, u: usize) -> usize {
        u / self.group() * self.group_bytes()
            + self.group_meta()
            + u % self.group() * self.quant_bytes()
    }

    /// Bytes of a panel of `units` units (a multiple of 64): a last group with
    /// fewer units holds only those.
    #[inline]
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
