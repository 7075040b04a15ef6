//! One rank training the text job's transformer on the embedded corpus, without the
//! scheduler: micro-batches from the bucket plan ([`crate::text::BucketPlan`]) in a seeded
//! order, their summed gradients accumulated on the device, AdamW with the step's token count
//! as the divisor, and the held-out loss per token. It is the model's end-to-end check and the
//! host-cost measurement's harness; the N-rank job (`train --task text`) drives the same
//! [`TextModel`] through `schedule::Workload` instead (`crate::text_workload`).
//!
//! Owns: [`TextTrainConfig`], [`train_steps`], [`TextModel`] (one rank's device state and its
//! launches), [`TrainLog`]. Must not touch: the graphs ([`crate::transformer_graphs`]), the
//! model definition ([`crate::transformer`]), the dealer or the scheduler (the micro-batch
//! order here is a plain seeded shuffle of the plan's units, one epoch after another).
//!
//! # Host cost of the mock's interpreter and the default sizes (issue 26 item 2.5)
//! Measured with `HOST_COST_SIZES='d,heads,layers,d_ff,rows;...' cargo test --release -p
//! dropcompute-train --test transformer -- --ignored host_cost --nocapture`: virtual time (the
//! wall time of launch + synchronize is the interpreter's host work only), the fastest of 5
//! repetitions, every row full (a bucket's graph costs the same whatever its padding), on
//! this project's 2-core machine shared with two other builds (load average 4.5 to 5.5): the
//! same size measured 1.5 to 2x apart between runs, so these are upper bounds of a quiet
//! machine's. ms per micro-batch, buckets 64 / 128 / 256 / 512 tokens, and the mean over the
//! embedded corpus' bucket mix (plan units per bucket: about 26 / 38 / 21 / 15 %):
//!
//! | size (D, heads, layers, F), rows | params | L64 | L128 | L256 | L512 | mix mean |
//! |---|---:|---:|---:|---:|---:|---:|
//! | 32, 2, 2, 64, rows 4 | 50 050 | 3.7 | 10.3 | 37.7 | 117 | 30.8 |
//! | 32, 4, 2, 64, rows 4 | 50 050 | 7.9 | 16.5 | 56.0 | 243 | 57.2 |
//! | 32, 2, 1, 64, rows 4 | 41 634 | 2.4-2.6 | 8.7-9.9 | 31-38 | 68-140 | 20.9-33.7 |
//! | 32, 2, 2, 64, rows 2 | 50 050 | 2.0-2.1 | 5.5-9.4 | 20-37 | 67-123 | 17.1-30.8 |
//! | 16, 2, 1, 32, rows 4 | 18 898 | 1.9 | 5.1 | 24.0 | 60.9 | 16.8 |
//! | **32, 2, 1, 64, rows 2 (default)** | 41 634 | 1.2-1.9 | 3.0-4.7 | 8.9-15.7 | 30-72 | **8.0-16.6** |
//!
//! Budget: the job's default run is a baseline and a policy run of 60 steps (`train`'s default
//! steps) at 16 ranks × M = 8 micro-batches, the ranks' interpreters sharing 2 cores:
//! 2 runs × 60 steps × 128 micro-batches × 8.0-16.6 ms / 2 cores = 61-127 s of interpreter
//! work, inside the ~4 minutes of issue 26 (5 minutes including a fresh release build of about
//! 2) with room for the scheduler, the collectives and the evaluations; the next size up
//! (2 layers, or 4 documents per micro-batch) measured 17-34 ms, 131-259 s: no margin. At the
//! default size one rank's 60 steps of M = 8 take the held-out loss from 5.558 (ln 258 = 5.553:
//! uniform) to 2.954 nats per token (3.542 at step 20, 3.229 at 40; `--ignored
//! default_size_learns`). Attention is most of the cost at L512 (b·H·L² scores through five
//! elementwise passes (scale, mask, softmax, its backward, scale) and six batch GEMMs per
//! layer), so the spread between buckets is the
//! data's straggling the policies act on.
#![forbid(unsafe_code)]

use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::SliceRandom;

use dropcompute::sim::rng::StableRng;
use dropcompute::synapse::graph::RecipeCache;
use dropcompute::synapse::{DeviceBuffer, HostBuffer, Stream};

use super::text::{BucketPlan, Buckets, Corpus, TextError};
use super::transformer::{AdamW, ConfigError, LmInputs, TransformerConfig, init_params, stage_lm};
use super::transformer_graphs::TransformerGraphs;

/// Why one-rank training failed.
#[derive(Debug, thiserror::Error)]
pub enum TextTrainError {
    /// The model's sizes.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The corpus, the split or the plan.
    #[error(transparent)]
    Text(#[from] TextError),
    /// The device: building, compiling, launching, copying (`call` names the step).
    #[error("{call}: {source}")]
    Device {
        /// What was being done.
        call: &'static str,
        /// The runtime's error.
        #[source]
        source: dropcompute::synapse::Error,
    },
    /// The largest bucket is longer than the model's position table.
    #[error("bucket {bucket} tokens is longer than the model's max_len {max_len}")]
    BucketTooLong {
        /// The bucket.
        bucket: u32,
        /// The model's.
        max_len: u32,
    },
    /// A loss that is not finite (divergence), with the step.
    #[error("step {step}: non-finite loss {loss}")]
    NonFinite {
        /// The step (0-based).
        step: u64,
        /// The loss.
        loss: f64,
    },
}

fn dev(call: &'static str) -> impl Fn(dropcompute::synapse::Error) -> TextTrainError {
    move |source| TextTrainError::Device { call, source }
}

/// What one-rank training is given.
#[derive(Clone, Debug, PartialEq)]
pub struct TextTrainConfig {
    /// Model sizes (`max_len` at least the largest bucket).
    pub model: TransformerConfig,
    /// Bucket lengths, tokens ([`Buckets::new`]'s rules).
    pub buckets: Vec<u32>,
    /// Documents per micro-batch (the graph's rows).
    pub rows: u32,
    /// Micro-batches per step (M).
    pub micro_batches: u32,
    /// Optimizer.
    pub adamw: AdamW,
    /// Seed of the initialization, the split, the plan and the order.
    pub seed: u64,
    /// Fraction of documents held out (`text::Corpus::split`).
    pub holdout_fraction: f64,
    /// Held-out micro-batches evaluated (the first of a plan over the held-out documents, with
    /// the same buckets: a fixed set).
    pub holdout_micro_batches: u32,
    /// Use only the first this many documents of the corpus (None: all).
    pub max_documents: Option<usize>,
}

impl Default for TextTrainConfig {
    /// The default size ([`TransformerConfig::DEFAULT`]), `text::DEFAULT_BUCKETS`, 2 documents
    /// per micro-batch, M = 8, [`AdamW::default`], seed 0, 10 % held out, 16 held-out
    /// micro-batches, the whole corpus.
    fn default() -> Self {
        Self {
            model: TransformerConfig::DEFAULT,
            buckets: super::text::DEFAULT_BUCKETS.to_vec(),
            rows: 2,
            micro_batches: 8,
            adamw: AdamW::default(),
            seed: 0,
            holdout_fraction: 0.1,
            holdout_micro_batches: 16,
            max_documents: None,
        }
    }
}

impl TextTrainConfig {
    /// The tests' size: [`TransformerConfig::TINY`], buckets 8 and 16, 4 documents per
    /// micro-batch, M = 4, lr 1e-2, 2000 documents, 8 held-out micro-batches.
    pub fn tiny() -> Self {
        Self {
            model: TransformerConfig::TINY,
            buckets: vec![8, 16],
            rows: 4,
            micro_batches: 4,
            adamw: AdamW { lr: 1e-2, ..AdamW::default() },
            seed: 0,
            holdout_fraction: 0.1,
            holdout_micro_batches: 8,
            max_documents: Some(2000),
        }
    }
}

/// Losses of a run, nats per real token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainLog {
    /// Each step's training loss (before its update).
    pub train_loss: Vec<f64>,
    /// Real tokens of each step (the divisor).
    pub train_tokens: Vec<u64>,
    /// Held-out loss before the first step and after each step.
    pub holdout_loss: Vec<f64>,
}

/// One rank's model on its device: parameters, AdamW state, gradient buffers, staging, the loss
/// accumulator, and the graphs.
pub struct TextModel {
    graphs: TransformerGraphs,
    /// Flat parameters.
    pub params: DeviceBuffer<f32>,
    m: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    /// One micro-batch's gradient (overwritten by each launch).
    pub grad: DeviceBuffer<f32>,
    acc: DeviceBuffer<f32>,
    /// Per bucket (the graphs' order): its length and the device copies of tokens, labels and
    /// mask (rows·len each).
    staging: Vec<Staging>,
    scalars: DeviceBuffer<f32>,
    /// `[loss sum, tokens]` accumulated since the last [`TextModel::take_loss`].
    pub loss: DeviceBuffer<f32>,
    adamw: AdamW,
    step: u64,
}

impl TextModel {
    /// Compiles the graphs for `lens` and `rows` ([`TransformerGraphs::build`], through `cache`
    /// when given), allocates the state on `stream`'s device and uploads `params`.
    ///
    /// # Errors
    /// [`TextTrainError::Device`]; a `params` of the wrong length is `InvalidArgument` there.
    pub fn new(
        stream: &Stream,
        cfg: &TransformerConfig,
        lens: &[u32],
        rows: u32,
        adamw: AdamW,
        params: &[f32],
        cache: Option<&RecipeCache>,
    ) -> Result<Self, TextTrainError> {
        let graphs = TransformerGraphs::build(stream, cfg, lens, rows, &adamw, cache).map_err(dev("compile"))?;
        let p = cfg.param_len();
        if params.len() != p {
            return Err(dev("upload")(dropcompute::synapse::Error::InvalidArgument {
                what: "transformer parameters",
                value: format!("{} values, the model has {p}", params.len()),
            }));
        }
        let d = stream.device();
        let alloc = |n| DeviceBuffer::<f32>::alloc(d, n).map_err(dev("alloc"));
        let ialloc = |n| DeviceBuffer::<i32>::alloc(d, n).map_err(dev("alloc"));
        let staging = lens
            .iter()
            .map(|&l| {
                let n = rows as usize * l as usize;
                Ok((l, ialloc(n)?, ialloc(n)?, alloc(n)?))
            })
            .collect::<Result<_, TextTrainError>>()?;
        let mut model = Self {
            params: alloc(p)?,
            m: alloc(p)?,
            v: alloc(p)?,
            grad: alloc(p)?,
            acc: alloc(p)?,
            staging,
            scalars: alloc(4)?,
            loss: alloc(2)?,
            graphs,
            adamw,
            step: 0,
        };
        upload_to(stream, &mut model.params, params)?;
        let zeros = vec![0f32; p];
        upload_to(stream, &mut model.m, &zeros)?;
        upload_to(stream, &mut model.v, &zeros)?;
        upload_to(stream, &mut model.loss, &[0.0, 0.0])?;
        Ok(model)
    }

    /// The graphs.
    pub fn graphs(&self) -> &TransformerGraphs {
        &self.graphs
    }

    /// Uploads `inputs` and enqueues its forward/backward: [`TextModel::grad`] ← its summed
    /// gradient, [`TextModel::loss`] += its loss and tokens. As
    /// [`TextModel::forward_backward_into`].
    ///
    /// # Errors
    /// As [`TextModel::forward_backward_into`].
    pub fn forward_backward(&mut self, s: &Stream, inputs: &LmInputs) -> Result<(), TextTrainError> {
        launch_fb(&self.graphs, &self.params, &self.loss, &mut self.staging, s, inputs, &self.grad)
    }

    /// Uploads `inputs` (tokens, labels, mask into its bucket's staging buffers) and enqueues
    /// its forward/backward on `s`: `grad` (param_len f32; e.g. the scheduler's gradient
    /// scratch) ← its gradient summed over real tokens (overwritten), [`TextModel::loss`] += its
    /// loss and tokens. Returns once the input copies are done (the host staging is then
    /// released), not the graph: events recorded after it time the micro-batch.
    ///
    /// # Errors
    /// [`TextTrainError::Device`]: a length no graph has, another row count (the copies'
    /// element counts differ), or the runtime's error.
    pub fn forward_backward_into(
        &mut self,
        s: &Stream,
        inputs: &LmInputs,
        grad: &DeviceBuffer<f32>,
    ) -> Result<(), TextTrainError> {
        launch_fb(&self.graphs, &self.params, &self.loss, &mut self.staging, s, inputs, grad)
    }

    /// Enqueues one AdamW step from `grad` times `grad_scale` (1 for the scheduler's mean
    /// gradient; 1/tokens for a summed one) and counts the step (bias corrections use it).
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn apply_adamw(&mut self, s: &Stream, grad: &DeviceBuffer<f32>, grad_scale: f64) -> Result<(), TextTrainError> {
        self.step += 1;
        let sc = self.adamw.step_scalars(self.step, grad_scale);
        upload_to(s, &mut self.scalars, &sc)?;
        self.graphs.launch_adamw(s, &self.params, &self.m, &self.v, grad, &self.scalars).map_err(dev("adamw"))
    }

    /// Reads and zeroes the loss accumulator: `(loss sum, tokens)`.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn take_loss(&mut self, s: &Stream) -> Result<(f64, u64), TextTrainError> {
        let v = download(s, &self.loss)?;
        upload_to(s, &mut self.loss, &[0.0, 0.0])?;
        Ok((f64::from(v[0]), v[1] as u64))
    }

    /// One step over `batches`: each one's gradient accumulated, then AdamW on the sum divided
    /// by the step's real tokens. Returns the step's training loss per token.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn step(&mut self, s: &Stream, batches: &[LmInputs]) -> Result<(f64, u64), TextTrainError> {
        let zeros = vec![0f32; self.acc.len()];
        upload_to(s, &mut self.acc, &zeros)?;
        self.take_loss(s)?;
        for b in batches {
            self.forward_backward(s, b)?;
            self.graphs.launch_accumulate(s, &self.acc, &self.grad).map_err(dev("accumulate"))?;
        }
        let (sum, tokens) = self.take_loss(s)?;
        self.step += 1;
        let sc = self.adamw.step_scalars(self.step, 1.0 / tokens.max(1) as f64);
        upload_to(s, &mut self.scalars, &sc)?;
        self.graphs.launch_adamw(s, &self.params, &self.m, &self.v, &self.acc, &self.scalars).map_err(dev("adamw"))?;
        s.synchronize().map_err(dev("adamw"))?;
        Ok((sum / tokens.max(1) as f64, tokens))
    }

    /// The loss per token over `batches` (the gradient computed and discarded).
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn evaluate(&mut self, s: &Stream, batches: &[LmInputs]) -> Result<f64, TextTrainError> {
        self.take_loss(s)?;
        for b in batches {
            self.forward_backward(s, b)?;
        }
        let (sum, tokens) = self.take_loss(s)?;
        Ok(sum / tokens.max(1) as f64)
    }

    /// Downloads the parameters.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn params(&self, s: &Stream) -> Result<Vec<f32>, TextTrainError> {
        download(s, &self.params)
    }

    /// Downloads the optimizer state: the parameters, AdamW's first and second moments
    /// (param_len f32 each, the flat layout of `TransformerConfig::blocks`) and the AdamW steps
    /// taken (the bias corrections' t). Waits for the stream.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn optimizer_state(&self, s: &Stream) -> Result<AdamWState, TextTrainError> {
        Ok(AdamWState {
            params: download(s, &self.params)?,
            m: download(s, &self.m)?,
            v: download(s, &self.v)?,
            step: self.step,
        })
    }

    /// Uploads `state` (as [`TextModel::optimizer_state`] returns it) and waits: the next
    /// [`TextModel::apply_adamw`] continues exactly where the run that saved it stopped.
    ///
    /// # Errors
    /// [`TextTrainError::Device`]: a vector of another length than the model's parameters
    /// (`InvalidArgument`, naming it), or the runtime's error.
    pub fn set_optimizer_state(&mut self, s: &Stream, state: &AdamWState) -> Result<(), TextTrainError> {
        let p = self.params.len();
        for (name, x) in [("parameters", &state.params), ("AdamW m", &state.m), ("AdamW v", &state.v)] {
            if x.len() != p {
                return Err(dev("upload")(dropcompute::synapse::Error::InvalidArgument {
                    what: "transformer optimizer state",
                    value: format!("{name}: {} values, the model has {p}", x.len()),
                }));
            }
        }
        upload_to(s, &mut self.params, &state.params)?;
        upload_to(s, &mut self.m, &state.m)?;
        upload_to(s, &mut self.v, &state.v)?;
        self.step = state.step;
        Ok(())
    }

    /// Downloads the last micro-batch's gradient.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn grad(&self, s: &Stream) -> Result<Vec<f32>, TextTrainError> {
        download(s, &self.grad)
    }
}

/// One rank's AdamW state on the host ([`TextModel::optimizer_state`]): what a checkpoint of
/// the text job holds besides the scheduler's and the data's state.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamWState {
    /// Flat parameters (param_len f32).
    pub params: Vec<f32>,
    /// First moment m (param_len f32).
    pub m: Vec<f32>,
    /// Second moment v (param_len f32).
    pub v: Vec<f32>,
    /// AdamW steps taken (t of the bias corrections 1 - beta^t).
    pub step: u64,
}

/// One bucket's input buffers on the device: its length, then tokens, labels (i32) and mask
/// (f32), rows·len each.
type Staging = (u32, DeviceBuffer<i32>, DeviceBuffer<i32>, DeviceBuffer<f32>);

/// Copies `data` into `to` and waits.
fn upload_to(s: &Stream, to: &mut DeviceBuffer<f32>, data: &[f32]) -> Result<(), TextTrainError> {
    let h = HostBuffer::from_slice(s.device(), data).map_err(dev("upload"))?;
    s.copy_h2d(&h, to).map_err(dev("upload"))?;
    s.synchronize().map_err(dev("upload"))
}

/// [`TextModel::forward_backward_into`] over the model's fields (borrowed apart from `grad`,
/// which may be the model's own).
fn launch_fb(
    graphs: &TransformerGraphs,
    params: &DeviceBuffer<f32>,
    loss: &DeviceBuffer<f32>,
    staging: &mut [Staging],
    s: &Stream,
    inputs: &LmInputs,
    grad: &DeviceBuffer<f32>,
) -> Result<(), TextTrainError> {
    let d = s.device();
    let (ht, hl, hm) = (
        HostBuffer::from_slice(d, &inputs.tokens).map_err(dev("stage"))?,
        HostBuffer::from_slice(d, &inputs.labels).map_err(dev("stage"))?,
        HostBuffer::from_slice(d, &inputs.mask).map_err(dev("stage"))?,
    );
    let Some((_, tokens, labels, mask)) = staging.iter_mut().find(|b| b.0 == inputs.len) else {
        return Err(dev("stage")(dropcompute::synapse::Error::InvalidArgument {
            what: "micro-batch",
            value: format!("{} tokens per row: no bucket of that length", inputs.len),
        }));
    };
    // A wrong row count is refused by the copies (element counts differ).
    s.copy_h2d(&ht, tokens).map_err(dev("stage"))?;
    s.copy_h2d(&hl, labels).map_err(dev("stage"))?;
    s.copy_h2d(&hm, mask).map_err(dev("stage"))?;
    graphs.launch_forward_backward(s, inputs, params, tokens, labels, mask, grad, loss).map_err(dev("forward/backward"))
    // The host buffers drop here: each waits for its own copy only.
}

fn download(s: &Stream, d: &DeviceBuffer<f32>) -> Result<Vec<f32>, TextTrainError> {
    let mut h = HostBuffer::zeroed(s.device(), d.len()).map_err(dev("download"))?;
    s.copy_d2h(d, &mut h).map_err(dev("download"))?;
    s.synchronize().map_err(dev("download"))?;
    h.to_vec().map_err(dev("download"))
}

/// The staged micro-batches of the first `n` units of `plan` in `order` (all when `n` exceeds
/// them).
fn staged(plan: &BucketPlan, corpus: &Corpus, order: &[u64]) -> Result<Vec<LmInputs>, TextTrainError> {
    order.iter().map(|&u| Ok(stage_lm(&plan.gather(corpus, &[u])?))).collect()
}

/// Trains one rank for `steps` steps on `stream`'s device (module doc) and returns the losses.
/// Deterministic for a configuration (the mock's kernels are).
///
/// # Errors
/// [`TextTrainError::Config`], [`TextTrainError::BucketTooLong`], [`TextTrainError::Text`]
/// (buckets, split, plan), [`TextTrainError::Device`], [`TextTrainError::NonFinite`].
pub fn train_steps(stream: &Stream, cfg: &TextTrainConfig, steps: u64) -> Result<TrainLog, TextTrainError> {
    cfg.model.validate()?;
    let buckets = Buckets::new(cfg.buckets.clone())?;
    if buckets.max_len() > cfg.model.max_len {
        return Err(TextTrainError::BucketTooLong { bucket: buckets.max_len(), max_len: cfg.model.max_len });
    }
    let mut corpus = Corpus::embedded()?;
    if let Some(n) = cfg.max_documents {
        corpus.docs.truncate(n.max(2));
    }
    let (train, hold) = corpus.split(cfg.holdout_fraction, cfg.seed)?;
    let (train, hold) = (Arc::new(train), Arc::new(hold));
    let plan = BucketPlan::new(&train, buckets.clone(), cfg.rows, cfg.seed)?;
    let hplan = BucketPlan::new(&hold, buckets.clone(), cfg.rows, cfg.seed)?;
    // Held-out units spread over the plan (every bucket represented in proportion).
    let hn = u64::from(cfg.holdout_micro_batches).clamp(1, hplan.units());
    let hold_ids: Vec<u64> = (0..hn).map(|i| i * hplan.units() / hn).collect();
    let holdout = staged(&hplan, &hold, &hold_ids)?;
    let lens = buckets.lengths().to_vec();
    let mut model =
        TextModel::new(stream, &cfg.model, &lens, cfg.rows, cfg.adamw, &init_params(&cfg.model, cfg.seed), None)?;
    let mut rng = StableRng::seed_from_u64(cfg.seed ^ 0x005e_ed0f_0de5);
    let mut order: Vec<u64> = Vec::new();
    let mut log = TrainLog { holdout_loss: vec![model.evaluate(stream, &holdout)?], ..TrainLog::default() };
    for step in 0..steps {
        let mut ids = Vec::with_capacity(cfg.micro_batches as usize);
        for _ in 0..cfg.micro_batches {
            if order.is_empty() {
                order = (0..plan.units()).collect();
                order.shuffle(&mut rng);
            }
            ids.push(order.pop().expect("a plan has units"));
        }
        let batches = staged(&plan, &train, &ids)?;
        let (loss, tokens) = model.step(stream, &batches)?;
        if !loss.is_finite() {
            return Err(TextTrainError::NonFinite { step, loss });
        }
        log.train_loss.push(loss);
        log.train_tokens.push(tokens);
        log.holdout_loss.push(model.evaluate(stream, &holdout)?);
    }
    Ok(log)
}
