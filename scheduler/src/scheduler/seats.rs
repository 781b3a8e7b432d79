//! The seat share: one API request cannot take every seat of the batch.
//!
//! A request with `n` samples (or a batch of prompts) enters the scheduler as one
//! [`Request`](pagoda_core::Request) per sequence, all with the same
//! [`group`](pagoda_core::Request::group). Without a share, an `n: 64` request
//! under `max_num_seqs = 64` holds all 64 seats and every request behind it waits
//! for a whole generation. The rule (checked in `schedule_waiting`):
//!
//! - a group holds at most `cap` seats (`SchedulerConfig::max_seqs_per_group`,
//!   default half of `max_num_seqs`) *while other requests wait*: admission passes
//!   over a waiting sequence whose group is at its share and admits those behind it;
//! - the share is not a reservation: seats nobody else wants go to the passed-over
//!   sequences (a lone `n: 64` request still runs 64 wide);
//! - when the batch is full and a request of a group under its share waits, one
//!   running sequence of the group furthest over its share (its most recently
//!   admitted one) is preempted for it: the newcomer waits one step, not one
//!   generation. Under the priority policy only a victim of the same or a lower
//!   priority is taken. The victim recomputes on return; its prompt blocks are
//!   still held by its siblings, so the prefix cache serves them.
//!
//! A group at its share never takes a seat from anyone, so sequences do not
//! preempt each other back and forth.

use super::{Scheduler, SchedulingPolicy, StepPlan};
use crate::hashing::FxHashMap;

/// Running sequences per group, counted at the start of an admission pass.
pub(super) struct Seats {
    cap: usize,
    counts: FxHashMap<u64, usize>,
}

impl Seats {
    /// Whether a sequence of `group` is passed over (its group holds its share).
    pub(super) fn full(&self, group: Option<u64>) -> bool {
        group.is_some_and(|g| self.counts.get(&g).copied().unwrap_or(0) >= self.cap)
    }

    pub(super) fn add(&mut self, group: Option<u64>) {
        if let Some(g) = group {
            *self.counts.entry(g).or_insert(0) += 1;
        }
    }

    fn remove(&mut self, group: u64) {
        if let Some(c) = self.counts.get_mut(&group) {
            *c -= 1;
        }
    }

    /// The group furthest over its share, if any is over it.
    fn most_over(&self) -> Option<u64> {
        self.counts
            .iter()
            .filter(|&(_, &c)| c > self.cap)
            // Ties by group id, so the choice does not depend on the map's order.
            .max_by_key(|&(&g, &c)| (c, std::cmp::Reverse(g)))
            .map(|(&g, _)| g)
    }
}

impl Scheduler {
    /// The share of one group: `max_seqs_per_group`, or half of `max_num_seqs`.
    pub(super) fn seat_cap(&self) -> usize {
        self.config
            .max_seqs_per_group
            .unwrap_or(self.config.max_num_seqs / 2)
            .max(1)
    }

    pub(super) fn count_seats(&self) -> Seats {
        let mut seats = Seats {
            cap: self.seat_cap(),
            counts: FxHashMap::default(),
        };
        for &i in &self.running {
            seats.add(self.req(i).group);
        }
        seats
    }

    /// Frees a seat for the waiting request `for_idx` (its group under its share)
    /// by preempting a sequence of the group furthest over its share; `false` when
    /// no group is over it (or, by priority, none may be taken).
    pub(super) fn reclaim_seat(
        &mut self,
        plan: &mut StepPlan,
        seats: &mut Seats,
        for_idx: u32,
    ) -> bool {
        let Some(group) = seats.most_over() else {
            return false;
        };
        // Its latest admitted member (the FCFS victim order), or by priority its
        // least urgent; never one admitted in this very pass.
        let mut members = (0..self.running.len()).filter(|&p| {
            let idx = self.running[p];
            self.req(idx).group == Some(group) && !plan.new.iter().any(|r| r.idx == idx)
        });
        let vpos = match self.config.policy {
            SchedulingPolicy::Fcfs => members.next_back(),
            SchedulingPolicy::Priority => {
                members.max_by_key(|&p| self.priority_key(self.running[p]))
            }
        };
        let Some(vpos) = vpos else {
            return false;
        };
        let victim = self.running[vpos];
        if self.config.policy == SchedulingPolicy::Priority
            && self.req(victim).priority < self.req(for_idx).priority
        {
            return false;
        }
        self.running.remove(vpos);
        if let Some(k) = plan.running.iter().position(|r| r.idx == victim) {
            // Scheduled by phase 1: its tokens and blocks go back.
            plan.budget += plan.running.remove(k).num_tokens;
        }
        let h = self.preempt(victim);
        plan.preempted.push(h);
        seats.remove(group);
        true
    }
}
