//! The step loop of one rank: deadline-checked micro-batches, one collective group, exact
//! rescale, one optimizer update.
//!
//! Owns: [`Scheduler`] (its stream, events, accumulator and count buffers) and the [`Workload`]
//! trait the user implements. Must not touch: the deadline rule itself (`policy::decide`, shared
//! with the simulator), the user's recipes' contents, host clocks (every time is a device event
//! timestamp; a host clock jump changes nothing).
//!
//! One step on rank r (`../shared/reference/dropcompute.md` §2, with our fixes):
//! 1. The compute clock starts at event `t0`, recorded after the previous optimizer update.
//! 2. Up to M micro-batches are taken from the data source. Before micro-batch i the host waits
//!    for the end event of micro-batch i-1-k (sync lag k) and asks `policy::decide` with the
//!    device time elapsed since `t0` (and, in predictive mode, the rank's latency estimate). On
//!    start: the user's recipe writes the micro-batch gradient, the scheduler accumulates it into
//!    the f32 accumulator. On stop: the rest go to the ledger (re-queued or discarded).
//! 3. Every rank, whatever it computed, issues the same group: one in-place all-reduce (Sum)
//!    per gradient bucket, and an all-reduce (Sum) of an N x K u32 matrix in which each rank
//!    fills only its own row (a gather through the all-reduce path) with the small vector
//!    `[nonfinite, computed, dropped, samples, tokens, compute ns, overhead ns, dropped samples,
//!    M latencies]`
//!    (64-bit values as lo/hi pairs). Gathering rather than summing gives every rank every
//!    rank's counts (the report), and the sums are formed in rank order on every rank, so every
//!    rank derives the same divisor.
//! 4. The gradient is rescaled on the device by 1 / divisor (realized: global samples or
//!    tokens; nominal: N·M·b), then the user's optimizer recipe runs once. A zero global count or
//!    a non-finite gradient on any rank skips the update on every rank (state unchanged).

use tracing::{debug, debug_span, info_span};

use crate::hccl::{Comm, HcclError, ReduceOp};
use crate::policy::{Decision, LatencyEstimator, Threshold, decide};
use crate::synapse::{DeviceBuffer, Event, HostBuffer, Stream};
use crate::tune::retune::{RetuneEvent, Retuner};

use super::config::{DropHandling, GradDtype, Normalization, SchedulerConfig, Weighting};
use super::data::{DataSource, DropFate, DropLedger, DropRecord, MicroBatch};
use super::ops::{GradientOps, GradientScratch};
use super::report::{MicroBatchRecord, RankStepStats, SkipReason, StepReport, StragglerTracker, threshold_ns};
use super::{ScheduleError, WorkloadError};

/// The user's model as the scheduler drives it. Both methods only enqueue work on `stream`.
pub trait Workload {
    /// Enqueue the forward and backward pass of `mb` (micro-batch `index` of `step`): copy its
    /// inputs host-to-device and launch the recipe that overwrites `grad` with the gradient
    /// summed (not averaged) over the micro-batch's samples (or tokens). The scheduler then
    /// accumulates `grad` into its f32 accumulator.
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
}

/// Fixed part of the per-rank count vector (u32 entries), before the 2·M latency entries.
const FIXED: usize = 14;
/// Latency entry of a micro-batch that was not computed.
const NOT_COMPUTED: u64 = u64::MAX;

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
    estimator: LatencyEstimator,
    stragglers: StragglerTracker,
    ledger: DropLedger,
    retuner: Option<Retuner>,
    last_overhead_ns: u64,
    stop_requested: bool,
}

/// The scheduler state a checkpoint must carry for a resumed run to decide exactly as the
/// uninterrupted one (everything else is rebuilt from the configuration).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SchedulerState {
    /// Threshold in force (ns), `None` for off.
    pub threshold_ns: Option<u64>,
    /// This rank's latency estimate window (predictive check).
    pub estimator: LatencyEstimator,
    /// Per-rank straggler statistics.
    pub stragglers: StragglerTracker,
    /// This rank's drop ledger.
    pub ledger: DropLedger,
    /// This rank's last step overhead (ns).
    pub last_overhead_ns: u64,
}

fn dev_err(rank: u32, step: u64, call: &'static str) -> impl FnOnce(crate::synapse::Error) -> ScheduleError {
    move |source| ScheduleError::Device { rank, step, call, source }
}

fn coll_err(rank: u32, step: u64, call: &'static str) -> impl FnOnce(HcclError) -> ScheduleError {
    move |source| ScheduleError::Collective { rank, step, call, source }
}

fn split(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

fn join(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

impl Scheduler {
    /// A scheduler for the rank of `comm`, on a new stream of the communicator's device, with
    /// the gradient operations `ops` (built for `cfg.gradient_len` and `cfg.grad_dtype`, e.g.
    /// [`GradientOps::mock`]). Allocates the accumulator (4·P bytes), the micro-batch gradient
    /// scratch (4·P or 2·P bytes), the count vectors and 2·M + 3 timed events.
    ///
    /// # Errors
    /// [`ScheduleError::Config`] for an invalid `cfg`; [`ScheduleError::Device`] when an
    /// allocation or event creation fails.
    pub fn new(comm: Comm, cfg: SchedulerConfig, ops: GradientOps) -> Result<Self, ScheduleError> {
        cfg.validate()?;
        let (rank, n) = (comm.rank(), comm.world_size() as usize);
        let dev = comm.device().clone();
        let e = |call| dev_err(rank, 0, call);
        let m = cfg.micro_batches as usize;
        let k = FIXED + 2 * m;
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
            estimator: LatencyEstimator::new(cfg.estimator_window, cfg.estimator_quantile),
            stragglers: StragglerTracker::new(n, cfg.straggler_ewma_alpha, cfg.chronic_hit_fraction),
            ledger: DropLedger::default(),
            retuner: None,
            last_overhead_ns: 0,
            stop_requested: false,
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

    /// The latency estimator of the predictive check (for checkpointing or inspection).
    pub fn estimator(&self) -> &LatencyEstimator {
        &self.estimator
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
            estimator: self.estimator.clone(),
            stragglers: self.stragglers.clone(),
            ledger: self.ledger.clone(),
            last_overhead_ns: self.last_overhead_ns,
        }
    }

    /// Restores a checkpointed state (the retuner, if any, is not part of it and restarts).
    pub fn restore(&mut self, s: SchedulerState) {
        self.cfg.policy.threshold =
            s.threshold_ns.map_or(Threshold::Off, |ns| Threshold::Fixed(std::time::Duration::from_nanos(ns)));
        self.estimator = s.estimator;
        self.stragglers = s.stragglers;
        self.ledger = s.ledger;
        self.last_overhead_ns = s.last_overhead_ns;
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
    /// [`ScheduleError::Data`] when `Weighting::Tokens` meets a micro-batch without tokens.
    pub fn step(
        &mut self,
        step: u64,
        data: &mut dyn DataSource,
        work: &mut dyn Workload,
    ) -> Result<(StepReport, Option<RetuneEvent>), ScheduleError> {
        let rank = self.comm.rank();
        let _span = info_span!("step", step, rank).entered();
        let e = |call| dev_err(rank, step, call);
        let m = self.cfg.micro_batches as usize;
        let threshold = self.cfg.policy.threshold;
        if !self.t0_recorded {
            self.t0.record(&self.stream).map_err(e("event record"))?;
            self.t0_recorded = true;
        }
        let planned: Vec<MicroBatch> = (0..m).map_while(|_| data.next_micro_batch()).collect();
        if self.cfg.weighting == Weighting::Tokens && planned.iter().any(|mb| mb.tokens.is_none()) {
            return Err(ScheduleError::Data {
                rank,
                step,
                what: "token weighting needs a token count on every micro-batch".into(),
            });
        }

        // Phase 1: micro-batches under the deadline.
        let lag = self.cfg.sync_lag as i64;
        let mut t0_ns: Option<u64> = None;
        let mut seen = 0usize; // end events already read
        let mut ends_ns = vec![0u64; m];
        let mut durations = vec![NOT_COMPUTED; m];
        let mut starts_ns = vec![0u64; m];
        let mut started = 0usize;
        let loop_start = std::time::Instant::now();
        for (i, mb) in planned.iter().enumerate() {
            let target = i as i64 - 1 - lag;
            let elapsed_ns = if target >= -1 {
                let t0 = self.t0_ns(&mut t0_ns, rank, step)?;
                while (seen as i64) <= target {
                    self.read_end(seen, &mut starts_ns, &mut ends_ns, &mut durations, rank, step)?;
                    seen += 1;
                }
                if target >= 0 { ends_ns[target as usize].saturating_sub(t0) } else { 0 }
            } else {
                0
            };
            let estimate = self.estimator.estimate();
            let decision = decide(&self.cfg.policy, step, i as u32, elapsed_ns, estimate);
            if let Decision::Stop(reason) = decision {
                debug!(step, rank, micro_batch = i, ?reason, "deadline: dropping the rest of the step");
                break;
            }
            let _mb_span = debug_span!("micro_batch", step, rank, index = i).entered();
            self.starts[i].record(&self.stream).map_err(e("event record"))?;
            work.launch_micro_batch(&self.stream, step, i as u32, mb, &mut self.scratch)
                .map_err(|source| ScheduleError::Workload { rank, step, call: "launch_micro_batch", source })?;
            self.ops.accumulate(&self.stream, &self.acc, &self.scratch).map_err(e("gradient accumulate"))?;
            self.ends[i].record(&self.stream).map_err(e("event record"))?;
            started += 1;
        }
        let host_loop_ns = u64::try_from(loop_start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let t0 = self.t0_ns(&mut t0_ns, rank, step)?;
        while seen < started {
            self.read_end(seen, &mut starts_ns, &mut ends_ns, &mut durations, rank, step)?;
            seen += 1;
        }
        let compute_ns = if started > 0 { ends_ns[started - 1].saturating_sub(t0) } else { 0 };

        // Ledger and data source.
        let mut dropped_mbs = planned;
        let computed_mbs: Vec<MicroBatch> = dropped_mbs.drain(..started).collect();
        let drop_at = if started > 0 { ends_ns[started - 1] } else { t0 };
        let mut records: Vec<MicroBatchRecord> = computed_mbs
            .iter()
            .enumerate()
            .map(|(i, mb)| MicroBatchRecord {
                step,
                micro_batch: i as u32,
                start_ns: starts_ns[i],
                duration_ns: durations[i],
                samples: mb.samples(),
                dropped: false,
            })
            .collect();
        let fate = match self.cfg.drop_handling {
            DropHandling::Requeue => DropFate::Requeued,
            DropHandling::Discard => DropFate::Discarded,
        };
        for (j, mb) in dropped_mbs.iter().enumerate() {
            let micro_batch = (started + j) as u32;
            records.push(MicroBatchRecord {
                step,
                micro_batch,
                start_ns: drop_at,
                duration_ns: 0,
                samples: mb.samples(),
                dropped: true,
            });
            self.ledger.dropped.push(DropRecord { step, rank, micro_batch, sample_ids: mb.sample_ids.clone(), fate });
        }
        self.ledger.computed.extend(computed_mbs.iter().flat_map(|mb| mb.sample_ids.iter().copied()));
        let n_dropped = dropped_mbs.len();
        let dropped_samples: u64 = dropped_mbs.iter().map(MicroBatch::samples).sum();
        if fate == DropFate::Requeued && !dropped_mbs.is_empty() {
            data.requeue(dropped_mbs);
        }

        // Phase 2: the count vector and the collective group.
        let samples: u64 = computed_mbs.iter().map(MicroBatch::samples).sum();
        let tokens: u64 = computed_mbs.iter().filter_map(|mb| mb.tokens).sum();
        self.ops.nonfinite(&self.stream, &self.flag_dev, &self.acc).map_err(e("non-finite check"))?;
        self.stream.copy_d2h(&self.flag_dev, &mut self.flag_host).map_err(e("flag copy"))?;
        let flag = self.flag_host.as_slice().map_err(e("host flag"))?[0];
        {
            let kk = FIXED + 2 * m;
            let all = self.gathered_host.as_mut_slice().map_err(e("host count vector"))?;
            all.fill(0);
            let v = &mut all[rank as usize * kk..(rank as usize + 1) * kk];
            v[0] = u32::from(flag != 0);
            v[1] = started as u32;
            v[2] = n_dropped as u32;
            v[3..5].copy_from_slice(&split(samples));
            v[5..7].copy_from_slice(&split(tokens));
            v[7..9].copy_from_slice(&split(compute_ns));
            v[9..11].copy_from_slice(&split(self.last_overhead_ns));
            v[11..13].copy_from_slice(&split(dropped_samples));
            v[13] = u32::from(self.stop_requested);
            for (i, d) in durations.iter().enumerate() {
                v[FIXED + 2 * i..FIXED + 2 * i + 2].copy_from_slice(&split(*d));
            }
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
        let coll_ns = c1_ns.saturating_sub(c0_ns);

        // Phase 3: the global view, identical on every rank.
        let n = self.comm.world_size() as usize;
        let k = FIXED + 2 * m;
        let g = self.gathered_host.as_slice().map_err(e("host count vector"))?;
        let mut ranks = Vec::with_capacity(n);
        let mut matrix = Vec::with_capacity(n * m);
        let mut max_overhead = 0u64;
        let mut stop_requested = false;
        for r in 0..n {
            let v = &g[r * k..(r + 1) * k];
            ranks.push(RankStepStats {
                nonfinite: v[0] != 0,
                computed: v[1],
                dropped: v[2],
                samples: join(v[3], v[4]),
                tokens: join(v[5], v[6]),
                compute_ns: join(v[7], v[8]),
                dropped_samples: join(v[11], v[12]),
            });
            max_overhead = max_overhead.max(join(v[9], v[10]));
            stop_requested |= v[13] != 0;
            for i in 0..m {
                let d = join(v[FIXED + 2 * i], v[FIXED + 2 * i + 1]);
                matrix.push(if d == NOT_COMPUTED { f64::NAN } else { d as f64 });
            }
        }
        let max_compute = ranks.iter().map(|r| r.compute_ns).max().unwrap_or(0);
        let weight: u64 = match self.cfg.weighting {
            Weighting::Samples => ranks.iter().map(|r| r.samples).sum(),
            Weighting::Tokens => ranks.iter().map(|r| r.tokens).sum(),
        };
        let bad: Vec<u32> = ranks.iter().enumerate().filter(|(_, r)| r.nonfinite).map(|(i, _)| i as u32).collect();
        let skip = if !bad.is_empty() {
            Some(SkipReason::NonFinite { ranks: bad })
        } else if weight == 0 {
            Some(SkipReason::ZeroCount)
        } else {
            None
        };
        let divisor = match (&skip, self.cfg.normalization) {
            (Some(_), _) => 0.0,
            (None, Normalization::Realized) => weight as f64,
            (None, Normalization::Nominal) => {
                n as f64 * f64::from(self.cfg.micro_batches) * f64::from(self.cfg.micro_batch_size)
            }
        };

        // Phase 4: rescale and update (or skip), zero the accumulator, restart the clock.
        if skip.is_none() {
            self.scale_host.as_mut_slice().map_err(e("host scale"))?[0] = (1.0 / divisor) as f32;
            self.stream.copy_h2d(&self.scale_host, &mut self.scale_dev).map_err(e("scale copy"))?;
            self.ops.scale(&self.stream, &self.acc, &self.scale_dev).map_err(e("gradient rescale"))?;
            work.launch_optimizer(&self.stream, step, &self.acc).map_err(|source| ScheduleError::Workload {
                rank,
                step,
                call: "launch_optimizer",
                source,
            })?;
        } else if self.gathered_planned(&ranks) > 0 || matches!(skip, Some(SkipReason::NonFinite { .. })) {
            tracing::warn!(step, rank, ?skip, "skipping the update on every rank");
        } else {
            debug!(step, rank, "no rank had data: nothing to update");
        }
        self.ops.zero(&self.stream, &self.acc).map_err(e("gradient zero"))?;
        self.t0.record(&self.stream).map_err(e("event record"))?;
        self.t0.synchronize().map_err(|x| self.stream_error(rank, step, "optimizer synchronize", x))?;
        let end = self.t0.timestamp_ns().map_err(e("event timestamp"))?;
        let step_ns = end.saturating_sub(t0);
        self.last_overhead_ns = step_ns.saturating_sub(compute_ns);
        self.stragglers.observe(&ranks);
        let wait_ns = max_compute.saturating_sub(compute_ns);
        let retune = match &mut self.retuner {
            Some(rt) => {
                let ev = rt.on_step(&matrix, (max_compute + max_overhead) as f64)?;
                self.cfg.policy.threshold = rt.threshold_for_next_step();
                ev
            }
            None => None,
        };
        let report = StepReport {
            step,
            rank,
            world_size: n as u32,
            threshold_ns: threshold_ns(threshold),
            ranks,
            divisor,
            skip,
            compute_ns,
            wait_ns,
            collective_ns: coll_ns.saturating_sub(wait_ns),
            step_ns,
            collective_seqs: seqs,
            host_loop_ns,
            collective_span_ns: (c0_ns, c1_ns),
            step_end_ns: end,
            overhead_ns: max_overhead,
            stop_requested,
            latencies_ns: matrix.clone(),
            micro_batches: records,
        };
        Ok((report, retune))
    }

    /// Micro-batches scheduled (computed + dropped) over every rank.
    fn gathered_planned(&self, ranks: &[RankStepStats]) -> u64 {
        ranks.iter().map(|r| u64::from(r.computed) + u64::from(r.dropped)).sum()
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

    fn read_end(
        &mut self,
        i: usize,
        starts_ns: &mut [u64],
        ends_ns: &mut [u64],
        durations: &mut [u64],
        rank: u32,
        step: u64,
    ) -> Result<(), ScheduleError> {
        let e = |call| dev_err(rank, step, call);
        self.ends[i].synchronize().map_err(|x| self.stream_error(rank, step, "micro-batch synchronize", x))?;
        starts_ns[i] = self.starts[i].timestamp_ns().map_err(e("event timestamp"))?;
        ends_ns[i] = self.ends[i].timestamp_ns().map_err(e("event timestamp"))?;
        durations[i] = ends_ns[i].saturating_sub(starts_ns[i]);
        self.estimator.observe(durations[i]);
        Ok(())
    }
}
