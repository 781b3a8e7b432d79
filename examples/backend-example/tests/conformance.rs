//! The conformance suite, run on this backend against `naive`.

// Link this crate so that its registration is in the inventory registry.
use pagoda_backend_example as _;
use pagoda_backend_testkit::{conformance_suite, Tolerance};

conformance_suite!("example", tolerance = Tolerance::F32);
