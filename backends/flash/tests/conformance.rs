//! The shared conformance suite (pagoda-backend-testkit) run against `flash`.

use pagoda_backend_flash as _; // link the crate so its registration is seen

pagoda_backend_testkit::conformance_suite!(
    "flash",
    tolerance = pagoda_backend_testkit::Tolerance::F32
);
