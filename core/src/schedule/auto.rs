//! `--threshold auto` from a baseline run: the run's step reports as a latency trace, the
//! deadline chosen on that trace for the step policy that will run, and its broadcast from
//! rank 0, so that any trainer driving the [`super::Scheduler`] tunes as `dropcompute train`
//! does.
//!
//! Owns: [`step_times`] and [`trace_of_reports`] (the report-to-trace conversion: per step the
//! clock skews, start offsets and overhead) and [`with_report_lengths`]
//! (the buckets and tokens every rank's reports add to it), [`choose`] and [`choose_on`] (the
//! one rule, `tune::policies::auto_threshold`, on those reports; `choose_on` replaying a run's
//! data model) and [`broadcast_threshold`]. Must not
//! touch: the search itself (`tune`), the replay (`sim`), the in-run retuner
//! (`tune::Retuner`), flags or printing.

use super::{ScheduleError, StepReport};
use crate::hccl::Comm;
use crate::policy::Threshold;
use crate::sim::policies::{PolicyRun, ReplayData, StepTimes};
use crate::synapse::{DeviceBuffer, HostBuffer, Stream};
use crate::trace::LatencyTrace;
use crate::tune::Recommend;
use crate::tune::policies::AutoChoice;

/// One step's times outside its micro-batches from `report` (one rank's view of the gathered
/// rows; `m` latency slots per rank), ns:
/// - per rank, the clock skew = its compute clock start ([`super::RankStepStats::clock_start_ns`],
///   from its count row) minus the step's earliest. Measured where the ranks' device clocks
///   share an epoch (the mock in virtual time, and in real time with thread ranks); 0 for
///   every rank in a report written before the field (every clock start 0) and when the
///   skews do not fit in this rank's step (`max_r(skew_r + compute_r)` > its step time: clocks
///   of different epochs): then the skew stays in the overhead, as before. Not caught: clocks
///   whose epochs differ by less than a step (rank processes in real time, each timing from
///   its own mock epoch);
/// - per rank, the start offset = its compute phase minus the sum of its computed micro-batch
///   latencies (device work before the first micro-batch, e.g. the previous step's loss
///   all-reduce, and gaps between micro-batches), at least 0;
/// - the overhead = this rank's step time minus `max_r(skew_r + compute_r)`: what the step
///   spends after the last rank's compute end (collective, rescale, update), counted from the
///   step's earliest clock start, so net of the skews; at least 0.
///
/// So `max_r(skew_r + compute_r) + overhead` is this rank's step time, and the replay
/// (`sim::policies`), which keeps the skews under any policy (they come from the update, not
/// from the micro-batches), sees a slowed rank start late even where its work is cut.
pub fn step_times(report: &StepReport, m: usize) -> StepTimes {
    let ranks = &report.ranks;
    let offsets_ns = ranks
        .iter()
        .zip(report.latencies_ns.chunks(m.max(1)))
        .map(|(x, lat)| (x.compute_ns as f64 - lat.iter().filter(|v| v.is_finite()).sum::<f64>()).max(0.0))
        .collect();
    let earliest = ranks.iter().map(|x| x.clock_start_ns).min().unwrap_or(0);
    let skews: Vec<u64> = ranks.iter().map(|x| x.clock_start_ns - earliest).collect();
    let end = |skew: &[u64]| ranks.iter().zip(skew).map(|(x, &k)| x.compute_ns.saturating_add(k)).max().unwrap_or(0);
    let measured = end(&skews) <= report.step_ns;
    let skews = if measured { skews } else { vec![0; ranks.len()] };
    StepTimes {
        skew_ns: skews.iter().map(|&k| k as f64).collect(),
        offsets_ns,
        overhead_ns: report.step_ns.saturating_sub(end(&skews)) as f64,
    }
}

/// The N x M latency trace of a whole run from one rank's reports (every rank holds the same
/// gathered matrix), warm-up steps included, skipping any step with a micro-batch not computed
/// (a baseline run computes all). Per step, the clock skews, start offsets and overhead of
/// [`step_times`]. `None` when no step remains or the values do not make a valid trace.
pub fn trace_of_reports(reports: &[StepReport]) -> Option<LatencyTrace> {
    let used: Vec<&StepReport> =
        reports.iter().filter(|r| !r.latencies_ns.is_empty() && r.latencies_ns.iter().all(|v| v.is_finite())).collect();
    let first = used.first()?;
    let n = first.world_size as usize;
    let m = first.latencies_ns.len() / n.max(1);
    let used: Vec<&&StepReport> = used.iter().filter(|r| r.latencies_ns.len() == n * m && r.ranks.len() == n).collect();
    let times: Vec<StepTimes> = used.iter().map(|r| step_times(r, m)).collect();
    LatencyTrace::new(
        "baseline run",
        (0..n as u32).collect(),
        used.iter().map(|r| r.step).collect(),
        m,
        used.iter().flat_map(|r| r.latencies_ns.iter().copied()).collect(),
        times.iter().map(|t| t.overhead_ns).collect(),
    )
    .and_then(|t| t.with_start_offsets(times.iter().flat_map(|x| x.offsets_ns.iter().copied()).collect()))
    .and_then(|t| t.with_skews(times.iter().flat_map(|x| x.skew_ns.iter().copied()).collect()))
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
/// ([`trace_of_reports`], with the buckets and tokens of every rank's reports `ranks`:
/// [`with_report_lengths`]; `ranks` empty or not one entry per rank: none, the length-aware
/// policies then tune blind) by the one rule of `train` and `tune --auto-for`
/// ([`crate::tune::policies::auto_threshold`]: DropCompute's recommendation with `template` =
/// `None`, else the policy replay's best threshold). `None` when the reports hold no complete
/// step (nothing to tune on: the deadline stays off). Pure (no device, no collective); every
/// rank gets the same answer from the same reports, but [`broadcast_threshold`] makes rank 0's
/// the one used.
pub fn choose(
    reports: &[StepReport],
    ranks: &[&[StepReport]],
    how: &Recommend,
    template: Option<PolicyRun>,
) -> Option<AutoChoice> {
    let trace = with_report_lengths(trace_of_reports(reports)?, ranks);
    Some(crate::tune::policies::auto_threshold(&trace, how, template))
}

/// [`choose`] with EVERY policy tuned on its own replay (`template`, the run's policy at any
/// threshold; its threshold is searched) and each candidate replayed on `data()`, a fresh copy
/// of the run's data model each (`tune::policies::auto_threshold_on`): the text job gives its
/// stream of units with their buckets and tokens (`deal::ReplayStream::with_shapes`, what its
/// prediction replays), so a candidate's drops re-queue units as the run's will and its drop
/// rate, in tokens, is the one the run measures. Blind DropCompute (`drop-predictive`,
/// `drop-before`) too: [`choose`]'s `tune::recommend` on the recorded cells in place judges a
/// drop rate the run on the stream does not have. `None` as [`choose`].
pub fn choose_on(
    reports: &[StepReport],
    ranks: &[&[StepReport]],
    how: &Recommend,
    template: PolicyRun,
    data: &mut dyn FnMut() -> Box<dyn ReplayData>,
) -> Option<AutoChoice> {
    let trace = with_report_lengths(trace_of_reports(reports)?, ranks);
    Some(crate::tune::policies::auto_threshold_on(&trace, how, Some(template), data))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::RankStepStats;

    /// A step of 3 ranks, M = 2, as rank 0 saw it: clock starts 1000, 1300, 1000 (rank 1 starts
    /// 300 ns late), compute 500 / 400 / 450 with 50 / 0 / 30 ns outside the launches; the
    /// step 1000 ns on rank 0.
    fn report(clock: [u64; 3], step_ns: u64) -> StepReport {
        let compute = [500u64, 400, 450];
        let lat = [[200.0, 250.0], [150.0, 250.0], [200.0, 220.0]];
        StepReport {
            world_size: 3,
            step_ns,
            ranks: (0..3)
                .map(|r| RankStepStats {
                    computed: 2,
                    compute_ns: compute[r],
                    clock_start_ns: clock[r],
                    ..Default::default()
                })
                .collect(),
            latencies_ns: lat.iter().flatten().copied().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn step_times_measure_the_skew_and_take_it_out_of_the_overhead() {
        let t = step_times(&report([1000, 1300, 1000], 1000), 2);
        assert_eq!(t.skew_ns, vec![0.0, 300.0, 0.0]);
        assert_eq!(t.offsets_ns, vec![50.0, 0.0, 30.0]);
        // The latest end from the earliest clock start: rank 1 at 300 + 400 = 700.
        assert_eq!(t.overhead_ns, 300.0);
        // What the trace carries and the replay adds back: this rank's step time.
        let end = (0..3).map(|r| t.skew_ns[r] + [500.0, 400.0, 450.0][r]).fold(0.0f64, f64::max);
        assert_eq!(end + t.overhead_ns, 1000.0);
    }

    /// Table: clock starts that carry no skew (a report written before the field: all 0; clocks
    /// of different epochs: skews beyond the step) leave every skew 0 and the overhead the step
    /// minus the slowest compute, the rule before the skew.
    #[test]
    fn clock_starts_that_cannot_be_compared_leave_the_skew_in_the_overhead() {
        for (clock, why) in [([0, 0, 0], "no clock starts"), ([5, 9_000_000, 7], "beyond the step")] {
            let t = step_times(&report(clock, 1000), 2);
            assert_eq!(t.skew_ns, vec![0.0; 3], "{why}");
            assert_eq!(t.overhead_ns, 500.0, "{why}");
        }
    }

    #[test]
    fn the_trace_of_reports_carries_every_steps_skews() {
        let mut a = report([1000, 1300, 1000], 1000);
        let mut b = report([2000, 2000, 2100], 900);
        (a.step, b.step) = (0, 1);
        let tr = trace_of_reports(&[a, b]).unwrap();
        assert_eq!(tr.skews_ns(), &[0.0, 300.0, 0.0, 0.0, 0.0, 100.0]);
        assert_eq!(tr.overhead_ns(), &[300.0, 350.0]);
        assert_eq!(tr.start_offsets_ns(), &[50.0, 0.0, 30.0, 50.0, 0.0, 30.0]);
    }
}
