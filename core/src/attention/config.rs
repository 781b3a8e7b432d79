//! What a backend is asked to serve ([`AttentionConfig`]), what it can serve
//! ([`Capabilities`]) and why it cannot ([`InvalidReason`]).

use super::BatchDescriptor;
use crate::tensor::{DType, Device, DeviceKind};
use crate::CoreError;

// The reasons live in the leaf `reason`, which the error type can name without a
// cycle; re-exported here so that `attention::config::InvalidReason` still resolves.
pub use super::reason::{InvalidReason, Role};

/// The attention configuration of one model on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionConfig {
    pub device: Device,
    pub q_dtype: DType,
    pub kv_dtype: DType,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    pub sliding_window: Option<usize>,
    pub logits_soft_cap: Option<f32>,
}

impl AttentionConfig {
    /// A CPU f32 configuration with the usual scale.
    pub fn cpu_f32(
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> Self {
        AttentionConfig {
            device: Device::Cpu,
            q_dtype: DType::F32,
            kv_dtype: DType::F32,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: None,
            logits_soft_cap: None,
        }
    }

    pub fn gqa_ratio(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }
}

/// What a backend supports. `None` in a list field means "any".
///
/// Start from [`Capabilities::cpu_f32`] (the common case) and change what differs:
/// `Capabilities { prefill: false, ..Capabilities::cpu_f32() }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Capabilities {
    pub devices: Vec<DeviceKind>,
    pub q_dtypes: Vec<DType>,
    pub kv_dtypes: Vec<DType>,
    pub head_dims: Option<Vec<usize>>,
    pub block_sizes: Option<Vec<usize>>,
    pub max_gqa_ratio: Option<usize>,
    pub sliding_window: bool,
    pub logits_soft_cap: bool,
    pub decode: bool,
    pub prefill: bool,
    /// Whether `run` fills the log-sum-exp output when asked.
    pub returns_lse: bool,
}

impl Capabilities {
    /// The common CPU case: f32 Q and KV cache, any head dim, block size and GQA
    /// ratio, decode and prefill rows, LSE returned; no sliding window, no soft-cap.
    pub fn cpu_f32() -> Self {
        Capabilities {
            devices: vec![DeviceKind::Cpu],
            q_dtypes: vec![DType::F32],
            kv_dtypes: vec![DType::F32],
            head_dims: None,
            block_sizes: None,
            max_gqa_ratio: None,
            sliding_window: false,
            logits_soft_cap: false,
            decode: true,
            prefill: true,
            returns_lse: true,
        }
    }

    /// The rows this capability set serves, as a [`Role`] (`None` if neither).
    pub fn role(&self) -> Option<Role> {
        match (self.decode, self.prefill) {
            (true, true) => Some(Role::Both),
            (true, false) => Some(Role::Decode),
            (false, true) => Some(Role::Prefill),
            (false, false) => None,
        }
    }

    /// `Ok` if `backend` can serve `cfg` in `role`, else [`CoreError::BackendInvalid`]
    /// with every reason. The one line a backend's constructor needs.
    pub fn require(
        &self,
        backend: &str,
        cfg: &AttentionConfig,
        role: Role,
    ) -> Result<(), CoreError> {
        let reasons = self.reasons(cfg, role);
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(CoreError::BackendInvalid {
                backend: backend.into(),
                reasons,
            })
        }
    }

    /// What a backend's `plan` checks of a (valid) batch: that it was laid out for
    /// `cfg`'s block size ([`CoreError::BlockSizeMismatch`]) and has only rows of the
    /// kinds these capabilities serve ([`CoreError::BackendInvalid`] with
    /// [`InvalidReason::RoleUnsupported`]). The batch's own consistency is already
    /// guaranteed by its constructor.
    pub fn check_batch(
        &self,
        backend: &str,
        cfg: &AttentionConfig,
        batch: &BatchDescriptor,
    ) -> Result<(), CoreError> {
        if batch.block_size() != cfg.block_size {
            return Err(CoreError::BlockSizeMismatch {
                batch: batch.block_size(),
                config: cfg.block_size,
            });
        }
        let unsupported = if !self.decode && batch.num_decode_reqs() > 0 {
            Some(Role::Decode)
        } else if !self.prefill && batch.num_prefill_reqs() > 0 {
            Some(Role::Prefill)
        } else {
            None
        };
        match unsupported {
            Some(role) => Err(CoreError::BackendInvalid {
                backend: backend.into(),
                reasons: vec![InvalidReason::RoleUnsupported { role }],
            }),
            None => Ok(()),
        }
    }

    /// Every reason this capability set cannot serve `cfg` in `role`; empty = valid.
    pub fn reasons(&self, cfg: &AttentionConfig, role: Role) -> Vec<InvalidReason> {
        let mut r = Vec::new();
        if !self.devices.contains(&cfg.device.kind()) {
            r.push(InvalidReason::DeviceUnsupported { device: cfg.device });
        }
        if !self.q_dtypes.contains(&cfg.q_dtype) {
            r.push(InvalidReason::QDTypeUnsupported {
                dtype: cfg.q_dtype,
                supported: self.q_dtypes.clone(),
            });
        }
        if !self.kv_dtypes.contains(&cfg.kv_dtype) {
            r.push(InvalidReason::KvDTypeUnsupported {
                dtype: cfg.kv_dtype,
                supported: self.kv_dtypes.clone(),
            });
        }
        if let Some(dims) = &self.head_dims {
            if !dims.contains(&cfg.head_dim) {
                r.push(InvalidReason::HeadDimUnsupported {
                    head_dim: cfg.head_dim,
                    supported: dims.clone(),
                });
            }
        }
        if let Some(sizes) = &self.block_sizes {
            if !sizes.contains(&cfg.block_size) {
                r.push(InvalidReason::BlockSizeUnsupported {
                    block_size: cfg.block_size,
                    supported: sizes.clone(),
                });
            }
        }
        if cfg.num_kv_heads == 0 || !cfg.num_heads.is_multiple_of(cfg.num_kv_heads) {
            r.push(InvalidReason::HeadsNotDivisible {
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
            });
        } else if let Some(max) = self.max_gqa_ratio {
            if cfg.gqa_ratio() > max {
                r.push(InvalidReason::GqaRatioUnsupported {
                    ratio: cfg.gqa_ratio(),
                    max,
                });
            }
        }
        if cfg.sliding_window.is_some() && !self.sliding_window {
            r.push(InvalidReason::SlidingWindowUnsupported);
        }
        if cfg.logits_soft_cap.is_some() && !self.logits_soft_cap {
            r.push(InvalidReason::SoftCapUnsupported);
        }
        let needs_decode = matches!(role, Role::Decode | Role::Both);
        let needs_prefill = matches!(role, Role::Prefill | Role::Both);
        if needs_prefill && !self.prefill {
            r.push(InvalidReason::RoleUnsupported {
                role: Role::Prefill,
            });
        }
        if needs_decode && !self.decode {
            r.push(InvalidReason::RoleUnsupported { role: Role::Decode });
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Capabilities {
        Capabilities {
            devices: vec![DeviceKind::Cpu],
            q_dtypes: vec![DType::F32],
            kv_dtypes: vec![DType::F32],
            head_dims: Some(vec![64, 128]),
            block_sizes: None,
            max_gqa_ratio: Some(8),
            sliding_window: false,
            logits_soft_cap: false,
            decode: true,
            prefill: false,
            returns_lse: true,
        }
    }

    #[test]
    fn reasons_list_every_problem() {
        let mut cfg = AttentionConfig::cpu_f32(9, 3, 80, 16);
        cfg.sliding_window = Some(4);
        let r = caps().reasons(&cfg, Role::Both);
        assert!(r.contains(&InvalidReason::HeadDimUnsupported {
            head_dim: 80,
            supported: vec![64, 128]
        }));
        assert!(r.contains(&InvalidReason::SlidingWindowUnsupported));
        assert!(r.contains(&InvalidReason::RoleUnsupported {
            role: Role::Prefill
        }));
        assert!(r.iter().any(|x| x.to_string().contains("prefill")));
        assert!(caps()
            .reasons(&AttentionConfig::cpu_f32(9, 3, 64, 16), Role::Decode)
            .is_empty());
    }

    #[test]
    fn cpu_f32_and_require() {
        let cfg = AttentionConfig::cpu_f32(9, 3, 80, 16);
        assert!(Capabilities::cpu_f32()
            .require("x", &cfg, Role::Both)
            .is_ok());
        let decode_only = Capabilities {
            prefill: false,
            ..Capabilities::cpu_f32()
        };
        assert_eq!(decode_only.role(), Some(Role::Decode));
        match decode_only.require("x", &cfg, Role::Both) {
            Err(CoreError::BackendInvalid { backend, reasons }) => {
                assert_eq!(backend, "x");
                assert_eq!(
                    reasons,
                    vec![InvalidReason::RoleUnsupported {
                        role: Role::Prefill
                    }]
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn check_batch_refuses_a_foreign_block_size_and_unserved_rows() {
        let cfg = AttentionConfig::cpu_f32(2, 1, 4, 4);
        let mixed = BatchDescriptor::new(4, &[1, 2], &[1, 2], &[&[0], &[1]]).unwrap();
        let caps = Capabilities::cpu_f32();
        assert!(caps.check_batch("x", &cfg, &mixed).is_ok());
        let other = BatchDescriptor::new(2, &[1], &[1], &[&[0]]).unwrap();
        assert_eq!(
            caps.check_batch("x", &cfg, &other),
            Err(CoreError::BlockSizeMismatch {
                batch: 2,
                config: 4
            })
        );
        for (caps, role) in [
            (
                Capabilities {
                    prefill: false,
                    ..Capabilities::cpu_f32()
                },
                Role::Prefill,
            ),
            (
                Capabilities {
                    decode: false,
                    ..Capabilities::cpu_f32()
                },
                Role::Decode,
            ),
        ] {
            assert_eq!(
                caps.check_batch("x", &cfg, &mixed),
                Err(CoreError::BackendInvalid {
                    backend: "x".into(),
                    reasons: vec![InvalidReason::RoleUnsupported { role }],
                })
            );
        }
    }
}
