//! The `dropcompute train` command-line surface: [`TrainArgs`] (clap) and its pure validation
//! into [`TrainConfig`].
//!
//! Owns: flag names (scripts depend on them), defaults, and every range check, each reported as
//! an [`ArgError`] naming the flag and the offending value. Must not touch: devices, the network,
//! the file system or the clock — [`TrainArgs::validate`] is pure, so a bad flag fails before any
//! device is opened. `-v/--verbose` is not declared here: it is the global flag of the
//! `dropcompute` parser (`Cli::verbose`), accepted after `train` too.
#![forbid(unsafe_code)]

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use crate::launch::Launch;
use crate::mock::config::{MAX_SLOWDOWN, TimeMode};
use crate::policy::CheckMode;
use crate::schedule::Normalization;
use crate::sim::noise::Noise;

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

fn bad(flag: &'static str, value: impl ToString, why: impl Into<String>) -> ArgError {
    ArgError { flag, value: value.to_string(), why: why.into() }
}

/// A float as the user would type it: plain for moderate magnitudes, else scientific
/// (`1e300`, not 301 digits).
fn show(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e9).contains(&x.abs()) { format!("{x}") } else { format!("{x:e}") }
}

/// The `--threshold` value: tune it automatically, no deadline (baseline), or fixed.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ThresholdArg {
    /// Tune the threshold from the baseline's latencies (`crate::tune`).
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

    /// The fixed deadline as a [`Duration`], `None` for `Auto` and `Off`.
    pub fn fixed(&self) -> Option<Duration> {
        match *self {
            // `parse` bounds ms to (0, MAX_MS]; a hand-built out-of-range value gives None.
            Self::Ms(ms) => Duration::try_from_secs_f64(ms / 1e3).ok(),
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

/// Arguments of `dropcompute train` (flag names are a stable interface).
#[derive(Clone, Debug, clap::Args)]
pub struct TrainArgs {
    /// World size: number of ranks, each a (mock) device.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true)]
    pub ranks: u32,
    /// Micro-batches per rank per step (gradient accumulation).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    pub micro_batches: u32,
    /// Samples per micro-batch.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    pub micro_batch_size: u32,
    /// Compute deadline per step: auto (tuned), off (baseline only) or a number of ms.
    #[arg(long, default_value = "auto", allow_hyphen_values = true)]
    pub threshold: String,
    /// Optimizer steps to run [default: 60].
    #[arg(long, conflicts_with = "epochs", allow_negative_numbers = true)]
    pub steps: Option<u64>,
    /// Epochs over the training split (instead of --steps).
    #[arg(long, allow_negative_numbers = true)]
    pub epochs: Option<u32>,
    /// Seed of data split, initialisation, sampling and noise (same for both runs).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub seed: u64,
    /// Digits data file (default: the built-in data set).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// How ranks are started.
    #[arg(long, value_enum, default_value_t = Launch::Threads)]
    pub launch: Launch,
    /// Output directory (report.json, timelines, figure), written atomically at the end.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Resume from the checkpoints in DIR.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Run the baseline (threshold off) and DropCompute and compare them (default).
    #[arg(long, overrides_with = "no_compare")]
    pub compare: bool,
    /// Run only DropCompute.
    #[arg(long, overrides_with = "compare")]
    pub no_compare: bool,
    /// Latency noise (the factor on --base-latency-ms per micro-batch): none,
    /// reference[:DELAY_FACTOR] (the reference's --delay_factor, default 1), lognormal:SIGMA,
    /// normal:CV, exponential:MEAN or seqlen:SAMPLES (the syntax of `simulate --noise`).
    #[arg(long, default_value = "reference", allow_hyphen_values = true)]
    pub noise: Noise,
    /// Persistently slow rank, RANK:FACTOR (repeatable).
    #[arg(long, value_name = "RANK:FACTOR", allow_hyphen_values = true)]
    pub slow_rank: Vec<String>,
    /// Emulated latency of one micro-batch before noise, ms.
    #[arg(long, default_value_t = 12.0, allow_negative_numbers = true)]
    pub base_latency_ms: f64,
    /// Deadline check semantics.
    #[arg(long, value_enum, default_value_t = CheckMode::Predictive)]
    pub check: CheckMode,
    /// Micro-batches the deadline check may lag behind the device (0 = none).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub sync_lag: u32,
    /// Gradient normalisation.
    #[arg(long, value_enum, default_value_t = Normalization::Realized)]
    pub normalization: Normalization,
    /// All-reduce bucket size, MiB.
    #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
    pub bucket_mb: f64,
    /// SGD learning rate.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9, allow_negative_numbers = true)]
    pub momentum: f64,
    /// Hidden units of the MLP.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    pub hidden: u32,
    /// Held-out fraction of the data for accuracy.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub holdout: f64,
    /// Steps that never drop (warm-up).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    pub warmup_steps: u64,
    /// Checkpoint every K steps (0 = off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub checkpoint_every: u64,
    /// Where checkpoints go (default: the --resume directory, else ./dropcompute-checkpoints).
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Mock device time: real (sleeps) or virtual (deterministic).
    #[arg(long, value_enum, default_value_t = TimeMode::Real)]
    pub time_mode: TimeMode,
}

/// A validated `train` configuration (every range already checked; see [`TrainArgs`]). JSON
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
    /// Deadline check semantics.
    pub check: CheckMode,
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
    /// Held-out fraction (0 < holdout < 1).
    pub holdout: f64,
    /// Steps `0..warmup_steps` never drop.
    pub warmup_steps: u64,
    /// Checkpoint period in steps, `None` = no checkpoints.
    pub checkpoint_every: Option<NonZeroU64>,
    /// Checkpoint directory: `--checkpoint-dir`, else `--resume`, else ./dropcompute-checkpoints.
    pub checkpoint_dir: PathBuf,
    /// Mock device time mode.
    pub time_mode: TimeMode,
}

fn positive(flag: &'static str, x: f64) -> Result<f64, ArgError> {
    if x.is_finite() && x > 0.0 { Ok(x) } else { Err(bad(flag, show(x), "must be a positive finite number")) }
}

fn at_least_one<T: Into<u64> + Copy + ToString>(flag: &'static str, x: T) -> Result<T, ArgError> {
    if x.into() >= 1 { Ok(x) } else { Err(bad(flag, x, "must be >= 1")) }
}

fn parse_slow_rank(s: &str, ranks: u32) -> Result<SlowRank, ArgError> {
    let (r, f) = s.split_once(':').ok_or_else(|| bad("slow-rank", s, "expected RANK:FACTOR, e.g. 3:2.5"))?;
    let rank: u32 = r.trim().parse().map_err(|_| bad("slow-rank", s, "RANK must be a non-negative integer"))?;
    if rank >= ranks {
        return Err(bad("slow-rank", s, format!("rank must be < --ranks {ranks}")));
    }
    let factor: f64 = f.trim().parse().map_err(|_| bad("slow-rank", s, "FACTOR must be a number"))?;
    if !(factor.is_finite() && factor > 0.0 && factor <= MAX_SLOWDOWN) {
        return Err(bad("slow-rank", s, format!("FACTOR must be > 0 and <= {MAX_SLOWDOWN}")));
    }
    Ok(SlowRank { rank, factor })
}

impl TrainArgs {
    /// Check every flag and build the [`TrainConfig`]. Pure: no I/O, no device.
    /// Errors: the first invalid flag, as [`ArgError`] (flag, value, requirement): a count of 0
    /// (`--ranks`, `--micro-batches`, `--micro-batch-size`, `--hidden`, `--steps`, `--epochs`),
    /// `--ranks` above [`MAX_RANKS`], a global batch overflowing u64, a bad `--threshold`, a NaN/inf/out-of-range float, `--slow-rank` with rank >= ranks, a repeated rank
    /// or a factor outside (0, [`MAX_SLOWDOWN`]], `--sync-lag` >= `--micro-batches`, a bucket
    /// below one f32 or above [`MAX_BUCKET_MB`].
    pub fn validate(&self) -> Result<TrainConfig, ArgError> {
        let ranks = at_least_one("ranks", self.ranks)?;
        if ranks > MAX_RANKS {
            return Err(bad(
                "ranks",
                ranks,
                format!("must be <= {MAX_RANKS} (ranks of one host: threads or processes)"),
            ));
        }
        let micro_batches = at_least_one("micro-batches", self.micro_batches)?;
        let micro_batch_size = at_least_one("micro-batch-size", self.micro_batch_size)?;
        let global_batch = u64::from(ranks)
            .checked_mul(u64::from(micro_batches))
            .and_then(|x| x.checked_mul(u64::from(micro_batch_size)))
            .ok_or_else(|| bad("micro-batch-size", micro_batch_size, "global batch overflows u64"))?;
        let threshold = ThresholdArg::parse(&self.threshold)?;
        let length = match (self.steps, self.epochs) {
            (Some(_), Some(_)) => return Err(bad("epochs", self.epochs.unwrap_or(0), "conflicts with --steps")),
            (Some(s), None) => RunLength::Steps(at_least_one("steps", s)?),
            (None, Some(e)) => RunLength::Epochs(at_least_one("epochs", e)?),
            (None, None) => RunLength::Steps(DEFAULT_STEPS),
        };
        let mut slow_ranks: Vec<SlowRank> = Vec::with_capacity(self.slow_rank.len());
        for s in &self.slow_rank {
            let sr = parse_slow_rank(s, ranks)?;
            if slow_ranks.iter().any(|o| o.rank == sr.rank) {
                return Err(bad("slow-rank", s, format!("rank {} given twice", sr.rank)));
            }
            slow_ranks.push(sr);
        }
        let base_ms = positive("base-latency-ms", self.base_latency_ms)?;
        if base_ms > MAX_MS {
            return Err(bad("base-latency-ms", show(base_ms), format!("must be <= {MAX_MS} ms (one hour)")));
        }
        if self.sync_lag >= micro_batches {
            return Err(bad("sync-lag", self.sync_lag, format!("must be < --micro-batches {micro_batches}")));
        }
        let mb = positive("bucket-mb", self.bucket_mb)?;
        let bucket_bytes = (mb * BYTES_PER_MB).round();
        if !(4.0..=MAX_BUCKET_MB * BYTES_PER_MB).contains(&bucket_bytes) {
            return Err(bad("bucket-mb", show(mb), format!("must hold one f32 (4 bytes) and be <= {MAX_BUCKET_MB}")));
        }
        let lr = positive("lr", self.lr)?;
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return Err(bad("momentum", show(self.momentum), "must be in [0, 1)"));
        }
        let hidden = at_least_one("hidden", self.hidden)?;
        if hidden > MAX_HIDDEN {
            return Err(bad("hidden", hidden, format!("must be <= {MAX_HIDDEN}")));
        }
        if !(self.holdout.is_finite() && self.holdout > 0.0 && self.holdout < 1.0) {
            return Err(bad("holdout", show(self.holdout), "must be in (0, 1)"));
        }
        Ok(TrainConfig {
            ranks,
            micro_batches,
            micro_batch_size,
            global_batch,
            threshold,
            length,
            seed: self.seed,
            data: self.data.clone(),
            launch: self.launch,
            out: self.out.clone(),
            resume: self.resume.clone(),
            compare: !self.no_compare,
            noise: self.noise.clone(),
            slow_ranks,
            // In (0, 1 h] by the check above, so the conversion cannot overflow.
            base_latency: Duration::from_secs_f64(base_ms / 1e3),
            check: self.check,
            sync_lag: self.sync_lag,
            normalization: self.normalization,
            bucket_bytes: bucket_bytes as u64,
            lr,
            momentum: self.momentum,
            hidden,
            holdout: self.holdout,
            warmup_steps: self.warmup_steps,
            checkpoint_every: NonZeroU64::new(self.checkpoint_every),
            checkpoint_dir: self
                .checkpoint_dir
                .clone()
                .or_else(|| self.resume.clone())
                .unwrap_or_else(|| PathBuf::from("dropcompute-checkpoints")),
            time_mode: self.time_mode,
        })
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
