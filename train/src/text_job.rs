//! The inputs of `train --task text` every rank shares: the model size and buckets of
//! `--text-model`, the embedded corpus split into training and held-out documents, the bucket
//! plan whose units the one dealer deals, the held-out micro-batches of the metric, the
//! initial parameters and AdamW.
//!
//! Owns: [`TextJob`] (what `--text-model` means: [`TextJob::model_of`]), the held-out set of the
//! metric ([`TextJob::holdout`]) and the tail shape's plan rule ([`TextJob::prepare`]: units of
//! b/S documents). Must not touch: devices (the graphs are compiled by each rank's
//! `text_workload`), the dealer, the scheduler or the outputs.
#![forbid(unsafe_code)]

use std::sync::Arc;

use super::config::counted;
use super::config::{TextModelSize, TrainConfig};
use super::data::{held_out_count, min_split_items};
use super::error::TrainError;
use super::text::{BucketPlan, Buckets, Corpus, DEFAULT_BUCKETS, MAX_MICRO_BATCH_SIZE, TextError};
use super::transformer::{AdamW, LmInputs, TransformerConfig, init_params, stage_lm};
use super::transformer_train::TextTrainError;

/// Held-out micro-batches of the metric: spread evenly over the held-out plan's units (every
/// bucket in proportion), as `transformer_train::train_steps` evaluates (16 there too).
pub const HOLDOUT_MICRO_BATCHES: u64 = 16;

/// The text task's validated inputs (one per job, shared by every rank).
#[derive(Debug)]
pub struct TextJob {
    /// The transformer's sizes.
    pub model: TransformerConfig,
    /// The length buckets (one compiled forward/backward recipe each).
    pub buckets: Buckets,
    /// Documents per whole micro-batch (b, `--micro-batch-size`): the rows of the whole graphs.
    pub rows: u32,
    /// Documents per dealt unit: b/S under the second run's tail split S, else b
    /// (both runs deal units of this size; the baseline merges S of them, as the digits job).
    pub unit_rows: u32,
    /// The optimizer (`--lr`, the rest [`AdamW::default`]).
    pub adamw: AdamW,
    /// Training documents.
    pub train: Arc<Corpus>,
    /// The plan over [`TextJob::train`] whose units the runs deal (one id per unit).
    pub plan: Arc<BucketPlan>,
    /// The held-out micro-batches of the metric (rows = b each).
    pub holdout: Arc<Vec<LmInputs>>,
    /// Real tokens of the held-out micro-batches (the metric's divisor).
    pub holdout_tokens: u64,
    /// Initial parameters (`transformer::init_params` from the seed).
    pub init: Vec<f32>,
}

impl TextJob {
    /// The transformer and buckets of `--text-model`: the default size with
    /// `text::DEFAULT_BUCKETS`, or the tests' tiny size with buckets of 8 and 16 tokens (the
    /// sizes of `transformer_train::TextTrainConfig::{default, tiny}`).
    pub fn model_of(size: TextModelSize) -> (TransformerConfig, Vec<u32>) {
        match size {
            TextModelSize::Default => (TransformerConfig::DEFAULT, DEFAULT_BUCKETS.to_vec()),
            TextModelSize::Tiny => (TransformerConfig::TINY, vec![8, 16]),
        }
    }

    /// Loads the embedded corpus (the first `--text-documents`), splits it (`--holdout`,
    /// `--seed`), plans the training units of b/S documents and the held-out micro-batches of
    /// b documents, and initializes the model. No device call.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the flag to change and its value ([`TextJob::check_split`],
    /// [`TextJob::too_few_units`]): `--text-documents` above the corpus; a split with no
    /// held-out or no training document; a plan with fewer units than ranks; a micro-batch size
    /// the plan refuses. [`TrainError::Text`] for the embedded corpus and model (not the
    /// user's); [`TrainError::Params`] for an `--init-params` file that is not this model's.
    pub fn prepare(cfg: &TrainConfig) -> Result<Self, TrainError> {
        let text = |e: TextTrainError| TrainError::Text { rank: None, source: Box::new(e) };
        let (model, lens) = Self::model_of(cfg.text.model);
        model.validate().map_err(|e| text(e.into()))?;
        let buckets = Buckets::new(lens).map_err(|e| text(e.into()))?;
        if buckets.max_len() > model.max_len {
            return Err(text(TextTrainError::BucketTooLong { bucket: buckets.max_len(), max_len: model.max_len }));
        }
        let mut corpus = Corpus::embedded().map_err(|e| text(e.into()))?;
        let available = corpus.len();
        if let Some(n) = cfg.text.documents {
            // Refused rather than capped: report.json records the flags as given.
            if n as usize > available {
                return Err(TrainError::Config {
                    what: "--text-documents",
                    value: format!(
                        "{n}: the embedded corpus has {available} documents; give at most {available}, or leave the flag out for all of them"
                    ),
                });
            }
            corpus.docs.truncate(n as usize);
        }
        Self::check_split(cfg, corpus.len(), available)?;
        let (train, hold) = corpus.split(cfg.holdout, cfg.seed).map_err(|e| text(e.into()))?;
        let rows = cfg.micro_batch_size;
        let unit_rows = (rows / cfg.tail.parts()).max(1);
        let plan = BucketPlan::new(&train, buckets.clone(), unit_rows, cfg.seed).map_err(|e| plan_error(e, text))?;
        if plan.units() < u64::from(cfg.ranks) {
            return Err(Self::too_few_units(cfg, train.len(), plan.units(), unit_rows, corpus.len(), available));
        }
        let hplan = BucketPlan::new(&hold, buckets.clone(), rows, cfg.seed).map_err(|e| plan_error(e, text))?;
        let hn = HOLDOUT_MICRO_BATCHES.clamp(1, hplan.units().max(1));
        let holdout = (0..hn)
            .map(|i| Ok(stage_lm(&hplan.gather(&hold, &[i * hplan.units() / hn])?)))
            .collect::<Result<Vec<_>, super::text::TextError>>()
            .map_err(|e| text(e.into()))?;
        let holdout_tokens = holdout.iter().map(LmInputs::tokens_counted).sum();
        Ok(Self {
            // `--init-params`: a text parameters file of this model (`params::load_text_for`).
            init: match &cfg.init_params {
                Some(p) => super::params::load_text_for(p, &model)?,
                None => init_params(&model, cfg.seed),
            },
            adamw: AdamW { lr: cfg.lr as f32, ..AdamW::default() },
            model,
            buckets,
            rows,
            unit_rows,
            train: Arc::new(train),
            plan: Arc::new(plan),
            holdout: Arc::new(holdout),
            holdout_tokens,
        })
    }

    /// `--holdout` must split the `n` documents (of the `available` of the corpus) into at
    /// least one held-out document (the metric) and one training document (one unit): the rule
    /// of `data::holdout_split` ([`held_out_count`]), whose fewest such documents is
    /// [`min_split_items`] (3 at the default 0.2). The flag named is `--text-documents` when
    /// more documents of the corpus fix it, else `--holdout`.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming that flag, its value, what the split leaves and the fix.
    fn check_split(cfg: &TrainConfig, n: usize, available: usize) -> Result<(), TrainError> {
        let h = cfg.holdout;
        let held = held_out_count(n, h);
        if (1..n).contains(&held) {
            return Ok(());
        }
        let what = if held == 0 {
            format!(
                "holds out none of {} (round({n} x {h}) = 0) and the held-out loss needs one",
                counted(n as u64, "documents")
            )
        } else {
            format!(
                "holds out all {} (round({n} x {h}) = {held}), leaving none to train on",
                counted(n as u64, "documents")
            )
        };
        let min = min_split_items(h);
        match (cfg.text.documents, min) {
            (Some(d), Some(m)) if m <= available as u64 => Err(TrainError::Config {
                what: "--text-documents",
                value: format!(
                    "{d}: at --holdout {h} it {what}; give at least {m} (the fewest documents --holdout {h} splits into one held-out and one training document), or another --holdout"
                ),
            }),
            _ => Err(TrainError::Config {
                what: "--holdout",
                value: format!(
                    "{h}: of the {} it {what}; give a {} --holdout",
                    match cfg.text.documents {
                        Some(d) => format!("{} (--text-documents {d})", counted(n as u64, "documents")),
                        None => format!("{n} documents of the embedded corpus"),
                    },
                    if held == 0 { "larger" } else { "smaller" }
                ),
            }),
        }
    }

    /// The refusal of a plan of `units` training units (of up to `unit_rows` documents, from
    /// `train` training documents of `n`, of the `available` of the corpus) for more ranks: each
    /// rank needs one. Names the flag that fixes it: `--text-documents` when the corpus has the
    /// documents that always make enough units (`(ranks - 1) x unit_rows + 1` training
    /// documents: every unit but a bucket's last is full), else `--micro-batch-size` when
    /// smaller units make enough, else `--ranks`.
    fn too_few_units(
        cfg: &TrainConfig,
        train: usize,
        units: u64,
        unit_rows: u32,
        n: usize,
        available: usize,
    ) -> TrainError {
        let ranks = u64::from(cfg.ranks).max(1);
        let have = format!(
            "{} (of {n}, --holdout {}) {} {} of up to {}, fewer than the {ranks} ranks (each rank needs one)",
            counted(train as u64, "training documents"),
            cfg.holdout,
            if train == 1 { "makes" } else { "make" },
            counted(units, "training units"),
            counted(u64::from(unit_rows), "documents"),
        );
        let train_needed = (ranks - 1) * u64::from(unit_rows) + 1;
        let more = (n..=available).find(|&k| (k - held_out_count(k, cfg.holdout)) as u64 >= train_needed);
        let parts = cfg.tail.parts();
        match (cfg.text.documents, more) {
            (Some(d), Some(k)) => TrainError::Config {
                what: "--text-documents",
                value: format!("{d}: {have}; give --text-documents {k} or more, or fewer --ranks"),
            },
            _ if unit_rows > 1 && train as u64 >= ranks => TrainError::Config {
                what: "--micro-batch-size",
                value: format!(
                    "{}: {have}; give --micro-batch-size {} or less, or fewer --ranks",
                    cfg.micro_batch_size,
                    (train as u64 - 1) / (ranks - 1).max(1) * u64::from(parts)
                ),
            },
            _ => {
                TrainError::Config { what: "--ranks", value: format!("{ranks}: {have}; give --ranks {units} or fewer") }
            }
        }
    }
}

/// A plan's error as the flag it comes from: a micro-batch size the plan refuses names
/// `--micro-batch-size`; the rest through `text` ([`TrainError::Text`]).
fn plan_error(e: TextError, text: impl Fn(TextTrainError) -> TrainError) -> TrainError {
    match e {
        TextError::MicroBatchSize { value } => TrainError::Config {
            what: "--micro-batch-size",
            value: format!("{value}: a unit of {value} documents; must be in 1..={MAX_MICRO_BATCH_SIZE} documents"),
        },
        e => text(e.into()),
    }
}
