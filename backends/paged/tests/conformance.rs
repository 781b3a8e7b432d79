//! The shared conformance suite (pagoda-backend-testkit) run against `paged`.

use pagoda_backend_paged as _; // link the crate so its registration is seen

pagoda_backend_testkit::conformance_suite!(
    "paged",
    tolerance = pagoda_backend_testkit::Tolerance::F32
);
