//! What-if analysis traces (OSDI'25 straggler study schema) to [`LatencyTrace`].
//!
//! Owns: the CSV reader (plain or .gz) for the schema dp_rank, stage, rank, step, optype,
//! start_ts, duration, seq_id, mc, mb_id, gmc (timestamps and durations in seconds), the
//! Parquet reader for the same schema (submodule `parquet_reader`, cargo feature `parquet`),
//! and the one derivation, shared by both readers, of a data-parallel replica's micro-batch
//! latency. Must not touch: tuning.
//!
//! Derivation (see [`PipelineAggregation`]): for step s, replica (dp_rank) n and micro-batch m,
//! each pipeline stage's cost is the sum of its forward-compute and backward-compute durations
//! with mb_id = m. The replica's latency for m is, by default, the **bottleneck** (max over
//! stages): in the 1F1B steady state the pipeline advances at the pace of its slowest stage, so
//! dropping micro-batch m from the replica saves about that stage's time, and the replica's
//! compute time Σ_m max_s(...) stays comparable with the step's wall time (overhead = wall -
//! max over replicas >= 0 up to pipeline-fill effects). The **sum** over stages (one
//! micro-batch's end-to-end latency through an idle pipeline) is available as an option; it
//! counts concurrent stage work twice, so it exceeds the wall time and the overhead clamps to 0.
//! Per-step overhead = (max end - min start over all ops of the step) - max over replicas of
//! the replica compute time, clamped at 0 (clamps are noted).

#[cfg(feature = "parquet")]
pub mod parquet_reader;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{LoadOptions, Loaded, TraceBuilder, TraceError, open_maybe_gz};

/// How stages of one pipeline-parallel replica combine into one micro-batch latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PipelineAggregation {
    /// max over stages of (forward + backward) for the micro-batch (default; see module doc).
    #[default]
    Bottleneck,
    /// sum over stages of (forward + backward) for the micro-batch.
    Sum,
}

/// The schema's columns, in order.
pub const WHATIF_COLUMNS: [&str; 11] =
    ["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "mb_id", "gmc"];

/// True if the header is the what-if schema (column order as in [`WHATIF_COLUMNS`]).
pub fn is_whatif_header(h: &[String]) -> bool {
    h.len() == WHATIF_COLUMNS.len() && h.iter().zip(WHATIF_COLUMNS).all(|(a, b)| a == b)
}

/// The error [`super::load`] returns for `.parquet` inputs when the crate is built without the
/// `parquet` feature (with it, `parquet_reader::load_parquet` reads them).
pub fn parquet_unsupported(path: &Path) -> TraceError {
    TraceError::ParquetUnsupported {
        path: path.into(),
        reason: "built without the `parquet` feature; rebuild with `--features parquet` or convert to CSV (same columns)",
    }
}

/// Load one what-if Parquet file. With the `parquet` feature this is
/// `parquet_reader::load_parquet` (columns found by name, errors name file, row and column);
/// without it, always [`TraceError::ParquetUnsupported`].
pub fn load_parquet(path: &Path, opts: &LoadOptions) -> Result<Loaded, TraceError> {
    #[cfg(feature = "parquet")]
    {
        parquet_reader::load_parquet(path, opts)
    }
    #[cfg(not(feature = "parquet"))]
    {
        let _ = opts;
        Err(parquet_unsupported(path))
    }
}

#[derive(Default, Clone, Copy)]
struct StageCost {
    fwd_s: f64,
    bwd_s: f64,
    has_fwd: bool,
    has_bwd: bool,
    line: u64,
}

/// Typed access to the fields of one what-if record; `col` indexes [`WHATIF_COLUMNS`].
/// Implemented by the CSV and the Parquet readers so that both feed the same
/// [`WhatifAccumulator`]. Each method returns [`TraceError::Malformed`] naming the file, the
/// record's line (CSV) or row (Parquet) and the column when the field is absent or not of the
/// asked type. Values are returned unchecked: range checks are the accumulator's.
pub(super) trait WhatifRecord {
    /// An integer field.
    fn int(&self, col: usize) -> Result<i64, TraceError>;
    /// A floating-point field (seconds for `start_ts`, `duration`).
    fn float(&self, col: usize) -> Result<f64, TraceError>;
    /// A string field (`optype`).
    fn text(&self, col: usize) -> Result<&str, TraceError>;
}

/// Turns what-if records into a [`Loaded`] trace: the one aggregation path for every input
/// format (forward + backward per stage, stages combined by [`PipelineAggregation`], cells fed
/// to a [`TraceBuilder`], per-step overhead from the step's span).
pub(super) struct WhatifAccumulator<'p> {
    path: &'p Path,
    costs: BTreeMap<(u64, u32, u32, u32), StageCost>,
    stages: BTreeSet<u32>,
    span: BTreeMap<u64, (f64, f64)>,
}

impl<'p> WhatifAccumulator<'p> {
    /// Empty accumulator for records of `path`.
    pub(super) fn new(path: &'p Path) -> Self {
        Self { path, costs: BTreeMap::new(), stages: BTreeSet::new(), span: BTreeMap::new() }
    }

    fn bad(&self, line: u64, col: &str, message: String) -> TraceError {
        TraceError::Malformed { path: self.path.into(), line, column: col.into(), message }
    }

    /// Add one record found at `line` (CSV line, or 1-based Parquet row). Errors:
    /// [`TraceError::Malformed`] for a negative / non-finite time, an id out of u32 range, a
    /// negative step or a compute op with mb_id < 0; [`TraceError::Duplicate`] for a second
    /// forward (or backward) op of one (step, replica, stage, micro-batch).
    pub(super) fn push(&mut self, line: u64, rec: &impl WhatifRecord) -> Result<(), TraceError> {
        let num = |i: usize| -> Result<f64, TraceError> {
            let v = rec.float(i)?;
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(self.bad(line, WHATIF_COLUMNS[i], format!("{v} is negative or not finite")))
            }
        };
        let id = |i: usize| -> Result<u32, TraceError> {
            let v = rec.int(i)?;
            u32::try_from(v).map_err(|_| self.bad(line, WHATIF_COLUMNS[i], format!("{v} out of range")))
        };
        let dp = id(0)?;
        let stage = id(1)?;
        let step = u64::try_from(rec.int(3)?).map_err(|_| self.bad(line, "step", "negative step".into()))?;
        let start = num(5)?;
        let dur = num(6)?;
        let e = self.span.entry(step).or_insert((f64::INFINITY, 0.0));
        e.0 = e.0.min(start);
        e.1 = e.1.max(start + dur);
        // Every column is parsed, used or not (rank, seq_id, mc, gmc; mb_id of any op): a
        // malformed value is an error at its column, never a silently skipped record.
        for col in [2, 7, 8, 10] {
            rec.int(col)?;
        }
        let mb = rec.int(9)?;
        let op = rec.text(4)?.trim();
        if op.is_empty() {
            return Err(self.bad(line, "optype", "empty op type".into()));
        }
        let is_fwd = op == "forward-compute";
        if !(is_fwd || op == "backward-compute") {
            return Ok(());
        }
        let mb = u32::try_from(mb).map_err(|_| self.bad(line, "mb_id", format!("compute op with mb_id {mb}")))?;
        self.stages.insert(stage);
        let c = self.costs.entry((step, dp, stage, mb)).or_insert(StageCost { line, ..Default::default() });
        let dup = if is_fwd { c.has_fwd } else { c.has_bwd };
        if dup {
            return Err(TraceError::Duplicate {
                path: self.path.into(),
                first_path: self.path.into(),
                line,
                first_line: c.line,
                step,
                rank: dp,
                micro_batch: mb,
            });
        }
        if is_fwd {
            c.fwd_s = dur;
            c.has_fwd = true;
        } else {
            c.bwd_s = dur;
            c.has_bwd = true;
        }
        Ok(())
    }

    /// Build the trace. Errors: ragged steps (a missing stage, forward or backward) unless
    /// `opts.allow_incomplete_steps`; [`TraceError::Empty`] if no complete step remains.
    pub(super) fn finish(self, opts: &LoadOptions) -> Result<Loaded, TraceError> {
        let Self { path, costs, stages, span } = self;
        // Combine stages per (step, replica, micro-batch); a cell is inserted only if every
        // stage has both its forward and backward (otherwise the builder reports it missing).
        let mut per_cell: BTreeMap<(u64, u32, u32), (Vec<f64>, u64)> = BTreeMap::new();
        for (&(step, dp, _stage, mb), c) in &costs {
            let e = per_cell.entry((step, dp, mb)).or_insert((Vec::new(), c.line));
            if c.has_fwd && c.has_bwd {
                e.0.push(c.fwd_s + c.bwd_s);
            }
        }
        let mut b = TraceBuilder::new();
        b.expect_micro_batches(costs.keys().map(|k| k.3 as usize + 1).max().unwrap_or(0));
        for ((step, dp, mb), (v, line)) in per_cell {
            if v.len() == stages.len() {
                let secs = match opts.pipeline {
                    PipelineAggregation::Bottleneck => v.iter().copied().fold(0.0, f64::max),
                    PipelineAggregation::Sum => v.iter().sum(),
                };
                b.insert(path, line, step, dp, mb, secs * 1e9)?;
            }
        }
        let source = path.display().to_string();
        let (trace, completeness) = b.finish(&source, opts.allow_incomplete_steps)?;
        let compute = trace.rank_compute_ns();
        let n = trace.world_size();
        let mut clamped = 0;
        let overhead: Vec<f64> = trace
            .steps()
            .iter()
            .enumerate()
            .map(|(si, s)| {
                let (a, z) = span.get(s).copied().unwrap_or((0.0, 0.0));
                let max_c = compute[si * n..(si + 1) * n].iter().copied().fold(0.0, f64::max);
                let o = (z - a) * 1e9 - max_c;
                if o < 0.0 {
                    clamped += 1;
                }
                o.max(0.0)
            })
            .collect();
        let mut notes = vec![format!(
            "what-if trace: {} replicas x {} pipeline stage(s), {} micro-batches, {} steps; replica micro-batch latency = {:?} over stages of forward+backward",
            n,
            stages.len(),
            trace.micro_batches(),
            trace.num_steps(),
            opts.pipeline
        )];
        if clamped > 0 {
            notes
                .push(format!("{clamped} step(s): replica compute exceeded the step wall time, overhead clamped to 0"));
        }
        let trace = trace.with_overhead(overhead)?;
        Ok(Loaded { trace, completeness, notes })
    }
}

/// One CSV record with its file and line, for [`WhatifAccumulator::push`].
struct CsvRecord<'a> {
    path: &'a Path,
    line: u64,
    rec: &'a csv::StringRecord,
}

impl CsvRecord<'_> {
    fn get(&self, i: usize) -> &str {
        self.rec.get(i).unwrap_or("").trim()
    }
    fn parse<T: std::str::FromStr>(&self, i: usize) -> Result<T, TraceError>
    where
        T::Err: std::fmt::Display,
    {
        self.get(i).parse().map_err(|e| TraceError::Malformed {
            path: self.path.into(),
            line: self.line,
            column: WHATIF_COLUMNS[i].into(),
            message: format!("cannot parse {:?}: {e}", self.get(i)),
        })
    }
}

impl WhatifRecord for CsvRecord<'_> {
    fn int(&self, col: usize) -> Result<i64, TraceError> {
        self.parse(col)
    }
    fn float(&self, col: usize) -> Result<f64, TraceError> {
        self.parse(col)
    }
    fn text(&self, col: usize) -> Result<&str, TraceError> {
        Ok(self.get(col))
    }
}

/// Load one what-if CSV (optionally gzipped). Errors: I/O; [`TraceError::UnknownFormat`] if
/// the header is not [`WHATIF_COLUMNS`]; [`TraceError::Malformed`] with file, line and column
/// for unparsable or negative fields and for an mb_id < 0 on a compute op;
/// [`TraceError::Duplicate`] for two forward (or backward) ops of one (step, replica, stage,
/// micro-batch); ragged steps (a missing stage, forward or backward) unless allowed.
pub fn load_csv(path: &Path, opts: &LoadOptions) -> Result<Loaded, TraceError> {
    load_csv_from(open_maybe_gz(path)?, path, opts)
}

/// [`load_csv`] of a what-if CSV held in memory (plain, not gzipped): for fuzzing and property
/// tests. `name` labels errors. Errors: as [`load_csv`].
pub fn load_csv_bytes(name: &Path, bytes: &[u8], opts: &LoadOptions) -> Result<Loaded, TraceError> {
    load_csv_from(bytes, name, opts)
}

fn load_csv_from(src: impl std::io::Read, path: &Path, opts: &LoadOptions) -> Result<Loaded, TraceError> {
    let (src, lines) = crate::csv_lines::LineIndex::new(src);
    let mut r = csv::ReaderBuilder::new().from_reader(src);
    let headers: Vec<String> =
        r.headers().map_err(|e| super::csv_error(path, 1, "(header)", e))?.iter().map(str::to_string).collect();
    if !is_whatif_header(&headers) {
        return Err(TraceError::UnknownFormat { path: path.into(), header: headers });
    }
    let mut acc = WhatifAccumulator::new(path);
    super::for_each_record(&mut r, &lines, path, |line, rec| acc.push(line, &CsvRecord { path, line, rec }))?;
    acc.finish(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "dp_rank,stage,rank,step,optype,start_ts,duration,seq_id,mc,mb_id,gmc\n";

    /// Writes `body` under the header into a fresh temporary directory (removed when the
    /// returned guard drops).
    fn write(name: &str, body: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::Builder::new().prefix("dropcompute-whatif-").tempdir().expect("temp dir");
        let p = d.path().join(name);
        std::fs::write(&p, format!("{HEADER}{body}")).expect("write");
        (d, p)
    }

    /// One step, 1 replica, 2 stages, 2 micro-batches, plus an optimizer op ending at 1.0 s.
    fn small() -> String {
        let mut s = String::new();
        // stage, mb, fwd, bwd
        for (st, mb, f, b) in [(0, 0, 0.1, 0.2), (0, 1, 0.1, 0.3), (1, 0, 0.2, 0.2), (1, 1, 0.05, 0.05)] {
            s += &format!("0,{st},{st},7,forward-compute,0.0,{f},0,0,{mb},0\n");
            s += &format!("0,{st},{st},7,backward-compute,0.1,{b},0,0,{mb},0\n");
        }
        s += "0,0,0,7,optimizer,0.9,0.1,0,0,-1,-1\n";
        s
    }

    #[test]
    fn bottleneck_and_sum_aggregations() {
        let (_d, p) = write("small.csv", &small());
        let l = load_csv(&p, &LoadOptions::default()).expect("load");
        let m = l.trace.step_matrix(0);
        assert!((m[0] - 0.4e9).abs() < 1.0 && (m[1] - 0.4e9).abs() < 1.0, "{m:?}");
        // wall 1.0 s - compute 0.8 s
        assert!((l.trace.overhead_ns()[0] - 0.2e9).abs() < 1.0);
        let opts = LoadOptions { pipeline: PipelineAggregation::Sum, ..Default::default() };
        let s = load_csv(&p, &opts).expect("load");
        let m = s.trace.step_matrix(0);
        assert!((m[0] - 0.7e9).abs() < 1.0 && (m[1] - 0.5e9).abs() < 1.0, "{m:?}");
        assert_eq!(s.trace.overhead_ns()[0], 0.0);
        assert!(s.notes.iter().any(|n| n.contains("clamped")));
    }

    #[test]
    fn missing_backward_is_reported_and_bad_field_located() {
        let body: String = small()
            .lines()
            .filter(|l| *l != "0,1,1,7,backward-compute,0.1,0.05,0,0,1,0")
            .map(|l| format!("{l}\n"))
            .collect();
        let (_d1, p) = write("ragged.csv", &body);
        match load_csv(&p, &LoadOptions::default()) {
            Err(TraceError::Ragged { missing, .. }) => assert_eq!(missing, vec![(7, 0, 1)]),
            other => panic!("expected Ragged, got {other:?}"),
        }
        // Allowed, the only step is removed: no step left, for that reason, with its count.
        let allow = LoadOptions { allow_incomplete_steps: true, ..Default::default() };
        match load_csv(&p, &allow) {
            Err(TraceError::NoCompleteStep { steps, ragged_steps, missing_cells, missing, .. }) => {
                assert_eq!((steps, ragged_steps, missing_cells, missing), (1, 1, 1, vec![(7, 0, 1)]));
            }
            other => panic!("expected NoCompleteStep, got {other:?}"),
        }
        let (_d2, p) = write("bad.csv", "0,0,0,7,forward-compute,0.0,abc,0,0,0,0\n");
        match load_csv(&p, &LoadOptions::default()) {
            Err(TraceError::Malformed { line, column, .. }) => {
                assert_eq!((line, column.as_str()), (2, "duration"));
            }
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn crlf_errors_name_the_physical_line() {
        for eol in ["\n", "\r\n"] {
            let mut lines = vec![WHATIF_COLUMNS.join(",")];
            lines.extend(small().lines().map(str::to_string));
            lines[3] = "0,1,1,7,forward-compute,0.0,abc,0,0,0,0".into(); // physical line 4
            let text = lines.join(eol) + eol;
            let e = load_csv_bytes(Path::new("w.csv"), text.as_bytes(), &LoadOptions::default()).unwrap_err();
            assert!(
                matches!(&e, TraceError::Malformed { line: 4, column, .. } if column == "duration"),
                "{eol:?}: {e}"
            );
        }
    }

    #[test]
    fn every_column_of_every_record_is_parsed() {
        // A bad value in any column of a compute op and of a non-compute op (the optimizer
        // record, last line) is an error at that column, never a silently skipped record.
        let rows: Vec<String> = small().lines().map(str::to_string).collect();
        for row in [0, rows.len() - 1] {
            for (col, column) in WHATIF_COLUMNS.iter().enumerate() {
                let mut lines = rows.clone();
                let mut cells: Vec<&str> = rows[row].split(',').collect();
                cells[col] = if *column == "optype" { "" } else { "x" };
                lines[row] = cells.join(",");
                let text = format!("{}\n{}\n", WHATIF_COLUMNS.join(","), lines.join("\n"));
                let e = load_csv_bytes(Path::new("w.csv"), text.as_bytes(), &LoadOptions::default());
                let line = row as u64 + 2;
                assert!(
                    matches!(&e, Err(TraceError::Malformed { line: l, column: c, .. }) if *l == line && c == column),
                    "row {row}, {column}: {e:?}"
                );
            }
        }
    }
}
