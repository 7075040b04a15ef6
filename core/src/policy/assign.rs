//! The assignment step: how many parts each rank is handed in the next step, one function of
//! the previous steps' per-rank latencies, shared by the scheduler (`schedule::Scheduler`, fed
//! from the gathered count rows: identical on every rank) and the simulator (`sim::policies`,
//! fed from the replayed walk). Neither holds a copy of the rule.
//!
//! Owns: [`Assigner`]. Must not touch: clocks, devices, I/O, the data source (the scheduler
//! takes `assignment()[rank]` parts from it), the per-micro-batch walk ([`super::walk`]).
//!
//! Per policy (every match exhaustive), counts in parts (a whole micro-batch = S parts):
//! - `synchronous`, `drop-before`, `drop-predictive`, `length-predictive`: M·S for every rank,
//!   always.
//! - `cost-balance`: M·S for every rank as counts; a driver that knows the step's micro-batches'
//!   buckets deals them by predicted cost ([`super::bucket::cost_balance`]) and sets the
//!   resulting counts with [`Assigner::set`] before dealing (the simulator and the scheduler's
//!   `Scheduler::deal_by_cost` do; a job without buckets deals M·S each).
//! - `compute-budget`: the cap ([`super::StepPolicy::budget_cap`], at most the slots) · S
//!   for every rank while a budget is set, M·S without one; M·S in the warm-up steps too
//!   (warm-up runs the nominal batch for every policy: with the budget's check off there,
//!   a cap of 2·M would double the global batch).
//! - `backup-workers` (b): from the step after the first one observed, every rank predicts each
//!   rank's step as its per-micro-batch latency EWMA × M ([`RankLatencyTracker`]) and
//!   [`super::backup_aggregated`] names the b ranks predicted last: they get 0 parts (they
//!   compute nothing and join the collective), the others M·S. A launched graph cannot be
//!   aborted, so the b slowest are chosen before the step from predictions (Chen et al. 2016
//!   choose after, from finish times: not realizable on a device). M·S for every rank during
//!   warm-up, until every rank has a latency, and with b = 0.
//! - `rebalance`, `rebalance-drop`: [`Rebalancer::update`] with the tracker's EWMA per part and
//!   its chronic flags; an assignment needing more parts than the slots on a rank is not
//!   applied (the previous one stays). Rebalancing may act in the warm-up (it keeps the
//!   global batch).

use super::rebalance::{RankLatencyTracker, Rebalancer};
use super::{Policy, StepPolicy, Threshold, backup_aggregated};

/// The per-rank part counts of the next step under one policy (module doc).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Assigner {
    params: StepPolicy,
    micro_batches: u32,
    split: u32,
    slots: u32,
    warmup_steps: u64,
    budget: bool,
    tracker: RankLatencyTracker,
    rebalancer: Option<Rebalancer>,
    assignment: Vec<u32>,
}

impl Assigner {
    /// The assigner of `params` (its policy, b, rebalancing limits and tail shape) for
    /// `world_size` ranks of `micro_batches` (M) each, at most `slots` parts per rank (the
    /// scheduler's part slots; at least M·S is used), `warmup_steps` warm-up steps, and the
    /// deadline the walk runs under (`threshold`: the budget of `compute-budget`, which without
    /// one assigns M·S). The assignment of the first step, `first_step` (0-based step index,
    /// compared with the warm-up), is [`Assigner::assignment`].
    pub fn new(
        params: StepPolicy,
        world_size: usize,
        micro_batches: u32,
        slots: u32,
        warmup_steps: u64,
        threshold: Threshold,
        first_step: u64,
    ) -> Self {
        let split = params.tail.parts();
        let nominal = micro_batches.saturating_mul(split);
        let rebalancer = params.policy.rebalances().then(|| {
            let mut cfg = params.rebalance;
            cfg.min_micro_batches = cfg.min_micro_batches.saturating_mul(split);
            Rebalancer::new(world_size, nominal, cfg)
        });
        let mut a = Self {
            params,
            micro_batches,
            split,
            slots: slots.max(nominal),
            warmup_steps,
            budget: threshold != Threshold::Off,
            tracker: RankLatencyTracker::new(world_size, Default::default()),
            rebalancer,
            assignment: vec![nominal; world_size],
        };
        a.assignment = a.fixed_for(first_step).unwrap_or(a.assignment);
        a
    }

    /// The assignment of a policy that does not learn from latencies, for `step`; `None` for
    /// the policies that do (backup workers, rebalancing).
    fn fixed_for(&self, step: u64) -> Option<Vec<u32>> {
        let n = self.assignment.len();
        let nominal = self.micro_batches.saturating_mul(self.split);
        match self.params.policy {
            Policy::Synchronous
            | Policy::DropBefore
            | Policy::DropPredictive
            | Policy::LengthPredictive
            | Policy::CostBalance => Some(vec![nominal; n]),
            Policy::ComputeBudget => {
                let cap = self.params.budget_cap(self.micro_batches).saturating_mul(self.split).min(self.slots);
                Some(vec![if self.budget && step >= self.warmup_steps { cap } else { nominal }; n])
            }
            Policy::BackupWorkers | Policy::Rebalance | Policy::RebalanceDrop => None,
        }
    }

    /// Parts per rank for the next step (one entry per rank).
    pub fn assignment(&self) -> &[u32] {
        &self.assignment
    }

    /// The policy parameters.
    pub fn params(&self) -> &StepPolicy {
        &self.params
    }

    /// The rebalancer (rebalancing policies), `None` otherwise.
    pub fn rebalancer(&self) -> Option<&Rebalancer> {
        self.rebalancer.as_ref()
    }

    /// The per-rank latency statistics fed so far (fed only under the policies that assign from
    /// them: backup workers and rebalancing; empty under the others).
    pub fn tracker(&self) -> &RankLatencyTracker {
        &self.tracker
    }

    /// Feeds step `step`'s per-rank mean latency per whole micro-batch (ns; NaN for a rank
    /// that computed nothing) and moves to the assignment of step `step + 1` (module doc).
    /// Returns true when an assignment was refused because it needed more than the slots.
    pub fn observe(&mut self, step: u64, per_micro_batch_ns: &[f64]) -> bool {
        // Only the policies that assign from latencies keep the tracker (its median over ranks
        // is an O(N log N) sort per step: the simulator's cost at 10000 ranks).
        match self.params.policy {
            Policy::BackupWorkers | Policy::Rebalance | Policy::RebalanceDrop => {
                self.tracker.observe(per_micro_batch_ns)
            }
            Policy::Synchronous
            | Policy::DropBefore
            | Policy::DropPredictive
            | Policy::ComputeBudget
            | Policy::LengthPredictive
            | Policy::CostBalance => {}
        }
        let next_step = step.saturating_add(1);
        if let Some(a) = self.fixed_for(next_step) {
            self.assignment = a;
            return false;
        }
        let n = self.assignment.len();
        let nominal = self.micro_batches.saturating_mul(self.split);
        match self.params.policy {
            Policy::BackupWorkers => {
                let lat = self.tracker.ewma_latency_ns();
                self.assignment = if next_step >= self.warmup_steps && lat.iter().all(|l| l.is_finite()) {
                    let predicted: Vec<f64> = lat.iter().map(|l| l * f64::from(self.micro_batches)).collect();
                    backup_aggregated(&predicted, self.params.backup_workers)
                        .into_iter()
                        .map(|keep| if keep { nominal } else { 0 })
                        .collect()
                } else {
                    vec![nominal; n]
                };
                false
            }
            Policy::Rebalance | Policy::RebalanceDrop => {
                let Some(rb) = self.rebalancer.as_mut() else { return false };
                // The rebalancer counts parts: it is fed the latency of one part.
                let split = f64::from(self.split);
                let per_part: Vec<f64> = self.tracker.ewma_latency_ns().iter().map(|l| l / split).collect();
                let next = rb.update(&per_part, &self.tracker.chronic()).to_vec();
                if next.iter().any(|&a| a > self.slots) {
                    return true;
                }
                self.assignment = next;
                false
            }
            // Handled by `fixed_for` above.
            Policy::Synchronous
            | Policy::DropBefore
            | Policy::DropPredictive
            | Policy::ComputeBudget
            | Policy::LengthPredictive
            | Policy::CostBalance => false,
        }
    }

    /// Replaces the state with a checkpointed one (an entry of the wrong length is ignored).
    pub fn restore(&mut self, assignment: &[u32], rebalancer: Option<Rebalancer>, tracker: Option<RankLatencyTracker>) {
        if assignment.len() == self.assignment.len() {
            self.assignment = assignment.to_vec();
        }
        if let (Some(rb), true) = (rebalancer, self.rebalancer.is_some()) {
            self.rebalancer = Some(rb);
        }
        if let Some(t) = tracker {
            self.tracker = t;
        }
    }

    /// Why `restored` (a checkpointed replica, e.g. deserialized) cannot stand in for this one:
    /// the first of its policy parameters, M, tail parts, slots, warm-up steps, budget, world
    /// size (its assignment's length) that differs, an assigned part count above the slots
    /// (which the walk would run: a checkpoint of another M, or an edited one), or a latency
    /// tracker or rebalancer that cannot replace this one's (their `restore_conflict`: another
    /// configuration, vectors of another length, a rebalanced assignment not summing to N·M).
    /// `None` when it can. The message names the field and both values (the checkpoint's first).
    pub fn restore_conflict(&self, restored: &Assigner) -> Option<String> {
        let fields = [
            ("step policy", format!("{:?}", self.params), format!("{:?}", restored.params)),
            ("micro_batches", self.micro_batches.to_string(), restored.micro_batches.to_string()),
            ("tail parts", self.split.to_string(), restored.split.to_string()),
            ("slots", self.slots.to_string(), restored.slots.to_string()),
            ("warmup_steps", self.warmup_steps.to_string(), restored.warmup_steps.to_string()),
            ("budget", self.budget.to_string(), restored.budget.to_string()),
            ("world_size", self.assignment.len().to_string(), restored.assignment.len().to_string()),
        ];
        if let Some((what, mine, theirs)) = fields.into_iter().find(|(_, a, b)| a != b) {
            return Some(format!("{what}: {theirs} in the checkpoint, {mine} in this step"));
        }
        if let Some(r) = restored.assignment.iter().position(|&k| k > self.slots) {
            return Some(format!(
                "assignment[{r}]: {} parts: above the {} slots per rank",
                restored.assignment[r], self.slots
            ));
        }
        if let Some(why) = self.tracker.restore_conflict(&restored.tracker) {
            return Some(why);
        }
        match (&self.rebalancer, &restored.rebalancer) {
            (Some(mine), Some(theirs)) => mine.restore_conflict(theirs),
            (None, None) => None,
            (mine, _) => Some(format!(
                "rebalancer: {} in the checkpoint, {} in this step",
                if mine.is_some() { "absent" } else { "present" },
                if mine.is_some() { "present" } else { "absent" }
            )),
        }
    }

    /// Sets the next step's assignment by hand (a caller that deals its own counts); the
    /// policy's rule replaces it after the next observed step.
    pub fn set(&mut self, assignment: Vec<u32>) {
        self.assignment = assignment;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget() -> Threshold {
        Threshold::Fixed(Duration::from_millis(1))
    }

    #[test]
    fn fixed_policies_and_the_compute_budget_keep_the_nominal_batch_in_warm_up() {
        for p in [
            Policy::Synchronous,
            Policy::DropBefore,
            Policy::DropPredictive,
            Policy::LengthPredictive,
            Policy::CostBalance,
        ] {
            let mut a = Assigner::new(StepPolicy::new(p), 3, 4, 8, 2, budget(), 0);
            assert_eq!(a.assignment(), &[4, 4, 4], "{p}");
            a.observe(0, &[1.0, 2.0, 3.0]);
            assert_eq!(a.assignment(), &[4, 4, 4], "{p}");
        }
        let p = StepPolicy { tail: crate::policy::TailShape::split(2), ..StepPolicy::new(Policy::ComputeBudget) };
        let mut a = Assigner::new(p, 2, 4, 16, 2, budget(), 0);
        assert_eq!(a.assignment(), &[8, 8], "warm-up step 0: M·S");
        a.observe(0, &[1.0, 1.0]);
        assert_eq!(a.assignment(), &[8, 8], "warm-up step 1");
        a.observe(1, &[1.0, 1.0]);
        assert_eq!(a.assignment(), &[16, 16], "step 2: the cap 2·M·S");
        // No budget: M·S; slots below the cap bound it.
        let mut off = Assigner::new(p, 2, 4, 16, 0, Threshold::Off, 0);
        off.observe(0, &[1.0, 1.0]);
        assert_eq!(off.assignment(), &[8, 8]);
        let tight = Assigner::new(p, 2, 4, 12, 0, budget(), 0);
        assert_eq!(tight.assignment(), &[12, 12]);
    }

    #[test]
    fn backup_workers_skip_the_rank_predicted_last_after_warm_up() {
        let p = StepPolicy { backup_workers: 1, ..StepPolicy::new(Policy::BackupWorkers) };
        let mut a = Assigner::new(p, 3, 3, 3, 1, Threshold::Off, 0);
        assert_eq!(a.assignment(), &[3, 3, 3]);
        a.observe(0, &[1.0, 5.0, f64::NAN]);
        assert_eq!(a.assignment(), &[3, 3, 3], "rank 2 has no latency yet");
        a.observe(1, &[1.0, 5.0, 2.0]);
        assert_eq!(a.assignment(), &[3, 0, 3]);
        let b0 = StepPolicy { backup_workers: 0, ..p };
        let mut z = Assigner::new(b0, 3, 3, 3, 0, Threshold::Off, 0);
        z.observe(0, &[1.0, 5.0, 2.0]);
        assert_eq!(z.assignment(), &[3, 3, 3], "b = 0 is synchronous");
        // In warm-up the nominal batch runs.
        let mut w = Assigner::new(p, 3, 3, 3, 5, Threshold::Off, 0);
        w.observe(0, &[1.0, 5.0, 2.0]);
        assert_eq!(w.assignment(), &[3, 3, 3]);
    }

    #[test]
    fn rebalancing_moves_work_within_the_slots() {
        let p = StepPolicy::new(Policy::Rebalance);
        let mut a = Assigner::new(p, 4, 8, 16, 3, Threshold::Off, 0);
        a.observe(0, &[1.0, 2.0, 1.0, 1.0]);
        assert_eq!(a.assignment(), &[9, 5, 9, 9], "in warm-up too");
        assert_eq!(a.assignment().iter().sum::<u32>(), 32);
        // Slots of 8 refuse any move above M.
        let mut t = Assigner::new(p, 4, 8, 8, 0, Threshold::Off, 0);
        assert!(t.observe(0, &[1.0, 2.0, 1.0, 1.0]));
        assert_eq!(t.assignment(), &[8, 8, 8, 8]);
    }

    #[test]
    fn a_restored_replica_of_another_configuration_or_above_the_slots_is_named() {
        let p = StepPolicy::new(Policy::Rebalance);
        let a = Assigner::new(p, 2, 4, 8, 1, Threshold::Off, 0);
        assert_eq!(a.restore_conflict(&a.clone()), None);
        // One configuration field changed at a time: each named with both values.
        let cases = [
            (Assigner::new(StepPolicy::new(Policy::DropBefore), 2, 4, 8, 1, Threshold::Off, 0), "step policy"),
            (Assigner::new(p, 2, 2, 8, 1, Threshold::Off, 0), "micro_batches: 2 in the checkpoint, 4 in this step"),
            (Assigner::new(p, 2, 4, 16, 1, Threshold::Off, 0), "slots: 16 in the checkpoint, 8 in this step"),
            (Assigner::new(p, 2, 4, 8, 5, Threshold::Off, 0), "warmup_steps: 5 in the checkpoint, 1 in this step"),
            (Assigner::new(p, 2, 4, 8, 1, budget(), 0), "budget: true in the checkpoint, false in this step"),
            (Assigner::new(p, 3, 4, 8, 1, Threshold::Off, 0), "world_size: 3 in the checkpoint, 2 in this step"),
            (
                Assigner::new(
                    StepPolicy { tail: crate::policy::TailShape::split(2), ..p },
                    2,
                    4,
                    8,
                    1,
                    Threshold::Off,
                    0,
                ),
                "step policy",
            ),
        ];
        for (other, want) in cases {
            let got = a.restore_conflict(&other).unwrap_or_default();
            assert!(got.starts_with(want), "{got:?} should start with {want:?}");
        }
        // The same configuration with an edited assignment above the slots.
        let mut edited = a.clone();
        edited.set(vec![4, 9]);
        assert_eq!(a.restore_conflict(&edited).as_deref(), Some("assignment[1]: 9 parts: above the 8 slots per rank"));
        edited.set(vec![8, 0]);
        assert_eq!(a.restore_conflict(&edited), None, "within the slots: a rebalanced assignment");
        // Inside the tracker and the rebalancer (edited JSON, as a user's file would be).
        let json = serde_json::to_value(&a).unwrap();
        for (path, value, want) in [
            ("/tracker/ewma", serde_json::json!([]), "tracker: 0 latencies"),
            ("/tracker/slow", serde_json::json!([0, 0, 0]), "tracker: 2 latencies and 3 slow counts"),
            ("/tracker/cfg/ewma_alpha", serde_json::json!(7.0), "tracker configuration"),
            ("/rebalancer/micro_batches", serde_json::json!(0), "rebalancer micro_batches: 0 in the checkpoint, 4"),
            ("/rebalancer/cfg/hysteresis", serde_json::json!(-3.0), "rebalancer configuration"),
            ("/rebalancer/assignment", serde_json::json!([4, 4, 4]), "rebalancer: 3 counts and 2 flags"),
            ("/rebalancer/rebalanced", serde_json::json!([]), "rebalancer: 2 counts and 0 flags"),
            ("/rebalancer/assignment", serde_json::json!([4, 3]), "rebalancer assignment: [4, 3] sums to 7"),
            ("/rebalancer", serde_json::Value::Null, "rebalancer: absent in the checkpoint, present"),
        ] {
            let mut j = json.clone();
            *j.pointer_mut(path).unwrap() = value;
            let other: Assigner = serde_json::from_value(j).unwrap();
            let got = a.restore_conflict(&other).unwrap_or_default();
            assert!(got.starts_with(want), "{path}: {got:?} should start with {want:?}");
        }
        // A counter at the top saturates instead of overflowing.
        let mut j = json.clone();
        *j.pointer_mut("/tracker/steps").unwrap() = serde_json::json!(u64::MAX);
        let mut top: Assigner = serde_json::from_value(j).unwrap();
        assert_eq!(a.restore_conflict(&top), None);
        top.observe(0, &[1.0, 2.0]);
        assert_eq!(top.tracker().steps(), u64::MAX);
    }
}
