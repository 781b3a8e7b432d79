//! `/metrics`: Prometheus text exposition with vLLM's metric names, so existing
//! vLLM dashboards work unchanged. Gauges and counters come from the engine's
//! [`EngineStats`]; the latency histograms are measured here, in the server, where
//! the client's view of time lives.

use pagoda_engine::EngineStats;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// vLLM's bucket bounds (seconds).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A Prometheus histogram: per-bucket counts (not cumulative; cumulated when rendered).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `counts[i]` = observations in (bounds[i-1], bounds[i]]; the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        // Bounds are sorted; the first bound >= v is the bucket.
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// Cumulative counts for each bound, then +Inf.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, &c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, name: &str, help: &str, labels: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (i, c) in self.cumulative().into_iter().enumerate() {
            let le = match self.bounds.get(i) {
                Some(b) => format!("{b:?}"),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", fmt_f64(self.sum));
    }
}

fn fmt_f64(v: f64) -> String {
    // Prometheus accepts Rust's `{:?}` float syntax (always has a dot or exponent).
    format!("{v:?}")
}

/// Server-side request latency histograms.
pub struct Metrics {
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
    /// Finished requests by reason: stop, length, abort, error.
    finished: Mutex<[u64; 4]>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(ITL_BUCKETS)),
            e2e: Mutex::new(Histogram::new(E2E_BUCKETS)),
            finished: Mutex::new([0; 4]),
        }
    }
}

impl Metrics {
    pub fn observe_ttft(&self, d: Duration) {
        self.ttft
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(d.as_secs_f64());
    }
    pub fn observe_itl(&self, d: Duration) {
        self.itl
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(d.as_secs_f64());
    }
    pub fn observe_e2e(&self, d: Duration, reason: pagoda_core::FinishReason) {
        self.e2e
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(d.as_secs_f64());
        let i = match reason {
            pagoda_core::FinishReason::Stop => 0,
            pagoda_core::FinishReason::Length => 1,
            pagoda_core::FinishReason::Abort => 2,
            pagoda_core::FinishReason::Error => 3,
        };
        self.finished.lock().unwrap_or_else(|e| e.into_inner())[i] += 1;
    }

    /// Counts a request that failed on its own (`finished_reason="error"`).
    pub fn count_error(&self) {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())[3] += 1;
    }

    /// The whole exposition: engine gauges and counters, then server histograms.
    pub fn render(&self, stats: &EngineStats, model_name: &str) -> String {
        let labels = format!("model_name=\"{}\"", escape_label(model_name));
        let mut out = String::with_capacity(8192);
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name}{{{labels}}} {}", fmt_f64(v));
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            stats.num_running as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            stats.num_waiting as f64,
        );
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            stats.kv_cache_usage,
        );
        // Counters: TYPE names the family, the sample carries `_total`, as
        // prometheus_client (and hence vLLM) writes them.
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name}_total{{{labels}}} {v}");
        };
        counter(
            &mut out,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        );
        counter(
            &mut out,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        );
        counter(
            &mut out,
            "vllm:num_preemptions",
            "Cumulative number of preemptions from the engine.",
            stats.num_preemptions,
        );
        counter(
            &mut out,
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            stats.prompt_tokens,
        );
        counter(
            &mut out,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens,
        );
        let finished = *self.finished.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            out,
            "# HELP vllm:request_success Count of successfully processed requests."
        );
        let _ = writeln!(out, "# TYPE vllm:request_success counter");
        for (reason, v) in ["stop", "length", "abort", "error"].iter().zip(finished) {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {v}"
            );
        }
        let lock = |m: &Mutex<Histogram>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
        lock(&self.ttft).render(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
            &mut out,
        );
        lock(&self.itl).render(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &labels,
            &mut out,
        );
        lock(&self.e2e).render(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &labels,
            &mut out,
        );
        out
    }
}

/// Escapes a Prometheus label value.
pub fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Per-request timing: arrival, first token, last token.
#[derive(Debug, Clone)]
pub struct RequestTimer {
    arrival: Instant,
    last_token: Option<Instant>,
}

impl RequestTimer {
    pub fn new(arrival: Instant) -> Self {
        RequestTimer {
            arrival,
            last_token: None,
        }
    }

    /// Records an output carrying `num_tokens` new tokens.
    pub fn on_tokens(&mut self, metrics: &Metrics, num_tokens: usize) {
        if num_tokens == 0 {
            return;
        }
        let now = Instant::now();
        match self.last_token {
            None => metrics.observe_ttft(now - self.arrival),
            Some(prev) => {
                // Several tokens in one output share the interval evenly.
                let per = (now - prev) / num_tokens as u32;
                for _ in 0..num_tokens {
                    metrics.observe_itl(per);
                }
            }
        }
        self.last_token = Some(now);
    }

    pub fn on_finish(&self, metrics: &Metrics, reason: pagoda_core::FinishReason) {
        metrics.observe_e2e(self.arrival.elapsed(), reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The bucketed histogram agrees with counting by definition (v <= le).
        #[test]
        fn histogram_matches_naive_counting(values in proptest::collection::vec(0.0f64..3000.0, 0..200)) {
            let mut h = Histogram::new(TTFT_BUCKETS);
            for &v in &values { h.observe(v); }
            let cum = h.cumulative();
            for (i, &le) in TTFT_BUCKETS.iter().enumerate() {
                let naive = values.iter().filter(|&&v| v <= le).count() as u64;
                prop_assert_eq!(cum[i], naive);
            }
            prop_assert_eq!(*cum.last().unwrap(), values.len() as u64);
            prop_assert_eq!(h.count(), values.len() as u64);
        }
    }

    #[test]
    fn exposition_has_vllm_names() {
        let m = Metrics::default();
        m.observe_ttft(Duration::from_millis(30));
        m.observe_e2e(Duration::from_millis(300), pagoda_core::FinishReason::Stop);
        let stats = EngineStats {
            num_running: 2,
            num_waiting: 1,
            kv_cache_usage: 0.25,
            prefix_cache_queries: 10,
            prefix_cache_hits: 4,
            num_preemptions: 1,
            prompt_tokens: 100,
            generation_tokens: 50,
            num_steps: 7,
        };
        let text = m.render(&stats, "smol\"lm");
        for line in [
            "vllm:num_requests_running{model_name=\"smol\\\"lm\"} 2.0",
            "vllm:num_requests_waiting{model_name=\"smol\\\"lm\"} 1.0",
            "vllm:kv_cache_usage_perc{model_name=\"smol\\\"lm\"} 0.25",
            "vllm:prefix_cache_queries_total{model_name=\"smol\\\"lm\"} 10",
            "vllm:prefix_cache_hits_total{model_name=\"smol\\\"lm\"} 4",
            "vllm:num_preemptions_total{model_name=\"smol\\\"lm\"} 1",
            "vllm:prompt_tokens_total{model_name=\"smol\\\"lm\"} 100",
            "vllm:generation_tokens_total{model_name=\"smol\\\"lm\"} 50",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",le=\"0.02\"} 0",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",le=\"0.04\"} 1",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",le=\"+Inf\"} 1",
            "vllm:time_to_first_token_seconds_count{model_name=\"smol\\\"lm\"} 1",
            "vllm:inter_token_latency_seconds_count{model_name=\"smol\\\"lm\"} 0",
            "vllm:e2e_request_latency_seconds_count{model_name=\"smol\\\"lm\"} 1",
            "vllm:request_success_total{model_name=\"smol\\\"lm\",finished_reason=\"stop\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing line {line}\n{text}"
            );
        }
        // Every sample line is `name{labels} value`, parseable as a float.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let v = l.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad value in {l}");
        }
    }
}
