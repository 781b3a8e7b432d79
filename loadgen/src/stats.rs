//! Summary statistics of latency samples (mean, percentiles), numpy-compatible.

use serde::Serialize;

/// Mean, standard deviation and percentiles of one metric, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Dist {
    pub mean: f64,
    pub std: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub count: usize,
}

impl Dist {
    /// Summarises `samples` (seconds) in milliseconds; all zeros when empty.
    pub fn from_secs(samples: &[f64]) -> Dist {
        let ms: Vec<f64> = samples.iter().map(|s| s * 1e3).collect();
        Dist::of(&ms)
    }

    pub fn of(samples: &[f64]) -> Dist {
        if samples.is_empty() {
            return Dist::default();
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let mean = mean(&sorted);
        let var = sorted.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / sorted.len() as f64;
        Dist {
            mean,
            std: var.sqrt(),
            p50: percentile_sorted(&sorted, 50.0),
            p90: percentile_sorted(&sorted, 90.0),
            p99: percentile_sorted(&sorted, 99.0),
            max: *sorted.last().unwrap_or(&0.0),
            count: sorted.len(),
        }
    }
}

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// The `q`-th percentile (0..=100) of ascending `sorted`, interpolating linearly
/// between closest ranks like numpy's default, as vLLM's benchmark reports them.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (q.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

/// Median of unsorted values (used to combine rounds).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    percentile_sorted(&v, 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn numpy_examples() {
        // numpy.percentile([1,2,3,4], [50, 99]) == [2.5, 3.97]
        let v = [1.0, 2.0, 3.0, 4.0];
        assert!((percentile_sorted(&v, 50.0) - 2.5).abs() < 1e-12);
        assert!((percentile_sorted(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile_sorted(&v, 0.0), 1.0);
        assert_eq!(percentile_sorted(&v, 100.0), 4.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(Dist::of(&[]).count, 0);
        let d = Dist::from_secs(&[0.001, 0.003]);
        assert!((d.mean - 2.0).abs() < 1e-9 && (d.std - 1.0).abs() < 1e-9);
    }

    proptest! {
        /// Percentiles are monotone in q and lie between the min and the max; at
        /// a rank that is an integer they equal that order statistic exactly.
        #[test]
        fn percentile_props(mut v in proptest::collection::vec(-1e6f64..1e6, 1..60), q in 0.0f64..100.0) {
            v.sort_by(|a, b| a.total_cmp(b));
            let p = percentile_sorted(&v, q);
            prop_assert!(p >= v[0] && p <= v[v.len() - 1]);
            prop_assert!(percentile_sorted(&v, (q + 1.0).min(100.0)) >= p);
            let k = ((q / 100.0) * (v.len() - 1) as f64).floor() as usize;
            let exact_q = 100.0 * k as f64 / ((v.len() - 1).max(1)) as f64;
            if v.len() > 1 {
                prop_assert!((percentile_sorted(&v, exact_q) - v[k]).abs() <= 1e-9 * (1.0 + v[k].abs()));
            }
        }
    }
}
