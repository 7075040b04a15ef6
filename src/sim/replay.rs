//! Replay of a real trace under a deadline policy: "what if this job had run with DropCompute
//! at threshold τ".
//!
//! Owns: [`replay`]. Must not touch: parsing (takes a [`LatencyTrace`]) or tuning. Each rank
//! walks its recorded latencies through [`crate::policy::decide`], with a per-rank
//! [`LatencyEstimator`] fed by the micro-batches it computed (as the scheduler would), in trace
//! step order; the step id passed to `decide` is the trace's step id. Step time = max over ranks
//! of the computed prefix + the recorded overhead. Assumes a dropped micro-batch's cost would
//! not have shifted later ones (latencies replayed as recorded).

use crate::policy::{LatencyEstimator, PolicyConfig, decide};
use crate::trace::LatencyTrace;

/// Outcome of [`replay`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// Mean recorded step time (max compute + overhead), ns.
    pub baseline_step_ns: f64,
    /// Mean step time under the policy, ns.
    pub policy_step_ns: f64,
    /// Fraction of micro-batches not started.
    pub drop_rate: f64,
    /// (1 - d)·baseline/policy - 1.
    pub effective_speedup: f64,
    /// Per step: (baseline ns, policy ns, micro-batches started over all ranks).
    pub per_step: Vec<(f64, f64, u64)>,
}

/// Replay `trace` under `policy`. Never fails (the trace is validated at construction).
pub fn replay(trace: &LatencyTrace, policy: &PolicyConfig) -> ReplayReport {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let mut est: Vec<LatencyEstimator> = (0..n).map(|_| LatencyEstimator::default()).collect();
    let mut per_step = Vec::with_capacity(trace.num_steps());
    for (si, &step) in trace.steps().iter().enumerate() {
        let mat = trace.step_matrix(si);
        let (mut base, mut pol, mut started_all) = (0.0f64, 0.0f64, 0u64);
        for (r, row) in mat.chunks_exact(m).enumerate() {
            base = base.max(row.iter().sum());
            let (mut elapsed, mut started) = (0.0f64, 0u32);
            for &lat in row {
                if !decide(policy, step, started, elapsed as u64, est[r].estimate()).is_start() {
                    break;
                }
                elapsed += lat;
                started += 1;
                est[r].observe(lat as u64);
            }
            pol = pol.max(elapsed);
            started_all += u64::from(started);
        }
        let o = trace.overhead_ns()[si];
        per_step.push((base + o, pol + o, started_all));
    }
    let s = per_step.len() as f64;
    let b = per_step.iter().map(|x| x.0).sum::<f64>() / s;
    let p = per_step.iter().map(|x| x.1).sum::<f64>() / s;
    let started: u64 = per_step.iter().map(|x| x.2).sum();
    let d = 1.0 - started as f64 / (s * (n * m) as f64);
    ReplayReport {
        baseline_step_ns: b,
        policy_step_ns: p,
        drop_rate: d,
        effective_speedup: (1.0 - d) * b / p - 1.0,
        per_step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CheckMode, Threshold};
    use std::time::Duration;

    #[test]
    fn replay_applies_the_policy_to_recorded_latencies() {
        // 2 ranks, M = 3, 1 step; rank 1 is slow on its last micro-batch.
        let t = LatencyTrace::new("t", vec![0, 1], vec![10], 3, vec![10.0, 10.0, 10.0, 10.0, 10.0, 40.0], vec![5.0])
            .expect("valid");
        let off = replay(&t, &PolicyConfig::default());
        assert_eq!(off.per_step, vec![(65.0, 65.0, 6)]);
        assert_eq!(off.effective_speedup, 0.0);
        let p = PolicyConfig {
            threshold: Threshold::Fixed(Duration::from_nanos(20)),
            check: CheckMode::BeforeMicroBatch,
            warmup_steps: 0,
            min_micro_batches: 1,
        };
        let r = replay(&t, &p);
        // Each rank starts mb 0 (0 < 20) and mb 1 (10 < 20), stops at 20.
        assert_eq!(r.per_step, vec![(65.0, 25.0, 4)]);
        assert!((r.drop_rate - 2.0 / 6.0).abs() < 1e-12);
        assert!((r.effective_speedup - ((4.0 / 6.0) * 65.0 / 25.0 - 1.0)).abs() < 1e-12);
    }
}
