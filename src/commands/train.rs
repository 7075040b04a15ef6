//! `dropcompute train`: trains the MLP on the digits (or `--data`), or with `--task text` the
//! byte-level transformer LM on the embedded corpus, with N ranks on the CPU mock, synchronous
//! baseline vs DropCompute (or `--policy`), and prints the comparison table.
//!
//! Owns: [`Args`] (flag names, defaults, and every range check, each reported as an
//! [`ArgError`] naming the flag and the offending value), [`run`] (the command: validate, run the
//! job, print, write `--out`) and [`child`] (one rank process of `--launch processes`). Must not
//! touch: the job itself (`dropcompute_train`). [`Args::validate`] is pure (no device, network, file
//! system or clock), so a bad flag fails before any device is opened. `-v/--verbose` is not
//! declared here: it is the global flag of the `dropcompute` parser, accepted after `train` too.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use dropcompute::launch::{ChildSpec, Launch};
use dropcompute::mock::config::{MAX_SLOWDOWN, TimeMode};
use dropcompute::policy::CheckMode;
use dropcompute::schedule::Normalization;
use dropcompute::sim::noise::Noise;
use dropcompute_train::config::{
    ArgError, BYTES_PER_MB, DEFAULT_RANKS, DEFAULT_STEPS, MAX_BUCKET_MB, MAX_HIDDEN, MAX_MICRO_BATCH_SIZE,
    MAX_MICRO_BATCHES, MAX_MS, MAX_RANKS, RunLength, SlowRank, Task, TextModelSize, TextTask, ThresholdArg,
    TrainConfig,
};
use dropcompute_train::error::TrainError;
use dropcompute_train::job::Job;
use dropcompute_train::output::StagedOut;
use dropcompute_train::report::{RunMetadata, comparison_table};
use dropcompute_train::run as job_run;
use dropcompute_train::summary;

/// Arguments of `dropcompute train` (flag names are a stable interface).
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// World size: number of ranks, each a (mock) device [default: 32; with --launch env, the
    /// launcher's world size (WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS)].
    #[arg(long, allow_negative_numbers = true)]
    pub ranks: Option<u32>,
    /// Micro-batches per rank per step (gradient accumulation).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    pub micro_batches: u32,
    /// Samples per micro-batch [default: 8; --task text: 2 documents].
    #[arg(long, allow_negative_numbers = true)]
    pub micro_batch_size: Option<u32>,
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
    /// Initial parameters: a parameters file written by an earlier run's --out
    /// (params_<run>.safetensors; same model: data set and --hidden, or --text-model) instead of the seeded
    /// initialisation.
    #[arg(long, value_name = "FILE")]
    pub init_params: Option<PathBuf>,
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
    /// Latency noise (the factor on each micro-batch's device time): none,
    /// reference[:DELAY_FACTOR] (the reference's --delay_factor, default 1), lognormal:SIGMA,
    /// normal:CV, exponential:MEAN or seqlen:SAMPLES (the syntax of `simulate --noise`)
    /// [default: reference; --task text: none, so that all straggling is the data's].
    #[arg(long, allow_hyphen_values = true)]
    pub noise: Option<Noise>,
    /// Persistently slow rank, RANK:FACTOR (repeatable).
    #[arg(long, value_name = "RANK:FACTOR", allow_hyphen_values = true)]
    pub slow_rank: Vec<String>,
    /// Emulated latency of one micro-batch before noise, ms.
    #[arg(long, default_value_t = dropcompute_train::config::DEFAULT_BASE_LATENCY_MS, allow_negative_numbers = true)]
    pub base_latency_ms: f64,
    /// Deadline check semantics (default predictive). drop-before and drop-predictive fix
    /// their own check: a different --check with them is refused.
    #[arg(long, value_enum)]
    pub check: Option<CheckMode>,
    /// Step policy of the second run [default: drop-before or drop-predictive, following
    /// --check; --task text: cost-balance]. synchronous: threshold off; compute-budget: the threshold is the per-step
    /// budget, up to 2 x --micro-batches per rank; backup-workers: the --backup-workers ranks
    /// predicted slowest skip each step; rebalance(-drop): chronic stragglers get fewer
    /// micro-batches, the global batch kept (-drop: with the deadline).
    #[arg(long, value_enum)]
    pub policy: Option<dropcompute::policy::Policy>,
    /// b of --policy backup-workers: ranks predicted slowest that skip each step (< --ranks;
    /// default 1). Refused with any other policy.
    #[arg(long, allow_negative_numbers = true)]
    pub backup_workers: Option<u32>,
    /// The second compiled shape of the second run (`policy::TailShape`).
    #[command(flatten)]
    pub tail: super::TailArgs,
    /// Micro-batches the deadline check may lag behind the device (0 = none).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub sync_lag: u32,
    /// Gradient normalisation.
    #[arg(long, value_enum, default_value_t = Normalization::Realized)]
    pub normalization: Normalization,
    /// All-reduce bucket size, MiB.
    #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
    pub bucket_mb: f64,
    /// Learning rate: SGD's [default: 0.2]; --task text: AdamW's [default: 3e-3].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9, allow_negative_numbers = true)]
    pub momentum: f64,
    /// Hidden units of the MLP.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    pub hidden: u32,
    /// Classes of --data: labels must be integers in 0..CLASSES (an out-of-range, negative or
    /// non-integer label is an error naming file, line and column; exit 6). Without --data
    /// (the built-in digits, 10 classes) any other value is refused (exit 2).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(2..=i64::from(dropcompute_train::data::MAX_CLASSES)))]
    pub classes: u32,
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
    /// Mock device time: real (sleeps) or virtual (deterministic) [default: real; --task text:
    /// virtual, because the mock's host work for one text micro-batch (1 to 72 ms of CPU)
    /// exceeds its modelled device time (0.5 to 6.8 ms), so real time on a host with fewer
    /// cores than ranks would measure the host's CPU, not the device].
    #[arg(long, value_enum)]
    pub time_mode: Option<TimeMode>,
    /// Guardrails of `--threshold auto`, judged on the replay of the baseline run (the flags
    /// and defaults of `dropcompute tune`).
    #[command(flatten)]
    pub guardrails: super::GuardrailArgs,
    /// What to train: digits (the MLP on the UCI digits, held-out accuracy) or text (the
    /// byte-level transformer LM on the embedded corpus, one compiled recipe per length
    /// bucket, AdamW, held-out loss per token; tokens are the unit of work and a micro-batch's
    /// device time is its bucket's modelled cost).
    #[arg(long, value_enum, default_value_t = Task::Digits)]
    pub task: Task,
    /// --task text: the model size and buckets (default: 32-wide, 1 layer, buckets 64..512
    /// tokens; tiny: 8-wide, buckets 8 and 16, for tests).
    #[arg(long, value_enum)]
    pub text_model: Option<TextModelSize>,
    /// --task text: use only the first N documents of the embedded corpus (15217; more is
    /// refused). At least the fewest --holdout splits into one held-out and one training
    /// document (3 at the default 0.2), and enough training documents for one micro-batch
    /// (unit) per rank.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub text_documents: Option<u32>,
}

fn bad(flag: &'static str, value: impl ToString, why: impl Into<String>) -> ArgError {
    ArgError::new(flag, value, why)
}

/// A float as the user would type it: plain for moderate magnitudes, else scientific
/// (`1e300`, not 301 digits).
fn show(x: f64) -> String {
    habana_sys::show_f64(x)
}

/// Why a number of ms for `--threshold` is refused with `policy`, a policy without a deadline
/// (`Policy::has_deadline` false: synchronous, backup-workers, rebalance): it names `--policy`
/// and says what is accepted.
fn threshold_unused(policy: dropcompute::policy::Policy) -> String {
    format!(
        "--policy {policy} never uses a threshold (it runs without a deadline); give --threshold auto or off, or leave it out"
    )
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

impl Args {
    /// The step policy of the second run as given, else the task's default when it has one
    /// (`--task text`: cost-balance); `None`: the digits' default, DropCompute with the check
    /// of `--check`. The one rule of [`Args::validate`] and of `validate`'s grid.
    pub fn policy_or_task_default(&self) -> Option<dropcompute::policy::Policy> {
        self.policy.or((self.task == Task::Text).then_some(dropcompute::policy::Policy::CostBalance))
    }

    /// These arguments with `--ranks` taken from the launcher under `--launch env`
    /// (`hccl::bootstrap::Bootstrap::from_env`: torchrun, Open MPI, Slurm) when it is absent.
    /// Other launch modes: unchanged.
    ///
    /// # Errors
    /// [`TrainError::Bootstrap`] naming a bad launcher variable and its value;
    /// [`TrainError::Config`] when an explicit `--ranks` differs from the launcher's world
    /// size, naming both values and the launcher's variable.
    pub fn with_launcher_world_size(&self) -> Result<Self, TrainError> {
        let mut a = self.clone();
        if a.launch != Launch::Env {
            return Ok(a);
        }
        // from_lookup, not from_env: the rank's own join logs the bootstrap's warnings once.
        let b = dropcompute::hccl::bootstrap::Bootstrap::from_lookup(Default::default(), |k| std::env::var(k).ok())?;
        match a.ranks {
            None => a.ranks = Some(b.world_size),
            Some(r) if r != b.world_size => {
                return Err(TrainError::Config {
                    what: "--ranks",
                    value: format!("{r} but the launcher's world size is {} ({})", b.world_size, b.world_size_source()),
                });
            }
            Some(_) => {}
        }
        Ok(a)
    }

    /// Check every flag and build the [`TrainConfig`]. Pure: no I/O, no device.
    /// Errors: the first invalid flag, as [`ArgError`] (flag, value, requirement): a count of 0
    /// (`--ranks`, `--micro-batches`, `--micro-batch-size`, `--hidden`, `--steps`, `--epochs`),
    /// `--ranks` above [`MAX_RANKS`], a global batch overflowing u64, a bad `--threshold`, a NaN/inf/out-of-range float, `--slow-rank` with rank >= ranks, a repeated rank
    /// or a factor outside (0, [`MAX_SLOWDOWN`]], `--sync-lag` >= `--micro-batches`, a bucket
    /// below one f32 or above [`MAX_BUCKET_MB`], `--classes` other than the digits' 10 without
    /// `--data`.
    pub fn validate(&self) -> Result<TrainConfig, ArgError> {
        let text = self.task == Task::Text;
        let ranks = at_least_one("ranks", self.ranks.unwrap_or(if text { DEFAULT_TEXT_RANKS } else { DEFAULT_RANKS }))?;
        if ranks > MAX_RANKS {
            return Err(bad(
                "ranks",
                ranks,
                format!("must be <= {MAX_RANKS} (ranks of one host: threads or processes)"),
            ));
        }
        let micro_batches = at_least_one("micro-batches", self.micro_batches)?;
        if micro_batches > MAX_MICRO_BATCHES {
            return Err(bad("micro-batches", micro_batches, format!("must be <= {MAX_MICRO_BATCHES}")));
        }
        self.check_task()?;
        // The text job's own defaults (`DEFAULT_TEXT_*`): its straggling is the data's.
        let policy_arg = self.policy_or_task_default();
        let micro_batch_size = at_least_one(
            "micro-batch-size",
            self.micro_batch_size.unwrap_or(if text { DEFAULT_TEXT_MICRO_BATCH_SIZE } else { 8 }),
        )?;
        if micro_batch_size > MAX_MICRO_BATCH_SIZE {
            return Err(bad("micro-batch-size", micro_batch_size, format!("must be <= {MAX_MICRO_BATCH_SIZE}")));
        }
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
        let guardrails = self.guardrails.guardrails().map_err(|why| {
            // The one check (`Guardrails::validate`) names the flag: "--FLAG VALUE: why".
            let (flag, value) = [
                ("max-drop-rate", self.guardrails.max_drop_rate),
                ("min-batch-fraction", self.guardrails.min_batch_fraction),
                ("min-gain", self.guardrails.min_gain),
                ("jitter-ms", self.guardrails.jitter_ms),
            ]
            .into_iter()
            .find(|(f, _)| why.starts_with(&format!("--{f} ")))
            .unwrap_or(("max-drop-rate", self.guardrails.max_drop_rate));
            bad(flag, show(value), why.rsplit(": ").next().unwrap_or("out of range"))
        })?;
        // `--threshold auto` with a baseline tunes on the baseline's steps after warm-up: it
        // needs as many as `dropcompute tune` (tune::MIN_STEPS).
        // Only the policies with a deadline use the threshold (`synchronous`, `rebalance` and
        // `backup-workers` run with it off).
        let policy = policy_arg.unwrap_or(dropcompute::policy::Policy::DropPredictive);
        let uses_threshold = policy.has_deadline();
        if policy == dropcompute::policy::Policy::ComputeBudget && threshold == ThresholdArg::Off {
            return Err(bad("threshold", "off", "--policy compute-budget needs a budget: auto or a value in ms"));
        }
        // A number of ms with a policy that never runs a deadline was silently ignored ("threshold
        // off", exit 0); `auto` (the default) and `off` stay accepted: both mean no deadline there.
        if let (ThresholdArg::Ms(_), false) = (threshold, uses_threshold) {
            return Err(bad("threshold", self.threshold.trim(), threshold_unused(policy)));
        }
        if let (ThresholdArg::Auto, RunLength::Steps(s), false, true) =
            (threshold, length, self.no_compare, uses_threshold)
        {
            let tuned = s.saturating_sub(self.warmup_steps);
            if tuned < dropcompute::tune::MIN_STEPS as u64 {
                return Err(bad(
                    "steps",
                    s,
                    format!(
                        "--threshold auto tunes on the baseline's steps after the {} warm-up steps: {tuned} < the minimum {} (insufficient data); run more steps or give a threshold",
                        self.warmup_steps,
                        dropcompute::tune::MIN_STEPS
                    ),
                ));
            }
        }
        // Every policy x check combination has an effect or is refused (`--check before
        // --policy drop-predictive` ran the predictive check silently).
        let check = match policy_arg {
            Some(p) => p.resolve_check(self.check, CheckMode::Predictive).map_err(|own| {
                bad(
                    "check",
                    self.check.map_or("", CheckMode::name),
                    if self.policy.is_some() {
                        format!("--policy {p} runs the {own} check; give --check {own} or leave --check out")
                    } else {
                        format!(
                            "the {} task's default policy {p} runs the {own} check; give --check {own}, leave --check out, or give a --policy that runs it (e.g. drop-before)",
                            self.task.name()
                        )
                    }
                )
            })?,
            None => self.check.unwrap_or(CheckMode::Predictive),
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
        let backup_workers = self.backup_workers.unwrap_or(1);
        match (policy_arg, self.backup_workers) {
            (Some(dropcompute::policy::Policy::BackupWorkers), _) if backup_workers >= ranks => {
                return Err(bad("backup-workers", backup_workers, format!("must be < --ranks {ranks}")));
            }
            (Some(dropcompute::policy::Policy::BackupWorkers), _) | (_, None) => {}
            (p, Some(b)) => {
                let p = p.map_or("the default (drop-predictive)".to_owned(), |p| p.name().to_owned());
                return Err(bad("backup-workers", b, format!("only with --policy backup-workers (the policy is {p})")));
            }
        }
        let tail = self.tail.tail_for(Some(micro_batch_size)).map_err(|e| bad(e.flag, e.value, e.why))?;
        if self.sync_lag >= micro_batches {
            return Err(bad("sync-lag", self.sync_lag, format!("must be < --micro-batches {micro_batches}")));
        }
        let mb = positive("bucket-mb", self.bucket_mb)?;
        let bucket_bytes = (mb * BYTES_PER_MB).round();
        if !(4.0..=MAX_BUCKET_MB * BYTES_PER_MB).contains(&bucket_bytes) {
            return Err(bad("bucket-mb", show(mb), format!("must hold one f32 (4 bytes) and be <= {MAX_BUCKET_MB}")));
        }
        let lr = positive("lr", self.lr.unwrap_or(if text { DEFAULT_TEXT_LR } else { 0.2 }))?;
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return Err(bad("momentum", show(self.momentum), "must be in [0, 1)"));
        }
        let hidden = at_least_one("hidden", self.hidden)?;
        // --classes describes --data; the built-in digits have their own (refused rather than
        // silently ignored).
        if self.data.is_none() && self.classes != dropcompute_train::data::DIGITS_CLASSES {
            return Err(bad(
                "classes",
                self.classes,
                format!(
                    "applies to --data only; the built-in digits have {} classes",
                    dropcompute_train::data::DIGITS_CLASSES
                ),
            ));
        }
        if hidden > MAX_HIDDEN {
            return Err(bad("hidden", hidden, format!("must be <= {MAX_HIDDEN}")));
        }
        if !(self.holdout.is_finite() && self.holdout > 0.0 && self.holdout < 1.0) {
            return Err(bad("holdout", show(self.holdout), "must be in (0, 1)"));
        }
        let drop_guard = self.guardrails.drop_guard().map_err(|_| {
            bad("drop-guard", self.guardrails.drop_guard.map_or_else(String::new, show), "must be a fraction in (0, 1]")
        })?;
        if let (Some(g), true) = (drop_guard, text) {
            return Err(bad("drop-guard", show(g), "digits task only (the text task counts tokens)"));
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
            init_params: self.init_params.clone(),
            launch: self.launch,
            out: self.out.clone(),
            resume: self.resume.clone(),
            compare: !self.no_compare,
            noise: self.noise.clone().unwrap_or(self.task.default_noise()),
            slow_ranks,
            // In (0, 1 h] by the check above, so the conversion cannot overflow.
            base_latency: Duration::from_secs_f64(base_ms / 1e3),
            check,
            policy: policy_arg,
            backup_workers,
            tail,
            sync_lag: self.sync_lag,
            normalization: self.normalization,
            bucket_bytes: bucket_bytes as u64,
            lr,
            momentum: self.momentum,
            hidden,
            classes: self.classes,
            holdout: self.holdout,
            warmup_steps: self.warmup_steps,
            drop_guard,
            checkpoint_every: NonZeroU64::new(self.checkpoint_every),
            checkpoint_dir: self
                .checkpoint_dir
                .clone()
                .or_else(|| self.resume.clone())
                .unwrap_or_else(|| PathBuf::from("dropcompute-checkpoints")),
            checkpoint_asked: self.checkpoint_every > 0 || self.checkpoint_dir.is_some() || self.resume.is_some(),
            time_mode: self.time_mode.unwrap_or(self.task.default_time_mode()),
            guardrails,
            task: self.task,
            text: TextTask { model: self.text_model.unwrap_or_default(), documents: self.text_documents },
        })
    }

    /// The flags that do not apply to `--task`, refused rather than ignored: with the text
    /// task, the digits' data and model flags (`--data`, `--classes`, `--hidden`,
    /// `--momentum`), `--base-latency-ms` (a text micro-batch costs its
    /// bucket's modelled time); with the digits, the text flags. A flag at its default counts as not
    /// given (as `--classes` without `--data`).
    fn check_task(&self) -> Result<(), ArgError> {
        let text = self.task == Task::Text;
        let not_text = |flag: &'static str, value: String| {
            Err(bad(flag, value, "does not apply to --task text (the digits MLP's flag)"))
        };
        if !text {
            if let Some(m) = self.text_model {
                return Err(bad("text-model", m.name(), "applies to --task text only"));
            }
            if let Some(n) = self.text_documents {
                return Err(bad("text-documents", n, "applies to --task text only"));
            }
            return Ok(());
        }
        if let Some(d) = &self.data {
            return not_text("data", d.display().to_string());
        }
        if self.classes != dropcompute_train::data::DIGITS_CLASSES {
            return not_text("classes", self.classes.to_string());
        }
        if self.hidden != 128 {
            return not_text("hidden", self.hidden.to_string());
        }
        if self.momentum != 0.9 {
            return not_text("momentum", show(self.momentum));
        }
        if self.base_latency_ms != dropcompute_train::config::DEFAULT_BASE_LATENCY_MS {
            return Err(bad(
                "base-latency-ms",
                show(self.base_latency_ms),
                "does not apply to --task text: a micro-batch costs its length bucket's modelled device time",
            ));
        }
        // `--text-documents`' range depends on the corpus and `--holdout`: checked once the
        // corpus is loaded (`TextJob::prepare`, before any device call; exit 2 naming it).
        Ok(())
    }
}

/// `--micro-batch-size` of `--task text` when absent: documents per micro-batch (the measured
/// default size, `transformer_train::TextTrainConfig::default`).
pub const DEFAULT_TEXT_MICRO_BATCH_SIZE: u32 = 2;
/// `--ranks` of `--task text` when absent: 16, the smaller of issue 26's two world sizes, so
/// that the default run (baseline and policy, 60 steps) takes about a minute and a half of
/// interpreter time on a 2-core machine.
pub const DEFAULT_TEXT_RANKS: u32 = 16;
/// `--lr` of `--task text` when absent: AdamW's (`transformer::AdamW::default`).
pub const DEFAULT_TEXT_LR: f64 = 3e-3;

/// Runs `dropcompute train`: validates the flags, runs the job (baseline and DropCompute, or
/// DropCompute only), prints the comparison table on rank 0 and writes `--out` atomically.
///
/// # Errors
/// [`TrainError`]: `Args` for a bad flag (before any device call), and the job's data, device,
/// collective, checkpoint, output and interrupt errors.
pub fn run(a: &Args) -> Result<(), TrainError> {
    let start = std::time::SystemTime::now();
    // Stop signals are recorded from the start: a read of an input FIFO no one writes (in the
    // validation below) then ends on SIGINT/SIGTERM with exit 130 (`dropcompute::input`).
    dropcompute::signals::install();
    // Pure validation first: bad flags, environment, data and --out fail before any device call.
    let cfg = a.with_launcher_world_size()?.validate()?;
    dropcompute::environment::check(dropcompute::environment::Subcommand::Train)?;
    let out = cfg.out.as_ref().map(|d| StagedOut::new(d)).transpose()?;
    let launch = cfg.launch;
    let job = Job::prepare(cfg)?;
    let rt = job_run::runtime(&job)?;
    let show = std::io::stderr().is_terminal();
    let (rank, outcomes) = job_run::run(&job, &rt, launch, show)?;
    if rank != 0 {
        return Ok(());
    }
    job_run::check_lockstep(&outcomes)?;
    let meta = RunMetadata::new(&job.cfg, backend_name(rt.api()), start);
    let predicted = summary::job_prediction(&job, &outcomes);
    let rep = summary::report(&job, &outcomes, meta, predicted.as_ref())?;
    // The outputs are in place before anything is written to the terminal: a closed or full
    // stdout then loses no result.
    let wrote = match out {
        Some(out) => {
            summary::write_outputs(&out, &job, &rep, &outcomes, predicted.as_ref())?;
            let done = out.commit()?;
            let dir = job.cfg.out.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
            let mut said = String::new();
            if !done.removed.is_empty() {
                let names: Vec<String> = done
                    .removed
                    .iter()
                    .filter_map(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect();
                said += &format!(
                    "removed {} files of an earlier run from {dir}: {}\n",
                    done.removed.len(),
                    names.join(", ")
                );
            }
            said += &format!("wrote {} files to {dir}\n", done.files.len());
            Some(said)
        }
        None => None,
    };
    let mut text = format!("{}\n{}", comparison_table(&rep), rep.stragglers.table());
    if let Some(dc) = outcomes[0].last() {
        text += &format!("threshold: {}\n", dc.threshold_source);
    }
    if job.cfg.time_mode == TimeMode::Virtual {
        text += "virtual time: wall time and rates are in device (virtual) seconds\n";
    }
    if rep.predicted_speedup.is_none() && rep.baseline.is_none() {
        text += "predicted speedup: needs the baseline run's latencies (--compare)\n";
    }
    text += wrote.as_deref().unwrap_or_default();
    Ok(dropcompute::console::out(&text)?)
}

/// The backend of report.json's metadata: "cpu-mock (in-process)" or "Synapse at PATH".
pub(crate) fn backend_name(api: &habana_sys::SynapseApi) -> String {
    match api.origin() {
        habana_sys::ApiOrigin::InProcess(name) => format!("{name} (in-process)"),
        habana_sys::ApiOrigin::Library(p) => format!("Synapse at {}", p.display()),
    }
}

/// One rank process of `train --launch processes` (see `dropcompute::launch`): runs the rank its
/// parent's spec describes.
///
/// # Errors
/// [`TrainError`] of the rank: a spec that is not a train job, and the job's own errors.
pub fn child(spec: &ChildSpec) -> Result<(), TrainError> {
    dropcompute::signals::install();
    job_run::run_child(spec)
}

#[cfg(test)]
#[path = "train_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "train_report_tests.rs"]
mod report_tests;
