//! Replay of a trace under any step policy ([`Policy`]): what every rank computes, which ranks'
//! work enters the gradient, and the step time, on the trace's recorded latencies (common
//! random numbers: every policy sees the same latencies).
//!
//! Owns: [`PolicyRun`], [`PolicyReplay`], [`ReplayData`], [`PartShape`], [`replay_policy`] and
//! [`replay_policy_on`]. Must not touch: parsing, tuning,
//! devices, and the decisions themselves: each rank's step is the one walker
//! ([`crate::policy::walk::RankWalk`], the scheduler's), each step's assignment the one
//! assignment step ([`crate::policy::assign::Assigner`], the scheduler's);
//! [`super::replay::replay`] (DropCompute) is this replay with a drop policy. This module only
//! feeds them the trace's latencies and adds up the step times.
//!
//! Per step and rank (see [`super::replay`] for the sync lag, the start offset, the clock skew,
//! warm-up and the predictive estimator; a step's time is `max_r(skew_r + offset_r +
//! compute_r) + overhead`, [`StepTimes`]), per policy (the module docs of `policy::assign` and `policy::walk`):
//! - `synchronous`: all M micro-batches; the step waits for the slowest rank.
//! - `drop-before` / `drop-predictive` / `rebalance-drop`: the deadline at the threshold with
//!   the policy's check mode ([`Policy::check_mode`]).
//! - `backup-workers` (b): the b ranks predicted slowest from the previous steps compute
//!   nothing, as the scheduler runs it (a launched graph cannot be aborted, so the choice is
//!   made before the step). With b = 0 this is the synchronous step, bit for bit.
//! - `compute-budget`: the deadline at the budget (the configured check), up to
//!   [`crate::policy::StepPolicy::budget_cap`] micro-batches after warm-up, M in warm-up.
//! - `rebalance` / `rebalance-drop`: the assignment of a [`crate::policy::Rebalancer`], updated
//!   after every step from each rank's mean latency per computed micro-batch (what the
//!   scheduler learns from the all-reduced counts and times).
//! - `length-predictive` (a trace with buckets, [`LatencyTrace::buckets`]): the deadline with the
//!   predictive check, each rank's walk told its micro-batches' buckets
//!   ([`RankWalk::set_buckets`]) and estimating with a per-rank
//!   [`crate::policy::BucketEstimator`]. Without buckets (or in a step beyond the trace) it is
//!   `drop-predictive`.
//! - `cost-balance` (a trace with buckets): before each recorded step, the step's N·M recorded
//!   micro-batches are dealt to ranks by [`crate::policy::cost_balance`] over their buckets'
//!   predicted costs ([`crate::policy::bucket::bucket_cost`] of one job-wide
//!   [`crate::policy::BucketEstimator`], fed after each step with every rank's whole
//!   micro-batches' latencies, as the gathered count rows give them to every rank), at most
//!   the run's cap each ([`StepPolicy::deal_cap`]: 2·M within [`PolicyRun::slots`], as the
//!   scheduler caps its deal within its slots); the counts become the step's assignment ([`Assigner::set`]), and each
//!   rank walks its dealt micro-batches in stream order under the length-aware deadline. A
//!   micro-batch keeps its recorded latency on whichever rank it is dealt to: the model of
//!   data-driven stragglers (`--noise none`: a micro-batch's cost is its bucket's), not of a
//!   slow rank (a rank's own slowdown does not follow the micro-batches it is dealt). Without
//!   buckets every rank keeps its own M (then it is `length-predictive`).
//!
//! What the data deals ([`ReplayData::knows_shapes`]: a text job's stream,
//! `deal::ReplayStream::with_shapes`), on a trace with buckets: the run re-queues what it
//! drops, so its later micro-batches are not the baseline's at the same position. Whole
//! micro-batch j of rank r then takes the recorded latency of its cell scaled by
//! cost(dealt bucket) / cost(recorded bucket), a bucket's cost rank r's mean recorded latency
//! of that bucket (`rank_bucket_means`; the trace's, `bucket_means`, when the rank recorded
//! only one of the two: exact with `--noise none`, where a micro-batch's device time is its
//! bucket's times its rank's slowdown; the trace's means mix a slow rank's cells into each
//! bucket in another share; with noise the cell's multiplier is kept); a bucket the trace
//! never recorded keeps the cell's latency. Its cell is (step, r, j) (the mock keys a launch's
//! noise by module, step and index: every recipe of the text job draws as one), beyond M
//! under `cost-balance` a cell of the rank computing it (its cell of the dealt bucket in the
//! step, else cell j mod M: another rank's cell would carry that rank's speed), else a draw
//! beyond the record as above, scaled alike (not
//! [`ReplayData::latency`], which knows a position, not its unit: with `--epochs 1`, 600
//! documents and a 3.5 ms deadline it put the three policies +0.01 to +2.1 % off, the draws
//! +0.01 %, the rest being the estimated steps' mean offsets and overhead). Under `cost-balance`
//! the step's N·M·S parts of the stream are dealt by cost as the run deals them
//! ([`ReplayData::deal_by`], [`crate::policy::cost_balance_parts`] over the dealt micro-batches'
//! bucket costs; by counts when the stream cannot deal a whole window, as the run). The
//! length-aware walk is told the dealt buckets; a tail part (a tail shape) takes the tail cost
//! fraction of its micro-batch's latency scaled to the part's own bucket (the tail recipe's own
//! cost is not in the record: not exact, README). The tokens are the dealt parts' own
//! (a step's nominal tokens: those handed out, per nominal part); a rank whose dealt parts'
//! shapes are unknown counts its recorded cells' tokens, started and handed out alike, so they
//! stay in the step's nominal tokens (the scheduler refuses such a micro-batch under token
//! weighting: `ScheduleError::Data`). Without shapes every number is as before.
//!
//! Micro-batches beyond the trace's M (a rank given more work by rebalancing or a compute
//! budget) are an estimate: micro-batch i >= M of rank r in step s takes the latency of one of
//! the same rank's recorded micro-batches of any step (S·M values), drawn uniformly from
//! `rng::stream(seed, s·N + r)` in order of i (ours: the rank's own speed; every policy draws
//! the same sequence, so the comparison stays paired). Measured against the run (`validate
//! --ranks 4,8 --micro-batches 8 --check predictive --seeds 0,1,2 --slow-rank 3:2,1:1.5
//! --steps 20`, 12 configurations each; speedup error median |e| / mean signed), this rule
//! against drawing from the same step's M only: rebalance 0.85 % / +0.22 % (was 1.35 % /
//! -1.32 %), rebalance-drop 0.66 % / +0.58 % (0.82 % / +0.72 %), compute-budget at 160 ms
//! 0.77 % / -0.52 % (1.03 % / +1.15 %); the worst configuration stays near 3 % either way.
//!
//! The drop-rate guard ([`ExecutionModel::drop_guard`], the policies that drop,
//! [`Policy::drops`]: a compute budget's deadline is not a drop threshold): before each step a
//! [`crate::policy::DropGuard`] is asked with the step's nominal parts N·M·S, as the scheduler
//! asks it (in tokens: the step's recorded tokens, the trace's mean beyond the record); a step
//! it holds off is walked with the threshold off; after it the guard is fed the step's nominal
//! and aggregated parts (or tokens), as [`PolicyReplay::drop_rate`] counts them
//! ([`PolicyReplay::enforced`]).
//!
//! Normalization is exact: a step's gradient is divided by the micro-batches aggregated (global
//! computed samples); the effective speedup is aggregated/nominal · baseline/policy step time - 1
//! (samples per second against the synchronous run). On a trace in tokens
//! ([`LatencyTrace::tokens`], a run whose unit of work is tokens) the aggregated and nominal
//! work, the drop rate and the effective speedup are in real tokens
//! ([`PolicyReplay::tokens`]; the counts stay in parts).

use std::collections::BTreeMap;

use rand::Rng;

use super::rng;
use crate::policy::assign::Assigner;
use crate::policy::bucket::{BucketEstimator, WalkEstimator, bucket_cost, cost_balance, cost_balance_parts};
use crate::policy::walk::{Next, RankWalk};
use crate::policy::{CheckMode, DeadlineConfig, DropGuard, LatencyEstimator, Policy, StepPolicy, TailShape, Threshold};
use crate::trace::LatencyTrace;

/// How the scheduler executes the deadline (everything but the threshold): the check mode, the
/// sync lag, the warm-up steps, the micro-batches always computed and the run-time drop-rate
/// guard. Defaults are `train`'s: predictive check, sync lag 0, 3 warm-up steps, 1
/// micro-batch, no guard.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExecutionModel {
    /// The check point semantics.
    pub check: CheckMode,
    /// Micro-batches the check lags behind the device (`train --sync-lag`).
    pub sync_lag: u32,
    /// Steps with a step id below this never drop.
    pub warmup_steps: u64,
    /// Micro-batches every rank always starts.
    pub min_micro_batches: u32,
    /// The run-time drop-rate guard's bound ([`DropGuard`]: a step runs with the threshold off
    /// when enforcing it could take the run's cumulative drop rate above this fraction; a
    /// fraction in (0, 1], [`DropGuard::check`]). `None` (the default): every step after the
    /// warm-up runs the threshold. The replay ignores a bound [`DropGuard::check`] refuses
    /// (the faces and `tune::check_inputs` refuse it first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_guard: Option<f64>,
}

impl Default for ExecutionModel {
    fn default() -> Self {
        Self { check: CheckMode::Predictive, sync_lag: 0, warmup_steps: 3, min_micro_batches: 1, drop_guard: None }
    }
}

impl ExecutionModel {
    /// The deadline policy of this execution at `threshold`.
    pub fn policy(&self, threshold: Threshold) -> DeadlineConfig {
        DeadlineConfig {
            threshold,
            check: self.check,
            warmup_steps: self.warmup_steps,
            min_micro_batches: self.min_micro_batches,
        }
    }
}

/// One policy replay's inputs besides the trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyRun {
    /// The policy and its parameters (b, budget, rebalancing).
    pub params: StepPolicy,
    /// The DropCompute threshold (drop policies only; ignored otherwise).
    pub threshold: Threshold,
    /// How the scheduler executes the deadline (check mode for `rebalance-drop`, sync lag,
    /// warm-up, micro-batches always computed).
    pub execution: ExecutionModel,
    /// Quantile of the predictive check's per-rank [`LatencyEstimator`] (window
    /// [`LatencyEstimator::DEFAULT_WINDOW`]); `train` runs [`LatencyEstimator::DEFAULT_QUANTILE`].
    pub estimator_quantile: f64,
    /// Seed of the draws of micro-batches beyond the trace's M (module doc).
    pub seed: u64,
    /// The run's micro-batch slots per rank and step (`SchedulerConfig::slots`, at least M):
    /// the most one rank may be handed, and `cost-balance`'s deal within them
    /// ([`StepPolicy::deal_cap`]). `None` (the default): the policy's cap
    /// ([`StepPolicy::budget_cap`], 2·M), as `train` sizes a run that moves work.
    pub slots: Option<u32>,
}

impl PolicyRun {
    /// `params` with the threshold and execution given, the default estimator quantile and
    /// seed 1.
    pub fn new(params: StepPolicy, threshold: Threshold, execution: ExecutionModel) -> Self {
        Self {
            params,
            threshold,
            execution,
            estimator_quantile: LatencyEstimator::DEFAULT_QUANTILE,
            seed: 1,
            slots: None,
        }
    }

    /// The run's micro-batch slots per rank for a nominal `m`: [`PolicyRun::slots`] (at least
    /// `m`), else the policy's cap ([`StepPolicy::budget_cap`]).
    pub fn slots_for(&self, m: u32) -> u32 {
        self.slots.map_or_else(|| self.params.budget_cap(m), |s| s.max(m))
    }

    /// The deadline the walk runs under ([`StepPolicy::deadline`] of this run's threshold).
    pub fn deadline(&self) -> Threshold {
        self.params.deadline(self.threshold)
    }
}

/// Outcome of [`replay_policy`]. Counts are in *parts* of 1/[`PolicyReplay::split`]
/// micro-batch ([`crate::policy::TailShape`]; with the default split 1, micro-batches):
/// multiply by B/split for samples.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyReplay {
    /// The policy replayed.
    pub policy: Policy,
    /// Parts per micro-batch (the tail shape's split; 1 without one).
    pub split: u32,
    /// Mean recorded (synchronous) step time, ns.
    pub baseline_step_ns: f64,
    /// Mean step time under the policy, ns.
    pub policy_step_ns: f64,
    /// Nominal parts: steps · N · M · split.
    pub nominal: u64,
    /// Micro-batches whose gradient was aggregated (the divisor's sum over steps).
    pub aggregated: u64,
    /// Micro-batches started (all of them enter the gradient: = aggregated).
    pub computed: u64,
    /// Micro-batches of the nominal batch missing from the gradient, summed over steps
    /// (Σ_s max(0, N·M - aggregated_s)): the samples lost (re-queued or discarded by the ledger).
    pub lost: u64,
    /// lost / nominal; in tokens when the trace carries them ([`PolicyReplay::tokens`]).
    pub drop_rate: f64,
    /// aggregated / nominal · baseline / policy step time - 1; in tokens when the trace
    /// carries them (the aggregated over the nominal real tokens).
    pub effective_speedup: f64,
    /// The work in real tokens when the trace carries them ([`LatencyTrace::tokens`], a run
    /// whose unit of work is tokens): (aggregated, nominal) summed over steps. A step's nominal
    /// tokens are its recorded N·M micro-batches' scaled by its nominal parts over N·M·S (an
    /// epoch's short step), or, with the dealt parts' shapes and under rebalancing
    /// ([`Policy::rebalances`]), the tokens handed out scaled by its nominal parts over the
    /// parts handed out; a started micro-batch counts its recorded tokens, a tail part its
    /// share 1/S of them, a micro-batch beyond the record (beyond M, or a step beyond the
    /// trace) the trace's mean per micro-batch (an estimate, as its latency is). `None` for a
    /// trace without tokens: then every count is in parts.
    pub tokens: Option<(f64, f64)>,
    /// Fewest micro-batches aggregated in one step.
    pub min_step_micro_batches: u64,
    /// Most micro-batches aggregated in one step.
    pub max_step_micro_batches: u64,
    /// Per step: (recorded ns, policy ns, micro-batches aggregated).
    pub per_step: Vec<(f64, f64, u64)>,
    /// Micro-batches started per step and rank (S x N, step-major).
    pub started: Vec<u32>,
    /// Micro-batches assigned per step and rank (S x N; M except under rebalancing; the cap
    /// under the compute budget).
    pub assigned: Vec<u32>,
    /// Compute phase per step (ns): the latest rank's compute end counted from the step's
    /// earliest clock start (`max_r(skew_r + end_r)`), the step's overhead excluded.
    pub compute_ns: Vec<f64>,
    /// Parts handed to each rank per step (S x N, step-major: its assignment, less what the
    /// [`ReplayData`] could not deal); handed - started were dropped.
    pub handed: Vec<u32>,
    /// Steps replayed beyond the trace's (a bounded [`ReplayData`] whose stream outlasts the
    /// recorded steps) whose start offsets and overhead the data did not know
    /// ([`ReplayData::step_times`]): an estimate.
    pub estimated_steps: u64,
    /// Micro-batch latencies drawn rather than recorded (beyond M, or in an estimated step):
    /// a prediction with any is an estimate.
    pub drawn_latencies: u64,
    /// Per step: whether it ran with the threshold in force (false: the drop-rate guard,
    /// [`ExecutionModel::drop_guard`], held it off; all true without a guard).
    pub enforced: Vec<bool>,
}

impl PolicyReplay {
    /// True when the replay used latencies or step times neither the trace nor the data knew
    /// ([`PolicyReplay::drawn_latencies`] or [`PolicyReplay::estimated_steps`] > 0): its
    /// prediction is an estimate.
    pub fn is_estimate(&self) -> bool {
        self.drawn_latencies > 0 || self.estimated_steps > 0
    }

    /// Mean step time under the policy (ns) over the steps the data filled: every rank was
    /// handed its whole assignment. An epoch's short last step (the stream ran dry: dealt less
    /// than assigned) is left out, as `StepReport::filled` leaves it out of a run: whether the
    /// last few parts end one step or make another is the quantization of the step count, not a
    /// step time. [`PolicyReplay::policy_step_ns`] when no step is filled.
    pub fn filled_step_ns(&self) -> f64 {
        let n = self.handed.len() / self.per_step.len().max(1);
        let filled: Vec<f64> = self
            .per_step
            .iter()
            .enumerate()
            .filter(|(s, _)| {
                let cells = s * n..(s + 1) * n;
                let sum = |v: &[u32]| v.iter().map(|&x| u64::from(x)).sum::<u64>();
                sum(&self.handed[cells.clone()]) == sum(&self.assigned[cells])
            })
            .map(|(_, x)| x.1)
            .collect();
        if filled.is_empty() { self.policy_step_ns } else { filled.iter().sum::<f64>() / filled.len() as f64 }
    }
}

/// Each bucket's cost (ns): the mean recorded latency of the trace's micro-batches of that
/// bucket (a bucket never recorded has none); empty for a trace without buckets. With
/// `--noise none` every micro-batch of a bucket costs the same, so the mean is that cost
/// exactly (latencies in whole ns: the sums are exact); with noise a scaled latency keeps its
/// cell's noise multiplier.
fn bucket_means(trace: &LatencyTrace) -> BTreeMap<u32, f64> {
    let mut acc: BTreeMap<u32, (f64, u64)> = BTreeMap::new();
    for (&b, &l) in trace.buckets().unwrap_or_default().iter().zip(trace.latencies_ns()) {
        let e = acc.entry(b).or_insert((0.0, 0));
        e.0 += l;
        e.1 += 1;
    }
    acc.into_iter().map(|(b, (sum, k))| (b, sum / k as f64)).collect()
}

/// [`bucket_means`] of each rank's own micro-batches (N maps): a rank's cost of a bucket,
/// its own speed included (a slow rank's costs are its slowdown times the others').
fn rank_bucket_means(trace: &LatencyTrace) -> Vec<BTreeMap<u32, f64>> {
    let (n, m) = (trace.world_size(), trace.micro_batches().max(1));
    let mut acc: Vec<BTreeMap<u32, (f64, u64)>> = vec![BTreeMap::new(); n];
    for (k, (&b, &l)) in trace.buckets().unwrap_or_default().iter().zip(trace.latencies_ns()).enumerate() {
        let e = acc[(k / m) % n].entry(b).or_insert((0.0, 0));
        e.0 += l;
        e.1 += 1;
    }
    acc.into_iter().map(|r| r.into_iter().map(|(b, (sum, k))| (b, sum / k as f64)).collect()).collect()
}

/// One rank's step as the walker ran it on the replay's latencies.
struct Walked {
    /// Parts started (a whole micro-batch = `split` parts, a tail micro-batch 1).
    parts: usize,
    /// Compute end time (ns), `t0` when nothing started.
    end: f64,
    /// Whole-micro-batch equivalents of device time (the divisor of the per-micro-batch
    /// latency the assignment step sees).
    equivalents: f64,
}

/// Drives the one walker ([`RankWalk`]) through one rank's step: a whole micro-batch j takes
/// `lat(j)`, a tail micro-batch `cost · lat(j) · part(p)` of the micro-batch j it is cut from
/// (`tail` = (the tail shape, `part`), `part(p)` the factor of its part p: 1 but with dealt
/// shapes, its own bucket's cost over the micro-batch's, the module doc); the clock
/// starts at `t0`. `ends` is scratch (f64 end times; the walker sees them truncated to ns, as
/// the estimator sees the latencies).
fn walk(
    w: &mut RankWalk,
    (tail, part): (&TailShape, &dyn Fn(usize) -> f64),
    t0: f64,
    est: &mut BucketEstimator,
    lat: &mut dyn FnMut(usize) -> f64,
    ends: &mut Vec<(f64, f64)>,
    mb_lat: &mut Vec<f64>,
) -> Walked {
    ends.clear();
    mb_lat.clear();
    let cost = tail.cost_fraction();
    let mut acc = t0;
    loop {
        match w.next(est) {
            Next::Launch(l) => {
                let j = l.micro_batch as usize;
                while mb_lat.len() <= j {
                    mb_lat.push(lat(mb_lat.len()));
                }
                let d = if l.whole { mb_lat[j] } else { cost * mb_lat[j] * part(l.first_part) };
                acc += d;
                ends.push((acc, d));
            }
            Next::Wait { upto } => {
                let from = w.reported();
                for (i, &(end, d)) in ends.iter().enumerate().take(upto).skip(from) {
                    w.ended(i, end as u64, d as u64, est);
                }
            }
            Next::Done(_) => break,
        }
    }
    Walked { parts: w.parts(), end: ends.last().map_or(t0, |e| e.0), equivalents: w.equivalents() }
}

/// What a replayed run deals each step: how many parts every rank has, and when the run ends.
/// The replay asks before each step and reports what was started after it, as the
/// scheduler's `DataSource` is asked (`take_assigned`) and settled. The default,
/// [`TraceSteps`], is the trace's steps with every assignment in full; `train` passes its
/// one data-dealing model (an `--epochs` run ends with its stream, possibly after more steps
/// than the baseline recorded).
pub trait ReplayData {
    /// Parts available to each rank in step index `index` (0-based, in replay order) under
    /// `assignment` (`N` values; each result `<= assignment[r]`), or `None` when the run has
    /// ended before this step.
    fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>>;
    /// The step's started parts per rank (`N` values, each `<=` what [`ReplayData::deal`]
    /// gave): the rest go back to the stream.
    fn settle(&mut self, started: &[u32]);
    /// The latency (ns) of whole micro-batch `micro_batch` of `rank` in step index `index`
    /// when the data knows it and the trace does not (`micro_batch` >= M, or `index` >= S):
    /// e.g. a latency script, or a cost known from the micro-batch's shape. `None` (the
    /// default): the replay draws it from the rank's recorded latencies (an estimate).
    fn latency(&self, index: usize, rank: usize, micro_batch: usize) -> Option<f64> {
        let _ = (index, rank, micro_batch);
        None
    }
    /// The clock skews and start offsets (N values each, ns) and overhead (ns) of step index
    /// `index` >= S when the data knows them (e.g. a recorded step the trace could not hold: an
    /// epoch's short last step). `None` (the default): each rank's mean skew and offset and the
    /// trace's mean overhead, and the step is an estimate ([`PolicyReplay::estimated_steps`]).
    fn step_times(&self, index: usize) -> Option<StepTimes> {
        let _ = index;
        None
    }
    /// True when the data knows what it deals: every dealt part's shape
    /// ([`ReplayData::part_shape`]) and the cost-balanced deal of a step's window
    /// ([`ReplayData::deal_by`]). `false` (the default): the replay takes the recorded cells'
    /// buckets and tokens and re-deals the recorded micro-batches (module doc).
    fn knows_shapes(&self) -> bool {
        false
    }
    /// The bucket and real tokens of part `slot` of `rank`'s parts dealt in the current step
    /// (between [`ReplayData::deal`] or [`ReplayData::deal_by`] and [`ReplayData::settle`]),
    /// `None` when the data does not know it (the default).
    fn part_shape(&self, rank: usize, slot: usize) -> Option<PartShape> {
        let _ = (rank, slot);
        None
    }
    /// `cost-balance`'s deal of step index `index`, as the run deals it
    /// (`DataSource::take_dealt`): the next `parts` parts of the stream are handed to `deal`
    /// (their shapes, in stream order), which returns each rank's indices into them,
    /// ascending, every index once; the result is that deal (each rank's window positions),
    /// its parts then dealt as [`ReplayData::deal`]'s. `None` (the default; also when fewer
    /// than `parts` parts remain, a shape is unknown, the deal names an index twice, or the run
    /// has ended): nothing is taken, and the replay deals by counts ([`ReplayData::deal`]).
    fn deal_by(
        &mut self,
        index: usize,
        parts: usize,
        deal: &mut dyn FnMut(&[PartShape]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<usize>>> {
        let _ = (index, parts, deal);
        None
    }
}

/// What the data knows of one dealt part ([`ReplayData::part_shape`]): its length bucket and
/// its real tokens (a text job's bucket-plan unit, `train::text::BucketPlan::shape`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartShape {
    /// Its length bucket (index into the job's bucket lengths).
    pub bucket: u32,
    /// Its real (non-padding) tokens.
    pub tokens: u64,
}

impl PartShape {
    /// The one bucket-merge rule: two parts launched as one micro-batch are padded to the
    /// larger of their buckets and carry the sum of their real tokens (saturating). Every
    /// place that merges parts (the replay, `MicroBatch::merged`, `ReplayStream`'s shapes, the
    /// text job's `BucketPlan::shape`) goes through it or [`PartShape::merged`]. Associative
    /// and commutative.
    pub fn merge(self, other: PartShape) -> PartShape {
        PartShape { bucket: self.bucket.max(other.bucket), tokens: self.tokens.saturating_add(other.tokens) }
    }

    /// Parts as one micro-batch ([`PartShape::merge`] over them, in order): `None` when no
    /// part is given or any part's shape is unknown (`None`).
    pub fn merged<T: Into<Option<PartShape>>>(parts: impl IntoIterator<Item = T>) -> Option<PartShape> {
        parts
            .into_iter()
            .try_fold(None, |acc: Option<PartShape>, p| p.into().map(|s| Some(acc.map_or(s, |a| a.merge(s)))))?
    }

    /// The bucket of parts as one micro-batch ([`PartShape::merged`]'s), 0 when none is given.
    pub fn merged_bucket(parts: &[PartShape]) -> u32 {
        Self::merged(parts.iter().copied()).map_or(0, |s| s.bucket)
    }
}

/// One step's times outside its micro-batches (ns), as a [`LatencyTrace`] holds them per step:
/// the step time is `max_r(skew_ns[r] + offsets_ns[r] + compute_r) + overhead_ns`
/// ([`LatencyTrace::with_skews`], [`LatencyTrace::with_start_offsets`]). Built from a run's
/// step report by `schedule::auto::step_times`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimes {
    /// Per rank (N values): its compute clock start minus the step's earliest (>= 0).
    pub skew_ns: Vec<f64>,
    /// Per rank (N values): device time from its clock start to its first micro-batch.
    pub offsets_ns: Vec<f64>,
    /// The rest of the step after the latest rank's compute end (collective, rescale, update),
    /// net of the skews.
    pub overhead_ns: f64,
}

/// The trace's steps, every assignment dealt in full: the run [`replay_policy`] replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceSteps(
    /// Steps of the run (the trace's step count).
    pub usize,
);

impl ReplayData for TraceSteps {
    fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
        (index < self.0).then(|| assignment.to_vec())
    }

    fn settle(&mut self, _started: &[u32]) {}
}

/// Replay `trace` under `run` (module doc) for the trace's steps ([`TraceSteps`]). Pure and
/// deterministic for a seed; never fails (the trace is validated at construction;
/// out-of-range parameters are clamped as [`StepPolicy`] documents).
pub fn replay_policy(trace: &LatencyTrace, run: &PolicyRun) -> PolicyReplay {
    replay_policy_on(trace, run, &mut TraceSteps(trace.num_steps()))
}

/// Steps a bounded replay runs beyond the trace at most (a data model that never ends would
/// otherwise never return): [`MAX_STEPS_PER_TRACE_STEP`] times the trace's steps, plus this.
pub const MAX_EXTRA_STEPS: usize = 1_000;
/// See [`MAX_EXTRA_STEPS`].
pub const MAX_STEPS_PER_TRACE_STEP: usize = 100;

/// Replay `trace` under `run` for as many steps as `data` deals (module doc), at most
/// [`MAX_STEPS_PER_TRACE_STEP`]·S + [`MAX_EXTRA_STEPS`]. A rank's walk is capped by what
/// `data` deals it (the end of an epoch-bounded stream). In a step beyond the trace's S each
/// micro-batch latency is [`ReplayData::latency`] where the data knows it, else drawn from the
/// rank's recorded latencies of every step (as beyond M); its start offsets and overhead are
/// [`ReplayData::step_times`] where the data knows them, else each rank's mean offset and the
/// trace's mean overhead (the step is then an estimate, [`PolicyReplay::estimated_steps`]); its
/// baseline time is NaN in [`PolicyReplay::per_step`] (no trace step). Deterministic for a
/// seed; never fails.
pub fn replay_policy_on(trace: &LatencyTrace, run: &PolicyRun, data: &mut dyn ReplayData) -> PolicyReplay {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let s_trace = trace.num_steps();
    let p = run.params.policy;
    let exec = &run.execution;
    let deadline = DeadlineConfig {
        threshold: run.deadline(),
        check: p.check_mode(exec.check),
        warmup_steps: exec.warmup_steps,
        min_micro_batches: exec.min_micro_batches,
    };
    let tail = run.params.tail;
    let split = tail.parts() as usize;
    // The run's slots: the most one rank may be handed (`train`: the cap, 2·M), in parts.
    let slots = run.slots_for(m as u32).saturating_mul(split as u32);
    let first_step = trace.steps().first().copied().unwrap_or(0);
    let last_step = trace.steps().last().copied().unwrap_or(0);
    let mut assigner = Assigner::new(run.params, n, m as u32, slots, exec.warmup_steps, deadline.threshold, first_step);
    // Per rank: a blind policy never tells its walk a bucket, so this is its LatencyEstimator
    // exactly (`BucketEstimator` without buckets).
    let mut est: Vec<BucketEstimator> =
        (0..n).map(|_| BucketEstimator::new(LatencyEstimator::DEFAULT_WINDOW, run.estimator_quantile)).collect();
    // The length-aware policies on a trace with buckets (module doc).
    let aware = p.length_aware() && trace.buckets().is_some();
    let balance = aware && p == Policy::CostBalance;
    // Cost-balance's job-wide estimate of each bucket's cost (the same on every rank).
    let mut job_est = BucketEstimator::new(LatencyEstimator::DEFAULT_WINDOW, run.estimator_quantile)
        .with_prior(run.params.bucket_tokens);
    // Cost-balance's cap per rank: the scheduler's (`StepPolicy::deal_cap` within the slots).
    let slots_mb = run.params.deal_cap(m as u32, run.slots_for(m as u32)) as usize;
    // Per rank, this step's micro-batches when dealt by cost: (latencies, buckets, tokens).
    let mut dealt_rows: Vec<(Vec<f64>, Vec<u32>, Vec<u64>)> = vec![(Vec::new(), Vec::new(), Vec::new()); n];
    // Token weights (module doc of `PolicyReplay::tokens`): the mean per micro-batch for the
    // micro-batches beyond the record, and the running (aggregated, nominal) sums.
    let tokens = trace.tokens();
    let mean_tokens = tokens.map(|t| t.iter().map(|&x| x as f64).sum::<f64>() / t.len().max(1) as f64);
    // Per step in tokens: (nominal, started).
    let mut tok_steps: Vec<(f64, f64)> = Vec::new();
    let mut ends = Vec::with_capacity(2 * m * split);
    let mut mb_lat: Vec<f64> = Vec::with_capacity(2 * m);
    let mut walker = RankWalk::new(deadline, first_step, 0, tail, exec.sync_lag);
    // The drop-rate guard (`ExecutionModel::drop_guard`): a step it holds off walks with the
    // threshold off (`open_walker`); its counts are the step's nominal and aggregated parts, or
    // tokens on a trace in tokens (the replay's drop unit).
    let mut guard = exec.drop_guard.filter(|_| p.drops()).and_then(|b| DropGuard::new(b).ok());
    let mut open_walker =
        RankWalk::new(DeadlineConfig { threshold: Threshold::Off, ..deadline }, first_step, 0, tail, exec.sync_lag);
    let mut enforced_steps = Vec::with_capacity(s_trace);
    let mut per_step = Vec::with_capacity(s_trace);
    let (mut started_cells, mut assigned_cells) = (Vec::with_capacity(s_trace * n), Vec::with_capacity(s_trace * n));
    let mut handed_cells = Vec::with_capacity(s_trace * n);
    let mut compute_ns = Vec::with_capacity(s_trace);
    let (mut computed, mut lost, mut drawn, mut estimated_steps) = (0u64, 0u64, 0u64, 0u64);
    let mut step_nominal: Vec<u64> = Vec::with_capacity(s_trace);
    let mut finish = vec![0.0f64; n];
    let mut mean_lat = vec![0.0f64; n];
    // Rank r's pool for the draws beyond M and beyond S: its recorded latencies of every step,
    // k = step index · M + micro-batch (not copied: read from the trace).
    let pool_len = s_trace * m;
    let pool = |r: usize, k: usize| trace.step_matrix(k / m)[r * m + k % m];
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let (sum, k) = v.fold((0.0, 0usize), |(s, k), x| (s + x, k + 1));
        if k > 0 { sum / k as f64 } else { 0.0 }
    };
    let offsets_all = trace.start_offsets_ns();
    let mean_offsets: Vec<f64> = (0..n).map(|r| mean(&mut (0..s_trace).map(|si| offsets_all[si * n + r]))).collect();
    let skews_all = trace.skews_ns();
    let mean_skews: Vec<f64> = (0..n).map(|r| mean(&mut (0..s_trace).map(|si| skews_all[si * n + r]))).collect();
    let mean_overhead = mean(&mut trace.overhead_ns().iter().copied());
    let no_row: Vec<f64> = Vec::new();
    // A data model that knows what it deals, on a trace with buckets: each dealt part's shape
    // replaces the recorded cell's (module doc, "What the data deals").
    let shaped = trace.buckets().is_some() && data.knows_shapes();
    let costs = if shaped { bucket_means(trace) } else { BTreeMap::new() };
    let rank_costs = if shaped { rank_bucket_means(trace) } else { Vec::new() };
    // A latency recorded on rank `rank` for bucket `rec` as the cost of bucket `dealt`: scaled
    // by the rank's own costs of the two when it recorded both (a slow rank's share of a
    // bucket's cells would otherwise skew the ratio), else by the trace's; the recorded
    // latency when either cost is unknown.
    let scale = |rank: usize, l: f64, rec: Option<u32>, dealt: Option<u32>| {
        let of = |map: Option<&BTreeMap<u32, f64>>, b: Option<u32>| {
            b.and_then(|b| map?.get(&b).copied()).filter(|&c| c > 0.0 && c.is_finite())
        };
        let own = rank_costs.get(rank);
        match ((of(own, rec), of(own, dealt)), (of(Some(&costs), rec), of(Some(&costs), dealt))) {
            ((Some(r), Some(d)), _) | (_, (Some(r), Some(d))) => d * (l / r),
            _ => l,
        }
    };
    let cell_bucket = |si: usize, cell: usize| trace.step_buckets(si).and_then(|b| b.get(cell).copied());
    let max_steps = s_trace.saturating_mul(MAX_STEPS_PER_TRACE_STEP).saturating_add(MAX_EXTRA_STEPS);
    for si in 0..max_steps {
        let recorded = si < s_trace;
        let step_buckets = if aware && recorded { trace.step_buckets(si) } else { None };
        // Cost-balance on data that knows what it deals: the stream's own window dealt by cost,
        // as the run deals it (each rank's window positions); `None`: dealt by counts.
        let window = if balance && shaped {
            let est = &mut job_est;
            let mut by_cost = |parts: &[PartShape]| {
                let b: Vec<u32> = parts.chunks(split).map(PartShape::merged_bucket).collect();
                cost_balance_parts(&bucket_cost(est, &b), n, slots_mb, split)
            };
            data.deal_by(si, n * m * split, &mut by_cost)
        } else {
            None
        };
        if let Some(w) = &window {
            assigner.set(w.iter().map(|x| x.len() as u32).collect());
        }
        let balanced = balance && !shaped && step_buckets.is_some();
        if let (true, Some(b)) = (balanced, step_buckets) {
            // Deal the step's N·M recorded micro-batches by predicted cost (module doc).
            let deal = cost_balance(&bucket_cost(&mut job_est, b), n, slots_mb);
            let mat = trace.step_matrix(si);
            let step_tokens = tokens.and_then(|t| t.get(si * n * m..(si + 1) * n * m));
            for (row, cells) in dealt_rows.iter_mut().zip(&deal) {
                row.0.clear();
                row.1.clear();
                row.2.clear();
                row.0.extend(cells.iter().map(|&k| mat[k]));
                row.1.extend(cells.iter().map(|&k| b[k]));
                if let Some(t) = step_tokens {
                    row.2.extend(cells.iter().map(|&k| t[k]));
                }
            }
            assigner.set(deal.iter().map(|c| (c.len() * split) as u32).collect());
        }
        let dealt = match &window {
            Some(w) => w.iter().map(|x| x.len() as u32).collect(),
            None => match data.deal(si, assigner.assignment()) {
                Some(d) => d,
                None => break,
            },
        };
        let assignment = assigner.assignment().to_vec();
        let step = if recorded { trace.steps()[si] } else { last_step + (si - s_trace + 1) as u64 };
        let known_times = if recorded { None } else { data.step_times(si) };
        estimated_steps += u64::from(!recorded && known_times.is_none());
        let (mat, offsets, skews): (&[f64], &[f64], &[f64]) = match (&known_times, recorded) {
            (_, true) => (trace.step_matrix(si), &offsets_all[si * n..(si + 1) * n], &skews_all[si * n..(si + 1) * n]),
            (Some(t), false) if t.offsets_ns.len() == n && t.skew_ns.len() == n => (&no_row, &t.offsets_ns, &t.skew_ns),
            _ => (&no_row, &mean_offsets, &mean_skews),
        };
        // The guard's decision before the step, on the step's nominal parts N·M·S (what every
        // rank of a run knows before the step, as the scheduler asks), or the step's recorded
        // tokens (the trace's mean beyond the record).
        let full = (n * m * split) as u64;
        let handed_before = match (mean_tokens, tokens) {
            (Some(_), Some(t)) if recorded => t[si * n * m..(si + 1) * n * m].iter().map(|&x| x as f64).sum(),
            (Some(mean), _) => mean * (n * m) as f64,
            _ => full as f64,
        };
        let enforced = guard.as_ref().is_none_or(|g| g.enforces(handed_before.round() as u64));
        enforced_steps.push(enforced);
        let walker = if enforced { &mut walker } else { &mut open_walker };
        let mut step_started = vec![0u32; n];
        let mut step_tokens_started = 0.0f64;
        let mut step_tokens_handed = (0.0f64, 0u64);
        for r in 0..n {
            let row: &[f64] = match (balanced, recorded) {
                (true, _) => &dealt_rows[r].0,
                (false, true) => &mat[r * m..(r + 1) * m],
                (false, false) => &no_row,
            };
            let t0 = offsets[r];
            let assigned = assignment[r];
            let cap = dealt.get(r).copied().unwrap_or(0).min(assigned) as usize;
            // The parts dealt, when the data knows them: their shapes, and each whole
            // micro-batch's bucket (the largest of its S parts').
            let parts: Option<Vec<PartShape>> =
                if shaped { (0..cap).map(|k| data.part_shape(r, k)).collect() } else { None };
            let dealt_buckets: Option<Vec<u32>> =
                parts.as_ref().map(|p| p.chunks(split).map(PartShape::merged_bucket).collect());
            let row_buckets: Option<&[u32]> = match (&dealt_buckets, balanced, step_buckets) {
                (Some(b), _, _) => aware.then_some(b.as_slice()),
                (None, true, _) => Some(&dealt_rows[r].1),
                (None, false, Some(b)) => Some(&b[r * m..(r + 1) * m]),
                (None, false, None) => None,
            };
            // The recorded cell of whole micro-batch j when the data knows the parts: (r, j) of
            // the step (the mock keys a launch's noise by module, step and index, one draw for
            // every recipe of the text job: a unit of any bucket there keeps the cell's noise);
            // beyond M under cost-balance, a cell of this rank, the one computing it (another
            // rank's cell would carry that rank's speed): its first cell from j mod M on that
            // recorded the dealt bucket, else cell j mod M (scaled to the dealt bucket below).
            let cell = |j: usize, dealt: Option<u32>| match &window {
                _ if j < m => Some(r * m + j),
                Some(_) => {
                    let own = |k: usize| r * m + (j + k) % m;
                    let same = (0..m).map(own).find(|&c| dealt.is_some() && cell_bucket(si, c) == dealt);
                    Some(same.unwrap_or(own(0)))
                }
                None => None,
            };
            let mut extra = rng::stream(run.seed, (si * n + r) as u64);
            // Beyond the record (i >= M, or a step beyond S): one of the rank's recorded
            // latencies of any step (module doc).
            let known = &*data;
            let mut lat = |i: usize| {
                if let Some(db) = &dealt_buckets {
                    let dealt_bucket = db.get(i).copied();
                    if let (true, Some(k)) = (recorded, cell(i, dealt_bucket)) {
                        return scale(r, mat[k], cell_bucket(si, k), dealt_bucket);
                    }
                    // A latency the data knows by position (a recorded step outside the trace)
                    // is of a unit of unknown bucket: the draw, scaled, is the dealt unit's.
                    drawn += 1;
                    let k = extra.random_range(0..pool_len);
                    return scale(r, pool(r, k), cell_bucket(k / m, r * m + k % m), dealt_bucket);
                }
                if i < row.len() {
                    row[i]
                } else if let Some(v) = known.latency(si, r, i) {
                    v
                } else {
                    drawn += 1;
                    pool(r, extra.random_range(0..pool_len))
                }
            };
            walker.restart(step, cap);
            if let Some(b) = row_buckets {
                walker.set_buckets(b);
            }
            // A tail part alone runs its own bucket: its cost over its micro-batch's.
            let part = |p: usize| match (&parts, &dealt_buckets) {
                (Some(ps), Some(db)) => {
                    let own = ps.get(p).map(|x| x.bucket);
                    scale(r, 1.0, db.get(p / split).copied(), own)
                }
                _ => 1.0,
            };
            let w = walk(walker, (&tail, &part), t0, &mut est[r], &mut lat, &mut ends, &mut mb_lat);
            if let (true, Some(b)) = (balanced || window.is_some(), row_buckets) {
                // The whole launches come first, launch i being micro-batch i: their latencies
                // are what the gathered count rows carry to every rank.
                let whole = walker.whole().iter().take_while(|&&w| w).count();
                for (j, &l) in mb_lat.iter().enumerate().take(whole) {
                    job_est.observe_for(b.get(j).copied(), l as u64);
                }
            }
            if let (Some(_), Some(p)) = (mean_tokens, &parts) {
                // Tokens started: the dealt parts' own, of the parts started (in order).
                step_tokens_started += p.iter().take(w.parts).map(|x| x.tokens as f64).sum::<f64>();
                step_tokens_handed.0 += p.iter().map(|x| x.tokens as f64).sum::<f64>();
                step_tokens_handed.1 += p.len() as u64;
            } else if let Some(mean) = mean_tokens {
                // Tokens started: whole micro-batch j its recorded count, a tail part 1/S of it.
                let row_tokens: &[u64] = match (balanced, recorded, tokens) {
                    (true, _, _) => &dealt_rows[r].2,
                    (false, true, Some(t)) => &t[(si * n + r) * m..(si * n + r + 1) * m],
                    _ => &[],
                };
                let of = |j: usize| row_tokens.get(j).map_or(mean, |&x| x as f64);
                let count = |parts: usize| {
                    (0..parts / split).map(of).sum::<f64>() + (parts % split) as f64 / split as f64 * of(parts / split)
                };
                step_tokens_started += count(w.parts);
                // Handed out alike: a rank whose parts have no shape in a shaped step counts
                // its recorded tokens there too, so they stay in the step's nominal tokens.
                step_tokens_handed.0 += count(cap);
                step_tokens_handed.1 += cap as u64;
            }
            step_started[r] = w.parts as u32;
            // The deadline ran on the rank's own clock; the step waits for its end counted from
            // the step's earliest clock start.
            finish[r] = skews[r] + w.end;
            mean_lat[r] = if w.parts > 0 { (w.end - t0) / w.equivalents } else { f64::NAN };
            assigned_cells.push(assigned);
            handed_cells.push(cap as u32);
        }
        data.settle(&step_started);
        // The baseline sums as the walk does (t0, then + each latency in order, then the skew):
        // the synchronous policy reproduces it bit for bit.
        let base = if recorded {
            mat.chunks_exact(m)
                .zip(offsets)
                .zip(skews)
                .map(|((row, &t0), &skew)| skew + row.iter().fold(t0, |a, &l| a + l))
                .fold(0.0f64, f64::max)
        } else {
            f64::NAN
        };
        let pol = finish.iter().copied().fold(0.0f64, f64::max);
        let aggregated: u64 = step_started.iter().map(|&s| u64::from(s)).sum();
        // The step's nominal batch: N·M·S parts, less what the stream could not deal (its
        // end), never below what was aggregated.
        let nominal =
            crate::policy::step_nominal((n * m * split) as u64, &assignment, dealt.iter().copied(), aggregated);
        computed += aggregated;
        lost += nominal.saturating_sub(aggregated);
        step_nominal.push(nominal);
        if let Some(mean) = mean_tokens {
            let recorded_tokens = match (recorded, tokens) {
                (true, Some(t)) => t[si * n * m..(si + 1) * n * m].iter().map(|&x| x as f64).sum::<f64>(),
                _ => mean * (n * m) as f64,
            };
            // With the dealt parts' shapes, and under rebalancing (the global batch kept, moved
            // between ranks): the tokens handed out, per nominal part. A micro-batch moved past
            // a rank's recorded M counts the trace's mean tokens (an estimate) on both sides,
            // so a rebalanced step that starts all it was handed drops nothing (against the
            // recorded tokens it showed a drop, or hid one, by the moved micro-batches'
            // difference from the mean).
            let step_tokens_nominal = match step_tokens_handed {
                (t, k) if (shaped || p.rebalances()) && k > 0 => crate::policy::step_nominal_tokens(t, k, nominal),
                _ => crate::policy::step_nominal_tokens(recorded_tokens, (n * m * split) as u64, nominal),
            };
            tok_steps.push((step_tokens_nominal, step_tokens_started));
        }
        if let Some(g) = guard.as_mut() {
            match tok_steps.last() {
                Some(&(nom, st)) if mean_tokens.is_some() => g.record(nom.round() as u64, st.round() as u64, enforced),
                _ => g.record(nominal, aggregated, enforced),
            }
        }
        started_cells.extend_from_slice(&step_started);
        if aggregated > 0 {
            // An empty step (the stream's end) is no step of the assignment's statistics, as
            // in the scheduler.
            assigner.observe(step, &mean_lat);
        }
        let o = match (&known_times, recorded) {
            (_, true) => trace.overhead_ns()[si],
            (Some(t), false) => t.overhead_ns,
            (None, false) => mean_overhead,
        };
        compute_ns.push(pol);
        per_step.push((base + o, pol + o, aggregated));
    }
    let recorded = &per_step[..per_step.len().min(s_trace)];
    let b = recorded.iter().map(|x| x.0).sum::<f64>() / recorded.len().max(1) as f64;
    let pt = per_step.iter().map(|x| x.1).sum::<f64>() / per_step.len().max(1) as f64;
    let nominal = (per_step.len() * n * m * split) as u64;
    let aggregated: u64 = per_step.iter().map(|x| x.2).sum();
    let parts_drop_rate =
        crate::policy::nominal_drop_rate(step_nominal.iter().zip(&per_step).map(|(&nm, x)| (nm, x.2)));
    let parts_speedup = aggregated as f64 / nominal.max(1) as f64 * b / pt - 1.0;
    let token_totals = mean_tokens.map(|_| tok_steps.iter().fold((0.0, 0.0), |(a, n), &(nom, st)| (a + st, n + nom)));
    let (drop_rate, effective_speedup) = match token_totals {
        // A step's lost tokens are its nominal less what started, never below 0 (as `lost`).
        Some((agg, nom)) if nom > 0.0 => (crate::policy::nominal_drop_rate_of(tok_steps), agg / nom * b / pt - 1.0),
        _ => (parts_drop_rate, parts_speedup),
    };
    PolicyReplay {
        policy: p,
        baseline_step_ns: b,
        policy_step_ns: pt,
        nominal,
        aggregated,
        computed,
        lost,
        drop_rate,
        effective_speedup,
        tokens: token_totals,
        min_step_micro_batches: per_step.iter().map(|x| x.2).min().unwrap_or(0),
        max_step_micro_batches: per_step.iter().map(|x| x.2).max().unwrap_or(0),
        split: split as u32,
        estimated_steps,
        drawn_latencies: drawn,
        per_step,
        started: started_cells,
        assigned: assigned_cells,
        handed: handed_cells,
        compute_ns,
        enforced: enforced_steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RebalanceConfig;
    use proptest::prelude::{Strategy, prop, prop_assert_eq, proptest};
    use std::time::Duration;

    fn shape() -> impl Strategy<Value = PartShape> {
        (0u32..6, 0u64..1_000).prop_map(|(bucket, tokens)| PartShape { bucket, tokens })
    }

    proptest! {
        /// The one bucket-merge rule: merging is associative, and a merge of parts is the
        /// largest of their buckets and the sum of their tokens (computed here independently
        /// as a plain max and sum); any unknown part makes the merge unknown.
        #[test]
        fn merging_parts_is_associative_and_is_max_bucket_sum_tokens(
            parts in prop::collection::vec(shape(), 0..8),
            a in shape(), b in shape(), c in shape(), unknown in 0usize..8,
        ) {
            prop_assert_eq!(a.merge(b).merge(c), a.merge(b.merge(c)));
            prop_assert_eq!(a.merge(b), b.merge(a));
            let m = PartShape::merged(parts.iter().copied());
            let expect = (!parts.is_empty()).then(|| PartShape {
                bucket: parts.iter().map(|p| p.bucket).max().unwrap_or(0),
                tokens: parts.iter().map(|p| p.tokens).sum(),
            });
            prop_assert_eq!(m, expect);
            prop_assert_eq!(PartShape::merged_bucket(&parts), expect.map_or(0, |s| s.bucket));
            // Split anywhere: the merge of the two halves' merges is the whole's.
            let cut = unknown.min(parts.len());
            if cut > 0 && cut < parts.len() {
                let halves = [PartShape::merged(parts[..cut].iter().copied()), PartShape::merged(parts[cut..].iter().copied())];
                prop_assert_eq!(PartShape::merged(halves), m);
            }
            if !parts.is_empty() {
                let mut opt: Vec<Option<PartShape>> = parts.iter().copied().map(Some).collect();
                opt[cut.min(parts.len() - 1)] = None;
                prop_assert_eq!(PartShape::merged(opt), None);
            }
        }
    }

    fn exec(check: CheckMode) -> ExecutionModel {
        ExecutionModel { check, sync_lag: 0, warmup_steps: 0, min_micro_batches: 1, drop_guard: None }
    }

    fn run(params: StepPolicy, th: Option<u64>) -> PolicyRun {
        let t = th.map_or(Threshold::Off, |ns| Threshold::Fixed(Duration::from_nanos(ns)));
        PolicyRun::new(params, t, exec(CheckMode::BeforeMicroBatch))
    }

    /// 3 ranks, M = 2, 2 steps, overhead 1: rank 2 is slow in step 0.
    fn trace() -> LatencyTrace {
        LatencyTrace::new(
            "t",
            vec![0, 1, 2],
            vec![0, 1],
            2,
            vec![1.0, 2.0, 2.0, 2.0, 5.0, 6.0, /* step 1 */ 1.0, 1.0, 3.0, 1.0, 2.0, 2.0],
            vec![1.0, 1.0],
        )
        .and_then(|t| t.with_start_offsets(vec![0.0, 0.5, 0.0, 0.0, 0.0, 0.25]))
        .expect("valid")
    }

    #[test]
    fn backup_workers_with_b_zero_is_the_synchronous_run_bit_for_bit() {
        let sync = replay_policy(&trace(), &run(StepPolicy::new(Policy::Synchronous), None));
        let b0 = replay_policy(
            &trace(),
            &run(StepPolicy { backup_workers: 0, ..StepPolicy::new(Policy::BackupWorkers) }, None),
        );
        assert_eq!(sync.per_step, b0.per_step);
        assert_eq!(sync.policy_step_ns.to_bits(), b0.policy_step_ns.to_bits());
        assert_eq!(sync.effective_speedup.to_bits(), b0.effective_speedup.to_bits());
        assert_eq!(sync.effective_speedup, 0.0);
        // Synchronous: step 0 = max(3, 4.5, 11) + 1, step 1 = max(2, 4, 4.25) + 1.
        assert_eq!(sync.per_step, vec![(12.0, 12.0, 6), (5.25, 5.25, 6)]);
    }

    /// A stream of `0` parts dealt rank by rank, the not-started ones back.
    struct Parts(u32);

    impl ReplayData for Parts {
        fn deal(&mut self, _index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
            let mut left = self.0;
            let dealt: Vec<u32> = assignment
                .iter()
                .map(|&a| {
                    let d = a.min(left);
                    left -= d;
                    d
                })
                .collect();
            (self.0 > 0).then_some(dealt)
        }

        fn settle(&mut self, started: &[u32]) {
            self.0 -= started.iter().sum::<u32>();
        }
    }

    /// A bounded stream outlasting the trace: the replay runs to its end, the step beyond the
    /// trace drawn from each rank's recorded latencies, its short batch not counted as dropped.
    #[test]
    fn a_bounded_stream_is_replayed_to_its_end_beyond_the_trace() {
        let sync = run(StepPolicy::new(Policy::Synchronous), None);
        assert_eq!(replay_policy(&trace(), &sync), replay_policy_on(&trace(), &sync, &mut TraceSteps(2)));
        let r = replay_policy_on(&trace(), &sync, &mut Parts(15));
        assert_eq!(r.started, vec![2, 2, 2, 2, 2, 2, 2, 1, 0]);
        assert_eq!(r.handed, r.started);
        assert_eq!((r.estimated_steps, r.per_step.len(), r.lost, r.drop_rate), (1, 3, 0, 0.0));
        assert!(r.per_step[2].0.is_nan(), "no recorded baseline for the estimated step");
        assert_eq!(r.drawn_latencies, 3, "rank 0's two and rank 1's one latency are drawn");
        assert!(r.is_estimate() && !replay_policy(&trace(), &sync).is_estimate());
        // Step 2: rank 0 draws two of its four recorded latencies (1, 2, 1, 1), rank 1 one of
        // (2, 2, 3, 1), after the mean start offsets 0 and 0.5; the mean overhead is 1.
        let (pool0, pool1): ([f64; 4], [f64; 4]) = ([1.0, 2.0, 1.0, 1.0], [2.0, 2.0, 3.0, 1.0]);
        let mut g0 = rng::stream(1, 6);
        let end0 = pool0[g0.random_range(0..4)] + pool0[g0.random_range(0..4)];
        let mut g1 = rng::stream(1, 7);
        let end1 = 0.5 + pool1[g1.random_range(0..4)];
        assert_eq!(r.per_step[2].1, end0.max(end1) + 1.0);
        assert_eq!(r.compute_ns[2], end0.max(end1));
        // Recorded steps replay as before; the means run over every replayed step.
        assert_eq!(&r.per_step[..2], &replay_policy(&trace(), &sync).per_step[..]);
        assert_eq!(r.baseline_step_ns, (12.0 + 5.25) / 2.0);
        // The short last step (the stream dealt 3 of the 6 parts assigned) is left out of the
        // filled steps' mean; a replay whose steps are all filled has it equal to the mean.
        assert_eq!(r.assigned[6..], [2, 2, 2]);
        assert_eq!(r.filled_step_ns(), (r.per_step[0].1 + r.per_step[1].1) / 2.0);
        assert_ne!(r.filled_step_ns(), r.policy_step_ns);
        let full = replay_policy(&trace(), &sync);
        assert_eq!(full.filled_step_ns(), full.policy_step_ns);
        // A stream shorter than the trace ends the replay early.
        let short = replay_policy_on(&trace(), &sync, &mut Parts(4));
        assert_eq!((short.started, short.estimated_steps), (vec![2, 2, 0], 0));
    }

    /// Backup workers as the scheduler runs them: step 0 (no latency yet) synchronous; from
    /// step 1 the rank predicted slowest (EWMA per micro-batch × M) computes nothing.
    #[test]
    fn backup_workers_skip_the_rank_predicted_slowest() {
        let b1 = replay_policy(&trace(), &run(StepPolicy::new(Policy::BackupWorkers), None));
        // Step 0: mean latencies 1.5, 2, 5.5: rank 2 is predicted last for step 1; step 1 then
        // ends at max(2, 4, 0.25) + 1.
        assert_eq!(b1.assigned, vec![2, 2, 2, 2, 2, 0]);
        assert_eq!(b1.per_step, vec![(12.0, 12.0, 6), (5.25, 5.0, 4)]);
        assert_eq!((b1.lost, b1.computed, b1.aggregated, b1.nominal), (2, 10, 10, 12));
        let want = (10.0 / 12.0) * (12.0 + 5.25) / 2.0 / ((12.0 + 5.0) / 2.0) - 1.0;
        assert!((b1.effective_speedup - want).abs() < 1e-12);
    }

    /// The clock skew (issue 26): a rank that starts late ends late by its skew under every
    /// policy, while its deadline counts from its own clock start. [`trace`] with rank 2 1.5 late
    /// in step 0, ranks 1 and 2 2 and 1 late in step 1.
    #[test]
    fn a_late_rank_ends_late_by_its_skew_and_its_deadline_runs_on_its_own_clock() {
        let skewed = trace().with_skews(vec![0.0, 0.0, 1.5, 0.0, 2.0, 1.0]).expect("valid");
        let sync = replay_policy(&skewed, &run(StepPolicy::new(Policy::Synchronous), None));
        // Step 0: max(3, 4.5, 1.5 + 11) + 1; step 1: max(2, 2 + 4, 1 + 4.25) + 1.
        assert_eq!(sync.per_step, vec![(13.5, 13.5, 6), (7.0, 7.0, 6)]);
        let drop = replay_policy(&skewed, &run(StepPolicy::new(Policy::DropBefore), Some(3)));
        // Before-check at 3 on each rank's own clock: step 0 as without skew (2, 2, 1), rank 2
        // ending at 1.5 + 5; step 1 rank 1 stops after its 3 (2 + 3 = 5), rank 2 starts its
        // second micro-batch at 2.25 < 3 on its clock (3.25 from the step's earliest start).
        assert_eq!(drop.started, vec![2, 2, 1, 2, 1, 2]);
        assert_eq!(drop.per_step, vec![(13.5, 7.5, 5), (7.0, 6.25, 5)]);
        assert_eq!(drop.compute_ns, vec![6.5, 5.25]);
        // The same trace without skews: the drops' decisions are the same, the times are not.
        let flat = replay_policy(&trace(), &run(StepPolicy::new(Policy::DropBefore), Some(3)));
        assert_eq!(flat.started, drop.started);
        assert_eq!(flat.per_step, vec![(12.0, 6.0, 5), (5.25, 5.25, 5)]);
    }

    /// Property: skews shift every rank's finish alike under every policy (a skew common to all
    /// ranks adds to every step time, baseline and policy, and decides nothing).
    #[test]
    fn a_common_skew_adds_to_every_step_and_decides_nothing() {
        for p in Policy::ALL {
            let th = Some(3);
            let flat = replay_policy(&trace(), &run(StepPolicy::new(p), th));
            let shifted =
                replay_policy(&trace().with_skews(vec![0.5; 6]).expect("valid"), &run(StepPolicy::new(p), th));
            assert_eq!(shifted.started, flat.started, "{p}");
            for (a, b) in shifted.per_step.iter().zip(&flat.per_step) {
                assert_eq!((a.0, a.1, a.2), (b.0 + 0.5, b.1 + 0.5, b.2), "{p}");
            }
        }
    }

    #[test]
    fn drop_policies_are_the_dropcompute_replay() {
        for (p, check) in
            [(Policy::DropBefore, CheckMode::BeforeMicroBatch), (Policy::DropPredictive, CheckMode::Predictive)]
        {
            let r = replay_policy(
                &trace(),
                &PolicyRun::new(StepPolicy::new(p), Threshold::Fixed(Duration::from_nanos(3)), exec(check)),
            );
            let d = super::super::replay::replay(&trace(), Threshold::Fixed(Duration::from_nanos(3)), &exec(check));
            assert_eq!(r.per_step, d.per_step);
            assert_eq!(r.started, d.started);
        }
        // Before-check at 3: step 0 ranks start (2, 2, 1): rank 2 sees 5 >= 3 after mb 0.
        let r = replay_policy(&trace(), &run(StepPolicy::new(Policy::DropBefore), Some(3)));
        assert_eq!(&r.started[..3], &[2, 2, 1]);
        assert_eq!(r.per_step[0], (12.0, 6.0, 5));
    }

    #[test]
    fn compute_budget_lets_fast_ranks_compute_beyond_m_from_their_own_latencies() {
        // Budget 4 ns, cap 4. Rank 0's recorded latencies are (1, 2) and (1, 1): in step 1 it
        // starts while elapsed < 4: 1 + 1, then extras drawn from its own four recorded values
        // of both steps.
        let p = StepPolicy {
            budget: Threshold::Fixed(Duration::from_nanos(4)),
            budget_max_micro_batches: Some(4),
            ..StepPolicy::new(Policy::ComputeBudget)
        };
        let r = replay_policy(&trace(), &run(p, None));
        // The extras of (step 1, rank 0): the seeded stream over rank 0's pool [1, 2, 1, 1].
        let mut rng = rng::stream(1, 3);
        let pool = [1.0, 2.0, 1.0, 1.0];
        let (mut end, mut k) = (2.0f64, 2u32);
        while end < 4.0 && k < 4 {
            end += pool[rng.random_range(0..4)];
            k += 1;
        }
        assert_eq!(&r.started[3..6], &[k, 2, 2]);
        assert_eq!(r.per_step[1], (5.25, end.max(4.25) + 1.0, k as u64 + 4));
        // A rank whose recorded latencies are all equal draws that value: the uniform trace
        // gives every rank the cap within the budget exactly.
        let flat = LatencyTrace::new("flat", vec![0, 1], vec![0, 1], 2, vec![1.0; 8], vec![0.0, 0.0]).expect("valid");
        let f = replay_policy(&flat, &run(p, None));
        assert_eq!(f.started, vec![4, 4, 4, 4]);
        assert_eq!(f.per_step, vec![(2.0, 4.0, 8), (2.0, 4.0, 8)]);
        let r = replay_policy(&trace(), &run(p, None));
        assert_eq!(&r.started[3..6], &[k, 2, 2]);
        assert_eq!(&r.assigned[..3], &[4, 4, 4]);
        assert!(r.max_step_micro_batches >= 7);
        // Common random numbers: the same seed draws the same extra latencies.
        assert_eq!(r, replay_policy(&trace(), &run(p, None)));
    }

    /// With a trace in tokens the replay counts real tokens: a started micro-batch its own, a
    /// tail part 1/S of its micro-batch's; the drop rate and the effective speedup are in
    /// tokens (the same replay without tokens counts micro-batches).
    #[test]
    fn a_trace_in_tokens_weighs_the_work_and_the_drop_rate_in_tokens() {
        // One rank, M = 4, latencies 10 each; step 1's micro-batches 10, 20, 30, 40 tokens.
        let plain = LatencyTrace::new("t", vec![0], vec![0, 1], 4, vec![10.0; 8], vec![0.0, 0.0]).expect("valid");
        let t = plain.clone().with_tokens(vec![1, 2, 3, 4, 10, 20, 30, 40]).expect("tokens");
        assert!(plain.clone().with_tokens(vec![1; 7]).is_err(), "one count per micro-batch");
        let th = Threshold::Fixed(Duration::from_nanos(35));
        let mut ex = exec(CheckMode::Predictive);
        ex.warmup_steps = 1;
        let with = |t: &LatencyTrace, tail: TailShape| {
            replay_policy(t, &PolicyRun::new(StepPolicy { tail, ..StepPolicy::new(Policy::DropPredictive) }, th, ex))
        };
        // Step 1 starts 3 whole micro-batches (60 of 100 tokens): 40 of the run's 110 lost.
        let whole = with(&t, TailShape::default());
        assert_eq!(whole.tokens, Some((70.0, 110.0)));
        assert_eq!(whole.drop_rate, 40.0 / 110.0);
        assert_eq!(whole.lost, 1, "counts stay in parts");
        // Step times 40 and 30 against the baseline's 40 and 40.
        assert!((whole.effective_speedup - (70.0 / 110.0 * 40.0 / 35.0 - 1.0)).abs() < 1e-12);
        // A half micro-batch of the fourth: half its 40 tokens.
        let half = with(&t, TailShape::split(2));
        assert_eq!(half.tokens, Some((90.0, 110.0)));
        assert_eq!(half.drop_rate, 20.0 / 110.0);
        // Without tokens: micro-batches.
        let parts = with(&plain, TailShape::default());
        assert_eq!((parts.tokens, parts.drop_rate), (None, 1.0 / 8.0));
        assert_eq!(parts.started, whole.started, "the decisions do not depend on the unit");
    }

    /// A tail shape of half a micro-batch: the predictive check stops a whole micro-batch
    /// that would overshoot and starts half of it when that fits; the estimator sees whole
    /// micro-batches only; split 1 is the whole-micro-batch replay.
    #[test]
    fn a_tail_micro_batch_fills_the_slack_before_the_deadline() {
        // One rank, M = 4, latencies 10 each, 2 steps (step 0 fills the estimator: 10).
        let t = LatencyTrace::new("t", vec![0], vec![0, 1], 4, vec![10.0; 8], vec![0.0, 0.0]).expect("valid");
        let th = Threshold::Fixed(Duration::from_nanos(35));
        let mut ex = exec(CheckMode::Predictive);
        ex.warmup_steps = 1;
        let with = |tail: TailShape| {
            replay_policy(&t, &PolicyRun::new(StepPolicy { tail, ..StepPolicy::new(Policy::DropPredictive) }, th, ex))
        };
        let whole = with(TailShape::default());
        // Step 1: 3 whole (30), the 4th predicted to end at 40 > 35: stop.
        assert_eq!(whole.per_step[1], (40.0, 30.0, 3));
        let half = with(TailShape::split(2));
        // In parts: step 0 all 8; step 1: 3 whole (6 parts, 30 ns), then one half (5 ns: ends
        // at 35 <= 35), the next half would end at 40: stop. 7 of 8 parts.
        assert_eq!(half.split, 2);
        assert_eq!(half.per_step, vec![(40.0, 40.0, 8), (40.0, 35.0, 7)]);
        assert_eq!((half.nominal, half.aggregated, half.lost), (16, 15, 1));
        assert_eq!(half.started, vec![8, 7]);
        // A tail at 60 % of a whole one costs 6 ns: 30 + 6 > 35: no tail.
        let dear = with(TailShape { split: 2, cost: Some(0.6) });
        assert_eq!(dear.per_step[1], (40.0, 30.0, 6));
        // The before-check has no estimate: no tail, as whole micro-batches.
        let before = replay_policy(
            &t,
            &PolicyRun::new(StepPolicy { tail: TailShape::split(2), ..StepPolicy::new(Policy::DropBefore) }, th, ex),
        );
        assert_eq!(before.per_step[1], (40.0, 40.0, 8));
    }

    /// `n` ranks x `m` micro-batches x `steps` steps, rank 1 at latency 2 (chronic), the others
    /// 1, no overhead.
    fn chronic_trace(n: usize, m: usize, steps: usize) -> LatencyTrace {
        let mut lat = Vec::new();
        for _ in 0..steps {
            for r in 0..n {
                lat.extend(std::iter::repeat_n(if r == 1 { 2.0 } else { 1.0 }, m));
            }
        }
        LatencyTrace::new("t", (0..n as u32).collect(), (0..steps as u64).collect(), m, lat, vec![0.0; steps])
            .expect("valid")
    }

    /// The drop-rate guard guards a drop threshold only: a compute budget's replay is the same
    /// with and without it, a drop policy's is not (the chronic rank's 8 x 2 ns do not fit in
    /// 12 ns: every enforced step drops, and at 1 % the guard holds most steps off).
    #[test]
    fn the_drop_guard_leaves_a_compute_budget_alone() {
        let t = chronic_trace(4, 8, 10);
        let ex = exec(CheckMode::Predictive);
        let guarded = ExecutionModel { drop_guard: Some(0.01), ..ex };
        let at12 = Threshold::Fixed(Duration::from_nanos(12));
        let budget = StepPolicy { budget: at12, ..StepPolicy::new(Policy::ComputeBudget) };
        let at = |p: StepPolicy, th, e| replay_policy(&t, &PolicyRun::new(p, th, e));
        assert_eq!(at(budget, Threshold::Off, ex), at(budget, Threshold::Off, guarded));
        let drop = StepPolicy::new(Policy::DropPredictive);
        let (plain, held) = (at(drop, at12, ex), at(drop, at12, guarded));
        assert!(plain.enforced.iter().all(|&e| e) && held.enforced.iter().any(|&e| !e), "{:?}", held.enforced);
        assert!(held.drop_rate < plain.drop_rate, "{} {}", held.drop_rate, plain.drop_rate);
    }

    /// Rebalancing counts parts: an odd part count runs its last part as a tail micro-batch.
    #[test]
    fn rebalancing_in_parts_runs_the_remainder_as_a_tail_micro_batch() {
        let (n, m, steps) = (4usize, 8usize, 20usize);
        let t = chronic_trace(n, m, steps);
        let p = StepPolicy { tail: TailShape::split(2), ..StepPolicy::new(Policy::Rebalance) };
        let r = replay_policy(&t, &run(p, None));
        assert!(r.per_step.iter().all(|x| x.2 == (n * m * 2) as u64), "global batch constant in parts");
        assert_eq!(r.lost, 0);
        // From step 1 in parts (M·2 = 16 per rank, 64 in all): rank 1 gets 9 parts (4 whole
        // + 1 half: 8 + 1 = 9 ns), the others 18, 18, 19 (9 ns, 9 ns, 9.5 ns).
        let a = &r.assigned[n..2 * n];
        assert_eq!(a.iter().sum::<u32>(), 64);
        assert_eq!(a[1], 9, "{a:?}");
        assert_eq!(r.per_step[1].1, 9.5, "{:?}", &r.per_step[1]);
    }

    /// One chronic rank at twice the latency: after the tracker's first step the rebalancer
    /// gives it fewer micro-batches, the global batch constant, and the step time falls.
    #[test]
    fn rebalance_moves_work_off_a_chronic_rank_and_keeps_the_global_batch() {
        let (n, m, steps) = (4usize, 8usize, 20usize);
        let t = chronic_trace(n, m, steps);
        let p = StepPolicy { rebalance: RebalanceConfig::default(), ..StepPolicy::new(Policy::Rebalance) };
        let r = replay_policy(&t, &run(p, None));
        assert!(r.per_step.iter().all(|x| x.2 == (n * m) as u64), "global batch constant");
        assert_eq!(r.lost, 0);
        // Step 0 synchronous (16 ns); from step 1 (the tracker's first step): rank 1 gets 5
        // (10 ns), the others 9, 9, 9 (9 ns).
        assert_eq!(r.per_step[0], (16.0, 16.0, 32));
        assert_eq!(&r.assigned[n..2 * n], &[9, 5, 9, 9]);
        assert_eq!(r.per_step[1], (16.0, 10.0, 32));
        let want = (20.0 * 16.0) / (16.0 + 19.0 * 10.0) - 1.0;
        assert!((r.effective_speedup - want).abs() < 1e-12, "{}", r.effective_speedup);
    }

    /// The same rebalancing on a trace in tokens where the chronic rank holds the long
    /// micro-batches (100 tokens against 10): the micro-batches moved past a fast rank's
    /// recorded M count the trace's mean tokens (an estimate) and the step's nominal tokens are
    /// those handed out, so a run that starts all it is handed drops nothing and its speedup is
    /// the one in micro-batches. Against the recorded tokens it showed a drop with no
    /// micro-batch lost (the review's "drop 0.33 %, lost mb 0").
    #[test]
    fn rebalance_in_tokens_drops_nothing_when_nothing_is_lost() {
        let (n, m, steps) = (4usize, 8usize, 20usize);
        let tokens: Vec<u64> = (0..n * m * steps).map(|k| if (k / m) % n == 1 { 100 } else { 10 }).collect();
        let t = chronic_trace(n, m, steps).with_tokens(tokens).expect("tokens");
        let p = StepPolicy { rebalance: RebalanceConfig::default(), ..StepPolicy::new(Policy::Rebalance) };
        let r = replay_policy(&t, &run(p, None));
        assert_eq!(r.lost, 0);
        assert_eq!(&r.assigned[n..2 * n], &[9, 5, 9, 9], "work moved off rank 1");
        let (agg, nom) = r.tokens.expect("in tokens");
        assert_eq!((r.drop_rate, agg), (0.0, nom));
        let want = (20.0 * 16.0) / (16.0 + 19.0 * 10.0) - 1.0;
        assert!((r.effective_speedup - want).abs() < 1e-12, "{}", r.effective_speedup);
    }

    /// `n` ranks x `m` micro-batches x `steps` steps of scripted lengths: micro-batch k of the
    /// run has bucket 3 when k is a multiple of 5 (a long bucket every fifth micro-batch), else k % 3, and
    /// costs `cost[bucket]`; no noise, no overhead.
    fn length_trace(n: usize, m: usize, steps: usize) -> LatencyTrace {
        let cost = [10.0, 20.0, 40.0, 160.0];
        let bucket = |k: usize| if k.is_multiple_of(5) { 3 } else { (k % 3) as u32 };
        let cells = n * m * steps;
        let b: Vec<u32> = (0..cells).map(bucket).collect();
        let lat: Vec<f64> = b.iter().map(|&x| cost[x as usize]).collect();
        LatencyTrace::new("lengths", (0..n as u32).collect(), (0..steps as u64).collect(), m, lat, vec![0.0; steps])
            .and_then(|t| t.with_buckets(b))
            .expect("valid")
    }

    /// Data that knows what it deals: every part of step s, rank r, slot j has bucket
    /// (s + r + j) % 4 and 10 tokens per bucket index plus one.
    struct Shaped {
        steps: usize,
        step: usize,
        dealt: Vec<u32>,
        /// A rank whose parts have no shape (`part_shape` says `None`), if any.
        unshaped: Option<usize>,
    }

    impl ReplayData for Shaped {
        fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
            self.step = index;
            self.dealt = assignment.to_vec();
            (index < self.steps).then(|| assignment.to_vec())
        }

        fn settle(&mut self, _started: &[u32]) {}

        fn knows_shapes(&self) -> bool {
            true
        }

        fn part_shape(&self, rank: usize, slot: usize) -> Option<PartShape> {
            let bucket = ((self.step + rank + slot) % 4) as u32;
            if self.unshaped == Some(rank) {
                return None;
            }
            (slot < *self.dealt.get(rank)? as usize).then_some(PartShape { bucket, tokens: 10 * u64::from(bucket) + 1 })
        }
    }

    /// With the dealt parts' shapes each micro-batch costs its dealt bucket's recorded cost
    /// (no noise: the trace's mean per bucket is the cost), whatever the recorded cell held,
    /// and the tokens are the dealt parts'; without shapes the same data replays as before.
    #[test]
    fn dealt_shapes_cost_their_own_bucket_and_count_their_own_tokens() {
        let (n, m, steps) = (3usize, 4usize, 5usize);
        let cost = [10.0, 20.0, 40.0, 160.0];
        let t = length_trace(n, m, steps);
        let tokens: Vec<u64> = t.buckets().expect("buckets").iter().map(|&b| 100 * u64::from(b)).collect();
        let t = t.with_tokens(tokens).expect("tokens");
        let sync = run(StepPolicy::new(Policy::Synchronous), None);
        let r = replay_policy_on(&t, &sync, &mut Shaped { steps, step: 0, dealt: Vec::new(), unshaped: None });
        let mut want_tokens = 0.0;
        for s in 0..steps {
            let rank_ns = |r: usize| (0..m).map(|j| cost[(s + r + j) % 4]).sum::<f64>();
            let want = (0..n).map(rank_ns).fold(0.0, f64::max);
            assert_eq!(r.compute_ns[s], want, "step {s}");
            want_tokens += (0..n).flat_map(|r| (0..m).map(move |j| (10 * ((s + r + j) % 4) + 1) as f64)).sum::<f64>();
        }
        assert_eq!(r.tokens, Some((want_tokens, want_tokens)), "the dealt parts' tokens");
        // The recorded cells: the same data without shapes replays the trace as recorded.
        let plain = replay_policy(&t, &sync);
        for s in 0..steps {
            let mat = t.step_matrix(s);
            let want = (0..n).map(|r| mat[r * m..(r + 1) * m].iter().sum::<f64>()).fold(0.0, f64::max);
            assert_eq!(plain.compute_ns[s], want, "step {s}");
        }
        assert_ne!(plain.compute_ns, r.compute_ns, "the shapes change what is replayed");
    }

    /// A rank without shapes in a shaped step (its parts' `part_shape` unknown, the others'
    /// known) keeps its tokens in the step's handed-out tokens: it counts its recorded cells'
    /// tokens as started and as handed out, so a synchronous replay (nothing dropped) computes
    /// its whole nominal batch in tokens, the shaped ranks' dealt tokens plus the unshaped
    /// rank's recorded ones, and drops 0 %. Before, its parts were left out of the handed-out
    /// tokens and the other ranks' tokens per part stood in for them (here a nominal 960
    /// tokens against 3580 computed: an inflated speedup in tokens).
    #[test]
    fn a_rank_without_shapes_in_a_shaped_step_keeps_its_tokens() {
        let (n, m, steps) = (3usize, 4usize, 5usize);
        let t = length_trace(n, m, steps);
        let tokens: Vec<u64> = t.buckets().expect("buckets").iter().map(|&b| 100 * u64::from(b) + 7).collect();
        let t = t.with_tokens(tokens.clone()).expect("tokens");
        let sync = run(StepPolicy::new(Policy::Synchronous), None);
        let r = replay_policy_on(&t, &sync, &mut Shaped { steps, step: 0, dealt: Vec::new(), unshaped: Some(1) });
        let mut want = 0.0;
        for s in 0..steps {
            for rank in 0..n {
                want += (0..m)
                    .map(|j| match rank {
                        1 => tokens[(s * n + rank) * m + j] as f64,
                        _ => (10 * ((s + rank + j) % 4) + 1) as f64,
                    })
                    .sum::<f64>();
            }
        }
        assert_eq!(r.tokens, Some((want, want)), "computed and nominal tokens");
        assert_eq!(r.drop_rate, 0.0);
    }

    /// One bucket only: the bucket estimate is the blind one, so `length-predictive` is
    /// `drop-predictive` bit for bit; and a trace without buckets runs both length-aware
    /// policies blind (`cost-balance` keeps every rank's own M).
    #[test]
    fn length_aware_policies_without_distinct_buckets_are_drop_predictive() {
        let one = chronic_trace(4, 8, 10);
        let with_one = one.clone().with_buckets(vec![0; 4 * 8 * 10]).expect("buckets");
        // The chronic rank's 8 x 2 ns do not fit in 12 ns.
        let mut ex = exec(CheckMode::Predictive);
        ex.warmup_steps = 1;
        let at = |p: Policy, t: &LatencyTrace| {
            replay_policy(t, &PolicyRun::new(StepPolicy::new(p), Threshold::Fixed(Duration::from_nanos(12)), ex))
        };
        let dp = at(Policy::DropPredictive, &one);
        assert!(dp.lost > 0, "the deadline drops");
        for t in [&one, &with_one] {
            for p in [Policy::LengthPredictive, Policy::CostBalance] {
                let r = at(p, t);
                assert_eq!((&r.per_step, &r.started, &r.assigned), (&dp.per_step, &dp.started, &dp.assigned), "{p}");
            }
        }
    }

    /// Cost-balance on scripted lengths, no deadline: every step deals all N·M micro-batches
    /// (the global batch kept, nothing lost), and once every bucket has been measured (no noise:
    /// the estimates are exact) the step's compute is within one micro-batch's cost of the mean
    /// load, below the blind deal's.
    #[test]
    fn cost_balance_deals_every_micro_batch_and_ends_near_the_mean_load() {
        let (n, m, steps) = (8usize, 4usize, 12usize);
        let t = length_trace(n, m, steps);
        let sync = replay_policy(&t, &run(StepPolicy::new(Policy::Synchronous), None));
        let cb = replay_policy(&t, &run(StepPolicy::new(Policy::CostBalance), None));
        assert_eq!((cb.lost, cb.aggregated, cb.nominal), (0, (n * m * steps) as u64, (n * m * steps) as u64));
        for s in 0..steps {
            let cells = s * n..(s + 1) * n;
            assert_eq!(cb.assigned[cells.clone()].iter().sum::<u32>(), (n * m) as u32, "step {s}");
            assert_eq!(cb.started[cells.clone()], cb.assigned[cells], "step {s}: no deadline");
            let mat = t.step_matrix(s);
            let mean = mat.iter().sum::<f64>() / n as f64;
            let max = mat.iter().copied().fold(0.0, f64::max);
            if s >= 1 {
                assert!(cb.compute_ns[s] <= mean + max, "step {s}: {} vs mean {mean}", cb.compute_ns[s]);
            }
            assert!(cb.compute_ns[s] <= sync.compute_ns[s], "step {s}");
        }
        assert!(cb.effective_speedup > 0.05, "{}", cb.effective_speedup);
        // In step 0 nothing was measured: equal costs, equal counts.
        assert_eq!(cb.assigned[..n], vec![m as u32; n][..]);
    }

    /// A bounded stream under cost-balance with a deadline: every part handed out is started
    /// exactly once over the run (the dropped ones are dealt again), as the ledger requires.
    #[test]
    fn cost_balance_computes_every_part_of_a_bounded_stream_once() {
        let (n, m, steps) = (4usize, 4usize, 6usize);
        let t = length_trace(n, m, steps);
        let mut ex = exec(CheckMode::Predictive);
        ex.warmup_steps = 1;
        let r = replay_policy_on(
            &t,
            &PolicyRun::new(StepPolicy::new(Policy::CostBalance), Threshold::Fixed(Duration::from_nanos(150)), ex),
            &mut Parts(70),
        );
        assert_eq!(r.started.iter().map(|&x| u64::from(x)).sum::<u64>(), 70);
        assert!(r.lost > 0, "the deadline dropped some (dealt again later)");
        assert!(r.handed.iter().zip(&r.started).all(|(h, s)| s <= h));
    }

    /// The length-aware check on scripted lengths beats the blind one at the same threshold:
    /// fewer micro-batches dropped (the blind quantile is a long bucket's and stops short ones
    /// that fit) within the same step time.
    #[test]
    fn length_predictive_drops_less_than_blind_at_the_same_threshold() {
        let (n, m, steps) = (8usize, 8usize, 20usize);
        let t = length_trace(n, m, steps);
        let mut ex = exec(CheckMode::Predictive);
        ex.warmup_steps = 2;
        let th = Threshold::Fixed(Duration::from_nanos(300));
        let blind = replay_policy(&t, &PolicyRun::new(StepPolicy::new(Policy::DropPredictive), th, ex));
        let aware = replay_policy(&t, &PolicyRun::new(StepPolicy::new(Policy::LengthPredictive), th, ex));
        assert!(aware.lost < blind.lost, "aware {} blind {}", aware.lost, blind.lost);
        // No noise: a bucket's estimate is exact, so no rank overshoots the deadline after the
        // warm-up, unless its guaranteed first micro-batch alone does.
        for s in ex.warmup_steps as usize..steps {
            assert!(aware.compute_ns[s] <= 300.0 || aware.started[s * n..(s + 1) * n].contains(&1), "step {s}");
        }
    }
}
