//! Sanity: the suite run on `naive` against itself passes, through both ways of
//! naming a subject (registry name and constructor).

use pagoda_backend_naive::{capabilities, NaiveBackend};
use pagoda_backend_testkit::{conformance_suite, Subject, Tolerance};

conformance_suite!("naive", tolerance = Tolerance::F32);

mod by_constructor {
    use super::*;
    conformance_suite!(Subject::from_ctor(
        "naive-ctor",
        capabilities(),
        NaiveBackend::new
    ));
}
