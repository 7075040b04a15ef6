//! The validated configuration of a `dropcompute train` job: [`TrainConfig`] (what the job,
//! its rank processes and its checkpoints see), its parts ([`ThresholdArg`], [`RunLength`],
//! [`SlowRank`]), the flags' limits, and [`ArgError`], the error of a flag out of range.
//!
//! Owns: the configuration's types, limits and JSON form (a rank process of `--launch
//! processes` receives it as JSON from its parent). Must not touch: clap or flag parsing (that
//! is `dropcompute_cli::commands::train`, whose `Args::validate` builds a [`TrainConfig`]), devices, the
//! network, the file system or the clock. ([`Task`] and [`TextModelSize`] derive
//! `clap::ValueEnum` for their value names only, as the core's flag enums do.)
#![forbid(unsafe_code)]

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use dropcompute::launch::Launch;
use dropcompute::mock::config::TimeMode;
use dropcompute::policy::{CheckMode, Threshold};
use dropcompute::schedule::Normalization;
use dropcompute::sim::noise::Noise;

/// Default number of steps when neither `--steps` nor `--epochs` is given.
pub const DEFAULT_STEPS: u64 = 60;
/// Largest accepted `--bucket-mb` (1 TiB, above any device memory).
pub const MAX_BUCKET_MB: f64 = 1_048_576.0;
/// Bytes per MB for `--bucket-mb`: MiB, as PyTorch DDP's `bucket_cap_mb` (`mb * 1024 * 1024`).
pub const BYTES_PER_MB: f64 = 1_048_576.0;
/// Largest accepted `--threshold` and `--base-latency-ms`, ms: one hour (the mock's
/// `MAX_SCRIPT_NS`); longer would put a single step hours away on the device timeline.
pub const MAX_MS: f64 = 3_600_000.0;
/// Largest `--ranks`: every rank of `train` runs on this host (a thread or a process, each with
/// its mock device and stream workers).
pub const MAX_RANKS: u32 = 1024;
/// `--ranks` when absent (`--launch threads|processes`; under `--launch env` the launcher's
/// world size).
pub const DEFAULT_RANKS: u32 = 32;

/// Default `--base-latency-ms`: the emulated device time of one micro-batch's forward and
/// backward before noise and slowdown, ms (mock only; see `Job::check_real_device`).
pub const DEFAULT_BASE_LATENCY_MS: f64 = 12.0;

/// Largest `--micro-batches` (gradient accumulation steps per rank per step): the count row
/// and the per-step latency records are O(M) per rank, and a larger M would only allocate.
pub const MAX_MICRO_BATCHES: u32 = 65_536;
/// Largest `--micro-batch-size` (samples per micro-batch; the device buffers hold one
/// micro-batch, so a larger one would only allocate).
pub const MAX_MICRO_BATCH_SIZE: u32 = 65_536;
/// Largest `--hidden` (parameters and per-rank buffers grow linearly with it).
pub const MAX_HIDDEN: u32 = 16_384;
/// A flag whose value is out of range. Display: `--FLAG VALUE: why`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("--{flag} {value}: {why}")]
pub struct ArgError {
    /// Flag name without the leading dashes, e.g. `"ranks"`.
    pub flag: &'static str,
    /// The value as given (or as parsed, for numbers).
    pub value: String,
    /// What is required.
    pub why: String,
}

impl ArgError {
    /// The error of flag `--flag` (name without dashes) given `value`: `why` says what is
    /// required.
    pub fn new(flag: &'static str, value: impl ToString, why: impl Into<String>) -> Self {
        Self { flag, value: value.to_string(), why: why.into() }
    }
}

fn bad(flag: &'static str, value: impl ToString, why: impl Into<String>) -> ArgError {
    ArgError::new(flag, value, why)
}

/// The `--threshold` value: tune it automatically, no deadline (baseline), or fixed.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ThresholdArg {
    /// Tune the threshold from the baseline's latencies (`dropcompute::tune`).
    Auto,
    /// No deadline: DropCompute degenerates to the synchronous baseline.
    Off,
    /// Fixed compute deadline per step, ms (in (0, [`MAX_MS`]] when built by [`Self::parse`]).
    Ms(f64),
}

impl ThresholdArg {
    /// Parse `auto`, `off` or a number of ms in (0, [`MAX_MS`]] (case-insensitive keywords).
    /// Errors: [`ArgError`] for `--threshold` on anything else (0, negative, NaN, inf, text, or
    /// above one hour).
    pub fn parse(s: &str) -> Result<Self, ArgError> {
        let why = "must be a positive number of ms, \"off\" or \"auto\"";
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            t => match t.parse::<f64>() {
                Ok(ms) if ms.is_finite() && ms > 0.0 && ms <= MAX_MS => Ok(Self::Ms(ms)),
                Ok(ms) if ms.is_finite() && ms > MAX_MS => {
                    Err(bad("threshold", s, format!("must be <= {MAX_MS} ms (one hour)")))
                }
                _ => Err(bad("threshold", s, why)),
            },
        }
    }

    /// The fixed deadline as a [`Duration`] rounded to the nearest ns (`Threshold::from_ms`, so
    /// report.json's `threshold_ms`, ns / 1e6 as f64, gives back the same ns), `None` for `Auto` and `Off`.
    pub fn fixed(&self) -> Option<Duration> {
        match *self {
            // `parse` bounds ms to (0, MAX_MS]; a hand-built out-of-range value gives None.
            Self::Ms(ms) if ms.is_finite() && ms > 0.0 && ms <= MAX_MS => match Threshold::from_ms(ms) {
                Some(Threshold::Fixed(d)) => Some(d),
                _ => None,
            },
            _ => None,
        }
    }
}

/// One `--slow-rank RANK:FACTOR`: every micro-batch of `rank` takes `factor` times longer.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SlowRank {
    /// Rank index (< `--ranks`).
    pub rank: u32,
    /// Persistent latency multiplier (finite, > 0, <= [`MAX_SLOWDOWN`]).
    pub factor: f64,
}

/// How long to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RunLength {
    /// Optimizer steps (>= 1).
    Steps(u64),
    /// Passes over the training split (>= 1).
    Epochs(u32),
}

/// A validated `train` configuration (every range already checked; built by `dropcompute_cli::commands::train::Args::validate`). JSON
/// (serde) is how a rank process of `--launch processes` receives it from its parent.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainConfig {
    /// World size (1..=[`MAX_RANKS`]).
    pub ranks: u32,
    /// Micro-batches per rank per step (>= 1).
    pub micro_batches: u32,
    /// Samples per micro-batch (>= 1).
    pub micro_batch_size: u32,
    /// Nominal global batch, samples per step: ranks × micro_batches × micro_batch_size.
    pub global_batch: u64,
    /// Deadline of the DropCompute run.
    pub threshold: ThresholdArg,
    /// Training length.
    pub length: RunLength,
    /// Seed shared by both runs.
    pub seed: u64,
    /// Data file, `None` for the built-in data set.
    pub data: Option<PathBuf>,
    /// `--init-params`: initial parameters from a parameters file (`train::params`, the
    /// `params_<run>.safetensors` of an earlier `--out`) instead of the seeded He
    /// initialisation; `None` for the latter.
    #[serde(default)]
    pub init_params: Option<PathBuf>,
    /// How ranks are started.
    pub launch: Launch,
    /// Output directory (see `output::StagedOut`).
    pub out: Option<PathBuf>,
    /// Checkpoint directory to resume from.
    pub resume: Option<PathBuf>,
    /// Run the baseline too and compare.
    pub compare: bool,
    /// Injected latency noise, as the mock device takes it (parameters in the ranges of
    /// [`Noise::from_str`](std::str::FromStr::from_str)).
    pub noise: Noise,
    /// Persistently slow ranks, each rank at most once, in command-line order.
    pub slow_ranks: Vec<SlowRank>,
    /// Emulated micro-batch latency before noise and slowdown (> 0, <= [`MAX_MS`] ms).
    pub base_latency: Duration,
    /// Deadline check semantics (the effective one: `--policy drop-before` / `drop-predictive`
    /// / `compute-budget` force theirs, `policy::Policy::check_mode`).
    pub check: CheckMode,
    /// `--policy`: the step policy of the second run; `None` (the default, and configurations
    /// written before the flag) is DropCompute with `check` ([`TrainConfig::policy`]).
    #[serde(default)]
    pub policy: Option<dropcompute::policy::Policy>,
    /// `--backup-workers`: b of `--policy backup-workers` (ranks predicted slowest that skip
    /// the step; 0 = synchronous).
    #[serde(default = "one")]
    pub backup_workers: u32,
    /// `--tail-split` / `--tail-cost`: the second compiled shape of the second run
    /// (`policy::TailShape`; split 1, the default, is whole micro-batches only). With split S
    /// the run's data source deals parts of b/S samples and its counts (steps.csv `computed`,
    /// `dropped`) are in parts.
    #[serde(default)]
    pub tail: dropcompute::policy::TailShape,
    /// Micro-batches the deadline check may lag behind the device (< micro_batches).
    pub sync_lag: u32,
    /// Gradient normalisation.
    pub normalization: Normalization,
    /// All-reduce bucket size, bytes (>= 4: one f32; `--bucket-mb` × [`BYTES_PER_MB`], rounded).
    pub bucket_bytes: u64,
    /// SGD learning rate (finite, > 0).
    pub lr: f64,
    /// SGD momentum (0 <= momentum < 1).
    pub momentum: f64,
    /// Hidden units (>= 1).
    pub hidden: u32,
    /// Classes of `--data` (2..=`data::MAX_CLASSES`): labels outside `0..classes` are an error
    /// naming line and column; the model has this many outputs.
    #[serde(default = "ten")]
    pub classes: u32,
    /// Held-out fraction (0 < holdout < 1).
    pub holdout: f64,
    /// Steps `0..warmup_steps` never drop.
    pub warmup_steps: u64,
    /// `--drop-guard`: the run-time drop-rate guard's bound of the second run
    /// (`policy::DropGuard`, a fraction in (0, 1]; its auto threshold and prediction replay
    /// it); `None` (the default, and configurations written before the flag): no guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_guard: Option<f64>,
    /// Checkpoint period in steps, `None` = no checkpoints.
    pub checkpoint_every: Option<NonZeroU64>,
    /// Checkpoint directory: `--checkpoint-dir`, else `--resume`, else ./dropcompute-checkpoints.
    pub checkpoint_dir: PathBuf,
    /// Checkpointing was asked for (`--checkpoint-every`, `--checkpoint-dir` or `--resume`
    /// given): a SIGHUP stop then writes a checkpoint too (`dropcompute::signals::StopSignal`).
    #[serde(default)]
    pub checkpoint_asked: bool,
    /// Mock device time mode.
    pub time_mode: TimeMode,
    /// Guardrails of `--threshold auto` (`--max-drop-rate`, `--min-batch-fraction`,
    /// `--min-gain`: the same flags and defaults as `dropcompute tune`), each in [0, 1].
    pub guardrails: dropcompute::tune::Guardrails,
    /// `--task`: what the job trains (the digits MLP, the default, or the text transformer).
    /// Configurations written before the flag are digits jobs.
    #[serde(default)]
    pub task: Task,
    /// `--text-model`, `--text-documents`: the text task's size (read only when `task` is
    /// [`Task::Text`]).
    #[serde(default)]
    pub text: TextTask,
}

/// `--task`: the job's model, data and metric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// The MLP on the UCI digits (or `--data`), SGD, held-out accuracy; samples are the unit.
    #[default]
    Digits,
    /// The byte-level transformer LM on the embedded text corpus (`train::text`), one compiled
    /// forward/backward recipe per length bucket, AdamW, held-out loss per token; tokens are
    /// the unit (divisor, ledger, compute log) and every micro-batch carries its bucket.
    Text,
}

impl Task {
    /// The command-line name: "digits" or "text".
    pub fn name(self) -> &'static str {
        match self {
            Task::Digits => "digits",
            Task::Text => "text",
        }
    }

    /// The task's `--noise` when absent: the reference's delay model (`reference`, delay factor 1) for
    /// the digits, whose straggling is injected; none for the text task, whose straggling is
    /// the data's (a micro-batch costs its length bucket's modelled device time).
    pub fn default_noise(self) -> Noise {
        match self {
            Task::Digits => Noise::Reference { delay_factor: 1.0 },
            Task::Text => Noise::None,
        }
    }

    /// What the task's dealer deals one id per, as every message names it: "training samples"
    /// (digits) or "training units" (text: bucket-plan units of b/S documents,
    /// `text_job::TextJob::plan`); `job::Job::units_described` adds the count.
    pub fn units_name(self) -> &'static str {
        match self {
            Task::Digits => "training samples",
            Task::Text => "training units",
        }
    }

    /// The flags that set how many [`Task::units_name`] a job has (checkpoint mismatch
    /// messages, `ckpt::differences`).
    pub fn units_flags(self) -> &'static str {
        match self {
            Task::Digits => "--data, --holdout",
            Task::Text => "--text-documents, --holdout, --micro-batch-size, --tail-split",
        }
    }

    /// The flags that set the model's parameter count (checkpoint mismatch messages).
    pub fn params_flags(self) -> &'static str {
        match self {
            Task::Digits => "--hidden and the data's features and classes",
            Task::Text => "--text-model",
        }
    }

    /// The task's `--time-mode` when absent: real for the digits; virtual for the text task,
    /// because the mock's host work for one text micro-batch (1 to 72 ms of CPU, README's
    /// table) exceeds its modelled device time (0.5 to 6.8 ms), so real time on a host with
    /// fewer cores than ranks would measure the host's CPU, not the modelled device.
    pub fn default_time_mode(self) -> TimeMode {
        match self {
            Task::Digits => TimeMode::Real,
            Task::Text => TimeMode::Virtual,
        }
    }
}

/// `n` and a plural noun phrase in the grammar of `n`: "1 training unit", "2 training units",
/// "0 documents" (a phrase not ending in "s" is kept as given).
pub fn counted(n: u64, plural: &str) -> String {
    match (n, plural.strip_suffix('s')) {
        (1, Some(one)) => format!("1 {one}"),
        _ => format!("{n} {plural}"),
    }
}

/// `--text-model`: the text task's transformer and bucket set (`train::text_job` maps each to
/// its `TransformerConfig` and buckets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TextModelSize {
    /// `TransformerConfig::DEFAULT` with `text::DEFAULT_BUCKETS` (64..512 tokens): the job's
    /// measured default size.
    #[default]
    Default,
    /// `TransformerConfig::TINY` with buckets of 8 and 16 tokens: the tests' size (seconds).
    Tiny,
}

impl TextModelSize {
    /// The command-line name: "default" or "tiny".
    pub fn name(self) -> &'static str {
        match self {
            TextModelSize::Default => "default",
            TextModelSize::Tiny => "tiny",
        }
    }
}

/// The text task's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TextTask {
    /// Model and buckets.
    pub model: TextModelSize,
    /// Use only the first this many documents of the embedded corpus (`None`: all): at least
    /// `data::min_split_items(holdout)` (3 at the default `--holdout` 0.2; checked by the CLI),
    /// at most the corpus (`text_job::TextJob::prepare` refuses more).
    pub documents: Option<u32>,
}

/// Serde default of [`TrainConfig::backup_workers`].
fn one() -> u32 {
    1
}

impl TrainConfig {
    /// The step policy of the second run: `--policy`, else DropCompute with the configured
    /// check (`drop-before` or `drop-predictive`), today's default.
    pub fn policy(&self) -> dropcompute::policy::Policy {
        use dropcompute::policy::Policy;
        self.policy.unwrap_or(match self.check {
            CheckMode::BeforeMicroBatch => Policy::DropBefore,
            CheckMode::Predictive => Policy::DropPredictive,
        })
    }
}

/// Serde default of [`TrainConfig::classes`] (configurations written before the flag existed).
fn ten() -> u32 {
    10
}
