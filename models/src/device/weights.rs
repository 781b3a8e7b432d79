//! How a device holds a decoder's weights ([`Dev`]): every matrix uploaded once in
//! the compute dtype (the projections stacked by `crate::decoder`'s builder, which
//! checks every shape exactly as for the CPU), norms, biases and the RoPE tables f32.

use super::bufs::upload;
use crate::decoder::{Place, Weights};
use crate::error::ModelError;
use crate::weights::Mat;
use pagoda_core::{DType, DeviceRuntime, Storage};
use pagoda_kernels::RopeCache;

/// RoPE tables `[max_pos, head_dim / 2]` f32 on the device.
pub(crate) struct RopeTables {
    pub(crate) cos: Storage,
    pub(crate) sin: Storage,
}

/// A device's weights.
pub(crate) struct Dev;

impl Weights for Dev {
    type Mat = Storage;
    type Vec = Storage;
    type Rope = RopeTables;
    type Embed = Storage;

    fn tied_head(embed: &Storage) -> Option<&Storage> {
        Some(embed)
    }
}

/// Uploads to `rt`'s device as `dtype` (norms and biases f32), counting the bytes;
/// `progress` is told after each layer.
pub(crate) struct DevPlace<'a, F> {
    pub(crate) rt: &'a dyn DeviceRuntime,
    pub(crate) dtype: DType,
    pub(crate) bytes: usize,
    pub(crate) progress: F,
}

impl<F> DevPlace<'_, F> {
    fn count(&mut self, s: Storage) -> Storage {
        self.bytes += s.size_bytes();
        s
    }

    /// The rows of `mats` stacked (`[wq; wk; wv]`, `[w_gate; w_up]`) as one matrix.
    fn stack(&mut self, mats: &[Mat]) -> Result<Storage, ModelError> {
        let cols = mats.first().map_or(0, |m| m.cols);
        let rows: usize = mats.iter().map(|m| m.rows).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for m in mats {
            data.extend_from_slice(&m.values()?);
        }
        let s = upload(self.rt, self.dtype, &[rows, cols], &data)?;
        Ok(self.count(s))
    }
}

impl<F: FnMut(usize, usize)> Place for DevPlace<'_, F> {
    type W = Dev;

    fn mat(
        &mut self,
        _name: &str,
        parts: Vec<Mat>,
        _k: usize,
        _router: bool,
    ) -> Result<Storage, ModelError> {
        // A router in the compute dtype too: its GEMM's output is f32.
        self.stack(&parts)
    }

    fn vec(&mut self, v: Vec<f32>) -> Result<Storage, ModelError> {
        let s = upload(self.rt, DType::F32, &[v.len()], &v)?;
        Ok(self.count(s))
    }

    fn embed_and_head(
        &mut self,
        embed: Mat,
        lm_head: Option<Mat>,
        _hidden: usize,
    ) -> Result<(Storage, Option<Storage>), ModelError> {
        let embed = self.stack(&[embed])?;
        let head = lm_head.map(|h| self.stack(&[h])).transpose()?;
        Ok((embed, head))
    }

    fn rope(&mut self, rope: RopeCache) -> Result<RopeTables, ModelError> {
        let (cos, sin) = rope.tables();
        let dims = [
            rope.max_position(),
            rope.tables().0.len() / rope.max_position().max(1),
        ];
        let cos = upload(self.rt, DType::F32, &dims, cos)?;
        let sin = upload(self.rt, DType::F32, &dims, sin)?;
        Ok(RopeTables {
            cos: self.count(cos),
            sin: self.count(sin),
        })
    }

    fn progress(&mut self, done: usize, total: usize) {
        (self.progress)(done, total)
    }
}
