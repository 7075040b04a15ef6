//! From rank outcomes to what the user sees: the baseline latency trace (tuner and simulator
//! input), the simulator's predicted speedup, report.json, the compute logs, the Chrome trace
//! and the figure.
//!
//! Owns: the conversions only. Must not touch: devices, collectives or the training loop.
#![forbid(unsafe_code)]

use std::time::Duration;

use dropcompute::policy::Threshold;
use dropcompute::schedule::StepReport;
use dropcompute::sim::policies::{PartShape, PolicyReplay, ReplayData, StepTimes, replay_policy_on};
use dropcompute::trace::compute_log::ComputeLogWriter;

use super::error::TrainError;
use super::figure::Series;
use super::job::{Job, RankOutcome, RunKind};
use super::mlp;
use super::output::StagedOut;
use super::report::{ConfigEcho, RankStraggler, Report, RunMeasurements, RunMetadata, RunReport, StragglerReport};
use super::timeline::{RunSpans, Span, SpanKind, chrome_trace};
use dropcompute::deal::ReplayStream;

/// The simulator's prediction of the DropCompute run (`train` prints `speedup` as "effective
/// speedup, predicted").
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The baseline run's latencies replayed as the DropCompute run executes them, for as many
    /// steps as the run's data deals ([`prediction`]).
    pub replay: PolicyReplay,
    /// Samples the DropCompute run computes, predicted: the run's one global stream
    /// (`dropcompute::deal::ReplayStream`, dropped parts re-queued first) dealt by the replay's
    /// assignments; `None` when the trace does not cover steps 0..S without a gap.
    pub samples_computed: Option<u64>,
    /// Samples the DropCompute run computes per step, predicted (the replay's steps).
    pub step_samples: Vec<u64>,
    /// Real tokens the DropCompute run computes per step, predicted (the text job: the
    /// stream's started parts' tokens, `ReplayStream::step_tokens`; empty for the digits job).
    pub step_tokens: Vec<u64>,
    /// Samples the baseline run computed (every step).
    pub baseline_samples: u64,
    /// Real tokens the DropCompute run computes, predicted (the text job: the stream's started
    /// parts' tokens, `ReplayStream::tokens`); `None` for the digits job or when
    /// [`Prediction::samples_computed`] is.
    pub tokens_computed: Option<u64>,
    /// Real tokens the baseline run computed (the text job; every step, every rank).
    pub baseline_tokens: Option<u64>,
    /// Predicted effective speedup (ratio, 1 = none): the predicted work per second over the
    /// baseline's (work / time, each over its whole run), the work in real tokens for the text
    /// job and in samples otherwise, as the measurement counts; the parts ratio
    /// (`1 + PolicyReplay::effective_speedup`) when the work cannot be predicted. The mean
    /// over [`Prediction::draws`] replays.
    pub speedup: f64,
    /// Predicted mean step time, ns (the mean over [`Prediction::draws`] replays).
    pub step_ns: f64,
    /// Predicted mean time of the steps the data fills, ns (`PolicyReplay::filled_step_ns`:
    /// an epoch's short last step left out; the mean over [`Prediction::draws`] replays).
    pub filled_step_ns: f64,
    /// Replays averaged: 1 when every latency was recorded, [`ESTIMATE_DRAWS`] for an
    /// estimate (each with its own draws; [`Prediction::replay`] is the first).
    pub draws: u32,
    /// True when the prediction draws latencies the baseline did not record (micro-batches
    /// beyond its M, or steps beyond its S: [`PolicyReplay::is_estimate`]).
    pub estimate: bool,
}

/// The what-if simulator's prediction for the DropCompute run: the baseline run's recorded
/// latencies (every step, warm-up included) replayed at `threshold_ns` as the DropCompute run
/// executes it (`sim::policies::replay_policy_on` with [`Job::policy_run`]: the job's policy,
/// check mode, sync lag, warm-up, tail shape; the scheduler's walker and assignment step),
/// dealing the run's own data stream (`dropcompute::deal::ReplayStream`): an `--epochs` run is replayed
/// to its stream's end, also beyond the baseline's steps (an estimate: the replay draws those
/// steps' latencies from each rank's recorded ones). The per-step overhead is the baseline's
/// (`dropcompute::schedule::auto::trace_of_reports`) plus its host time outside the device steps (wall time minus the sum of
/// step times, over the steps; 0 in virtual time). The speedup counts the work as the
/// measurement does: samples for the digits job (an epoch's last micro-batch may be short),
/// real tokens for the text job (`report`'s tokens per second): the predicted work over the
/// predicted time (the replayed steps) against the baseline's work over its time (its recorded
/// steps as replayed, plus any step the trace skipped, as measured). `None` without a complete
/// baseline step. `ranks` (every rank's baseline reports, rank order) give the text task's
/// trace its buckets and tokens (`schedule::auto::with_report_lengths`), and the text job's
/// stream knows every unit's bucket and tokens (`Job::replay_stream`): the replay gives each
/// dealt unit the recorded latency of its position scaled to its own bucket's cost, tells the
/// length-aware walk the dealt buckets, deals `cost-balance` by the stream's own units, and
/// counts the started units' tokens (`sim::policies`, "What the data deals"); the digits
/// task's trace has no buckets.
pub fn prediction(
    job: &Job,
    baseline: &RankOutcome,
    ranks: &[&[StepReport]],
    threshold_ns: Option<u64>,
) -> Option<Prediction> {
    let reports = &baseline.reports;
    let trace = dropcompute::schedule::auto::trace_of_reports(reports)?;
    let trace = match &job.text {
        Some(_) => dropcompute::schedule::auto::with_report_lengths(trace, ranks),
        None => trace,
    };
    let device_ns: u64 = reports.iter().map(|r| r.step_ns).sum();
    let host_gap = baseline.wall_ns.saturating_sub(device_ns) as f64 / reports.len().max(1) as f64;
    let overhead: Vec<f64> = trace.overhead_ns().iter().map(|o| o + host_gap).collect();
    let trace = trace.with_overhead(overhead).ok()?;
    let threshold = Threshold::from_ns(threshold_ns);
    let cfg = &job.cfg;
    let steps = trace.steps();
    let covered = steps.iter().enumerate().all(|(i, &s)| s == i as u64);
    let baseline_samples: u64 = reports.iter().map(StepReport::global_samples).sum();
    // The text job's measured unit of work (`run_report`'s tokens computed).
    let baseline_tokens: Option<u64> = job.text.as_ref().map(|_| reports.iter().map(StepReport::global_tokens).sum());
    // The baseline's steps the trace could not hold (an epoch's short last step: a rank
    // without data has no latency), recorded all the same: the replay takes their latencies
    // and times from the record.
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let partial: Vec<(usize, RecordedStep)> = if covered {
        reports
            .iter()
            .filter(|r| steps.binary_search(&r.step).is_err() && r.latencies_ns.len() == n * m && r.ranks.len() == n)
            .map(|r| {
                let mut times = dropcompute::schedule::auto::step_times(r, m);
                times.overhead_ns += host_gap;
                (r.step as usize, RecordedStep { latencies_ns: r.latencies_ns.clone(), m, times })
            })
            .collect()
    } else {
        Vec::new()
    };
    // The baseline's steps the trace skipped (an epoch's short last step), as measured: part
    // of the baseline's time.
    let skipped: f64 =
        reports.iter().filter(|r| steps.binary_search(&r.step).is_err()).map(|r| r.step_ns as f64 + host_gap).sum();
    // One replay with the draws of `seed` (beyond the record): the replay, its stream, its
    // speedup.
    let one = |seed: u64| {
        let mut data = WithRecorded { stream: job.replay_stream(), steps: &partial };
        let run = dropcompute::sim::policies::PolicyRun { seed, ..job.policy_run(threshold) };
        let replay = replay_policy_on(&trace, &run, &mut data);
        let stream = data.stream;
        // The baseline's time: its recorded steps as replayed (the synchronous policy
        // reproduces them bit for bit), plus the skipped ones.
        let recorded: f64 = replay.per_step.iter().take(steps.len()).map(|x| x.0).sum();
        let policy_time: f64 = replay.per_step.iter().map(|x| x.1).sum();
        // The work: tokens for the text job, samples otherwise (the measurement's unit).
        let work = match (baseline_tokens, stream.tokens()) {
            (Some(b), Some(t)) => covered.then_some((t, b)),
            (None, _) => covered.then(|| (stream.samples(), baseline_samples)),
            (Some(_), None) => None,
        };
        let speedup = match work {
            Some((w, base)) if base > 0 && policy_time > 0.0 => {
                (w as f64 / policy_time) / (base as f64 / (recorded + skipped))
            }
            _ => 1.0 + replay.effective_speedup,
        };
        (replay, stream, speedup)
    };
    let (replay, stream, first) = one(job.policy_run(threshold).seed);
    // An estimate is the mean over ESTIMATE_DRAWS draws of what the trace did not record.
    let draws = if replay.is_estimate() { ESTIMATE_DRAWS } else { 1 };
    let (mut speedup, mut step_ns, mut filled_ns) = (first, replay.policy_step_ns, replay.filled_step_ns());
    for k in 1..draws {
        let (r, _, s) = one(dropcompute::sim::rng::splitmix64(cfg.seed ^ u64::from(k)));
        speedup += s;
        step_ns += r.policy_step_ns;
        filled_ns += r.filled_step_ns();
    }
    Some(Prediction {
        estimate: replay.is_estimate(),
        speedup: speedup / f64::from(draws),
        step_ns: step_ns / f64::from(draws),
        filled_step_ns: filled_ns / f64::from(draws),
        draws,
        replay,
        samples_computed: covered.then(|| stream.samples()),
        step_samples: stream.step_samples().to_vec(),
        step_tokens: stream.step_tokens().to_vec(),
        baseline_samples,
        tokens_computed: stream.tokens().filter(|_| covered),
        baseline_tokens,
    })
}

/// A recorded baseline step outside the trace ([`prediction`]): its N x M latencies (NaN where
/// a rank computed nothing), clock skews, start offsets and overhead, ns.
struct RecordedStep {
    latencies_ns: Vec<f64>,
    m: usize,
    times: StepTimes,
}

/// The run's stream ([`ReplayStream`]) with the baseline's recorded steps outside the trace
/// (by replay step index), as one `ReplayData`.
struct WithRecorded<'a> {
    stream: ReplayStream,
    steps: &'a [(usize, RecordedStep)],
}

impl WithRecorded<'_> {
    fn step(&self, index: usize) -> Option<&RecordedStep> {
        self.steps.iter().find(|(i, _)| *i == index).map(|(_, s)| s)
    }
}

impl ReplayData for WithRecorded<'_> {
    fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
        self.stream.deal(index, assignment)
    }

    fn settle(&mut self, started: &[u32]) {
        self.stream.settle(started);
    }

    fn latency(&self, index: usize, rank: usize, micro_batch: usize) -> Option<f64> {
        let s = self.step(index)?;
        (micro_batch < s.m)
            .then(|| s.latencies_ns.get(rank * s.m + micro_batch).copied())
            .flatten()
            .filter(|v| v.is_finite())
    }

    fn step_times(&self, index: usize) -> Option<StepTimes> {
        self.step(index).map(|s| s.times.clone())
    }

    fn knows_shapes(&self) -> bool {
        self.stream.knows_shapes()
    }

    fn part_shape(&self, rank: usize, slot: usize) -> Option<PartShape> {
        self.stream.part_shape(rank, slot)
    }

    fn deal_by(
        &mut self,
        index: usize,
        parts: usize,
        deal: &mut dyn FnMut(&[PartShape]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<usize>>> {
        self.stream.deal_by(index, parts, deal)
    }
}

/// Replays averaged by an estimated prediction ([`Prediction::draws`]): the draws of latencies
/// the baseline did not record differ per replay, so one replay is one realization and its
/// error against the run (another realization) has about twice the variance of the mean's.
/// Measured on `validate`'s compute-budget and rebalance rows (ARCHITECTURE.md, README).
pub const ESTIMATE_DRAWS: u32 = 8;

/// The drop rate of run `o` against its nominal batch (`policy::nominal_drop_rate` over its
/// steps), a fraction in [0, 1]. What report.json and `validate` show.
///
/// Each step's nominal is `StepReport::nominal_parts` of N·M·S parts (S the run's tail split,
/// 1 for the baseline). The digits job counts parts. The text job counts tokens: each step's
/// nominal tokens are `StepReport::nominal_tokens` (its handed-out tokens per handed part times
/// its nominal parts, `policy::step_nominal_tokens`, the replay's rule) and its aggregated its
/// computed tokens. A policy that hands out more than the nominal batch (the compute budget)
/// is judged by what is missing from the nominal batch, in both units.
pub fn drop_rate(job: &Job, o: &RankOutcome) -> f64 {
    let split = match o.kind {
        RunKind::Baseline => 1,
        RunKind::DropCompute => job.cfg.tail.parts(),
    };
    let full = u64::from(job.cfg.ranks) * u64::from(job.cfg.micro_batches) * u64::from(split);
    if job.text.is_some() {
        let steps = o.reports.iter().map(|r| (r.nominal_tokens(full), r.global_tokens() as f64));
        return dropcompute::policy::nominal_drop_rate_of(steps);
    }
    dropcompute::policy::nominal_drop_rate(o.reports.iter().map(|r| (r.nominal_parts(full), r.global_computed())))
}

/// The measurements of one run: rank 0's view of the global counts, rank 0's wall time, the
/// held-out accuracy of the final parameters, the last step's global loss.
///
/// # Errors
/// [`TrainError::Model`] when evaluation fails; [`TrainError::Report`] for an empty run.
pub fn run_report(job: &Job, o: &RankOutcome) -> Result<RunReport, TrainError> {
    // The text task has no accuracy: its metric is the held-out loss per token rank 0
    // measured on the device (`RankOutcome::holdout_loss`).
    let accuracy = match &job.text {
        Some(_) => 0.0,
        None => mlp::evaluate(job.shape, &o.params, &job.holdout)?.1,
    };
    let m = RunMeasurements {
        wall: Duration::from_nanos(o.wall_ns.max(1)),
        steps: o.reports.len() as u64,
        samples_computed: o.reports.iter().map(StepReport::global_samples).sum(),
        samples_dropped: o.reports.iter().map(StepReport::global_dropped_samples).sum(),
        nominal_drop_rate: drop_rate(job, o),
        accuracy,
        final_loss: o.loss.iter().rev().copied().find(|l| l.is_finite()).unwrap_or(f64::NAN),
        threshold: o.threshold_ns.map(Duration::from_nanos),
    };
    let mut r = RunReport::from_measurements(&m)?;
    r.policy = job.policy_of(o.kind).name().to_owned();
    r.assignment = o.reports.last().map(|x| x.assignment.clone()).unwrap_or_default();
    if job.text.is_some() {
        let tokens: u64 = o.reports.iter().flat_map(|x| x.ranks.iter().map(|s| s.tokens)).sum();
        r.accuracy = f64::NAN;
        r.holdout_loss_per_token = Some(o.holdout_loss.unwrap_or(f64::NAN));
        r.tokens_computed = Some(tokens);
        r.tokens_per_s = Some(tokens as f64 / r.wall_s);
    }
    Ok(r)
}

/// The straggler attribution of run `o` (rank 0's view of the gathered counts): per rank its
/// dropped micro-batches, its slow steps (deadline hits) and the tracker's class
/// (`StragglerTracker::class`: chronic by its latency per micro-batch, the rule of the
/// rebalancer and of `tune`, so also without a deadline; transient needs a deadline hit).
pub fn stragglers(o: &RankOutcome) -> StragglerReport {
    let t = &o.stragglers;
    let n = t.hits.len();
    let mut dropped = vec![0u64; n];
    for r in &o.reports {
        for (d, s) in dropped.iter_mut().zip(&r.ranks) {
            *d += u64::from(s.dropped);
        }
    }
    let steps = t.steps();
    let unlabelled_because = if steps < dropcompute::schedule::CHRONIC_MIN_STEPS {
        Some(format!("{steps} steps < {}", dropcompute::schedule::CHRONIC_MIN_STEPS))
    } else {
        None
    };
    let ranks = (0..n)
        .map(|i| RankStraggler {
            rank: i as u32,
            dropped_micro_batches: dropped[i],
            slow_steps: t.hits[i],
            slow_step_share: if steps > 0 { t.hits[i] as f64 / steps as f64 } else { 0.0 },
            compute_ms_ewma: t.ewma_compute_ns[i] / 1e6,
            class: t.class(i as u32),
        })
        .collect();
    StragglerReport {
        run: o.kind.label().to_owned(),
        steps,
        min_steps: dropcompute::schedule::CHRONIC_MIN_STEPS,
        unlabelled_because,
        ranks,
    }
}

/// The prediction of a job's DropCompute run from rank 0's outcomes (`outcomes[0]`: its
/// baseline and DropCompute runs): [`prediction`] at the run's threshold; `None` without a
/// baseline (`--no-compare`) or a complete baseline step. Computed once per job and passed to
/// [`report`] and [`write_outputs`] (an estimate replays [`ESTIMATE_DRAWS`] times).
pub fn job_prediction(job: &Job, outcomes: &[Vec<RankOutcome>]) -> Option<Prediction> {
    let r0 = outcomes.first()?;
    let base = r0.iter().find(|o| o.kind == RunKind::Baseline)?;
    let dc = r0.iter().find(|o| o.kind == RunKind::DropCompute)?;
    let ranks: Vec<&[StepReport]> = outcomes
        .iter()
        .filter_map(|o| o.iter().find(|x| x.kind == RunKind::Baseline).map(|x| x.reports.as_slice()))
        .collect();
    prediction(job, base, &ranks, dc.threshold_ns)
}

/// The report of a job from the outcomes `[rank][run]` (rank 0 at least), with the run
/// metadata `meta` and the job's prediction ([`job_prediction`]).
///
/// # Errors
/// As [`run_report`].
pub fn report(
    job: &Job,
    outcomes: &[Vec<RankOutcome>],
    meta: RunMetadata,
    predicted: Option<&Prediction>,
) -> Result<Report, TrainError> {
    let r0 = &outcomes[0];
    let base = r0.iter().find(|o| o.kind == RunKind::Baseline);
    let dc = r0
        .iter()
        .find(|o| o.kind == RunKind::DropCompute)
        .ok_or(TrainError::Config { what: "runs", value: "no DropCompute run".into() })?;
    let baseline = base.map(|b| run_report(job, b)).transpose()?;
    let speedup = predicted.map(|p| p.speedup);
    let mut rep =
        Report::new(baseline, run_report(job, dc)?, speedup, ConfigEcho::from(&job.cfg), meta, stragglers(dc));
    if job.text.is_some() {
        // The text task's unit of work is the token: its speedup is in tokens per second.
        rep.speedup = match (rep.baseline.as_ref().and_then(|b| b.tokens_per_s), rep.dropcompute.tokens_per_s) {
            (Some(b), Some(d)) if b > 0.0 => Some(d / b),
            _ => None,
        };
    }
    rep.prediction_estimate = predicted.is_some_and(|p| p.estimate);
    Ok(rep)
}

/// Timeline spans of one run over the ranks given, times relative to the earliest start.
pub fn spans(outcomes: &[&RankOutcome]) -> Vec<Span> {
    let mut v = Vec::new();
    for o in outcomes {
        for r in &o.reports {
            for mb in &r.micro_batches {
                let kind = if mb.dropped { SpanKind::Dropped } else { SpanKind::Computed };
                v.push(Span {
                    rank: o.rank,
                    step: r.step,
                    micro_batch: Some(mb.micro_batch),
                    kind,
                    start_ns: mb.start_ns,
                    dur_ns: mb.duration_ns,
                });
            }
            let (c0, c1) = r.collective_span_ns;
            v.push(Span {
                rank: o.rank,
                step: r.step,
                micro_batch: None,
                kind: SpanKind::Collective,
                start_ns: c0,
                dur_ns: c1.saturating_sub(c0),
            });
            v.push(Span {
                rank: o.rank,
                step: r.step,
                micro_batch: None,
                kind: SpanKind::Optimizer,
                start_ns: c1,
                dur_ns: r.step_end_ns.saturating_sub(c1),
            });
        }
    }
    let t0 = v.iter().map(|s| s.start_ns).min().unwrap_or(0);
    for s in &mut v {
        s.start_ns -= t0;
    }
    v
}

/// Writes report.json, `steps.csv` (one row per step per run: `train::metrics`),
/// `compute_log_<run>.csv` (every rank's micro-batches, reference columns plus rank, start_ns,
/// duration_ns), `params_<run>.safetensors` (the final parameters, identical on every rank:
/// `train::params`), `ledger_<run>.json` (per rank: sample ids computed in order, dropped
/// micro-batches and their fate), `timeline.json` and `figure.svg` into `out`.
///
/// # Errors
/// [`TrainError::Output`], [`TrainError::Figure`], [`TrainError::Io`], [`TrainError::Params`].
pub fn write_outputs(
    out: &StagedOut,
    job: &Job,
    rep: &Report,
    outcomes: &[Vec<RankOutcome>],
    predicted: Option<&Prediction>,
) -> Result<(), TrainError> {
    out.write("report.json", rep.to_json().as_bytes())?;
    let runs = outcomes[0].len();
    let mut all_spans = Vec::new();
    let mut series = Vec::new();
    let mut steps = Vec::new();
    for i in 0..runs {
        let per_rank: Vec<&RankOutcome> = outcomes.iter().filter_map(|o| o.get(i)).collect();
        let label = per_rank[0].kind.label();
        let mut w = ComputeLogWriter::new(Vec::new());
        // The baseline runs whole micro-batches only; the second run its tail shape.
        let tail = match per_rank[0].kind {
            super::job::RunKind::Baseline => dropcompute::policy::TailShape::default(),
            super::job::RunKind::DropCompute => job.cfg.tail,
        };
        for o in &per_rank {
            for r in &o.reports {
                for row in r.compute_log(job.cfg.micro_batches, tail) {
                    w.write(&row).map_err(|e| TrainError::Io { what: "compute log".into(), source: e.into() })?;
                }
            }
        }
        let bytes = w.into_inner().map_err(|source| TrainError::Io { what: "compute log".into(), source })?;
        out.write(&format!("compute_log_{label}.csv"), &bytes)?;
        let ledgers: Vec<&dropcompute::schedule::DropLedger> = per_rank.iter().map(|o| &o.ledger).collect();
        let ledger =
            serde_json::to_vec(&ledgers).map_err(|e| TrainError::Config { what: "ledger", value: e.to_string() })?;
        out.write(&format!("ledger_{label}.json"), &ledger)?;
        let r0 = per_rank[0];
        let steps_taken = r0.reports.last().map_or(0, |r| r.step + 1);
        // The parameters file (`--init-params` reads it back): the MLP's or the transformer's.
        let params = match &job.text {
            Some(t) => super::params::text_to_safetensors(&t.model, &r0.params, label, steps_taken)?,
            None => super::params::to_safetensors(job.shape, &r0.params, label, steps_taken)?,
        };
        out.write(&format!("params_{label}.safetensors"), &params)?;
        let policy = job.policy_of(per_rank[0].kind);
        steps.extend(super::metrics::rows(label, policy.name(), &r0.reports, &r0.loss));
        if let (super::job::RunKind::DropCompute, Some(p)) = (r0.kind, predicted) {
            // The divisor column in the run's unit: tokens for the text job, samples otherwise.
            let work = if p.step_tokens.is_empty() { &p.step_samples } else { &p.step_tokens };
            steps.extend(super::metrics::predicted_rows(policy.name(), &p.replay, work, r0.threshold_ns));
        }
        all_spans.push((label, spans(&per_rank)));
        series.push(Series {
            label: label.to_string(),
            step_ms: r0.reports.iter().map(|r| r.step_ns as f64 / 1e6).collect(),
            loss: r0.loss.clone(),
        });
    }
    let runs: Vec<RunSpans<'_>> = all_spans.iter().map(|(name, s)| RunSpans { name, spans: s }).collect();
    out.write("timeline.json", chrome_trace(&runs).as_bytes())?;
    let csv =
        super::metrics::to_csv(&steps).map_err(|e| TrainError::Io { what: "steps.csv".into(), source: e.into() })?;
    out.write("steps.csv", &csv)?;
    out.write("figure.svg", super::figure::figure_svg(&series)?.as_bytes())?;
    Ok(())
}
