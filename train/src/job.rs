//! The job description of `train`: the validated inputs every rank shares ([`Job`]), the runs
//! it plans ([`RunKind`]) and what a rank measured in one run ([`RankOutcome`], also the JSON
//! result of a rank process).
//!
//! Owns: loading and splitting the data, the initial parameters, the resume step, the mock
//! configuration of a job, the checkpoint fingerprint and how `--threshold auto` recommends
//! ([`Job::auto_recommend`]). Must not touch: devices, collectives, the step loop or outputs.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use dropcompute::mock::config::TimeMode;
use dropcompute::mock::{DeviceOverride, MockConfig};
use dropcompute::policy::Threshold;
use dropcompute::schedule::{DropLedger, StepReport, StragglerTracker};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::tune::Recommend;

use super::config::{RunLength, TrainConfig};
use super::data::Dataset;
use super::error::TrainError;
use super::mlp::{self, MlpShape};

/// Validated inputs shared by every rank: the configuration, the train/held-out split, the
/// model shape and the initial parameters (identical on every rank: seeded).
#[derive(Debug, Clone)]
pub struct Job {
    /// The validated configuration.
    pub cfg: TrainConfig,
    /// Training samples.
    pub train: Arc<Dataset>,
    /// Held-out samples (accuracy).
    pub holdout: Arc<Dataset>,
    /// input x hidden x classes.
    pub shape: MlpShape,
    /// Initial parameters (He init from the seed).
    pub init: Vec<f32>,
    /// `--resume`: the step every rank resumes the DropCompute run from.
    pub resume_step: Option<u64>,
    /// The text task's inputs (`--task text`; `None` for digits). A text job has empty
    /// [`Job::train`] / [`Job::holdout`] data sets and a zero [`Job::shape`]: its model, data and
    /// parameters are here.
    pub text: Option<Arc<super::text_job::TextJob>>,
}

/// The serialized form of a [`Job`] handed to a rank process (JSON inside the
/// `dropcompute::launch::ChildSpec`): the parent's validated configuration and its choices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The parent's validated configuration (every flag, `--resume` and `--checkpoint-dir`
    /// included).
    pub cfg: TrainConfig,
    /// The step the parent chose to resume from ([`Job::resume_step`]).
    pub resume_step: Option<u64>,
}

impl Job {
    /// Loads and splits the data (embedded digits or `cfg.data`), initializes the model and,
    /// with `--resume`, picks the checkpoint step every rank has. No device or network call.
    ///
    /// # Errors
    /// [`TrainError::Data`] for an unreadable or malformed file (file and line);
    /// [`TrainError::Model`] for an impossible shape; [`TrainError::Checkpoint`] when `--resume`
    /// finds no step readable for every rank.
    pub fn prepare(cfg: TrainConfig) -> Result<Self, TrainError> {
        let mut job = Self::load(cfg)?;
        if let Some(dir) = job.cfg.resume.clone() {
            let s0 = super::ckpt::common_step(&dir, job.cfg.ranks)?;
            if let RunLength::Steps(s) = job.cfg.length
                && s <= s0
            {
                return Err(TrainError::Config {
                    what: "--steps",
                    value: format!("{s}: the checkpoint in {} is already at step {s0}; nothing to do", dir.display()),
                });
            }
            job.resume_step = Some(s0);
            job.check_resumed_threshold(&dir, s0)?;
        } else {
            job.check_auto_epochs()?;
            // A policy without a deadline runs with the threshold off: `auto` asks nothing of it
            // (its refusal advised a threshold in ms, which `train` refuses for that policy).
            if job.cfg.threshold == super::config::ThresholdArg::Auto
                && !job.cfg.compare
                && job.replays_policy()
                && job.cfg.policy().has_deadline()
            {
                return Err(job.auto_without_baseline_error());
            }
        }
        Ok(job)
    }

    /// `--threshold auto --no-compare` with a policy the replay runs: refused before any
    /// device call by [`Job::prepare`] (it was found by the ranks after the devices and the
    /// communicator were up), and by the run itself for a job built otherwise.
    pub fn auto_without_baseline_error(&self) -> TrainError {
        TrainError::Config {
            what: "--threshold auto",
            value: format!(
                "without a baseline run (--no-compare) it tunes in-run on whole micro-batch latencies as DropCompute, not on the replay of --policy {}{}; give a threshold in ms, or run the baseline",
                self.cfg.policy(),
                if self.cfg.tail.enabled() {
                    format!(" --tail-split {}", self.cfg.tail.parts())
                } else {
                    String::new()
                }
            ),
        }
    }

    /// `--threshold auto` tunes on the baseline's steps after warm-up and needs
    /// `tune::MIN_STEPS` of them. For `--steps` the flags say so (checked in the CLI's
    /// validation); for `--epochs` the count depends on the data, so it is checked here, once
    /// the data is loaded and before any device call (it was found only after the baseline
    /// ran). The same conditions as the run's own check: a baseline (`--compare`), a policy
    /// that uses the threshold. The data are the job's units ([`Job::units_described`]: the
    /// digits' samples, the text plan's units; the text job counted the digits' empty set and
    /// refused every `--epochs` run).
    ///
    /// # Errors
    /// [`TrainError::Config`] naming `--epochs`, the baseline's steps and the warm-up.
    fn check_auto_epochs(&self) -> Result<(), TrainError> {
        let c = &self.cfg;
        let p = c.policy();
        let uses_threshold = p.drops() || p == dropcompute::policy::Policy::ComputeBudget;
        let (RunLength::Epochs(e), super::config::ThresholdArg::Auto, true, true) =
            (c.length, c.threshold, c.compare, uses_threshold)
        else {
            return Ok(());
        };
        let steps = self.baseline_epoch_steps();
        let tuned = steps.saturating_sub(c.warmup_steps);
        if tuned < dropcompute::tune::MIN_STEPS as u64 {
            return Err(TrainError::Config {
                what: "--epochs",
                value: format!(
                    "{e}: the baseline runs {steps} step(s) ({} x {e} epoch(s), {} per step), {tuned} after the {} warm-up steps; --threshold auto needs at least {} (insufficient data): run more epochs, a smaller global batch, or give a threshold",
                    self.units_described(),
                    self.baseline_step_ids(),
                    c.warmup_steps,
                    dropcompute::tune::MIN_STEPS
                ),
            });
        }
        Ok(())
    }

    /// Ids ([`Job::units`]) the baseline deals per step: ranks x M micro-batches, each S parts
    /// of [`Job::part_size`] ids (S the tail split; the baseline merges S parts): ranks x M x b
    /// samples for the digits, ranks x M x S plan units for the text job.
    pub fn baseline_step_ids(&self) -> u64 {
        u64::from(self.cfg.ranks)
            * u64::from(self.cfg.micro_batches)
            * u64::from(self.cfg.tail.parts())
            * self.part_size() as u64
    }

    /// Steps of the synchronous baseline of an `--epochs` run: the job's one stream
    /// ([`Job::replay_stream`], the run's `RunData::global` of the same ids and parts) dealt
    /// M whole micro-batches (M x S parts) per rank per step, every one started, until a step
    /// deals nothing.
    fn baseline_epoch_steps(&self) -> u64 {
        use dropcompute::sim::policies::ReplayData;
        let mut stream = self.replay_stream();
        let assignment = vec![self.cfg.micro_batches * self.cfg.tail.parts(); self.cfg.ranks as usize];
        let mut steps = 0;
        while let Some(counts) = stream.deal(steps, &assignment) {
            stream.settle(&counts);
            steps += 1;
        }
        steps as u64
    }

    /// A resumed run continues at its checkpoint's threshold (the scheduler's state), so a
    /// `--threshold` given as `off` or in ms must be that one: refused when it differs (it
    /// printed "threshold: off" and ran the checkpoint's 120 ms: issue 24). `auto` keeps the
    /// checkpoint's and says so.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming `--threshold`, both values and the directory; the
    /// checkpoint's own errors (rank 0's file at `step`).
    fn check_resumed_threshold(&self, dir: &std::path::Path, step: u64) -> Result<(), TrainError> {
        if self.cfg.threshold == super::config::ThresholdArg::Auto {
            return Ok(());
        }
        let (meta, _) = super::ckpt::load(&self.fingerprint(), self.param_len(), dir, 0, step)?;
        let saved = Threshold::from_ns(meta.scheduler.threshold_ns);
        let given = self.cfg.threshold.fixed().map_or(Threshold::Off, Threshold::Fixed);
        let show = |t: Threshold| t.as_ms().map_or("off".to_owned(), |ms| format!("{ms} ms"));
        if saved != given {
            return Err(TrainError::Config {
                what: "--threshold",
                value: format!(
                    "{}: the checkpoint in {} (step {step}) runs at {}, and a resumed run keeps its threshold; give --threshold auto (the checkpoint's) or {}",
                    show(given),
                    dir.display(),
                    show(saved),
                    show(saved).replace(" ms", "")
                ),
            });
        }
        Ok(())
    }

    /// What a rank process needs to rebuild this job exactly: the validated configuration and
    /// the choice the parent made from its disk (the resume step).
    pub fn spec(&self) -> JobSpec {
        JobSpec { cfg: self.cfg.clone(), resume_step: self.resume_step }
    }

    /// The job of a rank process: [`Job::prepare`]'s data and model from `spec.cfg`, with the
    /// parent's resume step (not re-read from this process's disk).
    ///
    /// # Errors
    /// As [`Job::prepare`], except that no checkpoint directory is read here;
    /// [`TrainError::Config`] for guardrails outside [0, 1] or a resume step with no
    /// `--resume` directory.
    pub fn from_spec(spec: JobSpec) -> Result<Self, TrainError> {
        if let Err(value) = spec.cfg.guardrails.validate() {
            return Err(TrainError::Config { what: "guardrails", value: format!("{value} (parent job spec)") });
        }
        if spec.resume_step.is_some() && spec.cfg.resume.is_none() {
            return Err(TrainError::Config {
                what: "--resume",
                value: "a resume step without a directory (parent job spec)".into(),
            });
        }
        let mut job = Self::load(spec.cfg)?;
        job.resume_step = spec.resume_step;
        Ok(job)
    }

    /// Data, split, shape and initial parameters of `cfg`; no checkpoint read.
    fn load(cfg: TrainConfig) -> Result<Self, TrainError> {
        if cfg.task == super::config::Task::Text {
            let text = super::text_job::TextJob::prepare(&cfg)?;
            let none = || Arc::new(Dataset { features: Vec::new(), labels: Vec::new(), dim: 0, classes: 0 });
            return Ok(Self {
                init: text.init.clone(),
                train: none(),
                holdout: none(),
                shape: MlpShape { input: 0, hidden: 0, classes: 0 },
                resume_step: None,
                text: Some(Arc::new(text)),
                cfg,
            });
        }
        let all = match &cfg.data {
            Some(p) => Dataset::load(p, cfg.classes)?,
            None => Dataset::embedded_digits()?,
        };
        // A split that leaves no training sample names the flag (the data module's error
        // names neither flag nor file).
        let (train, holdout) = all.split(cfg.holdout, cfg.seed).map_err(|e| match e {
            super::data::DataError::InvalidSplit { .. } => TrainError::Config {
                what: "--holdout",
                value: format!(
                    "{}: holds out {} of the {} samples, leaving none to train on; give a smaller --holdout",
                    cfg.holdout,
                    super::data::held_out_count(all.len(), cfg.holdout),
                    all.len()
                ),
            },
            other => other.into(),
        })?;
        let shape = MlpShape { input: all.dim, hidden: cfg.hidden as usize, classes: all.classes };
        let init = match &cfg.init_params {
            Some(p) => super::params::load_for(p, shape)?,
            None => mlp::init_params(shape, cfg.seed)?,
        };
        let job = Self {
            cfg,
            train: Arc::new(train),
            holdout: Arc::new(holdout),
            shape,
            init,
            resume_step: None,
            text: None,
        };
        if job.holdout.is_empty() || job.train.len() < job.cfg.ranks as usize {
            return Err(TrainError::Config {
                what: "--holdout",
                value: format!(
                    "{}: leaves {} training and {} held-out samples of {} for {} ranks",
                    job.cfg.holdout,
                    job.train.len(),
                    job.holdout.len(),
                    all.len(),
                    job.cfg.ranks
                ),
            });
        }
        Ok(job)
    }

    /// The runs of this job in order: the baseline (threshold off) when comparing, then
    /// DropCompute. A resumed job continues the DropCompute run only.
    pub fn plan(&self) -> Vec<RunKind> {
        let mut v = Vec::new();
        if self.cfg.compare && self.resume_step.is_none() {
            v.push(RunKind::Baseline);
        }
        v.push(RunKind::DropCompute);
        v
    }

    /// The settings a checkpoint of this job is only valid for (stored in every checkpoint and
    /// compared on `--resume`).
    pub fn fingerprint(&self) -> String {
        use dropcompute::policy::Policy;
        let c = &self.cfg;
        // The step policy when it is not the DropCompute of `check` (which `check` already
        // names, so checkpoints written before `--policy` existed still resume).
        let policy = match c.policy() {
            Policy::DropBefore | Policy::DropPredictive => String::new(),
            Policy::BackupWorkers => format!(" policy=backup-workers:{}", c.backup_workers),
            p => format!(" policy={}", p.name()),
        };
        let tail = match c.tail {
            t if !t.enabled() => String::new(),
            t => format!(" tail={}:{}", t.parts(), t.cost_fraction()),
        };
        // The drop-rate guard's counts are in the checkpoint: a resumed run keeps its bound.
        let guard = c.drop_guard.map_or(String::new(), |g| format!(" drop_guard={g}"));
        // The text task: its model's sizes and buckets, and the training units it deals (the
        // digits' fields `hidden`, `momentum` and `train` are its defaults and 0 there).
        let text = match &self.text {
            Some(t) => format!(
                " task=text model={}:{} units={}",
                t.model.tag(),
                t.buckets.lengths().iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                t.plan.units()
            ),
            None => String::new(),
        };
        format!(
            "ranks={} m={} b={} seed={} params={} hidden={} check={:?} lag={} norm={:?} lr={} momentum={} train={}{policy}{tail}{text}{guard}",
            c.ranks,
            c.micro_batches,
            c.micro_batch_size,
            c.seed,
            self.param_len(),
            c.hidden,
            c.check,
            c.sync_lag,
            c.normalization,
            c.lr,
            c.momentum,
            self.train.len()
        )
    }

    /// How the DropCompute run executes the deadline: this job's check mode, sync lag,
    /// warm-up and drop-rate guard, one micro-batch always computed (the scheduler's policy in
    /// `run`).
    pub fn execution(&self) -> ExecutionModel {
        ExecutionModel {
            check: self.cfg.check,
            sync_lag: self.cfg.sync_lag,
            warmup_steps: self.cfg.warmup_steps,
            min_micro_batches: 1,
            drop_guard: self.cfg.drop_guard,
        }
    }

    /// True when the second run is replayed by the policy replay (`sim::policies`: its
    /// `--threshold auto` and its prediction) rather than DropCompute's (`tune::recommend`,
    /// `sim::replay`): `rebalance`, `rebalance-drop`, `compute-budget`, `backup-workers`,
    /// `cost-balance`
    /// (the replay runs the scheduler's predicted variant: the one assignment step), and
    /// `length-predictive` (its per-bucket check): the policies that move work
    /// (`Policy::moves_work`), the length-aware ones (`Policy::length_aware`), and any policy
    /// with a tail shape (`tune::policies::tunes_on_policy_replay`).
    pub fn replays_policy(&self) -> bool {
        dropcompute::tune::policies::tunes_on_policy_replay(&dropcompute::policy::StepPolicy {
            tail: self.cfg.tail,
            ..dropcompute::policy::StepPolicy::new(self.cfg.policy())
        })
    }

    /// The step policy a run of `kind` runs: synchronous for the baseline, the job's policy
    /// for the second run.
    pub fn policy_of(&self, kind: RunKind) -> dropcompute::policy::Policy {
        match kind {
            RunKind::Baseline => dropcompute::policy::Policy::Synchronous,
            RunKind::DropCompute => self.cfg.policy(),
        }
    }

    /// The second run as `sim::policies::replay_policy` replays it at `threshold`
    /// (`tune::policies::train_run` with this job's policy, b, tail shape, seed and
    /// [`Job::execution`]). Also the search template of `--threshold auto`.
    pub fn policy_run(&self, threshold: Threshold) -> dropcompute::sim::policies::PolicyRun {
        let mut run = dropcompute::tune::policies::train_run(
            self.cfg.policy(),
            self.cfg.backup_workers,
            self.cfg.tail,
            self.cfg.seed,
            threshold,
            self.execution(),
        );
        run.params.bucket_tokens = self.bucket_tokens();
        run
    }

    /// `cost-balance`'s padded length prior for the buckets not measured yet
    /// (`policy::BucketTokens`; the scheduler's `set_policy` and [`Job::policy_run`] both carry
    /// it): each bucket's length times the documents of a whole micro-batch (b), tokens. Empty
    /// for the digits task (no buckets).
    pub fn bucket_tokens(&self) -> dropcompute::policy::BucketTokens {
        let tokens = |t: &super::text_job::TextJob| -> Vec<u64> {
            t.buckets.lengths().iter().map(|&l| u64::from(l) * u64::from(t.rows)).collect()
        };
        self.text.as_deref().and_then(|t| dropcompute::policy::BucketTokens::new(&tokens(t))).unwrap_or_default()
    }

    /// How `--threshold auto` recommends a threshold on the baseline run's trace (all its steps,
    /// warm-up included): replayed as the DropCompute run will execute ([`Job::execution`]),
    /// judged by the job's guardrails (`--max-drop-rate`, `--min-batch-fraction`,
    /// `--min-gain`).
    pub fn auto_recommend(&self) -> Recommend {
        Recommend { execution: self.execution(), guardrails: self.cfg.guardrails }
    }

    /// Micro-batch slots per rank of the second run when its policy moves micro-batches
    /// between ranks (`Policy::moves_work`): `policy::StepPolicy::budget_cap(M)` = 2·M,
    /// the most one rank may be handed (a rebalanced assignment above it is not applied).
    pub fn slots(&self) -> u32 {
        dropcompute::policy::StepPolicy::new(self.cfg.policy()).budget_cap(self.cfg.micro_batches)
    }

    /// Micro-batch slots per rank of a run of `kind` (the width of its latency matrix): M for
    /// the baseline and the policies that keep M per rank, else [`Job::slots`].
    pub fn slots_of(&self, kind: RunKind) -> u32 {
        if kind == RunKind::DropCompute && self.cfg.policy().moves_work() {
            self.slots()
        } else {
            self.cfg.micro_batches
        }
    }

    /// What the job's dealer deals one id per: training samples (digits) or bucket-plan units
    /// of b/S documents (text, `text_job::TextJob::plan`).
    pub fn units(&self) -> u64 {
        match &self.text {
            Some(t) => t.plan.units(),
            None => self.train.len() as u64,
        }
    }

    /// The job's units as every message names them, count first ([`Job::units`],
    /// `config::Task::units_name`): "1438 training samples" (digits), "40 training units of 4
    /// documents" (text: bucket-plan units of b/S documents, a bucket's last one short).
    pub fn units_described(&self) -> String {
        let n = self.units();
        match &self.text {
            Some(t) => format!(
                "{} of {}",
                super::config::counted(n, self.cfg.task.units_name()),
                super::config::counted(u64::from(t.unit_rows), "documents")
            ),
            None => super::config::counted(n, self.cfg.task.units_name()),
        }
    }

    /// Ids per dealt part: b/S samples (digits; S the tail split), or one plan unit, itself
    /// b/S documents (text).
    pub fn part_size(&self) -> usize {
        match &self.text {
            Some(_) => 1,
            None => (self.cfg.micro_batch_size / self.cfg.tail.parts()) as usize,
        }
    }

    /// Length of the flat parameter (and gradient) vector, f32 values.
    pub fn param_len(&self) -> usize {
        match &self.text {
            Some(t) => t.model.param_len(),
            None => self.shape.param_len(),
        }
    }

    /// The stream this job's second run deals (its samples, seed, parts of b/S, epochs or
    /// steps), as `run` builds it: the data model of the job's prediction
    /// (`dropcompute::deal::ReplayStream`); for the text job with every unit's bucket and
    /// tokens, so the replay knows what it deals and counts tokens.
    pub fn replay_stream(&self) -> dropcompute::deal::ReplayStream {
        let stream = dropcompute::deal::ReplayStream::new(
            self.units(),
            self.cfg.seed,
            self.part_size(),
            self.max_epochs(),
            self.steps(),
        );
        match &self.text {
            // The text job's units: their buckets and tokens (`text::BucketPlan::part_shapes`).
            Some(t) => stream.with_shapes(t.plan.part_shapes()),
            None => stream,
        }
    }

    /// Every rank's baseline reports as `rank0` (rank 0's), with each micro-batch's bucket and
    /// tokens as the job's stream deals them to that rank (`replay_stream`: the baseline hands
    /// every rank its M whole micro-batches, a micro-batch the merge of its `--tail-split`
    /// parts, `PartShape::merged`): what `schedule::auto::with_report_lengths` reads from every
    /// rank's reports, for a rank that holds only its own (rank processes). Only the buckets
    /// and tokens of rank r's copy are rank r's; the rest is rank 0's. Empty for the digits
    /// job (no shapes), or when the stream ends before a report's step or a report is not of
    /// M whole micro-batches (then the tuner stays blind, as without peers).
    pub fn stream_peer_reports(&self, rank0: &[StepReport]) -> Vec<Vec<StepReport>> {
        use dropcompute::sim::policies::{PartShape, ReplayData};
        if self.text.is_none() {
            return Vec::new();
        }
        let (n, m) = (self.cfg.ranks as usize, self.cfg.micro_batches as usize);
        let split = self.cfg.tail.parts() as usize;
        let mut stream = self.replay_stream();
        let mut peers: Vec<Vec<StepReport>> = vec![Vec::with_capacity(rank0.len()); n];
        for (index, rep) in rank0.iter().enumerate() {
            if rep.step != index as u64 || rep.micro_batches.len() != m || rep.micro_batches.iter().any(|x| x.dropped) {
                return Vec::new();
            }
            let Some(dealt) = stream.deal(index, &vec![(m * split) as u32; n]) else { return Vec::new() };
            if dealt.iter().any(|&c| c as usize != m * split) {
                return Vec::new();
            }
            for (r, reports) in peers.iter_mut().enumerate() {
                let mut mine = rep.clone();
                for (j, mb) in mine.micro_batches.iter_mut().enumerate() {
                    let shape = PartShape::merged((j * split..(j + 1) * split).map(|k| stream.part_shape(r, k)));
                    mb.bucket = shape.map(|s| s.bucket);
                    mb.tokens = shape.map(|s| s.tokens);
                }
                reports.push(mine);
            }
            stream.settle(&dealt);
        }
        peers
    }

    /// Epochs after which a run's data stream ends, `None` for a run of `--steps` steps.
    pub fn max_epochs(&self) -> Option<u64> {
        match self.cfg.length {
            RunLength::Epochs(e) => Some(u64::from(e)),
            RunLength::Steps(_) => None,
        }
    }

    /// Steps of a run, `None` for an epoch-bounded run.
    pub fn steps(&self) -> Option<u64> {
        match self.cfg.length {
            RunLength::Steps(s) => Some(s),
            RunLength::Epochs(_) => None,
        }
    }

    /// The mock configuration of this job for a process whose ranks acquire modules
    /// `0..ranks`: `$DROPCOMPUTE_MOCK_CONFIG`/`$DROPCOMPUTE_MOCK_DEVICES` as a base (devices
    /// raised to the world size unless `$DROPCOMPUTE_MOCK_DEVICES` fixes it), the chosen time
    /// mode, seed, noise and slow ranks, and `--base-latency-ms` as the base latency of the
    /// forward/backward graph recipe (`MockConfig::graph_base_latency_ns`, keyed by
    /// [`super::model_graphs::forward_backward_recipe_name`]): one micro-batch costs that much
    /// emulated device time before noise and slowdown, as before the model became a graph. Every
    /// other graph (the SGD step, the scheduler's gradient graphs) keeps the mock's per-node
    /// cost model (microseconds). This is the only place the flag acts: it describes the
    /// emulated device and has no meaning on a real one. A text job (`--task text`) sets no
    /// base latency: each bucket's recipe costs what the per-node model says (its device time
    /// follows its length), and a tail recipe draws the noise of its whole recipe.
    ///
    /// # Errors
    /// [`TrainError::Config`] when `$DROPCOMPUTE_MOCK_DEVICES` has fewer devices than ranks or
    /// the mock environment is invalid.
    pub fn mock_config(&self) -> Result<MockConfig, TrainError> {
        let mut m = MockConfig::from_env_for_ranks(self.cfg.ranks)
            .map_err(|e| TrainError::Config { what: "mock environment", value: e.why })?;
        m.time_mode = self.cfg.time_mode;
        m.seed = self.cfg.seed;
        m.noise = self.cfg.noise.clone();
        if let Some(t) = &self.text {
            // The text task: every bucket recipe keeps the per-node cost model (no base
            // latency). Every recipe of the job (each bucket's, whole and tail) draws its noise
            // as the first bucket's whole recipe: a launch's noise factor is a function of
            // (seed, module, step, micro-batch) only, whatever bucket lands there, so the
            // baseline and a policy that deals other units to a position see the same device
            // conditions there (common random numbers; the replay scales the recorded latency
            // of a position to the dealt unit's bucket). The default model computes at the text
            // device model's rate (`text_device`) unless `$DROPCOMPUTE_MOCK_CONFIG` sets
            // `graph_gflops`; the tests' tiny model keeps the mock's rate.
            if let Some(r) = text_graph_gflops(self.cfg.text.model, &t.model, &MockConfig::set_by_env()) {
                m.graph_gflops = r;
            }
            m.graph_noise_alias.extend(text_noise_aliases(&t.model, t.buckets.lengths(), t.rows, self.cfg.tail));
            self.slow_ranks_into(&mut m);
            return Ok(m);
        }
        let b = self.cfg.micro_batch_size as usize;
        let fwd = super::model_graphs::forward_backward_recipe_name(self.shape, b);
        let base_ns = u64::try_from(self.cfg.base_latency.as_nanos()).unwrap_or(u64::MAX);
        let tail = self.cfg.tail;
        if tail.enabled() {
            // The tail shape's recipe: cost × the whole one's device time, drawing the noise of
            // the whole micro-batch it is cut from (common random numbers with the replay,
            // which models a tail as cost × that micro-batch's latency).
            let name = super::model_graphs::forward_backward_recipe_name(self.shape, b / tail.parts() as usize);
            m.graph_base_latency_ns.insert(name.clone(), (base_ns as f64 * tail.cost_fraction()).round() as u64);
            m.graph_noise_alias.insert(name, fwd.clone());
        }
        m.graph_base_latency_ns.insert(fwd, base_ns);
        self.slow_ranks_into(&mut m);
        Ok(m)
    }

    /// `--slow-rank`s as the mock's per-device slowdowns.
    fn slow_ranks_into(&self, m: &mut MockConfig) {
        for s in &self.cfg.slow_ranks {
            m.per_device.retain(|o| o.module_id != s.rank);
            m.per_device.push(DeviceOverride {
                module_id: s.rank,
                slowdown: s.factor,
                noise: None,
                script_ns: vec![],
                script_recipe: None,
            });
        }
    }
    /// Checks that none of the emulation settings is given for a real device: `--base-latency-ms`
    /// and `--noise` at their defaults ([`super::config::DEFAULT_BASE_LATENCY_MS`],
    /// [`super::config::Task::default_noise`]), no `--slow-rank`, `--time-mode real` (the text
    /// task, whose default is virtual, needs it given). They configure
    /// the CPU mock ([`Job::mock_config`]) and mean nothing on `library` (a description of the
    /// real libSynapse, for the message), so they are refused rather than silently ignored; at
    /// their defaults they are inert.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming every such flag given and the library.
    pub fn check_real_device(&self, library: &str) -> Result<(), TrainError> {
        let c = &self.cfg;
        let mut given = Vec::new();
        if c.base_latency != Duration::from_secs_f64(super::config::DEFAULT_BASE_LATENCY_MS / 1e3) {
            given.push("--base-latency-ms");
        }
        if c.noise != c.task.default_noise() {
            given.push("--noise");
        }
        if !c.slow_ranks.is_empty() {
            given.push("--slow-rank");
        }
        if c.time_mode != TimeMode::Real {
            // The text task's default (`Task::default_time_mode`) is virtual: on a real device
            // the user says --time-mode real.
            given.push(if c.time_mode == c.task.default_time_mode() {
                "--time-mode virtual (the text task's default on the mock: give --time-mode real)"
            } else {
                "--time-mode virtual"
            });
        }
        if given.is_empty() {
            return Ok(());
        }
        Err(TrainError::Config {
            what: "emulation flags",
            value: format!(
                "{} configure the emulated device (the CPU mock) and have no meaning on {library}; remove them, \
                 or run on the mock (DROPCOMPUTE_BACKEND=mock)",
                given.join(", ")
            ),
        })
    }
}

/// The compute rate (GFLOP/s) a text job of `size` (its transformer `model`) sets on the mock,
/// given the fields `$DROPCOMPUTE_MOCK_CONFIG` sets (`MockConfig::set_by_env`): the text
/// device model's rate (`text_device::text_graph_gflops`) for the default size; `None` (the
/// configured rate stands) when the user set `graph_gflops`, or for the tests' tiny size.
pub fn text_graph_gflops(
    size: super::config::TextModelSize,
    model: &super::transformer::TransformerConfig,
    set_by_env: &std::collections::BTreeSet<String>,
) -> Option<f64> {
    (size == super::config::TextModelSize::Default && !set_by_env.contains("graph_gflops"))
        .then(|| super::text_device::text_graph_gflops(model))
}

/// The text job's noise aliases (`MockConfig::graph_noise_alias`): every bucket's whole recipe
/// (`rows` documents) and, under a tail split, its tail recipe, mapped to the first bucket's
/// whole recipe, so that every launch at one (module, step, micro-batch) draws one noise factor
/// whatever its bucket. The first bucket's own whole recipe is not listed (it draws as itself).
pub fn text_noise_aliases(
    model: &super::transformer::TransformerConfig,
    lengths: &[u32],
    rows: u32,
    tail: dropcompute::policy::TailShape,
) -> Vec<(String, String)> {
    let name = |len, r| super::transformer_graphs::forward_backward_recipe_name(model, len, r);
    let Some(&first) = lengths.first() else { return Vec::new() };
    let canonical = name(first, rows);
    let tail_rows = tail.enabled().then(|| (rows / tail.parts()).max(1));
    lengths
        .iter()
        .flat_map(|&len| std::iter::once(name(len, rows)).chain(tail_rows.map(|r| name(len, r))))
        .filter(|n| *n != canonical)
        .map(|n| (n, canonical.clone()))
        .collect()
}

/// Which run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunKind {
    /// Threshold off.
    Baseline,
    /// The configured threshold.
    DropCompute,
}

impl RunKind {
    /// "baseline" or "dropcompute".
    pub fn label(self) -> &'static str {
        match self {
            RunKind::Baseline => "baseline",
            RunKind::DropCompute => "dropcompute",
        }
    }
}

/// What one rank measured in one run (JSON: the result file of a rank process).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankOutcome {
    /// Which run.
    pub kind: RunKind,
    /// Rank.
    pub rank: u32,
    /// One report per step.
    pub reports: Vec<StepReport>,
    /// Global mean training loss per step (loss summed over every rank's computed samples /
    /// their count; NaN for a step with none).
    #[serde(with = "dropcompute::serde_nan::vec")]
    pub loss: Vec<f64>,
    /// Wall time of the run's step loop (ns): host time in real time mode, the sum of the steps'
    /// device time in virtual time mode.
    pub wall_ns: u64,
    /// Final parameters.
    pub params: Vec<f32>,
    /// This rank's drop ledger.
    pub ledger: DropLedger,
    /// The scheduler's straggler statistics at the end of the run (identical on every rank).
    pub stragglers: StragglerTracker,
    /// Threshold in force at the end (ns), `None` for off.
    pub threshold_ns: Option<u64>,
    /// How the threshold was chosen.
    pub threshold_source: String,
    /// The text task's metric: held-out loss per real token (nats) of the final parameters,
    /// measured on rank 0 (`text_workload::TextWorkload::holdout_loss`); `None` for the digits
    /// task and on the other ranks (their parameters are rank 0's: `run::check_lockstep`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holdout_loss: Option<f64>,
}
