//! Per-micro-batch compute logs: ours (written by the scheduler) and the DropCompute
//! reference's `compute_logs_{rank}.csv`.
//!
//! Owns: [`ComputeLogRecord`] (the row the scheduler writes), [`ComputeLogWriter`], and the two
//! readers. Must not touch: tuning or scheduling logic.
//!
//! Column semantics (reference: `tensor_logging.save_drop_compute_logs`, digest §5):
//! global_step, local_step (micro-batch index within the step), world_size, batch (micro-batch
//! size, samples), sentence_length (tokens per sample), computed_batch (samples computed so far in
//! the step), compute_dropped (true once the deadline stopped this step), iteration_time_ms
//! (wall time of this micro-batch). Ours adds rank, start_ns (device time of the launch start,
//! ns on a per-rank monotonic clock), duration_ns, and what a run whose policy moves or drops
//! work needs to be read back: micro_batches (the run's nominal M), split, parts and cost (the
//! tail shape: a row holds parts/split of a micro-batch and is expected to take cost of a whole
//! one's device time), deadline_ns and clock_start_ns (the step's deadline and compute clock
//! start on the row's clock), bucket (the micro-batch's length bucket, for the length-aware
//! policies) and, only in a run whose unit of work is tokens, tokens (the row's real tokens).
//! Those columns are optional for the reader (empty or 0: not recorded), so older logs, the
//! Python writer's and the reference's load as before.
//!
//! Tokens likewise: a log whose every cell has its rows' tokens (a whole micro-batch's rows)
//! gives a trace with tokens ([`super::LatencyTrace::tokens`]), which the replay weighs its work
//! and drop rate by; else none, with a note when some were recorded.
//!
//! Buckets: a log whose every cell of the trace has a bucket (its first row's; a baseline run
//! launches every micro-batch) gives a length-carrying trace ([`super::LatencyTrace::buckets`]);
//! when some cell has none (a filled, unassigned cell; a log without the column) the trace has
//! no buckets and, when some were recorded, a note says so (the length-aware policies then
//! replay blind).
//!
//! # The trace of a log: N x M per step, every step kept
//!
//! The trace holds per step and rank M whole micro-batch latencies. Each (step, rank)'s rows,
//! in launch order, are grouped into whole micro-batches (a whole launch is one; `split` tail
//! launches or dropped parts make one); a launched row counts duration / cost (its
//! whole-micro-batch equivalent) times its share. A cell the log does not measure is filled,
//! never a reason to remove the step (removing the steps with drops biases the trace towards
//! steps without stragglers, the ones dropping is for):
//!
//! - *censored* (a dropped micro-batch or part): the scheduler never started it (a launched
//!   graph cannot be stopped), so nothing about its own latency was measured: not even a lower
//!   bound. The drop depends on the rank's earlier latencies in the step (the before check:
//!   elapsed >= threshold, so its would-be start is at or after the deadline, a bound of 0) and,
//!   with the predictive check, on the scheduler's estimate (deadline - would-be start is what
//!   it predicted the latency to exceed: a prediction, counted in the note, not applied). The
//!   cell takes the rank's mean whole-micro-batch latency over the log (its measured launches'
//!   device time over their whole-micro-batch equivalents, as the scheduler's
//!   `per_micro_batch_ns`): unbiased for draws independent of the drop decision, where the
//!   rank's mean in the step is not (the steps that drop are those whose measured micro-batches
//!   were slow). Measured on `train --ranks 4 --micro-batches 4 --steps 20 --slow-rank 1:2
//!   --time-mode virtual --warmup-steps 3` against the baseline's latency of the same draw
//!   (virtual time keys the draws alike): drop-predictive, 31 censored cells, true mean
//!   33.3 ms; the log mean fills 35.4 ms (mean absolute error 8.4 ms; the step mean's error:
//!   24.9 ms), the log mean raised to the predicted bound 37.0 ms (9.5 ms); drop-before 30
//!   cells, 31.0 ms true, 33.8 ms (7.0 ms; the step mean's: 25.9 ms). The comparison with the
//!   step mean is asserted by `tests/outputs_read_back.rs`.
//! - *unassigned* (M recorded, the rank was handed fewer than M: a rebalanced slow rank, the
//!   remainder of a tail part, a skipped backup worker with no row at all): the same mean.
//! - launches past the first M (a rebalanced fast rank, a compute budget's refill) are not in
//!   the trace; they count in the rank's means.
//!
//! A rank that measured nothing in the whole log is an error ([`TraceError::Unmeasured`]). Only
//! a cell with no row that M and the rows do not explain (old logs and the reference's: M is
//! the largest local_step + 1, a row missing below it; ours: a gap in local_step) makes a step
//! ragged: an error unless allowed, then the step is removed. Notes count every filled cell by
//! rule. The fill is an estimate: tune from the baseline run's log to see every latency.
//!
//! Overhead and start offsets (ours): with clock_start_ns, a rank's compute = end of its last
//! launch - clock start (the scheduler's), its start offset = that compute not spent in a launch,
//! the step period = the next step's clock start - this one's: the trace `train` builds from its
//! reports (`schedule::auto::trace_of_reports`) but for the last step's overhead (the median of the
//! others: the log records no end of the last update). Without it, offset 0, the first start
//! stands for the clock start and compute is the sum of the launches. The step period is the
//! mean over ranks of each rank's own period (start of step s+1 - start of step s): every rank
//! passes the step's collectives, so a rank's periods sum to the run's time, but when a rank
//! starts its clock after the collective varies (scheduling, optimizer, data); the max over
//! ranks took each step's latest start and summed that jitter into the overhead (4 processes on
//! 2 cores, examples/pytorch_ddp.py: +5.1 ms per 65 ms step, the prediction 4.7 % low).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{LoadOptions, Loaded, TraceBuilder, TraceError, open_maybe_gz};

/// The reference's eight columns, in order.
pub const REFERENCE_COLUMNS: [&str; 8] = [
    "global_step",
    "local_step",
    "world_size",
    "batch",
    "sentence_length",
    "computed_batch",
    "compute_dropped",
    "iteration_time_ms",
];

/// One scheduled micro-batch (or tail part) as the scheduler logs it (one CSV row; header =
/// field names). The last five columns say what the reader needs to rebuild the N x M matrix
/// of a run whose policy moves or drops work (module doc); each reads as "not recorded" when
/// absent or 0 (logs written before them, the Python writer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ComputeLogRecord {
    /// Global step index (0-based).
    pub global_step: u64,
    /// Launch index within the step on this rank (0-based; the micro-batch index when every
    /// launch is a whole micro-batch).
    pub local_step: u32,
    /// World size N.
    pub world_size: u32,
    /// Samples in this row (micro-batch size, or a tail part's).
    pub batch: u32,
    /// Tokens per sample (0 when not applicable).
    pub sentence_length: u32,
    /// Samples computed so far in this step on this rank, including this micro-batch if computed.
    pub computed_batch: u64,
    /// True if this micro-batch was dropped by the deadline (duration_ns is then 0).
    pub compute_dropped: bool,
    /// Latency in milliseconds (duration_ns / 1e6), the reference's column.
    pub iteration_time_ms: f64,
    /// Rank that ran it.
    pub rank: u32,
    /// Device time at start (ns, per-rank monotonic clock); for a dropped row, when it was
    /// dropped (the end of the last started launch, or the step's compute clock start).
    pub start_ns: u64,
    /// Device latency (ns; 0 if dropped).
    pub duration_ns: u64,
    /// Nominal micro-batches per rank per step M of the run (0: not recorded).
    #[serde(default)]
    pub micro_batches: u32,
    /// Parts per micro-batch of the run's tail shape (`policy::TailShape::parts`; 0 or 1:
    /// whole micro-batches only).
    #[serde(default)]
    pub split: u32,
    /// Parts of a micro-batch this row holds: `split` for a whole micro-batch, 1 for a tail
    /// micro-batch or a dropped part (0: not recorded, read as `split`).
    #[serde(default)]
    pub parts: u32,
    /// This row's expected device time as a fraction of a whole micro-batch's: 1 for a whole
    /// one, the tail cost (`policy::TailShape::cost_fraction`) for a tail micro-batch or a
    /// dropped part (0: not recorded, read as parts / split).
    #[serde(default)]
    pub cost: f64,
    /// Device time (ns, the `start_ns` clock) of this step's deadline on this rank: its
    /// compute clock start plus the threshold in force (0: none, or not recorded).
    #[serde(default)]
    pub deadline_ns: u64,
    /// Device time (ns, the `start_ns` clock) of this step's compute clock start on this rank
    /// (the end of the previous update): with it the reader derives the step's start offsets
    /// and overhead as `train` does from its reports (module doc). `None` (an empty field):
    /// not recorded.
    #[serde(default)]
    pub clock_start_ns: Option<u64>,
    /// The micro-batch's length bucket (the job's index of its padded length, ascending in
    /// length); `None` (an empty field): not a bucketed job, or not recorded.
    #[serde(default)]
    pub bucket: Option<u32>,
    /// Real (non-padding) tokens of the row's micro-batch or part, when the run's unit of work
    /// is tokens (`schedule::Weighting::Tokens`). `None` is not written at all (no column): a
    /// run's rows carry it on every row or on none, so a run weighing samples writes the
    /// columns it wrote before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// Writes [`ComputeLogRecord`]s as CSV with a header.
pub struct ComputeLogWriter<W: Write> {
    inner: csv::Writer<W>,
}

impl<W: Write> ComputeLogWriter<W> {
    /// Wrap a sink; the header is written with the first record.
    pub fn new(sink: W) -> Self {
        Self { inner: csv::Writer::from_writer(sink) }
    }
    /// Append one row. Errors: the csv crate's error (I/O).
    pub fn write(&mut self, rec: &ComputeLogRecord) -> Result<(), csv::Error> {
        self.inner.serialize(rec)
    }
    /// Flush buffered rows. Errors: I/O.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }

    /// Flushes and returns the sink.
    ///
    /// # Errors
    /// The sink's flush error.
    pub fn into_inner(self) -> std::io::Result<W> {
        self.inner.into_inner().map_err(|e| e.into_error())
    }
}

/// First CSV record of a file (header, or first data row if headerless).
/// Errors: [`TraceError::Input`] / [`TraceError::Malformed`] (line 1).
pub fn read_header(path: &Path) -> Result<Vec<String>, TraceError> {
    header_of(open_maybe_gz(path)?, path)
}

/// [`read_header`] of an open reader; `path` labels errors.
fn header_of(src: impl std::io::Read, path: &Path) -> Result<Vec<String>, TraceError> {
    let mut r = csv::ReaderBuilder::new().has_headers(false).from_reader(src);
    let mut rec = csv::StringRecord::new();
    match r.read_record(&mut rec) {
        Ok(_) => Ok(rec.iter().map(|s| s.trim().to_string()).collect()),
        Err(e) => Err(super::csv_error(path, 1, "(header)", e)),
    }
}

/// True for our header, the reference header, or a headerless 8-column numeric reference log.
pub fn is_compute_log_header(h: &[String]) -> bool {
    let names: Vec<&str> = h.iter().map(String::as_str).collect();
    names.len() >= 8 && names[..8] == REFERENCE_COLUMNS || (names.len() == 8 && names[0].parse::<u64>().is_ok())
}

/// Rank from a reference file name `compute_logs_{rank}.csv[.gz]`.
pub fn rank_from_file_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gz").unwrap_or(name);
    stem.strip_suffix(".csv")?.strip_prefix("compute_logs_")?.parse().ok()
}

fn field<'a>(rec: &'a csv::StringRecord, idx: usize, path: &Path, line: u64, col: &str) -> Result<&'a str, TraceError> {
    rec.get(idx).map(str::trim).ok_or_else(|| TraceError::Malformed {
        path: path.into(),
        line,
        column: col.into(),
        message: format!("missing field (row has {} fields)", rec.len()),
    })
}

fn parse<T: std::str::FromStr>(s: &str, path: &Path, line: u64, col: &str) -> Result<T, TraceError>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| TraceError::Malformed {
        path: path.into(),
        line,
        column: col.into(),
        message: format!("cannot parse {s:?}: {e}"),
    })
}

fn parse_bool(s: &str, path: &Path, line: u64) -> Result<bool, TraceError> {
    match s {
        "1" | "true" | "True" | "TRUE" => Ok(true),
        "0" | "false" | "False" | "FALSE" => Ok(false),
        _ => Err(TraceError::Malformed {
            path: path.into(),
            line,
            column: "compute_dropped".into(),
            message: format!("expected a boolean, got {s:?}"),
        }),
    }
}

/// Load and merge compute logs (ours and/or the reference's) into one trace keyed by rank.
/// Ours: latency = duration_ns; overhead of step s = the mean over ranks of (start of step s+1 -
/// start of step s) - max over ranks of the compute measured in step s (the launched rows'
/// durations, or the end of the last launch - the clock start); the last step gets the median
/// of the others (noted). The mean, not the max, of the periods: each rank's periods sum to the
/// run's time, while the max adds every step's latest clock start (module doc). Reference: latency =
/// iteration_time_ms · 1e6, rank from the file name, overhead = `opts.reference_overhead_ns`
/// (noted). Every cell the log does not measure (a dropped micro-batch, a part of one, or one
/// the policy did not assign) is filled by the module's rule and counted in a note; no step is
/// removed for it.
///
/// # Errors
/// Malformed fields with file, line and column (`micro_batches` larger than any rank's rows in
/// any step, `parts` above `split`, `cost` outside (0, 1]); a reference file whose name
/// carries no rank; duplicates; ragged steps unless allowed ([`TraceError::Ragged`],
/// [`TraceError::NoCompleteStep`]); a rank with no measured latency in the whole log
/// ([`TraceError::Unmeasured`]); no row at all ([`TraceError::Empty`]).
pub fn load_logs(paths: &[PathBuf], opts: &LoadOptions) -> Result<Loaded, TraceError> {
    load_logs_with(paths, opts, open_maybe_gz)
}

/// [`load_logs`] of one compute log held in memory (plain CSV, not gzipped): for fuzzing and
/// property tests. `name` labels errors and, for the reference format, gives the rank
/// (`compute_logs_{rank}.csv`). Errors: as [`load_logs`].
pub fn load_log_bytes(name: &Path, bytes: &[u8], opts: &LoadOptions) -> Result<Loaded, TraceError> {
    load_logs_with(&[name.to_path_buf()], opts, |_| Ok(Box::new(bytes)))
}

/// Most cells (steps x ranks x M) the reader builds for a log with M recorded, whose rank-steps
/// without a row are filled (a skipped backup worker): 2^28 (2 GiB of latencies), far above a
/// real run's (10 000 ranks x 64 micro-batches x 400 steps), so that a file declaring many
/// ranks and steps is refused instead of exhausting memory.
pub const MAX_FILLED_CELLS: usize = 1 << 28;

/// One parsed row of a compute log (ours or the reference's).
#[derive(Clone, Copy, Debug)]
struct Row {
    /// Index of its file in the inputs, and its physical line.
    file: usize,
    line: u64,
    /// `local_step`.
    mb: u32,
    dropped: bool,
    /// Device latency (ns; 0 when dropped).
    latency_ns: f64,
    /// Start (ns; ours only).
    start_ns: Option<u64>,
    /// Fraction of a whole micro-batch the row holds (parts / split).
    fraction: f64,
    /// Expected device time as a fraction of a whole micro-batch's.
    cost: f64,
    /// The step's deadline on the row's clock (ns; 0: none or not recorded).
    deadline_ns: u64,
    /// The step's compute clock start on the row's clock (ns; `None`: not recorded).
    clock_start_ns: Option<u64>,
    /// The micro-batch's length bucket (`None`: not recorded).
    bucket: Option<u32>,
    /// The row's real tokens (`None`: not recorded).
    tokens: Option<u64>,
}

/// One whole micro-batch of a rank-step built from its rows in launch order (a whole launch,
/// or `split` parts: tail launches and dropped parts).
#[derive(Clone, Copy, Debug)]
struct Cell {
    /// Measured whole-micro-batch-equivalent time of its launched rows (ns: duration / cost x
    /// share).
    measured_ns: f64,
    /// Share of the micro-batch dropped (censored).
    censored: f64,
    /// Share covered by rows (below 1 for the last cell of a partly assigned micro-batch).
    covered: f64,
    /// Start of its first row (ns), the deadline of its step (ns; 0: none).
    start_ns: Option<u64>,
    deadline_ns: u64,
    /// File index and line of its first row.
    file: usize,
    line: u64,
    /// Its first row's bucket.
    bucket: Option<u32>,
    /// Its rows' real tokens summed (`None` when a row has none).
    tokens: Option<u64>,
}

impl Cell {
    fn start(x: &Row) -> Self {
        let mut c = Cell {
            measured_ns: 0.0,
            censored: 0.0,
            covered: 0.0,
            start_ns: x.start_ns,
            deadline_ns: x.deadline_ns,
            file: x.file,
            line: x.line,
            bucket: x.bucket,
            tokens: Some(0),
        };
        c.add(x);
        c
    }

    fn add(&mut self, x: &Row) {
        self.covered += x.fraction;
        self.tokens = self.tokens.zip(x.tokens).map(|(a, b)| a.saturating_add(b));
        if x.dropped {
            self.censored += x.fraction;
        } else {
            self.measured_ns += x.latency_ns / x.cost * x.fraction;
        }
    }
}

/// What the fill rule did, for the note.
#[derive(Debug, Default)]
struct FillCounts {
    /// Cells holding a dropped micro-batch or part (censored), and the steps they are in.
    censored: usize,
    censored_steps: std::collections::BTreeSet<u64>,
    /// Censored cells whose scheduler's prediction (deadline - start) exceeds the fill.
    predicted_above: usize,
    /// Cells (or the rest of a partly assigned one) the policy did not assign.
    unassigned: usize,
    /// Measured micro-batches past the nominal M (not in the trace; in the rank's means).
    beyond_m: usize,
    /// Tail launches grouped into whole micro-batches.
    tail_launches: usize,
}

fn load_logs_with<'a>(
    paths: &[PathBuf],
    opts: &LoadOptions,
    open: impl Fn(&Path) -> Result<Box<dyn std::io::Read + 'a>, TraceError> + 'a,
) -> Result<Loaded, TraceError> {
    let mut seen = TraceBuilder::new();
    let mut notes = Vec::new();
    let mut rows: BTreeMap<(u64, u32), Vec<Row>> = BTreeMap::new();
    let mut any_reference = false;
    // The largest declared M (ours, recorded) and the largest micro-batch index of any row.
    let mut declared_m: Option<(u32, usize, u64)> = None;
    let mut max_mb: Option<u32> = None;
    for (file, path) in paths.iter().enumerate() {
        let header = header_of(open(path)?, path)?;
        let has_header = header.first().is_some_and(|h| h == "global_step");
        let ours = has_header && header.len() >= 11 && header[8..11] == ["rank", "start_ns", "duration_ns"];
        let file_rank = rank_from_file_name(path);
        if !ours && file_rank.is_none() {
            return Err(TraceError::Malformed {
                path: path.clone(),
                line: 1,
                column: "rank".into(),
                message: "reference compute logs carry no rank column: name the file compute_logs_{rank}.csv".into(),
            });
        }
        any_reference |= !ours;
        let col = |name: &str| if ours { header.iter().position(|h| h == name) } else { None };
        let (m_col, split_col, parts_col, cost_col, deadline_col, clock_col) =
            (col("micro_batches"), col("split"), col("parts"), col("cost"), col("deadline_ns"), col("clock_start_ns"));
        let (bucket_col, tokens_col) = (col("bucket"), col("tokens"));
        let (src, lines) = crate::csv_lines::LineIndex::new(open(path)?);
        let mut r = csv::ReaderBuilder::new().has_headers(has_header).flexible(true).from_reader(src);
        super::for_each_record(&mut r, &lines, path, |line, rec| {
            let step: u64 = parse(field(rec, 0, path, line, "global_step")?, path, line, "global_step")?;
            let mb: u32 = parse(field(rec, 1, path, line, "local_step")?, path, line, "local_step")?;
            let dropped = parse_bool(field(rec, 6, path, line, "compute_dropped")?, path, line)?;
            // Every column is parsed, used or not: a malformed value is an error at its column,
            // never a silently skipped cell.
            for (idx, col) in [(2, "world_size"), (3, "batch"), (4, "sentence_length")] {
                parse::<u32>(field(rec, idx, path, line, col)?, path, line, col)?;
            }
            parse::<u64>(field(rec, 5, path, line, "computed_batch")?, path, line, "computed_batch")?;
            let ms: f64 = parse(field(rec, 7, path, line, "iteration_time_ms")?, path, line, "iteration_time_ms")?;
            let bad = |column: &str, message: String| TraceError::Malformed {
                path: path.into(),
                line,
                column: column.into(),
                message,
            };
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(bad("iteration_time_ms", format!("{ms} ms is negative or not finite")));
            }
            max_mb = max_mb.max(Some(mb));
            let opt = |c: Option<usize>, name: &str| -> Result<Option<&str>, TraceError> {
                c.map(|i| field(rec, i, path, line, name)).transpose()
            };
            let m: u32 = opt(m_col, "micro_batches")?.map_or(Ok(0), |v| parse(v, path, line, "micro_batches"))?;
            let split: u32 = opt(split_col, "split")?.map_or(Ok(0), |v| parse(v, path, line, "split"))?.max(1);
            let parts: u32 = opt(parts_col, "parts")?.map_or(Ok(0), |v| parse(v, path, line, "parts"))?;
            let parts = if parts == 0 { split } else { parts };
            if parts > split {
                return Err(bad("parts", format!("{parts} parts in a row of a micro-batch of split {split}")));
            }
            let fraction = f64::from(parts) / f64::from(split);
            let cost: f64 = opt(cost_col, "cost")?.map_or(Ok(0.0), |v| parse(v, path, line, "cost"))?;
            let cost = if cost == 0.0 { fraction } else { cost };
            if !(cost.is_finite() && cost > 0.0 && cost <= 1.0) {
                return Err(bad("cost", format!("{cost} is not in (0, 1]")));
            }
            let deadline_ns: u64 =
                opt(deadline_col, "deadline_ns")?.map_or(Ok(0), |v| parse(v, path, line, "deadline_ns"))?;
            let clock_start_ns: Option<u64> = opt(clock_col, "clock_start_ns")?
                .filter(|v| !v.is_empty())
                .map(|v| parse(v, path, line, "clock_start_ns"))
                .transpose()?;
            let bucket: Option<u32> = opt(bucket_col, "bucket")?
                .filter(|v| !v.is_empty())
                .map(|v| parse(v, path, line, "bucket"))
                .transpose()?;
            let tokens: Option<u64> = opt(tokens_col, "tokens")?
                .filter(|v| !v.is_empty())
                .map(|v| parse(v, path, line, "tokens"))
                .transpose()?;
            if m > 0 && declared_m.is_none_or(|(d, _, _)| m > d) {
                declared_m = Some((m, file, line));
            }
            let (rank, start_ns, latency_ns) = if ours {
                let rank: u32 = parse(field(rec, 8, path, line, "rank")?, path, line, "rank")?;
                let start: u64 = parse(field(rec, 9, path, line, "start_ns")?, path, line, "start_ns")?;
                let dur: u64 = parse(field(rec, 10, path, line, "duration_ns")?, path, line, "duration_ns")?;
                (rank, Some(start), dur as f64)
            } else {
                (file_rank.unwrap_or(0), None, ms * 1e6)
            };
            // Duplicates (step, rank, local_step) are found once, by the builder.
            seen.insert(path, line, step, rank, mb, 0.0)?;
            let latency_ns = if dropped { 0.0 } else { latency_ns };
            rows.entry((step, rank)).or_default().push(Row {
                file,
                line,
                mb,
                dropped,
                latency_ns,
                start_ns,
                fraction,
                cost,
                deadline_ns,
                clock_start_ns,
                bucket,
                tokens,
            });
            Ok(())
        })?;
    }
    let source = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(",");
    if rows.is_empty() {
        return Err(TraceError::Empty(source));
    }
    for v in rows.values_mut() {
        v.sort_by_key(|r| r.mb);
    }
    // Whole micro-batches a rank-step's rows cover (each row parts / split of one).
    let covered = |v: &[Row]| v.iter().map(|r| r.fraction).sum::<f64>();
    // A declared M larger than what any rank was handed in any step is no M of this log (every
    // policy hands some rank at least M in every step); refusing it also bounds the fill.
    if let Some((m, file, line)) = declared_m {
        let most = rows.values().map(|v| covered(v)).fold(0.0, f64::max);
        if f64::from(m) > most + 1e-9 {
            return Err(TraceError::Malformed {
                path: paths[file].clone(),
                line,
                column: "micro_batches".into(),
                message: format!("{m} micro-batches, but no rank holds more than {most} in any step"),
            });
        }
    }
    let m = declared_m.map_or_else(|| max_mb.map_or(0, |x| x as usize + 1), |(m, _, _)| m as usize);
    // Per rank: measured device time and whole-micro-batch equivalents over the whole log
    // (sum of latencies / sum of costs: as `schedule::per_micro_batch_ns`).
    let mean_of = |v: &mut dyn Iterator<Item = &Row>| -> Option<f64> {
        let (sum, eq) = v.filter(|r| !r.dropped).fold((0.0, 0.0), |(s, e), r| (s + r.latency_ns, e + r.cost));
        (eq > 0.0).then(|| sum / eq)
    };
    let mut by_rank: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    for (&(_, r), v) in &rows {
        by_rank.entry(r).or_default().extend_from_slice(v);
    }
    let log_mean: BTreeMap<u32, f64> =
        by_rank.iter().filter_map(|(&r, v)| Some((r, mean_of(&mut v.iter())?))).collect();
    let ranks: std::collections::BTreeSet<u32> = by_rank.keys().copied().collect();
    drop(by_rank);
    let steps: std::collections::BTreeSet<u64> = rows.keys().map(|k| k.0).collect();
    let mut b = TraceBuilder::new();
    b.expect_micro_batches(m);
    let mut counts = FillCounts::default();
    // Measured compute per (rank, step) (ns) and first start, for the overhead.
    let mut measured: BTreeMap<(u32, u64), f64> = BTreeMap::new();
    let mut starts: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut offsets: BTreeMap<(u32, u64), f64> = BTreeMap::new();
    // The bucket (real tokens) of each (step, rank, micro-batch) cell that has one.
    let mut bucket_of: BTreeMap<(u64, u32, u32), u32> = BTreeMap::new();
    let mut tokens_of: BTreeMap<(u64, u32, u32), u64> = BTreeMap::new();
    // The rank-steps to build: every one when M is recorded (a rank with no row in a step, a
    // skipped backup worker, is filled: bounded by MAX_FILLED_CELLS), else those with rows (a
    // missing one is ragged, found by the builder without materializing its cells).
    let pairs: Vec<(u64, u32)> = if declared_m.is_some() {
        let cells = steps.len().saturating_mul(ranks.len()).saturating_mul(m);
        if cells > MAX_FILLED_CELLS {
            return Err(TraceError::Shape(format!(
                "{source}: {} steps x {} ranks x {m} micro-batches = {cells} cells, above the {MAX_FILLED_CELLS} a filled compute log may have",
                steps.len(),
                ranks.len()
            )));
        }
        steps.iter().flat_map(|&s| ranks.iter().map(move |&r| (s, r))).collect()
    } else {
        rows.keys().copied().collect()
    };
    for (s, r) in pairs {
        let v: &[Row] = rows.get(&(s, r)).map_or(&[], Vec::as_slice);
        let launched = v.iter().filter(|x| !x.dropped);
        let busy: f64 = launched.clone().map(|x| x.latency_ns).sum();
        // With the clock start recorded: compute = end of the last launch - clock start
        // (as the scheduler's), the offset = the compute time not spent in a launch; else
        // the launches' sum, offset 0, and the first start stands for the clock start.
        let clock = v.iter().find_map(|x| x.clock_start_ns);
        let last_end = launched.clone().filter_map(|x| x.start_ns.map(|t| t as f64 + x.latency_ns)).reduce(f64::max);
        match (clock, last_end) {
            (Some(c), Some(end)) => {
                let compute = (end - c as f64).max(busy);
                measured.insert((r, s), compute);
                offsets.insert((r, s), compute - busy);
            }
            _ => {
                measured.insert((r, s), busy);
            }
        }
        if let Some(t) = clock.or_else(|| launched.clone().filter_map(|x| x.start_ns).min()) {
            starts.insert((r, s), t);
        }
        counts.tail_launches += launched.filter(|x| x.fraction < 1.0).count();
        let contiguous = v.iter().enumerate().all(|(i, x)| x.mb as usize == i);
        // The fill: the rank's mean over the log (module doc: not the step's, which the drop
        // decision selected).
        let estimate = || -> Result<f64, TraceError> {
            log_mean.get(&r).copied().ok_or_else(|| TraceError::Unmeasured { source_name: source.clone(), rank: r })
        };
        if declared_m.is_none() || !contiguous {
            // One row, one cell at its index (the reference's layout, and a ragged
            // rank-step of ours); cells without a row are missing (ragged).
            let mut first = true;
            for x in v {
                let path = &paths[x.file];
                let value = if x.dropped {
                    let e = estimate()? * x.fraction;
                    counts.censored += 1;
                    counts.censored_steps.insert(s);
                    counts.predicted_above += usize::from(predicted(x.deadline_ns, x.start_ns, first) > e);
                    first = false;
                    e
                } else {
                    x.latency_ns / x.cost * x.fraction
                };
                if (x.mb as usize) < m {
                    b.insert(path, x.line, s, r, x.mb, value)?;
                    if let Some(k) = x.bucket {
                        bucket_of.insert((s, r, x.mb), k);
                    }
                    if let (Some(t), true) = (x.tokens, x.fraction >= 1.0) {
                        tokens_of.insert((s, r, x.mb), t);
                    }
                } else if !x.dropped {
                    counts.beyond_m += 1;
                }
            }
            continue;
        }
        // Our log with M recorded and a contiguous rank-step: rows grouped, in launch
        // order, into whole micro-batches (a whole launch is one; `split` parts make one).
        let mut cells: Vec<Cell> = Vec::new();
        for x in v {
            match cells.last_mut() {
                Some(c) if c.covered < 1.0 - 1e-9 => c.add(x),
                _ => cells.push(Cell::start(x)),
            }
        }
        let mut first_censored = true;
        for (i, c) in cells.iter().enumerate().take(m) {
            let filled = c.censored + (1.0 - c.covered).max(0.0);
            let value = if filled > 1e-9 {
                let value = c.measured_ns + filled * estimate()?;
                if c.censored > 0.0 {
                    counts.censored += 1;
                    counts.censored_steps.insert(s);
                    counts.predicted_above += usize::from(predicted(c.deadline_ns, c.start_ns, first_censored) > value);
                    first_censored = false;
                } else {
                    counts.unassigned += 1;
                }
                value
            } else {
                c.measured_ns
            };
            b.insert(&paths[c.file], c.line, s, r, i as u32, value)?;
            if let Some(k) = c.bucket {
                bucket_of.insert((s, r, i as u32), k);
            }
            if let (Some(t), true) = (c.tokens, c.covered >= 1.0 - 1e-9) {
                tokens_of.insert((s, r, i as u32), t);
            }
        }
        counts.beyond_m += cells.iter().skip(m).filter(|c| c.measured_ns > 0.0).count();
        // Cells the policy did not hand this rank (rebalanced, or a skipped backup worker).
        for i in cells.len()..m {
            let e = estimate()?;
            counts.unassigned += 1;
            let (file, line) = v.first().map_or((0, 0), |x| (x.file, x.line));
            b.insert(&paths[file], line, s, r, i as u32, e)?;
        }
    }
    if any_reference {
        notes.push(format!(
            "reference compute logs record no step wall time: assuming overhead {:.3} ms per step",
            opts.reference_overhead_ns / 1e6
        ));
        for &s in &steps {
            b.set_overhead(s, opts.reference_overhead_ns);
        }
    }
    notes.extend(fill_notes(&counts, m));
    // Steps with a cell that no row explains are ragged: an error unless allowed, then removed.
    let split = b.split(&source)?;
    let ragged = &split.report.dropped_steps;
    let missing_cells = ragged.iter().map(|&(_, n)| n).fold(0, usize::saturating_add);
    let (mut trace, completeness) = match split.trace {
        Some(_) | None if !ragged.is_empty() && !opts.allow_incomplete_steps => {
            return Err(TraceError::Ragged {
                source_name: source,
                count: missing_cells,
                missing: split.report.missing_examples,
            });
        }
        None => {
            return Err(TraceError::NoCompleteStep {
                source_name: source,
                steps: steps.len(),
                ragged_steps: ragged.len(),
                missing_cells,
                missing: split.report.missing_examples,
            });
        }
        Some(t) => (t, split.report),
    };
    if !any_reference && trace.num_steps() >= 2 {
        let mut overhead = Vec::with_capacity(trace.num_steps());
        for &s in trace.steps() {
            // The mean over ranks of each rank's own period: every rank passes the step's
            // collectives, so each rank's periods sum to the run's time and their mean is the
            // step's; a rank's clock start lands anywhere after the collective (scheduling,
            // the optimizer, the data), and the max over ranks summed that jitter as overhead
            // (examples/pytorch_ddp.py, 4 processes on 2 cores: +5.1 ms a step, 7.8 %).
            let periods: Vec<f64> = trace
                .ranks()
                .iter()
                .filter_map(|&r| {
                    let a = starts.get(&(r, s))?;
                    let z = starts.get(&(r, s + 1))?;
                    Some(z.saturating_sub(*a) as f64)
                })
                .collect();
            let period = if periods.is_empty() { f64::NAN } else { periods.iter().sum::<f64>() / periods.len() as f64 };
            let max_c = trace.ranks().iter().filter_map(|&r| measured.get(&(r, s))).copied().fold(0.0, f64::max);
            overhead.push(if period.is_nan() { f64::NAN } else { (period - max_c).max(0.0) });
        }
        let known: Vec<f64> = overhead.iter().copied().filter(|v| !v.is_nan()).collect();
        let mut sorted = known.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        let filled = overhead.iter().filter(|v| v.is_nan()).count();
        if filled > 0 {
            notes.push(format!(
                "{filled} step(s) without a following step: overhead set to the median of the others ({:.3} ms)",
                median / 1e6
            ));
        }
        let overhead: Vec<f64> = overhead.into_iter().map(|v| if v.is_nan() { median } else { v }).collect();
        trace = trace.with_overhead(overhead)?;
    }
    if !offsets.is_empty() {
        let off: Vec<f64> = trace
            .steps()
            .iter()
            .flat_map(|&s| trace.ranks().iter().map(move |&r| (r, s)))
            .map(|k| offsets.get(&k).copied().unwrap_or(0.0))
            .collect();
        trace = trace.with_start_offsets(off)?;
    }
    if !bucket_of.is_empty() {
        let m = trace.micro_batches() as u32;
        let cells: Vec<Option<u32>> = trace
            .steps()
            .iter()
            .flat_map(|&s| trace.ranks().iter().flat_map(move |&r| (0..m).map(move |i| (s, r, i))))
            .map(|k| bucket_of.get(&k).copied())
            .collect();
        let missing = cells.iter().filter(|c| c.is_none()).count();
        if missing == 0 {
            trace = trace.with_buckets(cells.into_iter().flatten().collect())?;
        } else {
            notes.push(format!(
                "{missing} of {} micro-batches have no bucket (a cell the policy did not hand out, or a row without one): \
                 the trace carries none, so the length-aware policies (length-predictive, cost-balance) replay blind, \
                 as drop-predictive",
                cells.len()
            ));
        }
    }
    if !tokens_of.is_empty() {
        let m = trace.micro_batches() as u32;
        let cells: Vec<Option<u64>> = trace
            .steps()
            .iter()
            .flat_map(|&s| trace.ranks().iter().flat_map(move |&r| (0..m).map(move |i| (s, r, i))))
            .map(|k| tokens_of.get(&k).copied())
            .collect();
        let missing = cells.iter().filter(|c| c.is_none()).count();
        if missing == 0 {
            trace = trace.with_tokens(cells.into_iter().flatten().collect())?;
        } else {
            notes.push(format!(
                "{missing} of {} micro-batches have no token count: the trace carries none (the replay counts micro-batches, not tokens)",
                cells.len()
            ));
        }
    }
    Ok(Loaded { trace, completeness, notes })
}

/// What the drop of a rank-step's first censored cell says about its latency (ns): the time
/// from its would-be start to the step's deadline, which the scheduler expected it to exceed
/// (the predictive check's estimate; with the before check it would start at or after the
/// deadline: 0). A prediction, not a measurement (module doc): reported, not applied. 0 for
/// the later censored cells and when the deadline or the start is not recorded.
fn predicted(deadline_ns: u64, start_ns: Option<u64>, first: bool) -> f64 {
    match start_ns {
        Some(t) if first && deadline_ns > 0 => deadline_ns.saturating_sub(t) as f64,
        _ => 0.0,
    }
}

/// The notes saying what the fill rule did (none when every cell was measured).
fn fill_notes(c: &FillCounts, m: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if c.censored > 0 {
        notes.push(format!(
            "{} censored cell(s) in {} step(s) (a dropped micro-batch or part: never started, its latency is unknown) kept, not removed: \
             filled with the rank's mean micro-batch latency over the log; in {} of them the scheduler had predicted more \
             (deadline - start, not applied: a prediction, not a measurement)",
            c.censored,
            c.censored_steps.len(),
            c.predicted_above
        ));
    }
    if c.unassigned > 0 {
        notes.push(format!(
            "{} cell(s) of the nominal {m} micro-batches per rank the policy did not assign (rebalanced or skipped ranks) \
             filled with the rank's mean micro-batch latency over the log",
            c.unassigned
        ));
    }
    if c.beyond_m > 0 {
        notes.push(format!(
            "{} measured micro-batch(es) past the nominal {m} per rank not in the trace (they count in the rank's means)",
            c.beyond_m
        ));
    }
    if c.tail_launches > 0 {
        notes.push(format!(
            "{} tail launch(es) grouped into whole micro-batches (each counts duration / cost x its share of one)",
            c.tail_launches
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh temporary directory, removed when the returned guard drops.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("dropcompute-trace-{name}-")).tempdir().expect("temp dir")
    }

    #[test]
    fn our_log_round_trips_and_derives_overhead() {
        let dir = tmp("ours");
        let path = dir.path().join("log.csv");
        let mut w = ComputeLogWriter::new(std::fs::File::create(&path).expect("create"));
        // 2 ranks, 2 steps, M = 2; step period 100 ns, rank 1 slower.
        for step in 0..2u64 {
            for rank in 0..2u32 {
                let mut t = step * 100;
                for mb in 0..2u32 {
                    let dur = 10 + u64::from(rank) * 5 + u64::from(mb);
                    w.write(&ComputeLogRecord {
                        global_step: step,
                        local_step: mb,
                        world_size: 2,
                        batch: 4,
                        sentence_length: 0,
                        computed_batch: u64::from(mb + 1) * 4,
                        compute_dropped: false,
                        iteration_time_ms: dur as f64 / 1e6,
                        rank,
                        start_ns: t,
                        duration_ns: dur,
                        ..ComputeLogRecord::default()
                    })
                    .expect("write");
                    t += dur;
                }
            }
        }
        w.flush().expect("flush");
        drop(w);
        let l = load_logs(&[path], &LoadOptions::default()).expect("load");
        assert_eq!(l.trace.world_size(), 2);
        assert_eq!(l.trace.micro_batches(), 2);
        assert_eq!(l.trace.step_matrix(1), &[10.0, 11.0, 15.0, 16.0]);
        // Step 0: period 100, max compute 31 -> overhead 69; step 1 takes the median (69).
        assert_eq!(l.trace.overhead_ns(), &[69.0, 69.0]);
        assert_eq!(l.notes.len(), 1);
    }

    /// The writer's exact output: the reference's eight columns in the reference's order (its
    /// readers go by position), then rank, start_ns, duration_ns; every field in its own column.
    #[test]
    fn writer_puts_each_field_in_its_column_in_the_reference_order() {
        let mut w = ComputeLogWriter::new(Vec::new());
        let rec = ComputeLogRecord {
            global_step: 7,
            local_step: 2,
            world_size: 3,
            batch: 16,
            sentence_length: 128,
            computed_batch: 48,
            compute_dropped: true,
            iteration_time_ms: 0.25,
            rank: 1,
            start_ns: 9_000,
            duration_ns: 250_000,
            micro_batches: 4,
            split: 2,
            parts: 1,
            cost: 0.5,
            deadline_ns: 99_000,
            clock_start_ns: Some(8_000),
            bucket: Some(3),
            tokens: None,
        };
        w.write(&rec).expect("write");
        let text = String::from_utf8(w.into_inner().expect("flush")).expect("utf8");
        let mut lines = text.lines();
        let header = lines.next().expect("header");
        let ours = ["rank", "start_ns", "duration_ns", "micro_batches", "split", "parts", "cost", "deadline_ns"];
        assert_eq!(header, [&REFERENCE_COLUMNS[..], &ours, &["clock_start_ns", "bucket"]].concat().join(","));
        assert_eq!(lines.next(), Some("7,2,3,16,128,48,true,0.25,1,9000,250000,4,2,1,0.5,99000,8000,3"));
        assert_eq!(lines.next(), None);
        let h = |s: &str| s.split(',').map(String::from).collect::<Vec<_>>();
        assert!(is_compute_log_header(&h(header)));
        // The reference header alone, and a headerless reference row (8 fields, numeric step).
        assert!(is_compute_log_header(&h(&REFERENCE_COLUMNS.join(","))));
        assert!(is_compute_log_header(&h("6,0,16,16,128,16,False,500.5")));
        // Anything else is not a compute log.
        assert!(!is_compute_log_header(&h("global_step,local_step,world_size")));
        assert!(!is_compute_log_header(&h(
            "step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms"
        )));
        assert!(!is_compute_log_header(&h("x,0,16,16,128,16,False,500.5")));
        assert!(!is_compute_log_header(&h("6,0,16,16,128,16,False,500.5,9")));
    }

    /// `flush` makes the rows written so far visible in the sink while the writer lives.
    #[test]
    fn flush_writes_the_rows_through() {
        let dir = tmp("flush");
        let path = dir.path().join("log.csv");
        let mut w = ComputeLogWriter::new(std::fs::File::create(&path).expect("create"));
        let rec = ComputeLogRecord {
            global_step: 1,
            local_step: 0,
            world_size: 2,
            batch: 4,
            sentence_length: 0,
            computed_batch: 4,
            compute_dropped: false,
            iteration_time_ms: 0.5,
            rank: 0,
            start_ns: 10,
            duration_ns: 500_000,
            ..ComputeLogRecord::default()
        };
        w.write(&rec).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "", "buffered until flushed");
        w.flush().expect("flush");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read").lines().nth(1),
            Some("1,0,2,4,0,4,false,0.5,0,10,500000,0,0,0,0.0,0,,")
        );
        drop(w);
    }

    #[test]
    fn reference_log_needs_rank_in_name_and_reports_bad_cells() {
        let dir = tmp("ref");
        let good = dir.path().join("compute_logs_3.csv");
        std::fs::write(
            &good,
            "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms\n\
             6,0,16,16,128,16,False,500.5\n6,1,16,16,128,32,False,400\n",
        )
        .expect("write");
        let opts = LoadOptions { reference_overhead_ns: 2.5e6, ..LoadOptions::default() };
        let l = load_logs(std::slice::from_ref(&good), &opts).expect("load");
        assert_eq!(l.trace.ranks(), &[3]);
        assert_eq!(l.trace.step_matrix(0), &[500.5e6, 400e6]);
        // A reference log records no step wall time: the assumed overhead, and a note saying so.
        assert_eq!(l.trace.overhead_ns(), &[2.5e6]);
        assert!(l.notes.iter().any(|n| n.contains("assuming overhead 2.500 ms")), "{:?}", l.notes);

        let bad = dir.path().join("compute_logs_4.csv");
        std::fs::write(
            &bad,
            "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms\n\
             6,0,16,16,128,16,False,500\n6,1,16,16,128,32,maybe,400\n",
        )
        .expect("write");
        match load_logs(&[bad], &LoadOptions::default()) {
            Err(TraceError::Malformed { line, column, .. }) => {
                assert_eq!(line, 3);
                assert_eq!(column, "compute_dropped");
            }
            other => panic!("expected Malformed, got {other:?}"),
        }
        let noname = dir.path().join("timings.csv");
        std::fs::copy(&good, &noname).expect("copy");
        assert!(matches!(
            load_logs(&[noname], &LoadOptions::default()),
            Err(TraceError::Malformed { column, .. }) if column == "rank"
        ));
        assert_eq!(rank_from_file_name(Path::new("a/compute_logs_12.csv.gz")), Some(12));
    }

    /// Ragged steps (a cell without a row) are removed only when allowed; when none is left the
    /// error counts them, in both formats (ours and the reference's, whose rank comes from the
    /// file name). A step with a dropped row is kept (filled), never a reason.
    #[test]
    fn no_step_left_reports_the_ragged_steps_with_their_count() {
        let ours = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n\
                    0,0,1,4,0,4,false,0.01,0,0,10\n0,1,1,4,0,4,true,0.0,0,10,0\n\
                    1,0,1,4,0,4,false,0.01,0,100,10\n\
                    2,0,1,4,0,4,false,0.01,0,200,10\n";
        let reference = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms\n\
                    0,0,1,4,0,4,false,0.01\n0,1,1,4,0,4,true,0.0\n1,0,1,4,0,4,false,0.01\n2,0,1,4,0,4,false,0.01\n";
        let allow = LoadOptions { allow_incomplete_steps: true, ..LoadOptions::default() };
        for (name, body) in [("log.csv", ours), ("compute_logs_0.csv", reference)] {
            let e = load_log_bytes(Path::new(name), body.as_bytes(), &LoadOptions::default()).unwrap_err();
            match e {
                TraceError::Ragged { count, missing, .. } => {
                    assert_eq!((count, missing), (2, vec![(1, 0, 1), (2, 0, 1)]), "{name}")
                }
                e => panic!("{name}: expected Ragged, got {e:?}"),
            }
            // Allowed: the ragged steps go, the censored one stays (its cell filled).
            let l = load_log_bytes(Path::new(name), body.as_bytes(), &allow).unwrap();
            assert_eq!(l.trace.steps(), &[0], "{name}");
            assert_eq!(l.completeness.dropped_steps, vec![(1, 1), (2, 1)], "{name}");
            // Only ragged steps (M = 2 from step 5's row 1): no complete step left, the counts.
            let rest = if name == "log.csv" { [",0,100,10", ",0,200,10", ",0,500,10"] } else { ["", "", ""] };
            let with_m1 = format!(
                "{}\n1,0,1,4,0,4,false,0.01{}\n2,0,1,4,0,4,false,0.01{}\n5,1,1,4,0,4,false,0.01{}\n",
                body.lines().next().unwrap(),
                rest[0],
                rest[1],
                rest[2]
            );
            let e = load_log_bytes(Path::new(name), with_m1.as_bytes(), &allow).unwrap_err();
            let text = e.to_string();
            match e {
                TraceError::NoCompleteStep { steps, ragged_steps, missing_cells, .. } => {
                    assert_eq!((steps, ragged_steps, missing_cells), (3, 3, 3), "{name}")
                }
                e => panic!("{name}: expected NoCompleteStep, got {e:?}"),
            }
            assert!(text.contains("no complete step left of 3: 3 ragged step(s) with 3 missing"), "{text}");
        }
    }

    /// The reference's layout (and ours without M): one row, one cell; a dropped row is a
    /// censored cell filled with the rank's mean over the log, the step kept, the fill counted
    /// in a note.
    #[test]
    fn dropped_micro_batches_are_censored_and_filled_not_removed() {
        let head = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n";
        // 2 ranks, M = 2, steps 0 and 1; rank 1 drops micro-batch 1 of step 1 after a 30 ns one.
        let rows = "0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,8,false,0.01,0,10,10\n\
                    0,0,2,4,0,4,false,0.01,1,0,12\n0,1,2,4,0,8,false,0.01,1,12,12\n\
                    1,0,2,4,0,4,false,0.01,0,100,10\n1,1,2,4,0,8,false,0.01,0,110,10\n\
                    1,0,2,4,0,4,false,0.01,1,100,30\n1,1,2,4,0,4,true,0.0,1,130,0\n";
        let name = Path::new("log.csv");
        let l = load_log_bytes(name, format!("{head}{rows}").as_bytes(), &LoadOptions::default()).unwrap();
        assert_eq!((l.trace.micro_batches(), l.trace.steps()), (2, &[0u64, 1][..]));
        // Rank 1's mean over the log, (12 + 12 + 30) / 3 ns, in the censored cell (not its
        // step-1 mean, 30).
        assert_eq!(l.trace.step_matrix(1), &[10.0, 10.0, 30.0, 18.0]);
        assert!(l.notes.iter().any(|n| n.starts_with("1 censored cell(s) in 1 step(s)")), "{:?}", l.notes);
        // A rank with no launch in the step: the same (rank 0: (10 + 20) / 2).
        let skipped = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,8,false,0.01,0,10,20\n0,0,2,4,0,4,false,0.01,1,0,10\n0,1,2,4,0,8,false,0.01,1,10,10\n\
             1,0,2,4,0,0,true,0.0,0,100,0\n1,1,2,4,0,0,true,0.0,0,100,0\n1,0,2,4,0,4,false,0.01,1,100,10\n1,1,2,4,0,8,false,0.01,1,110,10\n"
        );
        let l = load_log_bytes(name, skipped.as_bytes(), &LoadOptions::default()).unwrap();
        assert_eq!(l.trace.step_matrix(1), &[15.0, 15.0, 10.0, 10.0]);
        assert!(l.notes.iter().any(|n| n.starts_with("2 censored cell(s) in 1 step(s)")), "{:?}", l.notes);
        // A rank that measured nothing in the whole log: a typed error naming it.
        let all = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,4,false,0.0,0,10,10\n0,0,2,4,0,0,true,0.0,1,0,0\n0,1,2,4,0,0,true,0.0,1,0,0\n"
        );
        let e = load_log_bytes(name, all.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Unmeasured { rank: 1, .. }), "{e:?}");
        // A cell missing without a dropped row is still ragged.
        let ragged = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,8,false,0.01,0,10,10\n0,0,2,4,0,4,false,0.01,1,0,10\n"
        );
        let e = load_log_bytes(name, ragged.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Ragged { count: 1, .. }), "{e:?}");
        // A log with no row at all is empty.
        let e = load_log_bytes(name, head.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Empty(_)), "{e:?}");
    }

    /// Our log with M recorded: a rebalanced fast rank's launches past M are left out (in its
    /// mean), a rebalanced slow rank's and a skipped backup worker's unassigned cells take the
    /// rank's mean over the log, tail parts group into whole micro-batches (duration / cost x
    /// share), a censored cell takes the same mean (the scheduler's prediction, deadline -
    /// start, above it is counted, not applied), and the clock start gives the start offsets.
    /// Each value computed by hand below.
    #[test]
    fn a_log_with_m_recorded_rebuilds_every_policys_matrix() {
        let head = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns,micro_batches,split,parts,cost,deadline_ns,clock_start_ns\n";
        // M = 2, split 2, tail cost 0.5; 3 ranks, steps 0 and 1 (clock starts 0 and 1000).
        // Step 0: rank 0 (fast) runs 3 whole (10, 20, 30); rank 1 (slow) one whole (40) then a
        // tail part (24: a whole-equivalent 48, half a micro-batch) and nothing else (the rest
        // unassigned); rank 2 is skipped (no row).
        // Step 1: every rank 2 whole, but rank 2 drops its second in two parts, deadline 1050,
        // its first launch 1005..1025 (offset 5).
        let rows = "0,0,3,8,0,8,false,0,0,0,10,2,2,2,1,0,\n0,1,3,8,0,16,false,0,0,10,20,2,2,2,1,0,\n0,2,3,8,0,24,false,0,0,30,30,2,2,2,1,0,\n\
                    0,0,3,8,0,8,false,0,1,0,40,2,2,2,1,0,\n0,1,3,4,0,12,false,0,1,40,24,2,2,1,0.5,0,\n\
                    1,0,3,8,0,8,false,0,0,1000,10,2,2,2,1,0,1000\n1,1,3,8,0,16,false,0,0,1010,10,2,2,2,1,0,1000\n\
                    1,0,3,8,0,8,false,0,1,1000,40,2,2,2,1,0,1000\n1,1,3,8,0,16,false,0,1,1040,40,2,2,2,1,0,1000\n\
                    1,0,3,8,0,8,false,0,2,1005,20,2,2,2,1,1050,1000\n1,1,3,4,0,8,true,0,2,1025,0,2,2,1,0.5,1050,1000\n1,2,3,4,0,8,true,0,2,1025,0,2,2,1,0.5,1050,1000\n";
        // Step 0 has no clock start recorded: the first start stands for it.
        let l =
            load_log_bytes(Path::new("log.csv"), format!("{head}{rows}").as_bytes(), &LoadOptions::default()).unwrap();
        assert_eq!((l.trace.world_size(), l.trace.micro_batches(), l.trace.steps()), (3, 2, &[0u64, 1][..]));
        // Rank 1's mean over the log: (40 + 24 + 40 + 40) / (1 + 0.5 + 1 + 1) ns per whole
        // micro-batch; its step-0 cell 1 = 24 / 0.5 x 0.5 measured + 0.5 unassigned x the mean.
        // Rank 2 (skipped in step 0): its log mean, 20.
        let m1 = 144.0 / 3.5;
        assert_eq!(l.trace.step_matrix(0), &[10.0, 20.0, 40.0, 24.0 + 0.5 * m1, 20.0, 20.0]);
        // Step 1: rank 2's censored cell: its log mean 20 (the prediction, 1050 - 1025 = 25,
        // is above it: counted, not applied).
        assert_eq!(l.trace.step_matrix(1), &[10.0, 10.0, 40.0, 40.0, 20.0, 20.0]);
        assert_eq!(l.trace.start_offsets_ns(), &[0.0, 0.0, 0.0, 0.0, 0.0, 5.0]);
        for (note, start) in [
            ("1 censored cell(s) in 1 step(s)", "censored"),
            ("3 cell(s) of the nominal 2 micro-batches per rank the policy did not assign", "unassigned"),
            ("1 measured micro-batch(es) past the nominal 2", "beyond M"),
            ("1 tail launch(es) grouped", "tail"),
        ] {
            assert!(l.notes.iter().any(|n| n.starts_with(note)), "{start}: {:?}", l.notes);
        }
        assert!(l.notes.iter().any(|n| n.contains("in 1 of them the scheduler had predicted more")), "{:?}", l.notes);
        // A recorded M no rank ever held is refused at its line, before any fill.
        let bad = format!("{head}0,0,1,8,0,8,false,0,0,0,10,9,1,1,1,0,\n");
        let e = load_log_bytes(Path::new("log.csv"), bad.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(&e, TraceError::Malformed { line: 2, column, .. } if column == "micro_batches"), "{e:?}");
        // parts above split, cost outside (0, 1]: errors at their column.
        for (row, column) in
            [("0,0,1,8,0,8,false,0,0,0,10,1,1,2,1,0,", "parts"), ("0,0,1,8,0,8,false,0,0,0,10,1,1,1,1.5,0,", "cost")]
        {
            let e = load_log_bytes(Path::new("log.csv"), format!("{head}{row}\n").as_bytes(), &LoadOptions::default())
                .unwrap_err();
            assert!(matches!(&e, TraceError::Malformed { line: 2, column: c, .. } if c == column), "{e:?}");
        }
    }

    /// A log with M recorded whose steps x ranks x M exceeds [`MAX_FILLED_CELLS`] (every
    /// rank-step without a row would be filled) is refused with the numbers, quickly.
    #[test]
    fn a_filled_log_is_bounded() {
        let mut text = String::from(
            "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns,micro_batches\n",
        );
        // Rank 0 holds M = 2 in step 0; 16 385 more ranks in step 0, 8 193 more steps on rank 0.
        text += "0,0,1,8,0,8,false,0,0,0,10,2\n0,1,1,8,0,8,false,0,0,10,10,2\n";
        for r in 1..=16_385u32 {
            text += &format!("0,0,1,8,0,8,false,0,{r},0,10,2\n");
        }
        for step in 1..=8_193u64 {
            text += &format!("{step},0,1,8,0,8,false,0,0,0,10,2\n");
        }
        let t0 = std::time::Instant::now();
        let e = load_log_bytes(Path::new("log.csv"), text.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(&e, TraceError::Shape(m) if m.contains("8194 steps x 16386 ranks x 2 micro-batches = 268533768 cells")),
            "{e}"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{:?}", t0.elapsed());
    }

    /// Ranks start their clocks at different times after each step's collective (the Python
    /// face's 4 processes on 2 cores: 10 ms apart on average): the step period is the mean over
    /// ranks of each rank's own start-to-start period, so the steps' times (max compute +
    /// overhead) sum to the run's time; the max over ranks (the old rule: overheads 44 and 35
    /// here) added each step's latest start, 9 ns a step too many.
    #[test]
    fn overhead_takes_the_mean_period_over_ranks_whose_clocks_start_apart() {
        let head = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns,micro_batches,clock_start_ns\n";
        // Clock starts (step x rank) and compute (each rank launches its one micro-batch at its
        // clock start): periods of step 0: 100, 104, 96 (mean 100, max 104); step 1: 100, 95,
        // 105 (mean 100, max 105).
        let start = [[0u64, 4, 8], [100, 108, 104], [200, 203, 209]];
        let compute = [[50u64, 60, 40], [30, 70, 50], [10, 10, 10]];
        let mut text = head.to_string();
        for step in 0..3 {
            for rank in 0..3 {
                let (t, d) = (start[step][rank], compute[step][rank]);
                text += &format!("{step},0,3,4,0,4,false,0.0,{rank},{t},{d},1,{t}\n");
            }
        }
        let l = load_log_bytes(Path::new("log.csv"), text.as_bytes(), &LoadOptions::default()).unwrap();
        // Step 0: 100 - 60; step 1: 100 - 70; step 2 (no following step): the median of the two.
        assert_eq!(l.trace.overhead_ns(), &[40.0, 30.0, 40.0]);
        // The first two steps' times sum to the ranks' mean span (200, 199, 201).
        let steps: f64 = (0..2).map(|s| l.trace.step_matrix(s).iter().copied().fold(0.0, f64::max)).sum::<f64>()
            + l.trace.overhead_ns()[..2].iter().sum::<f64>();
        assert_eq!(steps, 200.0);
    }

    /// Overhead of step s = the mean over ranks of the start-to-start period - max over ranks of
    /// the step's compute, on 3 ranks and 3 steps (so step 1 has a following step and its own
    /// ranks' compute, not a neighbour's, is used); the last step takes the median.
    #[test]
    fn overhead_uses_each_steps_own_ranks() {
        let head = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n";
        // Compute (step x rank): [10, 90, 20], [20, 30, 80], [5, 5, 5]; steps start at 0, 100, 300.
        let compute = [[10u64, 90, 20], [20, 30, 80], [5, 5, 5]];
        let start = [0u64, 100, 300];
        let mut text = head.to_string();
        for (step, row) in compute.iter().enumerate() {
            for (rank, d) in row.iter().enumerate() {
                text += &format!("{step},0,3,4,0,4,false,0.0,{rank},{},{d}\n", start[step]);
            }
        }
        let l = load_log_bytes(Path::new("log.csv"), text.as_bytes(), &LoadOptions::default()).unwrap();
        assert_eq!(l.trace.overhead_ns(), &[100.0 - 90.0, 200.0 - 80.0, 120.0]);
        // A reference log of two steps: the assumed overhead on each, never periods (it has no
        // start times).
        let reference = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms\n\
                         0,0,1,4,0,4,False,1.5\n1,0,1,4,0,4,False,2\n";
        let opts = LoadOptions { reference_overhead_ns: 7e5, ..LoadOptions::default() };
        let l = load_log_bytes(Path::new("compute_logs_0.csv"), reference.as_bytes(), &opts).unwrap();
        assert_eq!((l.trace.step_matrix(0), l.trace.step_matrix(1)), (&[1.5e6][..], &[2e6][..]));
        assert_eq!(l.trace.overhead_ns(), &[7e5, 7e5]);
    }

    #[test]
    fn crlf_errors_name_the_physical_line() {
        // Physical line 4 has compute_dropped = "maybe": reported at line 4 for \n and \r\n.
        for eol in ["\n", "\r\n"] {
            let text = [
                "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns",
                "0,0,2,4,0,4,false,0.01,0,0,10",
                "0,1,2,4,0,8,false,0.01,0,10,10",
                "0,0,2,4,0,4,maybe,0.01,1,0,12",
            ]
            .join(eol);
            let e = load_log_bytes(Path::new("x.csv"), text.as_bytes(), &LoadOptions::default()).unwrap_err();
            assert!(
                matches!(&e, TraceError::Malformed { line: 4, column, .. } if column == "compute_dropped"),
                "{eol:?}: {e}"
            );
        }
    }

    #[test]
    fn every_column_of_every_row_is_parsed() {
        // Ours (11 columns) and the reference's (8): a bad value in any column of physical
        // line 3 is an error naming that column and line, never a silently skipped cell.
        let ours = [
            "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns",
            "0,0,1,4,0,4,false,0.01,0,0,10",
            "0,1,1,4,0,8,false,0.01,0,10,10",
        ];
        let reference =
            [&ours[0][..ours[0].find(",rank").unwrap()], "0,0,1,4,0,4,false,0.01", "0,1,1,4,0,8,false,0.01"];
        for (name, rows) in [("log.csv", ours), ("compute_logs_0.csv", reference)] {
            let name = Path::new(name);
            let header: Vec<&str> = rows[0].split(',').collect();
            assert!(load_log_bytes(name, rows.join("\n").as_bytes(), &LoadOptions::default()).is_ok(), "{name:?}");
            for (col, column) in header.iter().enumerate() {
                let bads: &[&str] = if *column == "iteration_time_ms" { &["abc", "-1", "inf"] } else { &["abc"] };
                for bad in bads {
                    let mut cells: Vec<&str> = rows[2].split(',').collect();
                    cells[col] = bad;
                    let text = [rows[0], rows[1], &cells.join(",")].join("\n");
                    let e = load_log_bytes(name, text.as_bytes(), &LoadOptions::default());
                    assert!(
                        matches!(&e, Err(TraceError::Malformed { line: 3, column: c, .. }) if c == column),
                        "{name:?}: {column} = {bad:?} must be an error at line 3: {e:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_duplicate_across_files_names_both_files_and_lines() {
        let dir = tmp("dup");
        let head = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n";
        let a = dir.path().join("a.csv");
        let b = dir.path().join("b.csv");
        std::fs::write(&a, format!("{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,0,2,4,0,4,false,0.01,1,0,10\n")).unwrap();
        std::fs::write(&b, format!("{head}1,0,2,4,0,4,false,0.01,0,20,10\n0,0,2,4,0,4,false,0.01,1,0,10\n")).unwrap();
        let e = load_logs(&[a.clone(), b.clone()], &LoadOptions::default()).unwrap_err();
        match &e {
            TraceError::Duplicate { path, first_path, line, first_line, step: 0, rank: 1, micro_batch: 0 } => {
                assert_eq!((path, first_path, *line, *first_line), (&b, &a, 3, 3));
            }
            other => panic!("expected a duplicate, got {other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("{}:3:", b.display()))
                && msg.ends_with(&format!("first seen at {}:3", a.display())),
            "{msg}"
        );
    }

    /// The bucket column: a log with a bucket on every row gives a length-carrying trace
    /// (cells in the trace's layout); a log without the column, or with a cell lacking one,
    /// gives a trace without buckets (a note says why when some were recorded).
    #[test]
    fn buckets_round_trip_and_old_logs_load_without_them() {
        let write = |bucket: &dyn Fn(u64, u32, u32) -> Option<u32>| -> Vec<u8> {
            let mut w = ComputeLogWriter::new(Vec::new());
            for step in 0..2u64 {
                for rank in 0..2u32 {
                    for mb in 0..2u32 {
                        let rec = ComputeLogRecord {
                            global_step: step,
                            local_step: mb,
                            world_size: 2,
                            batch: 4,
                            computed_batch: 4 * u64::from(mb + 1),
                            iteration_time_ms: 0.01,
                            rank,
                            start_ns: u64::from(mb) * 10,
                            duration_ns: 10,
                            micro_batches: 2,
                            bucket: bucket(step, rank, mb),
                            ..ComputeLogRecord::default()
                        };
                        w.write(&rec).expect("write");
                    }
                }
            }
            w.into_inner().expect("flush")
        };
        let name = Path::new("log.csv");
        let key = |s: u64, r: u32, m: u32| (s as u32) * 4 + r * 2 + m;
        let all = load_log_bytes(name, &write(&|s, r, m| Some(key(s, r, m))), &LoadOptions::default()).expect("load");
        assert_eq!(all.trace.buckets(), Some(&(0..8).collect::<Vec<u32>>()[..]));
        assert_eq!(all.trace.step_buckets(1), Some(&[4, 5, 6, 7][..]));
        let none = load_log_bytes(name, &write(&|_, _, _| None), &LoadOptions::default()).expect("load");
        assert_eq!(none.trace.buckets(), None);
        assert!(!none.notes.iter().any(|n| n.contains("bucket")));
        let some = load_log_bytes(name, &write(&|s, r, m| (r == 0).then(|| key(s, r, m))), &LoadOptions::default())
            .expect("load");
        assert_eq!(some.trace.buckets(), None);
        assert!(some.notes.iter().any(|n| n.contains("4 of 8 micro-batches have no bucket")), "{:?}", some.notes);
        // The same latencies either way.
        assert_eq!(all.trace.latencies_ns(), none.trace.latencies_ns());
    }
}
