//! The seat share (issue 29): one API request's samples (a group) cannot hold
//! every seat while other requests wait, and the share is not a reservation.

mod common;

use common::{greedy_req, FakeRunner};
use pagoda_core::Request;
use pagoda_scheduler::{Scheduler, SchedulerConfig, SchedulingPolicy};

const VOCAB: u32 = 50;

fn config(max_num_seqs: usize, share: Option<usize>) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: 4096,
        max_model_len: 512,
        block_size: 16,
        num_blocks: 1000,
        max_seqs_per_group: share,
        ..Default::default()
    }
}

/// `n` samples of one API request: the same prompt, one group.
fn group(s: &mut Scheduler, name: &str, group: u64, n: usize, max_tokens: usize) {
    for i in 0..n {
        let r = greedy_req(&format!("{name}{i}"), vec![7; 40], max_tokens).with_group(Some(group));
        s.add_request(r).unwrap();
    }
}

fn single(s: &mut Scheduler, id: &str, max_tokens: usize) -> Request {
    let r = greedy_req(id, vec![9; 24], max_tokens);
    s.add_request(r.clone()).unwrap();
    r
}

fn step(s: &mut Scheduler, runner: &mut FakeRunner) {
    let out = s.schedule();
    let res = runner.execute(&out).unwrap();
    s.update_from_output(&out, &res);
    s.check_invariants().unwrap();
}

fn running_of(s: &Scheduler, prefix: &str) -> usize {
    s.running_ids()
        .iter()
        .filter(|id| id.starts_with(prefix))
        .count()
}

#[test]
fn a_group_is_passed_over_at_its_share_and_others_are_admitted() {
    let mut s = Scheduler::new(config(8, None)).unwrap();
    let mut runner = FakeRunner::new(16, VOCAB);
    group(&mut s, "g", 1, 8, 50);
    single(&mut s, "b", 50);
    step(&mut s, &mut runner);
    // Half of 8 seats for g first, then b behind it, then the seats nobody else
    // wants go back to g.
    assert!(s.running_ids().iter().any(|id| id == "b"));
    assert_eq!(running_of(&s, "g"), 7);
    assert_eq!(s.waiting_ids(), vec!["g7".to_string()]);
    assert_eq!(s.num_preemptions(), 0);
}

#[test]
fn a_lone_group_runs_wide_and_gives_one_seat_back_per_newcomer() {
    let mut s = Scheduler::new(config(8, Some(4))).unwrap();
    let mut runner = FakeRunner::new(16, VOCAB);
    group(&mut s, "g", 1, 8, 200);
    step(&mut s, &mut runner);
    assert_eq!(running_of(&s, "g"), 8, "the share is not a reservation");
    single(&mut s, "b", 100);
    step(&mut s, &mut runner);
    // b waited one step, not a generation: g's latest sample went back.
    assert!(s.running_ids().iter().any(|id| id == "b"));
    assert_eq!(s.waiting_ids(), vec!["g7".to_string()]);
    assert_eq!(s.num_preemptions(), 1);
    for _ in 0..20 {
        step(&mut s, &mut runner);
    }
    // Stable: g7 (its group over its share) takes no seat back from b.
    assert_eq!(s.num_preemptions(), 1);
    assert_eq!(s.waiting_ids(), vec!["g7".to_string()]);
    // Three more newcomers take seats down to g's share, and no further.
    for i in 0..5 {
        single(&mut s, &format!("c{i}"), 100);
    }
    step(&mut s, &mut runner);
    assert_eq!(running_of(&s, "g"), 4);
    assert_eq!(s.num_preemptions(), 4);
    assert_eq!(s.num_waiting(), 6, "g7, g6, g5, g4 and two of c");
}

#[test]
fn two_groups_split_the_seats_and_settle() {
    let mut s = Scheduler::new(config(8, None)).unwrap();
    let mut runner = FakeRunner::new(16, VOCAB);
    group(&mut s, "g", 1, 8, 200);
    step(&mut s, &mut runner);
    group(&mut s, "h", 2, 8, 200);
    for _ in 0..30 {
        step(&mut s, &mut runner);
    }
    assert_eq!(running_of(&s, "g"), 4);
    assert_eq!(running_of(&s, "h"), 4);
    let settled = s.num_preemptions();
    assert_eq!(settled, 4);
    for _ in 0..30 {
        step(&mut s, &mut runner);
    }
    assert_eq!(s.num_preemptions(), settled, "no seat changes hands again");
}

#[test]
fn a_preempted_sample_resumes_with_the_same_tokens() {
    let cfg = config(4, Some(2));
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    let mut runner = FakeRunner::new(16, VOCAB);
    group(&mut s, "g", 1, 4, 30);
    let mut outputs = std::collections::HashMap::<String, Vec<u32>>::new();
    let mut names = std::collections::HashMap::new();
    for i in 0..4 {
        let id = format!("g{i}");
        names.insert(s.handle_of(&id).unwrap(), id);
    }
    let mut t = 0;
    while s.has_unfinished_requests() {
        if t == 5 {
            let b = single(&mut s, "b", 10);
            names.insert(s.handle_of(&b.request_id).unwrap(), "b".into());
        }
        let out = s.schedule();
        let res = runner.execute(&out).unwrap();
        for o in s.update_from_output(&out, &res) {
            outputs
                .entry(names[&o.handle].clone())
                .or_default()
                .extend(o.new_token_ids);
        }
        s.check_invariants().unwrap();
        t += 1;
        assert!(t < 1000);
    }
    assert!(s.num_preemptions() >= 1);
    // The samples of one prompt are greedy: all equal, preempted or not.
    let want = &outputs["g0"];
    assert_eq!(want.len(), 30);
    for i in 1..4 {
        assert_eq!(&outputs[&format!("g{i}")], want);
    }
    assert_eq!(outputs["b"].len(), 10);
}

#[test]
fn priority_never_takes_a_seat_from_a_more_urgent_group() {
    let cfg = SchedulerConfig {
        policy: SchedulingPolicy::Priority,
        ..config(8, Some(4))
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let mut runner = FakeRunner::new(16, VOCAB);
    for i in 0..8 {
        let r = greedy_req(&format!("g{i}"), vec![7; 40], 100)
            .with_group(Some(1))
            .with_priority(0);
        s.add_request(r).unwrap();
    }
    step(&mut s, &mut runner);
    let late = greedy_req("b", vec![9; 24], 10).with_priority(5);
    s.add_request(late).unwrap();
    step(&mut s, &mut runner);
    assert_eq!(s.num_preemptions(), 0);
    assert_eq!(s.waiting_ids(), vec!["b".to_string()]);
    let urgent = greedy_req("u", vec![9; 24], 10).with_priority(0);
    s.add_request(urgent).unwrap();
    step(&mut s, &mut runner);
    assert_eq!(s.num_preemptions(), 1);
    assert!(s.running_ids().iter().any(|id| id == "u"));
}
