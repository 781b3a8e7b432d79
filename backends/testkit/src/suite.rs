//! The proptest drivers behind the macro: draw cases within the subject's
//! capabilities, run one [`Check`] on each, shrink failures; and the macros
//! themselves ([`conformance_suite!`](crate::conformance_suite),
//! [`conformance_suites!`](crate::conformance_suites)), which expand to calls of
//! [`run_check`]. The top of the kit: nothing in it uses this module.

use crate::checks::Check;
use crate::error::Tolerance;
use crate::gen::{case_spec, Shapes};
use crate::judge::Outcome;
use crate::subject::{IntoSubject, Subject};
use pagoda_core::DeviceKind;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestError, TestRunner};

/// Set (to anything) where the subjects' devices must exist: a check whose device is
/// unavailable then fails instead of being skipped (scripts/device-check.sh sets it).
pub const REQUIRE_DEVICE_ENV: &str = "PAGODA_REQUIRE_DEVICE";

/// Runs `check` and panics with the minimal failing case (what the macro's tests call);
/// skips it, saying why, when the subject's device is unavailable in this process.
pub fn run_check(
    check: Check,
    subject: impl IntoSubject,
    tol: Tolerance,
    source_file: Option<&'static str>,
) {
    let subject = subject.into_subject().unwrap_or_else(|e| panic!("{e}"));
    if let Some(p) = &subject.placement {
        if let Some(why) = pagoda_core::device_unavailable(p.device) {
            // A device this machine lacks (no GPU here, nor in CI): the check cannot run.
            // The device check sets REQUIRE_DEVICE_ENV, where a skip is a failure.
            assert!(
                std::env::var_os(REQUIRE_DEVICE_ENV).is_none(),
                "{check:?} on {}: device unavailable ({why}) but {REQUIRE_DEVICE_ENV} is set",
                p.device
            );
            eprintln!("{check:?}: skipped on {}: {why}", p.device);
            return;
        }
    }
    if let Err(message) = try_run_check(check, &subject, tol, source_file) {
        panic!(
            "conformance check {check:?} failed for backend `{}`:\n{message}",
            subject.name
        );
    }
}

/// Runs `check`; `Err` holds proptest's report (minimal input and the kit's error).
/// `source_file` enables persisting failing seeds beside it, in
/// `<file stem>.proptest-regressions` (commit that file).
pub fn try_run_check(
    check: Check,
    subject: &Subject,
    tol: Tolerance,
    source_file: Option<&'static str>,
) -> Result<(), String> {
    let caps = &subject.capabilities;
    if !caps.decode && !caps.prefill {
        return Err(format!(
            "backend `{}` declares neither decode nor prefill",
            subject.name
        ));
    }
    if !caps.devices.contains(&DeviceKind::Cpu) && !caps.devices.contains(&DeviceKind::Cuda) {
        return Err(format!("backend `{}` declares no device", subject.name));
    }
    let shapes = Shapes::of(subject);
    if check == Check::GqaEqualsMha && shapes.max_group < 2 {
        eprintln!("{check:?}: skipped, `{}` supports no GQA", subject.name);
        return Ok(());
    }
    if let Some(why) = check.not_applicable(caps) {
        eprintln!("{check:?}: skipped, `{}` {why}", subject.name);
        return Ok(());
    }
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(check.cases())
        .min(subject.case_limit.map_or(u32::MAX, |l| l.cases));
    let config = Config {
        cases,
        max_shrink_iters: 2048,
        source_file,
        failure_persistence: source_file.map(|_| {
            Box::new(FileFailurePersistence::SourceParallel(
                "proptest-regressions",
            )) as _
        }),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = case_spec(&shapes, check.min_group());
    if check == Check::BatchInvariance {
        // Only a backend that declares it is checked: ask one instance, of the
        // first drawn configuration it can serve (its capabilities may accept a
        // head dim that only some dtypes have).
        let mut gen = TestRunner::deterministic();
        let mut declared = Err(String::from("no case drawn"));
        for _ in 0..64 {
            let spec = strategy
                .new_tree(&mut gen)
                .map_err(|e| e.to_string())?
                .current();
            declared = subject
                .create(&spec.config(subject))
                .map(|b| b.batch_invariant())
                .map_err(|e| e.to_string());
            if declared.is_ok() {
                break;
            }
        }
        if declared?.is_none() {
            eprintln!(
                "{check:?}: skipped, `{}` declares no batch invariance",
                subject.name
            );
            return Ok(());
        }
    }
    let result = runner.run(&strategy, |spec| match check.run(subject, &spec, tol) {
        Ok(Outcome::Passed) => Ok(()),
        Ok(Outcome::NotApplicable) => Err(TestCaseError::reject("not applicable to this case")),
        Err(e) => Err(TestCaseError::fail(e.to_string())),
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(reason, spec)) => Err(format!("{reason}\nminimal failing case: {spec:#?}")),
        Err(TestError::Abort(reason)) => Err(format!(
            "aborted: {reason} (are most shapes the capabilities accept refused by runtime_reasons?)"
        )),
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

/// One [`conformance_suite!`](crate::conformance_suite) per `(module, dtype, tolerance)`: the registered backend
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
