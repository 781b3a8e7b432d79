//! A GGUF (v2/v3) parser over a memory-mapped file: header, metadata key/values,
//! tensor infos and the aligned data section.
//!
//! Every read is bounds-checked against the file, and every count is capped by the
//! bytes left in the file before anything is allocated, so a truncated or corrupt file
//! yields [`ModelError::CorruptGguf`], never a panic or a huge allocation.

use crate::dequant::{self, GgmlType};
use crate::error::ModelError;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions a tensor may have (ggml's GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type as u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v as u64),
            Self::U16(v) => Some(v as u64),
            Self::U32(v) => Some(v as u64),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// Any integer or float type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v as f64),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(v as f64),
            Self::I16(v) => Some(v as f64),
            Self::I32(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions innermost first (`[cols, rows]` for a matrix).
    pub dims: Vec<u64>,
    /// Raw GGML type id (see [`dequant::type_name`]).
    pub ggml_type: u32,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length, when the type is known (unknown types are only rejected on use).
    pub n_bytes: Option<u64>,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file; tensor data stays in the mmap until asked for.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the (aligned) tensor data section.
    pub data_offset: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<GgufTensorInfo>,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
    mmap: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// True if the file at `path` starts with the GGUF magic.
pub fn has_gguf_magic(path: &Path) -> Result<bool, ModelError> {
    use std::io::Read;
    let mut f = File::open(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match f.read(&mut magic[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) => {
                return Err(ModelError::Io {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        }
    }
    Ok(&magic == GGUF_MAGIC)
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let io = |e| ModelError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file is opened read-only; like every mmap-based loader we assume it
        // is not truncated by another process while mapped.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, mmap)
    }

    fn parse(path: &Path, mmap: Mmap) -> Result<Self, ModelError> {
        let mut r = Reader {
            buf: &mmap,
            pos: 0,
            path,
        };
        let magic = r.bytes(4)?;
        if magic != GGUF_MAGIC {
            return Err(r.corrupt("bad magic (not a GGUF file)"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.corrupt(&format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            )));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        // Each KV needs >= 12 bytes, each tensor info >= 24: cap by what is left.
        r.check_count(n_kv, 12, "metadata count")?;
        r.check_count(n_tensors, 24, "tensor count")?;
        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            meta_index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }
        let alignment = match meta_index.get("general.alignment") {
            Some(&i) => match metadata[i].1.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => return Err(r.corrupt("general.alignment is not a power of two")),
            },
            None => DEFAULT_ALIGNMENT,
        };
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.corrupt(&format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64()?);
            }
            let ggml_type = r.u32()?;
            let offset = r.u64()?;
            if offset % alignment != 0 {
                return Err(r.corrupt(&format!(
                    "tensor `{name}` offset {offset} is not aligned to {alignment}"
                )));
            }
            let n_elems = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let n_elems = n_elems
                .ok_or_else(|| r.corrupt(&format!("tensor `{name}` dims {dims:?} overflow")))?;
            let n_bytes = match GgmlType::from_id(ggml_type) {
                Some(t) => Some(dequant::byte_size(t, n_elems).ok_or_else(|| {
                    r.corrupt(&format!(
                        "tensor `{name}` dims {dims:?} do not fit {} blocks",
                        t.name()
                    ))
                })?),
                None => None,
            };
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(r.corrupt(&format!("duplicate tensor `{name}`")));
            }
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
            });
        }
        let data_offset = r.pos.next_multiple_of(alignment as usize) as u64;
        let file_len = mmap.len() as u64;
        for t in &mut tensors {
            t.offset = t
                .offset
                .checked_add(data_offset)
                .ok_or_else(|| r.corrupt("tensor offset overflow"))?;
            let end = t.offset.checked_add(t.n_bytes.unwrap_or(0));
            if end.is_none_or(|e| e > file_len) {
                return Err(r.corrupt(&format!(
                    "tensor `{}` data ({} bytes at {}) runs past the end of the file ({file_len} bytes)",
                    t.name,
                    t.n_bytes.unwrap_or(0),
                    t.offset
                )));
            }
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            alignment,
            data_offset,
            metadata,
            tensors,
            meta_index,
            tensor_index,
            mmap,
        })
    }

    /// The metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor info for `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (for unknown types: empty, since its size is unknown).
    pub fn tensor_data(&self, t: &GgufTensorInfo) -> &[u8] {
        let start = t.offset as usize;
        &self.mmap[start..start + t.n_bytes.unwrap_or(0) as usize]
    }

    /// Hands the pages of `t`'s bytes back to the page cache (they leave this
    /// process's resident set; a later read maps them in again from the file), so
    /// reading a large file tensor by tensor keeps at most one tensor resident.
    pub fn release(&self, t: &GgufTensorInfo) {
        let len = t.n_bytes.unwrap_or(0) as usize;
        if len == 0 {
            return;
        }
        #[cfg(unix)]
        // SAFETY: the map is a read-only shared mapping of a file (`Mmap::map` of a
        // file opened read-only): MADV_DONTNEED only drops pages, which the next
        // access reads again from the file, so every slice into the map keeps its
        // contents (memmap2's warning is about private or written mappings, whose
        // pages would come back zeroed or as the file's). It is advice: a failure
        // changes nothing.
        let _ = unsafe {
            self.mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                t.offset as usize,
                len,
            )
        };
    }

    /// Dequantizes a tensor to f32 (row-major, innermost dim fastest).
    pub fn dequantize(&self, t: &GgufTensorInfo) -> Result<Vec<f32>, ModelError> {
        if t.n_bytes.is_none() {
            return Err(ModelError::UnsupportedTensorType {
                tensor: t.name.clone(),
                ggml_type: dequant::type_name(t.ggml_type),
            });
        }
        let n = usize::try_from(t.n_elements()).map_err(|_| ModelError::CorruptGguf {
            path: self.path.clone(),
            reason: format!("tensor `{}` is too large", t.name),
        })?;
        dequant::dequantize(&t.name, t.ggml_type, self.tensor_data(t), n)
    }
}

/// A cursor over the file bytes whose every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

/// Arrays nested deeper than this are treated as corruption (GGUF uses one level).
const MAX_NESTING: u32 = 4;

impl<'a> Reader<'a> {
    fn corrupt(&self, reason: &str) -> ModelError {
        ModelError::CorruptGguf {
            path: self.path.to_path_buf(),
            reason: format!("{reason} (at byte {})", self.pos),
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| self.corrupt(&format!("truncated: need {n} more bytes")))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ModelError> {
        Ok(self.bytes(N)?.try_into().expect("bytes(N) returns N bytes"))
    }

    fn u32(&mut self) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Fails unless `count` items of at least `min_size` bytes fit in the rest of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), ModelError> {
        let left = (self.buf.len() - self.pos) as u64;
        if count.checked_mul(min_size).is_none_or(|n| n > left) {
            return Err(self.corrupt(&format!(
                "{what} {count} exceeds what {left} remaining bytes can hold"
            )));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String, ModelError> {
        let len = self.u64()?;
        self.check_count(len, 1, "string length")?;
        let b = self.bytes(len as usize)?;
        // Some converters wrote invalid UTF-8 in token lists; keep the file loadable.
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue, ModelError> {
        use GgufValue as V;
        Ok(match ty {
            0 => V::U8(self.array::<1>()?[0]),
            1 => V::I8(self.array::<1>()?[0] as i8),
            2 => V::U16(u16::from_le_bytes(self.array()?)),
            3 => V::I16(i16::from_le_bytes(self.array()?)),
            4 => V::U32(self.u32()?),
            5 => V::I32(i32::from_le_bytes(self.array()?)),
            6 => V::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => V::Bool(false),
                1 => V::Bool(true),
                b => return Err(self.corrupt(&format!("bool value {b}"))),
            },
            8 => V::String(self.string()?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.corrupt("arrays nested too deeply"));
                }
                let elem_ty = self.u32()?;
                let count = self.u64()?;
                let min_size = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    t => return Err(self.corrupt(&format!("unknown array element type {t}"))),
                };
                self.check_count(count, min_size, "array length")?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem_ty, depth + 1)?);
                }
                V::Array(items)
            }
            10 => V::U64(self.u64()?),
            11 => V::I64(i64::from_le_bytes(self.array()?)),
            12 => V::F64(f64::from_le_bytes(self.array()?)),
            t => return Err(self.corrupt(&format!("unknown metadata value type {t}"))),
        })
    }
}
