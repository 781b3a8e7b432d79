//! Criterion benchmarks of one scheduler step: `schedule()` plus `update_from_output()`
//! with a fake runner output, at the loads of Pagoda issue 2:
//! - `decode_256`: 256 running requests, each decoding one token per step;
//! - `mixed_64_decode_512_prefill`: 64 running decodes plus a stream of 512-token
//!   prompts chunked under a 2048-token budget (each prompt finishes after its
//!   first token, so the mix stays 64 decodes + ~1984 prefill tokens per step).
//!
//! Only the two scheduler calls are timed; building the fake runner output and
//! topping up the waiting queue are not (they belong to the runner and the engine).
//! Each timed run uses a fresh scheduler for at most `CHUNK` steps so sequences and
//! the cache stay bounded.

use criterion::{criterion_group, criterion_main, Criterion};
use pagoda_core::{ModelRunnerOutput, Request, SamplingParams, SchedulerOutput};
use pagoda_scheduler::{Scheduler, SchedulerConfig};
use std::time::{Duration, Instant};

const CHUNK: u64 = 512;

/// The runner's answer: a token for every row that reaches the end of its known tokens.
fn fake_output(s: &Scheduler, out: &SchedulerOutput) -> ModelRunnerOutput {
    let mut o = ModelRunnerOutput {
        handles: Vec::with_capacity(out.num_scheduled_tokens.len()),
        sampled_token_ids: Vec::with_capacity(out.num_scheduled_tokens.len()),
        logprobs: Vec::with_capacity(out.num_scheduled_tokens.len()),
        failed: Vec::new(),
        prompt_logprobs: Vec::new(),
        deferred: Vec::new(),
        ..Default::default()
    };
    for &(h, _) in &out.num_scheduled_tokens {
        let r = s.request_at(h).expect("scheduled");
        o.handles.push(h);
        let done = r.num_computed_tokens == r.num_tokens();
        o.sampled_token_ids
            .push(done.then_some(7 + (r.num_tokens() as u32 % 1000)));
        o.logprobs.push(None);
    }
    o
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed.wrapping_mul(2654435761) ^ i.wrapping_mul(40503)) % 49152)
        .collect()
}

fn request(id: String, seed: u32, len: usize, max_tokens: Option<usize>) -> Request {
    let params = SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy(1)
    };
    let params = params.checked(usize::MAX).expect("valid parameters");
    Request::new(id, prompt(seed, len), params, vec![2])
}

/// Runs steps untimed until every request is decoding.
fn warm(s: &mut Scheduler) {
    for _ in 0..64 {
        let out = s.schedule();
        let o = fake_output(s, &out);
        s.update_from_output(&out, &o);
    }
}

/// Times `schedule` + `update_from_output` only.
fn timed_step(s: &mut Scheduler) -> Duration {
    let t = Instant::now();
    let out = s.schedule();
    let mut d = t.elapsed();
    let o = fake_output(s, &out);
    let t = Instant::now();
    let res = s.update_from_output(&out, &o);
    d += t.elapsed();
    criterion::black_box(res);
    d
}

fn decode_256() -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        max_model_len: 1 << 16,
        block_size: 16,
        num_blocks: 256 * ((128 + CHUNK as usize + 128) / 16 + 2),
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    for i in 0..256 {
        s.add_request(request(format!("cmpl-{i:08}"), i, 128, None))
            .unwrap();
    }
    warm(&mut s);
    assert_eq!(s.num_running(), 256);
    s
}

struct Mixed {
    s: Scheduler,
    next: u32,
}

impl Mixed {
    fn new() -> Self {
        let cfg = SchedulerConfig {
            max_num_seqs: 64 + 8,
            max_num_batched_tokens: 2048,
            max_model_len: 1 << 16,
            block_size: 16,
            num_blocks: 20_000,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg).unwrap();
        for i in 0..64 {
            s.add_request(request(format!("cmpl-dec-{i:08}"), i, 128, None))
                .unwrap();
        }
        warm(&mut s);
        assert_eq!(s.num_running(), 64);
        let mut m = Mixed { s, next: 1000 };
        m.top_up();
        m
    }
    fn top_up(&mut self) {
        while self.s.num_waiting() < 8 {
            let id = format!("cmpl-pre-{:08}", self.next);
            self.s
                .add_request(request(id, self.next, 512, Some(1)))
                .unwrap();
            self.next += 1;
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler_step");
    g.bench_function("decode_256", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK);
                let mut s = decode_256();
                for _ in 0..n {
                    total += timed_step(&mut s);
                }
                left -= n;
            }
            total
        })
    });
    g.bench_function("mixed_64_decode_512_prefill", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK);
                let mut m = Mixed::new();
                for _ in 0..n {
                    total += timed_step(&mut m.s);
                    m.top_up();
                }
                left -= n;
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
