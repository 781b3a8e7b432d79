//! The paged KV cache: its shape ([`KvCacheSpec`]), its storage ([`KvCache`], typed
//! [`Storage`] on the device the cache was allocated for) and the host write of new
//! K/V rows by slot mapping ([`write_kv`], vLLM's `reshape_and_cache`).
//!
//! Layout (the flash family's NHD): per layer one K pool and one V pool, each
//! `[num_blocks, block_size, num_kv_heads, head_dim]`, row-major, of the spec's dtype.
//! A slot is `block_id * block_size + offset`, so a slot addresses one
//! `[num_kv_heads, head_dim]` row of a pool.
//!
//! The pools' element type is chosen by `--kv-cache-dtype` ([`KvCacheDtype`]): a
//! 16-bit cache holds twice the tokens in the same memory and halves the bytes a
//! decode step reads; an fp8 (E4M3) cache holds four times the f32 tokens. K/V rows
//! are rounded to it (nearest even) when written; fp8 uses vLLM's default scale
//! 1.0 (no calibration), so values beyond ±448 are clamped to ±448.

mod dtype;

pub use dtype::KvCacheDtype;

use crate::device::DeviceRuntime;
use crate::tensor::{scatter_rows, DType, Device, Shape, Storage, TensorMut, TensorRef};
use crate::CoreError;

// Beside the cache, not the type: the parse fails with a `CoreError`, and the error
// type names `dtype` (its valid values), so `dtype` must not name the error back.
impl std::str::FromStr for KvCacheDtype {
    type Err = CoreError;

    /// vLLM's values (`auto`, `bfloat16`, `fp8` = `fp8_e4m3`: OCP E4M3 with scale
    /// 1.0; its `fp8_e5m2`, `fp8_inc` and `fp8_ds_mla` are refused with the reason),
    /// and the spellings of the same types users type for `--dtype` (`bf16`,
    /// `float16`, `fp16`, `half`, `float32`, ...). Case does not matter.
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let v = s.trim().to_ascii_lowercase();
        let fixed = |d| Ok(KvCacheDtype::Fixed(d));
        match v.as_str() {
            "auto" => Ok(KvCacheDtype::Auto),
            "bfloat16" | "bf16" => fixed(DType::BF16),
            "float16" | "fp16" | "f16" | "half" => fixed(DType::F16),
            "float32" | "fp32" | "f32" | "float" => fixed(DType::F32),
            "fp8" | "fp8_e4m3" => fixed(DType::F8E4M3),
            _ => Err(CoreError::InvalidKvCacheDtype {
                spec: s.to_string(),
                reason: if v == "fp8_e5m2" {
                    "fp8_e5m2 KV caches are not implemented on this engine; \
                     fp8 (fp8_e4m3) is"
                        .into()
                } else if v.starts_with("fp8") {
                    "this fp8 variant is not implemented on this engine; fp8 (fp8_e4m3) is".into()
                } else {
                    "not a KV cache data type".into()
                },
            }),
        }
    }
}

/// Shape and element type of the paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Element type of the pools.
    pub dtype: DType,
}

impl KvCacheSpec {
    /// Elements in one slot (one token's K, or its V, for one layer).
    pub fn slot_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    /// Elements in one pool (K or V) of one layer.
    pub fn pool_elems(&self) -> usize {
        self.num_blocks * self.block_size * self.slot_elems()
    }
    /// The shape of one pool.
    pub fn pool_shape(&self) -> Shape {
        Shape::new(&[
            self.num_blocks,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        ])
        .expect("four dimensions")
    }
    /// Bytes one block takes across all layers, K and V.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_size * self.slot_elems() * self.dtype.size()
    }
    /// How many blocks fit in `bytes`.
    pub fn num_blocks_for_bytes(&self, bytes: usize) -> usize {
        bytes / self.bytes_per_block().max(1)
    }
}

/// K and V pools of one layer.
#[derive(Debug)]
pub struct LayerKv {
    pub k: Storage,
    pub v: Storage,
}

impl LayerKv {
    /// Read-only views of both pools.
    pub fn views(&self) -> (TensorRef<'_>, TensorRef<'_>) {
        (self.k.view(), self.v.view())
    }
    /// Writable views of both pools.
    pub fn views_mut(&mut self) -> (TensorMut<'_>, TensorMut<'_>) {
        (self.k.view_mut(), self.v.view_mut())
    }
}

/// The whole cache, one [`LayerKv`] per layer, on one device.
#[derive(Debug)]
pub struct KvCache {
    pub spec: KvCacheSpec,
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    /// A zeroed cache in CPU memory.
    pub fn new(spec: KvCacheSpec) -> Self {
        Self::filled(spec, 0.0)
    }

    /// A CPU cache with every element set to `value` (tests use NaN so that a stray
    /// read of an unwritten slot poisons the result).
    pub fn filled(spec: KvCacheSpec, value: f32) -> Self {
        Self::host_filled(Device::Cpu, spec, value).expect("cpu is a host device")
    }

    /// A cache in the memory of a host device (`cpu` or `emu`), every element `value`.
    pub fn host_filled(device: Device, spec: KvCacheSpec, value: f32) -> Result<Self, CoreError> {
        let pool = || Storage::host_filled(device, spec.dtype, spec.pool_shape(), value);
        Self::with_pools(spec, pool)
    }

    /// A zeroed cache allocated by the device's owner.
    pub fn allocate(spec: KvCacheSpec, runtime: &dyn DeviceRuntime) -> Result<Self, CoreError> {
        let pool = || runtime.alloc_zeroed(spec.dtype, spec.pool_shape());
        Self::with_pools(spec, pool)
    }

    /// A cache of `spec.num_layers` layers, each K and V pool made by `pool`.
    fn with_pools(
        spec: KvCacheSpec,
        pool: impl Fn() -> Result<Storage, CoreError>,
    ) -> Result<Self, CoreError> {
        let layers = (0..spec.num_layers)
            .map(|_| {
                Ok(LayerKv {
                    k: pool()?,
                    v: pool()?,
                })
            })
            .collect::<Result<_, CoreError>>()?;
        Ok(KvCache { spec, layers })
    }

    /// The device the pools live on.
    pub fn device(&self) -> Device {
        self.layers.first().map_or(Device::Cpu, |l| l.k.device())
    }

    /// A copy of a host cache (tests keep pristine copies); an error on device memory.
    pub fn try_clone(&self) -> Result<Self, CoreError> {
        let copy = |s: &Storage| -> Result<Storage, CoreError> {
            let data = match s.view().host_slice() {
                Some(crate::tensor::HostSlice::F32(x)) => crate::tensor::HostVec::F32(x.to_vec()),
                Some(crate::tensor::HostSlice::F16(x)) => crate::tensor::HostVec::F16(x.to_vec()),
                Some(crate::tensor::HostSlice::BF16(x)) => crate::tensor::HostVec::BF16(x.to_vec()),
                Some(crate::tensor::HostSlice::F8E4M3(x)) => {
                    crate::tensor::HostVec::F8E4M3(x.to_vec())
                }
                None => {
                    return Err(CoreError::NotOnHost {
                        name: "kv cache",
                        device: s.device(),
                    })
                }
            };
            Storage::from_host(s.device(), data, s.shape())
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(LayerKv {
                    k: copy(&l.k)?,
                    v: copy(&l.v)?,
                })
            })
            .collect::<Result<_, CoreError>>()?;
        Ok(KvCache {
            spec: self.spec,
            layers,
        })
    }
}

/// Writes `k`/`v` (`[num_tokens, num_kv_heads, head_dim]`, any host dtype) into the
/// pools at `slot_mapping[t]`, converting to the pools' dtype; negative slots
/// (padding) are skipped. Host memory only: device backends write with their own
/// kernel ([`crate::AttentionBackend::write_kv`]).
pub fn write_kv(
    mut k_pool: TensorMut<'_>,
    mut v_pool: TensorMut<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    slot_mapping: &[i64],
    slot_elems: usize,
) -> Result<(), CoreError> {
    // Check both sources before writing either pool, so a bad call changes nothing.
    let n = slot_mapping.len() * slot_elems;
    for (name, x) in [("k", &k), ("v", &v)] {
        if x.len() != n {
            return Err(CoreError::ShapeMismatch {
                name,
                expected: n,
                actual: x.len(),
            });
        }
    }
    let num_slots = k_pool.len() / slot_elems.max(1);
    if let Some(&slot) = slot_mapping.iter().find(|&&s| s >= num_slots as i64) {
        return Err(CoreError::InvalidBatch {
            message: format!("slot {slot} out of range for a cache of {num_slots} slots"),
        });
    }
    scatter_rows(&mut k_pool, k, slot_mapping, slot_elems, "k")?;
    scatter_rows(&mut v_pool, v, slot_mapping, slot_elems, "v")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// vLLM's test_reshape_and_cache: random unique slots; cache[slot] equals the written row.
        #[test]
        fn write_kv_places_rows_at_their_slots(
            num_blocks in 1usize..8, block_size in 1usize..5, heads in 1usize..3, dim in 1usize..5,
            seed in any::<u64>(),
        ) {
            let slot_elems = heads * dim;
            let total = num_blocks * block_size;
            // A deterministic shuffle of all slots; use some of them, plus one padding slot.
            let mut slots: Vec<i64> = (0..total as i64).collect();
            let mut s = seed | 1;
            for i in (1..slots.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                slots.swap(i, (s % (i as u64 + 1)) as usize);
            }
            slots.truncate(total.div_ceil(2));
            slots.push(-1);
            let n = slots.len();
            let k: Vec<f32> = (0..n * slot_elems).map(|i| i as f32).collect();
            let v: Vec<f32> = (0..n * slot_elems).map(|i| -(i as f32)).collect();
            let mut kp = vec![f32::NAN; total * slot_elems];
            let mut vp = vec![f32::NAN; total * slot_elems];
            write_kv(TensorMut::cpu(&mut kp), TensorMut::cpu(&mut vp), TensorRef::cpu(&k), TensorRef::cpu(&v), &slots, slot_elems).unwrap();
            for (t, &slot) in slots.iter().enumerate() {
                if slot < 0 { continue; }
                let s = slot as usize;
                prop_assert_eq!(&kp[s * slot_elems..(s + 1) * slot_elems], &k[t * slot_elems..(t + 1) * slot_elems]);
                prop_assert_eq!(&vp[s * slot_elems..(s + 1) * slot_elems], &v[t * slot_elems..(t + 1) * slot_elems]);
            }
            let written = slots.iter().filter(|s| **s >= 0).count();
            prop_assert_eq!(kp.iter().filter(|x| x.is_nan()).count(), (total - written) * slot_elems);
        }
    }

    #[test]
    fn kv_cache_dtypes_parse_as_vllm_spells_them() {
        use KvCacheDtype::*;
        for (s, want) in [
            ("auto", Auto),
            ("bfloat16", Fixed(DType::BF16)),
            ("BF16", Fixed(DType::BF16)),
            ("float16", Fixed(DType::F16)),
            ("fp16", Fixed(DType::F16)),
            ("half", Fixed(DType::F16)),
            ("float32", Fixed(DType::F32)),
            ("f32", Fixed(DType::F32)),
            ("fp8", Fixed(DType::F8E4M3)),
            ("FP8_E4M3", Fixed(DType::F8E4M3)),
        ] {
            assert_eq!(s.parse::<KvCacheDtype>(), Ok(want), "{s}");
            // Display gives a spelling that parses back.
            assert_eq!(want.to_string().parse::<KvCacheDtype>(), Ok(want));
        }
        for bad in ["fp8_e5m2", "fp8_inc", "int8", ""] {
            let e = bad.parse::<KvCacheDtype>().unwrap_err().to_string();
            assert!(e.contains("auto, bfloat16 (bf16)"), "{e}");
            assert!(e.contains("fp8 (fp8_e4m3)"), "{e}");
            assert!(
                !bad.starts_with("fp8") || e.contains("not implemented"),
                "{e}"
            );
        }
        assert_eq!(Fixed(DType::F8E4M3).to_string(), "fp8_e4m3");
        assert_eq!(Auto.resolve(DType::F32), DType::F32);
        assert_eq!(Fixed(DType::BF16).resolve(DType::F32), DType::BF16);
    }

    #[test]
    fn a_16_bit_cache_fits_twice_the_blocks() {
        let spec = |dtype| KvCacheSpec {
            num_layers: 30,
            num_blocks: 0,
            block_size: 16,
            num_kv_heads: 3,
            head_dim: 64,
            dtype,
        };
        let bytes = 64 << 20;
        let f32_blocks = spec(DType::F32).num_blocks_for_bytes(bytes);
        assert_eq!(spec(DType::F32).bytes_per_block(), 2 * 30 * 16 * 192 * 4);
        assert_eq!(
            spec(DType::BF16).num_blocks_for_bytes(bytes),
            2 * f32_blocks
        );
        assert_eq!(spec(DType::F16).num_blocks_for_bytes(bytes), 2 * f32_blocks);
        assert_eq!(spec(DType::F8E4M3).bytes_per_block(), 2 * 30 * 16 * 192);
        assert_eq!(
            spec(DType::F8E4M3).num_blocks_for_bytes(bytes),
            4 * f32_blocks
        );
    }

    proptest! {
        /// An fp8 pool holds each written element rounded to E4M3 (nearest even,
        /// clamped to ±448), from f32, bf16 and f16 rows alike.
        #[test]
        fn write_kv_rounds_rows_into_an_fp8_pool(
            vals in proptest::collection::vec(-1000.0f32..1000.0, 8),
            scale in -12i32..4,
        ) {
            use crate::fp8::F8E4M3;
            use half::{bf16, f16};
            let rows: Vec<f32> = vals.iter().map(|v| v * 2f32.powi(scale)).collect();
            let slots = [1i64, -1, 0, 3];
            let want = |src: &[f32]| -> Vec<F8E4M3> {
                let mut w = vec![F8E4M3::NAN; 8];
                for (t, &s) in slots.iter().enumerate() {
                    if s >= 0 {
                        for j in 0..2 {
                            w[s as usize * 2 + j] = F8E4M3::from_f32(src[t * 2 + j]);
                        }
                    }
                }
                w
            };
            let b: Vec<bf16> = rows.iter().map(|&x| bf16::from_f32(x)).collect();
            let h: Vec<f16> = rows.iter().map(|&x| f16::from_f32(x)).collect();
            let bw: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
            let hw: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
            let sources = [
                (TensorRef::cpu(&rows), rows.clone()),
                (TensorRef::host(Device::Cpu, &b).unwrap(), bw),
                (TensorRef::host(Device::Cpu, &h).unwrap(), hw),
            ];
            for (src, widened) in sources {
                let mut kp = vec![F8E4M3::NAN; 8];
                let mut vp = vec![F8E4M3::NAN; 8];
                write_kv(
                    TensorMut::host(Device::Cpu, &mut kp).unwrap(),
                    TensorMut::host(Device::Cpu, &mut vp).unwrap(),
                    src,
                    src,
                    &slots,
                    2,
                )
                .unwrap();
                prop_assert_eq!(&kp, &want(&widened));
                prop_assert_eq!(&vp, &want(&widened));
                prop_assert!(kp.iter().all(|x| x.to_f32().is_nan() || x.to_f32().abs() <= 448.0));
            }
        }
    }

    #[test]
    fn out_of_range_slot_is_an_error() {
        let mut kp = vec![0.0; 4];
        let mut vp = vec![0.0; 4];
        let (k, v) = ([1.0, 2.0], [1.0, 2.0]);
        let e = write_kv(
            TensorMut::cpu(&mut kp),
            TensorMut::cpu(&mut vp),
            TensorRef::cpu(&k),
            TensorRef::cpu(&v),
            &[2],
            2,
        )
        .unwrap_err();
        assert!(matches!(e, CoreError::InvalidBatch { .. }));
        // Nothing was written.
        assert_eq!(kp, [0.0; 4]);
    }
}
