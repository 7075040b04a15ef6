//! Every step policy tuned and compared on one trace (`simulate`/`tune --policy`): each
//! policy's free parameter chosen on the replay ([`crate::sim::policies::replay_policy`]) under
//! the same guardrails as the threshold recommendation, beside the ideal (the exact search, not
//! realizable) and the straggler-free bound.
//!
//! Owns: [`compare`], [`PolicyOutcome`], [`PolicyComparison`], [`ESTIMATOR_QUANTILES`]. Must not
//! touch: I/O, clocks, devices. Pure and deterministic for a seed.
//!
//! Parameters searched (the best admissible effective speedup wins; ties keep the first):
//! - drop policies and `rebalance-drop`: the threshold over the exact search's candidates (at
//!   most [`super::recommend::MAX_REPLAYED`], as [`super::recommend`]); with the predictive
//!   check also the estimator's quantile over [`ESTIMATOR_QUANTILES`] (a lower quantile stops
//!   fewer micro-batches that would have fitted, a higher one overshoots less);
//! - `compute-budget`: the budget over the same candidates and the per-rank cap over M..=2·M
//!   (fast ranks refill, within the budget, what slow ranks drop); with the predictive check
//!   also the estimator's quantile;
//! - `backup-workers`: b in 0..N (b = 0 is synchronous);
//! - `rebalance`: none (default hysteresis);
//! - `synchronous`: none.
//!
//! Admissible: drop rate <= `max_drop_rate`, every step aggregates at least
//! `min_batch_fraction` and at most [`MAX_BATCH_FRACTION`] of the nominal batch; enabled: admissible and effective speedup >=
//! `min_gain`. A policy with no admissible candidate reports the synchronous run (enabled
//! false).
//!
//! The straggler-free bound: every rank as fast as the step's median rank (median over ranks
//! of start offset + compute time), nothing dropped: mean recorded step / mean (median compute
//! + overhead) - 1. Not a policy: what removing all imbalance would give.

use std::time::Duration;

use crate::policy::{CheckMode, Policy, PolicyParams, TailShape, Threshold};
use crate::sim::policies::{PolicyReplay, PolicyRun, replay_policy};
use crate::trace::LatencyTrace;

use super::recommend::{MAX_REPLAYED, Recommend};
use super::search::{CandidateScore, TuneConfig, TuneReport, Verdict, tune};

/// Largest admissible fraction of the nominal batch aggregated in one step: a step never
/// aggregates more than the nominal N·M micro-batches (the learning rate is set for that
/// batch). Binds only the compute budget, whose fast ranks refill what slow ranks drop.
pub const MAX_BATCH_FRACTION: f64 = 1.0;

/// Quantiles of the predictive check's estimator the tuner tries.
pub const ESTIMATOR_QUANTILES: [f64; 5] = [0.25, 0.5, 0.75, 0.9, 1.0];

/// One policy, tuned, replayed (times in ms, counts in micro-batches).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyOutcome {
    /// The policy.
    pub policy: Policy,
    /// The threshold chosen (drop policies), ms.
    pub threshold_ms: Option<f64>,
    /// The estimator quantile chosen (predictive check).
    pub estimator_quantile: Option<f64>,
    /// Per-rank micro-batch cap chosen (compute budget).
    pub budget_max_micro_batches: Option<u32>,
    /// b chosen (backup workers).
    pub backup_workers: Option<u32>,
    /// The budget chosen (compute budget), ms.
    pub budget_ms: Option<f64>,
    /// Within the guardrails and above the minimum gain.
    pub enabled: bool,
    /// Replayed effective speedup (0.05 = +5 %): aggregated/nominal · recorded/policy step - 1.
    pub effective_speedup: f64,
    /// Replayed drop rate (fraction of the nominal micro-batches not aggregated).
    pub drop_rate: f64,
    /// Fewest micro-batches aggregated in a step / N·M.
    pub min_batch_fraction: f64,
    /// Most micro-batches aggregated in a step / N·M (above 1 under a compute budget).
    pub max_batch_fraction: f64,
    /// Micro-batches of the nominal batches not aggregated, over the trace (fractional with a
    /// tail shape: parts / split).
    pub lost_micro_batches: f64,
    /// Micro-batches computed and discarded (backup workers).
    pub wasted_micro_batches: f64,
    /// Mean recorded step, ms.
    pub baseline_step_ms: f64,
    /// Mean replayed step, ms.
    pub policy_step_ms: f64,
}

/// Every policy on one trace.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyComparison {
    /// The trace.
    pub trace: String,
    /// N.
    pub ranks: usize,
    /// M.
    pub micro_batches: usize,
    /// Steps.
    pub steps: usize,
    /// One row per policy requested, in [`Policy::ALL`] order.
    pub rows: Vec<PolicyOutcome>,
    /// The exact search's unconstrained best (a micro-batch counts iff it ends by the
    /// threshold): not realizable.
    pub ideal_best: CandidateScore,
    /// The exact search's best within the guardrails, if any: not realizable.
    pub ideal_admissible: Option<CandidateScore>,
    /// The straggler-free bound's effective speedup (module doc).
    pub straggler_free_speedup: f64,
    /// The tail shape every policy ran with (split 1: whole micro-batches only).
    #[serde(default)]
    pub tail: TailShape,
}

fn outcome(r: &PolicyReplay, n_m: f64, how: &Recommend) -> (PolicyOutcome, bool) {
    let split = f64::from(r.split.max(1));
    let min_f = r.min_step_micro_batches as f64 / (n_m * split);
    let max_f = r.max_step_micro_batches as f64 / (n_m * split);
    let admissible = r.drop_rate <= how.guardrails.max_drop_rate
        && min_f >= how.guardrails.min_batch_fraction
        && max_f <= MAX_BATCH_FRACTION;
    let o = PolicyOutcome {
        policy: r.policy,
        threshold_ms: None,
        estimator_quantile: None,
        backup_workers: None,
        budget_max_micro_batches: None,
        budget_ms: None,
        enabled: admissible && r.effective_speedup >= how.guardrails.min_gain,
        effective_speedup: r.effective_speedup,
        drop_rate: r.drop_rate,
        min_batch_fraction: min_f,
        max_batch_fraction: max_f,
        lost_micro_batches: r.lost as f64 / split,
        wasted_micro_batches: r.computed.saturating_sub(r.aggregated) as f64 / split,
        baseline_step_ms: r.baseline_step_ns / 1e6,
        policy_step_ms: r.policy_step_ns / 1e6,
    };
    (o, admissible)
}

/// The candidate thresholds: the exact search's positive candidates, at most
/// [`MAX_REPLAYED`] evenly strided (as [`super::recommend`]). With `fine` (a tail shape, or
/// rebalancing: compute ends fall between the recorded micro-batch ends, which the exact
/// search's candidates are) also [`FINE_POINTS`] evenly spaced thresholds over the same
/// range, merged in ascending order.
fn threshold_grid(ideal: &TuneReport, fine: bool) -> Vec<f64> {
    let pts: Vec<f64> = ideal.curve.iter().map(|c| c.threshold_ns).filter(|t| *t > 0.0).collect();
    let stride = pts.len().div_ceil(MAX_REPLAYED).max(1);
    let mut grid: Vec<f64> = pts.iter().copied().step_by(stride).collect();
    if fine && let (Some(lo), Some(hi)) = (pts.iter().copied().reduce(f64::min), pts.iter().copied().reduce(f64::max)) {
        grid.extend((0..FINE_POINTS).map(|k| lo + (hi - lo) * k as f64 / (FINE_POINTS - 1) as f64));
        grid.sort_by(f64::total_cmp);
        grid.dedup();
    }
    grid
}

/// Evenly spaced thresholds added to the grid of a tail shape or a rebalancing policy
/// ([`threshold_grid`]).
pub const FINE_POINTS: usize = 100;

/// The straggler-free bound (module doc).
pub fn straggler_free_speedup(trace: &LatencyTrace) -> f64 {
    let n = trace.world_size();
    let compute = trace.rank_compute_ns();
    let (mut base, mut free) = (0.0, 0.0);
    for (si, row) in compute.chunks_exact(n).enumerate() {
        let off = &trace.start_offsets_ns()[si * n..(si + 1) * n];
        let t: Vec<f64> = row.iter().zip(off).map(|(c, o)| c + o).collect();
        let max = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let med = crate::policy::rebalance::median(t).unwrap_or(0.0);
        let o = trace.overhead_ns()[si];
        base += max + o;
        free += med + o;
    }
    if free > 0.0 { base / free - 1.0 } else { 0.0 }
}

/// The best admissible threshold for `template` on `trace` (the policy's deadline: the
/// DropCompute threshold of a drop policy, the budget of `compute-budget`), searched over the
/// exact search's candidates, refined for a tail shape or rebalancing ([`threshold_grid`] of
/// `ideal`), everything else of `template`
/// kept (estimator quantile, cap, tail shape, rebalancing). Returns the run with the chosen
/// threshold and its outcome, or `None` when no candidate is admissible (module doc). A policy
/// without a deadline replays `template` once.
pub fn best_threshold(
    trace: &LatencyTrace,
    how: &Recommend,
    ideal: &TuneReport,
    template: PolicyRun,
) -> Option<(PolicyRun, PolicyOutcome)> {
    let n_m = (trace.world_size() * trace.micro_batches()) as f64;
    let p = template.params.policy;
    let fine = template.params.tail.enabled() || p.rebalances();
    let cands: Vec<PolicyRun> = match p {
        Policy::ComputeBudget => threshold_grid(ideal, fine)
            .into_iter()
            .map(|t| PolicyRun { params: PolicyParams { budget_ms: Some(t / 1e6), ..template.params }, ..template })
            .collect(),
        Policy::DropBefore | Policy::DropPredictive | Policy::RebalanceDrop => threshold_grid(ideal, fine)
            .into_iter()
            .map(|t| PolicyRun { threshold: Threshold::Fixed(Duration::from_nanos(t.round() as u64)), ..template })
            .collect(),
        Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance => vec![template],
    };
    let mut best: Option<(PolicyRun, PolicyOutcome)> = None;
    for c in cands {
        let (o, adm) = outcome(&replay_policy(trace, &c), n_m, how);
        if adm && best.as_ref().is_none_or(|(_, b)| o.effective_speedup > b.effective_speedup) {
            best = Some((c, o));
        }
    }
    best
}

/// Tune and replay each of `policies` on `trace` under `how` (module doc), every policy with
/// the tail shape `tail` ([`TailShape`]; `TailShape::default()` for whole micro-batches only);
/// `seed` draws the micro-batches beyond the trace's M. Never fails.
pub fn compare(
    trace: &LatencyTrace,
    how: &Recommend,
    policies: &[Policy],
    tail: TailShape,
    seed: u64,
) -> PolicyComparison {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let n_m = (n * m) as f64;
    let ideal =
        tune(trace, &TuneConfig { guardrails: how.guardrails, min_micro_batches: how.execution.min_micro_batches });
    let exec = how.execution;
    let mut rows = Vec::new();
    for &p in Policy::ALL.iter().filter(|p| policies.contains(p)) {
        let base =
            PolicyRun { seed, ..PolicyRun::new(PolicyParams { tail, ..PolicyParams::new(p) }, Threshold::Off, exec) };
        // Candidate templates of this policy; each one's threshold (or budget) is searched.
        let predictive = (p.drops() || p == Policy::ComputeBudget) && p.check_mode(exec.check) == CheckMode::Predictive;
        let quantiles: &[f64] =
            if predictive { &ESTIMATOR_QUANTILES } else { &[crate::policy::LatencyEstimator::DEFAULT_QUANTILE] };
        let mut templates: Vec<PolicyRun> = Vec::new();
        match p {
            Policy::Synchronous | Policy::Rebalance => templates.push(base),
            Policy::BackupWorkers => {
                for b in 0..n as u32 {
                    templates.push(PolicyRun { params: PolicyParams { backup_workers: b, ..base.params }, ..base });
                }
            }
            Policy::ComputeBudget => {
                for cap in m as u32..=2 * m as u32 {
                    for &q in quantiles {
                        let params = PolicyParams { budget_max_micro_batches: Some(cap), ..base.params };
                        templates.push(PolicyRun { params, estimator_quantile: q, ..base });
                    }
                }
            }
            Policy::DropBefore | Policy::DropPredictive | Policy::RebalanceDrop => {
                for &q in quantiles {
                    templates.push(PolicyRun { estimator_quantile: q, ..base });
                }
            }
        }
        let mut best: Option<(PolicyOutcome, PolicyRun)> = None;
        for t in templates {
            if let Some((c, o)) = best_threshold(trace, how, &ideal, t)
                && best.as_ref().is_none_or(|(b, _)| o.effective_speedup > b.effective_speedup)
            {
                best = Some((o, c));
            }
        }
        let row = match best {
            Some((mut o, c)) => {
                if p.drops() {
                    o.threshold_ms = c.threshold.as_ns().map(|ns| ns as f64 / 1e6);
                }
                if predictive {
                    o.estimator_quantile = Some(c.estimator_quantile);
                }
                if p == Policy::BackupWorkers {
                    o.backup_workers = Some(c.params.backup_workers);
                }
                if p == Policy::ComputeBudget {
                    o.budget_ms = c.params.budget_ms;
                    o.budget_max_micro_batches = c.params.budget_max_micro_batches;
                }
                o
            }
            None => {
                let sync = PolicyRun { params: PolicyParams::new(Policy::Synchronous), ..base };
                let (o, _) = outcome(&replay_policy(trace, &sync), n_m, how);
                PolicyOutcome { policy: p, enabled: false, ..o }
            }
        };
        rows.push(row);
    }
    PolicyComparison {
        trace: trace.source().to_string(),
        ranks: n,
        micro_batches: m,
        steps: trace.num_steps(),
        rows,
        ideal_best: ideal.best,
        ideal_admissible: match ideal.verdict {
            Verdict::Enable(c) => Some(c),
            Verdict::Decline(_) => ideal.best_admissible,
        },
        straggler_free_speedup: straggler_free_speedup(trace),
        tail,
    }
}
