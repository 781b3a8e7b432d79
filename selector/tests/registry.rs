//! The registry holds exactly the linked backends, and the selector's rules:
//! priority among valid ones, forced-but-invalid is an error with reasons, unknown
//! names list the registered ones, no valid backend lists every verdict.

use pagoda_core::{AttentionConfig, DType, Device, InvalidReason, Role};
use pagoda_selector::{registered_names, select, BackendOverride, SelectorError};

use pagoda_backends as _;

fn smollm2() -> AttentionConfig {
    AttentionConfig::cpu_f32(9, 3, 64, 16)
}

/// Exactly the linked backends: every registration comes from a crate that
/// `pagoda-backends` links (its `LINKED_CRATES`, from its manifest, so a backend crate
/// added there needs no edit here), the library's own are among them, and the names
/// the selector lists are those registrations'.
#[test]
fn registry_holds_exactly_the_linked_backends() {
    let mut names = registered_names();
    names.sort();
    let regs = pagoda_core::attention::registered_modules();
    for (module, r) in &regs {
        let krate = module.split("::").next().unwrap_or(module);
        assert!(
            pagoda_backends::LINKED_CRATES.contains(&krate),
            "`{}` registered by {module}, which pagoda-backends does not link",
            r.name
        );
    }
    let mut from_regs: Vec<&str> = regs.iter().map(|(_, r)| r.name).collect();
    from_regs.sort();
    assert_eq!(names, from_regs);
    for name in [
        "cuda-flash",
        "cuda-naive",
        "cuda-paged",
        "example",
        "flash",
        "naive",
        "paged",
    ] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
}

#[test]
fn automatic_choice_is_paged_decode_flash_prefill() {
    let sel = select(&smollm2(), &BackendOverride::default()).unwrap();
    assert_eq!(sel.name(), "decode=paged,prefill=flash");
    assert!(!sel.forced);
    let backend = sel.build(&smollm2()).unwrap();
    assert_eq!(backend.name(), "decode=paged,prefill=flash");
}

#[test]
fn forced_single_backend_must_serve_both_roles() {
    let err = select(&smollm2(), &BackendOverride::parse("paged").unwrap())
        .err()
        .unwrap();
    match &err {
        SelectorError::ForcedInvalid { name, reasons, .. } => {
            assert_eq!(name, "paged");
            assert!(
                reasons.iter().any(|r| r.to_string().contains("prefill")),
                "{err}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        select(&smollm2(), &BackendOverride::parse("naive").unwrap())
            .unwrap()
            .name(),
        "naive"
    );
    assert_eq!(
        select(
            &smollm2(),
            &BackendOverride::parse("decode=naive,prefill=flash").unwrap()
        )
        .unwrap()
        .name(),
        "decode=naive,prefill=flash"
    );
}

#[test]
fn unknown_name_lists_registered_names() {
    let err = select(&smollm2(), &BackendOverride::parse("fastest").unwrap())
        .err()
        .unwrap()
        .to_string();
    for n in ["naive", "paged", "flash", "cuda-paged", "cuda-flash"] {
        assert!(err.contains(n), "{err}");
    }
}

#[test]
fn cuda_backends_say_not_compiled() {
    let mut cfg = smollm2();
    cfg.device = Device::Cuda(0);
    let err = select(&cfg, &BackendOverride::parse("cuda-paged").unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not compiled with CUDA"), "{err}");
}

#[test]
fn on_emu_the_automatic_choice_is_the_cuda_backends() {
    for (dtype, choice) in [
        (DType::BF16, "decode=cuda-paged,prefill=cuda-flash"),
        (DType::F16, "decode=cuda-paged,prefill=cuda-flash"),
        // No f32 flash kernel: cuda-naive is the prefill fallback.
        (DType::F32, "decode=cuda-paged,prefill=cuda-naive"),
    ] {
        let mut cfg = smollm2();
        cfg.device = Device::Emu;
        cfg.q_dtype = dtype;
        cfg.kv_dtype = dtype;
        let sel = select(&cfg, &BackendOverride::default()).unwrap();
        assert_eq!(sel.name(), choice, "{dtype}");
        sel.build(&cfg).unwrap();
    }
}

#[test]
fn the_kv_cache_dtype_filters_the_backends() {
    // paged and flash read 16-bit caches: the automatic choice stays.
    for kv_dtype in [DType::BF16, DType::F16] {
        let cfg = AttentionConfig {
            kv_dtype,
            ..smollm2()
        };
        let sel = select(&cfg, &BackendOverride::default()).unwrap();
        assert_eq!(sel.name(), "decode=paged,prefill=flash", "{kv_dtype}");
        sel.build(&cfg).unwrap();
        // The example backend declares an f32 cache only: forced, it is refused
        // with that reason.
        let err = select(&cfg, &BackendOverride::parse("example").unwrap())
            .err()
            .unwrap();
        match &err {
            SelectorError::ForcedInvalid { name, reasons, .. } => {
                assert_eq!(name, "example");
                assert_eq!(
                    reasons,
                    &[InvalidReason::KvDTypeUnsupported {
                        dtype: kv_dtype,
                        supported: vec![DType::F32]
                    }]
                );
                assert!(err.to_string().contains("KV cache dtype"), "{err}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn nothing_valid_lists_every_backend() {
    let mut cfg = smollm2();
    cfg.device = Device::Cuda(0);
    let err = select(&cfg, &BackendOverride::default()).err().unwrap();
    match &err {
        SelectorError::NoValidBackend { role, verdicts } => {
            assert_eq!(*role, Role::Decode);
            assert_eq!(verdicts.len(), pagoda_core::registered_backends().len());
            assert!(verdicts.iter().all(|(_, r)| !r.is_empty()));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn override_parsing() {
    assert_eq!(
        BackendOverride::parse("auto").unwrap(),
        BackendOverride::default()
    );
    let o = BackendOverride::parse("decode=paged, prefill=flash").unwrap();
    assert_eq!(o.decode.as_deref(), Some("paged"));
    assert_eq!(o.prefill.as_deref(), Some("flash"));
    assert!(BackendOverride::parse("decode=").is_err());
    assert!(BackendOverride::parse("middle=paged").is_err());
}

#[test]
fn one_role_backend_forced_alone_says_how_to_compose_it() {
    // `flash` is prefill-only: alone it is refused, and the error names why and
    // what to pass instead.
    let err = select(&smollm2(), &BackendOverride::parse("flash").unwrap())
        .err()
        .unwrap();
    match &err {
        SelectorError::ForcedInvalid {
            name,
            role,
            reasons,
            hint,
        } => {
            assert_eq!((name.as_str(), *role), ("flash", Role::Both));
            assert_eq!(
                reasons,
                &vec![pagoda_core::InvalidReason::RoleUnsupported { role: Role::Decode }]
            );
            assert!(hint.is_some());
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    for needle in [
        "`flash`",
        "does not handle decode rows",
        "prefill rows only",
        "--attention-backend decode=paged,prefill=flash",
        "`prefill=flash`",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    let msg = select(&smollm2(), &BackendOverride::parse("paged").unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("decode=paged,prefill=flash") && msg.contains("`decode=paged`"),
        "{msg}"
    );
    // Composed explicitly, or with the decode side by priority, it is accepted.
    for o in ["decode=paged,prefill=flash", "prefill=flash"] {
        let sel = select(&smollm2(), &BackendOverride::parse(o).unwrap()).unwrap();
        assert_eq!(sel.name(), "decode=paged,prefill=flash");
    }
}

/// A model that needs a sliding window or soft-capping (Mistral, Gemma 2) is served
/// by the CPU backends automatically; forcing a backend that lacks the feature
/// (`example` declares neither) fails with that reason.
#[test]
fn per_model_features_decide_and_a_forced_backend_lacking_one_is_refused() {
    let mut mistral = AttentionConfig::cpu_f32(32, 8, 128, 16);
    mistral.sliding_window = Some(4096);
    let mut gemma2 = AttentionConfig::cpu_f32(8, 4, 256, 16);
    gemma2.sliding_window = Some(4096);
    gemma2.logits_soft_cap = Some(50.0);
    for cfg in [&mistral, &gemma2] {
        let sel = select(cfg, &BackendOverride::default()).unwrap();
        assert_eq!(sel.name(), "decode=paged,prefill=flash");
        let err = select(cfg, &BackendOverride::parse("example").unwrap())
            .err()
            .unwrap();
        match &err {
            SelectorError::ForcedInvalid { name, reasons, .. } => {
                assert_eq!(name, "example");
                assert!(reasons.contains(&pagoda_core::InvalidReason::SlidingWindowUnsupported));
                assert_eq!(
                    reasons.contains(&pagoda_core::InvalidReason::SoftCapUnsupported),
                    cfg.logits_soft_cap.is_some()
                );
                assert!(err.to_string().contains("sliding-window"), "{err}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// The CUDA backends serve sliding windows and soft caps: on `emu` a model that needs
/// them (Mistral, Gemma 2; shapes of the real models and of the fixtures in
/// `tests/data/families`) gets the CUDA backends automatically, and on a `cuda` device
/// their reasons name what is missing there (the build, the driver), never a feature.
#[test]
fn cuda_backends_serve_windows_and_soft_caps() {
    let with = |heads, kv_heads, dim, window, cap, dtype| {
        let mut c = AttentionConfig::cpu_f32(heads, kv_heads, dim, 16);
        c.sliding_window = Some(window);
        c.logits_soft_cap = cap;
        c.q_dtype = dtype;
        c.kv_dtype = dtype;
        c.device = Device::Emu;
        c
    };
    for (cfg, choice) in [
        // Mistral 7B, Gemma 2 9B (head dim 256: no flash kernel, cuda-naive prefills).
        (
            with(32, 8, 128, 4096, None, DType::BF16),
            "decode=cuda-paged,prefill=cuda-flash",
        ),
        (
            with(16, 8, 256, 4096, Some(50.0), DType::BF16),
            "decode=cuda-paged,prefill=cuda-naive",
        ),
        // The fixtures: head dim 16, window 8, Gemma 2's cap 3 (only cuda-naive has
        // kernels for head dim 16).
        (with(4, 2, 16, 8, None, DType::F32), "cuda-naive"),
        (with(4, 2, 16, 8, Some(3.0), DType::F32), "cuda-naive"),
    ] {
        let sel = select(&cfg, &BackendOverride::default()).unwrap();
        assert_eq!(sel.name(), choice, "{cfg:?}");
        sel.build(&cfg).unwrap();
        let mut cuda = cfg.clone();
        cuda.device = Device::Cuda(0);
        for v in pagoda_selector::verdicts(&cuda)
            .iter()
            .filter(|v| v.name.starts_with("cuda-"))
        {
            for r in v.decode_reasons.iter().chain(&v.prefill_reasons) {
                assert!(
                    !matches!(
                        r,
                        pagoda_core::InvalidReason::SlidingWindowUnsupported
                            | pagoda_core::InvalidReason::SoftCapUnsupported
                    ),
                    "{}: {r}",
                    v.name
                );
            }
        }
        let err = select(&cuda, &BackendOverride::parse("cuda-naive").unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("CUDA"), "{err}");
        assert!(
            !err.contains("sliding-window") && !err.contains("soft-capping"),
            "{err}"
        );
    }
}
