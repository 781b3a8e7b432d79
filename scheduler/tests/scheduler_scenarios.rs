//! vLLM V1 scheduler scenarios (tests/v1/core/test_scheduler.py), re-expressed.
//!
//! Block ids are vLLM's: Pagoda also reserves block 0 as the null block, so a
//! cache of `n` blocks has the usable ids `1..n`.

mod common;

use common::{greedy_req, output_all, FakeRunner};
use pagoda_core::{
    FinishReason, ModelRunnerOutput, ReqHandle, Request, RequestStatus, SamplingParams,
    SchedulerOutput, StopReason,
};
use pagoda_scheduler::{Scheduler, SchedulerConfig, SchedulerError, SchedulingPolicy};

/// vLLM's `create_scheduler` defaults: block 16, 10000 blocks, budget 8192, 16 seqs.
fn config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 16,
        max_num_batched_tokens: 8192,
        max_model_len: 8192,
        block_size: 16,
        num_blocks: 10000,
        ..Default::default()
    }
}

fn reqs(n: usize, len: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            greedy_req(
                &i.to_string(),
                (0..len as u32).map(|t| t + 1000 * i as u32).collect(),
                16,
            )
        })
        .collect()
}

/// The external id of a live request's handle.
fn name(s: &Scheduler, h: ReqHandle) -> &str {
    s.request_at(h)
        .map_or("<finished>", |r| r.request_id.as_str())
}

fn ids<'a>(s: &'a Scheduler, out: &SchedulerOutput) -> Vec<(&'a str, usize)> {
    out.num_scheduled_tokens
        .iter()
        .map(|&(h, n)| (name(s, h), n))
        .collect()
}

fn names<'a>(s: &'a Scheduler, hs: &[ReqHandle]) -> Vec<&'a str> {
    hs.iter().map(|&h| name(s, h)).collect()
}

fn one_token(s: &Scheduler, id: &str, tok: u32) -> ModelRunnerOutput {
    ModelRunnerOutput {
        handles: vec![s.handle_of(id).expect("live")],
        sampled_token_ids: vec![Some(tok)],
        logprobs: vec![None],
        failed: Vec::new(),
        prompt_logprobs: Vec::new(),
        deferred: Vec::new(),
        ..Default::default()
    }
}

// Scenarios 1 and 2 (test_add_requests / test_finish_request / test_num_unfinished_requests).
#[test]
fn add_and_finish_requests() {
    let mut s = Scheduler::new(config()).unwrap();
    for (i, r) in reqs(10, 10).into_iter().enumerate() {
        s.add_request(r).unwrap();
        assert_eq!(s.num_waiting(), i + 1);
    }
    for i in 0..10 {
        let id = i.to_string();
        assert_eq!(
            s.finish_requests([&id], RequestStatus::FinishedAborted),
            Ok(1)
        );
        assert!(s.request(&id).is_none());
        assert_eq!(s.num_waiting(), 9 - i);
        assert_eq!(s.num_unfinished_requests(), 10 - i - 1);
    }
    assert!(!s.has_unfinished_requests());
    assert_eq!(s.schedule().finished_reqs.len(), 10);
}

// Scenario 3 (test_schedule), with and without prefix caching.
#[test]
fn schedule_admits_all_in_arrival_order() {
    for caching in [false, true] {
        let mut s = Scheduler::new(SchedulerConfig {
            enable_prefix_caching: caching,
            ..config()
        })
        .unwrap();
        for r in reqs(10, 10) {
            s.add_request(r).unwrap();
        }
        let out = s.schedule();
        assert_eq!(out.scheduled_new_reqs.len(), 10);
        assert!(out.scheduled_cached_reqs.is_empty());
        assert_eq!(s.num_waiting(), 0);
        let want: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        assert_eq!(s.running_ids(), want);
        for (i, &(h, n)) in out.num_scheduled_tokens.iter().enumerate() {
            assert_eq!((name(&s, h), n), (want[i].as_str(), 10));
        }
        assert_eq!(out.total_num_scheduled_tokens, 100);
    }
}

// Scenario 4 (test_schedule_concurrent_partial_requests).
#[test]
fn concurrent_partial_prefills_under_threshold() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 1024,
        long_prefill_token_threshold: 400,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    for r in reqs(3, 800) {
        s.add_request(r).unwrap();
    }
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("0", 400), ("1", 400), ("2", 224)]);
    assert!(s
        .update_from_output(&out, &output_all(&out, 7, &s))
        .is_empty());
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("0", 400), ("1", 400), ("2", 224)]);
    let res = s.update_from_output(&out, &output_all(&out, 7, &s));
    // The first two finished their prompts and sampled; the third is mid-prefill.
    assert_eq!(
        res.iter().map(|o| name(&s, o.handle)).collect::<Vec<_>>(),
        vec!["0", "1"]
    );
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("0", 1), ("1", 1), ("2", 352)]);
}

/// A 256-token budget with at most 48 prompt tokens in a step that decodes.
fn capped(max_num_seqs: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: 256,
        max_prefill_tokens_with_decodes: 48,
        ..config()
    })
    .unwrap()
}

/// Schedules one step, checks its `(request, tokens)` and feeds one token to each.
fn step(s: &mut Scheduler, want: &[(&str, usize)]) {
    let out = s.schedule();
    assert_eq!(ids(s, &out), want);
    let res = output_all(&out, 7, s);
    s.update_from_output(&out, &res);
}

// Pagoda's own: a step that decodes takes at most `max_prefill_tokens_with_decodes`
// prompt tokens (running chunks first, then admissions), so a long prompt does not
// stall the running streams for a whole budget's worth of prefill; with nothing to
// decode the budget is the only limit.
#[test]
fn prompt_tokens_capped_while_decoding() {
    let mut s = capped(16);
    let mut rs = reqs(3, 100).into_iter();
    s.add_request(rs.next().unwrap()).unwrap();
    // Nothing decodes yet: the whole prompt in one step.
    step(&mut s, &[("0", 100)]);
    s.add_request(rs.next().unwrap()).unwrap();
    // "0" decodes and "1" waits (no more waiting than decoding): 48 prompt tokens, the
    // second chunk continuing.
    step(&mut s, &[("0", 1), ("1", 48)]);
    step(&mut s, &[("0", 1), ("1", 48)]);
    s.add_request(rs.next().unwrap()).unwrap();
    // One decoding, two starting ("1"'s last chunk and "2"): a burst, uncapped.
    step(&mut s, &[("0", 1), ("1", 4), ("2", 100)]);
    s.abort_request("0");
    s.abort_request("1");
    s.add_request(reqs(4, 100).pop().unwrap()).unwrap();
    // "2" decodes, "3" waits: capped again.
    step(&mut s, &[("2", 1), ("3", 48)]);
}

// Pagoda's own: a burst of requests that arrives while fewer streams decode than
// wait to start fills the budget (one stall for the few, everyone started), and the
// cap comes back once as many decode as wait; a waiting request no seat is free for
// does not count as starting.
#[test]
fn a_burst_beside_few_decodes_fills_the_budget() {
    let mut s = capped(16);
    let mut rs = reqs(5, 100).into_iter();
    s.add_request(rs.next().unwrap()).unwrap();
    step(&mut s, &[("0", 100)]);
    for r in rs {
        s.add_request(r).unwrap();
    }
    // One decoding, four waiting: the budget (1 + 100 + 100 + 55).
    step(&mut s, &[("0", 1), ("1", 100), ("2", 100), ("3", 55)]);
    // Three decoding, two starting ("3"'s rest and "4"): capped at 48.
    step(&mut s, &[("0", 1), ("1", 1), ("2", 1), ("3", 45), ("4", 3)]);

    // With every seat taken, the queue does not make a burst.
    let mut s = capped(2);
    let mut rs = reqs(5, 100).into_iter();
    s.add_request(rs.next().unwrap()).unwrap();
    step(&mut s, &[("0", 100)]);
    s.add_request(rs.next().unwrap()).unwrap();
    step(&mut s, &[("0", 1), ("1", 48)]);
    for r in rs {
        s.add_request(r).unwrap();
    }
    // "0" decodes, "1" is mid-prompt, three wait for a seat: 1 starting, capped.
    step(&mut s, &[("0", 1), ("1", 48)]);
}

#[test]
fn schedule_order_with_and_without_chunking() {
    for chunked in [true, false] {
        let cfg = SchedulerConfig {
            max_num_seqs: 3,
            max_num_batched_tokens: 1024,
            max_model_len: 1024,
            enable_chunked_prefill: chunked,
            ..config()
        };
        let mut s = Scheduler::new(cfg).unwrap();
        let mut rs = reqs(2, 800);
        rs.extend(reqs(4, 10).into_iter().skip(2));
        for r in rs {
            s.add_request(r).unwrap();
        }
        let out = s.schedule();
        let want = if chunked {
            vec![("0", 800), ("1", 224)]
        } else {
            vec![("0", 800)]
        };
        assert_eq!(ids(&s, &out), want, "chunked={chunked}");
        assert_eq!(out.scheduled_new_reqs.len(), want.len());
    }
}

/// EOS sampled as the last token `max_tokens` allows finishes with "stop" (stop
/// tokens are checked before the length cap, as in vLLM).
#[test]
fn eos_at_max_tokens_is_a_stop() {
    let mut s = Scheduler::new(config()).unwrap();
    s.add_request(Request::new(
        "a",
        vec![1, 2, 3],
        SamplingParams::greedy(1).checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    let out = s.schedule();
    let res = s.update_from_output(&out, &one_token(&s, "a", 2));
    assert_eq!(res[0].finish_reason, Some(FinishReason::Stop));
    assert_eq!(res[0].stop_reason, Some(StopReason::Eos(2)));
}

// Scenario 7 (test_stop_via_update_from_output), one sampled token per step.
#[test]
fn stop_reasons_from_update() {
    let cfg = config();
    // EOS stops.
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    s.add_request(Request::new(
        "a",
        vec![1, 2, 3],
        SamplingParams::greedy(8).checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    let out = s.schedule();
    let res = s.update_from_output(&out, &one_token(&s, "a", 2));
    assert_eq!(res[0].new_token_ids, vec![2]);
    assert_eq!(res[0].finish_reason, Some(FinishReason::Stop));
    assert_eq!(res[0].stop_reason, Some(StopReason::Eos(2)));
    assert!(s.request("a").is_none());
    assert_eq!(s.kv_cache_usage(), 0.0);
    assert_eq!(s.schedule().finished_reqs, vec![res[0].handle]);

    // Stop token 42 among [10, 42, 12]: stops at 42 with outputs [10, 42].
    let p = SamplingParams {
        stop_token_ids: vec![42].into(),
        ..SamplingParams::greedy(8)
    };
    s.add_request(Request::new(
        "b",
        vec![1, 2, 3],
        p.checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    let mut got: Vec<u32> = Vec::new();
    let mut last = None;
    for tok in [10, 42, 12] {
        let out = s.schedule();
        if out.is_empty() {
            break;
        }
        let res = s.update_from_output(&out, &one_token(&s, "b", tok));
        got.extend(&res[0].new_token_ids);
        last = Some(res[0].clone());
    }
    assert_eq!(got, vec![10, 42]);
    assert_eq!(last.unwrap().stop_reason, Some(StopReason::StopTokenId(42)));

    // max_tokens 2 with 3 tokens offered: length-capped after 2.
    s.add_request(Request::new(
        "c",
        vec![1, 2, 3],
        SamplingParams::greedy(2).checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    let mut got: Vec<u32> = Vec::new();
    for tok in [10, 11, 12] {
        let out = s.schedule();
        if out.is_empty() {
            break;
        }
        let res = s.update_from_output(&out, &one_token(&s, "c", tok));
        got.extend(&res[0].new_token_ids);
        if res[0].finish_reason.is_some() {
            assert_eq!(res[0].finish_reason, Some(FinishReason::Length));
        }
    }
    assert_eq!(got, vec![10, 11]);

    // ignore_eos: EOS does not stop.
    let p = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(3)
    };
    s.add_request(Request::new(
        "d",
        vec![1, 2, 3],
        p.checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    let out = s.schedule();
    let res = s.update_from_output(&out, &one_token(&s, "d", 2));
    assert_eq!(res[0].finish_reason, None);
    assert!(s.request("d").is_some());
}

// Scenario 8 (test_check_stop_min_tokens).
#[test]
fn min_tokens_delays_eos_and_stop_ids() {
    let mut s = Scheduler::new(config()).unwrap();
    let p = SamplingParams {
        min_tokens: 5,
        stop_token_ids: vec![42].into(),
        ..SamplingParams::greedy(10)
    };
    s.add_request(Request::new(
        "a",
        vec![1, 2],
        p.checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    for step in 0..4 {
        let out = s.schedule();
        let tok = if step % 2 == 0 { 2 } else { 42 };
        let res = s.update_from_output(&out, &one_token(&s, "a", tok));
        assert_eq!(res[0].finish_reason, None, "step {step}");
    }
    let out = s.schedule();
    let res = s.update_from_output(&out, &one_token(&s, "a", 2));
    assert_eq!(
        (res[0].finish_reason, res[0].stop_reason.clone()),
        (Some(FinishReason::Stop), Some(StopReason::Eos(2)))
    );

    let p = SamplingParams {
        min_tokens: 0,
        ..SamplingParams::greedy(10)
    };
    s.add_request(Request::new(
        "b",
        vec![1, 2],
        p.checked(usize::MAX).unwrap(),
        vec![2],
    ))
    .unwrap();
    let out = s.schedule();
    assert_eq!(
        s.update_from_output(&out, &one_token(&s, "b", 2))[0].finish_reason,
        Some(FinishReason::Stop)
    );
}

// Scenario 9 (test_preempt_during_execution), adapted: Pagoda's engine is
// synchronous, so a stale output for a preempted request is ignored (vLLM's
// async scheduler appends it).
#[test]
fn growing_request_preempts_the_latest() {
    let cfg = SchedulerConfig {
        num_blocks: 11,
        max_model_len: 160,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    for r in reqs(2, 80) {
        s.add_request(r).unwrap();
    }
    let out = s.schedule();
    assert_eq!(out.scheduled_new_reqs[0].block_ids, vec![1, 2, 3, 4, 5]);
    assert_eq!(out.scheduled_new_reqs[1].block_ids, vec![6, 7, 8, 9, 10]);
    s.update_from_output(&out, &output_all(&out, 5, &s));
    let out = s.schedule();
    assert_eq!(names(&s, &out.preempted_reqs), vec!["1"]);
    assert_eq!(ids(&s, &out), vec![("0", 1)]);
    // Request 1 freed its blocks tail first, so its last block went first.
    assert_eq!(out.scheduled_cached_reqs[0].new_block_ids, vec![10]);
    assert_eq!(s.running_ids(), vec!["0".to_string()]);
    let r1 = s.request("1").unwrap();
    assert_eq!(
        (r1.status, r1.num_computed_tokens, r1.num_preemptions),
        (RequestStatus::Preempted, 0, 1)
    );
    assert_eq!(r1.output_token_ids(), &[5]);
    // A stale output naming request 1 is ignored.
    let stale = ModelRunnerOutput {
        handles: vec![s.handle_of("0").unwrap(), s.handle_of("1").unwrap()],
        sampled_token_ids: vec![Some(6), Some(42)],
        logprobs: vec![None, None],
        failed: Vec::new(),
        prompt_logprobs: Vec::new(),
        deferred: Vec::new(),
        ..Default::default()
    };
    let res = s.update_from_output(&out, &stale);
    assert_eq!(res.len(), 1);
    assert_eq!(s.request("1").unwrap().output_token_ids(), &[5]);
    assert_eq!(s.num_preemptions(), 1);
}

// Scenario 10 (test_memory_leak).
#[test]
fn run_to_completion_leaves_nothing() {
    let mut s = Scheduler::new(config()).unwrap();
    for mut r in reqs(5, 10) {
        r.sampling_params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(10)
        }
        .checked(usize::MAX)
        .unwrap();
        s.add_request(r).unwrap();
    }
    let mut runner = FakeRunner::new(16, 1000);
    let mut steps = 0;
    while s.has_unfinished_requests() {
        let out = s.schedule();
        let res = runner.execute(&out).unwrap();
        s.update_from_output(&out, &res);
        steps += 1;
        assert!(steps < 100);
    }
    runner.execute(&s.schedule()).unwrap();
    assert_eq!(runner.num_requests(), 0);
    assert_eq!(s.kv_cache_manager().num_requests(), 0);
    assert_eq!(s.kv_cache_manager().num_free_blocks(), 9999);
    assert_eq!(s.kv_cache_usage(), 0.0);
    s.check_invariants().unwrap();
}

// Scenario 11 (test_scheduler_reset_prefix_cache).
#[test]
fn reset_prefix_cache_with_running_requests() {
    let mut s = Scheduler::new(config()).unwrap();
    for r in reqs(10, 10) {
        s.add_request(r).unwrap();
    }
    let out = s.schedule();
    s.update_from_output(&out, &output_all(&out, 3, &s));
    assert!(matches!(
        s.reset_prefix_cache(),
        Err(SchedulerError::PrefixCacheInUse { .. })
    ));
    s.reset_prefix_cache_and_preempt().unwrap();
    assert_eq!(s.num_running(), 0);
    let want: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(s.waiting_ids(), want);
    let out = s.schedule();
    assert_eq!(out.preempted_reqs.len(), 10);
    // Resumed requests come back with their generated token; nothing hits the cache.
    assert_eq!(out.scheduled_new_reqs[0].token_ids.len(), 11);
    assert_eq!(out.scheduled_new_reqs[0].num_output_tokens, 1);
    assert!(out
        .scheduled_new_reqs
        .iter()
        .all(|n| n.num_computed_tokens == 0));
}

// Scenario 12 (test_no_spec_tokens_scheduled_for_prefill_chunks).
#[test]
fn prefill_chunks_under_small_budget() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 50,
        ..config()
    })
    .unwrap();
    s.add_request(reqs(1, 80).pop().unwrap()).unwrap();
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("0", 50)]);
    // A token returned for a partial prefill chunk is ignored.
    assert!(s
        .update_from_output(&out, &one_token(&s, "0", 1))
        .is_empty());
    assert_eq!(s.request("0").unwrap().num_output_tokens(), 0);
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("0", 30)]);
    assert_eq!(out.scheduled_cached_reqs[0].num_computed_tokens, 50);
    assert_eq!(
        s.update_from_output(&out, &output_all(&out, 1, &s)).len(),
        1
    );
}

fn prio(id: &str, p: i32, len: usize, max_tokens: usize) -> Request {
    greedy_req(
        id,
        (0..len as u32).map(|t| t + 7919 * p as u32).collect(),
        max_tokens,
    )
    .with_priority(p)
}

// Scenario 13 (test_priority_scheduling_basic_ordering).
#[test]
fn priority_basic_ordering() {
    let mut s = Scheduler::new(SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        ..config()
    })
    .unwrap();
    for (i, p) in [2, 0, 1].into_iter().enumerate() {
        s.add_request(prio(&i.to_string(), p, 10, 4)).unwrap();
    }
    let out = s.schedule();
    let got: Vec<&str> = out
        .scheduled_new_reqs
        .iter()
        .map(|n| n.req_id.as_str())
        .collect();
    assert_eq!(got, vec!["1", "2", "0"]);
}

// Scenario 15 (test_priority_scheduling_with_limited_slots).
#[test]
fn priority_with_limited_slots() {
    let cfg = SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        max_num_seqs: 2,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    for (i, p) in [3, 1, 2, 0].into_iter().enumerate() {
        s.add_request(prio(&i.to_string(), p, 10, 4)).unwrap();
    }
    s.schedule();
    assert_eq!(s.running_ids(), vec!["3".to_string(), "1".to_string()]);
    assert_eq!(s.waiting_ids(), vec!["2".to_string(), "0".to_string()]);
}

// Scenario 16 (test_priority_scheduling_preemption): 5 usable blocks.
#[test]
fn priority_preempts_low_priority_running() {
    let cfg = SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        num_blocks: 6,
        max_model_len: 80,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(prio("lo", 5, 40, 50)).unwrap();
    let out = s.schedule();
    s.update_from_output(&out, &output_all(&out, 1, &s));
    s.add_request(prio("hi", 0, 30, 50)).unwrap();
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("lo", 1), ("hi", 30)]);
    assert_eq!(s.kv_cache_manager().num_free_blocks(), 0);
    s.update_from_output(&out, &output_all(&out, 1, &s));
    for _ in 0..2 {
        let out = s.schedule();
        assert_eq!(out.num_scheduled_tokens.len(), 2);
        s.update_from_output(&out, &output_all(&out, 1, &s));
    }
    // hi now needs its third block: lo (scheduled first this step) is preempted.
    let out = s.schedule();
    assert_eq!(names(&s, &out.preempted_reqs), vec!["lo"]);
    assert_eq!(ids(&s, &out), vec![("hi", 1)]);
    assert_eq!(out.total_num_scheduled_tokens, 1);
    assert_eq!(s.running_ids(), vec!["hi".to_string()]);
    assert_eq!(s.request("lo").unwrap().status, RequestStatus::Preempted);
}

// Scenario 17 (test_priority_scheduling_preemption_and_resumption_when_out_of_kv).
#[test]
fn priority_preemption_then_resumption() {
    let cfg = SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        num_blocks: 5,
        max_model_len: 64,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(prio("low", 1, 30, 10)).unwrap();
    s.add_request(prio("high", 0, 32, 2)).unwrap();
    let out = s.schedule();
    assert_eq!(out.scheduled_new_reqs.len(), 2);
    assert_eq!(s.kv_cache_manager().num_free_blocks(), 0);
    s.update_from_output(&out, &output_all(&out, 9, &s));
    let out = s.schedule();
    assert_eq!(names(&s, &out.preempted_reqs), vec!["low"]);
    assert_eq!(ids(&s, &out), vec![("high", 1)]);
    assert_eq!((s.num_waiting(), s.num_running()), (1, 1));
    let res = s.update_from_output(&out, &output_all(&out, 9, &s));
    assert_eq!(res[0].finish_reason, Some(FinishReason::Length));
    let out = s.schedule();
    assert_eq!(s.num_waiting(), 0);
    let n = &out.scheduled_new_reqs[0];
    assert_eq!(
        (n.req_id.as_str(), n.token_ids.len(), n.num_output_tokens),
        ("low", 31, 1)
    );
}

// Scenario 19 (test_priority_scheduling_no_preemption_when_space_available).
#[test]
fn priority_admits_without_preemption_when_space() {
    let cfg = SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        max_num_seqs: 3,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(prio("a", 5, 10, 8)).unwrap();
    s.add_request(prio("b", 5, 10, 8)).unwrap();
    let out = s.schedule();
    s.update_from_output(&out, &output_all(&out, 1, &s));
    s.add_request(prio("c", 0, 10, 8)).unwrap();
    let out = s.schedule();
    assert_eq!(out.scheduled_new_reqs.len(), 1);
    assert!(out.preempted_reqs.is_empty());
    assert_eq!((s.num_running(), s.num_waiting()), (3, 0));
}

#[test]
fn add_request_refuses_what_can_never_fit() {
    let cfg = SchedulerConfig {
        num_blocks: 5,
        max_model_len: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let too_long = greedy_req("a", vec![1; 100], 4);
    assert!(matches!(
        s.add_request(too_long),
        Err(SchedulerError::PromptTooLong {
            num_prompt_tokens: 100,
            ..
        })
    ));
    // 4 usable blocks hold 64 tokens: a 64-token prompt has no room for an output.
    let too_big = greedy_req("b", vec![1; 64], 4);
    assert!(matches!(
        s.add_request(too_big),
        Err(SchedulerError::ExceedsKvCache {
            num_blocks_needed: 5,
            num_usable_blocks: 4,
            ..
        })
    ));
    assert!(matches!(
        s.add_request(greedy_req("c", vec![], 4)),
        Err(SchedulerError::EmptyPrompt { .. })
    ));
    s.add_request(greedy_req("d", vec![1; 63], 1000)).unwrap();
    assert!(matches!(
        s.add_request(greedy_req("d", vec![1], 4)),
        Err(SchedulerError::DuplicateRequest { .. })
    ));
    // A large max_tokens is capped by the cache: 64 tokens at most.
    let mut runner = FakeRunner::new(16, 50);
    let mut last = None;
    while s.has_unfinished_requests() {
        let out = s.schedule();
        let res = runner.execute(&out).unwrap();
        last = s.update_from_output(&out, &res).pop();
    }
    assert_eq!(last.unwrap().finish_reason, Some(FinishReason::Length));
}

#[test]
fn decode_rows_come_first() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        ..config()
    })
    .unwrap();
    s.add_request(greedy_req("long", (0..100).collect(), 4))
        .unwrap();
    s.add_request(greedy_req("short", (200..210).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("long", 64)]);
    s.update_from_output(&out, &output_all(&out, 1, &s));
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("long", 36), ("short", 10)]);
    s.update_from_output(&out, &output_all(&out, 1, &s));
    s.add_request(greedy_req("new", (300..340).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("long", 1), ("short", 1), ("new", 40)]);
}

#[test]
fn resumed_request_hits_its_own_cached_prefix() {
    // 6 usable blocks; two 40-token prompts. At 48 tokens both need a 4th block:
    // "b" is preempted (blocks 4, 5 cached, 6 partial; freed as [6, 5, 4]). "a" then
    // takes 6 and later 5, so when "a" finishes "b" resumes with block 4 still cached.
    let cfg = SchedulerConfig {
        num_blocks: 7,
        max_model_len: 96,
        ..config()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(greedy_req("a", (0..40).collect(), 40))
        .unwrap();
    s.add_request(greedy_req("b", (100..140).collect(), 20))
        .unwrap();
    let mut runner = FakeRunner::new(16, 50_000);
    let mut preempted = false;
    let mut resumed = false;
    while s.has_unfinished_requests() {
        let out = s.schedule();
        preempted |= !out.preempted_reqs.is_empty();
        if let Some(n) = out
            .scheduled_new_reqs
            .iter()
            .find(|n| n.req_id == "b" && n.num_output_tokens > 0)
        {
            assert_eq!(n.num_computed_tokens, 16);
            assert_eq!(n.block_ids[0], 4);
            resumed = true;
        }
        let res = runner.execute(&out).unwrap();
        s.update_from_output(&out, &res);
        s.check_invariants().unwrap();
    }
    assert!(preempted && resumed);
}

#[test]
fn prefix_hits_are_reported_in_outputs_and_stats() {
    let mut s = Scheduler::new(SchedulerConfig {
        num_blocks: 11,
        max_model_len: 160,
        ..config()
    })
    .unwrap();
    let shared: Vec<u32> = (0..48).collect();
    let mut p1 = shared.clone();
    p1.extend([900, 901, 902]);
    s.add_request(greedy_req("a", shared.clone(), 1)).unwrap();
    let out = s.schedule();
    assert_eq!(out.scheduled_new_reqs[0].block_ids, vec![1, 2, 3]);
    let res = s.update_from_output(&out, &output_all(&out, 5, &s));
    assert_eq!(res[0].num_cached_tokens, 0);
    s.add_request(greedy_req("b", p1, 2)).unwrap();
    let out = s.schedule();
    let n = &out.scheduled_new_reqs[0];
    // "a" finished and freed [3, 2, 1]; "b" hits all three and computes 3 tokens.
    assert_eq!(
        (n.num_computed_tokens, n.block_ids.clone()),
        (48, vec![1, 2, 3, 4])
    );
    assert_eq!(ids(&s, &out), vec![("b", 3)]);
    let res = s.update_from_output(&out, &output_all(&out, 5, &s));
    assert_eq!(
        (res[0].num_cached_tokens, res[0].num_prompt_tokens),
        (48, 51)
    );
    let st = s.stats();
    assert_eq!(
        (
            st.prefix_cache.requests,
            st.prefix_cache.queries,
            st.prefix_cache.hits
        ),
        (2, 99, 48)
    );
}

/// A row the runner deferred (a late grammar mask, issue 29 D7) is stepped back
/// one token: the next step schedules that token again, with no new block, and
/// samples it; nothing is emitted for the deferred step.
#[test]
fn deferred_rows_run_their_last_token_again() {
    let mut s = Scheduler::new(config()).unwrap();
    s.add_request(greedy_req("a", (1..=16).collect(), 8))
        .unwrap();
    // Prefill (16 tokens: exactly one block), deferred.
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("a", 16)]);
    let mut o = one_token(&s, "a", 7);
    o.sampled_token_ids = vec![None];
    o.deferred = vec![s.handle_of("a").unwrap()];
    assert!(s.update_from_output(&out, &o).is_empty());
    assert_eq!(s.request("a").unwrap().num_computed_tokens, 15);
    // The last prompt token again, in the block it already has.
    let out = s.schedule();
    assert_eq!(ids(&s, &out), vec![("a", 1)]);
    assert!(out.scheduled_cached_reqs[0].new_block_ids.is_empty());
    let res = s.update_from_output(&out, &one_token(&s, "a", 7));
    assert_eq!(res[0].new_token_ids, vec![7]);
    // A decode deferred twice, then sampled.
    for _ in 0..2 {
        let out = s.schedule();
        assert_eq!(ids(&s, &out), vec![("a", 1)]);
        let mut o = one_token(&s, "a", 8);
        o.sampled_token_ids = vec![None];
        o.deferred = vec![s.handle_of("a").unwrap()];
        assert!(s.update_from_output(&out, &o).is_empty());
        assert_eq!(s.request("a").unwrap().num_computed_tokens, 16);
        s.check_invariants().unwrap();
    }
    let out = s.schedule();
    let res = s.update_from_output(&out, &one_token(&s, "a", 8));
    assert_eq!(res[0].new_token_ids, vec![8]);
    assert_eq!(s.request("a").unwrap().output_token_ids(), &[7, 8]);
}
