//! Rotary position embeddings, rotate-half (GPT-NeoX / HF) convention: element `i`
//! of a head is paired with element `i + head_dim/2`.
//!
//! [`RopeCache`] precomputes cos/sin for every position once; applying it is then a
//! table lookup per token. Llama-3 frequency scaling is applied to the inverse
//! frequencies, as in HF's `_compute_llama3_parameters`; per-frequency divisors
//! (llama.cpp's `freq_factors`, a GGUF's `rope_freqs.weight`) divide them.

use crate::error::{check_len, KernelError};
use rayon::prelude::*;

/// Llama-3 RoPE scaling parameters (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// The `head_dim / 2` inverse frequencies `theta^(-2i/head_dim)`, with Llama-3
/// scaling if given. Computed in f64 and rounded once.
pub fn inv_freq(head_dim: usize, theta: f32, scaling: Option<&Llama3Scaling>) -> Vec<f32> {
    inv_freq_f64(head_dim, theta, scaling)
        .map(|f| f as f32)
        .collect()
}

/// [`inv_freq`] before rounding to f32.
fn inv_freq_f64(
    head_dim: usize,
    theta: f32,
    scaling: Option<&Llama3Scaling>,
) -> impl Iterator<Item = f64> + '_ {
    (0..head_dim / 2).map(move |i| {
        let f = 1.0 / (theta as f64).powf((2 * i) as f64 / head_dim as f64);
        match scaling {
            None => f,
            Some(s) => llama3_scale(f, s),
        }
    })
}

/// The standard llama3 rule: keep high frequencies, divide low ones by `factor`,
/// interpolate smoothly in between (by wavelength).
fn llama3_scale(freq: f64, s: &Llama3Scaling) -> f64 {
    let old = s.original_max_position_embeddings as f64;
    let (lo, hi, factor) = (
        s.low_freq_factor as f64,
        s.high_freq_factor as f64,
        s.factor as f64,
    );
    let low_freq_wavelen = old / lo;
    let high_freq_wavelen = old / hi;
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    if wavelen < high_freq_wavelen {
        freq
    } else if wavelen > low_freq_wavelen {
        freq / factor
    } else {
        let smooth = (old / wavelen - lo) / (hi - lo);
        (1.0 - smooth) * freq / factor + smooth * freq
    }
}

/// cos/sin tables `[max_position, head_dim / 2]`.
#[derive(Debug, Clone)]
pub struct RopeCache {
    head_dim: usize,
    max_position: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeCache {
    /// Tables for positions `0..max_position`. `head_dim` must be even and non-zero.
    pub fn new(
        head_dim: usize,
        max_position: usize,
        theta: f32,
        scaling: Option<&Llama3Scaling>,
    ) -> Result<Self, KernelError> {
        Self::with_freq_factors(head_dim, max_position, theta, scaling, None)
    }

    /// [`RopeCache::new`] with inverse frequency `i` divided by `freq_factors[i]`
    /// (`head_dim / 2` finite positive values), as llama.cpp's `ggml_rope_ext` applies
    /// a GGUF's `rope_freqs.weight` (Llama 3.1 stores its llama3 scaling that way: the
    /// factors are 1, `factor`, or the smooth blend in between). The division is in
    /// f64, after any `scaling`, and rounded once.
    pub fn with_freq_factors(
        head_dim: usize,
        max_position: usize,
        theta: f32,
        scaling: Option<&Llama3Scaling>,
        freq_factors: Option<&[f32]>,
    ) -> Result<Self, KernelError> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(KernelError::InvalidArgument {
                name: "head_dim",
                message: format!("{head_dim} must be even and > 0"),
            });
        }
        if theta.is_nan() || theta <= 0.0 {
            return Err(KernelError::InvalidArgument {
                name: "theta",
                message: format!("{theta} must be > 0"),
            });
        }
        if let Some(s) = scaling {
            let ok = s.factor > 0.0
                && s.low_freq_factor > 0.0
                && s.high_freq_factor > s.low_freq_factor
                && s.original_max_position_embeddings > 0;
            if !ok {
                return Err(KernelError::InvalidArgument {
                    name: "rope_scaling",
                    message: format!("invalid llama3 scaling {s:?}"),
                });
            }
        }
        let half = head_dim / 2;
        let inv = match freq_factors {
            None => inv_freq(head_dim, theta, scaling),
            Some(f) => {
                if f.len() != half || !f.iter().all(|x| x.is_finite() && *x > 0.0) {
                    return Err(KernelError::InvalidArgument {
                        name: "freq_factors",
                        message: format!(
                            "need {half} finite positive factors (head_dim / 2), got {} values",
                            f.len()
                        ),
                    });
                }
                inv_freq_f64(head_dim, theta, scaling)
                    .zip(f)
                    .map(|(x, &d)| (x / d as f64) as f32)
                    .collect()
            }
        };
        let mut cos = Vec::with_capacity(max_position * half);
        let mut sin = Vec::with_capacity(max_position * half);
        for p in 0..max_position {
            for &f in &inv {
                // Angle in f32 as HF computes it (position · inv_freq), cos/sin in f64.
                let a = (p as f32 * f) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok(RopeCache {
            head_dim,
            max_position,
            cos,
            sin,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    pub fn max_position(&self) -> usize {
        self.max_position
    }
    /// The cos and sin tables, each `[max_position, head_dim / 2]` (what a device
    /// forward uploads for its RoPE kernel).
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// Rotates `x` (`[positions.len(), num_heads, head_dim]`) in place, token `t` by
    /// angle `positions[t]`.
    pub fn apply(
        &self,
        x: &mut [f32],
        num_heads: usize,
        positions: &[u32],
    ) -> Result<(), KernelError> {
        let row = num_heads * self.head_dim;
        check_len("x", x.len(), positions.len() * row)?;
        if let Some(&p) = positions.iter().find(|&&p| p as usize >= self.max_position) {
            return Err(KernelError::PositionOutOfRange {
                position: p as usize,
                max_position: self.max_position,
            });
        }
        if row == 0 {
            return Ok(());
        }
        let half = self.head_dim / 2;
        let body = |(tok, &p): (&mut [f32], &u32)| {
            let cos = &self.cos[p as usize * half..(p as usize + 1) * half];
            let sin = &self.sin[p as usize * half..(p as usize + 1) * half];
            for head in tok.chunks_exact_mut(self.head_dim) {
                let (a, b) = head.split_at_mut(half);
                for i in 0..half {
                    let (x1, x2) = (a[i], b[i]);
                    a[i] = x1 * cos[i] - x2 * sin[i];
                    b[i] = x2 * cos[i] + x1 * sin[i];
                }
            }
        };
        if x.len() >= 1 << 15 {
            x.par_chunks_mut(row)
                .zip(positions.par_iter())
                .for_each(body);
        } else {
            x.chunks_mut(row).zip(positions.iter()).for_each(body);
        }
        Ok(())
    }
}

/// Slow reference of [`RopeCache::apply`]: frequencies and angles from scratch in f64.
pub fn rope_ref(
    x: &mut [f32],
    num_heads: usize,
    head_dim: usize,
    positions: &[u32],
    theta: f32,
    scaling: Option<&Llama3Scaling>,
) {
    let half = head_dim / 2;
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..num_heads {
            let base = (t * num_heads + h) * head_dim;
            for i in 0..half {
                let mut f = 1.0 / (theta as f64).powf((2 * i) as f64 / head_dim as f64);
                if let Some(s) = scaling {
                    f = llama3_scale(f, s);
                }
                let a = p as f64 * f;
                let (x1, x2) = (x[base + i] as f64, x[base + i + half] as f64);
                x[base + i] = (x1 * a.cos() - x2 * a.sin()) as f32;
                x[base + i + half] = (x2 * a.cos() + x1 * a.sin()) as f32;
            }
        }
    }
}
