//! The training driver: one rank's loop over the planned runs (synchronous baseline, then
//! DropCompute), one rank of any launch mode ([`run_rank`]), and [`run`], which starts the
//! ranks through `dropcompute::launch` (threads, child processes given the parent's [`JobSpec`](super::job::JobSpec), or
//! one rank under a launcher).
//!
//! Owns: [`rank_main`], [`run_rank`], [`run`], [`run_child`], the threshold resolution of a run
//! (fixed, auto via the core's `schedule::auto` on the baseline's reports, in-run re-tuning). Must not touch: how ranks are started
//! or children spawned (`dropcompute::launch`), the job description (`job`), the error type
//! (`error`), the step loop (`schedule::Scheduler::step` is the only training loop), the
//! deadline rule, or output formats (`summary`).
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dropcompute::hccl::{Comm, CommOptions, ReduceOp};
use dropcompute::launch::{self, ChildSpec, Join, Launch, Ranks};
use dropcompute::mock::MockControl;
use dropcompute::policy::{DeadlineConfig, Policy, Threshold};
use dropcompute::schedule::auto;
use dropcompute::schedule::{
    DropHandling, GradDtype, GradientOps, ScheduleError, Scheduler, SchedulerConfig, StepReport, Weighting,
};
use dropcompute::synapse::{Backend, BackendChoice, Device, HostBuffer, Runtime};
use dropcompute::tune::Verdict;
use dropcompute::tune::policies::AutoChoice;
use dropcompute::tune::retune::{Retuner, RetunerConfig};

use super::ckpt::OptimizerState;
use super::config::ThresholdArg;
use super::error::TrainError;
use super::job::{Job, RankOutcome, RunKind};
use super::progress::Progress;
use super::text_workload::TextWorkload;
use super::workload::LatencyKeys;
use super::workload::{MlpHyper, MlpWorkload};
use dropcompute::deal::RunData;
use dropcompute::schedule::{DataSource, Workload};
use dropcompute::synapse::DeviceBuffer;

/// The workload of one run: the digits MLP or the text transformer (`--task`).
enum Model {
    Mlp(MlpWorkload),
    Text(TextWorkload),
}

impl Model {
    fn workload(&mut self) -> &mut dyn Workload {
        match self {
            Model::Mlp(w) => w,
            Model::Text(w) => w,
        }
    }

    /// The `[loss sum, count]` accumulators the driver all-reduces after each step (one for
    /// the MLP, whose count is samples; one per compiled shape for the text model, tokens).
    fn loss_buffers(&mut self) -> Vec<&mut DeviceBuffer<f32>> {
        match self {
            Model::Mlp(w) => vec![&mut w.loss],
            Model::Text(w) => w.loss_buffers(),
        }
    }
}

/// The communicator options of `train`: a 60 s collective timeout (bounded failure when a
/// rank dies), 5 s abort deadline, a flight recorder of the last 15 collectives (5 steps).
pub fn comm_options() -> CommOptions {
    CommOptions {
        timeout: Duration::from_secs(60),
        abort_deadline: Duration::from_secs(5),
        flight_recorder_len: 15,
        ..CommOptions::default()
    }
}

/// Resolves the DropCompute run's threshold: off, fixed, tuned on the baseline's trace (auto
/// with a baseline), or re-tuned in the run (auto without a baseline: a probe window with the
/// threshold off, then the tuned value). Rank 0 tunes and broadcasts the result, so every rank
/// enforces the same threshold and the search runs once. `peers`: every rank's baseline
/// reports (rank order) where this process holds them (`run` with threads), which give the
/// baseline's trace its buckets and tokens (`schedule::auto::with_report_lengths`, as
/// `summary::prediction`): the length-aware policies tune on their own length-aware replay;
/// empty (rank processes), the text job takes every rank's from the stream that dealt them
/// (`Job::stream_peer_reports`; the digits job has none). The text job tunes every policy, blind DropCompute
/// included, on its stream of units (`schedule::auto::choose_on`), the digits job as `tune
/// --auto-for` does (`schedule::auto::choose`). Returns (threshold, retuner, description).
///
/// # Errors
/// [`TrainError::Collective`] / [`TrainError::Device`] from the broadcast.
fn resolve_threshold(
    job: &Job,
    comm: &Comm,
    kind: RunKind,
    baseline: Option<&[StepReport]>,
    peers: &[&[StepReport]],
) -> Result<(Threshold, Option<Retuner>, String), TrainError> {
    if kind == RunKind::Baseline {
        return Ok((Threshold::Off, None, "off (baseline)".into()));
    }
    Ok(match (job.cfg.threshold, baseline) {
        (ThresholdArg::Off, _) => (Threshold::Off, None, "off".into()),
        (ThresholdArg::Ms(_), _) => {
            let t = job.cfg.threshold.fixed().map_or(Threshold::Off, Threshold::Fixed);
            (t, None, "fixed".into())
        }
        (ThresholdArg::Auto, Some(reports)) => {
            let rank = comm.rank();
            // Every rank holds the same gathered latencies: all check the minimum alike.
            let tuned = reports.iter().filter(|r| r.step >= job.cfg.warmup_steps).count();
            if tuned < dropcompute::tune::MIN_STEPS {
                return Err(TrainError::Config {
                    what: "--threshold auto",
                    value: format!(
                        "insufficient data: the baseline ran {tuned} step(s) after the {} warm-up steps; tuning needs at least {} (run more steps or epochs, or give a threshold)",
                        job.cfg.warmup_steps,
                        dropcompute::tune::MIN_STEPS
                    ),
                });
            }
            let p = job.cfg.policy();
            // The text job tunes every policy, blind DropCompute too, on its stream of units
            // (their buckets and tokens, the dropped ones re-queued), as its prediction replays;
            // the digits job on the trace (`tune --auto-for`'s choice).
            let found = match (rank, &job.text) {
                (0, Some(_)) => {
                    // Rank processes hold their own reports only: every rank's buckets and
                    // tokens from the stream that dealt them (`Job::stream_peer_reports`).
                    let dealt = if peers.is_empty() { job.stream_peer_reports(reports) } else { Vec::new() };
                    let dealt: Vec<&[StepReport]> = dealt.iter().map(Vec::as_slice).collect();
                    let peers = if peers.is_empty() { &dealt[..] } else { peers };
                    auto::choose_on(reports, peers, &job.auto_recommend(), job.policy_run(Threshold::Off), &mut || {
                        Box::new(job.replay_stream())
                    })
                }
                (0, None) => {
                    let template = job.replays_policy().then(|| job.policy_run(Threshold::Off));
                    auto::choose(reports, peers, &job.auto_recommend(), template)
                }
                _ => None,
            };
            let t = auto::broadcast_threshold(comm, found.as_ref().map_or(Threshold::Off, AutoChoice::threshold))?;
            let g = job.cfg.guardrails;
            let limits = |drop_rate: f64| {
                format!(
                    "drop rate {:.2} % <= {:.0} %, batch >= {:.0} %, gain >= {:.0} %{}",
                    drop_rate * 100.0,
                    g.max_drop_rate * 100.0,
                    g.min_batch_fraction * 100.0,
                    g.min_gain * 100.0,
                    if g.jitter_ns > 0.0 {
                        format!(", all within +-{:.3} ms of the threshold", g.jitter_ns / 1e6)
                    } else {
                        String::new()
                    }
                )
            };
            let why = match (&found, found.as_ref().and_then(AutoChoice::outcome), rank) {
                (Some(AutoChoice::DropCompute(_)), Some((speedup, drop)), _) => format!(
                    "auto: best replayed speedup {:.3}x of the baseline run's latencies as this run executes ({})",
                    1.0 + speedup,
                    limits(drop)
                ),
                (Some(AutoChoice::Policy(_)), Some((speedup, drop)), _) => format!(
                    "auto ({p}): best replayed speedup {:.3}x of the baseline run's latencies under {p} as this run executes ({})",
                    1.0 + speedup,
                    limits(drop)
                ),
                (Some(AutoChoice::DropCompute(Verdict::Decline(why))), None, 0) if g.jitter_ns > 0.0 => format!(
                    "auto: off: {why} (each threshold judged by the worst replay within +-{:.3} ms of it)",
                    g.jitter_ns / 1e6
                ),
                (Some(AutoChoice::DropCompute(Verdict::Decline(why))), None, 0) => format!("auto: off: {why}"),
                (Some(_), None, 0) => {
                    format!("auto ({p}): off: no threshold within the guardrails on the replay of {p}")
                }
                (None, _, 0) => "auto: no baseline step to tune on; off".into(),
                (_, _, _) => "auto: chosen by rank 0".into(),
            };
            (t, None, why)
        }
        // A resumed run keeps the threshold its checkpoint holds (restored with the scheduler
        // state): re-tuning in-run would run the resumed steps at another threshold.
        (ThresholdArg::Auto, None) if job.resume_step.is_some() => {
            (Threshold::Off, None, "auto: the checkpoint's threshold (resumed run)".into())
        }
        // A policy without a deadline (synchronous, backup-workers, rebalance): nothing to tune.
        (ThresholdArg::Auto, None) if !job.cfg.policy().has_deadline() => {
            (Threshold::Off, None, format!("auto: off (--policy {} has no deadline)", job.cfg.policy()))
        }
        // Refused up front by `Job::prepare` (the same error); kept for a job built otherwise.
        (ThresholdArg::Auto, None) if job.replays_policy() => return Err(job.auto_without_baseline_error()),
        (ThresholdArg::Auto, None) => {
            let steps = job.steps().unwrap_or(200).max(4) as usize;
            let probe = (job.cfg.warmup_steps as usize + 10).min(steps - 1).max(1);
            // Scored on the probe window replayed as this run executes it (check mode, sync lag).
            let cfg = RetunerConfig {
                period: steps + 1,
                probe_steps: probe,
                tune: dropcompute::tune::TuneConfig { guardrails: job.cfg.guardrails, min_micro_batches: 1 },
                execution: Some(job.execution()),
                ..RetunerConfig::default()
            };
            let n = job.cfg.ranks as usize;
            match Retuner::new(cfg, n, job.slots_of(kind) as usize) {
                Ok(r) => (Threshold::Off, Some(r), format!("auto: tuned in-run after a {probe}-step probe")),
                Err(e) => (Threshold::Off, None, format!("auto: {e}; threshold off")),
            }
        }
    })
}

/// Prints the communicator's flight recorder (last collectives, with FAILED/PENDING marks) to
/// stderr: the first thing to read when a collective fails.
fn dump_flight_recorder(c: &Comm) {
    dropcompute::console::err(&format!(
        "rank {} flight recorder (last collectives):\n{}",
        c.rank(),
        c.flight_recorder().dump()
    ));
}

/// Latency-key step of a run's setup launches (before step 0); no real step has this number.
const RUN_SETUP_STEP: u64 = u64::MAX;

/// Runs every planned run on this rank with `comm` and gives the communicator back.
/// `progress` (rank 0 only) is called once per run with the run's label and step count.
///
/// # Errors
/// Any [`TrainError`] of this rank (a failed step names the step and call).
pub fn rank_main(job: &Job, comm: Comm, show_progress: bool) -> Result<(Vec<RankOutcome>, Comm), TrainError> {
    rank_runs(job, comm, show_progress, &job.plan(), Vec::new(), &[])
}

/// [`rank_main`] over the runs `plan`, after the runs already finished on this rank `prior`
/// (returned first, in order): a run of kind [`RunKind::DropCompute`] tunes `--threshold auto`
/// on the baseline among them, as in [`rank_main`], with the buckets and tokens of every
/// rank's finished runs `peers` (`[rank][..]`; empty: this rank's alone, see
/// [`resolve_threshold`]).
fn rank_runs(
    job: &Job,
    mut comm: Comm,
    show_progress: bool,
    plan: &[RunKind],
    prior: Vec<RankOutcome>,
    peers: &[Vec<RankOutcome>],
) -> Result<(Vec<RankOutcome>, Comm), TrainError> {
    let rank = comm.rank();
    let cfg = &job.cfg;
    let dev_err = |source| TrainError::Device { rank, source };
    let mut outcomes: Vec<RankOutcome> = prior;
    for &kind in plan {
        // Every launch of this run, its setup included, draws keyed latencies: both runs start
        // from the same mock state (common random numbers).
        super::workload::set_latency_key(comm.device().module_id(), RUN_SETUP_STEP, super::workload::STEP_START)
            .map_err(|value| TrainError::Config { what: "mock latency key", value })?;
        let baseline = outcomes.iter().find(|o| o.kind == RunKind::Baseline).map(|o| o.reports.as_slice());
        let peer_reports: Vec<&[StepReport]> = peers
            .iter()
            .filter_map(|o| o.iter().find(|x| x.kind == RunKind::Baseline).map(|x| x.reports.as_slice()))
            .collect();
        // The step policy of this run: the baseline is synchronous; the second run follows
        // `--policy` (default: DropCompute with the configured check).
        let policy = (kind == RunKind::DropCompute).then(|| cfg.policy());
        let (threshold, retuner, source) = match policy {
            Some(p) if !p.drops() && p != Policy::ComputeBudget => (Threshold::Off, None, format!("off ({p})")),
            _ => resolve_threshold(job, &comm, kind, baseline, &peer_reports)?,
        };
        let shares = policy.is_some_and(Policy::moves_work);
        // The tail shape is the second run's; the baseline runs whole micro-batches.
        let tail = if kind == RunKind::DropCompute { cfg.tail } else { dropcompute::policy::TailShape::default() };
        let scfg = SchedulerConfig {
            micro_batches: cfg.micro_batches,
            max_micro_batches: shares.then(|| job.slots_of(kind)),
            // Both runs' count rows as wide as the second run's (paired collectives).
            count_row_slots: Some(job.slots_of(RunKind::DropCompute) * cfg.tail.parts()),
            micro_batch_size: cfg.micro_batch_size,
            policy: DeadlineConfig {
                threshold,
                check: cfg.check,
                warmup_steps: cfg.warmup_steps,
                min_micro_batches: 1,
            },
            sync_lag: cfg.sync_lag,
            normalization: cfg.normalization,
            // The text task's unit of work is the real token (divisor, ledger, compute log).
            weighting: if job.text.is_some() { Weighting::Tokens } else { Weighting::Samples },
            drop_handling: DropHandling::Requeue,
            grad_dtype: GradDtype::F32,
            gradient_len: job.param_len(),
            bucket_bytes: usize::try_from(cfg.bucket_bytes).unwrap_or(usize::MAX),
            tail,
            // The guard is the second run's (the baseline runs the threshold off).
            drop_guard: if kind == RunKind::DropCompute { cfg.drop_guard } else { None },
            ..SchedulerConfig::default()
        };
        let ops = GradientOps::graphs(comm.device(), job.param_len(), GradDtype::F32).map_err(dev_err)?;
        let mut sched = Scheduler::new(comm, scfg, ops)?;
        if let Some(r) = retuner {
            sched.set_retuner(r);
        }
        // The one assignment step and walk of the policy (a compute budget declined by a
        // guardrail runs M per rank: the threshold is off).
        if let Some(p) = policy {
            sched.set_policy(dropcompute::policy::StepPolicy {
                backup_workers: cfg.backup_workers,
                tail,
                bucket_tokens: job.bucket_tokens(),
                ..dropcompute::policy::StepPolicy::new(p)
            });
        }
        let hyper = MlpHyper {
            shape: job.shape,
            micro_batch_size: cfg.micro_batch_size as usize,
            lr: cfg.lr as f32,
            momentum: cfg.momentum as f32,
            weight_decay: 0.0,
            tail_split: tail.parts() as usize,
        };
        let mut work = match &job.text {
            Some(t) => Model::Text(
                TextWorkload::new(sched.stream(), Arc::clone(t), tail.parts(), None)
                    .map_err(|e| TrainError::Text { rank: Some(rank), source: Box::new(e) })?,
            ),
            None => {
                let zeros = vec![0f32; job.init.len()];
                let mut w =
                    MlpWorkload::new(sched.stream(), hyper, job.train.clone(), &job.init, &zeros).map_err(dev_err)?;
                w.rank = rank;
                Model::Mlp(w)
            }
        };
        let max_epochs = job.max_epochs();
        // Both runs deal from the one global stream (`RunData::global`): paired by
        // construction, and a rank's dropped micro-batches go to the next step's ranks.
        let mut data = RunData::global(
            job.units(),
            cfg.seed,
            // Both runs deal the second run's parts; the baseline merges S of them (paired).
            job.part_size(),
            (cfg.tail.parts() / tail.parts()) as usize,
            max_epochs,
        );
        let (mut reports, mut losses): (Vec<StepReport>, Vec<f64>) = (Vec::new(), Vec::new());
        let dev = sched.stream().device().clone();
        let checkpointed = kind == RunKind::DropCompute;
        let every = cfg.checkpoint_every.map(|k| k.get()).filter(|_| checkpointed);
        let mut step = 0u64;
        if let (Some(s0), true) = (job.resume_step, checkpointed) {
            let (meta, state) = super::ckpt::load(&job.fingerprint(), job.param_len(), &cfg.checkpoint_dir, rank, s0)?;
            match (&mut work, &state) {
                (Model::Mlp(w), OptimizerState::Momentum { params, velocity }) => {
                    w.set_state(sched.stream(), params, velocity).map_err(dev_err)?;
                }
                (Model::Text(w), OptimizerState::AdamW(s)) => w
                    .set_state(sched.stream(), s)
                    .map_err(|e| TrainError::Text { rank: Some(rank), source: Box::new(e) })?,
                // The fingerprint names the task, so a sound file of this job has its task's state.
                _ => return Err(optimizer_mismatch(&cfg.checkpoint_dir, rank, s0, &state)),
            }
            sched.restore(meta.scheduler).map_err(|e| {
                TrainError::Checkpoint(dropcompute::checkpoint::CheckpointError::Malformed {
                    path: super::ckpt::rank_dir(&cfg.checkpoint_dir, rank).join(dropcompute::checkpoint::file_name(s0)),
                    reason: format!("its scheduler state: {e}"),
                })
            })?;
            data = meta.data;
            data.set_max_epochs(max_epochs); // the run length may change on resume
            losses = meta.losses.iter().map(|l| l.unwrap_or(f64::NAN)).collect();
            step = s0;
        }
        let progress = Progress::new(job.steps().unwrap_or(0), step, kind.label(), show_progress);
        let zero = HostBuffer::from_slice(&dev, &[0f32, 0f32]).map_err(dev_err)?;
        // The global loss of step s is all-reduced right after it and read after step s+1
        // (the stream has passed it by then): no extra host synchronization per step.
        let mut pending: Option<Vec<HostBuffer<f32>>> = None;
        // The step's loss per sample (digits) or per real token (text): the sums over the
        // model's accumulators (one for the digits: its value as read).
        let read = |hs: &Vec<HostBuffer<f32>>| -> Result<f64, TrainError> {
            let (mut sum, mut count) = (0f64, 0f64);
            for h in hs {
                let l = h.as_slice().map_err(dev_err)?;
                sum += f64::from(l[0]);
                count += f64::from(l[1]);
            }
            Ok(if count > 0.0 { sum / count } else { f64::NAN })
        };
        let coll_err = |source| TrainError::Collective { rank, call: "loss all-reduce", source };
        let coll_err = |c: &Comm| {
            dump_flight_recorder(c);
            coll_err
        };
        // The text task deals plan units whose tokens and buckets the scheduler reads.
        let mut counted =
            job.text.as_ref().map(|t| super::text::TokenCounted { plan: Arc::clone(&t.plan), inner: data.clone() });
        let t = Instant::now();
        while job.steps().is_none_or(|s| step < s) {
            super::workload::set_latency_key(dev.module_id(), step, super::workload::STEP_START)
                .map_err(|value| TrainError::Config { what: "mock latency key", value })?;
            if dropcompute::signals::received().is_some() {
                sched.request_stop();
            }
            let source: &mut dyn DataSource = match counted.as_mut() {
                Some(c) => c,
                None => &mut data,
            };
            let (rep, _) = match sched.step(step, source, work.workload()) {
                Ok(v) => v,
                Err(e) => {
                    if matches!(e, ScheduleError::Collective { .. }) {
                        dump_flight_recorder(sched.comm());
                    }
                    return Err(e.into());
                }
            };
            if let Some(h) = pending.take() {
                losses.push(read(&h)?);
            }
            let s = sched.stream();
            let mut read_back = Vec::with_capacity(1);
            for loss in work.loss_buffers() {
                sched.comm().all_reduce_in_place(loss, ReduceOp::Sum, s).map_err(|e| coll_err(sched.comm())(e))?;
                let mut h = HostBuffer::<f32>::zeroed(&dev, 2).map_err(dev_err)?;
                s.copy_d2h(loss, &mut h).map_err(dev_err)?;
                s.copy_h2d(&zero, loss).map_err(dev_err)?;
                read_back.push(h);
            }
            pending = Some(read_back);
            if rep.global_computed() + rep.global_dropped() == 0 {
                pending = None; // every rank's epochs are done (identical view on every rank)
                break;
            }
            let last_loss = losses.last().copied().unwrap_or(f64::NAN);
            progress.step_done(step, rep.step_ns as f64 / 1e6, rep.drop_rate(), last_loss);
            let stop = rep.stop_requested;
            reports.push(rep);
            step += 1;
            if stop || every.is_some_and(|k| step.is_multiple_of(k)) {
                sched.comm().synchronize(sched.stream()).map_err(|e| coll_err(sched.comm())(e))?;
                if let Some(h) = pending.take() {
                    losses.push(read(&h)?);
                }
                // A stop writes a checkpoint on SIGINT/SIGTERM, on SIGHUP only when asked for;
                // a rank stopped by a peer's request (no signal here) follows the same rule.
                let signal = dropcompute::signals::received();
                let save = every.is_some_and(|k| step.is_multiple_of(k))
                    || (stop && (cfg.checkpoint_asked || signal.is_none_or(|s| s.always_checkpoints())));
                let saved = if checkpointed && save {
                    let state = match &work {
                        Model::Mlp(w) => {
                            let (params, velocity) = w.state(sched.stream()).map_err(dev_err)?;
                            OptimizerState::Momentum { params, velocity }
                        }
                        Model::Text(w) => OptimizerState::AdamW(
                            w.state(sched.stream())
                                .map_err(|e| TrainError::Text { rank: Some(rank), source: Box::new(e) })?,
                        ),
                    };
                    let meta = super::ckpt::RankMeta {
                        fingerprint: job.fingerprint(),
                        scheduler: sched.state(),
                        // The text task deals through `counted` (its own copy of the stream).
                        data: counted.as_ref().map_or_else(|| data.clone(), |c| c.inner.clone()),
                        losses: losses.iter().map(|l| l.is_finite().then_some(*l)).collect(),
                        adamw_step: None,
                    };
                    let path = super::ckpt::save(&cfg.checkpoint_dir, rank, step, &meta, state)?;
                    format!("checkpoint {}", path.display())
                } else if checkpointed {
                    "no checkpoint (none asked for: --checkpoint-every, --checkpoint-dir or --resume)".into()
                } else {
                    "no checkpoint (baseline run)".into()
                };
                if stop {
                    progress.finish();
                    let signal = signal.map_or_else(|| "a peer's stop request".into(), |s| s.name().to_string());
                    return Err(TrainError::Interrupted { step, signal, saved });
                }
            }
        }
        sched.comm().synchronize(sched.stream()).map_err(|e| coll_err(sched.comm())(e))?;
        if let Some(h) = pending.take() {
            losses.push(read(&h)?);
        }
        // Virtual time: host time says nothing about the emulated cluster; use device time.
        let wall_ns = match cfg.time_mode {
            dropcompute::mock::TimeMode::Virtual => reports.iter().map(|r| r.step_ns).sum::<u64>(),
            dropcompute::mock::TimeMode::Real => u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX),
        };
        progress.finish();
        let text_err = |e| TrainError::Text { rank: Some(rank), source: Box::new(e) };
        let (params, holdout_loss) = match &mut work {
            Model::Mlp(w) => (w.state(sched.stream()).map_err(dev_err)?.0, None),
            Model::Text(w) => {
                let params = w.params(sched.stream()).map_err(text_err)?;
                // Rank 0 measures the metric for the report (every rank holds its parameters).
                let loss = if rank == 0 {
                    super::workload::set_latency_key(dev.module_id(), RUN_SETUP_STEP, super::workload::STEP_END)
                        .map_err(|value| TrainError::Config { what: "mock latency key", value })?;
                    Some(w.holdout_loss(sched.stream()).map_err(text_err)?)
                } else {
                    None
                };
                (params, loss)
            }
        };
        let threshold_ns = sched.threshold().as_ns();
        let ledger = sched.ledger().clone();
        let stragglers = sched.stragglers().clone();
        drop(work);
        comm = sched.into_comm();
        outcomes.push(RankOutcome {
            kind,
            rank,
            reports,
            loss: losses,
            wall_ns,
            params,
            ledger,
            stragglers,
            threshold_ns,
            threshold_source: source,
            holdout_loss,
        });
    }
    Ok((outcomes, comm))
}

/// A checkpoint whose optimizer state is not this job's model's (momentum for the text task, or
/// AdamW for the digits): refused as malformed, naming the file and what it holds.
fn optimizer_mismatch(dir: &std::path::Path, rank: u32, step: u64, state: &OptimizerState) -> TrainError {
    let held = match state {
        OptimizerState::Momentum { .. } => "the digits MLP's momentum",
        OptimizerState::AdamW(_) => "the text transformer's AdamW state",
    };
    TrainError::Checkpoint(dropcompute::checkpoint::CheckpointError::Malformed {
        path: super::ckpt::rank_dir(dir, rank).join(dropcompute::checkpoint::file_name(step)),
        reason: format!("it holds {held}, which is not this job's model's"),
    })
}

fn destroy(comm: Comm, rank: u32) -> Result<(), TrainError> {
    comm.destroy().map_err(|b| TrainError::Collective { rank, call: "hcclCommDestroy", source: b.0 })
}

/// The in-process mock configured for `job` ([`Job::mock_config`]): the device of `validate`,
/// which compares a prediction with an emulated measurement and so needs the emulated device.
///
/// # Errors
/// [`TrainError::Config`] / [`TrainError::Mock`] for a bad mock environment or configuration;
/// [`TrainError::Device`] when the runtime cannot start.
pub fn mock_runtime(job: &Job) -> Result<Arc<Runtime>, TrainError> {
    MockControl::in_process().configure(&job.mock_config()?)?;
    super::workload::route_latency_keys(LatencyKeys::InProcess);
    Runtime::new(dropcompute::mock::api()).map_err(|source| TrainError::Device { rank: 0, source })
}

/// The runtime `train` runs on, chosen as by every subcommand (`DROPCOMPUTE_BACKEND`,
/// `DROPCOMPUTE_SYNAPSE_LIB`; `synapse::Backend::select`): the in-process mock, the mock shared
/// library loaded as libSynapse, or a real libSynapse. An emulated device (either mock: the
/// library exports the `dcmock_*` control symbols) is configured with the job's emulation
/// settings ([`Job::mock_config`]); on a real library those settings must be at their defaults
/// ([`Job::check_real_device`]).
///
/// # Errors
/// [`TrainError::Config`] for a `DROPCOMPUTE_BACKEND` that is not a backend name, or emulation
/// flags given for a real device; [`TrainError::Device`] (rank 0) with `synapse::Error::Load`
/// when the library cannot be loaded (exit 3, naming the paths tried) or the runtime cannot
/// start; [`TrainError::Mock`] when a mock rejects its configuration.
pub fn runtime(job: &Job) -> Result<Arc<Runtime>, TrainError> {
    let device = |source| TrainError::Device { rank: 0, source };
    let choice = BackendChoice::from_env()
        .map_err(|e| TrainError::Config { what: dropcompute::synapse::backend::ENV_BACKEND, value: e.to_string() })?;
    let backend = Backend::select(&choice).map_err(|e| device(e.into()))?;
    if backend.is_mock() {
        return mock_runtime(job);
    }
    let keys = match backend.library_path().and_then(|p| MockControl::from_library(p).ok()) {
        Some(c) => {
            c.configure(&job.mock_config()?)?;
            LatencyKeys::Library(c)
        }
        None => {
            job.check_real_device(&backend.describe())?;
            LatencyKeys::Off
        }
    };
    super::workload::route_latency_keys(keys);
    Runtime::new(backend.api).map_err(device)
}

/// One rank of `job`: acquires its device (module `rank`, or the launcher's local rank under
/// [`Join::Env`]), joins the communicator, runs the plan ([`rank_main`]) and destroys it.
///
/// # Errors
/// [`TrainError::Device`] / [`TrainError::Collective`] naming the rank; any error of
/// [`rank_main`].
pub fn run_rank(
    job: &Job,
    rt: &Arc<Runtime>,
    join: &Join,
    show_progress: bool,
) -> Result<Vec<RankOutcome>, TrainError> {
    run_rank_plan(job, rt, join, show_progress, &job.plan(), Vec::new(), &[])
}

/// [`run_rank`] over the runs `plan` after this rank's finished runs `prior`, every rank's
/// being `peers` ([`rank_runs`]).
fn run_rank_plan(
    job: &Job,
    rt: &Arc<Runtime>,
    join: &Join,
    show_progress: bool,
    plan: &[RunKind],
    prior: Vec<RankOutcome>,
    peers: &[Vec<RankOutcome>],
) -> Result<Vec<RankOutcome>, TrainError> {
    let rank = join.rank();
    if join.world_size() != job.cfg.ranks {
        return Err(TrainError::Config {
            what: "--ranks",
            value: match join {
                Join::Env(b) => {
                    format!(
                        "{} but the launcher's world size is {} ({})",
                        job.cfg.ranks,
                        b.world_size,
                        b.world_size_source()
                    )
                }
                Join::UniqueId { world_size, .. } => format!("{} but the communicator has {world_size}", job.cfg.ranks),
            },
        });
    }
    if let Join::Env(b) = join {
        // Every launcher rank judges its host alike, so all of them refuse at once (a rank
        // without a device used to leave its peers waiting for the HCCL init timeout).
        launch::check_devices(rt, b.local_world_size.unwrap_or(b.local_rank + 1))?;
    }
    let dev = match join {
        Join::Env(b) => Device::acquire_for_local_rank(rt, b.local_rank),
        Join::UniqueId { .. } => Device::acquire(rt, rank),
    }
    .map_err(|source| TrainError::Device { rank, source })?;
    let call = if matches!(join, Join::Env(_)) { "join" } else { "hcclCommInitRank" };
    let comm = join.comm(&dev, comm_options()).map_err(|source| TrainError::Collective { rank, call, source })?;
    let (out, comm) = rank_runs(job, comm, show_progress && rank == 0, plan, prior, peers)?;
    destroy(comm, rank)?;
    Ok(out)
}

/// Runs the ranks of `job` as `launch` says (`dropcompute::launch`) and returns the outcomes indexed
/// `[rank][run]`; under [`Launch::Env`] only this process's rank: `(rank, [outcomes])`.
/// Threads run rank r on mock module r of `rt`; processes are children of this executable, each
/// given `job.spec()` (the validated configuration, resume step and guardrail) and its own
/// mock.
///
/// # Errors
/// The first rank's error that is not a consequence of another rank's failure (a collective
/// error is reported only when no rank has a more specific one); [`TrainError::Child`] naming a
/// failed rank process with its exit status and stderr tail; [`TrainError::Bootstrap`] for a
/// bad launcher environment.
pub fn run(
    job: &Job,
    rt: &Arc<Runtime>,
    launch: Launch,
    show_progress: bool,
) -> Result<(u32, Vec<Vec<RankOutcome>>), TrainError> {
    let unique_id =
        || Comm::unique_id(rt).map_err(|source| TrainError::Collective { rank: 0, call: "unique id", source });
    // Feasibility before any rank starts: threads and processes put every rank on this host.
    if launch != Launch::Env {
        launch::check_devices(rt, job.cfg.ranks)?;
    }
    // The text job's `--threshold auto` with threads: the baseline on every rank first, then
    // the second run after it, so that rank 0 tunes with every rank's buckets and tokens
    // (`resolve_threshold`); the same runs as in one pass (each run keys its latencies from
    // its own start: `workload::set_latency_key`).
    let plan = job.plan();
    let auto = job.cfg.threshold == ThresholdArg::Auto;
    if launch == Launch::Threads && job.text.is_some() && auto && plan == [RunKind::Baseline, RunKind::DropCompute] {
        let baseline = run_plan_threads(job, rt, show_progress, &plan[..1], &[])?;
        return Ok((0, run_plan_threads(job, rt, show_progress, &plan[1..], &baseline)?));
    }
    let ranks = launch::dispatch(launch, job.cfg.ranks, unique_id, CHILD_PROGRAM, &job.spec(), |join| {
        run_rank(job, rt, join, show_progress)
    })?;
    match ranks {
        Ranks::All(results) => Ok((0, collect(results)?)),
        Ranks::This { join, result } => Ok((join.rank(), vec![result?])),
    }
}

/// Runs every rank as a thread of this process (rank r on mock module r). Returns the
/// outcomes indexed `[rank][run]`. Same as [`run`] with [`Launch::Threads`].
///
/// # Errors
/// As [`run`].
pub fn run_threads(job: &Job, rt: &Arc<Runtime>, show_progress: bool) -> Result<Vec<Vec<RankOutcome>>, TrainError> {
    Ok(run(job, rt, Launch::Threads, show_progress)?.1)
}

/// Runs only `job`'s synchronous baseline, every rank a thread of this process (rank r on mock
/// module r of `rt`), and returns the outcomes indexed `[rank][0]`: the baseline a set of
/// policy runs is compared against ([`run_after_baseline_threads`]), run once. The baseline's
/// count rows are as wide as `job`'s second run's (`Job::slots_of`), as in [`run`].
///
/// # Errors
/// As [`run`].
pub fn run_baseline_threads(
    job: &Job,
    rt: &Arc<Runtime>,
    show_progress: bool,
) -> Result<Vec<Vec<RankOutcome>>, TrainError> {
    run_plan_threads(job, rt, show_progress, &[RunKind::Baseline], &[])
}

/// Runs `job`'s second run (its `--policy`, threshold resolved as in [`run`]: `--threshold
/// auto` tuned on the baseline) on every rank as a thread of this process, after the finished
/// baseline `baselines` (`[rank][..]`, e.g. from [`run_baseline_threads`] of the same job's
/// data, seed and sizes), which is not run again. Returns `[rank][baseline, run]`, the shape
/// [`run`] returns for a comparing job, so `summary::report` and `summary::job_prediction`
/// read it alike.
///
/// # Errors
/// [`TrainError::Config`] when `baselines` does not hold one baseline run per rank of `job`;
/// otherwise as [`run`].
pub fn run_after_baseline_threads(
    job: &Job,
    rt: &Arc<Runtime>,
    baselines: &[Vec<RankOutcome>],
    show_progress: bool,
) -> Result<Vec<Vec<RankOutcome>>, TrainError> {
    let ok = baselines.len() == job.cfg.ranks as usize
        && baselines.iter().all(|o| o.iter().any(|x| x.kind == RunKind::Baseline));
    if !ok {
        return Err(TrainError::Config {
            what: "baseline",
            value: format!(
                "{} rank(s) given, {} with a baseline run; the job has {} ranks",
                baselines.len(),
                baselines.iter().filter(|o| o.iter().any(|x| x.kind == RunKind::Baseline)).count(),
                job.cfg.ranks
            ),
        });
    }
    run_plan_threads(job, rt, show_progress, &[RunKind::DropCompute], baselines)
}

/// The runs `plan` on every rank as threads, after `prior[rank]` (empty: none).
fn run_plan_threads(
    job: &Job,
    rt: &Arc<Runtime>,
    show_progress: bool,
    plan: &[RunKind],
    prior: &[Vec<RankOutcome>],
) -> Result<Vec<Vec<RankOutcome>>, TrainError> {
    let unique_id =
        || Comm::unique_id(rt).map_err(|source| TrainError::Collective { rank: 0, call: "unique id", source });
    launch::check_devices(rt, job.cfg.ranks)?;
    let ranks = launch::dispatch(Launch::Threads, job.cfg.ranks, unique_id, CHILD_PROGRAM, &job.spec(), |join| {
        let before = prior.get(join.rank() as usize).cloned().unwrap_or_default();
        run_rank_plan(job, rt, join, show_progress, plan, before, prior)
    })?;
    match ranks {
        Ranks::All(results) => collect(results),
        Ranks::This { result, .. } => Ok(vec![result?]),
    }
}

/// The rank program name of `train` in a `dropcompute::launch::ChildSpec`.
pub const CHILD_PROGRAM: &str = "train";

/// The body of a `train` rank process (`dropcompute rank-process SPEC` with program
/// [`CHILD_PROGRAM`]): rebuilds the parent's job from the spec's [`JobSpec`](super::job::JobSpec), configures this
/// process's mock for it, runs the rank and writes its outcomes to the spec's result file.
///
/// # Errors
/// [`TrainError::Config`] for a spec that is not a `train` job; any rank error.
pub fn run_child(spec: &ChildSpec) -> Result<(), TrainError> {
    let job = Job::from_spec(spec.config()?)?;
    let rt = runtime(&job)?;
    let out = run_rank(&job, &rt, &spec.join()?, false)?;
    Ok(spec.write_result(&out)?)
}

/// Picks the most specific error of a set of rank results.
fn collect(results: Vec<Result<Vec<RankOutcome>, TrainError>>) -> Result<Vec<Vec<RankOutcome>>, TrainError> {
    dropcompute::launch::root_cause(results, |e| {
        matches!(e, TrainError::Collective { .. } | TrainError::Step(ScheduleError::Collective { .. }))
    })
}

/// Checks that every rank ended each run with the same parameters.
///
/// # Errors
/// [`TrainError::Diverged`] naming the first rank that differs.
pub fn check_lockstep(outcomes: &[Vec<RankOutcome>]) -> Result<(), TrainError> {
    for (r, o) in outcomes.iter().enumerate().skip(1) {
        for (a, b) in o.iter().zip(&outcomes[0]) {
            if a.params.iter().map(|x| x.to_bits()).ne(b.params.iter().map(|x| x.to_bits())) {
                return Err(TrainError::Diverged { rank: r as u32 });
            }
        }
    }
    Ok(())
}
