//! `dropcompute validate`: how close the simulator's prediction is to the run it predicts, over
//! a grid of short `train` configurations.
//!
//! Owns: [`Args`] (the grid's flags), [`run`] / [`run_to`], the per-configuration row
//! ([`ConfigRow`]), the summary ([`Summary`]) and the `--json` form ([`ValidateJson`]). Must not
//! touch: the job (`dropcompute_train`: each configuration is `train` itself, built from the same
//! flags and validated by `commands::train::Args::validate`) or the prediction
//! (`train::summary::prediction`, the replay `train` prints as "effective speedup, predicted").
//!
//! Per configuration: the baseline and DropCompute runs of `train` (same seed: common random
//! numbers), the prediction (the baseline's latencies replayed at the DropCompute run's
//! threshold as the scheduler executes it), and the relative error of the predicted mean step
//! time and effective speedup against the measured ones. Then the median, p90 (nearest rank)
//! and worst |error| over the grid, and the targets: every configuration within 0.5 % in
//! virtual time (the same latencies go in, so the replay must reproduce the run); median
//! <= 1.5 % and p90 <= 5.5 % in real time (the What-if simulator's published error against
//! real runs, 1.3 % median and 5.5 % p90).
#![forbid(unsafe_code)]

use std::io::Write;

use clap::Parser;

use super::{CommandError, io_err};
use dropcompute::mock::config::TimeMode;
use dropcompute::policy::{CheckMode, Policy};
use dropcompute_train::error::TrainError;
use dropcompute_train::job::Job;
use dropcompute_train::report::RunMetadata;
use dropcompute_train::{run as job_run, summary};

/// Target of `validate` in virtual time: the largest |relative error| of any configuration.
pub const VIRTUAL_MAX_ERROR: f64 = 0.005;
/// Target of `validate` in virtual time for an estimated prediction (`ConfigRow::estimate`: a
/// policy computing beyond the recorded M, or a run outlasting the recorded steps): the median
/// |relative error| over those configurations (issue 23).
pub const ESTIMATE_MEDIAN_ERROR: f64 = 0.01;
/// Target for estimated predictions in virtual time: the largest |relative error|.
pub const ESTIMATE_MAX_ERROR: f64 = 0.02;
/// Target for estimated predictions in virtual time: the largest |mean signed relative error|
/// (no bias).
pub const ESTIMATE_MAX_BIAS: f64 = 0.005;
/// Target of `validate` in real time: the median |relative error|.
pub const REAL_MEDIAN_ERROR: f64 = 0.015;
/// Target of `validate` in real time: the p90 |relative error|.
pub const REAL_P90_ERROR: f64 = 0.055;

/// Arguments of `dropcompute validate` (each list flag is comma-separated; the grid is their
/// product).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// World sizes.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    pub ranks: Vec<u32>,
    /// Micro-batches per rank per step.
    #[arg(long, value_delimiter = ',', default_value = "4,8")]
    pub micro_batches: Vec<u32>,
    /// Deadline check modes [default: each policy's own where it fixes one (drop-before:
    /// before; drop-predictive, length-predictive, cost-balance: predictive), else both,
    /// before and predictive]. Given, every configuration runs each check listed, and a
    /// policy that fixes a different one is refused (`Policy::resolve_check`).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub check: Vec<CheckMode>,
    /// Sync lags (a combination whose lag is not below its micro-batches is skipped).
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub sync_lag: Vec<u32>,
    /// Slow-rank settings: `none` or RANK:FACTOR (as `train --slow-rank`; RANK must exist in
    /// every world size).
    #[arg(long, value_delimiter = ',', default_value = "none,3:2")]
    pub slow_rank: Vec<String>,
    /// Seeds.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub seeds: Vec<u64>,
    /// Step policies of the DropCompute run (`train --policy`; empty, the default: train's
    /// default for the task, `train::Args::policy_or_task_default`: the digits' DropCompute
    /// with the check of `--check`, the text task's cost-balance).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policy: Vec<Policy>,
    /// Tail shapes (`train --tail-split`: parts per micro-batch; 1 = whole micro-batches).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub tail_split: Vec<u32>,
    /// Run lengths in epochs (`train --epochs`); empty, the default: `--steps` steps.
    #[arg(long, value_delimiter = ',')]
    pub epochs: Vec<u32>,
    /// Steps per run (warm-up included; `--threshold auto` needs warm-up + 10); unused with
    /// `--epochs`.
    #[arg(long, default_value_t = 16)]
    pub steps: u64,
    /// Threshold of every DropCompute run whose policy has a deadline: auto (tuned on its
    /// baseline, as `train`), or ms (the policies without one run with it off; a number is
    /// refused when no policy of the grid has one).
    #[arg(long, default_value = "auto")]
    pub threshold: String,
    /// Mock device time: virtual (deterministic, the default) or real (sleeps; slower).
    #[arg(long, value_enum, default_value_t = TimeMode::Virtual)]
    pub time_mode: TimeMode,
    /// Print the rows and the summary as JSON (`ValidateJson`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// More `train` flags for every configuration, after `--` (e.g. `-- --max-drop-rate 0.25
    /// --noise lognormal:0.5`).
    #[arg(last = true, allow_hyphen_values = true)]
    pub train_args: Vec<String>,
}

/// `train` flags that `validate` sets itself and refuses after `--` (`--resume`: every
/// configuration is a fresh pair of runs; it panicked, issue 24).
pub const OVERRIDDEN_TRAIN_FLAGS: [&str; 5] = ["--out", "--launch", "--no-compare", "--compare", "--resume"];

/// One configuration of the grid, predicted and measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ConfigRow {
    /// World size.
    pub ranks: u32,
    /// Micro-batches per rank per step.
    pub micro_batches: u32,
    /// "before" or "predictive".
    pub check: String,
    /// Sync lag.
    pub sync_lag: u32,
    /// The slow rank ("none" or RANK:FACTOR).
    pub slow_rank: String,
    /// Seed.
    pub seed: u64,
    /// The DropCompute run's threshold, ms; `null` for off (auto declined).
    pub threshold_ms: Option<f64>,
    /// Measured drop rate of the DropCompute run: the parts missing from the nominal batch
    /// (`policy::nominal_drop_rate`, the replay's definition), fraction; for the text task the
    /// tokens missing from the nominal batch's (`train::summary::drop_rate`,
    /// `policy::step_nominal_tokens`, the replay's rule too).
    pub drop_rate_measured: f64,
    /// Micro-batches handed out and not started over those handed out (fraction): differs from
    /// the drop rate where a policy hands out more than the nominal batch (the compute budget).
    #[serde(default)]
    pub dropped_of_handed_out: f64,
    /// Predicted drop rate.
    pub drop_rate_predicted: f64,
    /// Measured mean step time of the DropCompute run over the steps the data filled (an
    /// epoch's short last step left out: `StepReport::filled`) plus its host time per step, ms.
    pub step_ms_measured: f64,
    /// Predicted mean step time, ms.
    pub step_ms_predicted: f64,
    /// (predicted - measured) / measured step time.
    pub step_error: f64,
    /// Measured effective speedup (ratio of computed-samples throughputs).
    pub speedup_measured: f64,
    /// Predicted effective speedup (ratio), what `train` prints.
    pub speedup_predicted: f64,
    /// (predicted - measured) / measured effective speedup.
    pub speedup_error: f64,
    /// True when the prediction is an estimate (`train::summary::Prediction::estimate`: it
    /// draws latencies the baseline did not record).
    #[serde(default)]
    pub estimate: bool,
    /// The DropCompute run's step policy (`policy::Policy::name`).
    #[serde(default)]
    pub policy: String,
    /// Its tail split (1 = whole micro-batches).
    #[serde(default)]
    pub tail_split: u32,
    /// Its length in epochs; `null` for a run of `--steps` steps.
    #[serde(default)]
    pub epochs: Option<u32>,
}

/// Statistics of |relative error| over the grid.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ErrorStats {
    /// Median (nearest rank).
    pub median: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// Largest.
    pub worst: f64,
    /// Mean of the signed errors (the bias; 0 for an empty list).
    #[serde(default)]
    pub mean_signed: f64,
}

impl ErrorStats {
    /// The statistics of |x| over `errors`, and their signed mean; zeros for an empty list.
    pub fn of(errors: &[f64]) -> Self {
        let mut v: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if v.is_empty() { 0.0 } else { v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1] }
        };
        let mean_signed = if errors.is_empty() { 0.0 } else { errors.iter().sum::<f64>() / errors.len() as f64 };
        Self { median: q(0.5), p90: q(0.9), worst: v.last().copied().unwrap_or(0.0), mean_signed }
    }
}

/// The summary of a grid.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// "virtual" or "real".
    pub time_mode: String,
    /// Configurations run.
    pub configs: usize,
    /// Configurations whose DropCompute run dropped something.
    pub configs_dropping: usize,
    /// |error| of the effective speedup.
    pub speedup: ErrorStats,
    /// |error| of the mean step time.
    pub step_time: ErrorStats,
    /// Configurations whose prediction is an estimate (`ConfigRow::estimate`).
    #[serde(default)]
    pub estimated: usize,
    /// The target of this time mode, in words.
    pub target: String,
    /// Whether both the speedup and the step time meet it.
    pub target_met: bool,
}

/// `validate --json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ValidateJson {
    /// One row per configuration, in grid order.
    pub rows: Vec<ConfigRow>,
    /// Over the rows.
    pub summary: Summary,
}

/// The clap wrapper that parses one configuration's `train` flags.
/// `bench text-table` parses each policy's `train` flags with it too.
#[derive(Parser)]
pub(crate) struct TrainCli {
    /// The `train` flags.
    #[command(flatten)]
    pub(crate) train: super::train::Args,
}

/// One configuration of the grid as `train` flags.
#[derive(Clone, Debug, PartialEq)]
struct Point {
    ranks: u32,
    micro_batches: u32,
    check: CheckMode,
    sync_lag: u32,
    slow_rank: String,
    seed: u64,
    policy: Option<Policy>,
    tail_split: u32,
    epochs: Option<u32>,
    /// `train --threshold`: validate's, or `off` for a policy without a deadline given a
    /// number (train refuses a number there; the grid's threshold is for the others).
    threshold: String,
}

/// True when `--threshold` is a number of ms (not `auto` or `off`, train's keywords).
fn threshold_is_ms(t: &str) -> bool {
    !matches!(t.trim().to_ascii_lowercase().as_str(), "auto" | "off")
}

fn check_name(c: CheckMode) -> String {
    c.name().to_owned()
}

/// The checks of the grid when `--check` is not given and the policy takes any check.
pub const DEFAULT_CHECKS: [CheckMode; 2] = [CheckMode::BeforeMicroBatch, CheckMode::Predictive];

impl Args {
    /// The step policy every configuration without `--policy` runs, and how to name it in a
    /// message: the train flags after `--` read by train's own rule
    /// (`train::Args::policy_or_task_default`); `None` for the digits' default, which takes
    /// any check.
    ///
    /// # Errors
    /// [`CommandError::Args`] when the flags after `--` do not parse as `train` flags.
    fn default_policy(&self) -> Result<Option<(Policy, String)>, CommandError> {
        let argv = std::iter::once("train".to_owned()).chain(self.train_args.iter().cloned());
        let cli = TrainCli::try_parse_from(argv)
            .map_err(|e| CommandError::Args(format!("validate: train flags {:?}: {e}", self.train_args)))?;
        let t = cli.train;
        Ok(t.policy_or_task_default().map(|p| {
            let words = if t.policy.is_some() {
                format!("--policy {p} (after --)")
            } else {
                format!("the {} task's default policy {p}", t.task.name())
            };
            (p, words)
        }))
    }

    /// The checks the configurations of `policy` (named `words`; `None`: the digits' default)
    /// run: `--check` as given, each one `Policy::resolve_check` accepts; not given, the
    /// policy's own check where it fixes one (the same under either default), else
    /// [`DEFAULT_CHECKS`].
    ///
    /// # Errors
    /// [`CommandError::Args`] naming `validate --check` when a given check is one the policy
    /// refuses (it runs its own).
    fn checks_of(&self, policy: Option<(Policy, String)>) -> Result<Vec<CheckMode>, CommandError> {
        let Some((p, words)) = policy else {
            return Ok(if self.check.is_empty() { DEFAULT_CHECKS.to_vec() } else { self.check.clone() });
        };
        if self.check.is_empty() {
            let own = DEFAULT_CHECKS.map(|d| p.resolve_check(None, d));
            return Ok(match own {
                [Ok(a), Ok(b)] if a == b => vec![a],
                _ => DEFAULT_CHECKS.to_vec(),
            });
        }
        self.check
            .iter()
            .map(|&c| {
                p.resolve_check(Some(c), c).map_err(|own| {
                    CommandError::Args(format!(
                        "validate --check {c}: {words} runs the {own} check; give validate --check {own}, or leave \
                         --check out (each policy then runs its own check, the others both)"
                    ))
                })
            })
            .collect()
    }

    /// The grid in order (policy, tail split, run length, ranks, micro-batches, check, sync
    /// lag, slow rank, seed; the last varies fastest), skipping a sync lag not below the
    /// micro-batches; each policy with its checks ([`Args::checks_of`]).
    ///
    /// # Errors
    /// [`CommandError::Args`] for a `--check` a policy refuses, or train flags after `--`
    /// that do not parse.
    fn grid(&self) -> Result<Vec<Point>, CommandError> {
        let policies: Vec<Option<Policy>> =
            if self.policy.is_empty() { vec![None] } else { self.policy.iter().copied().map(Some).collect() };
        let lengths: Vec<Option<u32>> =
            if self.epochs.is_empty() { vec![None] } else { self.epochs.iter().copied().map(Some).collect() };
        let default = self.default_policy()?;
        let mut v = Vec::new();
        for &policy in &policies {
            let named = match policy {
                Some(p) => Some((p, format!("--policy {p}"))),
                None => default.clone(),
            };
            // The digits' default (None) is DropCompute: it has a deadline.
            let deadline = named.as_ref().is_none_or(|(p, _)| p.has_deadline());
            let threshold =
                if !deadline && threshold_is_ms(&self.threshold) { "off".to_owned() } else { self.threshold.clone() };
            let checks = self.checks_of(named)?;
            for &tail_split in &self.tail_split {
                for &epochs in &lengths {
                    v.extend(self.inner_grid(&checks).into_iter().map(|p| Point {
                        policy,
                        tail_split,
                        epochs,
                        threshold: threshold.clone(),
                        ..p
                    }));
                }
            }
        }
        Ok(v)
    }

    /// The grid of one (policy, tail split, run length) over `checks`: its policy None, split
    /// 1, steps.
    fn inner_grid(&self, checks: &[CheckMode]) -> Vec<Point> {
        let mut v = Vec::new();
        for &ranks in &self.ranks {
            for &micro_batches in &self.micro_batches {
                for &check in checks {
                    for &sync_lag in self.sync_lag.iter().filter(|&&k| k < micro_batches) {
                        for slow_rank in &self.slow_rank {
                            for &seed in &self.seeds {
                                v.push(Point {
                                    ranks,
                                    micro_batches,
                                    check,
                                    sync_lag,
                                    slow_rank: slow_rank.clone(),
                                    seed,
                                    policy: None,
                                    tail_split: 1,
                                    epochs: None,
                                    threshold: self.threshold.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// The `train` flags of `p`.
    fn train_argv(&self, p: &Point) -> Vec<String> {
        let mut v = vec!["train".to_owned()];
        for (flag, value) in [
            ("--ranks", p.ranks.to_string()),
            ("--micro-batches", p.micro_batches.to_string()),
            ("--check", check_name(p.check)),
            ("--sync-lag", p.sync_lag.to_string()),
            ("--seed", p.seed.to_string()),
            ("--tail-split", p.tail_split.to_string()),
            ("--threshold", p.threshold.clone()),
            (
                "--time-mode",
                clap::ValueEnum::to_possible_value(&self.time_mode)
                    .map(|v| v.get_name().to_owned())
                    .unwrap_or_default(),
            ),
        ] {
            v.push(flag.to_owned());
            v.push(value);
        }
        match p.epochs {
            Some(e) => v.extend(["--epochs".to_owned(), e.to_string()]),
            None => v.extend(["--steps".to_owned(), self.steps.to_string()]),
        }
        if let Some(policy) = p.policy {
            v.extend(["--policy".to_owned(), policy.name().to_owned()]);
        }
        if p.slow_rank != "none" {
            v.push("--slow-rank".into());
            v.push(p.slow_rank.clone());
        }
        v.extend(self.train_args.iter().cloned());
        v
    }
}

/// Runs one configuration: the `train` job with a baseline, its prediction and measurement.
///
/// # Errors
/// [`TrainError`] of the job (a bad flag names it).
fn run_point(args: &Args, p: &Point) -> Result<ConfigRow, TrainError> {
    let argv = args.train_argv(p);
    let cli = TrainCli::try_parse_from(&argv)
        .map_err(|e| TrainError::Config { what: "validate: train flags", value: format!("{argv:?}: {e}") })?;
    let mut cfg = cli.train.validate()?;
    cfg.compare = true;
    cfg.out = None;
    let job = Job::prepare(cfg)?;
    let rt = job_run::mock_runtime(&job)?;
    let outcomes = job_run::run_threads(&job, &rt, false)?;
    job_run::check_lockstep(&outcomes)?;
    let meta = RunMetadata::new(&job.cfg, super::train::backend_name(rt.api()), std::time::SystemTime::now());
    let predicted = summary::job_prediction(&job, &outcomes);
    let rep = summary::report(&job, &outcomes, meta, predicted.as_ref())?;
    let dc = &outcomes[0][1];
    let pred = predicted.ok_or(TrainError::Config {
        what: "validate",
        value: format!(
            "no prediction: the baseline run has no complete step, or --policy {} is not replayed by sim::replay",
            job.cfg.policy()
        ),
    })?;
    // Mean step time over the steps the data filled (an epoch's short last step left out on
    // both sides: `StepReport::filled`, `PolicyReplay::filled_step_ns`), plus the run's host
    // time per step outside the device steps.
    let steps = dc.reports.len().max(1) as f64;
    let host_gap = (dc.wall_ns as f64 - dc.reports.iter().map(|r| r.step_ns as f64).sum::<f64>()) / steps;
    let filled: Vec<f64> = dc.reports.iter().filter(|r| r.filled()).map(|r| r.step_ns as f64).collect();
    let measured_step = if filled.is_empty() {
        dc.wall_ns as f64 / steps
    } else {
        filled.iter().sum::<f64>() / filled.len() as f64 + host_gap
    };
    let planned: u64 = dc.reports.iter().map(|r| r.global_computed() + r.global_dropped()).sum();
    let dropped: u64 = dc.reports.iter().map(|r| r.global_dropped()).sum();
    // The replay's definition: parts missing from the nominal N·M·S batch per step (the text
    // task: the tokens missing from the nominal batch's, `policy::step_nominal_tokens`).
    let drop_measured = summary::drop_rate(&job, dc);
    let speedup_measured = rep.speedup.unwrap_or(f64::NAN);
    let speedup_predicted = pred.speedup;
    let (estimate, step_ns) = (pred.estimate, pred.filled_step_ns);
    let pred = pred.replay;
    Ok(ConfigRow {
        ranks: p.ranks,
        micro_batches: p.micro_batches,
        check: check_name(p.check),
        sync_lag: p.sync_lag,
        slow_rank: p.slow_rank.clone(),
        seed: p.seed,
        threshold_ms: dc.threshold_ns.map(|ns| ns as f64 / 1e6),
        drop_rate_measured: drop_measured,
        dropped_of_handed_out: if planned > 0 { dropped as f64 / planned as f64 } else { 0.0 },
        drop_rate_predicted: pred.drop_rate,
        step_ms_measured: measured_step / 1e6,
        step_ms_predicted: step_ns / 1e6,
        step_error: (step_ns - measured_step) / measured_step,
        speedup_measured,
        speedup_predicted,
        speedup_error: (speedup_predicted - speedup_measured) / speedup_measured,
        estimate,
        policy: job.cfg.policy().name().to_owned(),
        tail_split: job.cfg.tail.parts(),
        epochs: p.epochs,
    })
}

/// The summary of `rows` run in `time_mode`, with its target.
pub fn summarize(rows: &[ConfigRow], time_mode: TimeMode) -> Summary {
    let sp: Vec<f64> = rows.iter().map(|r| r.speedup_error).collect();
    let st: Vec<f64> = rows.iter().map(|r| r.step_error).collect();
    let (speedup, step_time) = (ErrorStats::of(&sp), ErrorStats::of(&st));
    let all_finite = sp.iter().chain(&st).all(|e| e.is_finite());
    // Virtual time: a prediction from recorded latencies only must match its run; an estimate
    // (latencies drawn) is judged over the estimated configurations.
    let of = |estimate: bool, f: fn(&ConfigRow) -> f64| -> ErrorStats {
        ErrorStats::of(&rows.iter().filter(|r| r.estimate == estimate).map(f).collect::<Vec<f64>>())
    };
    let (target, met) = match time_mode {
        TimeMode::Virtual => (
            format!(
                "recorded: every configuration within {:.1} %; estimated: median <= {:.1} %, worst <= {:.1} %, \
                 mean signed within +-{:.1} %",
                VIRTUAL_MAX_ERROR * 100.0,
                ESTIMATE_MEDIAN_ERROR * 100.0,
                ESTIMATE_MAX_ERROR * 100.0,
                ESTIMATE_MAX_BIAS * 100.0
            ),
            [of(false, |r| r.speedup_error), of(false, |r| r.step_error)].iter().all(|e| e.worst <= VIRTUAL_MAX_ERROR)
                && [of(true, |r| r.speedup_error), of(true, |r| r.step_error)].iter().all(|e| {
                    e.median <= ESTIMATE_MEDIAN_ERROR
                        && e.worst <= ESTIMATE_MAX_ERROR
                        && e.mean_signed.abs() <= ESTIMATE_MAX_BIAS
                }),
        ),
        TimeMode::Real => (
            format!("median <= {:.1} %, p90 <= {:.1} %", REAL_MEDIAN_ERROR * 100.0, REAL_P90_ERROR * 100.0),
            [speedup, step_time].iter().all(|s| s.median <= REAL_MEDIAN_ERROR && s.p90 <= REAL_P90_ERROR),
        ),
    };
    Summary {
        time_mode: clap::ValueEnum::to_possible_value(&time_mode).map(|v| v.get_name().to_owned()).unwrap_or_default(),
        configs: rows.len(),
        configs_dropping: rows.iter().filter(|r| r.drop_rate_measured > 0.0).count(),
        speedup,
        step_time,
        estimated: rows.iter().filter(|r| r.estimate).count(),
        target,
        target_met: met && all_finite && !rows.is_empty(),
    }
}

/// Run and print to stdout. Errors: see [`run_to`].
pub fn run(args: &Args) -> Result<(), crate::commands::BoxError> {
    run_to(args, &mut dropcompute::console::Stdout)
}

/// The line before the table header when the task is text: what `drop_meas` counts there.
pub const TEXT_DROP_NOTE: &str =
    "drop rate (tokens): drop_meas and drop_pred are the tokens missing from the nominal batch's (the text task)";

/// The table header of the text output.
const HEADER: &str = "policy           split  length  ranks   M  check       lag  slow  seed  threshold_ms  drop_meas  drop_pred  step_ms_meas  step_ms_pred  step_err  speedup_meas  speedup_pred  speedup_err  estimate";

fn row_text(r: &ConfigRow) -> String {
    format!(
        "{:<16} {:>5}  {:>6}  {:>5} {:>3}  {:<10} {:>4} {:>5} {:>5}  {:>12}  {:>8.2}%  {:>8.2}%  {:>12.3}  {:>12.3}  {:>+7.3}%  {:>11.4}x  {:>11.4}x  {:>+10.3}%  {}",
        r.policy,
        r.tail_split,
        r.epochs.map_or_else(|| "steps".to_owned(), |e| format!("{e} ep")),
        r.ranks,
        r.micro_batches,
        r.check,
        r.sync_lag,
        r.slow_rank,
        r.seed,
        r.threshold_ms.map_or_else(|| "off".to_owned(), |t| format!("{t:.3}")),
        r.drop_rate_measured * 100.0,
        r.drop_rate_predicted * 100.0,
        r.step_ms_measured,
        r.step_ms_predicted,
        r.step_error * 100.0,
        r.speedup_measured,
        r.speedup_predicted,
        r.speedup_error * 100.0,
        if r.estimate { "yes" } else { "no" }
    )
}

/// The summary lines of the text output.
pub fn summary_text(s: &Summary) -> String {
    let line = |name: &str, e: &ErrorStats| {
        format!(
            "  {name:<22} median {:.3} %, p90 {:.3} %, worst {:.3} %, mean signed {:+.3} %\n",
            e.median * 100.0,
            e.p90 * 100.0,
            e.worst * 100.0,
            e.mean_signed * 100.0
        )
    };
    format!(
        "{} configurations ({} dropping, {} estimated), {} time; |relative error| of the prediction:\n{}{}target ({}): {}\n",
        s.configs,
        s.configs_dropping,
        s.estimated,
        s.time_mode,
        line("effective speedup", &s.speedup),
        line("mean step time", &s.step_time),
        s.target,
        if s.target_met { "met" } else { "NOT met" }
    )
}

/// The grid, every configuration's flags checked before the first one runs, and whether the
/// task is text.
///
/// # Errors
/// [`CommandError::Args`] for an empty grid, a `--check` a policy refuses, a number for
/// `--threshold` when no policy of the grid has a deadline, a flag validate sets itself or a
/// flag of the grid after `--`; the first configuration's [`TrainError`] (a bad `train` flag
/// names the flag and value).
fn plan(args: &Args) -> Result<(Vec<Point>, bool), crate::commands::BoxError> {
    // Flags validate decides itself are refused rather than silently overridden: every
    // configuration runs a baseline (the measured speedup needs it), in threads of this
    // process, and writes nothing.
    if let Some(f) = args
        .train_args
        .iter()
        .find(|a| OVERRIDDEN_TRAIN_FLAGS.iter().any(|f| a.as_str() == *f || a.starts_with(&format!("{f}="))))
    {
        return Err(CommandError::Args(format!(
            "validate: `{f}` after -- is not accepted: validate runs every configuration with a \
             baseline, in threads, writing no files"
        ))
        .into());
    }
    let grid = args.grid()?;
    if grid.is_empty() {
        return Err(CommandError::Args(
            "validate: the grid is empty (every --sync-lag >= every --micro-batches?)".into(),
        )
        .into());
    }
    // A number for the threshold that no configuration uses was ignored (train refuses it).
    if threshold_is_ms(&args.threshold) && grid.iter().all(|p| p.threshold != args.threshold) {
        let policies: Vec<String> = grid
            .iter()
            .filter_map(|p| p.policy.map(|p| p.name().to_owned()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        return Err(CommandError::Args(format!(
            "validate --threshold {}: no policy of the grid uses a threshold ({}: no deadline); give --threshold auto or off, or a --policy with a deadline",
            args.threshold.trim(),
            if policies.is_empty() { "the task's default policy".to_owned() } else { policies.join(", ") }
        ))
        .into());
    }
    // The flags of the grid itself go through validate's own flags (a second one after `--`
    // failed in clap with "cannot be used multiple times" and the whole argv).
    if let Some(first) = grid.first() {
        let argv = args.train_argv(first);
        // The grid's own flags: the argv before the flags passed after `--` (appended last).
        let own: Vec<&String> =
            argv[1..argv.len() - args.train_args.len()].iter().filter(|a| a.starts_with("--")).collect();
        if let Some(f) = args
            .train_args
            .iter()
            .find(|a| own.iter().any(|o| a.as_str() == o.as_str() || a.starts_with(&format!("{o}="))))
        {
            let name = f.split('=').next().unwrap_or(f);
            return Err(CommandError::Args(format!(
                "validate: `{name}` after -- is not accepted: it is a flag of the grid; give it to validate itself ({name} of `dropcompute validate --help`)"
            ))
            .into());
        }
    }
    // Every configuration's flags are checked before the first one runs.
    let mut text = false;
    for p in &grid {
        let argv = args.train_argv(p);
        let cli = TrainCli::try_parse_from(&argv)
            .map_err(|e| CommandError::Args(format!("validate: train flags {:?}: {e}", &argv[1..])))?;
        text |= cli.train.validate().map_err(TrainError::from)?.task == dropcompute_train::config::Task::Text;
    }
    Ok((grid, text))
}

/// Runs the grid, printing a row per configuration as it finishes (or, with `--json`, the
/// [`ValidateJson`] at the end), then the summary.
///
/// # Errors
/// As [`plan`], before any configuration runs; then the first configuration's
/// [`TrainError`]; output I/O.
pub fn run_to(args: &Args, out: &mut dyn Write) -> Result<(), crate::commands::BoxError> {
    let (grid, text) = plan(args)?;
    let mut rows = Vec::with_capacity(grid.len());
    if !args.json {
        if text {
            // The text task's measured drop rate counts tokens (`summary::drop_rate`).
            writeln!(out, "{TEXT_DROP_NOTE}").map_err(io_err("stdout"))?;
        }
        writeln!(out, "{HEADER}").map_err(io_err("stdout"))?;
    }
    for p in &grid {
        let row = run_point(args, p)?;
        if !args.json {
            writeln!(out, "{}", row_text(&row)).map_err(io_err("stdout"))?;
            out.flush().map_err(io_err("stdout"))?;
        }
        rows.push(row);
    }
    let summary = summarize(&rows, args.time_mode);
    if args.json {
        let text = serde_json::to_string_pretty(&ValidateJson { rows, summary })
            .map_err(|e| CommandError::Args(format!("--json: {e}")))?;
        writeln!(out, "{text}").map_err(io_err("stdout"))?;
    } else {
        write!(out, "{}", summary_text(&summary)).map_err(io_err("stdout"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["validate"];
        v.extend_from_slice(extra);
        Wrap::try_parse_from(v).expect("flags").args
    }

    #[test]
    fn the_default_grid_is_the_issue_grid_without_impossible_lags() {
        let a = args(&[]);
        let g = a.grid().expect("grid");
        // 4 world sizes x 2 M x 2 checks x 2 lags x 2 slow-rank settings x 2 seeds.
        assert_eq!(g.len(), 4 * 2 * 2 * 2 * 2 * 2);
        assert_eq!(a.time_mode, TimeMode::Virtual);
        let narrow = args(&["--ranks", "8", "--micro-batches", "1,4", "--sync-lag", "0,1", "--seeds", "5"]);
        // M = 1 allows only lag 0.
        let g = narrow.grid().expect("grid");
        assert_eq!(g.iter().filter(|p| p.micro_batches == 1).count(), 2 * 2);
        assert!(g.iter().all(|p| p.sync_lag < p.micro_batches && p.seed == 5 && p.ranks == 8));
        let argv = narrow.train_argv(&g[g.len() - 1]);
        assert_eq!(argv[..3], ["train", "--ranks", "8"]);
        assert!(argv.windows(2).any(|w| w == ["--slow-rank", "3:2"]), "{argv:?}");
        assert!(argv.windows(2).any(|w| w == ["--steps", "16"]) && !argv.iter().any(|a| a == "--policy"), "{argv:?}");
        // Policies x tail splits x epochs multiply the grid; each point carries its flags.
        let wide = args(&["--ranks", "4", "--micro-batches", "8", "--sync-lag", "0", "--check", "predictive"]);
        let wide = Args {
            policy: vec![Policy::Rebalance, Policy::ComputeBudget],
            tail_split: vec![1, 2],
            epochs: vec![3],
            ..wide
        };
        let g = wide.grid().expect("grid");
        assert_eq!(g.len(), 2 * 2 * 2 * 2, "2 policies x 2 splits x 1 length x 2 slow ranks x 2 seeds");
        let last = wide.train_argv(&g[g.len() - 1]);
        for pair in [["--policy", "compute-budget"], ["--tail-split", "2"], ["--epochs", "3"]] {
            assert!(last.windows(2).any(|w| w == pair), "{pair:?} in {last:?}");
        }
        assert!(!last.iter().any(|a| a == "--steps"), "{last:?}");
    }

    #[test]
    fn error_statistics_are_nearest_rank_over_absolute_errors() {
        let s = ErrorStats::of(&[0.01, -0.03, 0.002, -0.004, 0.0, 0.05, 0.001, 0.002, -0.02, 0.003]);
        assert_eq!((s.median, s.p90, s.worst), (0.003, 0.03, 0.05));
        assert!((s.mean_signed - 0.0014).abs() < 1e-15, "{}", s.mean_signed);
        assert_eq!(ErrorStats::of(&[]), ErrorStats { median: 0.0, p90: 0.0, worst: 0.0, mean_signed: 0.0 });
    }

    /// Virtual time: a recorded-only prediction must be within 0.5 % of its run; estimates are
    /// judged by their median, worst and bias over the estimated configurations.
    #[test]
    fn the_virtual_target_holds_recorded_rows_exactly_and_estimates_by_median_worst_and_bias() {
        let row = |err: f64, estimate: bool| ConfigRow {
            ranks: 4,
            micro_batches: 8,
            check: "predictive".into(),
            sync_lag: 0,
            slow_rank: "none".into(),
            seed: 0,
            threshold_ms: None,
            drop_rate_measured: 0.0,
            dropped_of_handed_out: 0.0,
            drop_rate_predicted: 0.0,
            step_ms_measured: 1.0,
            step_ms_predicted: 1.0 + err,
            step_error: err,
            speedup_measured: 1.0,
            speedup_predicted: 1.0 + err,
            speedup_error: err,
            estimate,
            policy: "drop-predictive".into(),
            tail_split: 1,
            epochs: None,
        };
        let met = |rows: &[ConfigRow]| summarize(rows, TimeMode::Virtual).target_met;
        let est = [row(0.008, true), row(-0.009, true), row(0.015, true)];
        assert!(met(&[&[row(0.004, false)][..], &est].concat()));
        let s = summarize(&[&[row(0.004, false)][..], &est].concat(), TimeMode::Virtual);
        assert_eq!((s.estimated, s.configs), (3, 4));
        // A recorded row off by 0.6 % fails; an estimate of 0.6 % does not.
        assert!(!met(&[&[row(0.006, false)][..], &est].concat()));
        assert!(met(&[row(0.006, true), row(-0.006, true)]));
        // An estimate off by 2.1 %, or biased (+0.8 % on average), fails.
        assert!(!met(&[row(0.021, true), row(-0.001, true), row(0.0, true)]));
        assert!(!met(&[row(0.008, true), row(0.008, true), row(0.008, true)]));
    }

    #[test]
    fn a_bad_train_flag_fails_before_any_configuration_runs() {
        let a = args(&["--ranks", "2", "--slow-rank", "3:2", "--seeds", "0"]);
        let e = run_to(&a, &mut Vec::new()).expect_err("rank 3 of 2").to_string();
        assert!(e.contains("--slow-rank 3:2"), "{e}");
    }

    /// `--out`, `--launch`, `--no-compare` (and `--compare`) after `--` were silently dropped;
    /// they are refused, naming the flag, in both spellings.
    #[test]
    fn flags_validate_sets_itself_are_refused_after_the_separator() {
        for extra in
            [&["--", "--out", "o"][..], &["--", "--launch=env"], &["--", "--no-compare"], &["--", "--resume", "d"]]
        {
            let mut v = vec!["--ranks", "4", "--seeds", "0"];
            v.extend_from_slice(extra);
            let e = run_to(&args(&v), &mut Vec::new()).expect_err("refused").to_string();
            let flag = extra[1].split('=').next().unwrap();
            assert!(e.contains(&format!("`{}", flag)) && e.contains("not accepted"), "{e}");
        }
        // The grid's own flags go to validate itself: refused after `--`, naming the flag.
        for extra in [
            &["--", "--threshold", "NaN"][..],
            &["--", "--seed=3"],
            &["--", "--steps", "30"],
            &["--", "--check", "before"],
        ] {
            let mut v = vec!["--ranks", "4", "--seeds", "0"];
            v.extend_from_slice(extra);
            let e = run_to(&args(&v), &mut Vec::new()).expect_err("refused").to_string();
            let flag = extra[1].split('=').next().unwrap();
            assert!(e.contains(&format!("`{flag}` after -- is not accepted: it is a flag of the grid")), "{e}");
        }
        // A train flag validate does not set is still passed on (checked, not refused).
        let e = run_to(&args(&["--ranks", "4", "--seeds", "0", "--", "--max-drop-rate", "2"]), &mut Vec::new())
            .expect_err("a drop rate above 1")
            .to_string();
        assert!(e.contains("--max-drop-rate"), "{e}");
    }

    /// Every policy (and none: the task's default) x `--check` (not given, before, predictive)
    /// x task (digits; text after `--`): not given, a policy that fixes its check contributes
    /// that check only and the others both, with no refusal (validate's own default grid was
    /// refused as "--check before" with the text task); given, a policy fixing another check
    /// is refused naming `validate --check`, not train's advice. Checked by [`plan`], every
    /// configuration's train flags included, before anything runs.
    #[test]
    fn each_policy_runs_its_own_check_unless_check_is_given_and_a_refusal_names_validate() {
        use CheckMode::{BeforeMicroBatch as B, Predictive as P};
        const TEXT: [&str; 6] = ["--task", "text", "--text-model", "tiny", "--text-documents", "800"];
        // The check each policy fixes (kind.rs's rule, written out independently).
        let own = |p: Option<Policy>, text: bool| match p.or(text.then_some(Policy::CostBalance)) {
            Some(Policy::DropBefore) => Some(B),
            Some(Policy::DropPredictive | Policy::LengthPredictive | Policy::CostBalance) => Some(P),
            _ => None,
        };
        let mut cases = 0;
        for text in [false, true] {
            for policy in std::iter::once(None).chain(Policy::ALL.map(Some)) {
                for check in [None, Some(B), Some(P)] {
                    let mut v = vec!["--ranks", "4", "--micro-batches", "4", "--sync-lag", "0", "--slow-rank", "none"];
                    v.extend(["--seeds", "0", "--steps", "14"]);
                    if let Some(p) = policy {
                        v.extend(["--policy", p.name()]);
                    }
                    if let Some(c) = check {
                        v.extend(["--check", c.name()]);
                    }
                    if text {
                        v.push("--");
                        v.extend(TEXT);
                    }
                    let what = format!("{v:?}");
                    let got = plan(&args(&v));
                    cases += 1;
                    match (check, own(policy, text)) {
                        (Some(c), Some(o)) if c != o => {
                            let e = got.err().unwrap_or_else(|| panic!("{what}: accepted")).to_string();
                            assert!(
                                e.contains(&format!("validate --check {c}:"))
                                    && e.contains(&format!("give validate --check {o}"))
                                    && !e.contains("give a --policy that runs it"),
                                "{what}: {e}"
                            );
                        }
                        (given, fixed) => {
                            let (grid, is_text) = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                            let checks: Vec<CheckMode> = grid.iter().map(|p| p.check).collect();
                            let want = match (given, fixed) {
                                (Some(c), _) | (None, Some(c)) => vec![c],
                                (None, None) => vec![B, P],
                            };
                            assert_eq!((checks, is_text), (want, text), "{what}");
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 2 * 10 * 3);
    }

    /// `--threshold` in ms goes to the configurations whose policy has a deadline; the others
    /// run with it off (train refuses a number there); a grid where none has one refuses it.
    #[test]
    fn a_threshold_in_ms_goes_to_the_policies_with_a_deadline_and_is_refused_when_none_has_one() {
        let base = ["--ranks", "4", "--micro-batches", "4", "--sync-lag", "0", "--slow-rank", "none", "--seeds", "0"];
        let mut v = base.to_vec();
        v.extend(["--threshold", "0.5", "--check", "predictive", "--policy", "synchronous,drop-predictive,rebalance"]);
        let (grid, _) = plan(&args(&v)).expect("plan");
        let thresholds: Vec<(Option<Policy>, &str)> = grid.iter().map(|p| (p.policy, p.threshold.as_str())).collect();
        assert_eq!(
            thresholds,
            [
                (Some(Policy::Synchronous), "off"),
                (Some(Policy::DropPredictive), "0.5"),
                (Some(Policy::Rebalance), "off")
            ]
        );
        for none in ["synchronous", "backup-workers,rebalance"] {
            let mut v = base.to_vec();
            v.extend(["--threshold", "0.5", "--policy", none]);
            let e = plan(&args(&v)).expect_err("refused").to_string();
            assert!(e.contains("validate --threshold 0.5: no policy of the grid uses a threshold"), "{none}: {e}");
        }
    }
}
