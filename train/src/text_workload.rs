//! The text transformer as the scheduler drives it (`train --task text`): one rank's
//! [`TextModel`] (and, under a tail split S, a second one for b/S documents), each dealt
//! micro-batch gathered from the bucket plan, staged as LM inputs and launched on its bucket's
//! compiled forward/backward recipe.
//!
//! The device time of a micro-batch is its bucket's recipe cost under the mock's per-node cost
//! model (`habana_mock`'s graph `cost_ns`: bytes and flops at the configured rates, attention
//! quadratic in the bucket's length), times the module's latency noise drawn under the
//! micro-batch's common-random-numbers key ([`super::workload::set_latency_key`]) and its
//! recipe's name (`transformer_graphs::forward_backward_recipe_name`; a tail recipe draws its
//! whole recipe's noise, `Job::mock_config`). No base latency is configured for these
//! recipes, so with `--noise none` every difference between micro-batches is the data's.
//!
//! Owns: [`TextWorkload`] (implements `schedule::Workload`). Must not touch: the dealing, the
//! deadline, the collectives (the scheduler's), the graphs (`transformer_graphs`) or the
//! model's launches (`transformer_train::TextModel`).
#![forbid(unsafe_code)]

use std::sync::Arc;

use dropcompute::schedule::{GradientScratch, MicroBatch, Workload, WorkloadError};
use dropcompute::synapse::graph::RecipeCache;
use dropcompute::synapse::{DeviceBuffer, Stream};

use super::text_job::TextJob;
use super::transformer::stage_lm;
use super::transformer_train::{AdamWState, TextModel, TextTrainError};
use super::workload::{STEP_END, set_latency_key};

/// One rank's text model on its device.
pub struct TextWorkload {
    job: Arc<TextJob>,
    whole: TextModel,
    /// The tail shape's model (b/S rows) with its row count; its parameters are copied from
    /// the whole model's after each update (its own AdamW state is never used).
    tail: Option<(TextModel, u32)>,
}

impl TextWorkload {
    /// Compiles the bucket recipes for b documents (and b/S for `tail_split` S > 1) through
    /// `cache`, allocates the state on `stream`'s device and uploads the job's initial
    /// parameters.
    ///
    /// # Errors
    /// [`TextTrainError::Device`] from compiling, allocating or copying.
    pub fn new(
        stream: &Stream,
        job: Arc<TextJob>,
        tail_split: u32,
        cache: Option<&RecipeCache>,
    ) -> Result<Self, TextTrainError> {
        let lens = job.buckets.lengths().to_vec();
        let whole = TextModel::new(stream, &job.model, &lens, job.rows, job.adamw, &job.init, cache)?;
        let tail = match tail_split {
            s if s > 1 => {
                let rows = (job.rows / s).max(1);
                Some((TextModel::new(stream, &job.model, &lens, rows, job.adamw, &job.init, cache)?, rows))
            }
            _ => None,
        };
        Ok(Self { job, whole, tail })
    }

    /// The `[loss sum, tokens]` accumulators of the models (the whole one first), each
    /// accumulated by its launches since the driver last zeroed it.
    pub fn loss_buffers(&mut self) -> Vec<&mut DeviceBuffer<f32>> {
        let mut v = vec![&mut self.whole.loss];
        if let Some((t, _)) = self.tail.as_mut() {
            v.push(&mut t.loss);
        }
        v
    }

    /// Downloads the parameters (waits for the stream).
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn params(&self, stream: &Stream) -> Result<Vec<f32>, TextTrainError> {
        self.whole.params(stream)
    }

    /// The whole model's optimizer state ([`TextModel::optimizer_state`]; the tail model's
    /// parameters are copies of it and its own AdamW state is never used). Waits for the stream.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn state(&self, stream: &Stream) -> Result<AdamWState, TextTrainError> {
        self.whole.optimizer_state(stream)
    }

    /// Restores `state` into the whole model and copies its parameters into the tail model.
    ///
    /// # Errors
    /// As [`TextModel::set_optimizer_state`].
    pub fn set_state(&mut self, stream: &Stream, state: &AdamWState) -> Result<(), TextTrainError> {
        self.whole.set_optimizer_state(stream, state)?;
        if let Some((t, _)) = self.tail.as_mut() {
            t.set_optimizer_state(stream, &AdamWState { step: 0, ..state.clone() })?;
        }
        Ok(())
    }

    /// The held-out loss per real token of the current parameters over the job's held-out
    /// micro-batches (the metric of the text task; the whole model's loss accumulator is read
    /// and zeroed). Waits for the stream.
    ///
    /// # Errors
    /// [`TextTrainError::Device`].
    pub fn holdout_loss(&mut self, stream: &Stream) -> Result<f64, TextTrainError> {
        let job = Arc::clone(&self.job);
        self.whole.evaluate(stream, &job.holdout)
    }
}

impl Workload for TextWorkload {
    fn launch_micro_batch(
        &mut self,
        stream: &Stream,
        step: u64,
        index: u32,
        mb: &MicroBatch,
        grad: &mut GradientScratch,
    ) -> Result<(), WorkloadError> {
        set_latency_key(stream.device().module_id(), step, index)?;
        let batch = self.job.plan.gather(&self.job.train, &mb.sample_ids)?;
        let inputs = stage_lm(&batch);
        let g = grad.as_f32_mut().ok_or("the text model writes f32 gradients")?;
        let model = match self.tail.as_mut() {
            Some((t, rows)) if inputs.rows == *rows => t,
            _ => &mut self.whole,
        };
        model.forward_backward_into(stream, &inputs, g)?;
        Ok(())
    }

    fn launch_optimizer(&mut self, stream: &Stream, _step: u64, grad: &DeviceBuffer<f32>) -> Result<(), WorkloadError> {
        // The scheduler's gradient is the mean over the step's tokens (its divisor).
        self.whole.apply_adamw(stream, grad, 1.0)?;
        if let Some((t, _)) = self.tail.as_mut() {
            // The tail model runs on the whole model's parameters (a device copy, in order).
            stream.copy_d2d(&self.whole.params, &mut t.params)?;
        }
        Ok(())
    }

    fn compute_done(&mut self, stream: &Stream, step: u64) -> Result<(), WorkloadError> {
        set_latency_key(stream.device().module_id(), step, STEP_END)?;
        Ok(())
    }
}
