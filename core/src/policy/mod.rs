//! The DropCompute deadline policy: one pure decision function shared by the step scheduler
//! (`schedule`, real execution) and the simulator (`sim`), so that simulation and execution
//! cannot disagree about when a micro-batch is started.
//!
//! Owns: [`Threshold`], [`CheckMode`], [`DeadlineConfig`], [`decide`] and the per-rank online
//! [`LatencyEstimator`]; the step policies beyond dropping ([`kind`]: [`Policy`], [`StepPolicy`],
//! backup workers' aggregation), the micro-batch assignment of rebalancing ([`rebalance`]), the
//! one per-rank step walk ([`walk`]: what to launch next), the one assignment step
//! ([`assign`]: how many parts each rank gets next step) and the length buckets of the
//! length-aware policies ([`bucket`]: the per-bucket estimator and the cost-balanced deal) and the
//! run-time drop-rate guard ([`guard`]: whether a step runs with the threshold in force). The scheduler, the simulator and the
//! faces drive [`walk::RankWalk`] and [`assign::Assigner`]; none of them holds a copy.
//! Must not touch: clocks, I/O, devices or collectives. Callers pass the
//! elapsed compute time (ns, measured from device events by the scheduler, or summed latencies by
//! the simulator) and the step index; this module never reads time itself.
//!
//! Semantics follow the reference implementation (`../shared/reference/dropcompute.md` §2): the
//! compute clock starts when the previous optimizer step completes; the check runs at
//! micro-batch boundaries; warm-up steps never drop.
#![forbid(unsafe_code)]

pub mod assign;
pub mod bucket;
pub mod guard;
pub mod kind;
pub mod rebalance;
pub mod walk;

pub use bucket::{BucketEstimator, BucketTokens, WalkEstimator, cost_balance, cost_balance_parts};
pub use guard::{DropGuard, DropGuardError};
pub use kind::{MAX_TAIL_SPLIT, Policy, StepPolicy, TailRule, TailShape, TailShapeError, backup_aggregated};
pub use rebalance::{RankLatencyTracker, RebalanceConfig, Rebalancer, TrackerConfig};

use std::time::Duration;

/// The compute deadline per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Threshold {
    /// No deadline: the plain synchronous baseline (every micro-batch is started).
    #[default]
    Off,
    /// Deadline on the compute phase of every step, measured from the end of the previous
    /// optimizer step (reference §2). Set by the user or driven by the tuner (`tune`).
    Fixed(Duration),
}

impl Threshold {
    /// The deadline in nanoseconds, `None` for [`Threshold::Off`]. Durations longer than
    /// `u64::MAX` ns (584 years) saturate.
    pub fn as_ns(&self) -> Option<u64> {
        match self {
            Threshold::Off => None,
            Threshold::Fixed(d) => Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        }
    }

    /// The deadline of `ns` nanoseconds, [`Threshold::Off`] for `None`: the `Option<u64>` of
    /// reports, checkpoints and the faces.
    pub fn from_ns(ns: Option<u64>) -> Threshold {
        ns.map_or(Threshold::Off, |ns| Threshold::Fixed(Duration::from_nanos(ns)))
    }

    /// The deadline at a search candidate of `ns` nanoseconds (f64: the tuner's grid), rounded
    /// to the nearest ns; [`Threshold::Off`] when `ns` is negative, not finite or beyond
    /// `u64::MAX`.
    pub fn from_ns_f64(ns: f64) -> Threshold {
        let ns = ns.round();
        if ns.is_finite() && ns >= 0.0 && ns < u64::MAX as f64 {
            Threshold::Fixed(Duration::from_nanos(ns as u64))
        } else {
            Threshold::Off
        }
    }

    /// The deadline in milliseconds (ns / 1e6), `None` for [`Threshold::Off`]: the unit of
    /// flags and files (report.json, steps.csv, `tune --json`).
    pub fn as_ms(&self) -> Option<f64> {
        self.as_ns().map(|ns| ns as f64 / 1e6)
    }

    /// The deadline of `ms` milliseconds rounded to the nearest ns, the one conversion from a
    /// flag's or a file's ms (so [`Threshold::as_ms`] gives back the same ns); `None` when `ms`
    /// is not finite, negative, or beyond `u64::MAX` ns.
    pub fn from_ms(ms: f64) -> Option<Threshold> {
        // `from_ns_f64` is off exactly for what is not a deadline (0 ms is `Fixed(0)`).
        match Threshold::from_ns_f64(ms * 1e6) {
            Threshold::Off => None,
            t => Some(t),
        }
    }
}

/// Serde of a [`Threshold`] as milliseconds at a file edge: `null` (or absent, with
/// `#[serde(default)]`) is [`Threshold::Off`], a number is [`Threshold::from_ms`]. Use with
/// `#[serde(with = "crate::policy::threshold_ms")]`.
pub mod threshold_ms {
    use super::Threshold;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes [`Threshold::as_ms`] (`null` when off).
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(t: &Threshold, s: S) -> Result<S::Ok, S::Error> {
        match t.as_ms() {
            Some(ms) => s.serialize_f64(ms),
            None => s.serialize_none(),
        }
    }

    /// Reads `null` as off and a number of ms as [`Threshold::from_ms`].
    ///
    /// # Errors
    /// A value that is neither `null` nor a finite, non-negative number of ms.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Threshold, D::Error> {
        match Option::<f64>::deserialize(d)? {
            None => Ok(Threshold::Off),
            Some(ms) => Threshold::from_ms(ms)
                .ok_or_else(|| serde::de::Error::custom(format!("{ms} ms is not a deadline (finite, >= 0)"))),
        }
    }
}

/// Where and how the deadline is checked. Command-line and JSON names (one spelling):
/// `before`, `predictive` (JSON also reads the older `BeforeMicroBatch`, `Predictive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum CheckMode {
    /// Start micro-batch k iff the elapsed compute time is strictly below the threshold (the
    /// reference BERT-Large behaviour: the micro-batch in flight always finishes, so the compute
    /// phase overshoots the threshold by up to one micro-batch).
    #[default]
    #[cfg_attr(feature = "clap", value(help = "Check before each micro-batch (reference)"))]
    #[cfg_attr(feature = "clap", value(name = "before"))]
    #[serde(rename = "before", alias = "BeforeMicroBatch")]
    BeforeMicroBatch,
    /// Start micro-batch k iff elapsed + estimated latency of micro-batch k <= threshold (ours).
    /// Without an estimate this behaves exactly like [`CheckMode::BeforeMicroBatch`].
    #[cfg_attr(
        feature = "clap",
        value(help = "Elapsed + estimated latency of the next micro-batch <= threshold (ours)")
    )]
    #[serde(rename = "predictive", alias = "Predictive")]
    Predictive,
}

impl CheckMode {
    /// The command-line and JSON name (`--check before`, `--check predictive`), for messages
    /// (never the Rust variant name).
    pub fn name(self) -> &'static str {
        match self {
            Self::BeforeMicroBatch => "before",
            Self::Predictive => "predictive",
        }
    }
}

impl std::fmt::Display for CheckMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the deadline is checked in one job (identical on every rank): the threshold, the check
/// mode, the warm-up steps and the micro-batches always started; the input of [`decide`]. The
/// step policy itself (which policy, its parameters) is a [`StepPolicy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadlineConfig {
    /// The deadline in force.
    pub threshold: Threshold,
    /// The check point semantics.
    pub check: CheckMode,
    /// Steps `0..warmup_steps` (0-based step index) never drop: graph compilation and warm-up
    /// happen there. The reference uses 3 (BERT-Large) and 5 (DeepSpeed BERT-1.5B).
    pub warmup_steps: u64,
    /// The first `min_micro_batches` micro-batches of every step always start, whatever the
    /// clock says (0 allows a rank to compute nothing).
    pub min_micro_batches: u32,
}

impl Default for DeadlineConfig {
    /// Threshold off, check before each micro-batch, 3 warm-up steps (reference BERT-Large
    /// `MIN_DROP_STEP`), at least 1 micro-batch per rank per step.
    fn default() -> Self {
        Self { threshold: Threshold::Off, check: CheckMode::BeforeMicroBatch, warmup_steps: 3, min_micro_batches: 1 }
    }
}

/// Why a micro-batch was not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The elapsed compute time reached the threshold (`elapsed_ns >= threshold_ns`).
    ThresholdReached {
        /// Elapsed compute time of this step when checked (ns).
        elapsed_ns: u64,
        /// The threshold (ns).
        threshold_ns: u64,
    },
    /// Predictive mode: the micro-batch would finish after the threshold
    /// (`elapsed_ns + estimate_ns > threshold_ns`, while `elapsed_ns < threshold_ns`).
    PredictedOvershoot {
        /// Elapsed compute time of this step when checked (ns).
        elapsed_ns: u64,
        /// Estimated latency of the next micro-batch (ns).
        estimate_ns: u64,
        /// The threshold (ns).
        threshold_ns: u64,
    },
}

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start the next micro-batch.
    Start,
    /// Do not start it (and, the policy being monotone in elapsed time, none after it).
    Stop(StopReason),
}

impl Decision {
    /// True for [`Decision::Start`].
    pub fn is_start(&self) -> bool {
        matches!(self, Decision::Start)
    }
}

/// Decide whether to start the next micro-batch of `step` on this rank.
///
/// - `step`: 0-based global step index (compared with `cfg.warmup_steps`).
/// - `started`: micro-batches already started in this step (so the candidate is micro-batch
///   index `started`, 0-based). The caller bounds it by M.
/// - `elapsed_ns`: compute time elapsed in this step (ns since the previous optimizer step ended).
/// - `estimate_ns`: estimated latency of the next micro-batch (ns), used only in
///   [`CheckMode::Predictive`]; `None` falls back to [`CheckMode::BeforeMicroBatch`].
///
/// Guarantees (property-tested): warm-up steps always start; the first
/// `cfg.min_micro_batches` always start; for fixed other arguments the decision is monotone in
/// `elapsed_ns` (once it stops, any larger elapsed time stops too). Never panics.
pub fn decide(cfg: &DeadlineConfig, step: u64, started: u32, elapsed_ns: u64, estimate_ns: Option<u64>) -> Decision {
    let Some(threshold_ns) = cfg.threshold.as_ns() else {
        return Decision::Start;
    };
    if step < cfg.warmup_steps || started < cfg.min_micro_batches {
        return Decision::Start;
    }
    if elapsed_ns >= threshold_ns {
        return Decision::Stop(StopReason::ThresholdReached { elapsed_ns, threshold_ns });
    }
    match (cfg.check, estimate_ns) {
        (CheckMode::Predictive, Some(estimate_ns)) if elapsed_ns.saturating_add(estimate_ns) > threshold_ns => {
            Decision::Stop(StopReason::PredictedOvershoot { elapsed_ns, estimate_ns, threshold_ns })
        }
        _ => Decision::Start,
    }
}

/// The nominal batch of one step, in parts: `full` (N·M·S) less what the data could not hand
/// out (Σ_r max(0, assignment_r - handed_r): an epoch-bounded stream's end), never below
/// `aggregated` (a compute budget may aggregate more than N·M·S). `assignment` and `handed`
/// are per rank in parts. The one definition of the replay (`sim::policies`) and of the
/// measured runs (`schedule::StepReport::nominal_parts`).
pub fn step_nominal(full: u64, assignment: &[u32], handed: impl IntoIterator<Item = u32>, aggregated: u64) -> u64 {
    let short: u64 = assignment.iter().zip(handed).map(|(&a, h)| u64::from(a.saturating_sub(h))).sum();
    full.saturating_sub(short).max(aggregated)
}

/// A step's nominal batch in tokens: the tokens handed out (computed + dropped, over every
/// rank) per handed part, times the step's nominal parts ([`step_nominal`]); 0 when nothing
/// was handed out. So a policy that hands out more than the nominal batch (the compute budget:
/// 2·M per rank) or less (backup workers: 0 to the skipped ranks) is judged in tokens as in
/// parts, against the nominal batch. The one definition of the replay
/// (`sim::policies::PolicyReplay::tokens`) and of the measured text runs
/// (`schedule::StepReport::nominal_tokens`).
pub fn step_nominal_tokens(handed_tokens: f64, handed_parts: u64, nominal_parts: u64) -> f64 {
    if handed_parts == 0 { 0.0 } else { handed_tokens * nominal_parts as f64 / handed_parts as f64 }
}

/// The drop rate of a run against its nominal batch: the parts missing from each step's
/// gradient, Σ_s max(0, nominal_s - aggregated_s), over Σ_s nominal_s (a fraction in [0, 1];
/// 0 for no step). `steps` yields (nominal_s, aggregated_s) per step, in parts (whole
/// micro-batches without a tail shape). The one drop-rate definition of the replay
/// (`sim::policies::PolicyReplay::drop_rate`) and of the measured runs (`validate`): a policy
/// that hands out more than the nominal batch (the compute budget) is judged by what is missing
/// from the nominal batch, not by what was handed out and left.
pub fn nominal_drop_rate(steps: impl IntoIterator<Item = (u64, u64)>) -> f64 {
    nominal_drop_rate_of(steps.into_iter().map(|(nom, agg)| (nom as f64, agg as f64)))
}

/// [`nominal_drop_rate`] over (nominal_s, aggregated_s) in any unit as f64 (tokens:
/// [`step_nominal_tokens`] and the computed tokens): Σ_s max(0, nominal_s - aggregated_s) over
/// Σ_s nominal_s, 0 for no work. Exact for part counts below 2^53.
pub fn nominal_drop_rate_of(steps: impl IntoIterator<Item = (f64, f64)>) -> f64 {
    let (lost, nominal) =
        steps.into_iter().fold((0.0f64, 0.0f64), |(l, n), (nom, agg)| (l + (nom - agg).max(0.0), n + nom));
    if nominal > 0.0 { lost / nominal } else { 0.0 }
}

/// Online estimate of this rank's next micro-batch latency: a high quantile (nearest rank) of a
/// sliding window of the most recent observed latencies.
///
/// Why a quantile and not a mean (EWMA): the predictive check overshoots the threshold only when
/// the started micro-batch is slower than the estimate. With estimate = the q-quantile of
/// recent latencies, that happens with probability about 1 - q per step and rank (i.i.d.
/// latencies), independent of the tail shape. Under the reference noise (latency =
/// base·(1 + 0.5·mult), mult with p90 2.23, p99 5.99; reference §4) the default q = 0.9 over 32
/// samples keeps the *median* realized compute time at or below the threshold, i.e. well within
/// the 5 % overshoot budget, at the cost of stopping earlier than a mean-based estimate would
/// (a mean would overshoot in about 40 % of steps, by up to 3 base latencies). The window keeps
/// the estimate tracking slow drifts (thermal, data mix) within 32 micro-batches.
///
/// Once asked for an estimate, the window is kept sorted beside its arrival order, so an
/// estimate is one index (O(1)) and an observation one binary search and shift of at most
/// `window` values; before that (a before-check run never asks) an observation only writes the
/// ring. The replay feeds the estimator once per micro-batch: `simulate --policy all` spent
/// 63 % of its time selecting the quantile from a copy of the window.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(from = "EstimatorState")]
pub struct LatencyEstimator {
    window: Vec<u64>,
    capacity: usize,
    next: usize,
    quantile: f64,
    /// The window's values in ascending order once `sorted_live` (serialized under its former
    /// name, `scratch`; rebuilt from `window` when read back).
    #[serde(rename = "scratch")]
    sorted: Vec<u64>,
    /// Whether `sorted` is maintained (set by the first [`LatencyEstimator::estimate`]).
    #[serde(skip)]
    sorted_live: bool,
}

impl PartialEq for LatencyEstimator {
    /// Equal windows (in arrival order), positions and quantiles: the same estimates.
    fn eq(&self, other: &Self) -> bool {
        (&self.window, self.capacity, self.next, self.quantile.to_bits())
            == (&other.window, other.capacity, other.next, other.quantile.to_bits())
    }
}

/// What a checkpoint holds of a [`LatencyEstimator`]: the sorted copy is rebuilt on reading
/// (a checkpoint written before it was kept sorted holds an unordered scratch copy there).
#[derive(serde::Deserialize)]
struct EstimatorState {
    window: Vec<u64>,
    capacity: usize,
    next: usize,
    quantile: f64,
}

impl From<EstimatorState> for LatencyEstimator {
    fn from(s: EstimatorState) -> Self {
        let capacity = s.capacity.max(1);
        let mut window = s.window;
        window.truncate(capacity);
        let mut sorted = window.clone();
        sorted.sort_unstable();
        let quantile = if s.quantile.is_nan() { 1.0 } else { s.quantile.clamp(0.0, 1.0) };
        Self { next: s.next % capacity, window, capacity, quantile, sorted, sorted_live: true }
    }
}

impl LatencyEstimator {
    /// Default window length (micro-batches).
    pub const DEFAULT_WINDOW: usize = 32;
    /// Default quantile.
    pub const DEFAULT_QUANTILE: f64 = 0.9;

    /// A new estimator over the last `window` latencies (clamped to >= 1) returning their
    /// `quantile` (clamped to [0, 1]; NaN counts as 1, the most conservative choice).
    pub fn new(window: usize, quantile: f64) -> Self {
        let capacity = window.max(1);
        let quantile = if quantile.is_nan() { 1.0 } else { quantile.clamp(0.0, 1.0) };
        Self {
            window: Vec::with_capacity(capacity),
            capacity,
            next: 0,
            quantile,
            sorted: Vec::with_capacity(capacity),
            sorted_live: false,
        }
    }

    /// Record the measured latency (ns) of a completed micro-batch of this rank.
    pub fn observe(&mut self, latency_ns: u64) {
        let new = latency_ns;
        if !self.sorted_live {
            if self.window.len() < self.capacity {
                self.window.push(new);
            } else {
                self.window[self.next] = new;
            }
        } else if self.window.len() < self.capacity {
            self.window.push(new);
            let at = self.sorted.partition_point(|&v| v < new);
            self.sorted.insert(at, new);
        } else {
            // Replace the evicted value in the sorted copy: shift the values between its place
            // and the new value's place by one (no removal and reinsertion).
            let old = std::mem::replace(&mut self.window[self.next], new);
            let s = &mut self.sorted;
            let i = s.partition_point(|&v| v < old);
            if new >= old {
                let j = s.partition_point(|&v| v <= new).max(i + 1);
                s.copy_within(i + 1..j, i);
                s[j - 1] = new;
            } else {
                let j = s.partition_point(|&v| v < new);
                s.copy_within(j..i, j + 1);
                s[j] = new;
            }
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// The estimated latency (ns) of the next micro-batch: the nearest-rank `quantile` of the
    /// window; `None` before the first observation.
    pub fn estimate(&mut self) -> Option<u64> {
        if self.window.is_empty() {
            return None;
        }
        let n = self.window.len();
        // Nearest rank: ceil(q n) - 1, clamped to [0, n - 1].
        if !self.sorted_live {
            self.sorted.clear();
            self.sorted.extend_from_slice(&self.window);
            self.sorted.sort_unstable();
            self.sorted_live = true;
        }
        let rank = ((self.quantile * n as f64).ceil() as usize).clamp(1, n) - 1;
        self.sorted.get(rank).copied()
    }

    /// Number of latencies currently in the window.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// True before the first observation.
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }
}

impl Default for LatencyEstimator {
    /// Window 32, quantile 0.9 (see the type's documentation).
    fn default() -> Self {
        Self::new(Self::DEFAULT_WINDOW, Self::DEFAULT_QUANTILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(th: Option<u64>, check: CheckMode, warmup: u64, min_mb: u32) -> DeadlineConfig {
        DeadlineConfig {
            threshold: th.map_or(Threshold::Off, |t| Threshold::Fixed(Duration::from_nanos(t))),
            check,
            warmup_steps: warmup,
            min_micro_batches: min_mb,
        }
    }

    fn check_mode() -> impl Strategy<Value = CheckMode> {
        prop_oneof![Just(CheckMode::BeforeMicroBatch), Just(CheckMode::Predictive)]
    }

    #[test]
    fn the_drop_rate_counts_what_the_nominal_batch_misses() {
        // A step over the nominal batch (compute budget) does not offset one under it.
        assert_eq!(nominal_drop_rate([(32, 40), (32, 24)]), 8.0 / 64.0);
        assert_eq!(nominal_drop_rate([(32, 32)]), 0.0);
        assert_eq!(nominal_drop_rate(std::iter::empty()), 0.0);
    }

    #[test]
    fn before_micro_batch_boundary_is_strict() {
        let c = cfg(Some(100), CheckMode::BeforeMicroBatch, 0, 0);
        assert_eq!(decide(&c, 5, 3, 99, None), Decision::Start);
        assert_eq!(
            decide(&c, 5, 3, 100, None),
            Decision::Stop(StopReason::ThresholdReached { elapsed_ns: 100, threshold_ns: 100 })
        );
        // The estimate is ignored in this mode.
        assert_eq!(decide(&c, 5, 3, 10, Some(1000)), Decision::Start);
    }

    /// The first step after warm-up and the first micro-batch after the `min_micro_batches`
    /// guaranteed ones are subject to the threshold (the guarantees are strict: `<`, not `<=`).
    #[test]
    fn warmup_and_min_micro_batches_end_exactly_at_their_counts() {
        let stop = Decision::Stop(StopReason::ThresholdReached { elapsed_ns: 100, threshold_ns: 100 });
        let c = cfg(Some(100), CheckMode::BeforeMicroBatch, 3, 2);
        assert_eq!(decide(&c, 2, 5, 100, None), Decision::Start, "last warm-up step");
        assert_eq!(decide(&c, 3, 5, 100, None), stop, "first step after warm-up");
        assert_eq!(decide(&c, 3, 1, 100, None), Decision::Start, "second guaranteed micro-batch");
        assert_eq!(decide(&c, 3, 2, 100, None), stop, "first micro-batch after the guaranteed ones");
    }

    #[test]
    fn predictive_stops_on_predicted_overshoot_and_falls_back_without_estimate() {
        let c = cfg(Some(100), CheckMode::Predictive, 0, 0);
        assert_eq!(decide(&c, 5, 3, 60, Some(40)), Decision::Start);
        assert_eq!(
            decide(&c, 5, 3, 60, Some(41)),
            Decision::Stop(StopReason::PredictedOvershoot { elapsed_ns: 60, estimate_ns: 41, threshold_ns: 100 })
        );
        assert_eq!(decide(&c, 5, 3, 60, None), Decision::Start);
        assert!(!decide(&c, 5, 3, u64::MAX - 1, Some(u64::MAX)).is_start());
    }

    #[test]
    fn estimator_returns_nearest_rank_quantile_of_recent_window() {
        let mut e = LatencyEstimator::new(10, 0.9);
        assert_eq!(e.estimate(), None);
        assert!(e.is_empty());
        assert_eq!(e.len(), 0);
        e.observe(10);
        assert!(!e.is_empty());
        assert_eq!(e.len(), 1);
        let mut e = LatencyEstimator::new(10, 0.9);
        for v in 1..=10u64 {
            e.observe(v * 10);
        }
        // ceil(0.9 * 10) = 9th smallest of 10..100 = 90.
        assert_eq!(e.estimate(), Some(90));
        // The window slides: after 10 more observations of 5 the old values are gone.
        for _ in 0..10 {
            e.observe(5);
        }
        assert_eq!(e.estimate(), Some(5));
        assert_eq!(e.len(), 10);
        let mut m = LatencyEstimator::new(3, 1.0);
        m.observe(7);
        m.observe(3);
        assert_eq!(m.estimate(), Some(7));
    }

    /// A checkpoint written before the window was kept sorted (an unordered `scratch` copy)
    /// reads back with the right estimate, and a read-back estimator equals the original.
    #[test]
    fn an_estimator_reads_back_from_old_and_new_checkpoints() {
        let old = r#"{"window":[30,10,20],"capacity":4,"next":3,"quantile":1.0,"scratch":[20,30,10]}"#;
        let mut e: LatencyEstimator = serde_json::from_str(old).expect("old form");
        assert_eq!(e.estimate(), Some(30));
        e.observe(5);
        e.observe(40); // evicts 30 (the oldest)
        assert_eq!((e.estimate(), e.len()), (Some(40), 4));
        let back: LatencyEstimator = serde_json::from_str(&serde_json::to_string(&e).expect("json")).expect("new");
        assert_eq!(back, e);
    }

    proptest! {
        /// The sorted window gives the nearest-rank quantile of the last `window` values, as a
        /// selection over them (the f64-free reference).
        #[test]
        fn the_estimate_is_the_nearest_rank_quantile_of_the_last_window_values(
            values in proptest::collection::vec(0u64..50, 1..200), window in 1usize..40, q in 0.0f64..=1.0) {
            let mut e = LatencyEstimator::new(window, q);
            // Never asked until the end: the ring alone, sorted on the first estimate.
            let mut lazy = LatencyEstimator::new(window, q);
            for &v in &values {
                lazy.observe(v);
            }
            for (i, &v) in values.iter().enumerate() {
                e.observe(v);
                let mut last: Vec<u64> = values[(i + 1).saturating_sub(window)..=i].to_vec();
                last.sort_unstable();
                let rank = ((q * last.len() as f64).ceil() as usize).clamp(1, last.len()) - 1;
                prop_assert_eq!(e.estimate(), Some(last[rank]));
            }
            prop_assert_eq!(lazy.estimate(), e.estimate());
            prop_assert_eq!(&lazy, &e);
        }

        #[test]
        fn warmup_steps_never_stop(warmup in 1u64..50, step_frac in 0.0f64..1.0, started in 0u32..64,
                                   elapsed in any::<u64>(), est in proptest::option::of(any::<u64>()),
                                   th in 0u64..1_000_000, check in check_mode()) {
            let step = ((warmup as f64) * step_frac) as u64;
            prop_assume!(step < warmup);
            let c = cfg(Some(th), check, warmup, 0);
            prop_assert_eq!(decide(&c, step, started, elapsed, est), Decision::Start);
        }

        #[test]
        fn min_micro_batches_always_start(min_mb in 1u32..16, started_frac in 0.0f64..1.0, step in any::<u64>(),
                                          elapsed in any::<u64>(), est in proptest::option::of(any::<u64>()),
                                          th in 0u64..1_000_000, check in check_mode()) {
            let started = ((min_mb as f64) * started_frac) as u32;
            prop_assume!(started < min_mb);
            let c = cfg(Some(th), check, 0, min_mb);
            prop_assert_eq!(decide(&c, step, started, elapsed, est), Decision::Start);
        }

        #[test]
        fn monotone_in_elapsed(a in any::<u64>(), b in any::<u64>(), step in 0u64..10, started in 0u32..8,
                               est in proptest::option::of(0u64..1_000_000), th in 0u64..2_000_000,
                               warmup in 0u64..4, min_mb in 0u32..3, check in check_mode()) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let c = cfg(Some(th), check, warmup, min_mb);
            if !decide(&c, step, started, lo, est).is_start() {
                prop_assert!(!decide(&c, step, started, hi, est).is_start());
            }
        }

        #[test]
        fn off_always_starts(step in any::<u64>(), started in any::<u32>(), elapsed in any::<u64>(),
                             est in proptest::option::of(any::<u64>()), check in check_mode()) {
            let c = cfg(None, check, 0, 0);
            prop_assert_eq!(decide(&c, step, started, elapsed, est), Decision::Start);
        }

        #[test]
        fn predictive_start_implies_fit(elapsed in 0u64..1_000_000, est in 0u64..1_000_000, th in 1u64..2_000_000) {
            let c = cfg(Some(th), CheckMode::Predictive, 0, 0);
            let d = decide(&c, 10, 2, elapsed, Some(est));
            prop_assert_eq!(d.is_start(), elapsed < th && elapsed + est <= th);
        }

        /// The boundary the random draws above almost never hit: a micro-batch predicted to
        /// end exactly at the threshold fits (start), one nanosecond more does not (stop).
        #[test]
        fn predictive_exact_fit_starts_one_ns_more_stops(elapsed in 0u64..1_000_000, th in 1u64..2_000_000) {
            prop_assume!(elapsed < th);
            let c = cfg(Some(th), CheckMode::Predictive, 0, 0);
            prop_assert_eq!(decide(&c, 10, 2, elapsed, Some(th - elapsed)), Decision::Start);
            prop_assert_eq!(
                decide(&c, 10, 2, elapsed, Some(th - elapsed + 1)),
                Decision::Stop(StopReason::PredictedOvershoot { elapsed_ns: elapsed, estimate_ns: th - elapsed + 1, threshold_ns: th })
            );
        }
    }
}
