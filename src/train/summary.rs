//! From rank outcomes to what the user sees: the baseline latency trace (tuner and simulator
//! input), the simulator's predicted speedup, report.json, the compute logs, the Chrome trace
//! and the figure.
//!
//! Owns: the conversions only. Must not touch: devices, collectives or the training loop.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::policy::Threshold;
use crate::schedule::StepReport;
use crate::trace::LatencyTrace;
use crate::trace::compute_log::ComputeLogWriter;
use crate::tune::StragglerClass;

use super::error::TrainError;
use super::figure::Series;
use super::job::{Job, RankOutcome, RunKind};
use super::mlp;
use super::output::StagedOut;
use super::report::{ConfigEcho, RankStraggler, Report, RunMeasurements, RunMetadata, RunReport, StragglerReport};
use super::timeline::{RunSpans, Span, SpanKind, chrome_trace};

/// The N x M latency trace of a run from one rank's reports (every rank holds the same gathered
/// matrix), skipping the first `skip` (warm-up) steps and any step with a micro-batch not
/// computed; per-step overhead = the gathered overhead. `None` when no step remains.
pub fn baseline_trace(reports: &[StepReport], skip: u64) -> Option<LatencyTrace> {
    let used: Vec<&StepReport> = reports
        .iter()
        .filter(|r| r.step >= skip && !r.latencies_ns.is_empty() && r.latencies_ns.iter().all(|v| v.is_finite()))
        .collect();
    let first = used.first()?;
    let n = first.world_size as usize;
    let m = first.latencies_ns.len() / n.max(1);
    let used: Vec<&&StepReport> = used.iter().filter(|r| r.latencies_ns.len() == n * m).collect();
    LatencyTrace::new(
        "baseline run",
        (0..n as u32).collect(),
        used.iter().map(|r| r.step).collect(),
        m,
        used.iter().flat_map(|r| r.latencies_ns.iter().copied()).collect(),
        used.iter().map(|r| r.overhead_ns as f64).collect(),
    )
    .ok()
}

/// The what-if simulator's predicted effective speedup (as a ratio, 1 = none) of running the
/// baseline's recorded latencies under the DropCompute run's policy (`sim::replay`).
pub fn predicted_speedup(job: &Job, baseline: &[StepReport], threshold_ns: Option<u64>) -> Option<f64> {
    let trace = baseline_trace(baseline, job.cfg.warmup_steps)?;
    let threshold = threshold_ns.map_or(Threshold::Off, |t| Threshold::Fixed(Duration::from_nanos(t)));
    let r = crate::tune::recommend::replay_at(&trace, threshold, job.cfg.check, 1);
    Some(1.0 + r.effective_speedup)
}

/// The measurements of one run: rank 0's view of the global counts, rank 0's wall time, the
/// held-out accuracy of the final parameters, the last step's global loss.
///
/// # Errors
/// [`TrainError::Model`] when evaluation fails; [`TrainError::Report`] for an empty run.
pub fn run_report(job: &Job, o: &RankOutcome) -> Result<RunReport, TrainError> {
    let (_, accuracy) = mlp::evaluate(job.shape, &o.params, &job.holdout)?;
    let m = RunMeasurements {
        wall: Duration::from_nanos(o.wall_ns.max(1)),
        steps: o.reports.len() as u64,
        samples_computed: o.reports.iter().map(StepReport::global_samples).sum(),
        samples_dropped: o.reports.iter().map(StepReport::global_dropped_samples).sum(),
        accuracy,
        final_loss: o.loss.iter().rev().copied().find(|l| l.is_finite()).unwrap_or(f64::NAN),
        threshold: o.threshold_ns.map(Duration::from_nanos),
    };
    Ok(RunReport::from_measurements(&m)?)
}

/// The straggler attribution of run `o` (rank 0's view of the gathered counts): per rank its
/// dropped micro-batches, its slow steps (deadline hits) and the tracker's class
/// (`StragglerTracker::class`); every rank unlabelled, with the reason, when no step of the run
/// had a deadline (nothing to hit).
pub fn stragglers(o: &RankOutcome) -> StragglerReport {
    let t = &o.stragglers;
    let n = t.hits.len();
    let mut dropped = vec![0u64; n];
    for r in &o.reports {
        for (d, s) in dropped.iter_mut().zip(&r.ranks) {
            *d += u64::from(s.dropped);
        }
    }
    let no_deadline = o.reports.iter().all(|r| r.threshold_ns.is_none());
    let steps = t.steps();
    let unlabelled_because = if no_deadline {
        Some("no step had a deadline (threshold off), so no rank could hit it".to_owned())
    } else if steps < crate::schedule::CHRONIC_MIN_STEPS {
        Some(format!("{steps} steps < {}", crate::schedule::CHRONIC_MIN_STEPS))
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
            class: if no_deadline { StragglerClass::Unlabelled } else { t.class(i as u32) },
        })
        .collect();
    StragglerReport {
        run: o.kind.label().to_owned(),
        steps,
        min_steps: crate::schedule::CHRONIC_MIN_STEPS,
        unlabelled_because,
        ranks,
    }
}

/// The report of a job from the outcomes `[rank][run]` (rank 0 at least), with the run
/// metadata `meta`.
///
/// # Errors
/// As [`run_report`].
pub fn report(job: &Job, outcomes: &[Vec<RankOutcome>], meta: RunMetadata) -> Result<Report, TrainError> {
    let r0 = &outcomes[0];
    let base = r0.iter().find(|o| o.kind == RunKind::Baseline);
    let dc = r0
        .iter()
        .find(|o| o.kind == RunKind::DropCompute)
        .ok_or(TrainError::Config { what: "runs", value: "no DropCompute run".into() })?;
    let predicted = base.and_then(|b| predicted_speedup(job, &b.reports, dc.threshold_ns));
    let baseline = base.map(|b| run_report(job, b)).transpose()?;
    Ok(Report::new(baseline, run_report(job, dc)?, predicted, ConfigEcho::from(&job.cfg), meta, stragglers(dc)))
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
        for o in &per_rank {
            for r in &o.reports {
                for row in r.compute_log() {
                    w.write(&row).map_err(|e| TrainError::Io { what: "compute log".into(), source: e.into() })?;
                }
            }
        }
        let bytes = w.into_inner().map_err(|source| TrainError::Io { what: "compute log".into(), source })?;
        out.write(&format!("compute_log_{label}.csv"), &bytes)?;
        let ledgers: Vec<&crate::schedule::DropLedger> = per_rank.iter().map(|o| &o.ledger).collect();
        let ledger =
            serde_json::to_vec(&ledgers).map_err(|e| TrainError::Config { what: "ledger", value: e.to_string() })?;
        out.write(&format!("ledger_{label}.json"), &ledger)?;
        let r0 = per_rank[0];
        let steps_taken = r0.reports.last().map_or(0, |r| r.step + 1);
        let params = super::params::to_safetensors(job.shape, &r0.params, label, steps_taken)?;
        out.write(&format!("params_{label}.safetensors"), &params)?;
        steps.extend(super::metrics::rows(label, &r0.reports, &r0.loss));
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
