//! `steps.csv` of `train --out`: one row per optimizer step per run (baseline and DropCompute),
//! the numbers behind the figure and report.json in a form any CSV reader takes.
//!
//! Owns: [`StepMetrics`] (the columns), [`rows`], [`to_csv`] and [`read_csv`]. Must not touch:
//! measuring (the values come from the scheduler's `StepReport`s and the driver's losses).
//!
//! Columns (header = field names, in this order): `run` ("baseline" or "dropcompute"), `step`
//! (0-based), `step_ms` (device time from the previous update's end to this one's, rank 0),
//! `compute_ms` (the step's compute phase: the slowest rank's, from the gathered counts),
//! `collective_ms` (rank 0's all-reduce and count read-back minus its wait for the slowest
//! rank), `computed` / `dropped` (micro-batches over every rank), `divisor` (the gradient's
//! normalization divisor: computed samples for realized normalization, N·M·b for nominal, 0 when
//! the update was skipped), `loss` (global mean training loss; empty when no sample was
//! computed), `threshold_ms` (deadline in force; empty when off), `policy` (the run's step
//! policy, `policy::Policy` names: "synchronous" for the baseline), `assignment` (micro-batches
//! assigned to each rank in the step, space-separated in rank order; M each unless the policy
//! moves work), `dropped_tokens` (tokens of the dropped micro-batches over every rank: 0 unless
//! micro-batches carry token counts, the text job), `drop_rate` (the step's
//! `StepReport::drop_rate`: dropped / (computed + dropped) tokens when micro-batches carry
//! tokens, else micro-batches). Rows with `run` = "predicted" (after the DropCompute run's, when the baseline
//! was run) are the simulator's prediction of the DropCompute run step by step, next to the
//! measurement they predict ([`predicted_rows`]): `step_ms` its step time, `compute_ms` its
//! compute phase, `collective_ms` the step's overhead after the compute phase (the baseline's:
//! collective, rescale, optimizer), `computed` / `dropped` micro-batches (parts under a tail
//! shape, as in the run's rows), `divisor` the work computed in the run's unit (real tokens for
//! the text job, samples otherwise, as the run's rows), `loss` empty, `dropped_tokens` and
//! `drop_rate` empty (the replay's per-step drops are not in tokens yet).
#![forbid(unsafe_code)]

use std::path::Path;

use serde::{Deserialize, Serialize};

use dropcompute::schedule::StepReport;

/// One row of `steps.csv` (units in the field names: ms, micro-batches, samples, tokens).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// "baseline" or "dropcompute".
    pub run: String,
    /// 0-based optimizer step.
    pub step: u64,
    /// Step time, ms (rank 0's device time).
    pub step_ms: f64,
    /// Compute phase of the step (slowest rank), ms.
    pub compute_ms: f64,
    /// Rank 0's collective time without the wait, ms.
    pub collective_ms: f64,
    /// Micro-batches computed over every rank.
    pub computed: u64,
    /// Micro-batches dropped over every rank.
    pub dropped: u64,
    /// Normalization divisor of the summed gradient (samples; 0 when skipped).
    pub divisor: f64,
    /// Global mean training loss; `None` (empty cell) when not finite.
    pub loss: Option<f64>,
    /// Deadline in force, ms; `None` (empty cell) when off.
    pub threshold_ms: Option<f64>,
    /// The run's step policy (`policy::Policy::name`).
    pub policy: String,
    /// Micro-batches assigned per rank, space-separated in rank order ([`parse_assignment`]).
    pub assignment: String,
    /// Tokens of the dropped micro-batches over every rank (0 unless micro-batches carry
    /// token counts); `None` (empty cell) in the predicted rows.
    pub dropped_tokens: Option<u64>,
    /// The step's drop rate, a fraction (`StepReport::drop_rate`: in tokens when the
    /// micro-batches carry them, else in micro-batches); `None` (empty cell) in the predicted
    /// rows.
    pub drop_rate: Option<f64>,
}

/// The per-rank counts of an `assignment` cell.
///
/// # Errors
/// The first entry that is not a u32, as its text.
pub fn parse_assignment(cell: &str) -> Result<Vec<u32>, String> {
    cell.split_whitespace().map(|x| x.parse::<u32>().map_err(|_| x.to_owned())).collect()
}

/// The rows of one run (`policy`: its step policy's name) from rank 0's reports and the run's
/// per-step losses (indexed by step: a resumed run's losses include the steps before the
/// checkpoint).
pub fn rows(run: &str, policy: &str, reports: &[StepReport], loss: &[f64]) -> Vec<StepMetrics> {
    let ms = |ns: u64| ns as f64 / 1e6;
    reports
        .iter()
        .map(|r| StepMetrics {
            run: run.to_owned(),
            step: r.step,
            step_ms: ms(r.step_ns),
            compute_ms: ms(r.ranks.iter().map(|x| x.compute_ns).max().unwrap_or(r.compute_ns)),
            collective_ms: ms(r.collective_ns),
            computed: r.global_computed(),
            dropped: r.global_dropped(),
            divisor: r.divisor,
            loss: usize::try_from(r.step).ok().and_then(|s| loss.get(s)).copied().filter(|l| l.is_finite()),
            threshold_ms: r.threshold_ns.map(ms),
            policy: policy.to_owned(),
            assignment: r.assignment.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
            dropped_tokens: Some(r.global_dropped_tokens()),
            drop_rate: Some(r.drop_rate()),
        })
        .collect()
}

/// The "predicted" rows of the DropCompute run under `policy` at `threshold_ns` (module doc):
/// one per replayed step of `r` (a `summary::Prediction`'s replay), numbered from 0 (steps
/// beyond the baseline's are the replay's estimate), with the work it predicts per step,
/// `step_work` (the divisor column, in the run's unit: tokens for the text job, else samples;
/// 0 where unknown).
pub fn predicted_rows(
    policy: &str,
    r: &dropcompute::sim::policies::PolicyReplay,
    step_work: &[u64],
    threshold_ns: Option<u64>,
) -> Vec<StepMetrics> {
    let n = r.started.len() / r.per_step.len().max(1);
    r.per_step
        .iter()
        .enumerate()
        .map(|(s, &(_, step_ns, computed))| {
            let cells = s * n..(s + 1) * n;
            let handed: u64 = r.handed[cells.clone()].iter().map(|&x| u64::from(x)).sum();
            let compute_ns = r.compute_ns.get(s).copied().unwrap_or(f64::NAN);
            StepMetrics {
                run: "predicted".to_owned(),
                step: s as u64,
                step_ms: step_ns / 1e6,
                compute_ms: compute_ns / 1e6,
                collective_ms: (step_ns - compute_ns) / 1e6,
                computed,
                dropped: handed.saturating_sub(computed),
                divisor: step_work.get(s).copied().unwrap_or(0) as f64,
                loss: None,
                threshold_ms: threshold_ns.map(|ns| ns as f64 / 1e6),
                policy: policy.to_owned(),
                assignment: r.assigned[cells].iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
                dropped_tokens: None,
                drop_rate: None,
            }
        })
        .collect()
}

/// The CSV bytes (header first) of `rows`.
///
/// # Errors
/// The csv crate's error (not expected: the sink is memory).
pub fn to_csv(rows: &[StepMetrics]) -> Result<Vec<u8>, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    w.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// Reads a `steps.csv` file back.
///
/// # Errors
/// The csv crate's error (I/O, or a row that does not parse; it carries the line).
pub fn read_csv(path: &Path) -> Result<Vec<StepMetrics>, csv::Error> {
    csv::Reader::from_path(path)?.deserialize().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dropcompute::schedule::RankStepStats;

    #[test]
    fn rows_take_the_slowest_compute_and_global_counts_and_round_trip() {
        let stats =
            |computed, dropped, compute_ns| RankStepStats { computed, dropped, compute_ns, ..Default::default() };
        // Rank 1 dropped 2 micro-batches of 30 tokens; 90 computed over both ranks.
        let tok = |s: RankStepStats, tokens, dropped_tokens| RankStepStats { tokens, dropped_tokens, ..s };
        let r = |step, threshold_ns| StepReport {
            step,
            world_size: 2,
            threshold_ns,
            ranks: vec![stats(4, 0, 3_000_000), stats(2, 2, 5_500_000)],
            divisor: 48.0,
            compute_ns: 3_000_000,
            collective_ns: 250_000,
            step_ns: 7_000_000,
            assignment: vec![5, 3],
            ..Default::default()
        };
        let mut text = r(1, Some(5_000_000));
        text.ranks = vec![tok(stats(4, 0, 3_000_000), 60, 0), tok(stats(2, 2, 5_500_000), 30, 30)];
        let v = rows("dropcompute", "rebalance", &[r(0, None), text], &[2.5, f64::NAN]);
        assert_eq!((v[0].dropped_tokens, v[0].drop_rate), (Some(0), Some(2.0 / 8.0)), "micro-batches");
        assert_eq!((v[1].dropped_tokens, v[1].drop_rate), (Some(30), Some(30.0 / 120.0)), "tokens");
        assert_eq!((v[0].policy.as_str(), v[0].assignment.as_str()), ("rebalance", "5 3"));
        assert_eq!(parse_assignment(&v[1].assignment), Ok(vec![5, 3]));
        assert_eq!(parse_assignment("5 x"), Err("x".to_owned()));
        assert_eq!((v[0].compute_ms, v[0].collective_ms, v[0].step_ms), (5.5, 0.25, 7.0));
        assert_eq!((v[0].computed, v[0].dropped, v[0].divisor), (6, 2, 48.0));
        assert_eq!((v[0].loss, v[1].loss), (Some(2.5), None));
        assert_eq!((v[0].threshold_ms, v[1].threshold_ms), (None, Some(5.0)));
        let bytes = to_csv(&v).expect("csv");
        let text = String::from_utf8(bytes.clone()).expect("utf8");
        assert!(text.starts_with(
            "run,step,step_ms,compute_ms,collective_ms,computed,dropped,divisor,loss,threshold_ms,policy,assignment,\
             dropped_tokens,drop_rate\n"
        ));
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("steps.csv");
        std::fs::write(&f, bytes).expect("write");
        assert_eq!(read_csv(&f).expect("read"), v);
    }
}
