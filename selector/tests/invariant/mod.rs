//! The automatic `decode=paged,prefill=flash` composition as a conformance-kit
//! subject, for the batch-invariance checks of `hybrid.rs` and `hybrid_avx2.rs`.

use pagoda_backend_testkit::Subject;
use pagoda_core::{Capabilities, CoreError};
use pagoda_selector::{select, BackendOverride};

/// The automatic composition as a conformance subject, built through the selector's
/// `build_batch_invariant` (which refuses a composition that is not invariant).
pub fn invariant_subject() -> Subject {
    let paged = pagoda_core::registered_backends()
        .into_iter()
        .find(|r| r.name == "paged")
        .expect("paged is linked");
    // `flash` declares the same shapes for prefill rows.
    let caps = Capabilities {
        prefill: true,
        ..(paged.capabilities)()
    };
    Subject::new("decode=paged,prefill=flash", caps, |cfg| {
        select(cfg, &BackendOverride::default())
            .and_then(|s| s.build_batch_invariant(cfg))
            .map_err(|e| CoreError::BackendFailed {
                backend: "hybrid".into(),
                message: e.to_string(),
            })
    })
}
