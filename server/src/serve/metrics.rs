//! `/metrics`: Prometheus text exposition with vLLM's metric names, labels
//! (`model_name`, `engine`) and bucket bounds (`vllm/v1/metrics/loggers.py`), so
//! existing vLLM dashboards work unchanged. Gauges, counters and the per-step
//! `iteration_tokens_total` come from the engine's [`EngineStats`]; TTFT, ITL and
//! e2e latency are measured here, in the server, where the client's view of time
//! lives; the per-request histograms (prompt/generation tokens, `n`, `max_tokens`,
//! queue/prefill/decode/inference time) from the engine's [`RequestMetrics`] of
//! each finished request.

use pagoda_engine::{EngineStats, RequestMetrics, ITERATION_TOKENS_BUCKETS};
use std::fmt::Write;
use std::sync::{Arc, Mutex};
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

/// vLLM's `request_latency_buckets` (queue, inference, prefill and decode time too).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = E2E_BUCKETS;
/// vLLM's `vllm:request_params_n` bounds.
pub const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// vLLM's `build_1_2_5_buckets(max_value)`: 1, 2, 5, 10, 20, 50, ... up to `max_value`.
pub fn build_1_2_5_buckets(max_value: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max_value => out.push(v as f64),
                _ => return out,
            }
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => return out,
        };
    }
}

/// A Prometheus histogram: per-bucket counts (not cumulative; cumulated when rendered).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Arc<[f64]>,
    /// `counts[i]` = observations in (bounds[i-1], bounds[i]]; the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: impl Into<Arc<[f64]>>) -> Self {
        let bounds: Arc<[f64]> = bounds.into();
        Histogram {
            counts: vec![0; bounds.len() + 1],
            bounds,
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

    pub fn sum(&self) -> f64 {
        self.sum
    }

    fn render(&self, name: &str, help: &str, labels: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        self.render_samples(name, labels, out);
    }

    /// The bucket, count and sum samples, without the HELP/TYPE header.
    fn render_samples(&self, name: &str, labels: &str, out: &mut String) {
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

/// The `vllm:cache_config_info` labels (vLLM's `CacheConfig` fields that apply).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfigInfo {
    pub block_size: usize,
    pub gpu_memory_utilization: f64,
    pub cache_dtype: String,
    pub enable_prefix_caching: bool,
    pub num_gpu_blocks: usize,
}

/// Histograms of finished requests, observed from their [`RequestMetrics`].
struct RequestHistograms {
    prompt_tokens: Histogram,
    generation_tokens: Histogram,
    max_tokens: Histogram,
    queue: Histogram,
    inference: Histogram,
    prefill: Histogram,
    decode: Histogram,
}

/// Server-side request histograms.
pub struct Metrics {
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
    n: Mutex<Histogram>,
    requests: Mutex<RequestHistograms>,
    cache_config: Mutex<Option<CacheConfigInfo>>,
    /// Finished requests by reason: stop, length, abort, error.
    finished: Mutex<[u64; 4]>,
}

impl Default for Metrics {
    /// Token-count buckets up to 8192 tokens; servers use [`Metrics::new`].
    fn default() -> Self {
        Metrics::new(8192)
    }
}

impl Metrics {
    /// Token-count histograms get vLLM's 1-2-5 buckets up to `max_model_len`.
    pub fn new(max_model_len: usize) -> Self {
        let tokens: Arc<[f64]> = build_1_2_5_buckets(max_model_len).into();
        Metrics {
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(ITL_BUCKETS)),
            e2e: Mutex::new(Histogram::new(E2E_BUCKETS)),
            n: Mutex::new(Histogram::new(N_BUCKETS)),
            requests: Mutex::new(RequestHistograms {
                prompt_tokens: Histogram::new(tokens.clone()),
                generation_tokens: Histogram::new(tokens.clone()),
                max_tokens: Histogram::new(tokens),
                queue: Histogram::new(REQUEST_LATENCY_BUCKETS),
                inference: Histogram::new(REQUEST_LATENCY_BUCKETS),
                prefill: Histogram::new(REQUEST_LATENCY_BUCKETS),
                decode: Histogram::new(REQUEST_LATENCY_BUCKETS),
            }),
            cache_config: Mutex::new(None),
            finished: Mutex::new([0; 4]),
        }
    }

    /// Sets what `vllm:cache_config_info` reports.
    pub fn set_cache_config(&self, c: CacheConfigInfo) {
        *self.cache_config.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// `vllm:request_params_n`: once per prompt of a request.
    pub fn observe_n(&self, n: usize) {
        self.n
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(n as f64);
    }

    /// The per-request histograms of a finished request (vLLM observes
    /// `max_tokens` only when set, which it always is here: the request's or the
    /// room left in the context).
    pub fn observe_finished(&self, m: &RequestMetrics) {
        let mut h = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        h.prompt_tokens.observe(m.num_prompt_tokens as f64);
        h.generation_tokens.observe(m.num_generation_tokens as f64);
        if m.max_tokens > 0 {
            h.max_tokens.observe(m.max_tokens as f64);
        }
        let secs = |d: Option<Duration>| d.unwrap_or_default().as_secs_f64();
        h.queue.observe(secs(m.queue_time()));
        h.inference.observe(secs(m.inference_time()));
        h.prefill.observe(secs(m.prefill_time()));
        h.decode.observe(secs(m.decode_time()));
    }

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

    /// The whole exposition: each engine core's gauges and counters (one sample per
    /// data-parallel rank, labelled `engine`), then the server's histograms.
    pub fn render(&self, ranks: &[EngineStats], model_name: &str) -> String {
        let model = escape_label(model_name);
        let labels = format!("model_name=\"{model}\",engine=\"0\"");
        let mut out = String::with_capacity(8192);
        render_engines(&mut out, ranks, &model);
        render_spec_decode(&mut out, ranks, &model);
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
        render_iteration_tokens(&mut out, ranks, &model);
        lock(&self.n).render(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            &labels,
            &mut out,
        );
        let h = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for (hist, name, help) in [
            (
                &h.prompt_tokens,
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
            ),
            (
                &h.generation_tokens,
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
            ),
            (
                &h.max_tokens,
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
            ),
            (
                &h.queue,
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
            ),
            (
                &h.inference,
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
            ),
            (
                &h.prefill,
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
            ),
            (
                &h.decode,
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
            ),
        ] {
            hist.render(name, help, &labels, &mut out);
        }
        drop(h);
        if let Some(c) = &*self.cache_config.lock().unwrap_or_else(|e| e.into_inner()) {
            // An info metric: a gauge at 1 whose labels are the configuration, with
            // Python's spelling of the values (vLLM's `metrics_info()`).
            let py_bool = |b: bool| if b { "True" } else { "False" };
            let _ = writeln!(
                out,
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig"
            );
            let _ = writeln!(out, "# TYPE vllm:cache_config_info gauge");
            let _ = writeln!(
                out,
                "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"{}\",cpu_offload_gb=\"0\",enable_prefix_caching=\"{}\",engine=\"0\",gpu_memory_utilization=\"{}\",is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"None\",sliding_window=\"None\",swap_space=\"0\"}} 1.0",
                c.block_size,
                escape_label(&c.cache_dtype),
                py_bool(c.enable_prefix_caching),
                fmt_f64(c.gpu_memory_utilization),
                c.num_gpu_blocks,
            );
        }
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

/// The pre-V1 names that the production-stack router and older dashboards still
/// scrape, beside the current ones (the same values).
/// One metric with a sample per rank: `value` of each rank's stats.
fn per_rank(
    out: &mut String,
    (name, kind, help): (&str, &str, &str),
    ranks: &[EngineStats],
    model: &str,
    value: impl Fn(&EngineStats) -> String,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    // Counters: TYPE names the family, the sample carries `_total`, as
    // prometheus_client (and hence vLLM) writes them.
    let sample = if kind == "counter" {
        format!("{name}_total")
    } else {
        name.to_string()
    };
    for (rank, stats) in ranks.iter().enumerate() {
        let _ = writeln!(
            out,
            "{sample}{{model_name=\"{model}\",engine=\"{rank}\"}} {}",
            value(stats)
        );
    }
}

/// The engine cores' gauges and counters, current names then the legacy ones the
/// production-stack router still scrapes.
fn render_engines(out: &mut String, ranks: &[EngineStats], model: &str) {
    type Metric = (
        (&'static str, &'static str, &'static str),
        fn(&EngineStats) -> String,
    );
    let metrics: [Metric; 12] = [
        (
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
            |s| fmt_f64(s.num_running as f64),
        ),
        (
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
            |s| fmt_f64(s.num_waiting as f64),
        ),
        (
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
            |s| fmt_f64(s.kv_cache_usage),
        ),
        (
            ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
            |s| s.prefix_cache_queries.to_string(),
        ),
        (
            ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
            |s| s.prefix_cache_hits.to_string(),
        ),
        (
            ("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage (legacy name of vllm:kv_cache_usage_perc)."),
            |s| fmt_f64(s.kv_cache_usage),
        ),
        (
            ("vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache hit rate (legacy: hits / queries, in tokens)."),
            |s| {
                let rate = if s.prefix_cache_queries == 0 {
                    0.0
                } else {
                    s.prefix_cache_hits as f64 / s.prefix_cache_queries as f64
                };
                fmt_f64(rate)
            },
        ),
        (
            ("vllm:gpu_prefix_cache_queries", "counter", "GPU prefix cache queries, in tokens (legacy name of vllm:prefix_cache_queries)."),
            |s| s.prefix_cache_queries.to_string(),
        ),
        (
            ("vllm:gpu_prefix_cache_hits", "counter", "GPU prefix cache hits, in tokens (legacy name of vllm:prefix_cache_hits)."),
            |s| s.prefix_cache_hits.to_string(),
        ),
        (
            ("vllm:num_preemptions", "counter", "Cumulative number of preemptions from the engine."),
            |s| s.num_preemptions.to_string(),
        ),
        (
            ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
            |s| s.prompt_tokens.to_string(),
        ),
        (
            ("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
            |s| s.generation_tokens.to_string(),
        ),
    ];
    for (head, value) in metrics {
        per_rank(out, head, ranks, model, value);
    }
}

/// vLLM's speculative-decoding counters (zero without `--speculative-config`), the
/// per-position acceptances labelled `position` (0-based, as vLLM's).
fn render_spec_decode(out: &mut String, ranks: &[EngineStats], model: &str) {
    type Counter = (
        (&'static str, &'static str, &'static str),
        fn(&EngineStats) -> String,
    );
    let counters: [Counter; 3] = [
        (
            (
                "vllm:spec_decode_num_drafts",
                "counter",
                "Number of spec decoding drafts.",
            ),
            |s| s.spec_decoding.num_drafts.to_string(),
        ),
        (
            (
                "vllm:spec_decode_num_draft_tokens",
                "counter",
                "Number of draft tokens.",
            ),
            |s| s.spec_decoding.num_draft_tokens.to_string(),
        ),
        (
            (
                "vllm:spec_decode_num_accepted_tokens",
                "counter",
                "Number of accepted tokens.",
            ),
            |s| s.spec_decoding.num_accepted_tokens.to_string(),
        ),
    ];
    for (head, value) in counters {
        per_rank(out, head, ranks, model, value);
    }
    let name = "vllm:spec_decode_num_accepted_tokens_per_pos";
    let _ = writeln!(out, "# HELP {name} Accepted tokens per draft position.");
    let _ = writeln!(out, "# TYPE {name} counter");
    for (rank, stats) in ranks.iter().enumerate() {
        for (pos, c) in stats
            .spec_decoding
            .num_accepted_tokens_per_pos
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                out,
                "{name}_total{{model_name=\"{model}\",engine=\"{rank}\",position=\"{pos}\"}} {c}"
            );
        }
    }
}

/// `vllm:iteration_tokens_total`, one histogram per rank under one header.
fn render_iteration_tokens(out: &mut String, ranks: &[EngineStats], model: &str) {
    let name = "vllm:iteration_tokens_total";
    let _ = writeln!(
        out,
        "# HELP {name} Histogram of number of tokens per engine_step."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (rank, stats) in ranks.iter().enumerate() {
        let mut h = Histogram::new(
            ITERATION_TOKENS_BUCKETS
                .iter()
                .map(|&b| b as f64)
                .collect::<Vec<_>>(),
        );
        h.counts = stats.iteration_tokens.buckets.to_vec();
        h.sum = stats.iteration_tokens.sum as f64;
        h.count = stats.iteration_tokens.count;
        h.render_samples(
            name,
            &format!("model_name=\"{model}\",engine=\"{rank}\""),
            out,
        );
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
            iteration_tokens: Default::default(),
            spec_decoding: pagoda_engine::SpecDecodingStats {
                num_drafts: 3,
                num_draft_tokens: 9,
                num_accepted_tokens: 5,
                num_accepted_tokens_per_pos: vec![3, 2, 0],
            },
        };
        let text = m.render(std::slice::from_ref(&stats), "smol\"lm");
        for line in [
            "vllm:num_requests_running{model_name=\"smol\\\"lm\",engine=\"0\"} 2.0",
            "vllm:num_requests_waiting{model_name=\"smol\\\"lm\",engine=\"0\"} 1.0",
            "vllm:kv_cache_usage_perc{model_name=\"smol\\\"lm\",engine=\"0\"} 0.25",
            "vllm:prefix_cache_queries_total{model_name=\"smol\\\"lm\",engine=\"0\"} 10",
            "vllm:prefix_cache_hits_total{model_name=\"smol\\\"lm\",engine=\"0\"} 4",
            "vllm:num_preemptions_total{model_name=\"smol\\\"lm\",engine=\"0\"} 1",
            "vllm:gpu_cache_usage_perc{model_name=\"smol\\\"lm\",engine=\"0\"} 0.25",
            "vllm:gpu_prefix_cache_hit_rate{model_name=\"smol\\\"lm\",engine=\"0\"} 0.4",
            "vllm:gpu_prefix_cache_hits_total{model_name=\"smol\\\"lm\",engine=\"0\"} 4",
            "vllm:gpu_prefix_cache_queries_total{model_name=\"smol\\\"lm\",engine=\"0\"} 10",
            "vllm:prompt_tokens_total{model_name=\"smol\\\"lm\",engine=\"0\"} 100",
            "vllm:generation_tokens_total{model_name=\"smol\\\"lm\",engine=\"0\"} 50",
            "vllm:spec_decode_num_drafts_total{model_name=\"smol\\\"lm\",engine=\"0\"} 3",
            "vllm:spec_decode_num_draft_tokens_total{model_name=\"smol\\\"lm\",engine=\"0\"} 9",
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"smol\\\"lm\",engine=\"0\"} 5",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"smol\\\"lm\",engine=\"0\",position=\"1\"} 2",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",engine=\"0\",le=\"0.02\"} 0",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",engine=\"0\",le=\"0.04\"} 1",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",engine=\"0\",le=\"+Inf\"} 1",
            "vllm:time_to_first_token_seconds_count{model_name=\"smol\\\"lm\",engine=\"0\"} 1",
            "vllm:inter_token_latency_seconds_count{model_name=\"smol\\\"lm\",engine=\"0\"} 0",
            "vllm:e2e_request_latency_seconds_count{model_name=\"smol\\\"lm\",engine=\"0\"} 1",
            "vllm:request_success_total{model_name=\"smol\\\"lm\",engine=\"0\",finished_reason=\"stop\"} 1",
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

    #[test]
    fn one_two_five_buckets_as_vllm() {
        assert_eq!(
            build_1_2_5_buckets(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(build_1_2_5_buckets(8192).last(), Some(&5000.0));
        assert_eq!(build_1_2_5_buckets(0), Vec::<f64>::new());
    }

    #[test]
    fn request_histograms_and_info_metrics() {
        let m = Metrics::new(100);
        m.set_cache_config(CacheConfigInfo {
            block_size: 16,
            gpu_memory_utilization: 0.9,
            cache_dtype: "auto".into(),
            enable_prefix_caching: true,
            num_gpu_blocks: 512,
        });
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        m.observe_finished(&RequestMetrics {
            queued: t0,
            scheduled: Some(ms(100)),
            first_token: Some(ms(400)),
            last_token: Some(ms(1400)),
            num_prompt_tokens: 7,
            num_generation_tokens: 30,
            max_tokens: 30,
        });
        m.observe_n(2);
        let mut stats = EngineStats::default();
        stats.iteration_tokens.observe(9);
        stats.iteration_tokens.observe(1);
        let text = m.render(std::slice::from_ref(&stats), "m");
        for line in [
            "vllm:request_prompt_tokens_bucket{model_name=\"m\",engine=\"0\",le=\"5.0\"} 0",
            "vllm:request_prompt_tokens_bucket{model_name=\"m\",engine=\"0\",le=\"10.0\"} 1",
            "vllm:request_prompt_tokens_sum{model_name=\"m\",engine=\"0\"} 7.0",
            "vllm:request_generation_tokens_bucket{model_name=\"m\",engine=\"0\",le=\"50.0\"} 1",
            "vllm:request_generation_tokens_bucket{model_name=\"m\",engine=\"0\",le=\"100.0\"} 1",
            "vllm:request_params_max_tokens_sum{model_name=\"m\",engine=\"0\"} 30.0",
            "vllm:request_params_n_bucket{model_name=\"m\",engine=\"0\",le=\"1.0\"} 0",
            "vllm:request_params_n_bucket{model_name=\"m\",engine=\"0\",le=\"2.0\"} 1",
            "vllm:request_queue_time_seconds_sum{model_name=\"m\",engine=\"0\"} 0.1",
            "vllm:request_prefill_time_seconds_sum{model_name=\"m\",engine=\"0\"} 0.3",
            "vllm:request_decode_time_seconds_sum{model_name=\"m\",engine=\"0\"} 1.0",
            "vllm:request_inference_time_seconds_sum{model_name=\"m\",engine=\"0\"} 1.3",
            "vllm:request_inference_time_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"1.0\"} 0",
            "vllm:request_inference_time_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"1.5\"} 1",
            "vllm:iteration_tokens_total_bucket{model_name=\"m\",engine=\"0\",le=\"1.0\"} 1",
            "vllm:iteration_tokens_total_bucket{model_name=\"m\",engine=\"0\",le=\"8.0\"} 1",
            "vllm:iteration_tokens_total_bucket{model_name=\"m\",engine=\"0\",le=\"16.0\"} 2",
            "vllm:iteration_tokens_total_bucket{model_name=\"m\",engine=\"0\",le=\"+Inf\"} 2",
            "vllm:iteration_tokens_total_sum{model_name=\"m\",engine=\"0\"} 10.0",
            "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"512\",num_gpu_blocks_override=\"None\",sliding_window=\"None\",swap_space=\"0\"} 1.0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing line {line}\n{text}");
        }
    }
}
