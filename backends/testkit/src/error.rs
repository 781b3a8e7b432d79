//! Why a check failed ([`KitError`]) and how close a backend's output must be to the
//! reference ([`Tolerance`]).
//!
//! One module for the two because each names the other: a comparison that fails
//! ([`Tolerance::compare`]) is a [`KitError::Mismatch`], which carries the tolerance it
//! failed. Nearly every module of the kit uses this one; it uses none of them.

use pagoda_core::CoreError;
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
