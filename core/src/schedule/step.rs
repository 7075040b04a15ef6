//! The step loop of one rank: deadline-checked micro-batches, one collective group, exact
//! rescale, one optimizer update.
//!
//! Owns: [`Scheduler`] (its stream, events, accumulator and count buffers) and the [`Workload`]
//! trait the user implements. Must not touch: the deadline rule itself (`policy::decide`, shared
//! with the simulator), the user's recipes' contents, host clocks (every time is a device event
//! timestamp; a host clock jump changes nothing).
//!
//! One step on rank r (`../shared/reference/dropcompute.md` §2, with our fixes), one method per
//! phase, in the order [`Scheduler::step`] calls them:
//! 1. `start_clock`: the compute clock starts at event `t0`, recorded after the previous
//!    optimizer update (at the first step, now).
//! 2. `take_micro_batches` takes this rank's assigned micro-batches from the data source
//!    (`assignment[rank]`, M unless a rebalancing policy moved work; `DataSource::take_assigned`);
//!    Under `cost-balance` the step's N·M micro-batches are instead dealt by predicted bucket
//!    cost (`deal_by_cost`: `policy::cost_balance` over the job-wide `BucketEstimator`, through
//!    `DataSource::take_dealt`), as `sim::policies` deals a recorded step.
//!    `run_micro_batches` runs them under the deadline, or with the threshold off when the
//!    drop-rate guard (`SchedulerConfig::drop_guard`, `policy::DropGuard`, asked with the
//!    step's N·M·S nominal parts and fed after phase 5 with the step's global nominal and
//!    computed parts, as `sim::policies` replays it) holds the step off (the length-aware policies tell the
//!    walk each micro-batch's bucket, `MicroBatch::bucket`). Before micro-batch i the host waits
//!    for the end event of micro-batch i-1-k (sync lag k) and asks `policy::decide` with the
//!    device time elapsed since `t0` (and, in predictive mode, the rank's latency estimate). On
//!    start: the user's recipe writes the micro-batch gradient, the scheduler accumulates it into
//!    the f32 accumulator. On stop: the rest are left undone.
//! 3. `update_ledger`: the computed sample ids and the dropped micro-batches go to the ledger;
//!    after the collective (phase 5) the data source settles the step with every rank's
//!    computed count (`DataSource::settle`): the dropped ones are re-queued or discarded.
//! 4. `local_row` + `issue_collective_group`: every rank, whatever it computed, issues the same
//!    group: one in-place all-reduce (Sum) per gradient bucket, and an all-reduce (Sum) of an
//!    N x `CountRow::len(M)` u32 matrix in which each rank fills only its own row (a gather
//!    through the all-reduce path) with its [`CountRow`] (non-finite flag, counts, compute and
//!    overhead ns, stop request, compute clock start, M latencies; layout in `count_row.rs`).
//!    Gathering rather than summing gives every rank every rank's counts (the report), and the
//!    sums are formed in rank order on every rank, so every rank derives the same divisor.
//! 5. `global_view` decodes the rows and applies the rescale rule [`divisor`] (realized: global
//!    samples or tokens; nominal: N·M·b). `rescale_and_update` rescales the gradient on the
//!    device by 1 / divisor, then the user's optimizer recipe runs once. A zero global count or
//!    a non-finite gradient on any rank skips the update on every rank (state unchanged).
//! 6. `restart_clock` zeroes the accumulator and records the next `t0`; the step's overhead,
//!    the straggler statistics, the report and the re-tuner follow.

use tracing::{debug, debug_span, info_span};

use crate::hccl::{Comm, HcclError, ReduceOp};
use crate::policy::assign::Assigner;
use crate::policy::bucket::{BucketEstimator, WalkEstimator, bucket_cost, cost_balance_parts};
use crate::policy::walk::{Next, RankWalk, WalkEnd};
use crate::policy::{
    DeadlineConfig, DropGuard, LatencyEstimator, Policy, RankLatencyTracker, Rebalancer, StepPolicy, Threshold,
};
use crate::synapse::{DeviceBuffer, Event, HostBuffer, Stream};
use crate::tune::retune::{RetuneEvent, Retuner};

use super::config::{DropHandling, GradDtype, SchedulerConfig, Weighting};
use super::count_row::CountRow;
use super::data::{DataSource, DropFate, DropLedger, DropRecord, MicroBatch};
use super::divisor::divisor;
use super::ops::{GradientOps, GradientScratch};
use super::report::{MicroBatchRecord, RankStepStats, SkipReason, StepReport, StragglerTracker};
use super::{ScheduleError, WorkloadError};

/// The user's model as the scheduler drives it. Both methods only enqueue work on `stream`.
pub trait Workload {
    /// Enqueue the forward and backward pass of `mb` (micro-batch `index` of `step`): copy its
    /// inputs host-to-device and launch the recipe that overwrites `grad` with the gradient
    /// summed (not averaged) over the micro-batch's samples (or tokens). The scheduler then
    /// accumulates `grad` into its f32 accumulator. With a tail shape
    /// (`SchedulerConfig::tail`, split S) a launch of at most b/S samples is a tail
    /// micro-batch: run it on the tail shape's recipe; `index` is then the index of the
    /// micro-batch it is cut from (several launches of a step may share it).
    ///
    /// # Errors
    /// Any error; reported as [`ScheduleError::Workload`] with rank, step and call.
    fn launch_micro_batch(
        &mut self,
        stream: &Stream,
        step: u64,
        index: u32,
        mb: &MicroBatch,
        grad: &mut GradientScratch,
    ) -> Result<(), WorkloadError>;

    /// Enqueue the optimizer update reading the reduced, rescaled gradient `grad` (f32, the
    /// mean gradient under realized normalization). Called exactly once per non-skipped step.
    ///
    /// # Errors
    /// As [`Workload::launch_micro_batch`].
    fn launch_optimizer(&mut self, stream: &Stream, step: u64, grad: &DeviceBuffer<f32>) -> Result<(), WorkloadError>;

    /// Called once per step after the rank's last micro-batch launch (whatever it computed),
    /// before the step's non-finite check, collectives, rescale and update are enqueued. The
    /// default does nothing; `train`'s workload sets the mock's latency key of the step's end,
    /// so those launches draw the same latencies in two runs that computed different
    /// micro-batches (common random numbers).
    ///
    /// # Errors
    /// As [`Workload::launch_micro_batch`].
    fn compute_done(&mut self, stream: &Stream, step: u64) -> Result<(), WorkloadError> {
        let _ = (stream, step);
        Ok(())
    }
}

/// Every rank's whole micro-batches' length buckets in one step, rank-major (`[r][j]`: rank
/// r's j-th whole micro-batch; `None`: no bucket), as a cost-balanced deal handed them out.
type RankBuckets = Vec<Vec<Option<u32>>>;

/// This rank's compute phase of one step (device times, ns).
struct ComputePhase {
    /// Device timestamp of the compute clock start `t0` (set after the loop).
    t0_ns: u64,
    /// Launches started: whole micro-batches first, then tail micro-batches (the tail shape).
    started: usize,
    /// Parts started (a prefix of the planned ones; = `started` without a tail shape).
    parts: usize,
    /// Per launch: its samples.
    samples: Vec<u64>,
    /// Per launch: its tokens (recorded under `Weighting::Tokens` only) and its length bucket.
    tokens: Vec<Option<u64>>,
    /// See `tokens`.
    buckets: Vec<Option<u32>>,
    /// Start timestamp of each of the M slots (0 when not started).
    starts_ns: Vec<u64>,
    /// End timestamp of each of the M slots (0 when not started).
    ends_ns: Vec<u64>,
    /// Duration of each of the M slots, [`CountRow::NOT_COMPUTED`] when not computed.
    durations: Vec<u64>,
    /// End of the last computed micro-batch minus `t0` (0 when none was).
    compute_ns: u64,
    /// Host wall time of the micro-batch loop (reported only, never decided on).
    host_loop_ns: u64,
    /// End events already read (a prefix of the started micro-batches).
    seen: usize,
}

impl ComputePhase {
    /// Nothing started yet, for M = `m` slots.
    fn new(m: usize) -> Self {
        Self {
            t0_ns: 0,
            started: 0,
            parts: 0,
            samples: Vec::with_capacity(m),
            tokens: Vec::with_capacity(m),
            buckets: Vec::with_capacity(m),
            starts_ns: vec![0; m],
            ends_ns: vec![0; m],
            durations: vec![CountRow::NOT_COMPUTED; m],
            compute_ns: 0,
            host_loop_ns: 0,
            seen: 0,
        }
    }
}

/// What the ledger update leaves for the count row and the report.
struct Settled {
    /// This rank's micro-batches, computed then dropped.
    records: Vec<MicroBatchRecord>,
    /// Samples computed.
    samples: u64,
    /// Tokens computed.
    tokens: u64,
    /// Micro-batches dropped.
    dropped: u32,
    /// Samples of the dropped micro-batches.
    dropped_samples: u64,
    /// Tokens of the dropped micro-batches (0 unless they carry token counts).
    dropped_tokens: u64,
    /// The dropped micro-batches, in schedule order (for [`DataSource::settle`]).
    dropped_mbs: Vec<MicroBatch>,
}

/// The collective group of one step on this rank.
struct CollectivePhase {
    /// Sequence numbers of its collectives (first, last).
    seqs: (u64, u64),
    /// Device timestamps (ns) before the group and after the count read-back.
    c0_ns: u64,
    /// See `c0_ns`.
    c1_ns: u64,
}

/// Every rank's decoded count row and the rescale outcome (identical on every rank).
struct GlobalView {
    /// Count rows, indexed by rank.
    rows: Vec<CountRow>,
    /// [`divisor`] of the rows: the divisor, or why every rank skips the update.
    outcome: Result<f64, SkipReason>,
}

impl GlobalView {
    /// Micro-batches scheduled (computed + dropped) over every rank.
    fn planned(&self) -> u64 {
        self.rows.iter().map(|r| u64::from(r.computed) + u64::from(r.dropped)).sum()
    }
}

/// One rank's DropCompute step scheduler.
pub struct Scheduler {
    cfg: SchedulerConfig,
    comm: Comm,
    stream: Stream,
    ops: GradientOps,
    acc: DeviceBuffer<f32>,
    scratch: GradientScratch,
    flag_dev: DeviceBuffer<u32>,
    flag_host: HostBuffer<u32>,
    gathered_dev: DeviceBuffer<u32>,
    gathered_host: HostBuffer<u32>,
    scale_dev: DeviceBuffer<f32>,
    scale_host: HostBuffer<f32>,
    t0: Event,
    t0_recorded: bool,
    starts: Vec<Event>,
    ends: Vec<Event>,
    c0: Event,
    c1: Event,
    /// This rank's estimate of the predictive check: per length bucket when the policy is
    /// length-aware and the micro-batches carry buckets, else its blind window alone (exactly
    /// the `LatencyEstimator` of a job without buckets).
    estimator: BucketEstimator,
    /// `cost-balance`'s job-wide per-bucket cost estimate, fed after every cost-balanced step
    /// with every rank's whole micro-batches' gathered latencies under their buckets (identical
    /// on every rank, as `sim::policies` feeds it).
    job_estimator: BucketEstimator,
    stragglers: StragglerTracker,
    ledger: DropLedger,
    retuner: Option<Retuner>,
    last_overhead_ns: u64,
    stop_requested: bool,
    assigner: Assigner,
    /// The run-time drop-rate guard (`SchedulerConfig::drop_guard`), fed after every step with
    /// the step's global nominal and aggregated parts (identical on every rank).
    guard: Option<DropGuard>,
}

/// The scheduler state a checkpoint must carry for a resumed run to decide exactly as the
/// uninterrupted one (everything else is rebuilt from the configuration).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SchedulerState {
    /// Threshold in force (ns), `None` for off.
    pub threshold_ns: Option<u64>,
    /// This rank's latency estimate window (predictive check): the blind window (every
    /// micro-batch).
    pub estimator: LatencyEstimator,
    /// This rank's per-bucket estimate (the length-aware policies), its blind window equal to
    /// `estimator`; `None` when no bucket was measured (not written then, so a job without
    /// buckets checkpoints as before; checkpoints written before it restore the blind window
    /// and no bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_estimator: Option<BucketEstimator>,
    /// `cost-balance`'s job-wide per-bucket cost estimate (identical on every rank); `None`
    /// when never fed (not written then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_estimator: Option<BucketEstimator>,
    /// Per-rank straggler statistics.
    pub stragglers: StragglerTracker,
    /// This rank's drop ledger.
    pub ledger: DropLedger,
    /// This rank's last step overhead (ns).
    pub last_overhead_ns: u64,
    /// Micro-batches assigned to each rank for the next step (empty in checkpoints written
    /// before per-rank assignments: M for every rank).
    #[serde(default)]
    pub assignment: Vec<u32>,
    /// The rebalancing state (`rebalance` policies), `None` otherwise.
    #[serde(default)]
    pub rebalancer: Option<Rebalancer>,
    /// Per-rank micro-batch latency statistics of the policies (`None` in checkpoints written
    /// before them: restarts empty).
    #[serde(default)]
    pub latency: Option<RankLatencyTracker>,
    /// The drop-rate guard's counts (`SchedulerConfig::drop_guard`), `None` without a guard
    /// (not written then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_guard: Option<DropGuard>,
}

fn dev_err(rank: u32, step: u64, call: &'static str) -> impl FnOnce(crate::synapse::Error) -> ScheduleError {
    move |source| ScheduleError::Device { rank, step, call, source }
}

fn coll_err(rank: u32, step: u64, call: &'static str) -> impl FnOnce(HcclError) -> ScheduleError {
    move |source| ScheduleError::Collective { rank, step, call, source }
}

impl Scheduler {
    /// A scheduler for the rank of `comm`, on a new stream of the communicator's device, with
    /// the gradient operations `ops` (built for `cfg.gradient_len` and `cfg.grad_dtype`, e.g.
    /// [`GradientOps::graphs`], the product path). Allocates the accumulator (4·P bytes), the
    /// micro-batch gradient scratch (4·P or 2·P bytes), the count vectors and 2·M + 3 timed
    /// events.
    ///
    /// # Errors
    /// [`ScheduleError::Config`] for an invalid `cfg`; [`ScheduleError::Device`] when an
    /// allocation or event creation fails.
    pub fn new(comm: Comm, cfg: SchedulerConfig, ops: GradientOps) -> Result<Self, ScheduleError> {
        cfg.validate()?;
        let (rank, n) = (comm.rank(), comm.world_size() as usize);
        let dev = comm.device().clone();
        let e = |call| dev_err(rank, 0, call);
        let m = cfg.part_slots() as usize;
        let k = CountRow::len(cfg.row_slots() as usize);
        let stream = Stream::new(&dev).map_err(e("stream create"))?;
        let p = cfg.gradient_len;
        let scratch = match cfg.grad_dtype {
            GradDtype::F32 => GradientScratch::F32(DeviceBuffer::alloc(&dev, p).map_err(e("gradient scratch"))?),
            GradDtype::Bf16 => GradientScratch::Bf16(DeviceBuffer::alloc(&dev, p).map_err(e("gradient scratch"))?),
        };
        let timed = |call| Event::new(&dev, true).map_err(e(call));
        let mut starts = Vec::with_capacity(m);
        let mut ends = Vec::with_capacity(m);
        for _ in 0..m {
            starts.push(timed("event create")?);
            ends.push(timed("event create")?);
        }
        let s = Self {
            acc: DeviceBuffer::alloc(&dev, p).map_err(e("accumulator alloc"))?,
            scratch,
            flag_dev: DeviceBuffer::alloc(&dev, 1).map_err(e("flag alloc"))?,
            flag_host: HostBuffer::zeroed(&dev, 1).map_err(e("host flag"))?,
            gathered_dev: DeviceBuffer::alloc(&dev, k * n).map_err(e("count vector alloc"))?,
            gathered_host: HostBuffer::zeroed(&dev, k * n).map_err(e("host count vector"))?,
            scale_dev: DeviceBuffer::alloc(&dev, 1).map_err(e("scale alloc"))?,
            scale_host: HostBuffer::zeroed(&dev, 1).map_err(e("host scale"))?,
            t0: timed("event create")?,
            t0_recorded: false,
            starts,
            ends,
            c0: timed("event create")?,
            c1: timed("event create")?,
            estimator: BucketEstimator::new(cfg.estimator_window, cfg.estimator_quantile),
            job_estimator: BucketEstimator::new(cfg.estimator_window, cfg.estimator_quantile),
            stragglers: StragglerTracker::new(n, cfg.straggler_ewma_alpha, cfg.chronic_hit_fraction),
            ledger: DropLedger::default(),
            retuner: None,
            last_overhead_ns: 0,
            stop_requested: false,
            assigner: Self::assigner_of(&cfg, StepPolicy::new(Policy::DropPredictive), n),
            guard: cfg.drop_guard.and_then(|b| DropGuard::new(b).ok()),
            cfg,
            comm,
            stream,
            ops,
        };
        s.ops.zero(&s.stream, &s.acc).map_err(dev_err(rank, 0, "gradient zero"))?;
        Ok(s)
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The stream every launch of this scheduler (and of its workload) goes to.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The communicator (its flight recorder is the collective ledger: seq, op, dtype, count).
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// Sets the threshold for the following steps: the hook a tuner drives. Must be called with
    /// the same value on every rank before the same step (the scheduler does not check).
    pub fn set_threshold(&mut self, t: Threshold) {
        self.cfg.policy.threshold = t;
    }

    /// Lets `retuner` choose the threshold: fed after every step with the gathered N x M latency
    /// matrix (identical on every rank), so every rank moves to the same threshold.
    pub fn set_retuner(&mut self, retuner: Retuner) {
        self.cfg.policy.threshold = retuner.threshold_for_next_step();
        self.retuner = Some(retuner);
    }

    /// The threshold in force for the next step.
    pub fn threshold(&self) -> Threshold {
        self.cfg.policy.threshold
    }

    /// Per-rank straggler statistics so far.
    pub fn stragglers(&self) -> &StragglerTracker {
        &self.stragglers
    }

    /// This rank's ledger of dropped micro-batches and computed sample ids.
    pub fn ledger(&self) -> &DropLedger {
        &self.ledger
    }

    /// The latency estimator of the predictive check (for checkpointing or inspection): the
    /// blind window over every whole micro-batch.
    pub fn estimator(&self) -> &LatencyEstimator {
        self.estimator.blind()
    }

    /// The per-bucket estimator of the predictive check (the length-aware policies; without
    /// buckets its blind window is [`Scheduler::estimator`] and it has no bucket).
    pub fn bucket_estimator(&self) -> &BucketEstimator {
        &self.estimator
    }

    /// `cost-balance`'s job-wide per-bucket cost estimate (identical on every rank).
    pub fn job_estimator(&self) -> &BucketEstimator {
        &self.job_estimator
    }

    /// Asks every rank to stop: the request rides in this rank's row of the next step's count
    /// vector, so every rank sees [`StepReport::stop_requested`] at the same step (a
    /// coordinated stop, e.g. on SIGTERM, without an extra collective).
    pub fn request_stop(&mut self) {
        self.stop_requested = true;
    }

    /// The state to checkpoint (see [`SchedulerState`]).
    pub fn state(&self) -> SchedulerState {
        SchedulerState {
            threshold_ns: self.cfg.policy.threshold.as_ns(),
            estimator: self.estimator.blind().clone(),
            bucket_estimator: self.estimator.has_buckets().then(|| self.estimator.clone()),
            job_estimator: (!self.job_estimator.blind().is_empty()).then(|| self.job_estimator.clone()),
            stragglers: self.stragglers.clone(),
            ledger: self.ledger.clone(),
            last_overhead_ns: self.last_overhead_ns,
            assignment: self.assigner.assignment().to_vec(),
            rebalancer: self.assigner.rebalancer().cloned(),
            latency: Some(self.assigner.tracker().clone()),
            drop_guard: self.guard,
        }
    }

    /// Restores a checkpointed state (the retuner, if any, is not part of it and restarts).
    ///
    /// # Errors
    /// [`crate::policy::DropGuardError::Counts`] when the state's drop-guard counts are ones no
    /// run records (`reserve <= dropped <= handed` fails: a hand-made or damaged file),
    /// [`crate::policy::DropGuardError::Absent`] when this run has a guard and the state holds
    /// no counts; nothing is restored then.
    pub fn restore(&mut self, s: SchedulerState) -> Result<(), crate::policy::DropGuardError> {
        // A checkpoint of the same configuration carries the guard's counts; the bound is the
        // configuration's. Checked first, so a refused state leaves the scheduler as it was.
        let guard = match (&self.guard, s.drop_guard) {
            (Some(g), Some(saved)) => {
                let (h, d, r) = saved.counts();
                Some(DropGuard::from_counts(g.bound(), h, d, r)?)
            }
            (Some(g), None) => return Err(crate::policy::DropGuardError::Absent { bound: g.bound() }),
            (None, _) => None,
        };
        self.guard = guard;
        self.cfg.policy.threshold = Threshold::from_ns(s.threshold_ns);
        let fresh = BucketEstimator::new(self.cfg.estimator_window, self.cfg.estimator_quantile);
        self.estimator = s.bucket_estimator.unwrap_or_else(|| fresh.clone().with_blind(s.estimator));
        self.job_estimator = s.job_estimator.unwrap_or(fresh).with_prior(self.assigner.params().bucket_tokens);
        self.stragglers = s.stragglers;
        self.ledger = s.ledger;
        self.last_overhead_ns = s.last_overhead_ns;
        self.assigner.restore(&s.assignment, s.rebalancer, s.latency);
        Ok(())
    }

    /// The one assigner of `params` for this configuration: its tail shape is the
    /// configuration's, its slots the part slots, its deadline the threshold in force.
    fn assigner_of(cfg: &SchedulerConfig, params: StepPolicy, n: usize) -> Assigner {
        let params = StepPolicy { tail: cfg.tail, ..params };
        let (m, slots, warmup) = (cfg.micro_batches, cfg.part_slots(), cfg.policy.warmup_steps);
        Assigner::new(params, n, m, slots, warmup, cfg.policy.threshold, 0)
    }

    /// Runs the step policy `params` (its b, rebalancing limits; the tail shape is
    /// [`SchedulerConfig::tail`]) from the next step on, exactly as `sim::policies` replays it:
    /// each step's per-rank part counts are the one assignment step (`policy::assign::Assigner`,
    /// fed after every step with each rank's mean micro-batch latency from the gathered count
    /// rows, [`per_micro_batch_ns`]: identical on every rank), each rank's launches the one
    /// walker (`policy::walk::RankWalk`). The deadline's check mode becomes the policy's
    /// ([`Policy::check_mode`]); a policy without a deadline (`synchronous`, `backup-workers`,
    /// `rebalance`) turns the threshold off; `compute-budget` takes the threshold in force as
    /// its budget (off: M per rank). Call it on every rank alike, after setting the threshold.
    /// An assignment needing more than [`SchedulerConfig::part_slots`] parts on a rank is not
    /// applied (the previous one stays; logged).
    pub fn set_policy(&mut self, params: StepPolicy) {
        let p = params.policy;
        self.cfg.policy.check = p.check_mode(self.cfg.policy.check);
        if !p.has_deadline() {
            self.cfg.policy.threshold = Threshold::Off;
        }
        self.assigner = Self::assigner_of(&self.cfg, params, self.comm.world_size() as usize);
        // Cost-balance's prior for the buckets not measured yet, as the replay takes it.
        self.job_estimator = self.job_estimator.clone().with_prior(params.bucket_tokens);
    }

    /// The rebalancer of a rebalancing policy, if any (its assignment is
    /// [`Scheduler::assignment`]).
    pub fn rebalancer(&self) -> Option<&Rebalancer> {
        self.assigner.rebalancer()
    }

    /// Micro-batches each rank runs in the next step (`assignment[r]` for rank r; M for every
    /// rank unless set). Identical on every rank.
    pub fn assignment(&self) -> &[u32] {
        self.assigner.assignment()
    }

    /// Sets the per-rank part counts (micro-batches without a tail shape) of the following
    /// steps. Must be called with the same value on every rank before the same step (derive it
    /// from [`StepReport`] data, which is identical on every rank, never from local-only data).
    ///
    /// # Errors
    /// [`ScheduleError::Config`] (`assignment`) unless it has one entry per rank, each at most
    /// [`SchedulerConfig::part_slots`], summing to N·M·S (the global batch stays constant).
    pub fn set_assignment(&mut self, assignment: &[u32]) -> Result<(), ScheduleError> {
        let n = self.comm.world_size() as usize;
        let (m, slots) = (u64::from(self.cfg.micro_batches) * u64::from(self.cfg.parts()), self.cfg.part_slots());
        let sum: u64 = assignment.iter().map(|&a| u64::from(a)).sum();
        if assignment.len() != n || sum != n as u64 * m || assignment.iter().any(|&a| a > slots) {
            return Err(ScheduleError::Config {
                what: "assignment",
                value: format!(
                    "{assignment:?} (must have {n} entries, each <= {slots} slots, summing to N·M·S = {})",
                    n as u64 * m
                ),
            });
        }
        self.assigner.set(assignment.to_vec());
        Ok(())
    }

    /// Gives the communicator back (e.g. to destroy it), dropping the scheduler's buffers.
    pub fn into_comm(self) -> Comm {
        self.comm
    }

    /// Runs step `step` (0-based; steps below the warm-up count never drop) on this rank with
    /// micro-batches from `data` and the model `work`. Must be called by every rank for the
    /// same `step` (the collectives are matched by order).
    ///
    /// # Errors
    /// [`ScheduleError::Device`] for a failed launch, copy or event (naming the call);
    /// [`ScheduleError::Workload`] from `work`; [`ScheduleError::Collective`] for a collective
    /// failure (timeout, lost peer, asynchronous error), bounded by the communicator's timeout;
    /// [`ScheduleError::Data`] when `Weighting::Tokens` meets a micro-batch without tokens;
    /// [`ScheduleError::Counts`] when a gathered count row is garbled; [`ScheduleError::Retune`]
    /// when the re-tuner rejects the latency matrix.
    pub fn step(
        &mut self,
        step: u64,
        data: &mut dyn DataSource,
        work: &mut dyn Workload,
    ) -> Result<(StepReport, Option<RetuneEvent>), ScheduleError> {
        let _span = info_span!("step", step, rank = self.comm.rank()).entered();
        self.start_clock(step)?;
        let (planned, balanced) = self.take_micro_batches(step, data)?;
        // The guard's decision, on the step's nominal parts (N·M·S, known alike on every rank).
        let full = u64::from(self.comm.world_size()) * u64::from(self.cfg.micro_batches) * u64::from(self.cfg.parts());
        // Only a drop threshold is guarded (a compute budget's deadline is not one).
        let drops = self.assigner.params().policy.drops();
        let enforced = self.guard.as_ref().filter(|_| drops).is_none_or(|g| g.enforces(full));
        let compute = self.run_micro_batches(step, &planned, work, enforced)?;
        work.compute_done(&self.stream, step).map_err(|source| ScheduleError::Workload {
            rank: self.comm.rank(),
            step,
            call: "compute_done",
            source,
        })?;
        let mut settled = self.update_ledger(step, planned, &compute);
        let row = self.local_row(step, &compute, &settled)?;
        let collective = self.issue_collective_group(step, &row)?;
        let global = self.global_view(step)?;
        if let Some(buckets) = &balanced {
            self.observe_job_costs(&global, buckets);
        }
        let computed: Vec<u32> = global.rows.iter().map(|r| r.computed).collect();
        let requeue = self.cfg.drop_handling == DropHandling::Requeue;
        data.settle(self.comm.rank(), &computed, std::mem::take(&mut settled.dropped_mbs), requeue);
        self.rescale_and_update(step, work, &global)?;
        let end_ns = self.restart_clock(step)?;
        self.last_overhead_ns = end_ns.saturating_sub(compute.t0_ns).saturating_sub(compute.compute_ns);
        let mut report = self.report(step, &compute, settled.records, &collective, global, end_ns);
        if let Some(g) = self.guard.as_mut().filter(|_| drops) {
            g.record(report.nominal_parts(full), report.global_computed(), enforced);
        }
        if !enforced {
            report.threshold_ns = None; // the step ran with the threshold off
        }
        // A step in which no rank had data (the end of an epoch-bounded run) is no step of the
        // statistics: neither the straggler labels, the assignment step nor the re-tuner see it.
        if report.global_computed() + report.global_dropped() == 0 {
            return Ok((report, None));
        }
        let per_mb = per_micro_batch_ns(&report, &self.cfg.tail);
        self.stragglers.observe(&report.ranks, &per_mb);
        if self.assigner.observe(step, &per_mb) {
            tracing::warn!(
                step,
                slots = self.cfg.part_slots(),
                "rebalance: assignment exceeds the micro-batch slots; kept the previous one"
            );
        }
        let retune = self.retune(&report)?;
        Ok((report, retune))
    }

    /// Starts the compute clock (event `t0`) at the first step; later steps reuse the
    /// `t0` recorded after the previous optimizer update ([`Scheduler::restart_clock`]).
    fn start_clock(&mut self, step: u64) -> Result<(), ScheduleError> {
        if !self.t0_recorded {
            self.t0.record(&self.stream).map_err(dev_err(self.comm.rank(), step, "event record"))?;
            self.t0_recorded = true;
        }
        Ok(())
    }

    /// Takes this rank's assigned micro-batches from `data` (fewer when it runs out). Under
    /// `cost-balance` the step's N·M micro-batches (N·M·S parts) are dealt by predicted cost
    /// instead ([`Scheduler::deal_by_cost`]) when the source can deal a global step; the second
    /// value is then every rank's whole micro-batches' buckets (rank-major), for the job-wide
    /// estimate fed after the collective.
    ///
    /// # Errors
    /// [`ScheduleError::Data`] when `Weighting::Tokens` meets a micro-batch without tokens
    /// (nothing is requeued: the step fails).
    fn take_micro_batches(
        &mut self,
        step: u64,
        data: &mut dyn DataSource,
    ) -> Result<(Vec<MicroBatch>, Option<RankBuckets>), ScheduleError> {
        let rank = self.comm.rank();
        let balanced = match self.assigner.params().policy {
            Policy::CostBalance => self.deal_by_cost(data),
            _ => None,
        };
        let (mut planned, buckets) = match balanced {
            // Only a deal by buckets feeds the job-wide estimate (a job without buckets is
            // dealt blind, and its checkpoint stays as before).
            Some((mine, buckets)) => (mine, buckets.iter().flatten().any(Option::is_some).then_some(buckets)),
            None => (data.take_assigned(rank, self.assigner.assignment()), None),
        };
        planned.truncate(self.cfg.part_slots() as usize);
        if self.cfg.weighting == Weighting::Tokens && planned.iter().any(|mb| mb.tokens.is_none()) {
            return Err(ScheduleError::Data {
                rank: self.comm.rank(),
                step,
                what: "token weighting needs a token count on every micro-batch".into(),
            });
        }
        Ok((planned, buckets))
    }

    /// `cost-balance`'s deal of one step, as `sim::policies` deals a recorded step: the next
    /// N·M micro-batches of the global stream (N·M·S parts, S consecutive parts one whole
    /// micro-batch) go to ranks by [`cost_balance_parts`] over their buckets' predicted costs
    /// ([`bucket_cost`] of the job-wide estimate), at most the slots (the policy's cap, 2·M,
    /// within [`SchedulerConfig::part_slots`]) each; the counts become the step's assignment
    /// (`Assigner::set`). A micro-batch without a bucket (a job without buckets) makes the deal
    /// the blind one, M·S contiguous parts per rank. Returns this rank's parts and every rank's
    /// whole micro-batches' buckets; `None` when the source cannot deal a global step or the
    /// stream has fewer parts left (the caller deals by counts, the assignment M·S each).
    fn deal_by_cost(&mut self, data: &mut dyn DataSource) -> Option<(Vec<MicroBatch>, RankBuckets)> {
        let (rank, n) = (self.comm.rank(), self.comm.world_size() as usize);
        let split = self.cfg.parts() as usize;
        let m = self.cfg.micro_batches;
        let slots = self.assigner.params().deal_cap(m, self.cfg.part_slots() / split.max(1) as u32) as usize;
        let per_rank = m as usize * split;
        let est = &mut self.job_estimator;
        let mut deal = |parts: &[MicroBatch]| -> Vec<Vec<usize>> {
            let buckets: Option<Vec<u32>> = parts.chunks(split).map(MicroBatch::merged_bucket).collect();
            match buckets {
                Some(b) => cost_balance_parts(&bucket_cost(est, &b), n, slots, split),
                None => (0..n).map(|r| (r * per_rank..(r + 1) * per_rank).collect()).collect(),
            }
        };
        let slices = data.take_dealt(rank, n * per_rank, &mut deal)?;
        if slices.len() != n {
            return None;
        }
        self.assigner.set(slices.iter().map(|s| s.len() as u32).collect());
        let buckets = slices.iter().map(|s| s.chunks(split).map(MicroBatch::merged_bucket).collect()).collect();
        let mine = slices.into_iter().nth(rank as usize).unwrap_or_default();
        Some((mine, buckets))
    }

    /// Feeds `cost-balance`'s job-wide estimate with the step's gathered latencies: rank by
    /// rank, each whole micro-batch's device time under its bucket (`buckets[r][j]`: rank r's
    /// j-th whole micro-batch; the whole launches come first), as `sim::policies` feeds it.
    fn observe_job_costs(&mut self, global: &GlobalView, buckets: &[Vec<Option<u32>>]) {
        let split = u64::from(self.cfg.parts());
        for (row, b) in global.rows.iter().zip(buckets) {
            let launches = row.latencies_ns.iter().filter(|&&l| l != CountRow::NOT_COMPUTED).count() as u64;
            let whole =
                if split > 1 { u64::from(row.computed).saturating_sub(launches) / (split - 1) } else { launches };
            for (j, &l) in row.latencies_ns.iter().enumerate().take(whole as usize) {
                self.job_estimator.observe_for(b.get(j).copied().flatten(), l);
            }
        }
    }

    /// Launches a prefix of `planned` (this rank's parts) as the one walker
    /// (`policy::walk::RankWalk`) says: it asks for the device time at the end of earlier
    /// launches (waited for and read from their events, relative to `t0`), and for each
    /// launch, a whole micro-batch (S consecutive parts merged) or a tail part. Returns once
    /// every started launch has finished on the device.
    fn run_micro_batches(
        &mut self,
        step: u64,
        planned: &[MicroBatch],
        work: &mut dyn Workload,
        enforced: bool,
    ) -> Result<ComputePhase, ScheduleError> {
        let rank = self.comm.rank();
        let mut phase = ComputePhase::new(self.cfg.part_slots() as usize);
        let mut t0_ns: Option<u64> = None;
        let loop_start = std::time::Instant::now();
        // A step the drop-rate guard holds off runs with the threshold off.
        let deadline =
            if enforced { self.cfg.policy } else { DeadlineConfig { threshold: Threshold::Off, ..self.cfg.policy } };
        let mut walk = RankWalk::new(deadline, step, planned.len(), self.cfg.tail, self.cfg.sync_lag);
        // The length-aware policies tell the walk each micro-batch's bucket when every one has
        // one (S consecutive parts one micro-batch, padded to its largest part's bucket).
        if self.assigner.params().policy.length_aware() {
            let split = self.cfg.parts() as usize;
            let buckets: Option<Vec<u32>> = planned.chunks(split).map(MicroBatch::merged_bucket).collect();
            if let Some(b) = buckets {
                walk.set_buckets(&b);
            }
        }
        let tokens_unit = self.cfg.weighting == Weighting::Tokens;
        loop {
            match walk.next(&mut self.estimator) {
                Next::Launch(l) => {
                    let merged;
                    let mb = if l.parts == 1 {
                        &planned[l.first_part]
                    } else {
                        merged = MicroBatch::merged(&planned[l.first_part..l.first_part + l.parts]);
                        &merged
                    };
                    self.launch_micro_batch(step, l.index, l.micro_batch, mb, work)?;
                    phase.samples.push(mb.samples());
                    phase.tokens.push(mb.tokens.filter(|_| tokens_unit));
                    phase.buckets.push(mb.bucket);
                    phase.started += 1;
                    phase.parts += l.parts;
                }
                Next::Wait { upto } => {
                    let t0 = self.t0_ns(&mut t0_ns, rank, step)?;
                    self.read_ends(step, &mut phase, upto)?;
                    for i in walk.reported()..upto {
                        walk.ended(i, phase.ends_ns[i].saturating_sub(t0), phase.durations[i], &mut self.estimator);
                    }
                }
                Next::Done(WalkEnd::Assignment) => break,
                Next::Done(WalkEnd::Deadline(reason)) => {
                    debug!(step, rank, launch = phase.started, ?reason, "deadline: dropping the rest of the step");
                    break;
                }
            }
        }
        phase.host_loop_ns = u64::try_from(loop_start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        phase.t0_ns = self.t0_ns(&mut t0_ns, rank, step)?;
        phase.compute_ns = match phase.started {
            0 => 0,
            n => phase.ends_ns[n - 1].saturating_sub(phase.t0_ns),
        };
        Ok(phase)
    }

    /// Enqueues launch `i` (micro-batch index `j` for the workload): start event, the user's
    /// recipe, accumulation into the f32 accumulator, end event.
    fn launch_micro_batch(
        &mut self,
        step: u64,
        i: usize,
        j: u32,
        mb: &MicroBatch,
        work: &mut dyn Workload,
    ) -> Result<(), ScheduleError> {
        let rank = self.comm.rank();
        let e = |call| dev_err(rank, step, call);
        let _mb_span = debug_span!("micro_batch", step, rank, index = i).entered();
        self.starts[i].record(&self.stream).map_err(e("event record"))?;
        work.launch_micro_batch(&self.stream, step, j, mb, &mut self.scratch)
            .map_err(|source| ScheduleError::Workload { rank, step, call: "launch_micro_batch", source })?;
        self.ops.accumulate(&self.stream, &self.acc, &self.scratch).map_err(e("gradient accumulate"))?;
        self.ends[i].record(&self.stream).map_err(e("event record"))
    }

    /// The ledger update: records the sample ids of the computed micro-batches and a
    /// [`DropRecord`] per dropped one, and returns this rank's micro-batch records, its computed
    /// and dropped totals and the dropped micro-batches (settled with the data source after the
    /// collective, when every rank's count is known).
    fn update_ledger(&mut self, step: u64, planned: Vec<MicroBatch>, compute: &ComputePhase) -> Settled {
        let rank = self.comm.rank();
        let mut dropped = planned;
        let computed: Vec<MicroBatch> = dropped.drain(..compute.parts).collect();
        let fate = match self.cfg.drop_handling {
            DropHandling::Requeue => DropFate::Requeued,
            DropHandling::Discard => DropFate::Discarded,
        };
        let tokens_unit = self.cfg.weighting == Weighting::Tokens;
        for (j, mb) in dropped.iter().enumerate() {
            let micro_batch = (compute.parts + j) as u32;
            let tokens = mb.tokens.filter(|_| tokens_unit);
            let sample_ids = mb.sample_ids.clone();
            self.ledger.dropped.push(DropRecord { step, rank, micro_batch, sample_ids, fate, tokens });
        }
        self.ledger.computed.extend(computed.iter().flat_map(|mb| mb.sample_ids.iter().copied()));
        if tokens_unit {
            self.ledger.computed_tokens += computed.iter().filter_map(|mb| mb.tokens).sum::<u64>();
        }
        Settled {
            records: micro_batch_records(step, &dropped, compute, tokens_unit),
            samples: computed.iter().map(MicroBatch::samples).sum(),
            tokens: computed.iter().filter_map(|mb| mb.tokens).sum(),
            dropped: dropped.len() as u32,
            dropped_samples: dropped.iter().map(MicroBatch::samples).sum(),
            dropped_tokens: dropped.iter().filter_map(|mb| mb.tokens).sum(),
            dropped_mbs: dropped,
        }
    }

    /// This rank's count row: runs the non-finite check of the accumulator on the device
    /// (waiting for it) and collects the counts, the previous step's overhead, the stop
    /// request, the compute clock start and the M latencies.
    fn local_row(&mut self, step: u64, compute: &ComputePhase, settled: &Settled) -> Result<CountRow, ScheduleError> {
        let e = |call| dev_err(self.comm.rank(), step, call);
        self.ops.nonfinite(&self.stream, &self.flag_dev, &self.acc).map_err(e("non-finite check"))?;
        self.stream.copy_d2h(&self.flag_dev, &mut self.flag_host).map_err(e("flag copy"))?;
        let flag = self.flag_host.as_slice().map_err(e("host flag"))?[0];
        Ok(CountRow {
            nonfinite: flag != 0,
            computed: compute.parts as u32,
            dropped: settled.dropped,
            samples: settled.samples,
            tokens: settled.tokens,
            compute_ns: compute.compute_ns,
            overhead_ns: self.last_overhead_ns,
            dropped_samples: settled.dropped_samples,
            dropped_tokens: settled.dropped_tokens,
            stop_requested: self.stop_requested,
            clock_start_ns: compute.t0_ns,
            latencies_ns: {
                // Padded to the count row's width (a paired run's; never decoded).
                let mut l = compute.durations.clone();
                l.resize(self.cfg.row_slots() as usize, CountRow::NOT_COMPUTED);
                l
            },
        })
    }

    /// The collective group every rank issues whatever it computed: one in-place
    /// all-reduce (Sum) per gradient bucket, then the all-reduce (Sum) of the N x
    /// `CountRow::len(M)` count matrix in which this rank filled only its own row (`row`). Waits
    /// until the reduced counts are back on the host.
    fn issue_collective_group(&mut self, step: u64, row: &CountRow) -> Result<CollectivePhase, ScheduleError> {
        let rank = self.comm.rank();
        let e = |call| dev_err(rank, step, call);
        {
            let k = CountRow::len(self.cfg.row_slots() as usize);
            let all = self.gathered_host.as_mut_slice().map_err(e("host count vector"))?;
            all.fill(0);
            let own = all.chunks_exact_mut(k).nth(rank as usize).unwrap_or_default();
            row.encode(own).map_err(|source| ScheduleError::Counts { rank, step, row: rank, source })?;
        }
        self.stream.copy_h2d(&self.gathered_host, &mut self.gathered_dev).map_err(e("count vector copy"))?;
        self.c0.record(&self.stream).map_err(e("event record"))?;
        let buckets = self.cfg.buckets();
        let seqs = {
            let _c = debug_span!("collective", step, rank, buckets = buckets.len()).entered();
            let (acc, gathered, stream) = (&mut self.acc, &mut self.gathered_dev, &self.stream);
            let first = self.comm.last_seq() + 1;
            self.comm
                .group(stream, |c| {
                    for r in &buckets {
                        c.all_reduce_range_in_place(acc, r.clone(), ReduceOp::Sum, stream)?;
                    }
                    c.all_reduce_in_place(gathered, ReduceOp::Sum, stream)
                })
                .map_err(coll_err(rank, step, "gradient all-reduce group"))?;
            let last = self.comm.last_seq();
            self.stream.copy_d2h(&self.gathered_dev, &mut self.gathered_host).map_err(e("count vector copy"))?;
            self.c1.record(&self.stream).map_err(e("event record"))?;
            self.comm.synchronize(&self.stream).map_err(coll_err(rank, step, "collective synchronize"))?;
            (first, last)
        };
        let c0_ns = self.c0.timestamp_ns().map_err(e("event timestamp"))?;
        let c1_ns = self.c1.timestamp_ns().map_err(e("event timestamp"))?;
        Ok(CollectivePhase { seqs, c0_ns, c1_ns })
    }

    /// Decodes every rank's row of the gathered count matrix and applies the rescale
    /// rule ([`divisor`]); identical on every rank.
    ///
    /// # Errors
    /// [`ScheduleError::Counts`] naming the first rank whose row does not decode.
    fn global_view(&self, step: u64) -> Result<GlobalView, ScheduleError> {
        let rank = self.comm.rank();
        let (m, w) = (self.cfg.part_slots() as usize, self.cfg.row_slots() as usize);
        let g = self.gathered_host.as_slice().map_err(dev_err(rank, step, "host count vector"))?;
        let rows = g
            .chunks(CountRow::len(w))
            .enumerate()
            .map(|(r, v)| {
                let mut row = CountRow::decode(v, w).map_err(|source| ScheduleError::Counts {
                    rank,
                    step,
                    row: r as u32,
                    source,
                })?;
                // The padding beyond the part slots carries nothing.
                row.latencies_ns.truncate(m);
                Ok(row)
            })
            .collect::<Result<Vec<_>, ScheduleError>>()?;
        let outcome = divisor(&rows, &self.cfg);
        Ok(GlobalView { rows, outcome })
    }

    /// Divides the summed gradient by the divisor on the device and runs the user's
    /// optimizer recipe once; when the step is skipped (on every rank alike), logs why and
    /// leaves the model untouched.
    fn rescale_and_update(
        &mut self,
        step: u64,
        work: &mut dyn Workload,
        global: &GlobalView,
    ) -> Result<(), ScheduleError> {
        let rank = self.comm.rank();
        let e = |call| dev_err(rank, step, call);
        match &global.outcome {
            Ok(divisor) => {
                self.scale_host.as_mut_slice().map_err(e("host scale"))?[0] = (1.0 / divisor) as f32;
                self.stream.copy_h2d(&self.scale_host, &mut self.scale_dev).map_err(e("scale copy"))?;
                self.ops.scale(&self.stream, &self.acc, &self.scale_dev).map_err(e("gradient rescale"))?;
                work.launch_optimizer(&self.stream, step, &self.acc).map_err(|source| ScheduleError::Workload {
                    rank,
                    step,
                    call: "launch_optimizer",
                    source,
                })?;
            }
            Err(skip) if global.planned() > 0 || matches!(skip, SkipReason::NonFinite { .. }) => {
                tracing::warn!(step, rank, ?skip, "skipping the update on every rank");
            }
            Err(_) => debug!(step, rank, "no rank had data: nothing to update"),
        }
        Ok(())
    }

    /// Zeroes the accumulator, records the next step's compute clock start `t0` after
    /// the update and waits for it; returns its device timestamp (ns), this step's end.
    fn restart_clock(&mut self, step: u64) -> Result<u64, ScheduleError> {
        let rank = self.comm.rank();
        let e = |call| dev_err(rank, step, call);
        self.ops.zero(&self.stream, &self.acc).map_err(e("gradient zero"))?;
        self.t0.record(&self.stream).map_err(e("event record"))?;
        self.t0.synchronize().map_err(|x| self.stream_error(rank, step, "optimizer synchronize", x))?;
        self.t0.timestamp_ns().map_err(e("event timestamp"))
    }

    /// The step's report from its phases (`end_ns`: device timestamp of the update's end). The
    /// threshold is the one in force for this step (read before any re-tune).
    fn report(
        &self,
        step: u64,
        compute: &ComputePhase,
        micro_batches: Vec<MicroBatchRecord>,
        collective: &CollectivePhase,
        global: GlobalView,
        end_ns: u64,
    ) -> StepReport {
        let ranks: Vec<RankStepStats> = global.rows.iter().map(CountRow::stats).collect();
        let max_compute = ranks.iter().map(|r| r.compute_ns).max().unwrap_or(0);
        let wait_ns = max_compute.saturating_sub(compute.compute_ns);
        let (divisor, skip) = match global.outcome {
            Ok(d) => (d, None),
            Err(s) => (0.0, Some(s)),
        };
        StepReport {
            step,
            rank: self.comm.rank(),
            world_size: self.comm.world_size(),
            threshold_ns: self.cfg.policy.threshold.as_ns(),
            divisor,
            skip,
            compute_ns: compute.compute_ns,
            wait_ns,
            collective_ns: collective.c1_ns.saturating_sub(collective.c0_ns).saturating_sub(wait_ns),
            step_ns: end_ns.saturating_sub(compute.t0_ns),
            collective_seqs: collective.seqs,
            host_loop_ns: compute.host_loop_ns,
            collective_span_ns: (collective.c0_ns, collective.c1_ns),
            step_end_ns: end_ns,
            overhead_ns: global.rows.iter().map(|r| r.overhead_ns).max().unwrap_or(0),
            stop_requested: global.rows.iter().any(|r| r.stop_requested),
            latencies_ns: global.rows.iter().flat_map(CountRow::latencies_f64).collect(),
            assignment: self.assigner.assignment().to_vec(),
            micro_batches,
            ranks,
        }
    }

    /// Feeds the re-tuner, if any, with the step's N x M latency matrix and T_c estimate (max
    /// compute plus max overhead over ranks) and moves to the threshold it chooses.
    fn retune(&mut self, report: &StepReport) -> Result<Option<RetuneEvent>, ScheduleError> {
        let Some(rt) = &mut self.retuner else { return Ok(None) };
        let max_compute = report.ranks.iter().map(|r| r.compute_ns).max().unwrap_or(0);
        let ev = rt.on_step(&report.latencies_ns, (max_compute + report.overhead_ns) as f64)?;
        self.cfg.policy.threshold = rt.threshold_for_next_step();
        Ok(ev)
    }

    /// A stream error seen at a synchronize: when it is the asynchronous failure of an earlier
    /// collective on this stream (`synFailHccl`), it is reported as a collective failure with the
    /// communicator's typed error when the watchdog has one.
    fn stream_error(&self, rank: u32, step: u64, call: &'static str, e: crate::synapse::Error) -> ScheduleError {
        if e.status() == Some(habana_sys::synStatus::FAIL_HCCL) {
            let source = self.comm.error().unwrap_or_else(|| HcclError::Synapse(std::sync::Arc::new(e)));
            ScheduleError::Collective { rank, step, call, source }
        } else {
            ScheduleError::Device { rank, step, call, source: e }
        }
    }

    fn t0_ns(&self, cache: &mut Option<u64>, rank: u32, step: u64) -> Result<u64, ScheduleError> {
        if let Some(v) = *cache {
            return Ok(v);
        }
        self.t0.synchronize().map_err(|x| self.stream_error(rank, step, "event synchronize", x))?;
        let v = self.t0.timestamp_ns().map_err(dev_err(rank, step, "event timestamp"))?;
        *cache = Some(v);
        Ok(v)
    }

    /// Waits for the end events of micro-batches `phase.seen..upto` in order and reads their
    /// start and end timestamps and durations into `phase` (the walker feeds the estimator).
    fn read_ends(&mut self, step: u64, phase: &mut ComputePhase, upto: usize) -> Result<(), ScheduleError> {
        let rank = self.comm.rank();
        let e = |call| dev_err(rank, step, call);
        while phase.seen < upto {
            let i = phase.seen;
            self.ends[i].synchronize().map_err(|x| self.stream_error(rank, step, "micro-batch synchronize", x))?;
            phase.starts_ns[i] = self.starts[i].timestamp_ns().map_err(e("event timestamp"))?;
            phase.ends_ns[i] = self.ends[i].timestamp_ns().map_err(e("event timestamp"))?;
            phase.durations[i] = phase.ends_ns[i].saturating_sub(phase.starts_ns[i]);
            phase.seen += 1;
        }
        Ok(())
    }
}

/// Each rank's mean micro-batch latency in a step (ns: the sum of its launches' device
/// durations over the whole-micro-batch equivalents they computed, from the gathered N x S
/// matrix; NaN when it computed none): the input of `RankLatencyTracker`, the quantity
/// `sim::policies` feeds it. With a tail shape a rank that started `u` launches over `p` parts
/// ran w = (p - u)/(S - 1) whole micro-batches (they come first) and u - w tail ones, each
/// counting `tail.cost_fraction()` of a whole one.
pub fn per_micro_batch_ns(report: &StepReport, tail: &crate::policy::TailShape) -> Vec<f64> {
    let n = report.ranks.len().max(1);
    let s = report.latencies_ns.len() / n;
    if s == 0 {
        return vec![f64::NAN; report.ranks.len()];
    }
    let split = u64::from(tail.parts());
    report
        .latencies_ns
        .chunks_exact(s)
        .zip(&report.ranks)
        .map(|(row, rank)| {
            let (sum, k) = row.iter().filter(|v| v.is_finite()).fold((0.0, 0u64), |(a, k), &v| (a + v, k + 1));
            let equivalents = if split > 1 {
                let whole = u64::from(rank.computed).saturating_sub(k) / (split - 1);
                whole as f64 + k.saturating_sub(whole) as f64 * tail.cost_fraction()
            } else {
                k as f64
            };
            if k > 0 { sum / equivalents } else { f64::NAN }
        })
        .collect()
}

/// This rank's launch records of one step in schedule order: the started launches (whole or
/// tail micro-batches) with their device start, duration and samples, then the dropped parts
/// (micro-batches without a tail shape) stamped at the drop time (the end of the last started
/// launch, or `t0` when none was) with duration 0.
fn micro_batch_records(
    step: u64,
    dropped: &[MicroBatch],
    compute: &ComputePhase,
    tokens_unit: bool,
) -> Vec<MicroBatchRecord> {
    let drop_at = compute.started.checked_sub(1).map_or(compute.t0_ns, |last| compute.ends_ns[last]);
    let done = (0..compute.started).map(|i| MicroBatchRecord {
        step,
        micro_batch: i as u32,
        start_ns: compute.starts_ns[i],
        duration_ns: compute.durations[i],
        samples: compute.samples[i],
        dropped: false,
        tokens: compute.tokens[i],
        bucket: compute.buckets[i],
    });
    let undone = dropped.iter().enumerate().map(|(j, mb)| MicroBatchRecord {
        step,
        micro_batch: (compute.started + j) as u32,
        start_ns: drop_at,
        duration_ns: 0,
        samples: mb.samples(),
        dropped: true,
        tokens: mb.tokens.filter(|_| tokens_unit),
        bucket: mb.bucket,
    });
    done.chain(undone).collect()
}
