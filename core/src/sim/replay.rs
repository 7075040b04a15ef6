//! Replay of a real trace under a deadline policy: "what if this job had run with DropCompute
//! at threshold τ", executed as the scheduler executes it.
//!
//! Owns: [`ExecutionModel`] (what the scheduler does around the deadline rule) and [`replay`]
//! (DropCompute's replay: [`super::policies::replay_policy`] with the drop policy of the check
//! mode). Must not touch: parsing (takes a [`LatencyTrace`]) or tuning. Each rank walks its recorded
//! latencies through [`crate::policy::decide`] exactly as `schedule::Scheduler` does:
//! - the step id passed to `decide` is the trace's step id, so steps below
//!   [`ExecutionModel::warmup_steps`] never drop (give a trace that holds the warm-up steps to
//!   replay a whole run);
//! - the first `min_micro_batches` always start;
//! - sync lag k: the check before micro-batch i sees the end of micro-batch i-1-k (0 when
//!   i-1-k < 0), never the micro-batches still in flight;
//! - the elapsed time starts at the trace's start offset of the step and rank
//!   ([`LatencyTrace::start_offsets_ns`]: device work between the compute clock start and the
//!   first micro-batch);
//! - the drop-rate guard ([`ExecutionModel::drop_guard`], `policy::DropGuard`): before each
//!   step the guard, fed the replayed global counts of the steps before, says whether the step
//!   runs with the threshold; a step it holds off is walked with the threshold off;
//! - predictive check: a per-rank [`crate::policy::LatencyEstimator`], persistent across steps, fed with a
//!   micro-batch's latency when the scheduler reads its end event (lazily under sync lag, all
//!   started ones at the end of the compute phase), in trace step order.
//!
//! Step time = max over ranks of (clock skew + start offset + computed prefix) + the recorded
//! per-step overhead (collective, rescale, optimizer: what the step spends after the last
//! rank's compute end, net of the skews). The clock skew ([`LatencyTrace::skews_ns`]) is when
//! the rank's compute clock started after the step's earliest (a rank whose update runs longer
//! starts later); the deadline counts from the rank's own clock start, so the skew is added to
//! the rank's finish, not to the elapsed time its checks see, and it stays under any policy
//! (it comes from the update, not from the micro-batches: a slowed rank whose work is cut still
//! starts late).
//! Assumes a dropped micro-batch's cost would not have shifted later ones (latencies replayed
//! as recorded), which is exact when the latencies are common random numbers (`train`).

pub use super::policies::ExecutionModel;
use super::policies::{PolicyRun, replay_policy};
use crate::policy::{CheckMode, Policy, StepPolicy, Threshold};
use crate::trace::LatencyTrace;

/// Outcome of [`replay`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// Mean recorded step time (max compute + overhead), ns.
    pub baseline_step_ns: f64,
    /// Mean step time under the policy, ns.
    pub policy_step_ns: f64,
    /// Fraction of micro-batches not started; of the real tokens when the trace carries them
    /// (`LatencyTrace::tokens`: the replay's `PolicyReplay::drop_rate`), so the guardrail of
    /// `tune::recommend` judges tokens.
    pub drop_rate: f64,
    /// (1 - d)·baseline/policy - 1.
    pub effective_speedup: f64,
    /// Per step: (baseline ns, policy ns, micro-batches started over all ranks).
    pub per_step: Vec<(f64, f64, u64)>,
    /// Micro-batches started per step and rank (S x N, step-major).
    pub started: Vec<u32>,
    /// Per step: whether the threshold was in force (false: the drop-rate guard,
    /// [`ExecutionModel::drop_guard`], held it off; all true without a guard).
    pub enforced: Vec<bool>,
}

/// Replay `trace` at `threshold` executed as `exec` says (module doc). Never fails (the trace
/// is validated at construction).
pub fn replay(trace: &LatencyTrace, threshold: Threshold, exec: &ExecutionModel) -> ReplayReport {
    let policy = match exec.check {
        CheckMode::BeforeMicroBatch => Policy::DropBefore,
        CheckMode::Predictive => Policy::DropPredictive,
    };
    let r = replay_policy(trace, &PolicyRun::new(StepPolicy::new(policy), threshold, *exec));
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let (per_step, started_cells) = (r.per_step, r.started);
    let s = per_step.len() as f64;
    let b = per_step.iter().map(|x| x.0).sum::<f64>() / s;
    let p = per_step.iter().map(|x| x.1).sum::<f64>() / s;
    let started: u64 = per_step.iter().map(|x| x.2).sum();
    let d = match r.tokens {
        Some((_, nominal)) if nominal > 0.0 => r.drop_rate,
        _ => 1.0 - started as f64 / (s * (n * m) as f64),
    };
    ReplayReport {
        baseline_step_ns: b,
        policy_step_ns: p,
        drop_rate: d,
        effective_speedup: (1.0 - d) * b / p - 1.0,
        per_step,
        started: started_cells,
        enforced: r.enforced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ns: u64) -> Threshold {
        Threshold::Fixed(Duration::from_nanos(ns))
    }

    fn before(sync_lag: u32, warmup_steps: u64) -> ExecutionModel {
        ExecutionModel {
            check: CheckMode::BeforeMicroBatch,
            sync_lag,
            warmup_steps,
            min_micro_batches: 1,
            drop_guard: None,
        }
    }

    #[test]
    fn replay_applies_the_policy_to_recorded_latencies() {
        // 2 ranks, M = 3, 1 step; rank 1 is slow on its last micro-batch.
        let t = LatencyTrace::new("t", vec![0, 1], vec![10], 3, vec![10.0, 10.0, 10.0, 10.0, 10.0, 40.0], vec![5.0])
            .expect("valid");
        let off = replay(&t, Threshold::Off, &before(0, 0));
        assert_eq!(off.per_step, vec![(65.0, 65.0, 6)]);
        assert_eq!(off.effective_speedup, 0.0);
        let r = replay(&t, at(20), &before(0, 0));
        // Each rank starts mb 0 (0 < 20) and mb 1 (10 < 20), stops at 20.
        assert_eq!(r.per_step, vec![(65.0, 25.0, 4)]);
        assert!((r.drop_rate - 2.0 / 6.0).abs() < 1e-12);
        assert!((r.effective_speedup - ((4.0 / 6.0) * 65.0 / 25.0 - 1.0)).abs() < 1e-12);
    }

    /// One rank, M = 4, latencies 10 each, threshold 15, check before each micro-batch.
    fn one_rank(offset: f64) -> LatencyTrace {
        LatencyTrace::new("t", vec![0], vec![10], 4, vec![10.0; 4], vec![0.0])
            .and_then(|t| t.with_start_offsets(vec![offset]))
            .expect("valid")
    }

    #[test]
    fn sync_lag_checks_against_the_end_of_micro_batch_i_minus_1_minus_k() {
        // Lag 0: mb 2 sees 20 >= 15: 2 started. Lag 1: mb 2 sees the end of mb 0 (10), mb 3
        // sees 20: 3 started. Lag 2: mb 3 sees the end of mb 0 (10): all 4 start.
        let started = |lag| replay(&one_rank(0.0), at(15), &before(lag, 0)).per_step[0];
        assert_eq!(started(0), (40.0, 20.0, 2));
        assert_eq!(started(1), (40.0, 30.0, 3));
        assert_eq!(started(2), (40.0, 40.0, 4));
    }

    /// The drop-rate guard at 0.25, 2 ranks x M = 4, threshold 15, check before: a rank of
    /// latencies 10 starts 2 (0, 10 < 15), drops 2; step 3's rank 0 (5, 5, 5, 10) starts 3.
    /// Enforced drops per step would be 4, 4, 4, 3, 4, 4 of 8. By the rule `dropped + reserve
    /// <= 0.25 · (handed + 8)`: step 0: 0 <= 2, enforced (dropped 4, reserve 4); step 1: 8 <=
    /// 4 no; step 2: 8 <= 6 no; step 3: 8 <= 8 yes (dropped 7); step 4: 11 <= 10 no; step 5:
    /// 11 <= 12 yes: 11 of 48 dropped, against 23 without the guard.
    #[test]
    fn the_drop_guard_turns_the_threshold_off_exactly_when_its_rule_says() {
        let mut lat = Vec::new();
        for s in 0..6 {
            lat.extend(if s == 3 { [5.0, 5.0, 5.0, 10.0] } else { [10.0; 4] });
            lat.extend([10.0; 4]);
        }
        let t = LatencyTrace::new("t", vec![0, 1], (0..6).collect(), 4, lat, vec![0.0; 6]).expect("valid");
        let plain = replay(&t, at(15), &before(0, 0));
        assert!((plain.drop_rate - 23.0 / 48.0).abs() < 1e-12, "{}", plain.drop_rate);
        assert_eq!(plain.enforced, vec![true; 6]);
        let guarded = replay(&t, at(15), &ExecutionModel { drop_guard: Some(0.25), ..before(0, 0) });
        assert_eq!(guarded.enforced, vec![true, false, false, true, false, true]);
        let started: Vec<u64> = guarded.per_step.iter().map(|x| x.2).collect();
        assert_eq!(started, vec![4, 8, 8, 5, 8, 4]);
        assert_eq!(guarded.per_step[1], (40.0, 40.0, 8), "held off: the synchronous step");
        assert_eq!(guarded.per_step[3], (40.0, 20.0, 5), "rank 1 recorded 40");
        assert!((guarded.drop_rate - 11.0 / 48.0).abs() < 1e-12, "{}", guarded.drop_rate);
        // In warm-up nothing drops and every step counts as handed out: with 2 warm-up steps
        // (16 handed, 0 dropped) step 2 enforces (0 <= 6), step 3 (4 + 4 <= 8) too.
        let warm = replay(&t, at(15), &ExecutionModel { drop_guard: Some(0.25), ..before(0, 2) });
        assert_eq!(&warm.enforced[..4], &[true, true, true, true]);
        assert_eq!(warm.per_step[3].2, 5);
    }

    #[test]
    fn warm_up_steps_never_drop_and_the_start_offset_counts_as_elapsed_time() {
        // Step id 10 < 11 warm-up steps: everything starts.
        assert_eq!(replay(&one_rank(0.0), at(15), &before(0, 11)).per_step[0], (40.0, 40.0, 4));
        // An offset of 7 before the first micro-batch: mb 1 sees 17 >= 15; the step is 7 + 10.
        assert_eq!(replay(&one_rank(7.0), at(15), &before(0, 0)).per_step[0], (47.0, 17.0, 1));
    }

    #[test]
    fn the_predictive_estimate_is_fed_only_with_ends_the_scheduler_has_read() {
        // M = 4, latencies 10, 10, 10, 30 on one rank over two steps (step 0 warm-up: all
        // start, the window holds 10, 10, 10, 30); predictive, threshold 35, 1 micro-batch
        // always. Step 1, lag 0: before mb 1 the end of mb 0 is read (window 10, 10, 10, 30,
        // 10: 0.9-quantile 30), 10 + 30 > 35: stop at 1. Lag 1: before mb 1 nothing new is
        // read and the elapsed time seen is 0: 0 + 30 <= 35 starts it; before mb 2 the end of
        // mb 0 is read, 10 + 30 > 35: stop at 2.
        let t = LatencyTrace::new(
            "t",
            vec![0],
            vec![0, 1],
            4,
            vec![10.0, 10.0, 10.0, 30.0, 10.0, 10.0, 10.0, 30.0],
            vec![0.0, 0.0],
        )
        .expect("valid");
        let p = |lag| ExecutionModel {
            check: CheckMode::Predictive,
            sync_lag: lag,
            warmup_steps: 1,
            min_micro_batches: 1,
            drop_guard: None,
        };
        assert_eq!(replay(&t, at(35), &p(0)).per_step[1], (60.0, 10.0, 1));
        assert_eq!(replay(&t, at(35), &p(1)).per_step[1], (60.0, 20.0, 2));
    }
}
