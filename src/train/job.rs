//! The job description of `train`: the validated inputs every rank shares ([`Job`]), the runs
//! it plans ([`RunKind`]) and what a rank measured in one run ([`RankOutcome`], also the JSON
//! result of a rank process).
//!
//! Owns: loading and splitting the data, the initial parameters, the resume step, the mock
//! configuration of a job, the checkpoint fingerprint and the `--threshold auto` guardrail
//! from the environment. Must not touch: devices, collectives, the step loop or outputs.
#![forbid(unsafe_code)]

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::mock::{DeviceOverride, MockConfig};
use crate::schedule::{DropLedger, StepReport, StragglerTracker};
use crate::tune::{Guardrails, Recommend, Scoring};

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
    /// Drop-rate guardrail of `--threshold auto` ([`auto_max_drop_rate`]).
    pub auto_max_drop: f64,
}

/// The serialized form of a [`Job`] handed to a rank process (JSON inside the
/// `crate::launch::ChildSpec`): the parent's validated configuration and its choices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The parent's validated configuration (every flag, `--resume` and `--checkpoint-dir`
    /// included).
    pub cfg: TrainConfig,
    /// The step the parent chose to resume from ([`Job::resume_step`]).
    pub resume_step: Option<u64>,
    /// The parent's `--threshold auto` guardrail ([`Job::auto_max_drop`]).
    pub auto_max_drop: f64,
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
        let mut job = Self::load(cfg, auto_max_drop_rate()?)?;
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
        }
        Ok(job)
    }

    /// What a rank process needs to rebuild this job exactly: the validated configuration and
    /// the choices the parent made from its environment and disk (resume step, auto guardrail).
    pub fn spec(&self) -> JobSpec {
        JobSpec { cfg: self.cfg.clone(), resume_step: self.resume_step, auto_max_drop: self.auto_max_drop }
    }

    /// The job of a rank process: [`Job::prepare`]'s data and model from `spec.cfg`, with the
    /// parent's resume step and guardrail (not re-read from this process's disk or environment).
    ///
    /// # Errors
    /// As [`Job::prepare`], except that no checkpoint directory is read here;
    /// [`TrainError::Config`] for a guardrail outside [0, 1] or a resume step with no
    /// `--resume` directory.
    pub fn from_spec(spec: JobSpec) -> Result<Self, TrainError> {
        if !(0.0..=1.0).contains(&spec.auto_max_drop) {
            return Err(TrainError::Config {
                what: ENV_AUTO_MAX_DROP,
                value: format!("{} (parent job spec)", spec.auto_max_drop),
            });
        }
        if spec.resume_step.is_some() && spec.cfg.resume.is_none() {
            return Err(TrainError::Config {
                what: "--resume",
                value: "a resume step without a directory (parent job spec)".into(),
            });
        }
        let mut job = Self::load(spec.cfg, spec.auto_max_drop)?;
        job.resume_step = spec.resume_step;
        Ok(job)
    }

    /// Data, split, shape and initial parameters of `cfg`; no checkpoint read.
    fn load(cfg: TrainConfig, auto_max_drop: f64) -> Result<Self, TrainError> {
        let all = match &cfg.data {
            Some(p) => Dataset::load(p, cfg.classes)?,
            None => Dataset::embedded_digits()?,
        };
        let (train, holdout) = all.split(cfg.holdout, cfg.seed)?;
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
            auto_max_drop,
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
        let c = &self.cfg;
        format!(
            "ranks={} m={} b={} seed={} params={} hidden={} check={:?} lag={} norm={:?} lr={} momentum={} train={}",
            c.ranks,
            c.micro_batches,
            c.micro_batch_size,
            c.seed,
            self.shape.param_len(),
            c.hidden,
            c.check,
            c.sync_lag,
            c.normalization,
            c.lr,
            c.momentum,
            self.train.len()
        )
    }

    /// How `--threshold auto` recommends a threshold on the baseline run's trace: replayed
    /// under this job's check mode, drop rate <= [`Job::auto_max_drop`], gain >=
    /// [`AUTO_MIN_GAIN`], no batch-fraction floor, one micro-batch always computed.
    pub fn auto_recommend(&self) -> Recommend {
        Recommend {
            scoring: Scoring::Replay(self.cfg.check),
            guardrails: Guardrails {
                max_drop_rate: self.auto_max_drop,
                min_batch_fraction: 0.0,
                min_gain: AUTO_MIN_GAIN,
            },
            min_micro_batches: 1,
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
    /// mode, seed, noise and slow ranks.
    ///
    /// # Errors
    /// [`TrainError::Config`] when `$DROPCOMPUTE_MOCK_DEVICES` has fewer devices than ranks or
    /// the mock environment is invalid.
    pub fn mock_config(&self) -> Result<MockConfig, TrainError> {
        let mut m = MockConfig::from_env()
            .map_err(|e| TrainError::Config { what: "mock environment", value: e.to_string() })?;
        let fixed = std::env::var_os(crate::mock::config::ENV_DEVICES).is_some();
        if m.devices < self.cfg.ranks {
            if fixed {
                return Err(TrainError::Config {
                    what: "--ranks",
                    value: format!(
                        "{} ranks but only {} mock devices (${})",
                        self.cfg.ranks,
                        m.devices,
                        crate::mock::config::ENV_DEVICES
                    ),
                });
            }
            m.devices = self.cfg.ranks;
        }
        m.time_mode = self.cfg.time_mode;
        m.seed = self.cfg.seed;
        m.noise = self.cfg.noise.clone();
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
        Ok(m)
    }
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
    #[serde(with = "crate::serde_nan::vec")]
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
}

/// The smallest predicted effective speedup for which `--threshold auto` enables dropping
/// (0.02 = +2 %).
pub const AUTO_MIN_GAIN: f64 = 0.02;

/// Environment variable: the drop-rate guardrail of `--threshold auto` (a fraction in [0, 1]).
pub const ENV_AUTO_MAX_DROP: &str = "DROPCOMPUTE_AUTO_MAX_DROP";

/// The drop-rate guardrail of `--threshold auto`: `$DROPCOMPUTE_AUTO_MAX_DROP`, else 0.25.
///
/// # Errors
/// [`TrainError::Config`] naming the variable and its value when it is not a number in [0, 1].
pub fn auto_max_drop_rate() -> Result<f64, TrainError> {
    match std::env::var(ENV_AUTO_MAX_DROP) {
        Err(_) => Ok(0.25),
        Ok(v) => v.trim().parse::<f64>().ok().filter(|x| (0.0..=1.0).contains(x)).ok_or(TrainError::Config {
            what: ENV_AUTO_MAX_DROP,
            value: format!("{v:?} (must be a fraction in [0, 1])"),
        }),
    }
}
