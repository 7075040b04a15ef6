//! `bench text-table`: the text job's measured policy table (issue 26). For one world size, the
//! synchronous baseline runs once; every policy of [`POLICIES`] then runs against that same
//! baseline (`dropcompute_train::run::run_after_baseline_threads`: its threshold tuned on that
//! baseline's trace as `train --threshold auto` tunes it), and each row reports the measured
//! effective speedup (tokens per second against the baseline's, `summary::report`), the
//! simulator's prediction (`summary::job_prediction`), the drop rate (`summary::drop_rate`)
//! and the share of the straggler-free bound's gain. The bound is
//! `dropcompute::tune::policies::mean_cost_bound_speedup` of the baseline's trace
//! (`schedule::auto::trace_of_reports` of rank 0's reports): every rank given the step's mean
//! cost, nothing dropped.
//!
//! Owns: [`POLICIES`], [`TextTable`], [`PolicyRow`], [`measure`]. Must not touch: the
//! command line (`commands::bench` parses the flags into each policy's `TrainConfig`), the
//! driver (`dropcompute_train::run`), the prediction, the bound or the outputs' definitions
//! (`dropcompute_train::summary`, `dropcompute::tune::policies`); it prints nothing.
#![forbid(unsafe_code)]

use std::fmt;
use std::time::{Instant, SystemTime};

use dropcompute::policy::Policy;
use dropcompute::tune::policies::mean_cost_bound_speedup;
use dropcompute_train::config::TrainConfig;
use dropcompute_train::error::TrainError;
use dropcompute_train::job::{Job, RankOutcome};
use dropcompute_train::report::RunMetadata;
use dropcompute_train::run as job_run;
use dropcompute_train::summary;

/// The policies of the table, in its row order: blind DropCompute, the length-aware deadline,
/// blind rebalancing (without and with the deadline) and the length-aware cost balance.
pub const POLICIES: [Policy; 5] =
    [Policy::DropPredictive, Policy::LengthPredictive, Policy::Rebalance, Policy::RebalanceDrop, Policy::CostBalance];

/// One policy's row.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRow {
    /// The policy run.
    pub policy: Policy,
    /// Threshold in force at the end of the run, ms (`None`: off).
    pub threshold_ms: Option<f64>,
    /// How the threshold was chosen (`RankOutcome::threshold_source`).
    pub threshold_source: String,
    /// Measured effective speedup (ratio, 1 = none): tokens per second over the baseline's.
    pub speedup: f64,
    /// Predicted effective speedup (`summary::Prediction::speedup`); `None` without a prediction.
    pub predicted: Option<f64>,
    /// Drop rate of the run (fraction, `summary::drop_rate`).
    pub drop_rate: f64,
    /// Held-out loss per real token of the run's final parameters (nats).
    pub holdout_loss: Option<f64>,
    /// Host wall time of the run, seconds.
    pub wall_s: f64,
}

impl PolicyRow {
    /// (predicted − measured) / measured; `None` without a prediction.
    pub fn error(&self) -> Option<f64> {
        self.predicted.map(|p| (p - self.speedup) / self.speedup)
    }

    /// The row's gain as a fraction of the bound's: (speedup − 1) / `bound_gain`; NaN when the
    /// bound has no gain.
    pub fn share(&self, bound_gain: f64) -> f64 {
        if bound_gain > 0.0 { (self.speedup - 1.0) / bound_gain } else { f64::NAN }
    }
}

/// The table of one world size.
#[derive(Clone, Debug, PartialEq)]
pub struct TextTable {
    /// World size N.
    pub ranks: u32,
    /// Micro-batches per rank per step M.
    pub micro_batches: u32,
    /// Steps of each run.
    pub steps: u64,
    /// The mean-cost bound's gain on the baseline's trace (speedup − 1).
    pub bound_gain: f64,
    /// The baseline's held-out loss per real token (nats).
    pub baseline_holdout_loss: Option<f64>,
    /// Host wall time of the baseline run, seconds.
    pub baseline_wall_s: f64,
    /// The largest admissible drop rate of the guardrails (fraction).
    pub max_drop_rate: f64,
    /// One row per policy, [`POLICIES`] order.
    pub rows: Vec<PolicyRow>,
}

/// Runs the baseline once with `config_of`'s configuration of the first policy of
/// [`POLICIES`] that moves work (its count rows the widest: `Job::slots_of`; the baseline's
/// step times differ from a narrower row's only by that collective's bytes), then every
/// policy with `config_of(policy)` (each must be the same job with that `--policy`, comparing,
/// in threads) against it, each on a freshly configured in-process mock
/// (`run::mock_runtime`). `done` is called after each run with its label and wall seconds.
///
/// # Errors
/// Any [`TrainError`] of `config_of`, the job or a run; [`TrainError::Config`] when the
/// baseline has no complete step (no trace for the bound).
pub fn measure(
    config_of: &dyn Fn(Policy) -> Result<TrainConfig, TrainError>,
    done: &mut dyn FnMut(&str, f64),
) -> Result<TextTable, TrainError> {
    let first = POLICIES.iter().copied().find(|p| p.moves_work()).unwrap_or(POLICIES[0]);
    let base_job = Job::prepare(config_of(first)?)?;
    let t = Instant::now();
    let rt = job_run::mock_runtime(&base_job)?;
    let baseline = job_run::run_baseline_threads(&base_job, &rt, false)?;
    drop(rt);
    let baseline_wall_s = t.elapsed().as_secs_f64();
    done("baseline", baseline_wall_s);
    let b0: &RankOutcome = baseline
        .first()
        .and_then(|o| o.first())
        .ok_or(TrainError::Config { what: "bench text-table", value: "the baseline returned no rank".into() })?;
    let trace = dropcompute::schedule::auto::trace_of_reports(&b0.reports).ok_or(TrainError::Config {
        what: "bench text-table",
        value: "the baseline run has no complete step: no trace for the bound (run more steps)".into(),
    })?;
    let bound_gain = mean_cost_bound_speedup(&trace);
    let mut rows = Vec::with_capacity(POLICIES.len());
    for p in POLICIES {
        let job = Job::prepare(config_of(p)?)?;
        let t = Instant::now();
        let rt = job_run::mock_runtime(&job)?;
        let outcomes = job_run::run_after_baseline_threads(&job, &rt, &baseline, false)?;
        job_run::check_lockstep(&outcomes)?;
        drop(rt);
        let wall_s = t.elapsed().as_secs_f64();
        done(p.name(), wall_s);
        let predicted = summary::job_prediction(&job, &outcomes);
        // The report's metadata is not printed; the backend is always the in-process mock.
        let meta = RunMetadata::new(&job.cfg, "in-process mock (bench text-table)".into(), SystemTime::now());
        let rep = summary::report(&job, &outcomes, meta, None)?;
        let run = &outcomes[0][1];
        rows.push(PolicyRow {
            policy: p,
            threshold_ms: run.threshold_ns.map(|ns| ns as f64 / 1e6),
            threshold_source: run.threshold_source.clone(),
            speedup: rep.speedup.unwrap_or(f64::NAN),
            predicted: predicted.map(|p| p.speedup),
            drop_rate: summary::drop_rate(&job, run),
            holdout_loss: run.holdout_loss,
            wall_s,
        });
    }
    Ok(TextTable {
        ranks: base_job.cfg.ranks,
        micro_batches: base_job.cfg.micro_batches,
        steps: base_job.steps().unwrap_or(0),
        bound_gain,
        baseline_holdout_loss: b0.holdout_loss,
        baseline_wall_s,
        max_drop_rate: base_job.cfg.guardrails.max_drop_rate,
        rows,
    })
}

/// The first row's name of the bound (`bench text-table`'s output; tests read it back).
pub const BOUND_ROW: &str = "mean-cost bound";

impl fmt::Display for TextTable {
    /// A heading line, then a markdown table: policy | threshold | speedup measured |
    /// predicted | error | drop rate | share of the mean-cost bound's gain | held-out loss (vs
    /// baseline's) | wall s; one row per policy, then the bound's. Speedups to 4 decimals,
    /// shares and rates in % to 1 decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "N = {}, M = {}, {} steps, --noise none, virtual time; baseline: held-out loss {}, wall {:.1} s; drop-rate guardrail {:.0} %",
            self.ranks,
            self.micro_batches,
            self.steps,
            self.baseline_holdout_loss.map_or("-".into(), |l| format!("{l:.4}")),
            self.baseline_wall_s,
            self.max_drop_rate * 100.0
        )?;
        writeln!(
            f,
            "| policy | threshold | speedup measured | predicted | error | drop rate | share of the mean-cost bound's gain | held-out loss (vs baseline's) | wall s |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|")?;
        for r in &self.rows {
            let loss = match (r.holdout_loss, self.baseline_holdout_loss) {
                (Some(l), Some(b)) => format!("{l:.4} ({:+.4})", l - b),
                (Some(l), None) => format!("{l:.4}"),
                _ => "-".into(),
            };
            let share = r.share(self.bound_gain);
            writeln!(
                f,
                "| {} | {} | {:.4}x | {} | {} | {:.1} % | {} | {} | {:.1} |",
                r.policy.name(),
                r.threshold_ms.map_or("off".into(), |t| format!("{t:.3} ms")),
                r.speedup,
                r.predicted.map_or("-".into(), |p| format!("{p:.4}x")),
                r.error().map_or("-".into(), |e| format!("{:+.1} %", e * 100.0)),
                r.drop_rate * 100.0,
                if share.is_finite() { format!("{:.1} %", share * 100.0) } else { "n/a".into() },
                loss,
                r.wall_s
            )?;
        }
        writeln!(f, "| {BOUND_ROW} | - | {:.4}x | - | - | 0.0 % | 100.0 % | - | - |", 1.0 + self.bound_gain)?;
        for r in &self.rows {
            writeln!(f, "{}: threshold {}", r.policy.name(), r.threshold_source)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(speedup: f64, predicted: Option<f64>) -> PolicyRow {
        PolicyRow {
            policy: Policy::Rebalance,
            threshold_ms: None,
            threshold_source: "off (rebalance)".into(),
            speedup,
            predicted,
            drop_rate: 0.0,
            holdout_loss: Some(2.5),
            wall_s: 1.0,
        }
    }

    #[test]
    fn share_and_error_are_ratios_of_gains() {
        let r = row(1.09, Some(1.12));
        assert!((r.share(0.10) - 0.9).abs() < 1e-12);
        assert!((r.error().unwrap() - 0.03 / 1.09).abs() < 1e-12);
        assert!(r.share(0.0).is_nan());
        assert_eq!(row(1.0, None).error(), None);
    }

    #[test]
    fn the_table_has_a_row_per_policy_and_the_bound() {
        let t = TextTable {
            ranks: 4,
            micro_batches: 8,
            steps: 3,
            bound_gain: 0.25,
            baseline_holdout_loss: Some(2.0),
            baseline_wall_s: 1.0,
            max_drop_rate: 0.1,
            rows: vec![row(1.2, None)],
        };
        let s = t.to_string();
        assert!(s.contains("| rebalance | off | 1.2000x | - | - | 0.0 % | 80.0 % | 2.5000 (+0.5000) | 1.0 |"), "{s}");
        assert!(s.contains("| mean-cost bound | - | 1.2500x |"), "{s}");
    }
}
