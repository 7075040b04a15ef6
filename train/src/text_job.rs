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

use super::config::{TextModelSize, TrainConfig};
use super::error::TrainError;
use super::text::{BucketPlan, Buckets, Corpus, DEFAULT_BUCKETS};
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
    /// [`TrainError::Text`] for the corpus, the split, a bucket longer than the model, the
    /// plan; [`TrainError::Config`] when the plan has fewer units than ranks;
    /// [`TrainError::Params`] for an `--init-params` file that is not this model's.
    pub fn prepare(cfg: &TrainConfig) -> Result<Self, TrainError> {
        let text = |e: TextTrainError| TrainError::Text { rank: None, source: Box::new(e) };
        let (model, lens) = Self::model_of(cfg.text.model);
        model.validate().map_err(|e| text(e.into()))?;
        let buckets = Buckets::new(lens).map_err(|e| text(e.into()))?;
        if buckets.max_len() > model.max_len {
            return Err(text(TextTrainError::BucketTooLong { bucket: buckets.max_len(), max_len: model.max_len }));
        }
        let mut corpus = Corpus::embedded().map_err(|e| text(e.into()))?;
        if let Some(n) = cfg.text.documents {
            corpus.docs.truncate((n as usize).max(2));
        }
        let (train, hold) = corpus.split(cfg.holdout, cfg.seed).map_err(|e| text(e.into()))?;
        let rows = cfg.micro_batch_size;
        let unit_rows = (rows / cfg.tail.parts()).max(1);
        let plan = BucketPlan::new(&train, buckets.clone(), unit_rows, cfg.seed).map_err(|e| text(e.into()))?;
        if plan.units() < u64::from(cfg.ranks) {
            return Err(TrainError::Config {
                what: "--text-documents",
                value: format!(
                    "{} training documents make {} micro-batches of {unit_rows} documents, fewer than the {} ranks",
                    train.len(),
                    plan.units(),
                    cfg.ranks
                ),
            });
        }
        let hplan = BucketPlan::new(&hold, buckets.clone(), rows, cfg.seed).map_err(|e| text(e.into()))?;
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
}
