//! The conformance kit: one macro runs the whole backend suite against the naive reference.
//!
//! A backend crate adds this crate as a dev-dependency and writes
//! `tests/conformance.rs`:
//!
//! ```ignore
//! use pagoda_backend_example as _; // link the crate so its registration is seen
//! pagoda_backend_testkit::conformance_suite!("example", tolerance = pagoda_backend_testkit::Tolerance::F32);
//! ```
//!
//! That expands to one `#[test]` per [`Check`]: random batches compared with
//! `naive` (proptest), plus metamorphic checks (block permutation, batch
//! composition, decode vs prefill, GQA vs MHA, LSE merging), a bad-buffer check,
//! and, for a backend that declares `batch_invariant`, bit-exact invariance under
//! re-batching, re-chunking, block renumbering and thread counts.
//! The kit reads the backend's [`Capabilities`](pagoda_core::Capabilities) to
//! restrict shapes and row kinds: decode-only backends get only query length 1,
//! prefill-only backends only query length >= 2. Unused cache slots are NaN, so any
//! stray read fails.
//!
//! The subject is a registered name (looked up in the inventory registry) or a
//! [`Subject`] built from a constructor.
//!
//! A backend's own kernel tests (one layer, called directly) use [`direct`].
//! An fp8 KV cache's error against the f32 cache it rounds, with its derived bound,
//! is [`fp8`].
//!
//! The modules go leaf first, each using only ones before it here: `place` (where a
//! case's buffers live, the reference backend) and `error` ([`KitError`],
//! [`Tolerance`]); `subject` ([`Subject`]); `gen` (drawing cases); `case` (one case,
//! built and run); `judge` (what the checks share: the backends a case runs on, how
//! outputs are compared, [`Outcome`]); `invariance` and `verify` (two checks);
//! [`checks`] (the rest, and [`Check`], which dispatches to all); [`suite`] (the
//! proptest drivers and the macros). [`direct`] and [`fp8`], for backends' own
//! tests, stand beside the checks on `gen`, `case` and `judge`. This file only
//! declares and re-exports.

pub mod case;
pub mod checks;
pub mod direct;
mod error;
pub mod fp8;
pub mod gen;
pub mod invariance;
mod judge;
pub mod place;
mod subject;
pub mod suite;
pub mod verify;

pub use checks::Check;
pub use error::{KitError, Tolerance};
pub use judge::Outcome;
pub use pagoda_core;
pub use subject::{CaseLimit, IntoSubject, Subject};
pub use suite::{run_check, try_run_check, REQUIRE_DEVICE_ENV};
