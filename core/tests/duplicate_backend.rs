//! Two backends registered under one name: the registry refuses them at start,
//! naming both modules. (Its own test binary: the duplicate would break every other
//! test that walks the registry.)

use pagoda_core::{
    no_runtime_reasons, try_registered_backends, AttentionBackend, AttentionConfig,
    BackendRegistration, Capabilities, CoreError,
};

fn create(_: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Err(CoreError::BackendFailed {
        backend: "twin".into(),
        message: "never built".into(),
    })
}

mod first {
    pagoda_core::register_backend!(pagoda_core::BackendRegistration {
        name: "twin",
        priority: 1,
        description: "first twin",
        capabilities: pagoda_core::Capabilities::cpu_f32,
        runtime_reasons: pagoda_core::no_runtime_reasons,
        create: super::create,
    });
}

mod second {
    pagoda_core::register_backend!(pagoda_core::BackendRegistration {
        name: "twin",
        priority: 2,
        description: "second twin",
        capabilities: pagoda_core::Capabilities::cpu_f32,
        runtime_reasons: pagoda_core::no_runtime_reasons,
        create: super::create,
    });
}

pagoda_core::register_backend!(BackendRegistration {
    name: "single",
    priority: 0,
    description: "unique",
    capabilities: Capabilities::cpu_f32,
    runtime_reasons: no_runtime_reasons,
    create,
});

#[test]
fn a_duplicate_name_is_refused_naming_both() {
    let err = try_registered_backends().err().expect("duplicate refused");
    assert_eq!(
        err,
        CoreError::DuplicateBackend {
            name: "twin",
            first: "duplicate_backend::first",
            second: "duplicate_backend::second",
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("`twin`")
            && text.contains("duplicate_backend::first")
            && text.contains("duplicate_backend::second"),
        "{text}"
    );
}

#[test]
#[should_panic(expected = "two attention backends are registered as `twin`")]
fn registered_backends_panics_on_it() {
    let _ = pagoda_core::registered_backends();
}
