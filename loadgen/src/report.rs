//! Per-concurrency-level summaries, the printed tables (vLLM benchmark_serving
//! style), and the JSON document `--json` writes.

use super::client::RequestResult;
use super::stats::Dist;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Statistics of one concurrency level (latencies in ms).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LevelSummary {
    pub concurrency: usize,
    pub num_prompts: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub ttft_ms: Dist,
    /// Time per output token after the first, per request.
    pub tpot_ms: Dist,
    pub itl_ms: Dist,
    pub e2e_ms: Dist,
}

/// One level: its summary and every request's raw timings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LevelResult {
    pub summary: LevelSummary,
    pub requests: Vec<RequestResult>,
}

/// Everything `--json` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    pub base_url: String,
    pub model: String,
    pub input_len: usize,
    pub output_len: usize,
    pub shared_prefix_len: usize,
    pub seed: u64,
    pub new_connection_per_request: bool,
    pub label: Option<String>,
    /// Unix time (s) the run started.
    pub started_unix_s: u64,
    pub levels: Vec<LevelResult>,
}

/// Summarises one level. `prompt_len` stands in for servers that report no usage.
pub fn summarize(
    concurrency: usize,
    duration_s: f64,
    prompt_len: usize,
    reqs: &[RequestResult],
) -> LevelSummary {
    let ok: Vec<&RequestResult> = reqs.iter().filter(|r| r.ok).collect();
    let total_out: usize = ok.iter().map(|r| r.output_tokens).sum();
    let total_in: usize = ok
        .iter()
        .map(|r| {
            if r.prompt_tokens > 0 {
                r.prompt_tokens
            } else {
                prompt_len
            }
        })
        .sum();
    let ttft: Vec<f64> = ok.iter().map(|r| r.ttft_s).collect();
    let e2e: Vec<f64> = ok.iter().map(|r| r.e2e_s).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_s.iter().copied()).collect();
    let tpot: Vec<f64> = ok
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) as f64)
        .collect();
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    LevelSummary {
        concurrency,
        num_prompts: reqs.len(),
        completed: ok.len(),
        failed: reqs.len() - ok.len(),
        duration_s,
        request_throughput: per_s(ok.len() as f64),
        output_throughput: per_s(total_out as f64),
        total_token_throughput: per_s((total_in + total_out) as f64),
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        ttft_ms: Dist::from_secs(&ttft),
        tpot_ms: Dist::from_secs(&tpot),
        itl_ms: Dist::from_secs(&itl),
        e2e_ms: Dist::from_secs(&e2e),
    }
}

/// The detailed block for one level, like vLLM's `benchmark_serving.py`.
pub fn level_block(s: &LevelSummary) -> String {
    let mut o = String::new();
    let title = format!(" Serving Benchmark Result (concurrency {}) ", s.concurrency);
    let _ = writeln!(o, "{:=^56}", title);
    let row = |o: &mut String, k: &str, v: String| {
        let _ = writeln!(o, "{:<40}{:>16}", k, v);
    };
    row(&mut o, "Successful requests:", s.completed.to_string());
    row(&mut o, "Failed requests:", s.failed.to_string());
    row(
        &mut o,
        "Maximum request concurrency:",
        s.concurrency.to_string(),
    );
    row(
        &mut o,
        "Benchmark duration (s):",
        format!("{:.2}", s.duration_s),
    );
    row(
        &mut o,
        "Total input tokens:",
        s.total_input_tokens.to_string(),
    );
    row(
        &mut o,
        "Total generated tokens:",
        s.total_output_tokens.to_string(),
    );
    row(
        &mut o,
        "Request throughput (req/s):",
        format!("{:.2}", s.request_throughput),
    );
    row(
        &mut o,
        "Output token throughput (tok/s):",
        format!("{:.2}", s.output_throughput),
    );
    row(
        &mut o,
        "Total token throughput (tok/s):",
        format!("{:.2}", s.total_token_throughput),
    );
    for (name, short, d) in [
        ("Time to First Token", "TTFT", &s.ttft_ms),
        (
            "Time per Output Token (excl. 1st token)",
            "TPOT",
            &s.tpot_ms,
        ),
        ("Inter-token Latency", "ITL", &s.itl_ms),
        ("End-to-end Latency", "E2EL", &s.e2e_ms),
    ] {
        let _ = writeln!(o, "{:-^56}", name);
        row(
            &mut o,
            &format!("Mean {short} (ms):"),
            format!("{:.2}", d.mean),
        );
        row(
            &mut o,
            &format!("Median {short} (ms):"),
            format!("{:.2}", d.p50),
        );
        row(
            &mut o,
            &format!("P99 {short} (ms):"),
            format!("{:.2}", d.p99),
        );
    }
    let _ = writeln!(o, "{}", "=".repeat(56));
    o
}

/// One line per level: the compact comparison table.
pub fn summary_table(levels: &[LevelSummary]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>5} {:>4} {:>4} {:>8} {:>7} {:>9} | {:>8} {:>8} {:>8} | {:>7} {:>7} {:>7} | {:>8} {:>8} {:>8}",
        "conc", "ok", "fail", "dur s", "req/s", "out tok/s", "TTFT avg", "p50", "p99", "ITL avg", "p50", "p99", "E2E avg",
        "p50", "p99"
    );
    for s in levels {
        let _ = writeln!(
            o,
            "{:>5} {:>4} {:>4} {:>8.2} {:>7.2} {:>9.1} | {:>8.1} {:>8.1} {:>8.1} | {:>7.1} {:>7.1} {:>7.1} | {:>8.0} {:>8.0} {:>8.0}",
            s.concurrency,
            s.completed,
            s.failed,
            s.duration_s,
            s.request_throughput,
            s.output_throughput,
            s.ttft_ms.mean,
            s.ttft_ms.p50,
            s.ttft_ms.p99,
            s.itl_ms.mean,
            s.itl_ms.p50,
            s.itl_ms.p99,
            s.e2e_ms.mean,
            s.e2e_ms.p50,
            s.e2e_ms.p99,
        );
    }
    let _ = writeln!(o, "(latencies in ms)");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ok: bool, ttft: f64, e2e: f64, out: usize) -> RequestResult {
        RequestResult {
            ok,
            ttft_s: ttft,
            e2e_s: e2e,
            output_tokens: out,
            chunks: out,
            itl_s: vec![(e2e - ttft) / (out.max(2) - 1) as f64; out.saturating_sub(1)],
            error: (!ok).then(|| "boom".into()),
            ..Default::default()
        }
    }

    #[test]
    fn summary_counts_only_successes() {
        let reqs = vec![
            req(true, 0.1, 1.1, 11),
            req(true, 0.3, 2.3, 21),
            req(false, 0.0, 0.5, 0),
        ];
        let s = summarize(2, 4.0, 64, &reqs);
        assert_eq!((s.completed, s.failed, s.num_prompts), (2, 1, 3));
        assert_eq!(s.total_output_tokens, 32);
        assert_eq!(s.total_input_tokens, 128);
        assert!((s.output_throughput - 8.0).abs() < 1e-9);
        assert!((s.request_throughput - 0.5).abs() < 1e-9);
        assert!((s.ttft_ms.mean - 200.0).abs() < 1e-9);
        assert!((s.tpot_ms.mean - 100.0).abs() < 1e-9);
        assert_eq!(s.itl_ms.count, 30);
        let text = level_block(&s) + &summary_table(&[s]);
        assert!(text.contains("Successful requests:") && text.contains("out tok/s"));
    }
}
