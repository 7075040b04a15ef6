//! `--threshold auto` from a baseline run: the run's step reports as a latency trace, the
//! deadline chosen on that trace for the step policy that will run, and its broadcast from
//! rank 0, so that any trainer driving the [`super::Scheduler`] tunes as `dropcompute train`
//! does.
//!
//! Owns: [`trace_of_reports`] (the report-to-trace conversion) and [`with_report_lengths`]
//! (the buckets and tokens every rank's reports add to it), [`choose`] (the one rule,
//! `tune::policies::auto_threshold`, on those reports) and [`broadcast_threshold`]. Must not
//! touch: the search itself (`tune`), the replay (`sim`), the in-run retuner
//! (`tune::Retuner`), flags or printing.

use super::{ScheduleError, StepReport};
use crate::hccl::Comm;
use crate::policy::Threshold;
use crate::sim::policies::PolicyRun;
use crate::synapse::{DeviceBuffer, HostBuffer, Stream};
use crate::trace::LatencyTrace;
use crate::tune::Recommend;
use crate::tune::policies::AutoChoice;

/// The N x M latency trace of a whole run from one rank's reports (every rank holds the same
/// gathered matrix), warm-up steps included, skipping any step with a micro-batch not computed
/// (a baseline run computes all). Per step: overhead = this rank's step time minus the slowest
/// rank's compute phase (collective, rescale, optimizer: what the step spends after the last
/// rank's compute, without the wait for it); per rank, the start offset = its compute phase
/// minus the sum of its micro-batch latencies (device work before the first micro-batch, e.g.
/// the previous step's loss all-reduce, and gaps between micro-batches). All in ns. `None` when
/// no step remains or the values do not make a valid trace.
pub fn trace_of_reports(reports: &[StepReport]) -> Option<LatencyTrace> {
    let used: Vec<&StepReport> =
        reports.iter().filter(|r| !r.latencies_ns.is_empty() && r.latencies_ns.iter().all(|v| v.is_finite())).collect();
    let first = used.first()?;
    let n = first.world_size as usize;
    let m = first.latencies_ns.len() / n.max(1);
    let used: Vec<&&StepReport> = used.iter().filter(|r| r.latencies_ns.len() == n * m && r.ranks.len() == n).collect();
    let max_compute = |r: &StepReport| r.ranks.iter().map(|x| x.compute_ns).max().unwrap_or(0);
    let offsets: Vec<f64> = used
        .iter()
        .flat_map(|r| {
            r.ranks.iter().zip(r.latencies_ns.chunks_exact(m.max(1))).map(|(x, lat)| {
                let sum: f64 = lat.iter().sum();
                (x.compute_ns as f64 - sum).max(0.0)
            })
        })
        .collect();
    LatencyTrace::new(
        "baseline run",
        (0..n as u32).collect(),
        used.iter().map(|r| r.step).collect(),
        m,
        used.iter().flat_map(|r| r.latencies_ns.iter().copied()).collect(),
        used.iter().map(|r| r.step_ns.saturating_sub(max_compute(r)) as f64).collect(),
    )
    .and_then(|t| t.with_start_offsets(offsets))
    .ok()
}

/// `trace` (from [`trace_of_reports`]) carrying each micro-batch's length bucket and real
/// tokens from every rank's own reports (`ranks[r]`: rank r's reports; a report holds only its
/// own rank's [`super::MicroBatchRecord`]s, where they are): cell (step s, rank r, micro-batch
/// j) is rank r's launch j of step s, which in a baseline run (every micro-batch a whole launch,
/// none dropped) is its micro-batch j. Buckets (tokens) are added only when every cell has one
/// (a job without buckets, a run weighing samples, a dropped or missing micro-batch: none),
/// and nothing when `ranks` does not have one entry per rank of the trace: the length-aware
/// policies then replay blind and the replay counts micro-batches, as on a compute log without
/// the columns.
pub fn with_report_lengths(trace: LatencyTrace, ranks: &[&[StepReport]]) -> LatencyTrace {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    if ranks.len() != n {
        return trace;
    }
    let mut cells: Vec<&super::MicroBatchRecord> = Vec::with_capacity(trace.latencies_ns().len());
    for &step in trace.steps() {
        for reports in ranks {
            let Some(rep) = reports.iter().find(|r| r.step == step) else { return trace };
            let mbs = rep.micro_batches.get(..m).unwrap_or_default();
            if mbs.len() < m || mbs.iter().any(|x| x.dropped) {
                return trace;
            }
            cells.extend(mbs);
        }
    }
    let buckets: Option<Vec<u32>> = cells.iter().map(|x| x.bucket).collect();
    let tokens: Option<Vec<u64>> = cells.iter().map(|x| x.tokens).collect();
    let mut out = trace;
    if let Some(b) = buckets {
        out = match out.clone().with_buckets(b) {
            Ok(t) => t,
            Err(_) => out,
        };
    }
    if let Some(t) = tokens {
        out = match out.clone().with_tokens(t) {
            Ok(t) => t,
            Err(_) => out,
        };
    }
    out
}

/// Chooses the deadline of `--threshold auto` on the baseline run's `reports`
/// ([`trace_of_reports`]) by the one rule of `train` and `tune --auto-for`
/// ([`crate::tune::policies::auto_threshold`]: DropCompute's recommendation with `template` =
/// `None`, else the policy replay's best threshold). `None` when the reports hold no complete
/// step (nothing to tune on: the deadline stays off). Pure (no device, no collective); every
/// rank gets the same answer from the same reports, but [`broadcast_threshold`] makes rank 0's
/// the one used.
pub fn choose(reports: &[StepReport], how: &Recommend, template: Option<PolicyRun>) -> Option<AutoChoice> {
    let trace = trace_of_reports(reports)?;
    Some(crate::tune::policies::auto_threshold(&trace, how, template))
}

/// The wire value of "no deadline" in [`broadcast_threshold`] (a deadline of `u64::MAX` ns,
/// 584 years, is no deadline either).
const OFF_NS: u64 = u64::MAX;

/// Broadcasts rank 0's `threshold` over `comm` (two u32 halves of its ns on a temporary
/// stream) and returns it on every rank; `threshold` is ignored on the other ranks.
///
/// # Errors
/// [`ScheduleError::Device`] (stream, buffers, copies) or [`ScheduleError::Collective`] (the
/// broadcast, e.g. a timed-out peer), both naming this rank, step 0 and the call.
pub fn broadcast_threshold(comm: &Comm, threshold: Threshold) -> Result<Threshold, ScheduleError> {
    let rank = comm.rank();
    let call = "threshold broadcast";
    let dev_err = |source| ScheduleError::Device { rank, step: 0, call, source };
    let coll_err = |source| ScheduleError::Collective { rank, step: 0, call, source };
    let v = threshold.as_ns().unwrap_or(OFF_NS);
    let dev = comm.device();
    let s = Stream::new(dev).map_err(dev_err)?;
    let host = HostBuffer::from_slice(dev, &[v as u32, (v >> 32) as u32]).map_err(dev_err)?;
    let mut send = DeviceBuffer::<u32>::alloc(dev, 2).map_err(dev_err)?;
    let mut recv = DeviceBuffer::<u32>::alloc(dev, 2).map_err(dev_err)?;
    s.copy_h2d(&host, &mut send).map_err(dev_err)?;
    comm.broadcast(&send, &mut recv, 0, &s).map_err(coll_err)?;
    let mut back = HostBuffer::<u32>::zeroed(dev, 2).map_err(dev_err)?;
    s.copy_d2h(&recv, &mut back).map_err(dev_err)?;
    comm.synchronize(&s).map_err(coll_err)?;
    let b = back.as_slice().map_err(dev_err)?;
    let ns = u64::from(b[0]) | (u64::from(b[1]) << 32);
    Ok(Threshold::from_ns(Some(ns).filter(|&ns| ns != OFF_NS)))
}
