//! Cases on devices: the kit keeps every case's truth as host f32 ([`HostKv`], the
//! queries), rounded once to the subject's dtypes, and places it on the subject's
//! device and dtypes for each run ([`Placement`], [`upload`]); results come back widened to f32.
//!
//! The reference ([`Reference`]) wraps `naive` so that it runs on any placement: it
//! copies its inputs to the host, widens them to f32 and computes in f64, then writes
//! its output back in the subject's dtype. So reference and subject read the same
//! representable inputs, and a tolerance measures only the subject's arithmetic (plus
//! one rounding of the output to its dtype).

use pagoda_backend_naive::NaiveBackend;
use pagoda_core::{
    open_device, AttentionBackend, AttentionConfig, BatchDescriptor, CoreError, DType, Device,
    DeviceRuntime, HostSlice, HostSliceMut, HostVec, KvCacheSpec, LayerIo, Shape, Storage,
    TensorMut, TensorRef,
};
use std::sync::Arc;

/// K and V pools of one layer in host f32.
#[derive(Debug, Clone, PartialEq)]
pub struct HostLayer {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// A paged KV cache held as host f32 (the kit's truth), whatever the subject's device.
#[derive(Debug, Clone, PartialEq)]
pub struct HostKv {
    pub spec: KvCacheSpec,
    pub layers: Vec<HostLayer>,
}

impl HostKv {
    /// Every element `value`.
    pub fn filled(spec: KvCacheSpec, value: f32) -> Self {
        let n = spec.pool_elems();
        let layers = (0..spec.num_layers)
            .map(|_| HostLayer {
                k: vec![value; n],
                v: vec![value; n],
            })
            .collect();
        HostKv { spec, layers }
    }
}

/// Rounds `x` to the nearest value of `dtype` (kept as f32).
pub fn round_to(dtype: DType, x: &mut [f32]) {
    match dtype {
        DType::F32 => {}
        DType::F16 => x
            .iter_mut()
            .for_each(|v| *v = pagoda_core::f16::from_f32(*v).to_f32()),
        DType::BF16 => x
            .iter_mut()
            .for_each(|v| *v = pagoda_core::bf16::from_f32(*v).to_f32()),
        DType::F8E4M3 => x
            .iter_mut()
            .for_each(|v| *v = pagoda_core::F8E4M3::from_f32(*v).to_f32()),
    }
}

/// Device and dtypes of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    pub device: Device,
    pub q_dtype: DType,
    pub kv_dtype: DType,
}

impl Placement {
    pub fn of(cfg: &AttentionConfig) -> Self {
        Placement {
            device: cfg.device,
            q_dtype: cfg.q_dtype,
            kv_dtype: cfg.kv_dtype,
        }
    }
}

/// `data` rounded to `dtype` (nearest even), as owned host elements.
pub fn host_vec(dtype: DType, data: &[f32]) -> HostVec {
    match dtype {
        DType::F32 => HostVec::F32(data.to_vec()),
        DType::F16 => HostVec::F16(
            data.iter()
                .map(|&x| pagoda_core::f16::from_f32(x))
                .collect(),
        ),
        DType::BF16 => HostVec::BF16(
            data.iter()
                .map(|&x| pagoda_core::bf16::from_f32(x))
                .collect(),
        ),
        DType::F8E4M3 => HostVec::F8E4M3(
            data.iter()
                .map(|&x| pagoda_core::F8E4M3::from_f32(x))
                .collect(),
        ),
    }
}

/// Storage of `data` converted to `dtype` on `rt`'s device.
pub fn upload(rt: &dyn DeviceRuntime, dtype: DType, data: &[f32]) -> Result<Storage, CoreError> {
    let shape = Shape::flat(data.len());
    let mut s = rt.alloc_zeroed(dtype, shape)?;
    let host = host_vec(dtype, data);
    let src = match &host {
        HostVec::F32(x) => HostSlice::F32(x),
        HostVec::F16(x) => HostSlice::F16(x),
        HostVec::BF16(x) => HostSlice::BF16(x),
        HostVec::F8E4M3(x) => HostSlice::F8E4M3(x),
    };
    rt.upload(s.view_mut(), src)?;
    Ok(s)
}

/// Any view, copied to the host and widened to f32.
pub fn download(rt: &dyn DeviceRuntime, src: TensorRef<'_>) -> Result<Vec<f32>, CoreError> {
    let n = src.len();
    Ok(match src.dtype() {
        DType::F32 => {
            let mut v = vec![0.0f32; n];
            rt.download(src, HostSliceMut::F32(&mut v))?;
            v
        }
        DType::F16 => {
            let mut v = vec![pagoda_core::f16::ZERO; n];
            rt.download(src, HostSliceMut::F16(&mut v))?;
            v.iter().map(|x| x.to_f32()).collect()
        }
        DType::BF16 => {
            let mut v = vec![pagoda_core::bf16::ZERO; n];
            rt.download(src, HostSliceMut::BF16(&mut v))?;
            v.iter().map(|x| x.to_f32()).collect()
        }
        DType::F8E4M3 => {
            let mut v = vec![pagoda_core::F8E4M3::ZERO; n];
            rt.download(src, HostSliceMut::F8E4M3(&mut v))?;
            v.iter().map(|x| x.to_f32()).collect()
        }
    })
}

/// Copies host f32 into an existing view, converted to its dtype.
pub fn upload_into(
    rt: &dyn DeviceRuntime,
    dst: TensorMut<'_>,
    data: &[f32],
) -> Result<(), CoreError> {
    let s = upload(
        &pagoda_core::HostRuntime::new(Device::Cpu)?,
        dst.dtype(),
        data,
    )?;
    let src = s.view().host_slice().expect("host storage");
    rt.upload(dst, src)
}

/// The runtime of a placement's device.
pub fn runtime(p: &Placement) -> Result<Arc<dyn DeviceRuntime>, CoreError> {
    open_device(p.device)
}

/// The reference backend for a subject configuration: `naive` in f64 on the host,
/// reading and writing buffers of any device and dtype.
pub struct Reference {
    inner: NaiveBackend,
    rt: Arc<dyn DeviceRuntime>,
}

impl Reference {
    /// For a subject configured as `cfg` (its device and dtypes are the buffers'
    /// placement; the computation is always host f64).
    pub fn new(cfg: &AttentionConfig) -> Result<Self, CoreError> {
        let mut host = cfg.clone();
        host.device = Device::Cpu;
        host.q_dtype = DType::F32;
        host.kv_dtype = DType::F32;
        Ok(Reference {
            inner: NaiveBackend::new(&host)?,
            rt: open_device(cfg.device)?,
        })
    }
}

impl AttentionBackend for Reference {
    fn name(&self) -> &str {
        "naive"
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.inner.plan(batch)
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        let rt = self.rt.as_ref();
        let q = download(rt, io.q)?;
        let k = download(rt, io.k_cache)?;
        let v = download(rt, io.v_cache)?;
        let mut out = vec![0.0f32; io.out.len()];
        let mut lse = io.lse.as_ref().map(|l| vec![0.0f32; l.len()]);
        self.inner
            .run(LayerIo::cpu(&q, &k, &v, &mut out, lse.as_deref_mut()))?;
        upload_into(rt, io.out, &out)?;
        if let (Some(dst), Some(l)) = (io.lse, lse) {
            upload_into(rt, dst, &l)?;
        }
        Ok(())
    }

    fn write_kv(
        &mut self,
        k_pool: TensorMut<'_>,
        v_pool: TensorMut<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
        slot_mapping: &[i64],
        slot_elems: usize,
    ) -> Result<(), CoreError> {
        let rt = self.rt.as_ref();
        let (mut kp, mut vp) = (
            download(rt, k_pool.as_ref())?,
            download(rt, v_pool.as_ref())?,
        );
        let (kn, vn) = (download(rt, k)?, download(rt, v)?);
        pagoda_core::write_kv(
            TensorMut::cpu(&mut kp),
            TensorMut::cpu(&mut vp),
            TensorRef::cpu(&kn),
            TensorRef::cpu(&vn),
            slot_mapping,
            slot_elems,
        )?;
        upload_into(rt, k_pool, &kp)?;
        upload_into(rt, v_pool, &vp)
    }
}
