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
//! The kit reads the backend's [`Capabilities`] to restrict shapes and row kinds:
//! decode-only backends get only query length 1, prefill-only backends only
//! query length >= 2. Unused cache slots are NaN, so any stray read fails.
//!
//! The subject is a registered name (looked up in the inventory registry) or a
//! [`Subject`] built from a constructor.
//!
//! A backend's own kernel tests (one layer, called directly) use [`direct`].
//! An fp8 KV cache's error against the f32 cache it rounds, with its derived bound,
//! is [`fp8`].

pub mod case;
pub mod checks;
pub mod direct;
pub mod fp8;
pub mod gen;
pub mod invariance;
pub mod place;
pub mod suite;
pub mod verify;

pub use checks::{Check, Outcome};
pub use pagoda_core;
pub use suite::{run_check, try_run_check, REQUIRE_DEVICE_ENV};

use pagoda_core::{
    registered_backends, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, InvalidReason, Role,
};
use thiserror::Error;

/// How close a backend must be to the f64-accumulated reference: element-wise
/// `|actual - expected| <= atol + rtol * |expected|` (NaN never passes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    /// f32 arithmetic against the f64 reference.
    pub const F32: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1e-4,
    };
    /// f16 inputs or accumulation (10-bit mantissa, eps ~1e-3).
    pub const F16: Tolerance = Tolerance {
        atol: 2e-3,
        rtol: 2e-3,
    };
    /// bf16 inputs or accumulation (7-bit mantissa, eps ~8e-3).
    pub const BF16: Tolerance = Tolerance {
        atol: 2e-2,
        rtol: 2e-2,
    };

    /// Whether `actual` is close enough to `expected`. Equal values (including two
    /// equal infinities, e.g. the LSE of a row with no keys) always pass.
    pub fn accepts(&self, actual: f32, expected: f32) -> bool {
        if actual == expected {
            return true;
        }
        let (a, b) = (actual as f64, expected as f64);
        (a - b).abs() <= self.atol + self.rtol * b.abs()
    }

    /// Compares two `[tokens, heads, width]` buffers (`width` = head dim, or 1 for LSE).
    pub fn compare(
        &self,
        check: &'static str,
        buffer: &'static str,
        actual: &[f32],
        expected: &[f32],
        heads: usize,
        width: usize,
    ) -> Result<(), KitError> {
        if actual.len() != expected.len() {
            return Err(KitError::Length {
                check,
                buffer,
                actual: actual.len(),
                expected: expected.len(),
            });
        }
        let bad: Vec<usize> = (0..actual.len())
            .filter(|&i| !self.accepts(actual[i], expected[i]))
            .collect();
        let Some(&first) = bad.first() else {
            return Ok(());
        };
        let max_abs_err = bad
            .iter()
            .map(|&i| (actual[i] as f64 - expected[i] as f64).abs())
            .fold(0.0, f64::max);
        Err(KitError::Mismatch {
            check,
            buffer,
            token: first / (heads * width),
            head: first / width % heads,
            dim: first % width,
            actual: actual[first],
            expected: expected[first],
            count: bad.len(),
            total: actual.len(),
            max_abs_err,
            tolerance: *self,
        })
    }
}

/// Why a check failed.
#[derive(Debug, Error)]
pub enum KitError {
    #[error(
        "{check}: {buffer} differs at token {token}, head {head}, dim {dim}: got {actual}, expected {expected} \
         ({count} of {total} elements off, max |err| {max_abs_err:e}, tolerance {tolerance:?})"
    )]
    Mismatch {
        check: &'static str,
        buffer: &'static str,
        token: usize,
        head: usize,
        dim: usize,
        actual: f32,
        expected: f32,
        count: usize,
        total: usize,
        max_abs_err: f64,
        tolerance: Tolerance,
    },
    #[error("{check}: {buffer} has {actual} elements, expected {expected}")]
    Length {
        check: &'static str,
        buffer: &'static str,
        actual: usize,
        expected: usize,
    },
    #[error("backend `{backend}` failed in {stage}: {source}")]
    Backend {
        backend: String,
        stage: &'static str,
        #[source]
        source: CoreError,
    },
    #[error(
        "backend `{name}` is not registered; is its crate linked? Add `use {crate_hint} as _;` to the test \
         (registered: {registered})"
    )]
    NotRegistered {
        name: String,
        crate_hint: String,
        registered: String,
    },
    #[error(
        "{check}: backend `{backend}` refuses a configuration its capabilities accept: {reasons}"
    )]
    Refused {
        check: &'static str,
        backend: String,
        reasons: String,
    },
    #[error("{check}: {message}")]
    Protocol {
        check: &'static str,
        message: String,
    },
}

/// A cap on a subject's cases ([`Subject::small_cases`]): the work budget per case
/// (query-key-dim products over heads, at most [`gen::WORK_BUDGET`]; rows are dropped,
/// then the last row's context and query halved, to fit) and the cases per check (at
/// most each check's own number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaseLimit {
    pub work: u64,
    pub cases: u32,
}

impl CaseLimit {
    /// What the emulated CUDA backends use: ~20k multiply-adds, 10 cases per check.
    pub const EMULATOR: CaseLimit = CaseLimit {
        work: 20_000,
        cases: 10,
    };
}

type Create = dyn Fn(&AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError>;
type Reasons = dyn Fn(&AttentionConfig) -> Vec<InvalidReason>;

/// The backend under test: a name, its capabilities, a constructor, and where its
/// buffers live ([`Subject::on`]; by default the first of cpu, emu, cuda:0 that its
/// capabilities list, with f32 where supported, else its first dtype).
pub struct Subject {
    pub name: String,
    pub capabilities: Capabilities,
    /// Device and dtypes of every case, if chosen.
    pub placement: Option<place::Placement>,
    /// Smaller cases for a slow subject ([`Subject::small_cases`]).
    pub case_limit: Option<CaseLimit>,
    /// Every case draws the sliding window and soft cap the subject declares
    /// ([`Subject::features_always`]).
    pub features_always: bool,
    runtime_reasons: Box<Reasons>,
    create: Box<Create>,
}

impl Subject {
    /// A subject from a constructor returning a boxed backend.
    pub fn new(
        name: impl Into<String>,
        capabilities: Capabilities,
        create: impl Fn(&AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> + 'static,
    ) -> Self {
        Subject {
            name: name.into(),
            capabilities,
            placement: None,
            case_limit: None,
            features_always: false,
            runtime_reasons: Box::new(|_| Vec::new()),
            create: Box::new(create),
        }
    }

    /// A subject from a typed constructor such as `NaiveBackend::new`.
    pub fn from_ctor<B: AttentionBackend + 'static>(
        name: impl Into<String>,
        capabilities: Capabilities,
        ctor: impl Fn(&AttentionConfig) -> Result<B, CoreError> + 'static,
    ) -> Self {
        Self::new(name, capabilities, move |cfg| {
            Ok(Box::new(ctor(cfg)?) as Box<dyn AttentionBackend>)
        })
    }

    /// The subject a registry entry describes.
    pub fn from_registration(reg: &'static BackendRegistration) -> Self {
        Subject {
            name: reg.name.to_string(),
            capabilities: (reg.capabilities)(),
            placement: None,
            case_limit: None,
            features_always: false,
            runtime_reasons: Box::new(reg.runtime_reasons),
            create: Box::new(reg.create),
        }
    }

    /// Looks `name` up among the linked backends.
    pub fn registered(name: &str) -> Result<Self, KitError> {
        let all = registered_backends();
        match all.iter().find(|r| r.name == name) {
            Some(reg) => Ok(Self::from_registration(reg)),
            None => Err(KitError::NotRegistered {
                name: name.to_string(),
                crate_hint: format!("pagoda_backend_{}", name.replace('-', "_")),
                registered: all.iter().map(|r| r.name).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// The same subject with its buffers on `device`, queries (and outputs) of
    /// `q_dtype`, the KV cache of `kv_dtype`: one test body per device and dtype.
    pub fn on(
        mut self,
        device: pagoda_core::Device,
        q_dtype: pagoda_core::DType,
        kv_dtype: pagoda_core::DType,
    ) -> Self {
        self.placement = Some(place::Placement {
            device,
            q_dtype,
            kv_dtype,
        });
        self
    }

    /// The same subject checked on smaller and fewer cases: for a backend that runs
    /// slowly here (the CUDA kernels through the SIMT emulator), so that its suite
    /// keeps every check and stays within a test's time.
    pub fn small_cases(mut self, limit: CaseLimit) -> Self {
        self.case_limit = Some(limit);
        self
    }

    /// The same subject with a sliding window and a soft cap in every case (those its
    /// capabilities declare; otherwise a quarter of the cases draw each): for a slow
    /// subject whose few cases must still exercise them.
    pub fn features_always(mut self) -> Self {
        self.features_always = true;
        self
    }

    /// Every reason the subject cannot serve `cfg` in `role`.
    pub fn reasons(&self, cfg: &AttentionConfig, role: Role) -> Vec<InvalidReason> {
        let mut r = (self.runtime_reasons)(cfg);
        r.extend(self.capabilities.reasons(cfg, role));
        r
    }

    /// A fresh backend for `cfg`.
    pub fn create(&self, cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, KitError> {
        (self.create)(cfg).map_err(|source| KitError::Backend {
            backend: self.name.clone(),
            stage: "create",
            source,
        })
    }

    /// The role a batch with these query lengths needs.
    pub fn role_of(query_lens: &[usize]) -> Role {
        match (query_lens.contains(&1), query_lens.iter().any(|&q| q > 1)) {
            (true, true) => Role::Both,
            (false, true) => Role::Prefill,
            _ => Role::Decode,
        }
    }
}

/// What the macro accepts as a subject: a registered name or a [`Subject`].
pub trait IntoSubject {
    fn into_subject(self) -> Result<Subject, KitError>;
}

impl IntoSubject for Subject {
    fn into_subject(self) -> Result<Subject, KitError> {
        Ok(self)
    }
}

impl IntoSubject for &str {
    fn into_subject(self) -> Result<Subject, KitError> {
        Subject::registered(self)
    }
}

impl IntoSubject for String {
    fn into_subject(self) -> Result<Subject, KitError> {
        Subject::registered(&self)
    }
}

impl IntoSubject for Result<Subject, KitError> {
    fn into_subject(self) -> Result<Subject, KitError> {
        self
    }
}

impl IntoSubject for &'static BackendRegistration {
    fn into_subject(self) -> Result<Subject, KitError> {
        Ok(Subject::from_registration(self))
    }
}

/// Generates the conformance suite as `#[test]` functions.
///
/// `conformance_suite!(SUBJECT)` or `conformance_suite!(SUBJECT, tolerance = Tolerance::F32)`,
/// where `SUBJECT` is a registered name (`"example"`) or an expression building a
/// [`Subject`]. It expands to several `fn conformance_*` items, so invoke it once
/// per module (wrap further invocations in their own `mod`).
/// Failing seeds are persisted beside the invoking file, e.g.
/// `tests/conformance.proptest-regressions` (commit it).
#[macro_export]
macro_rules! conformance_suite {
    ($subject:expr $(,)?) => {
        $crate::conformance_suite!($subject, tolerance = $crate::Tolerance::F32);
    };
    ($subject:expr, tolerance = $tol:expr $(,)?) => {
        $crate::conformance_suite!(@one conformance_random_batches_match_naive, RandomBatches, $subject, $tol);
        $crate::conformance_suite!(@one conformance_block_permutation_changes_nothing, BlockPermutation, $subject, $tol);
        $crate::conformance_suite!(@one conformance_request_alone_equals_in_batch, AloneEqualsInBatch, $subject, $tol);
        $crate::conformance_suite!(@one conformance_decode_equals_last_prefill_row, DecodeEqualsPrefill, $subject, $tol);
        $crate::conformance_suite!(@one conformance_gqa_equals_repeated_kv_mha, GqaEqualsMha, $subject, $tol);
        $crate::conformance_suite!(@one conformance_lse_merge_of_kv_halves_equals_whole, LseMergeKvHalves, $subject, $tol);
        $crate::conformance_suite!(@one conformance_lse_merge_of_context_and_chunk_equals_whole, LseMergeContextAndChunk, $subject, $tol);
        $crate::conformance_suite!(@one conformance_bad_buffers_are_errors, BadBuffers, $subject, $tol);
        $crate::conformance_suite!(@one conformance_batch_invariant_bits, BatchInvariance, $subject, $tol);
        $crate::conformance_suite!(@one conformance_verify_runs_match_naive, VerifyRuns, $subject, $tol);
    };
    (@one $name:ident, $check:ident, $subject:expr, $tol:expr) => {
        #[test]
        fn $name() {
            $crate::run_check($crate::Check::$check, $subject, $tol, ::core::option::Option::Some(file!()));
        }
    };
}

/// One [`conformance_suite!`] per `(module, dtype, tolerance)`: the registered backend
/// `name` with q and KV of that dtype on `device`, each subject passed through
/// `|s| adjust` (e.g. the emulator's case limit), in a module of that name:
///
/// ```ignore
/// pagoda_backend_testkit::conformance_suites!(
///     "cuda-paged", Device::Emu, |s| s.small_cases(CaseLimit::EMULATOR),
///     [(bf16, BF16, BF16), (f16, F16, F16), (f32, F32, F32)]
/// );
/// ```
///
/// The dtype and tolerance are the names of a [`pagoda_core::DType`] and a
/// [`Tolerance`] preset.
#[macro_export]
macro_rules! conformance_suites {
    ($name:expr, $device:expr, |$s:ident| $adjust:expr,
     [$(($module:ident, $dtype:ident, $tol:ident)),+ $(,)?] $(,)?) => {
        $(
            mod $module {
                #[allow(unused_imports)]
                use super::*;
                $crate::conformance_suite!(
                    $crate::Subject::registered($name).map(|$s| {
                        let $s = $s.on(
                            $device,
                            $crate::pagoda_core::DType::$dtype,
                            $crate::pagoda_core::DType::$dtype,
                        );
                        $adjust
                    }),
                    tolerance = $crate::Tolerance::$tol
                );
            }
        )+
    };
}
