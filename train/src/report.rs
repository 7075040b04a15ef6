//! `report.json` of `dropcompute train` and the side-by-side comparison table.
//!
//! Owns: [`Report`] / [`RunReport`] / [`ConfigEcho`] (the JSON schema), the derived rates
//! ([`RunReport::from_measurements`]), the measured effective speedup ([`Report::new`]) and
//! [`comparison_table`]. Must not touch: training, timing or files (the driver measures and
//! `output::StagedOut` writes).
//!
//! Effective speedup (DropCompute, Giladi et al. 2023, §4): throughput of *computed* samples
//! with DropCompute divided by that of the synchronous baseline, on the same job and seed.
#![forbid(unsafe_code)]

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::{RunLength, Task, ThresholdArg, TrainConfig};

/// Errors of building a report from measurements.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    /// A measurement is out of its range (`what` names it).
    #[error("report: {what} = {value}: {why}")]
    Invalid {
        /// Field name.
        what: &'static str,
        /// Offending value.
        value: String,
        /// Requirement.
        why: &'static str,
    },
}

/// Raw measurements of one run, as the driver collects them.
#[derive(Clone, Debug, PartialEq)]
pub struct RunMeasurements {
    /// Wall time of the training loop (> 0).
    pub wall: Duration,
    /// Optimizer steps completed.
    pub steps: u64,
    /// Samples whose gradient was computed, summed over ranks and steps.
    pub samples_computed: u64,
    /// Samples dropped by the deadline, summed over ranks and steps.
    pub samples_dropped: u64,
    /// The drop rate against the nominal batch (`policy::nominal_drop_rate` over the steps:
    /// parts missing from each step's N·M·S, less what the data could not hand out; for the
    /// text task tokens dropped over tokens handed out: `summary::drop_rate`), in [0, 1].
    pub nominal_drop_rate: f64,
    /// Held-out accuracy, fraction in [0, 1].
    pub accuracy: f64,
    /// Training loss of the last step (may be NaN if training diverged).
    pub final_loss: f64,
    /// Deadline in force, `None` for threshold off.
    pub threshold: Option<Duration>,
}

/// One run in report.json (`"baseline"` or `"dropcompute"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RunReport {
    /// Held-out accuracy, fraction in [0, 1]; `null` (NaN) for the text task, whose metric is
    /// [`RunReport::holdout_loss_per_token`].
    #[serde(with = "dropcompute::serde_nan")]
    pub accuracy: f64,
    /// Computed samples per second of wall time.
    pub samples_per_s: f64,
    /// Optimizer steps per second of wall time.
    pub steps_per_s: f64,
    /// Wall time of the training loop, s.
    pub wall_s: f64,
    /// The drop rate against the nominal batch, in [0, 1] ([`RunMeasurements::nominal_drop_rate`]:
    /// the definition of the replay and of `validate`; a compute budget or backup workers are
    /// judged by what is missing from the nominal batch); in tokens for the text task, against
    /// the nominal batch's tokens (`summary::drop_rate`, `policy::step_nominal_tokens`).
    pub drop_rate: f64,
    /// samples_dropped / (samples_computed + samples_dropped), in [0, 1] (0 if both are 0): the
    /// fraction of what was handed out and not computed (differs from [`RunReport::drop_rate`]
    /// when a policy hands out more or less than the nominal batch).
    #[serde(default)]
    pub dropped_of_handed_out: f64,
    /// Deadline, ms; `null` for threshold off.
    pub threshold_ms: Option<f64>,
    /// Training loss of the last step; `null` in JSON when not finite (diverged).
    #[serde(with = "dropcompute::serde_nan")]
    pub final_loss: f64,
    /// Optimizer steps completed.
    pub steps: u64,
    /// Samples computed, summed over ranks and steps (the text task: bucket-plan units, each
    /// `--micro-batch-size`/S documents; its tokens are [`RunReport::tokens_computed`]).
    pub samples_computed: u64,
    /// Samples dropped, summed over ranks and steps.
    pub samples_dropped: u64,
    /// The run's step policy (`policy::Policy` name; "synchronous" for the baseline; empty in
    /// reports written before policies).
    #[serde(default)]
    pub policy: String,
    /// Micro-batches assigned to each rank in the run's last step (rank order; M each unless
    /// the policy moves work; every step's assignment is in steps.csv).
    #[serde(default)]
    pub assignment: Vec<u32>,
    /// The text task's metric: held-out loss per real token of the final parameters, nats
    /// (absent for the digits task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holdout_loss_per_token: Option<f64>,
    /// Real tokens computed, summed over ranks and steps (the text task's unit of work;
    /// absent for the digits task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_computed: Option<u64>,
    /// Real tokens computed per second of wall time (absent for the digits task); the text
    /// task's [`Report::speedup`] is the ratio of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
}

impl RunReport {
    /// Derive the rates from raw measurements.
    /// Errors: [`ReportError::Invalid`] for a zero wall time, an accuracy outside [0, 1] or NaN.
    pub fn from_measurements(m: &RunMeasurements) -> Result<Self, ReportError> {
        let wall_s = m.wall.as_secs_f64();
        if wall_s <= 0.0 {
            return Err(ReportError::Invalid { what: "wall", value: format!("{:?}", m.wall), why: "must be > 0" });
        }
        if !(0.0..=1.0).contains(&m.accuracy) {
            return Err(ReportError::Invalid {
                what: "accuracy",
                value: m.accuracy.to_string(),
                why: "must be in [0, 1]",
            });
        }
        let total = m.samples_computed as f64 + m.samples_dropped as f64;
        Ok(Self {
            accuracy: m.accuracy,
            samples_per_s: m.samples_computed as f64 / wall_s,
            steps_per_s: m.steps as f64 / wall_s,
            wall_s,
            drop_rate: m.nominal_drop_rate,
            dropped_of_handed_out: if total > 0.0 { m.samples_dropped as f64 / total } else { 0.0 },
            threshold_ms: m.threshold.map(|d| d.as_nanos() as f64 / 1e6),
            final_loss: m.final_loss,
            steps: m.steps,
            samples_computed: m.samples_computed,
            samples_dropped: m.samples_dropped,
            policy: String::new(),
            assignment: Vec::new(),
            holdout_loss_per_token: None,
            tokens_computed: None,
            tokens_per_s: None,
        })
    }
}

/// The configuration the runs used, echoed into report.json (units in the field names).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ConfigEcho {
    /// World size.
    pub ranks: u32,
    /// Micro-batches per rank per step.
    pub micro_batches: u32,
    /// Samples per micro-batch.
    pub micro_batch_size: u32,
    /// `--threshold` as given: "auto", "off" or the ms value.
    pub threshold: String,
    /// Steps requested (`null` when run by epochs).
    pub steps: Option<u64>,
    /// Epochs requested (`null` when run by steps).
    pub epochs: Option<u32>,
    /// Seed.
    pub seed: u64,
    /// Data file, `null` for the built-in set.
    pub data: Option<String>,
    /// `--init-params` file, `null` for the seeded initialisation.
    pub init_params: Option<String>,
    /// "threads", "processes" or "env".
    pub launch: String,
    /// `--noise` in its command-line form (`Noise`'s Display), e.g. "lognormal:0.5" or
    /// "reference:1" (the reference's delay factor after the colon).
    pub noise: String,
    /// Persistent slow ranks as [rank, factor].
    pub slow_ranks: Vec<(u32, f64)>,
    /// Emulated base latency of a micro-batch, ms.
    pub base_latency_ms: f64,
    /// "before" or "predictive" (the effective check: a `--policy` may force it).
    pub check: String,
    /// The second run's step policy (`--policy`, or the default DropCompute policy of the
    /// check: "drop-before" / "drop-predictive").
    #[serde(default)]
    pub policy: String,
    /// `--backup-workers` (b of the backup-workers policy).
    #[serde(default)]
    pub backup_workers: u32,
    /// The tail shape of the second run (`--tail-split`, `--tail-cost`; split 1 = none).
    #[serde(default)]
    pub tail: dropcompute::policy::TailShape,
    /// Deadline check lag, micro-batches.
    pub sync_lag: u32,
    /// "realized" or "nominal".
    pub normalization: String,
    /// All-reduce bucket, bytes.
    pub bucket_bytes: u64,
    /// Learning rate.
    pub lr: f64,
    /// Momentum.
    pub momentum: f64,
    /// Hidden units.
    pub hidden: u32,
    /// Held-out fraction.
    pub holdout: f64,
    /// Warm-up steps (never drop).
    pub warmup_steps: u64,
    /// Checkpoint period, steps (0 = off).
    pub checkpoint_every: u64,
    /// "real" or "virtual".
    pub time_mode: String,
    /// `--task` when it is not the digits (absent for the digits task): "text".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// `--text-model` of the text task ("default" or "tiny"; absent for the digits task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_model: Option<String>,
    /// `--text-documents` of the text task (absent when the whole corpus is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_documents: Option<u32>,
    /// The guardrails `--threshold auto` judged its candidates by (`--max-drop-rate`,
    /// `--min-batch-fraction`, `--min-gain`, `--jitter-ms` as `jitter_ns`); the defaults in a
    /// report written before they were echoed.
    #[serde(default)]
    pub guardrails: dropcompute::tune::Guardrails,
}

/// The command-line name of an enum flag's value (`clap::ValueEnum`), e.g. `"before"`.
fn value_name<T: clap::ValueEnum>(v: T) -> String {
    // Every variant of the flags' enums has a visible name (none is `#[value(skip)]`).
    v.to_possible_value().map_or_else(String::new, |p| p.get_name().to_owned())
}

impl From<&TrainConfig> for ConfigEcho {
    fn from(c: &TrainConfig) -> Self {
        let (steps, epochs) = match c.length {
            RunLength::Steps(s) => (Some(s), None),
            RunLength::Epochs(e) => (None, Some(e)),
        };
        let s = |x: &str| x.to_owned();
        Self {
            ranks: c.ranks,
            micro_batches: c.micro_batches,
            micro_batch_size: c.micro_batch_size,
            threshold: match c.threshold {
                ThresholdArg::Auto => s("auto"),
                ThresholdArg::Off => s("off"),
                ThresholdArg::Ms(ms) => ms.to_string(),
            },
            steps,
            epochs,
            seed: c.seed,
            data: c.data.as_ref().map(|p| p.display().to_string()),
            init_params: c.init_params.as_ref().map(|p| p.display().to_string()),
            launch: value_name(c.launch),
            noise: c.noise.to_string(),
            slow_ranks: c.slow_ranks.iter().map(|r| (r.rank, r.factor)).collect(),
            base_latency_ms: c.base_latency.as_secs_f64() * 1e3,
            check: value_name(c.check),
            policy: c.policy().name().to_owned(),
            backup_workers: c.backup_workers,
            tail: c.tail,
            sync_lag: c.sync_lag,
            normalization: value_name(c.normalization),
            bucket_bytes: c.bucket_bytes,
            lr: c.lr,
            momentum: c.momentum,
            hidden: c.hidden,
            holdout: c.holdout,
            warmup_steps: c.warmup_steps,
            checkpoint_every: c.checkpoint_every.map_or(0, |k| k.get()),
            time_mode: value_name(c.time_mode),
            task: (c.task != Task::Digits).then(|| c.task.name().to_owned()),
            text_model: (c.task == Task::Text).then(|| c.text.model.name().to_owned()),
            text_documents: c.text.documents.filter(|_| c.task == Task::Text),
            guardrails: c.guardrails,
        }
    }
}

/// Who ran what, where and when: the run metadata of report.json.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RunMetadata {
    /// Version of the `dropcompute` crate that wrote the report.
    pub version: String,
    /// The device backend of the ranks: "cpu-mock (in-process)" or "Synapse at PATH".
    pub backend: String,
    /// "real" or "virtual" (the mock's device time).
    pub time_mode: String,
    /// When the job started, RFC 3339 in UTC to the second (e.g. "2026-11-30T18:28:45Z").
    pub start_time: String,
    /// CPU cores available to this process (`std::thread::available_parallelism`; 1 if unknown).
    pub cores: usize,
    /// World size N.
    pub world_size: u32,
    /// How ranks were started: "threads", "processes" or "env".
    pub launch: String,
    /// Seed of both runs.
    pub seed: u64,
    /// The command line, program name first (lossy UTF-8).
    pub args: Vec<String>,
}

impl RunMetadata {
    /// The metadata of a job of `cfg` started at `start` on `backend`, with this process's
    /// command line and core count.
    pub fn new(cfg: &TrainConfig, backend: String, start: std::time::SystemTime) -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            backend,
            time_mode: value_name(cfg.time_mode),
            start_time: humantime::format_rfc3339_seconds(start).to_string(),
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            world_size: cfg.ranks,
            launch: value_name(cfg.launch),
            seed: cfg.seed,
            args: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
        }
    }
}

/// One rank's line of the straggler attribution (from the scheduler's
/// `schedule::StragglerTracker` over the DropCompute run).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RankStraggler {
    /// Rank.
    pub rank: u32,
    /// Micro-batches this rank dropped over the run.
    pub dropped_micro_batches: u64,
    /// Steps in which it hit the deadline (dropped at least one micro-batch): its slow steps.
    pub slow_steps: u64,
    /// slow_steps / steps observed, in [0, 1].
    pub slow_step_share: f64,
    /// Exponentially weighted mean of its compute phase at the end of the run, ms.
    pub compute_ms_ewma: f64,
    /// "chronic", "transient", "normal" or "unlabelled" (`tune::StragglerClass`; rule in
    /// [`StragglerReport`]).
    pub class: dropcompute::tune::StragglerClass,
}

/// The straggler attribution of report.json and of `train`'s stdout.
///
/// Rule (`schedule::StragglerTracker::class`): with fewer than [`StragglerReport::min_steps`]
/// (`tune::MIN_STEPS`) steps, or a run without a deadline, every rank is "unlabelled"; else a
/// rank is chronic when it hit the deadline in at least the tracker's chronic fraction (default
/// 0.5) of the steps and its smoothed compute time exceeds the median rank's by more than
/// 10 %, transient when it hit the deadline in some step, normal otherwise.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StragglerReport {
    /// The run the tracker observed ("dropcompute").
    pub run: String,
    /// Steps observed.
    pub steps: u64,
    /// Fewest steps before any label (`tune::MIN_STEPS`).
    pub min_steps: u64,
    /// Why every rank is unlabelled, when they are (e.g. "threshold off"); `null` otherwise.
    pub unlabelled_because: Option<String>,
    /// Every rank, by rank id.
    pub ranks: Vec<RankStraggler>,
}

impl StragglerReport {
    /// The ranks of a class.
    pub fn ranks_of(&self, class: dropcompute::tune::StragglerClass) -> Vec<u32> {
        self.ranks.iter().filter(|r| r.class == class).map(|r| r.rank).collect()
    }

    /// The text table printed by `train`: a title line, then (when some rank hit the deadline
    /// or is labelled chronic) a column header and one line per such rank, and one line
    /// counting the others. Ends with a newline.
    pub fn table(&self) -> String {
        let mut out = format!(
            "stragglers ({} run, {} steps; labels need >= {} steps{}):\n",
            self.run,
            self.steps,
            self.min_steps,
            self.unlabelled_because.as_deref().map(|w| format!("; unlabelled: {w}")).unwrap_or_default()
        );
        // A chronic rank is listed even without a deadline hit (a rebalanced run has none).
        let hit = |r: &&RankStraggler| {
            r.slow_steps > 0 || r.dropped_micro_batches > 0 || r.class == dropcompute::tune::StragglerClass::Chronic
        };
        if self.ranks.iter().any(|r| hit(&r)) {
            out.push_str(&format!(
                "  {:>6}  {:>21}  {:>16}  {:>18}  {}\n",
                "rank", "dropped micro-batches", "slow steps (%)", "compute ms (EWMA)", "class"
            ));
        }
        let quiet = self.ranks.len() - self.ranks.iter().filter(hit).count();
        for r in self.ranks.iter().filter(hit) {
            out.push_str(&format!(
                "  {:>6}  {:>21}  {:>16.1}  {:>18.3}  {}\n",
                r.rank,
                r.dropped_micro_batches,
                r.slow_step_share * 100.0,
                r.compute_ms_ewma,
                r.class.name()
            ));
        }
        if quiet == self.ranks.len() {
            out.push_str(&format!("  all {quiet} ranks: no deadline hit\n"));
        } else if quiet > 0 {
            out.push_str(&format!("  {quiet} other rank(s): no deadline hit\n"));
        }
        out
    }
}

/// report.json.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Report {
    /// The synchronous baseline (threshold off); `null` with `--no-compare`.
    pub baseline: Option<RunReport>,
    /// The DropCompute run.
    pub dropcompute: RunReport,
    /// Measured effective speedup: dropcompute.samples_per_s / baseline.samples_per_s (ratio;
    /// tokens_per_s for the text task, `summary::report`); `null` without a baseline or when
    /// the baseline computed nothing.
    pub speedup: Option<f64>,
    /// Effective speedup predicted by the simulator (`dropcompute::sim`) for this configuration.
    pub predicted_speedup: Option<f64>,
    /// True when the prediction is an estimate: it replays latencies the baseline did not
    /// record (micro-batches beyond its M under a compute budget or rebalancing, steps beyond
    /// its S when an `--epochs` run outlasts the baseline), drawn from each rank's recorded ones.
    #[serde(default)]
    pub prediction_estimate: bool,
    /// The configuration both runs used.
    pub config: ConfigEcho,
    /// Version, backend, time mode, start time, cores, world size, launch mode, seed, command
    /// line.
    pub run: RunMetadata,
    /// Per-rank straggler attribution of the DropCompute run.
    pub stragglers: StragglerReport,
}

impl Report {
    /// Assemble the report and compute the measured [`Report::speedup`].
    pub fn new(
        baseline: Option<RunReport>,
        dropcompute: RunReport,
        predicted_speedup: Option<f64>,
        config: ConfigEcho,
        run: RunMetadata,
        stragglers: StragglerReport,
    ) -> Self {
        let speedup =
            baseline.as_ref().filter(|b| b.samples_per_s > 0.0).map(|b| dropcompute.samples_per_s / b.samples_per_s);
        Self { baseline, dropcompute, speedup, predicted_speedup, prediction_estimate: false, config, run, stragglers }
    }

    /// Pretty JSON (infallible for this schema: string keys, no maps with non-string keys).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Side-by-side text table of the two runs (columns baseline, DropCompute; `-` where a value is
/// absent), one row per metric, columns aligned, ending with a newline. Units: s, steps/s,
/// samples/s, %, ms, ratio; the text task adds tokens/s and its drop rate row says "tokens"
/// (`summary::drop_rate`).
pub fn comparison_table(r: &Report) -> String {
    let b = r.baseline.as_ref();
    let d = &r.dropcompute;
    let dash = || "-".to_owned();
    let both = |f: &dyn Fn(&RunReport) -> String| [b.map_or_else(dash, f), f(d)];
    let ms = |x: Option<f64>| x.map_or_else(|| "off".to_owned(), |v| format!("{v:.3}"));
    let ratio = |x: Option<f64>| x.map_or_else(dash, |v| format!("{v:.3}x"));
    let rows: Vec<(&str, [String; 2])> = vec![
        ("wall time (s)", both(&|x| format!("{:.3}", x.wall_s))),
        ("steps/s", both(&|x| format!("{:.3}", x.steps_per_s))),
        ("samples/s computed", both(&|x| format!("{:.1}", x.samples_per_s))),
        ("drop rate (%)", both(&|x| format!("{:.2}", x.drop_rate * 100.0))),
        ("threshold (ms)", both(&|x| ms(x.threshold_ms))),
        ("final train loss", both(&|x| format!("{:.4}", x.final_loss))),
        match d.holdout_loss_per_token {
            // The text task's metric (no accuracy).
            Some(_) => (
                "held-out loss (nats/token)",
                both(&|x| x.holdout_loss_per_token.map_or_else(dash, |l| format!("{l:.4}"))),
            ),
            None => ("held-out accuracy (%)", both(&|x| format!("{:.2}", x.accuracy * 100.0))),
        },
        ("effective speedup, measured", [b.map_or_else(dash, |_| "1.000x".to_owned()), ratio(r.speedup)]),
        (
            "effective speedup, predicted",
            [dash(), {
                let v = ratio(r.predicted_speedup);
                if r.prediction_estimate && r.predicted_speedup.is_some() { format!("{v} (estimate)") } else { v }
            }],
        ),
    ];
    let mut rows = rows;
    if d.tokens_per_s.is_some() {
        // The text task's unit of work (its speedup and drop rate are in tokens).
        rows.insert(3, ("tokens/s computed", both(&|x| x.tokens_per_s.map_or_else(dash, |t| format!("{t:.1}")))));
        if let Some(r) = rows.iter_mut().find(|r| r.0 == "drop rate (%)") {
            r.0 = "drop rate (%, tokens)";
        }
    }
    let header = ("", ["baseline".to_owned(), "dropcompute".to_owned()]);
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w = |i: usize| rows.iter().chain([&header]).map(|r| r.1[i].len()).max().unwrap_or(0);
    let (w1, w2) = (w(0), w(1));
    let mut out = String::new();
    for (label, [c1, c2]) in std::iter::once(&header).chain(&rows) {
        out.push_str(&format!("{label:<w0$}  {c1:>w1$}  {c2:>w2$}\n"));
    }
    out
}
