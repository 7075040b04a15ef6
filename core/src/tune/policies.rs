//! Every step policy tuned and compared on one trace (`simulate`/`tune --policy`): each
//! policy's free parameter chosen on the replay ([`crate::sim::policies::replay_policy`]) under
//! the same guardrails as the threshold recommendation, beside the ideal (the exact search, not
//! realizable) and the straggler-free bound.
//!
//! Owns: [`compare`] (and [`compare_with_progress`]), [`PolicyOutcome`], [`PolicyComparison`], [`ESTIMATOR_QUANTILES`]. Must not
//! touch: I/O, clocks, devices. Pure and deterministic for a seed.
//!
//! Parameters searched (the best admissible effective speedup wins; ties keep the first):
//! - drop policies (`length-predictive` and `cost-balance` among them) and `rebalance-drop`:
//!   the threshold over the exact search's candidates (at
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
//! With a jitter window (`Guardrails::jitter_ns` > 0) a threshold is judged by every threshold
//! within +- it (`super::window::window_of`): admitted only if all are, ranked by the worst
//! effective speedup among them, in the comparison's coordinate search as in
//! [`best_threshold_on`]; each breakpoint less the jitter is a candidate too.
//!
//! Admissible: drop rate <= `max_drop_rate`, every step aggregates at least
//! `min_batch_fraction` and at most [`MAX_BATCH_FRACTION`] of the nominal batch; enabled: admissible and effective speedup >=
//! `min_gain`. A policy with no admissible candidate reports the synchronous run (enabled
//! false).
//!
//! The straggler-free bound: every rank as fast as the step's median rank (median over ranks
//! of start offset + compute time), nothing dropped: mean recorded step / mean (median
//! compute + overhead) - 1. Not a policy: what removing all imbalance would give. The
//! mean-cost bound ([`mean_cost_bound_speedup`]: every rank at the step's mean) is what
//! balancing the step's work can reach (issue 26's bound for data-driven stragglers).

use crate::policy::{CheckMode, Policy, StepPolicy, TailShape, Threshold};
use crate::sim::policies::{PolicyReplay, PolicyRun, ReplayData, TraceSteps, replay_policy, replay_policy_on};
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
    /// Replayed effective speedup (0.05 = +5 %): aggregated/nominal · recorded/policy step - 1
    /// (in real tokens when the trace carries them: `sim::policies::PolicyReplay::tokens`).
    pub effective_speedup: f64,
    /// Replayed drop rate (fraction of the nominal micro-batches, or of the nominal real tokens
    /// when the trace carries them, not aggregated): what the guardrail judges.
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
    /// The jitter window (ns) each threshold was judged by (`Guardrails::jitter_ns`; 0: the
    /// point replay): a point is admitted only if every threshold within +- it is, ranked by
    /// the window's smallest effective speedup; each row reports its threshold's own replay.
    #[serde(default)]
    pub jitter_ns: f64,
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

/// Micro-batch walks one policy's parameter search may replay (each replay walks N·M·S·split
/// of them); a parameter space larger than that allows is searched coordinate by coordinate,
/// coarse to fine ([`search`]). Chosen so that `simulate --policy all` over the default
/// `--workers` (16 to 10000) finishes in about a minute on 2 cores (ARCHITECTURE.md).
pub const SEARCH_BUDGET: u64 = 50_000_000;
/// Replays every policy's search may make whatever the trace's size.
pub const MIN_SEARCH_REPLAYS: usize = 32;
/// Rounds of the coordinate search.
pub const SEARCH_ROUNDS: usize = 2;

/// A point of a parameter space (one index per axis) and its outcome when admissible.
type Scored = Option<(f64, PolicyOutcome)>;

/// The best admissible point of the space with axes of `dims` points (indices; `eval` gives a
/// point's effective speedup and outcome, `None` when not admissible), replaying at most about
/// `budget` points. When the whole space fits, every point is replayed (in parallel) and the
/// first best in lexicographic order wins (the exhaustive search). Otherwise a coordinate
/// search from `start`: [`SEARCH_ROUNDS`] rounds over the axes (the last one, the threshold,
/// first), each axis searched with the others fixed, exhaustively when its points fit the
/// round's share of the budget, else on an even coarse grid and then every point between the
/// coarse best's neighbours; a point is replayed at most once. Between the two, when every
/// combination of the other axes leaves the last axis (the threshold) at least 24 points, each
/// combination's threshold is searched coarse to fine. Deterministic. `None` when no point
/// replayed is admissible.
fn search(
    dims: &[usize],
    start: &[usize],
    budget: usize,
    eval: &(dyn Fn(&[usize]) -> Scored + Sync),
) -> Option<(Vec<usize>, PolicyOutcome)> {
    use rayon::prelude::*;
    let total = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
    let point = |mut i: usize| -> Vec<usize> {
        let mut x = vec![0; dims.len()];
        for (k, &d) in dims.iter().enumerate().rev() {
            x[k] = i % d;
            i /= d;
        }
        x
    };
    let first_best = |scored: Vec<(Vec<usize>, Scored)>| -> Option<(f64, Vec<usize>, PolicyOutcome)> {
        scored.into_iter().fold(None, |best, (x, sc)| match (sc, &best) {
            (Some((v, o)), None) => Some((v, x, o)),
            (Some((v, o)), Some((b, _, _))) if v > *b => Some((v, x, o)),
            _ => best,
        })
    };
    if total <= budget {
        let scored: Vec<(Vec<usize>, Scored)> =
            (0..total).into_par_iter().map(|i| (point(i), eval(&point(i)))).collect();
        return first_best(scored).map(|(_, x, o)| (x, o));
    }
    let mut memo: std::collections::HashMap<Vec<usize>, Scored> = std::collections::HashMap::new();
    let replay = |xs: Vec<Vec<usize>>, memo: &mut std::collections::HashMap<Vec<usize>, Scored>| {
        let todo: Vec<Vec<usize>> = xs.iter().filter(|x| !memo.contains_key(*x)).cloned().collect();
        let done: Vec<(Vec<usize>, Scored)> = todo
            .into_par_iter()
            .map(|x| {
                let sc = eval(&x);
                (x, sc)
            })
            .collect();
        memo.extend(done);
        let mut out: Vec<(Vec<usize>, Scored)> = xs
            .into_iter()
            .map(|x| {
                let sc = memo.get(&x).cloned().flatten();
                (x, sc)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.dedup_by(|a, b| a.0 == b.0);
        out
    };
    let axes = dims.len();
    // One axis `d` through `through` (the others fixed), within `share` replays: every point
    // when they fit, else an even coarse grid (both ends) and then every point between the
    // coarse best's neighbours.
    let line = |d: usize, through: &[usize], share: usize, memo: &mut std::collections::HashMap<Vec<usize>, Scored>| {
        let at = |i: usize| -> Vec<usize> {
            let mut x = through.to_vec();
            x[d] = i;
            x
        };
        let len = dims[d];
        if len <= share {
            return first_best(replay((0..len).map(at).collect(), memo));
        }
        let k = (share / 2).max(2);
        let coarse: Vec<usize> = (0..k).map(|j| j * (len - 1) / (k - 1)).collect();
        let (_, x, _) = first_best(replay(coarse.iter().map(|&i| at(i)).collect(), memo))?;
        let pos = coarse.iter().position(|&i| i == x[d]).unwrap_or(0);
        let (lo, hi) = (coarse[pos.saturating_sub(1)], coarse[(pos + 1).min(k - 1)]);
        let stride = (hi - lo).div_ceil(share.saturating_sub(k).max(1)).max(1);
        first_best(replay((lo..=hi).step_by(stride).chain([x[d]]).map(at).collect(), memo))
    };
    let better = |best: &mut Option<(f64, Vec<usize>, PolicyOutcome)>,
                  found: Option<(f64, Vec<usize>, PolicyOutcome)>| {
        if let Some((v, x, o)) = found
            && best.as_ref().is_none_or(|(b, _, _)| v > *b)
        {
            *best = Some((v, x, o));
        }
    };
    let mut best: Option<(f64, Vec<usize>, PolicyOutcome)> = None;
    // Every combination of the other axes, the last (the threshold) coarse to fine, when each
    // line gets at least MIN_LINE points.
    let others: usize = dims[..axes - 1].iter().product();
    const MIN_LINE: usize = 24;
    if others.saturating_mul(MIN_LINE) <= budget {
        let share = budget / others;
        for i in 0..others {
            let mut through = point(i * dims[axes - 1]);
            through[axes - 1] = start[axes - 1];
            let found = line(axes - 1, &through, share, &mut memo);
            better(&mut best, found);
        }
        return best.map(|(_, x, o)| (x, o));
    }
    // Otherwise coordinate by coordinate from `start`, the threshold first.
    let share = (budget / (SEARCH_ROUNDS * axes)).max(4);
    let mut cur = start.to_vec();
    let order: Vec<usize> = std::iter::once(axes - 1).chain(0..axes - 1).collect();
    for _ in 0..SEARCH_ROUNDS {
        for &d in &order {
            let found = line(d, &cur, share, &mut memo);
            if let Some((_, x, _)) = &found {
                cur = x.clone();
            }
            better(&mut best, found);
        }
    }
    best.map(|(_, x, o)| (x, o))
}

/// The straggler-free bound (module doc).
pub fn straggler_free_speedup(trace: &LatencyTrace) -> f64 {
    bound_speedup(trace, |t| crate::policy::rebalance::median(t).unwrap_or(0.0))
}

/// The mean-cost bound (issue 26's straggler-free bound for data-driven stragglers): every
/// rank given the step's mean cost (mean over ranks of clock skew + start offset + compute
/// time), nothing
/// dropped: mean recorded step / mean (mean compute + overhead) - 1. What a perfect balance of
/// the step's work would give: on a length-tailed trace the median rank is below the mean, so
/// [`straggler_free_speedup`] overstates what moving work can reach there.
pub fn mean_cost_bound_speedup(trace: &LatencyTrace) -> f64 {
    bound_speedup(trace, |t| t.iter().sum::<f64>() / t.len().max(1) as f64)
}

/// Mean recorded step over the mean step with every rank at `stat` of the ranks' times, - 1.
fn bound_speedup(trace: &LatencyTrace, stat: impl Fn(Vec<f64>) -> f64) -> f64 {
    let n = trace.world_size();
    let compute = trace.rank_compute_ns();
    let (mut base, mut free) = (0.0, 0.0);
    for (si, row) in compute.chunks_exact(n).enumerate() {
        let off = &trace.start_offsets_ns()[si * n..(si + 1) * n];
        let skew = &trace.skews_ns()[si * n..(si + 1) * n];
        let t: Vec<f64> = row.iter().zip(off).zip(skew).map(|((c, o), k)| c + o + k).collect();
        let max = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let med = stat(t);
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
    best_threshold_on(trace, how, ideal, template, &mut || Box::new(TraceSteps(trace.num_steps())))
}

/// [`best_threshold`] with each candidate replayed on its own copy of a run's data model
/// (`data()` gives a fresh one per candidate: `sim::policies::replay_policy_on`), e.g. the
/// text job's stream, which knows the bucket and tokens of each unit it deals and re-queues what
/// a candidate drops, as the run will (`deal::ReplayStream::with_shapes`): the guardrail then
/// judges the drop rate the prediction predicts. [`best_threshold`] is this with the trace's own
/// steps (`TraceSteps`: every recorded cell where it was recorded).
pub fn best_threshold_on(
    trace: &LatencyTrace,
    how: &Recommend,
    ideal: &TuneReport,
    template: PolicyRun,
    data: &mut dyn FnMut() -> Box<dyn ReplayData>,
) -> Option<(PolicyRun, PolicyOutcome)> {
    let n_m = (trace.world_size() * trace.micro_batches()) as f64;
    let p = template.params.policy;
    let fine = template.params.tail.enabled() || p.rebalances();
    let at = |t: f64| with_deadline(template, t);
    let (grid, jitter) = match p {
        Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance => (vec![0.0], 0.0),
        _ => (threshold_grid(ideal, fine), how.guardrails.jitter_ns),
    };
    // Each candidate judged by its jitter window (`super::window`; itself alone without a
    // jitter): admitted and enabled only if every threshold in it is, ranked by the window's
    // smallest effective speedup; the outcome kept is the candidate's own.
    let judged = super::window::judge(&super::window::candidates(&grid, jitter), jitter, &mut |t| {
        let c = at(t);
        let (o, adm) = outcome(&replay_policy_on(trace, &c, data().as_mut()), n_m, how);
        (c, o, adm)
    });
    let mut best: Option<(PolicyRun, PolicyOutcome, f64)> = None;
    for ((c, o, _), window) in judged {
        if !window.iter().all(|(_, _, adm)| *adm) {
            continue;
        }
        let worst = window.iter().map(|(_, o, _)| o.effective_speedup).fold(f64::INFINITY, f64::min);
        if best.as_ref().is_none_or(|(_, _, b)| worst > *b) {
            let enabled = window.iter().all(|(_, o, _)| o.enabled);
            best = Some((c, PolicyOutcome { enabled, ..o }, worst));
        }
    }
    best.map(|(c, o, _)| (c, o))
}

/// `run` with the deadline a threshold `t` (ns) sets: the budget of compute-budget, the drop
/// threshold of the drop policies and `rebalance-drop`; `run` unchanged for a policy without
/// a deadline (synchronous, backup-workers, rebalance).
fn with_deadline(run: PolicyRun, t: f64) -> PolicyRun {
    match run.params.policy {
        Policy::ComputeBudget => PolicyRun {
            params: StepPolicy { budget: Threshold::from_ms(t / 1e6).unwrap_or(Threshold::Off), ..run.params },
            ..run
        },
        Policy::DropBefore
        | Policy::DropPredictive
        | Policy::RebalanceDrop
        | Policy::LengthPredictive
        | Policy::CostBalance => PolicyRun { threshold: Threshold::from_ns_f64(t), ..run },
        Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance => run,
    }
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
    compare_with_progress(trace, how, policies, tail, seed, &mut |_| {})
}

/// [`compare`], calling `done(policy)` after each policy's row (a caller's progress display).
pub fn compare_with_progress(
    trace: &LatencyTrace,
    how: &Recommend,
    policies: &[Policy],
    tail: TailShape,
    seed: u64,
    done: &mut dyn FnMut(Policy),
) -> PolicyComparison {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let n_m = (n * m) as f64;
    let ideal =
        tune(trace, &TuneConfig { guardrails: how.guardrails, min_micro_batches: how.execution.min_micro_batches });
    let exec = how.execution;
    let mut rows = Vec::new();
    for &p in Policy::ALL.iter().filter(|p| policies.contains(p)) {
        let base =
            PolicyRun { seed, ..PolicyRun::new(StepPolicy { tail, ..StepPolicy::new(p) }, Threshold::Off, exec) };
        // The parameter space (module doc), one axis per free parameter in loop order:
        // compute budget (cap, quantile, budget), drop policies (quantile, threshold), backup
        // workers (b); a point is replayed once.
        let predictive = (p.drops() || p == Policy::ComputeBudget) && p.check_mode(exec.check) == CheckMode::Predictive;
        let quantiles: &[f64] =
            if predictive { &ESTIMATOR_QUANTILES } else { &[crate::policy::LatencyEstimator::DEFAULT_QUANTILE] };
        let q_start =
            quantiles.iter().position(|&q| q == crate::policy::LatencyEstimator::DEFAULT_QUANTILE).unwrap_or(0);
        let fine = tail.enabled() || p.rebalances();
        // Under a jitter window each breakpoint less the jitter is a candidate too
        // (`super::window::candidates`), as in `best_threshold_on`.
        let jitter = how.guardrails.jitter_ns;
        let grid = match p {
            Policy::ComputeBudget
            | Policy::DropBefore
            | Policy::DropPredictive
            | Policy::RebalanceDrop
            | Policy::LengthPredictive
            | Policy::CostBalance => super::window::candidates(&threshold_grid(&ideal, fine), jitter),
            Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance => Vec::new(),
        };
        let caps: Vec<u32> = (m as u32..=2 * m as u32).collect();
        let (dims, start): (Vec<usize>, Vec<usize>) = match p {
            Policy::Synchronous | Policy::Rebalance => (vec![1], vec![0]),
            Policy::BackupWorkers => (vec![n], vec![1.min(n - 1)]),
            Policy::DropBefore
            | Policy::DropPredictive
            | Policy::RebalanceDrop
            | Policy::LengthPredictive
            | Policy::CostBalance => (vec![quantiles.len(), grid.len()], vec![q_start, grid.len() / 2]),
            Policy::ComputeBudget => {
                (vec![caps.len(), quantiles.len(), grid.len()], vec![caps.len() - 1, q_start, grid.len() / 2])
            }
        };
        // The threshold (or budget) is the last axis of the policies that have one.
        let threshold_axis = (!grid.is_empty()).then(|| dims.len() - 1);
        let run_at = |x: &[usize]| -> PolicyRun {
            match p {
                Policy::Synchronous | Policy::Rebalance => base,
                Policy::BackupWorkers => {
                    PolicyRun { params: StepPolicy { backup_workers: x[0] as u32, ..base.params }, ..base }
                }
                Policy::DropBefore
                | Policy::DropPredictive
                | Policy::RebalanceDrop
                | Policy::LengthPredictive
                | Policy::CostBalance => PolicyRun {
                    estimator_quantile: quantiles[x[0]],
                    threshold: Threshold::from_ns_f64(grid[x[1]]),
                    ..base
                },
                Policy::ComputeBudget => PolicyRun {
                    params: StepPolicy {
                        budget_max_micro_batches: Some(caps[x[0]]),
                        budget: Threshold::from_ms(grid[x[2]] / 1e6).unwrap_or(Threshold::Off),
                        ..base.params
                    },
                    estimator_quantile: quantiles[x[1]],
                    ..base
                },
            }
        };
        // A point is judged by its jitter window (`super::window::window_of` on the threshold
        // axis; the point alone without a jitter): admitted only if every threshold in it is,
        // scored by the window's smallest effective speedup, enabled only if every one is; the
        // outcome kept is the point's own (as `best_threshold_on`).
        let eval = |x: &[usize]| -> Option<(f64, PolicyOutcome)> {
            let run = run_at(x);
            let (o, adm) = outcome(&replay_policy(trace, &run), n_m, how);
            if !adm {
                return None;
            }
            let (mut worst, mut enabled) = (o.effective_speedup, o.enabled);
            if let Some(axis) = threshold_axis {
                let (near, ends) = super::window::window_of(grid[x[axis]], &grid, jitter);
                for t in near.into_iter().map(|i| grid[i]).chain(ends.into_iter().flatten()) {
                    let (w, adm) = outcome(&replay_policy(trace, &with_deadline(run, t)), n_m, how);
                    if !adm {
                        return None;
                    }
                    worst = worst.min(w.effective_speedup);
                    enabled &= w.enabled;
                }
            }
            Some((worst, PolicyOutcome { enabled, ..o }))
        };
        let per_replay = (n * m) as u64 * trace.num_steps() as u64 * u64::from(tail.parts());
        let budget = (SEARCH_BUDGET / per_replay.max(1)).max(MIN_SEARCH_REPLAYS as u64) as usize;
        let best =
            if dims.contains(&0) { None } else { search(&dims, &start, budget, &eval) }.map(|(x, o)| (o, run_at(&x)));
        let row = match best {
            Some((mut o, c)) => {
                if p.drops() {
                    o.threshold_ms = c.threshold.as_ms();
                }
                if predictive {
                    o.estimator_quantile = Some(c.estimator_quantile);
                }
                if p == Policy::BackupWorkers {
                    o.backup_workers = Some(c.params.backup_workers);
                }
                if p == Policy::ComputeBudget {
                    o.budget_ms = c.params.budget.as_ms();
                    o.budget_max_micro_batches = c.params.budget_max_micro_batches;
                }
                o
            }
            None => {
                let sync = PolicyRun { params: StepPolicy::new(Policy::Synchronous), ..base };
                let (o, _) = outcome(&replay_policy(trace, &sync), n_m, how);
                PolicyOutcome { policy: p, enabled: false, ..o }
            }
        };
        rows.push(row);
        done(p);
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
        jitter_ns: how.guardrails.jitter_ns,
    }
}

/// True when `train --threshold auto` tunes the second run of `params` on the policy replay
/// rather than DropCompute's recommendation ([`super::recommend`]): the policies that move work
/// (`Policy::moves_work`: the replay runs the scheduler's assignment step), the length-aware
/// ones (`Policy::length_aware`: `length-predictive` checks with each bucket's estimate, which
/// only the policy replay walks; DropCompute's recommendation replays the blind check) and any
/// policy with a tail shape.
pub fn tunes_on_policy_replay(params: &StepPolicy) -> bool {
    params.policy.moves_work() || params.policy.length_aware() || params.tail.enabled()
}

/// The second run as `train` replays it at `threshold` (the budget of `compute-budget`: off,
/// as a declined `--threshold auto`, runs M per rank, which the replay's assignment step does
/// too): `policy` with b = `backup_workers`, the tail shape `tail`, default rebalancing and
/// cap (2·M), the scheduler's default estimator quantile, `execution`, `seed`. The search
/// template of [`auto_threshold`] (with [`Threshold::Off`]).
pub fn train_run(
    policy: Policy,
    backup_workers: u32,
    tail: TailShape,
    seed: u64,
    threshold: Threshold,
    execution: crate::sim::replay::ExecutionModel,
) -> PolicyRun {
    let budget = if policy == Policy::ComputeBudget { threshold } else { Threshold::Off };
    let params = StepPolicy { backup_workers, tail, budget, ..StepPolicy::new(policy) };
    PolicyRun { seed, ..PolicyRun::new(params, threshold, execution) }
}

/// What `--threshold auto` chose on a baseline trace ([`auto_threshold`]).
#[derive(Clone, Debug, PartialEq)]
pub enum AutoChoice {
    /// DropCompute (no policy template): `tune::recommend`'s verdict, replayed as the run
    /// executes ([`Recommend::execution`]) and judged by [`Recommend::guardrails`].
    DropCompute(Verdict),
    /// A step policy tuned on its own replay ([`tunes_on_policy_replay`]): its best run and
    /// outcome within the guardrails, `None` when no candidate is admissible.
    Policy(Option<Box<(PolicyRun, PolicyOutcome)>>),
}

impl AutoChoice {
    /// The deadline the run uses: the enabled threshold of DropCompute, the chosen run's
    /// deadline for a policy (`StepPolicy::deadline`: the budget of `compute-budget`, off for
    /// a policy without a deadline), else [`Threshold::Off`].
    pub fn threshold(&self) -> Threshold {
        match self {
            AutoChoice::DropCompute(v) => v.threshold(),
            AutoChoice::Policy(Some(found)) => found.0.params.deadline(found.0.threshold),
            AutoChoice::Policy(None) => Threshold::Off,
        }
    }

    /// (effective speedup, drop rate) replayed at the chosen deadline, `None` when declined.
    pub fn outcome(&self) -> Option<(f64, f64)> {
        match self {
            AutoChoice::DropCompute(Verdict::Enable(c)) => Some((c.objective, c.drop_rate)),
            AutoChoice::Policy(Some(found)) => Some((found.1.effective_speedup, found.1.drop_rate)),
            AutoChoice::DropCompute(Verdict::Decline(_)) | AutoChoice::Policy(None) => None,
        }
    }
}

/// `--threshold auto` on the baseline `trace`, the one rule of `train` and `tune --auto-for`:
/// with `template` = `None`, DropCompute's [`super::recommend`] under `how`; with a policy run
/// ([`train_run`] at [`Threshold::Off`]: every parameter as the run executes it), the threshold
/// (the budget of `compute-budget`) maximising the policy replay's effective speedup within
/// `how`'s guardrails ([`best_threshold`] over the exact search's candidates). Tuning on the
/// replay of the policy itself matters once work moves: a threshold tuned on the unbalanced
/// baseline over-drops after rebalancing. Pure and deterministic.
pub fn auto_threshold(trace: &LatencyTrace, how: &Recommend, template: Option<PolicyRun>) -> AutoChoice {
    auto_threshold_on(trace, how, template, &mut || Box::new(TraceSteps(trace.num_steps())))
}

/// [`auto_threshold`] with a policy replay's candidates replayed on `data()`, a fresh copy of
/// the run's data model each ([`best_threshold_on`]); the blind DropCompute choice (no
/// template) is the search of [`super::recommend`] as in [`auto_threshold`].
pub fn auto_threshold_on(
    trace: &LatencyTrace,
    how: &Recommend,
    template: Option<PolicyRun>,
    data: &mut dyn FnMut() -> Box<dyn ReplayData>,
) -> AutoChoice {
    match template {
        None => AutoChoice::DropCompute(super::recommend(trace, how).verdict),
        Some(template) => {
            let cfg = TuneConfig { guardrails: how.guardrails, min_micro_batches: how.execution.min_micro_batches };
            let ideal = tune(trace, &cfg);
            AutoChoice::Policy(
                best_threshold_on(trace, how, &ideal, template, data).filter(|(_, o)| o.enabled).map(Box::new),
            )
        }
    }
}
