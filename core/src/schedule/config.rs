//! Configuration of the step scheduler: how many micro-batches, which deadline policy, how the
//! gradient is normalized, how dropped samples are handled, and the gradient layout.
//!
//! Owns: [`SchedulerConfig`], [`Normalization`], [`Weighting`], [`DropHandling`],
//! [`GradDtype`] and their validation. Must not touch: devices, clocks or collectives.

use crate::policy::DeadlineConfig;

use super::ScheduleError;

/// What the all-reduced gradient is divided by (`../shared/reference/dropcompute.md` §2).
/// Command-line (`train --normalization`) and JSON names: `realized`, `nominal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Normalization {
    /// Divide by the global weight actually computed this step (samples, or tokens under
    /// [`Weighting::Tokens`]), summed over every rank in the same collective group as the
    /// gradient. The update is the exact mean gradient of the computed samples.
    #[default]
    #[cfg_attr(
        feature = "clap",
        value(help = "By the number of samples actually computed across ranks (DropCompute's rescale)")
    )]
    Realized,
    /// Divide by the nominal `N * M * micro_batch_size`, as the reference code does: a dropped
    /// micro-batch counts as a zero gradient. Under plain SGD this scales the effective learning
    /// rate by `1 - drop rate` (reference §2, "Consequence"); trust-ratio optimizers (LAMB/LARS)
    /// and Adam mostly cancel that bias.
    #[cfg_attr(feature = "clap", value(help = "By the nominal global batch ranks × micro-batches × micro-batch size"))]
    Nominal,
}

/// The unit of the realized weight: samples, or tokens carried by each micro-batch (so that a
/// token-level loss summed over a micro-batch is normalized by the total token count, not per
/// micro-batch: the classic gradient-accumulation bug).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Weighting {
    /// Weight of a micro-batch = its sample count.
    #[default]
    Samples,
    /// Weight of a micro-batch = its token count ([`super::MicroBatch::tokens`] must be set).
    Tokens,
}

/// Where dropped micro-batches go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DropHandling {
    /// Back to the front of the rank's data source, in order, so that over an epoch every sample
    /// is computed exactly once (the reference instead leaves them to later steps implicitly).
    #[default]
    Requeue,
    /// Dropped for good; counted in the report and the ledger.
    Discard,
}

/// Element type of the per-micro-batch gradient the user's recipe writes. The accumulator is
/// always f32 (`kernels`: `accumulate_f32` or `accumulate_bf16_to_f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GradDtype {
    /// 4-byte float.
    #[default]
    F32,
    /// bfloat16 (accumulated into f32 with round-to-nearest-even on the way in, bit-exact with
    /// `half::bf16::to_f32`).
    Bf16,
}

/// Configuration of one rank's scheduler (must be identical on every rank, except that nothing
/// here is rank-specific).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Micro-batches per step and rank (M, gradient accumulation steps), >= 1. A rebalancing
    /// policy moves micro-batches between ranks, keeping the global `N·M` per step.
    pub micro_batches: u32,
    /// Most micro-batches one rank may be assigned in a step (the slots of its count row and
    /// events), `None` = M. Must be >= M; a rebalancing policy needs more than M.
    pub max_micro_batches: Option<u32>,
    /// Latency slots of the count row when wider than [`SchedulerConfig::part_slots`]
    /// (`None`: the part slots): a run paired with another of more part slots (a baseline
    /// beside a tail-shape or work-moving run) pads its count row to the other's width, so
    /// both runs' collectives move the same bytes and a deadline that never fires measures
    /// exactly 1x (issue 23: 0.99999984x with `--tail-split 2`, 35 ns per step). The padding
    /// is never decoded into a report.
    pub count_row_slots: Option<u32>,
    /// Nominal samples per micro-batch (b), >= 1; used by [`Normalization::Nominal`].
    pub micro_batch_size: u32,
    /// The deadline policy (threshold, check mode, warm-up, minimum micro-batches).
    pub policy: DeadlineConfig,
    /// Sync lag k: before deciding micro-batch i, the host waits on the completion event of
    /// micro-batch i-1-k (k = 0: exact, the device pipeline drains at every check; larger k lets
    /// k micro-batches queue on the device, and the decision uses device time k micro-batches
    /// old). Must be < `micro_batches`.
    pub sync_lag: u32,
    /// Normalization of the reduced gradient.
    pub normalization: Normalization,
    /// Unit of the realized weight.
    pub weighting: Weighting,
    /// What happens to dropped micro-batches.
    pub drop_handling: DropHandling,
    /// Element type of the micro-batch gradient.
    pub grad_dtype: GradDtype,
    /// Gradient elements (f32 accumulator length), >= 1.
    pub gradient_len: usize,
    /// All-reduce bucket size in bytes (>= 4): the accumulator is reduced as
    /// `ceil(4 * gradient_len / bucket_bytes)` in-place all-reduces of contiguous ranges.
    pub bucket_bytes: usize,
    /// Window (micro-batches) and quantile of the predictive mode's latency estimate
    /// (`policy::LatencyEstimator`).
    pub estimator_window: usize,
    /// See `estimator_window`.
    pub estimator_quantile: f64,
    /// Smoothing factor of the per-rank exponentially weighted mean compute time (0, 1].
    pub straggler_ewma_alpha: f64,
    /// A rank is flagged a chronic straggler when it hit the threshold in at least this fraction
    /// of the (at least 10) steps since the start, and its smoothed compute time is the largest.
    pub chronic_hit_fraction: f64,
    /// The second compiled shape (`policy::TailShape`, split S): with S > 1 the data source
    /// deals *parts* of b/S samples, assignments and counts are in parts (a micro-batch = S
    /// parts), the scheduler launches S consecutive parts as one whole micro-batch and, near
    /// the deadline (predictive check) or for the remainder of an assignment, single parts as
    /// tail micro-batches (the workload runs a micro-batch of at most b/S samples on its tail
    /// shape). Default: S = 1, whole micro-batches only (counts in micro-batches).
    pub tail: crate::policy::TailShape,
    /// The run-time drop-rate guard's bound (`policy::DropGuard`, a fraction in (0, 1]): a
    /// step runs with the threshold off when enforcing it could take the run's cumulative drop
    /// rate (in parts, over every rank) above it, as the replay runs
    /// `sim::policies::ExecutionModel::drop_guard`, for the policies that drop
    /// (`Policy::drops`). `None` (the default): no guard. Counts in parts: refused with
    /// [`Weighting::Tokens`] (the replay of a token run counts tokens).
    pub drop_guard: Option<f64>,
}

impl Default for SchedulerConfig {
    /// M = 8, b = 1, default policy (threshold off), k = 0, realized sample normalization,
    /// requeue, f32 gradients, 1 gradient element, 4 MiB buckets, 32-sample p90 estimate,
    /// EWMA alpha 0.1, chronic at 50 % of steps.
    fn default() -> Self {
        Self {
            micro_batches: 8,
            max_micro_batches: None,
            count_row_slots: None,
            micro_batch_size: 1,
            policy: DeadlineConfig::default(),
            sync_lag: 0,
            normalization: Normalization::Realized,
            weighting: Weighting::Samples,
            drop_handling: DropHandling::Requeue,
            grad_dtype: GradDtype::F32,
            gradient_len: 1,
            bucket_bytes: 4 << 20,
            estimator_window: crate::policy::LatencyEstimator::DEFAULT_WINDOW,
            estimator_quantile: crate::policy::LatencyEstimator::DEFAULT_QUANTILE,
            straggler_ewma_alpha: 0.1,
            chronic_hit_fraction: 0.5,
            tail: crate::policy::TailShape::default(),
            drop_guard: None,
        }
    }
}

impl SchedulerConfig {
    /// Checks every field.
    ///
    /// # Errors
    /// [`ScheduleError::Config`] naming the first bad field and its value.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let bad = |what: &'static str, value: String| Err(ScheduleError::Config { what, value });
        if self.micro_batches == 0 {
            return bad("micro_batches", "0 (must be >= 1)".into());
        }
        if let Some(c) = self.max_micro_batches
            && c < self.micro_batches
        {
            return bad("max_micro_batches", format!("{c} (must be >= micro_batches = {})", self.micro_batches));
        }
        if self.micro_batch_size == 0 {
            return bad("micro_batch_size", "0 (must be >= 1)".into());
        }
        if self.sync_lag >= self.micro_batches {
            return bad("sync_lag", format!("{} (must be < micro_batches = {})", self.sync_lag, self.micro_batches));
        }
        if self.gradient_len == 0 {
            return bad("gradient_len", "0 (must be >= 1)".into());
        }
        if self.bucket_bytes < 4 {
            return bad("bucket_bytes", format!("{} (must be >= 4)", self.bucket_bytes));
        }
        if !(self.straggler_ewma_alpha > 0.0 && self.straggler_ewma_alpha <= 1.0) {
            return bad("straggler_ewma_alpha", format!("{} (must be in (0, 1])", self.straggler_ewma_alpha));
        }
        if !(0.0..=1.0).contains(&self.chronic_hit_fraction) {
            return bad("chronic_hit_fraction", format!("{} (must be in [0, 1])", self.chronic_hit_fraction));
        }
        if self.tail.split == 0 || self.tail.split > 64 || !self.micro_batch_size.is_multiple_of(self.tail.parts()) {
            return bad(
                "tail.split",
                format!(
                    "{} (must be in 1..=64 and divide micro_batch_size = {})",
                    self.tail.split, self.micro_batch_size
                ),
            );
        }
        if let Some(ns) = self.policy.threshold.as_ns()
            && ns == 0
        {
            return bad("threshold", "0 ns (use Threshold::Off for no deadline)".into());
        }
        if let Some(b) = self.drop_guard {
            if let Err(e) = crate::policy::DropGuard::check(b) {
                return bad("drop_guard", e.to_string());
            }
            if self.weighting == Weighting::Tokens {
                return bad("drop_guard", format!("{b} with token weighting (the guard counts parts; not supported)"));
            }
        }
        Ok(())
    }

    /// Micro-batch slots per rank and step: `max_micro_batches`, or M when unset (the width of
    /// the count row's latency block and of `StepReport::latencies_ns` per rank).
    pub fn slots(&self) -> u32 {
        self.max_micro_batches.unwrap_or(self.micro_batches).max(self.micro_batches)
    }

    /// Latency slots of the count row: [`SchedulerConfig::count_row_slots`], at least
    /// [`SchedulerConfig::part_slots`].
    pub fn row_slots(&self) -> u32 {
        self.count_row_slots.unwrap_or(0).max(self.part_slots())
    }

    /// Parts per micro-batch: the tail shape's split S (1 without a tail shape).
    pub fn parts(&self) -> u32 {
        self.tail.parts()
    }

    /// Part slots per rank and step: [`SchedulerConfig::slots`] · S. The most parts a rank may
    /// be assigned, and the most launches (whole or tail micro-batches) it makes in a step: the
    /// width of the count row's latency block and of `StepReport::latencies_ns` per rank.
    pub fn part_slots(&self) -> u32 {
        self.slots().saturating_mul(self.parts())
    }

    /// The element ranges of the all-reduce buckets: contiguous, covering `0..gradient_len`,
    /// each at most `bucket_bytes / 4` elements (at least 1).
    pub fn buckets(&self) -> Vec<std::ops::Range<usize>> {
        let per = (self.bucket_bytes / 4).max(1);
        (0..self.gradient_len).step_by(per).map(|s| s..(s + per).min(self.gradient_len)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_gradient_exactly_once() {
        for (len, bytes) in [(1, 4), (10, 4), (10, 12), (1000, 4096), (1025, 4096), (7, 1 << 20)] {
            let cfg = SchedulerConfig { gradient_len: len, bucket_bytes: bytes, ..Default::default() };
            let b = cfg.buckets();
            assert_eq!(b.first().unwrap().start, 0);
            assert_eq!(b.last().unwrap().end, len);
            assert!(b.windows(2).all(|w| w[0].end == w[1].start));
            assert!(b.iter().all(|r| !r.is_empty() && r.len() * 4 <= bytes.max(4)));
            assert_eq!(b.len(), (len * 4).div_ceil(bytes / 4 * 4));
        }
    }

    #[test]
    fn validation_names_the_field() {
        let tail = |split| crate::policy::TailShape::split(split);
        let cases: [(SchedulerConfig, &str); 10] = [
            (SchedulerConfig { drop_guard: Some(0.0), ..Default::default() }, "drop_guard"),
            (
                SchedulerConfig { drop_guard: Some(0.1), weighting: Weighting::Tokens, ..Default::default() },
                "drop_guard",
            ),
            (SchedulerConfig { max_micro_batches: Some(7), ..Default::default() }, "max_micro_batches"),
            (SchedulerConfig { micro_batches: 0, ..Default::default() }, "micro_batches"),
            (SchedulerConfig { sync_lag: 8, ..Default::default() }, "sync_lag"),
            (SchedulerConfig { gradient_len: 0, ..Default::default() }, "gradient_len"),
            (SchedulerConfig { bucket_bytes: 3, ..Default::default() }, "bucket_bytes"),
            (SchedulerConfig { straggler_ewma_alpha: f64::NAN, ..Default::default() }, "straggler_ewma_alpha"),
            (SchedulerConfig { tail: tail(0), ..Default::default() }, "tail.split"),
            (SchedulerConfig { tail: tail(3), micro_batch_size: 16, ..Default::default() }, "tail.split"),
        ];
        for (cfg, field) in cases {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        assert!(SchedulerConfig::default().validate().is_ok());
        let c =
            SchedulerConfig { tail: tail(4), micro_batch_size: 16, max_micro_batches: Some(12), ..Default::default() };
        assert!(c.validate().is_ok());
        assert_eq!((c.slots(), c.parts(), c.part_slots()), (12, 4, 48));
    }
}
