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
//! (wall time of this micro-batch). Ours adds rank, start_ns (device time of the micro-batch start,
//! ns on a per-rank monotonic clock) and duration_ns.
//!
//! Rows flagged compute_dropped carry no complete latency: they are not used as latencies, so a
//! step with drops shows up as incomplete (reported, never filled in).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Completeness, LoadOptions, Loaded, TraceBuilder, TraceError, open_maybe_gz};

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

/// One scheduled micro-batch as the scheduler logs it (one CSV row; header = field names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComputeLogRecord {
    /// Global step index (0-based).
    pub global_step: u64,
    /// Micro-batch index within the step (0..M).
    pub local_step: u32,
    /// World size N.
    pub world_size: u32,
    /// Micro-batch size (samples).
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
    /// Device time at start (ns, per-rank monotonic clock; 0 if dropped).
    pub start_ns: u64,
    /// Device latency (ns; 0 if dropped).
    pub duration_ns: u64,
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
/// Errors: [`TraceError::Io`] / [`TraceError::Malformed`] (line 1).
pub fn read_header(path: &Path) -> Result<Vec<String>, TraceError> {
    header_of(open_maybe_gz(path)?, path)
}

/// [`read_header`] of an open reader; `path` labels errors.
fn header_of(src: impl std::io::Read, path: &Path) -> Result<Vec<String>, TraceError> {
    let mut r = csv::ReaderBuilder::new().has_headers(false).from_reader(src);
    let mut rec = csv::StringRecord::new();
    match r.read_record(&mut rec) {
        Ok(_) => Ok(rec.iter().map(|s| s.trim().to_string()).collect()),
        Err(e) => {
            Err(TraceError::Malformed { path: path.into(), line: 1, column: "(header)".into(), message: e.to_string() })
        }
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
/// Ours: latency = duration_ns; overhead of step s = max over ranks of (start of step s+1 -
/// start of step s) - max over ranks of compute(s); the last step gets the median of the others
/// (noted). Reference: latency = iteration_time_ms · 1e6, rank from the file name, overhead =
/// `opts.reference_overhead_ns` (noted). Errors: malformed fields with file, line and column;
/// a reference file whose name carries no rank; duplicates; ragged steps unless allowed.
///
/// Dropped micro-batches (`compute_dropped` = true, as in a DropCompute run's log) count for the
/// shape (M is the largest `local_step` + 1 over every row) but their latency is unknown
/// (censored): a step with a dropped micro-batch is removed from the trace and the removal is
/// noted, never filled in. Only cells missing without a dropped row make a step ragged.
pub fn load_logs(paths: &[PathBuf], opts: &LoadOptions) -> Result<Loaded, TraceError> {
    load_logs_with(paths, opts, open_maybe_gz)
}

/// [`load_logs`] of one compute log held in memory (plain CSV, not gzipped): for fuzzing and
/// property tests. `name` labels errors and, for the reference format, gives the rank
/// (`compute_logs_{rank}.csv`). Errors: as [`load_logs`].
pub fn load_log_bytes(name: &Path, bytes: &[u8], opts: &LoadOptions) -> Result<Loaded, TraceError> {
    load_logs_with(&[name.to_path_buf()], opts, |_| Ok(Box::new(bytes)))
}

fn load_logs_with<'a>(
    paths: &[PathBuf],
    opts: &LoadOptions,
    open: impl Fn(&Path) -> Result<Box<dyn std::io::Read + 'a>, TraceError> + 'a,
) -> Result<Loaded, TraceError> {
    let mut b = TraceBuilder::new();
    let mut notes = Vec::new();
    // (rank, step) -> first start_ns, for our logs.
    let mut starts: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut any_reference = false;
    // step -> dropped rows (censored cells), and the largest micro-batch index of any row.
    let mut dropped_per_step: BTreeMap<u64, usize> = BTreeMap::new();
    let mut max_mb: Option<u32> = None;
    for path in paths {
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
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(TraceError::Malformed {
                    path: path.into(),
                    line,
                    column: "iteration_time_ms".into(),
                    message: format!("{ms} ms is negative or not finite"),
                });
            }
            max_mb = max_mb.max(Some(mb));
            if dropped {
                *dropped_per_step.entry(step).or_insert(0) += 1;
            }
            if ours {
                let rank: u32 = parse(field(rec, 8, path, line, "rank")?, path, line, "rank")?;
                let start: u64 = parse(field(rec, 9, path, line, "start_ns")?, path, line, "start_ns")?;
                let dur: u64 = parse(field(rec, 10, path, line, "duration_ns")?, path, line, "duration_ns")?;
                if !dropped {
                    let e = starts.entry((rank, step)).or_insert(start);
                    *e = (*e).min(start);
                    b.insert(path, line, step, rank, mb, dur as f64)?;
                }
            } else {
                if !dropped {
                    b.insert(path, line, step, file_rank.unwrap_or(0), mb, ms * 1e6)?;
                }
            }
            Ok(())
        })?;
    }
    let source = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(",");
    if any_reference {
        notes.push(format!(
            "reference compute logs record no step wall time: assuming overhead {:.3} ms per step",
            opts.reference_overhead_ns / 1e6
        ));
        let steps: Vec<u64> = b.cells().keys().map(|k| k.0).collect();
        for s in steps {
            b.set_overhead(s, opts.reference_overhead_ns);
        }
    }
    if let Some(m) = max_mb {
        b.expect_micro_batches(m as usize + 1);
    }
    // Steps whose only missing cells are dropped micro-batches are removed (censored), not
    // ragged; a step with a cell missing that no dropped row explains is ragged (an error
    // unless allowed). When no step is left, the error gives every reason with its count.
    let split = b.split(&source)?;
    let censored_step = |&(s, n): &(u64, usize)| dropped_per_step.get(&s) == Some(&n);
    let ragged: Vec<(u64, usize)> = split.report.dropped_steps.iter().copied().filter(|c| !censored_step(c)).collect();
    let missing_cells =
        ragged.iter().map(|&(s, n)| n.saturating_sub(dropped_per_step.get(&s).copied().unwrap_or(0))).sum::<usize>();
    let ragged_examples = |c: &Completeness| -> Vec<(u64, u32, u32)> {
        c.missing_examples.iter().copied().filter(|e| ragged.iter().any(|&(s, _)| s == e.0)).collect()
    };
    // Every step: the removed ones plus any made only of dropped rows (no cell at all).
    let mut all_steps: Vec<u64> = split.report.dropped_steps.iter().map(|&(s, _)| s).collect();
    all_steps.extend(dropped_per_step.keys().copied());
    all_steps.sort_unstable();
    all_steps.dedup();
    let censored_any = all_steps.len() > ragged.len();
    let (mut trace, completeness) = match split.trace {
        None if split.steps == 0 && dropped_per_step.is_empty() => return Err(TraceError::Empty(source)),
        None if ragged.is_empty() => {
            return Err(TraceError::AllStepsDropped { source_name: source, steps: dropped_per_step.len() });
        }
        // Ragged steps are the only reason, not allowed: as the other loaders.
        None if !opts.allow_incomplete_steps && !censored_any => {
            let missing = ragged_examples(&split.report);
            return Err(TraceError::Ragged { source_name: source, count: missing_cells, missing });
        }
        None => {
            return Err(TraceError::NoCompleteStep {
                source_name: source,
                steps: all_steps.len(),
                censored_steps: all_steps.len() - ragged.len(),
                ragged_steps: ragged.len(),
                missing_cells,
                missing: ragged_examples(&split.report),
            });
        }
        Some(_) if !ragged.is_empty() && !opts.allow_incomplete_steps => {
            let missing = ragged_examples(&split.report);
            return Err(TraceError::Ragged { source_name: source, count: missing_cells, missing });
        }
        Some(t) => (t, split.report),
    };
    let censored = completeness.dropped_steps.iter().filter(|(s, _)| dropped_per_step.contains_key(s)).count();
    if censored > 0 {
        notes.push(format!(
            "{censored} step(s) with dropped micro-batches removed: a dropped micro-batch's latency is unknown \
             (tune from the baseline run's log to see every latency)"
        ));
    }
    if !any_reference && trace.num_steps() >= 2 {
        let compute = trace.rank_compute_ns();
        let n = trace.world_size();
        let mut overhead = Vec::with_capacity(trace.num_steps());
        for (si, &s) in trace.steps().iter().enumerate() {
            let period = trace
                .ranks()
                .iter()
                .filter_map(|&r| {
                    let a = starts.get(&(r, s))?;
                    let z = starts.get(&(r, s + 1))?;
                    Some(z.saturating_sub(*a) as f64)
                })
                .fold(f64::NAN, f64::max);
            let max_c = compute[si * n..(si + 1) * n].iter().copied().fold(0.0, f64::max);
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
    Ok(Loaded { trace, completeness, notes })
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
        };
        w.write(&rec).expect("write");
        let text = String::from_utf8(w.into_inner().expect("flush")).expect("utf8");
        let mut lines = text.lines();
        let header = lines.next().expect("header");
        assert_eq!(header, [&REFERENCE_COLUMNS[..], &["rank", "start_ns", "duration_ns"]].concat().join(","));
        assert_eq!(lines.next(), Some("7,2,3,16,128,48,true,0.25,1,9000,250000"));
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
        };
        w.write(&rec).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "", "buffered until flushed");
        w.flush().expect("flush");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read").lines().nth(1),
            Some("1,0,2,4,0,4,false,0.5,0,10,500000")
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

    /// When no step is left, the error names every reason with its count, in both formats
    /// (ours and the reference's, whose rank comes from the file name), allowed or not.
    #[test]
    fn no_step_left_reports_every_reason_with_its_count() {
        let ours = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n\
                    0,0,1,4,0,4,false,0.01,0,0,10\n0,1,1,4,0,4,true,0.0,0,10,0\n\
                    1,0,1,4,0,4,false,0.01,0,100,10\n\
                    2,0,1,4,0,4,false,0.01,0,200,10\n";
        let reference = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms\n\
                    0,0,1,4,0,4,false,0.01\n0,1,1,4,0,4,true,0.0\n1,0,1,4,0,4,false,0.01\n2,0,1,4,0,4,false,0.01\n";
        let allow = LoadOptions { allow_incomplete_steps: true, ..LoadOptions::default() };
        for (name, body) in [("log.csv", ours), ("compute_logs_0.csv", reference)] {
            for opts in [&LoadOptions::default(), &allow] {
                let e = load_log_bytes(Path::new(name), body.as_bytes(), opts).unwrap_err();
                let text = e.to_string();
                match e {
                    TraceError::NoCompleteStep {
                        steps, censored_steps, ragged_steps, missing_cells, missing, ..
                    } => assert_eq!(
                        (steps, censored_steps, ragged_steps, missing_cells, missing),
                        (3, 1, 2, 2, vec![(1, 0, 1), (2, 0, 1)]),
                        "{name}"
                    ),
                    e => panic!("{name}: expected NoCompleteStep, got {e:?}"),
                }
                assert!(
                    text.contains("no complete step left of 3: 1 step(s) with dropped micro-batches")
                        && text.contains("2 ragged step(s) with 2 missing"),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn dropped_micro_batches_are_censored_not_ragged() {
        let head = "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n";
        // 2 ranks, M = 2, steps 0 and 1; rank 1 drops micro-batch 1 of step 1.
        let rows = "0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,8,false,0.01,0,10,10\n\
                    0,0,2,4,0,4,false,0.01,1,0,12\n0,1,2,4,0,8,false,0.01,1,12,12\n\
                    1,0,2,4,0,4,false,0.01,0,100,10\n1,1,2,4,0,8,false,0.01,0,110,10\n\
                    1,0,2,4,0,4,false,0.01,1,100,30\n1,1,2,4,0,4,true,0.0,1,130,0\n";
        let name = Path::new("log.csv");
        let l = load_log_bytes(name, format!("{head}{rows}").as_bytes(), &LoadOptions::default()).unwrap();
        assert_eq!((l.trace.micro_batches(), l.trace.steps()), (2, &[0u64][..]));
        assert!(l.notes.iter().any(|n| n.contains("1 step(s) with dropped micro-batches removed")), "{:?}", l.notes);
        // Every step censored: a typed error saying so.
        let all = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,4,true,0.0,0,10,0\n0,0,2,4,0,4,false,0.01,1,0,10\n0,1,2,4,0,8,false,0.01,1,10,10\n"
        );
        let e = load_log_bytes(name, all.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::AllStepsDropped { steps: 1, .. }), "{e:?}");
        // A cell missing without a dropped row is still ragged.
        let ragged = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,8,false,0.01,0,10,10\n0,0,2,4,0,4,false,0.01,1,0,10\n"
        );
        let e = load_log_bytes(name, ragged.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Ragged { count: 1, .. }), "{e:?}");
        // M counts dropped rows too: micro-batch 2 appears only dropped (step 0, every rank), so
        // step 1, which has no row for it at all, is incomplete (M = 3), not complete with M = 2:
        // no step is left: one step removed for its dropped rows, one ragged, both counted.
        let only_dropped = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,8,false,0.01,0,10,10\n0,2,2,4,0,8,true,0.0,0,20,0\n\
             0,0,2,4,0,4,false,0.01,1,0,10\n0,1,2,4,0,8,false,0.01,1,10,10\n0,2,2,4,0,8,true,0.0,1,20,0\n\
             1,0,2,4,0,4,false,0.01,0,100,10\n1,1,2,4,0,8,false,0.01,0,110,10\n\
             1,0,2,4,0,4,false,0.01,1,100,10\n1,1,2,4,0,8,false,0.01,1,110,10\n"
        );
        let allow = LoadOptions { allow_incomplete_steps: true, ..LoadOptions::default() };
        for opts in [&LoadOptions::default(), &allow] {
            match load_log_bytes(name, only_dropped.as_bytes(), opts).unwrap_err() {
                TraceError::NoCompleteStep { steps, censored_steps, ragged_steps, missing_cells, missing, .. } => {
                    assert_eq!(
                        (steps, censored_steps, ragged_steps, missing_cells, missing),
                        (2, 1, 1, 2, vec![(1, 0, 2), (1, 1, 2)])
                    )
                }
                e => panic!("expected NoCompleteStep, got {e:?}"),
            }
        }
        // A censored step does not excuse a ragged one: step 0 has a dropped row, step 1 misses
        // a cell without one, step 2 is complete.
        let mixed = format!(
            "{head}0,0,2,4,0,4,false,0.01,0,0,10\n0,1,2,4,0,4,true,0.0,0,10,0\n\
             0,0,2,4,0,4,false,0.01,1,0,10\n0,1,2,4,0,8,false,0.01,1,10,10\n\
             1,0,2,4,0,4,false,0.01,0,100,10\n1,1,2,4,0,8,false,0.01,0,110,10\n1,0,2,4,0,4,false,0.01,1,100,10\n\
             2,0,2,4,0,4,false,0.01,0,200,10\n2,1,2,4,0,8,false,0.01,0,210,10\n\
             2,0,2,4,0,4,false,0.01,1,200,10\n2,1,2,4,0,8,false,0.01,1,210,10\n"
        );
        let e = load_log_bytes(name, mixed.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Ragged { count: 1, .. }), "{e:?}");
        let opts = LoadOptions { allow_incomplete_steps: true, ..LoadOptions::default() };
        assert_eq!(load_log_bytes(name, mixed.as_bytes(), &opts).unwrap().trace.steps(), &[2]);
        // A log with no row at all is empty, not "every step dropped".
        let e = load_log_bytes(name, head.as_bytes(), &LoadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Empty(_)), "{e:?}");
    }

    /// Overhead of step s = max over ranks of the start-to-start period - max over ranks of
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
}
