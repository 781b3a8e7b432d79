//! CUDA attention backends; registered always, usable only with the `cuda` feature.
//!
//! This crate shows where GPU variants of the backends go. Both entries are in the
//! registry in every build, so that `--attention-backend cuda-paged` on a CPU-only
//! build fails with a clear reason ("not compiled with CUDA") rather than "unknown
//! backend":
//! * `cuda-paged`: paged decode attention (the GPU sibling of `paged`);
//! * `cuda-flash`: flash-style prefill attention (the GPU sibling of `flash`).
//!
//! Without the `cuda` feature, [`BackendRegistration::runtime_reasons`] reports
//! [`InvalidReason::NotCompiled`] and the constructors fail. With it, the kernels are
//! not written yet, so they report [`InvalidReason::Other`] instead.

use pagoda_core::{
    AttentionBackend, AttentionConfig, BackendRegistration, Capabilities, CoreError, DType,
    DeviceKind, InvalidReason,
};

/// Registered name of the paged decode backend.
pub const CUDA_PAGED: &str = "cuda-paged";
/// Registered name of the flash prefill backend.
pub const CUDA_FLASH: &str = "cuda-flash";

/// Whether this build has the CUDA code compiled in.
pub const COMPILED: bool = cfg!(feature = "cuda");

fn gpu_caps(decode: bool, prefill: bool) -> Capabilities {
    Capabilities {
        devices: vec![DeviceKind::Cuda],
        q_dtypes: vec![DType::F16, DType::BF16, DType::F32],
        kv_dtypes: vec![DType::F16, DType::BF16, DType::F32],
        head_dims: Some(vec![64, 80, 96, 128, 256]),
        block_sizes: Some(vec![16, 32]),
        max_gqa_ratio: None,
        sliding_window: false,
        logits_soft_cap: false,
        decode,
        prefill,
        returns_lse: true,
    }
}

/// Capabilities of `cuda-paged` (decode rows).
pub fn paged_capabilities() -> Capabilities {
    gpu_caps(true, false)
}

/// Capabilities of `cuda-flash` (prefill rows).
pub fn flash_capabilities() -> Capabilities {
    gpu_caps(false, true)
}

/// The reasons both CUDA backends give regardless of the configuration.
pub fn runtime_reasons(_cfg: &AttentionConfig) -> Vec<InvalidReason> {
    if COMPILED {
        vec![InvalidReason::Other {
            message: "CUDA kernels not implemented yet".into(),
        }]
    } else {
        vec![InvalidReason::NotCompiled { feature: "cuda" }]
    }
}

fn unavailable(backend: &str) -> CoreError {
    let message = if COMPILED {
        "CUDA kernels not implemented yet".to_string()
    } else {
        "not compiled with CUDA (pagoda-backend-cuda was built without its `cuda` feature)"
            .to_string()
    };
    CoreError::BackendFailed {
        backend: backend.into(),
        message,
    }
}

fn create_paged(_cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Err(unavailable(CUDA_PAGED))
}

fn create_flash(_cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Err(unavailable(CUDA_FLASH))
}

pagoda_core::register_backend!(BackendRegistration {
    name: CUDA_PAGED,
    // Above every CPU backend: on a CUDA device it should win once it exists.
    priority: 100,
    description: "paged decode attention on CUDA (split-KV)",
    capabilities: paged_capabilities,
    runtime_reasons,
    create: create_paged,
});

pagoda_core::register_backend!(BackendRegistration {
    name: CUDA_FLASH,
    priority: 100,
    description: "flash-style prefill attention on CUDA",
    capabilities: flash_capabilities,
    runtime_reasons,
    create: create_flash,
});

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_core::{registered_backends, Device, Role};

    fn gpu_cfg() -> AttentionConfig {
        let mut cfg = AttentionConfig::cpu_f32(32, 8, 128, 16);
        cfg.device = Device::Cuda(0);
        cfg.q_dtype = DType::BF16;
        cfg.kv_dtype = DType::BF16;
        cfg
    }

    #[test]
    fn both_are_registered_and_explain_why_they_cannot_run() {
        for (name, role) in [(CUDA_PAGED, Role::Decode), (CUDA_FLASH, Role::Prefill)] {
            let reg = registered_backends()
                .into_iter()
                .find(|r| r.name == name)
                .expect(name);
            let reasons = reg.reasons(&gpu_cfg(), role);
            // The capabilities accept this config; only the runtime reason remains.
            assert_eq!(reasons.len(), 1, "{name}: {reasons:?}");
            if COMPILED {
                assert!(matches!(&reasons[0], InvalidReason::Other { .. }));
            } else {
                assert_eq!(reasons[0], InvalidReason::NotCompiled { feature: "cuda" });
                assert!(reasons[0].to_string().contains("not compiled with CUDA"));
            }
            let err = (reg.create)(&gpu_cfg())
                .err()
                .expect("constructor must fail");
            let text = err.to_string();
            assert!(text.contains(name), "{text}");
            assert!(
                text.contains(if COMPILED {
                    "not implemented"
                } else {
                    "not compiled with CUDA"
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn a_cpu_config_is_refused_for_the_device_too() {
        let reg = registered_backends()
            .into_iter()
            .find(|r| r.name == CUDA_PAGED)
            .unwrap();
        let reasons = reg.reasons(&AttentionConfig::cpu_f32(9, 3, 64, 16), Role::Decode);
        assert!(reasons
            .iter()
            .any(|r| matches!(r, InvalidReason::DeviceUnsupported { .. })));
    }
}
