//! Latency traces: every input format becomes one [`LatencyTrace`].
//!
//! Owns: the trace type, its validation, the [`TraceBuilder`] that all parsers feed (duplicate,
//! missing and ragged micro-batches are detected here, once), and [`load`] which picks a parser
//! by file contents. Must not touch: tuning, simulation or the scheduler's runtime state.
//!
//! Units: latencies and overheads are f64 nanoseconds. f64 because the tuner and the models work
//! in f64, sums never overflow, and integers up to 2^53 ns (104 days) are exact.
#![forbid(unsafe_code)]

pub mod compute_log;
pub mod whatif;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors of trace parsing and validation. Every parse error names the file, the 1-based line
/// and the column.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The bounded reader refused the file or could not open it (`crate::input`: absent, a
    /// directory, a size or line cap, a stop signal while waiting for a FIFO).
    #[error("{0}")]
    Input(#[from] crate::input::InputError),
    /// The file could not be opened or read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A field could not be parsed or is out of range.
    #[error("{path}:{line}: column `{column}`: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number (CSV: the header is line 1). Parquet: the 1-based data row, or 0
        /// for the file's metadata and schema.
        line: u64,
        /// Column name.
        column: String,
        /// What is wrong, including the offending value.
        message: String,
    },
    /// The header does not match any supported format.
    #[error("{path}: unrecognised header {header:?} (expected a compute log or a what-if trace)")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// The header found.
        header: Vec<String>,
    },
    /// The same (step, rank, micro-batch) appears twice.
    #[error(
        "{path}:{line}: duplicate micro-batch (step {step}, rank {rank}, micro-batch {micro_batch}); first seen at {first_path}:{first_line}"
    )]
    Duplicate {
        /// The file of the second occurrence.
        path: PathBuf,
        /// The file of the first occurrence (the same file, or an earlier one of the inputs).
        first_path: PathBuf,
        /// Line of the second occurrence.
        line: u64,
        /// First occurrence.
        first_line: u64,
        /// Step id.
        step: u64,
        /// Rank id.
        rank: u32,
        /// Micro-batch index.
        micro_batch: u32,
    },
    /// Some (step, rank, micro-batch) cells are missing, so the trace is not an N x M matrix per
    /// step. `missing` lists up to 20 of them.
    #[error(
        "{source_name}: {count} missing micro-batch latencies (ragged trace), e.g. (step, rank, micro-batch) {missing:?}; pass --allow-incomplete-steps (tune) to drop those steps"
    )]
    Ragged {
        /// Where the data came from.
        source_name: String,
        /// Total missing cells.
        count: usize,
        /// Up to 20 examples.
        missing: Vec<(u64, u32, u32)>,
    },
    /// Shapes do not agree (e.g. when constructing or merging traces).
    #[error("trace shape: {0}")]
    Shape(String),
    /// The input holds no latency at all (no step to remove). When steps were removed, the
    /// error is [`TraceError::Ragged`] or [`TraceError::NoCompleteStep`], with the reason.
    #[error("{0}: no complete step in trace")]
    Empty(String),
    /// A rank of a compute log measured no micro-batch in the whole log (every row of it
    /// dropped): its dropped or unassigned cells have no latency to be estimated from.
    #[error(
        "{source_name}: rank {rank} computed no micro-batch in the whole log: its dropped micro-batches' latency cannot be estimated; tune from a log of a run without drops (the baseline run's)"
    )]
    Unmeasured {
        /// The log(s).
        source_name: String,
        /// The rank.
        rank: u32,
    },
    /// No step is left after removing the ragged ones (cells missing without a row: a
    /// dropped micro-batch has a row and is filled, never a reason to remove a step): the
    /// counts, so the user knows which rows are missing.
    #[error(
        "{source_name}: no complete step left of {steps}: {ragged_steps} ragged step(s) with {missing_cells} missing micro-batch latencies, e.g. (step, rank, micro-batch) {missing:?}"
    )]
    NoCompleteStep {
        /// Where the data came from.
        source_name: String,
        /// Steps in the input.
        steps: usize,
        /// Steps removed for missing cells.
        ragged_steps: usize,
        /// Missing cells over the ragged steps.
        missing_cells: usize,
        /// Up to 20 missing (step, rank, micro-batch) cells of the ragged steps.
        missing: Vec<(u64, u32, u32)>,
    },
    /// Too little data for an answer (`dropcompute tune`): fewer than `min_steps` complete
    /// steps or fewer than 2 ranks.
    #[error(
        "{source_name}: insufficient data: {steps} complete step(s) x {ranks} rank(s){}; a verdict needs at least {min_steps} steps and 2 ranks",
        warmup_note(*warmup_removed)
    )]
    InsufficientData {
        /// The trace.
        source_name: String,
        /// Complete steps in it that count (after the warm-up).
        steps: usize,
        /// Steps of the trace left out as warm-up (`--warmup-steps`), not in `steps`.
        warmup_removed: usize,
        /// Ranks in it.
        ranks: usize,
        /// The minimum (`tune::MIN_STEPS`).
        min_steps: usize,
    },
    /// Parquet input in a build without the `parquet` cargo feature.
    #[error("{path}: Parquet traces are not supported by this build: {reason}")]
    ParquetUnsupported {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
}

/// The part of [`TraceError::InsufficientData`]'s message that names the warm-up.
fn warmup_note(removed: usize) -> String {
    if removed == 0 {
        String::new()
    } else {
        format!(" after the first {removed} step(s), left out as warm-up (--warmup-steps)")
    }
}

/// Per step an N x M matrix of micro-batch latencies plus the per-step overhead, and per step
/// and rank the compute-clock offset of the first micro-batch and the skew of the rank's
/// compute clock start.
///
/// Layout: `latencies_ns[(s * N + n) * M + m]` for step index s (0..S), rank index n (0..N),
/// micro-batch m (0..M); `start_ns[s * N + n]`, `skew_ns[s * N + n]`. Invariants (checked by
/// [`LatencyTrace::new`], [`LatencyTrace::with_start_offsets`] and
/// [`LatencyTrace::with_skews`]): every latency, overhead, offset and skew is finite and >= 0;
/// lengths agree; N, M, S >= 1.
///
/// A step's time in the replay is `max_r(skew_r + offset_r + compute_r) + overhead`: the skew
/// is when rank r's compute clock starts after the step's earliest (a rank whose update runs
/// longer starts its next step later), the offset and the compute run on the rank's own clock
/// (its deadline counts from its own clock start), and the overhead is the rest of the step
/// (collective, rescale, update) net of the skew.
///
/// A *length-carrying* trace also holds each micro-batch's length bucket
/// ([`LatencyTrace::with_buckets`], same layout as the latencies): what the length-aware policies
/// (`policy::bucket`) replay. A trace without them (every format before the column, the
/// What-if CSV, the reference's logs) has none, and those policies then run blind.
///
/// A trace of a run whose unit of work is tokens may also hold each micro-batch's real token
/// count ([`LatencyTrace::with_tokens`], same layout): the replay then counts its work, drop
/// rate and effective speedup in tokens (`sim::policies`), so the tuner's guardrail judges the
/// drop rate in tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyTrace {
    source: String,
    ranks: Vec<u32>,
    steps: Vec<u64>,
    micro_batches: usize,
    latencies_ns: Vec<f64>,
    overhead_ns: Vec<f64>,
    start_ns: Vec<f64>,
    skew_ns: Vec<f64>,
    buckets: Option<Vec<u32>>,
    tokens: Option<Vec<u64>>,
}

impl LatencyTrace {
    /// Build and validate. `ranks`: N rank ids (data-parallel replicas); `steps`: S step ids;
    /// `latencies_ns`: S*N*M values (see the type's layout); `overhead_ns`: S values
    /// (communication + optimizer + anything outside the compute phase, ns).
    /// Errors: [`TraceError::Shape`] on a length mismatch, an empty dimension or a negative /
    /// non-finite value.
    pub fn new(
        source: impl Into<String>,
        ranks: Vec<u32>,
        steps: Vec<u64>,
        micro_batches: usize,
        latencies_ns: Vec<f64>,
        overhead_ns: Vec<f64>,
    ) -> Result<Self, TraceError> {
        let source = source.into();
        let (s, n, m) = (steps.len(), ranks.len(), micro_batches);
        if s == 0 || n == 0 || m == 0 {
            return Err(TraceError::Shape(format!(
                "{source}: empty dimension: {s} steps, {n} ranks, {m} micro-batches"
            )));
        }
        if latencies_ns.len() != s * n * m || overhead_ns.len() != s {
            return Err(TraceError::Shape(format!(
                "{source}: {} latencies for {s}x{n}x{m}, {} overheads for {s} steps",
                latencies_ns.len(),
                overhead_ns.len()
            )));
        }
        if let Some((i, v)) =
            latencies_ns.iter().chain(&overhead_ns).enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(TraceError::Shape(format!("{source}: value #{i} is {v} (must be finite and >= 0)")));
        }
        let start_ns = vec![0.0; s * n];
        let skew_ns = vec![0.0; s * n];
        Ok(Self {
            source,
            ranks,
            steps,
            micro_batches,
            latencies_ns,
            overhead_ns,
            start_ns,
            skew_ns,
            buckets: None,
            tokens: None,
        })
    }

    /// The same trace with per step and rank the device time (ns) from the step's compute
    /// clock start to the start of the rank's first micro-batch (S x N values, step-major; e.g.
    /// work the job enqueues between the previous update and the first micro-batch). A trace
    /// built by [`LatencyTrace::new`] has offsets 0 (what a compute log or What-if CSV records).
    /// The replay adds the offset to the elapsed time every deadline check sees.
    ///
    /// # Errors
    /// [`TraceError::Shape`] when `start_ns` has not S x N values or one is negative or not
    /// finite.
    pub fn with_start_offsets(mut self, start_ns: Vec<f64>) -> Result<Self, TraceError> {
        if start_ns.len() != self.start_ns.len() {
            return Err(TraceError::Shape(format!(
                "{}: {} start offsets for {} steps x {} ranks",
                self.source,
                start_ns.len(),
                self.steps.len(),
                self.ranks.len()
            )));
        }
        if let Some((i, v)) = start_ns.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0)) {
            return Err(TraceError::Shape(format!(
                "{}: start offset #{i} is {v} (must be finite and >= 0)",
                self.source
            )));
        }
        self.start_ns = start_ns;
        Ok(self)
    }

    /// The same trace with per step and rank the skew of the rank's compute clock start (ns):
    /// its clock start minus the step's earliest clock start over the ranks (S x N values,
    /// step-major, each >= 0; the earliest rank's is 0). A rank whose update (or anything after
    /// the collective) runs longer starts its next step that much later; its deadline still
    /// counts from its own clock start, so the replay adds the skew to the rank's finish time,
    /// not to the elapsed time its checks see. A trace built by [`LatencyTrace::new`] has skews
    /// 0 (a compute log, a What-if CSV); `schedule::auto::trace_of_reports` measures them from
    /// the gathered count rows.
    ///
    /// # Errors
    /// [`TraceError::Shape`] when `skew_ns` has not S x N values or one is negative or not
    /// finite.
    pub fn with_skews(mut self, skew_ns: Vec<f64>) -> Result<Self, TraceError> {
        if skew_ns.len() != self.skew_ns.len() {
            return Err(TraceError::Shape(format!(
                "{}: {} clock skews for {} steps x {} ranks",
                self.source,
                skew_ns.len(),
                self.steps.len(),
                self.ranks.len()
            )));
        }
        if let Some((i, v)) = skew_ns.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0)) {
            return Err(TraceError::Shape(format!(
                "{}: clock skew #{i} is {v} (must be finite and >= 0)",
                self.source
            )));
        }
        self.skew_ns = skew_ns;
        Ok(self)
    }

    /// The same trace with its per-step overhead replaced by `overhead_ns` (S values), validated
    /// as by [`LatencyTrace::new`]. Used by loaders that derive the overhead after building (the compute log, a run's report). Errors: as [`LatencyTrace::new`] (a negative or non-finite value, a wrong length).
    pub fn with_overhead(self, overhead_ns: Vec<f64>) -> Result<Self, TraceError> {
        let (start_ns, skew_ns, buckets, tokens) = (self.start_ns, self.skew_ns, self.buckets, self.tokens);
        let mut t = Self::new(self.source, self.ranks, self.steps, self.micro_batches, self.latencies_ns, overhead_ns)?
            .with_start_offsets(start_ns)?
            .with_skews(skew_ns)?;
        t.buckets = buckets;
        t.tokens = tokens;
        Ok(t)
    }

    /// The same trace carrying each micro-batch's length bucket: S x N x M values in the
    /// latencies' layout (`buckets[(s * N + n) * M + m]`; a bucket is the job's index of the
    /// padded length, ascending in length). The length-aware policies replay them.
    ///
    /// # Errors
    /// [`TraceError::Shape`] when `buckets` has not S x N x M values.
    pub fn with_buckets(mut self, buckets: Vec<u32>) -> Result<Self, TraceError> {
        if buckets.len() != self.latencies_ns.len() {
            return Err(TraceError::Shape(format!(
                "{}: {} buckets for {} micro-batch latencies",
                self.source,
                buckets.len(),
                self.latencies_ns.len()
            )));
        }
        self.buckets = Some(buckets);
        Ok(self)
    }

    /// The same trace carrying each micro-batch's real (non-padding) token count: S x N x M
    /// values in the latencies' layout. The replay then weighs its work in tokens.
    ///
    /// # Errors
    /// [`TraceError::Shape`] when `tokens` has not S x N x M values.
    pub fn with_tokens(mut self, tokens: Vec<u64>) -> Result<Self, TraceError> {
        if tokens.len() != self.latencies_ns.len() {
            return Err(TraceError::Shape(format!(
                "{}: {} token counts for {} micro-batch latencies",
                self.source,
                tokens.len(),
                self.latencies_ns.len()
            )));
        }
        self.tokens = Some(tokens);
        Ok(self)
    }

    /// Every micro-batch's real tokens (S x N x M, the latencies' layout), `None` for a trace
    /// of a run that weighs samples.
    pub fn tokens(&self) -> Option<&[u64]> {
        self.tokens.as_deref()
    }

    /// Every micro-batch's bucket (S x N x M, the latencies' layout), `None` for a trace
    /// without the column.
    pub fn buckets(&self) -> Option<&[u32]> {
        self.buckets.as_deref()
    }

    /// The N x M buckets of step index `s` (row-major by rank), `None` without buckets or for
    /// an out-of-range `s`.
    pub fn step_buckets(&self, s: usize) -> Option<&[u32]> {
        let w = self.ranks.len() * self.micro_batches;
        self.buckets.as_deref().and_then(|b| b.get(s * w..(s + 1) * w))
    }

    /// Where the trace came from (file names).
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Rank ids (N).
    pub fn ranks(&self) -> &[u32] {
        &self.ranks
    }
    /// Step ids (S).
    pub fn steps(&self) -> &[u64] {
        &self.steps
    }
    /// N.
    pub fn world_size(&self) -> usize {
        self.ranks.len()
    }
    /// S.
    pub fn num_steps(&self) -> usize {
        self.steps.len()
    }
    /// The step id at which a warm-up of `steps` steps of this trace ends: the id of its
    /// `steps`-th step (0-based), or one past the last step when the warm-up covers them all.
    /// `--warmup-steps` of `tune` and `simulate` counts steps, while the replay
    /// ([`crate::sim::replay::ExecutionModel::warmup_steps`]) compares step ids, and a trace's
    /// ids need not start at 0 (the What-if trace-SE starts at 16).
    pub fn warmup_end(&self, steps: u64) -> u64 {
        let last = self.steps.last().copied().unwrap_or(0);
        usize::try_from(steps).ok().and_then(|i| self.steps.get(i).copied()).unwrap_or(last.saturating_add(1))
    }
    /// M.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }
    /// All latencies (ns), S*N*M, layout as documented on the type.
    pub fn latencies_ns(&self) -> &[f64] {
        &self.latencies_ns
    }
    /// The N*M latency matrix (ns) of step index `s` (row-major by rank). Panics-free: returns
    /// an empty slice for an out-of-range `s`.
    pub fn step_matrix(&self, s: usize) -> &[f64] {
        let w = self.ranks.len() * self.micro_batches;
        self.latencies_ns.get(s * w..(s + 1) * w).unwrap_or(&[])
    }
    /// Per step and rank, the offset (ns) of the first micro-batch from the step's compute clock
    /// start (S x N, step-major; see [`LatencyTrace::with_start_offsets`]).
    pub fn start_offsets_ns(&self) -> &[f64] {
        &self.start_ns
    }
    /// Per step and rank, the skew (ns) of the rank's compute clock start after the step's
    /// earliest (S x N, step-major; see [`LatencyTrace::with_skews`]).
    pub fn skews_ns(&self) -> &[f64] {
        &self.skew_ns
    }
    /// Per-step overhead (S values, ns).
    pub fn overhead_ns(&self) -> &[f64] {
        &self.overhead_ns
    }
    /// Per-step compute time of each rank: S*N sums over micro-batches (ns).
    pub fn rank_compute_ns(&self) -> Vec<f64> {
        self.latencies_ns.chunks_exact(self.micro_batches).map(|c| c.iter().sum()).collect()
    }

    /// Concatenate traces with the same ranks and M along the step axis (e.g. several windows);
    /// the result carries buckets (tokens) when every input does.
    /// Errors: [`TraceError::Shape`] if ranks or M differ, or the list is empty.
    pub fn concat_steps(traces: &[LatencyTrace]) -> Result<LatencyTrace, TraceError> {
        let first = traces.first().ok_or_else(|| TraceError::Shape("no trace to concatenate".into()))?;
        let mut out = first.clone();
        for t in &traces[1..] {
            if t.ranks != first.ranks || t.micro_batches != first.micro_batches {
                return Err(TraceError::Shape(format!(
                    "cannot concatenate {} ({} ranks, M={}) with {} ({} ranks, M={})",
                    t.source,
                    t.ranks.len(),
                    t.micro_batches,
                    first.source,
                    first.ranks.len(),
                    first.micro_batches
                )));
            }
            out.steps.extend_from_slice(&t.steps);
            out.latencies_ns.extend_from_slice(&t.latencies_ns);
            out.overhead_ns.extend_from_slice(&t.overhead_ns);
            out.start_ns.extend_from_slice(&t.start_ns);
            out.skew_ns.extend_from_slice(&t.skew_ns);
            // Buckets survive only when every part carries them.
            out.buckets = match (out.buckets.take(), &t.buckets) {
                (Some(mut a), Some(b)) => {
                    a.extend_from_slice(b);
                    Some(a)
                }
                _ => None,
            };
            out.tokens = match (out.tokens.take(), &t.tokens) {
                (Some(mut a), Some(b)) => {
                    a.extend_from_slice(b);
                    Some(a)
                }
                _ => None,
            };
            out.source = format!("{} + {}", out.source, t.source);
        }
        Ok(out)
    }
}

/// What [`TraceBuilder::finish`] dropped when incomplete steps were allowed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completeness {
    /// Step ids removed because some cell was missing, with the number of missing cells.
    pub dropped_steps: Vec<(u64, usize)>,
    /// Up to 20 examples of missing (step, rank, micro-batch) cells.
    pub missing_examples: Vec<(u64, u32, u32)>,
}

/// Collects (step, rank, micro-batch) -> latency cells from any parser and turns them into a
/// [`LatencyTrace`], detecting duplicates (error at insertion) and missing cells (error or
/// report at [`TraceBuilder::finish`]), never filling anything in.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    /// (step, rank, micro-batch) -> (latency ns, line, index in `files`).
    cells: BTreeMap<(u64, u32, u32), (f64, u64, usize)>,
    /// The files cells came from, in first-insertion order (named by duplicate errors).
    files: Vec<PathBuf>,
    overhead: BTreeMap<u64, f64>,
    expected_m: usize,
}

/// Reads every record of `r`, calling `f(line, record)` with the record's physical line (from
/// `lines`, filled by the [`crate::csv_lines::LineIndex`] `r` reads through: right for `\n`
/// and `\r\n` endings alike); a CSV-level error (bad UTF-8, I/O, truncated gzip) becomes
/// [`TraceError::Malformed`] at its line with column `(record)`.
pub(crate) fn for_each_record<R: std::io::Read>(
    r: &mut csv::Reader<R>,
    lines: &crate::csv_lines::LineMap,
    path: &Path,
    mut f: impl FnMut(u64, &csv::StringRecord) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let mut rec = csv::StringRecord::new();
    loop {
        let more = r.read_record(&mut rec).map_err(|e| {
            let line = lines.line_of_position(e.position());
            csv_error(path, line, "(record)", e)
        })?;
        if !more {
            return Ok(());
        }
        f(lines.line_of_position(rec.position()), &rec)?;
    }
}

/// A latency or duration must be finite and >= 0; the error names `column`.
fn check_ns(path: &Path, line: u64, column: &str, ns: f64) -> Result<(), TraceError> {
    if ns.is_finite() && ns >= 0.0 {
        return Ok(());
    }
    Err(TraceError::Malformed {
        path: path.into(),
        line,
        column: column.into(),
        message: format!("{column} {ns} ns is negative or not finite"),
    })
}

impl TraceBuilder {
    /// Empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one micro-batch latency (ns) found at `path:line`.
    /// Errors: [`TraceError::Duplicate`] if the cell exists; [`TraceError::Malformed`] (column
    /// `latency`) if the value is negative or not finite.
    pub fn insert(
        &mut self,
        path: &Path,
        line: u64,
        step: u64,
        rank: u32,
        micro_batch: u32,
        latency_ns: f64,
    ) -> Result<(), TraceError> {
        check_ns(path, line, "latency", latency_ns)?;
        let file = self.file_index(path);
        match self.cells.entry((step, rank, micro_batch)) {
            std::collections::btree_map::Entry::Occupied(e) => Err(TraceError::Duplicate {
                path: path.into(),
                first_path: self.files[e.get().2].clone(),
                line,
                first_line: e.get().1,
                step,
                rank,
                micro_batch,
            }),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert((latency_ns, line, file));
                Ok(())
            }
        }
    }

    /// The index of `path` in `files`, adding it if new (inputs are a handful of files).
    fn file_index(&mut self, path: &Path) -> usize {
        match self.files.iter().rposition(|f| f == path) {
            Some(i) => i,
            None => {
                self.files.push(path.to_path_buf());
                self.files.len() - 1
            }
        }
    }

    /// Add `latency_ns` to a cell (creating it), for formats where one micro-batch has several
    /// ops (forward + backward). Errors as [`TraceBuilder::insert`] for the value.
    pub fn accumulate(
        &mut self,
        path: &Path,
        line: u64,
        key: (u64, u32, u32),
        latency_ns: f64,
    ) -> Result<(), TraceError> {
        check_ns(path, line, "duration", latency_ns)?;
        let file = self.file_index(path);
        self.cells.entry(key).or_insert((0.0, line, file)).0 += latency_ns;
        Ok(())
    }

    /// Declare that steps have at least `m` micro-batches (indices 0..m), so a micro-batch
    /// missing on every rank is still reported.
    pub fn expect_micro_batches(&mut self, m: usize) {
        self.expected_m = self.expected_m.max(m);
    }

    /// Set the overhead (ns) of a step (default 0).
    pub fn set_overhead(&mut self, step: u64, overhead_ns: f64) {
        self.overhead.insert(step, overhead_ns);
    }

    /// Cells collected so far, keyed by (step, rank, micro-batch), value (latency ns, line).
    pub fn cells(&self) -> &BTreeMap<(u64, u32, u32), (f64, u64, usize)> {
        &self.cells
    }

    /// Build the trace over the union of steps, ranks and micro-batch indices 0..=max seen.
    /// A step with any missing cell is an error ([`TraceError::Ragged`]) unless
    /// `allow_incomplete_steps`, in which case it is removed and listed in the returned
    /// [`Completeness`]. Errors: [`TraceError::Empty`] if there is no cell at all;
    /// [`TraceError::NoCompleteStep`] (every step ragged, with the counts) if every step was
    /// removed.
    pub fn finish(
        self,
        source: &str,
        allow_incomplete_steps: bool,
    ) -> Result<(LatencyTrace, Completeness), TraceError> {
        let split = self.split(source)?;
        let total_missing: usize = split.report.dropped_steps.iter().map(|&(_, n)| n).fold(0, usize::saturating_add);
        if total_missing > 0 && !allow_incomplete_steps {
            return Err(TraceError::Ragged {
                source_name: source.into(),
                count: total_missing,
                missing: split.report.missing_examples,
            });
        }
        match split.trace {
            Some(t) => Ok((t, split.report)),
            None if split.steps == 0 => Err(TraceError::Empty(source.into())),
            None => Err(TraceError::NoCompleteStep {
                source_name: source.into(),
                steps: split.steps,
                ragged_steps: split.report.dropped_steps.len(),
                missing_cells: total_missing,
                missing: split.report.missing_examples,
            }),
        }
    }

    /// Splits the steps into complete ones (the trace, None when there is none) and incomplete
    /// ones (the report, with every removed step and its missing-cell count), leaving the
    /// policy to the caller ([`TraceBuilder::finish`]; the compute-log reader, which tells
    /// steps with dropped micro-batches from ragged ones). Errors: only an inconsistent trace
    /// ([`LatencyTrace::new`]).
    pub(crate) fn split(self, source: &str) -> Result<Split, TraceError> {
        let steps: Vec<u64> = {
            let mut v: Vec<u64> = self.cells.keys().map(|k| k.0).collect();
            v.dedup();
            v
        };
        let mut ranks: Vec<u32> = self.cells.keys().map(|k| k.1).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let m = self.cells.keys().map(|k| k.2 as usize + 1).max().unwrap_or(0).max(self.expected_m);
        let mut report = Completeness::default();
        let mut kept_steps = Vec::new();
        let mut lat = Vec::new();
        let mut overhead = Vec::new();
        // Cells per step = ranks x m, which untrusted input (a micro-batch index near u32::MAX)
        // can make huge: count the present cells first; a complete step has exactly that many,
        // and an incomplete one is walked only until 20 missing examples are known (at most
        // present + 20 lookups), so time and memory stay bounded by the input.
        let per_step = ranks.len().saturating_mul(m);
        for &s in &steps {
            let present = self.cells.range((s, 0, 0)..=(s, u32::MAX, u32::MAX)).count();
            let missing = per_step.saturating_sub(present);
            let mut row = Vec::new();
            'walk: for &r in &ranks {
                for mb in (0..m).map(|mb| mb as u32) {
                    if missing > 0 && report.missing_examples.len() >= 20 {
                        break 'walk;
                    }
                    match self.cells.get(&(s, r, mb)) {
                        Some(&(v, _, _)) if missing == 0 => row.push(v),
                        Some(_) => {}
                        None => report.missing_examples.push((s, r, mb)),
                    }
                }
            }
            if missing == 0 {
                kept_steps.push(s);
                lat.extend(row);
                overhead.push(self.overhead.get(&s).copied().unwrap_or(0.0));
            } else {
                report.dropped_steps.push((s, missing));
            }
        }
        let trace = if kept_steps.is_empty() {
            None
        } else {
            Some(LatencyTrace::new(source, ranks, kept_steps, m, lat, overhead)?)
        };
        Ok(Split { steps: steps.len(), trace, report })
    }
}

/// The complete and incomplete steps of a [`TraceBuilder`] ([`TraceBuilder::split`]).
#[derive(Debug)]
pub(crate) struct Split {
    /// Steps seen (complete or not).
    pub steps: usize,
    /// The complete steps, None when none is.
    pub trace: Option<LatencyTrace>,
    /// The removed steps with their missing cells.
    pub report: Completeness,
}

/// Options shared by the parsers.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Drop (and report) steps with missing micro-batches instead of failing.
    pub allow_incomplete_steps: bool,
    /// Per-step overhead (ns) to assume for the reference's compute logs, which do not record
    /// step wall time (default 0: optimistic, the caller should say so).
    pub reference_overhead_ns: f64,
    /// How a pipeline-parallel replica's micro-batch latency is derived from what-if traces.
    pub pipeline: whatif::PipelineAggregation,
}

/// A loaded trace with what was dropped and any notes for the user.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The trace.
    pub trace: LatencyTrace,
    /// Steps removed for missing cells.
    pub completeness: Completeness,
    /// Human-readable notes (assumptions made, clamped overheads).
    pub notes: Vec<String>,
}

/// Load trace files: every compute-log file (ours or the reference's per-rank logs) is merged
/// into one trace keyed by rank; every what-if file (CSV, CSV.gz, or `.parquet` with the
/// `parquet` feature) is its own trace. Without the feature `.parquet` gives
/// [`TraceError::ParquetUnsupported`].
/// Errors: any parser error, with file, line and column.
pub fn load(paths: &[PathBuf], opts: &LoadOptions) -> Result<Vec<Loaded>, TraceError> {
    let mut out = Vec::new();
    let mut logs = Vec::new();
    for p in paths {
        if p.extension().is_some_and(|e| e == "parquet") {
            out.push(whatif::load_parquet(p, opts)?);
            continue;
        }
        let header = compute_log::read_header(p)?;
        if whatif::is_whatif_header(&header) {
            out.push(whatif::load_csv(p, opts)?);
        } else if compute_log::is_compute_log_header(&header) {
            logs.push(p.clone());
        } else {
            return Err(TraceError::UnknownFormat { path: p.clone(), header });
        }
    }
    if !logs.is_empty() {
        out.insert(0, compute_log::load_logs(&logs, opts)?);
    }
    Ok(out)
}

/// Open a trace file through the one bounded reader (`crate::input`, kind trace: its size and
/// line caps), transparently gunzipping a gzip file.
/// Errors: [`TraceError::Input`] (absent, a directory, a cap, a stop signal while waiting).
pub fn open_maybe_gz(path: &Path) -> Result<Box<dyn std::io::Read>, TraceError> {
    Ok(Box::new(crate::input::open(path, crate::input::InputKind::Trace)?))
}

/// A CSV error at `line`/`column` of `path`: [`TraceError::Input`] when the bounded reader
/// refused the file (a cap, a stop signal), else [`TraceError::Malformed`].
pub(crate) fn csv_error(path: &Path, line: u64, column: &str, e: csv::Error) -> TraceError {
    let message = e.to_string();
    if let csv::ErrorKind::Io(io) = e.into_kind()
        && let Ok(input) = crate::input::InputError::from_io(io)
    {
        return TraceError::Input(input);
    }
    TraceError::Malformed { path: path.into(), line, column: column.into(), message }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A warm-up counts steps, whatever their ids (trace-SE's start at 16), with gaps.
    #[test]
    fn warmup_end_counts_steps_not_ids() {
        let t = LatencyTrace::new("t", vec![0, 1], vec![16, 17, 19, 40], 1, vec![1.0; 8], vec![0.0; 4]).expect("trace");
        let table = [(0, 16), (1, 17), (2, 19), (3, 40), (4, 41), (900, 41), (u64::MAX, 41)];
        for (steps, end) in table {
            assert_eq!(t.warmup_end(steps), end, "{steps}");
            let left = t.steps().iter().filter(|&&s| s >= end).count() as u64;
            assert_eq!(left, 4u64.saturating_sub(steps), "{steps}");
        }
    }

    /// Every trace format read through the one opener refuses an endless line (`/dev/zero`,
    /// and a file of 1.5 MiB without a newline) with a typed error naming the file, the cap and
    /// its variable, without buffering it.
    #[test]
    fn an_endless_line_is_refused_by_every_trace_loader() {
        use crate::input::{DEFAULT_LINE_CAP, InputError, LINE_VARIABLE};
        let dir = tempfile::tempdir().expect("temp dir");
        let long = vec![b'1'; (DEFAULT_LINE_CAP + DEFAULT_LINE_CAP / 2) as usize];
        let mut inputs: Vec<PathBuf> = Vec::new();
        for name in ["compute_logs_0.csv", "whatif.csv"] {
            let p = dir.path().join(name);
            std::fs::write(&p, &long).expect("write");
            inputs.push(p);
        }
        if Path::new("/dev/zero").exists() {
            inputs.push(PathBuf::from("/dev/zero"));
        }
        for p in &inputs {
            let e = load(std::slice::from_ref(p), &LoadOptions::default()).expect_err("refused");
            assert!(matches!(e, TraceError::Input(InputError::LineTooLong { .. })), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(LINE_VARIABLE) && text.contains(&p.display().to_string()), "{text}");
        }
    }

    /// A directory and a missing file are I/O errors naming the path (the C API's `DC_IO`,
    /// Python's `IsADirectoryError` / `FileNotFoundError`), not malformed traces.
    #[test]
    fn a_directory_or_a_missing_file_is_an_io_error() {
        use crate::input::InputError;
        let dir = tempfile::tempdir().expect("temp dir");
        let sub = dir.path().join("trace.csv.gz");
        std::fs::create_dir(&sub).expect("mkdir");
        for p in [dir.path().to_path_buf(), sub] {
            match load(std::slice::from_ref(&p), &LoadOptions::default()) {
                Err(TraceError::Input(InputError::Directory { path, .. })) => assert_eq!(path, p),
                other => panic!("{}: expected a directory error, got {other:?}", p.display()),
            }
        }
        let missing = dir.path().join("missing.csv");
        match load(std::slice::from_ref(&missing), &LoadOptions::default()) {
            Err(TraceError::Input(InputError::Io { path, source, .. })) => {
                assert_eq!(path, missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[test]
    fn builder_reports_missing_cells_and_rejects_duplicates() {
        let p = Path::new("x.csv");
        let mut b = TraceBuilder::new();
        for s in 0..2u64 {
            for r in 0..2u32 {
                for m in 0..3u32 {
                    if (s, r, m) != (1, 1, 2) {
                        b.insert(p, 2, s, r, m, 1.0 + f64::from(m)).expect("fresh cell");
                    }
                }
            }
        }
        let err = b.insert(p, 9, 0, 0, 0, 1.0).expect_err("duplicate");
        assert!(matches!(err, TraceError::Duplicate { first_line: 2, line: 9, .. }));
        let cells = std::mem::take(&mut b.cells);
        let strict = TraceBuilder { cells: cells.clone(), ..Default::default() };
        match strict.finish("x", false) {
            Err(TraceError::Ragged { count, missing, .. }) => {
                assert_eq!(count, 1);
                assert_eq!(missing, vec![(1, 1, 2)]);
            }
            other => panic!("expected Ragged, got {other:?}"),
        }
        let lax = TraceBuilder { cells, ..Default::default() };
        let (t, rep) = lax.finish("x", true).expect("one complete step");
        assert_eq!(t.steps(), &[0]);
        assert_eq!(rep.dropped_steps, vec![(1, 1)]);
        assert_eq!(t.step_matrix(0), &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        assert_eq!(t.rank_compute_ns(), vec![6.0, 6.0]);
    }

    #[cfg(not(feature = "parquet"))]
    #[test]
    fn parquet_needs_the_feature() {
        let p = PathBuf::from("trace-SE.parquet");
        match load(std::slice::from_ref(&p), &LoadOptions::default()) {
            Err(TraceError::ParquetUnsupported { path, .. }) => assert_eq!(path, p),
            other => panic!("expected ParquetUnsupported, got {other:?}"),
        }
    }

    #[test]
    fn new_validates_shape_and_values() {
        assert!(LatencyTrace::new("t", vec![0], vec![0], 2, vec![1.0, 2.0], vec![0.0]).is_ok());
        assert!(LatencyTrace::new("t", vec![0], vec![0], 2, vec![1.0], vec![0.0]).is_err());
        assert!(LatencyTrace::new("t", vec![0], vec![0], 1, vec![-1.0], vec![0.0]).is_err());
        assert!(LatencyTrace::new("t", vec![0], vec![0], 1, vec![f64::NAN], vec![0.0]).is_err());
        assert!(LatencyTrace::new("t", vec![], vec![0], 1, vec![], vec![0.0]).is_err());
    }
}
