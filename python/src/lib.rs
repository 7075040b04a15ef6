//! `dropcompute._core`: the Python extension module (pyo3, abi3, CPython >= 3.9) over the
//! dropcompute crate. The Python package `dropcompute` (python/dropcompute/) re-exports it;
//! `dropcompute/_core.pyi` holds the typed stubs.
//!
//! Owns: argument conversion and validation (a bad argument is a `ValueError` naming the
//! field; a size above its cap, `MAX_*`, is a `ValueError` raised before anything is
//! allocated, a negative or too wide integer pyo3's `OverflowError`, a bool where a number
//! belongs a `TypeError`: `args`), the mapping of crate
//! errors to Python exceptions (`OSError` for files, with the subclass of the OS error:
//! `FileNotFoundError`, `IsADirectoryError`, `PermissionError`; `ValueError` for malformed
//! traces and insufficient data), and releasing the interpreter lock around every call that
//! reads files or searches (`Python::detach`). The size checks and trace loading are the C
//! API crate's (`dropcompute_capi::{check_size, estimator, walk, divisor, load_trace}`), so both
//! faces validate alike. A panic (a bug) prints nothing: the module installs the C API's
//! quiet panic hook, and pyo3 raises it as `PanicException` with its message. Must not touch: decision logic
//! (every function forwards to the crate's one implementation: `policy::decide`,
//! `policy::walk::RankWalk` (the scheduler's step walk),
//! `tune::recommend`, `sim::replay`, `schedule::divisor`, `tune::retune::Retuner`,
//! `schedule::StragglerTracker`, `trace::compute_log`; the step policies' `policy::StepPolicy`,
//! `policy::assign::Assigner` and `policy::backup_aggregated` in `steppolicy.rs`).

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use numpy::ndarray::{Array3, ArrayView3};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3};
use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use dropcompute::policy::{self, CheckMode, DeadlineConfig, Threshold, WalkEstimator};
use dropcompute::schedule::RankStepStats;
use dropcompute::sim::replay::{ExecutionModel, replay};
use dropcompute::trace::compute_log::MAX_FILLED_CELLS;
use dropcompute::trace::compute_log::{ComputeLogRecord, ComputeLogWriter as RsWriter};
use dropcompute::trace::{LatencyTrace, LoadOptions};
use dropcompute::tune::retune::{RetuneEvent, RetunerConfig};
use dropcompute::tune::{self, Guardrails, Refusal, TuneConfig, Verdict as RsVerdict};
use dropcompute_capi::{DC_MAX_ESTIMATOR_WINDOW, DC_MAX_MICRO_BATCHES, DC_MAX_WORLD_SIZE, FaceError, check_size};

mod args;
mod steppolicy;

/// An OS error as the exception Python itself raises for it (an `OSError` subclass; a path
/// with a NUL byte: `ValueError`), with `msg`.
fn os_err(kind: std::io::ErrorKind, msg: String) -> PyErr {
    use std::io::ErrorKind;
    match kind {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
        ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
        // A path the OS cannot take (an embedded NUL): Python's own `open` raises ValueError.
        ErrorKind::InvalidInput => PyValueError::new_err(msg),
        _ => PyOSError::new_err(msg),
    }
}

/// An error of the C API layer as a Python exception: an unreadable file as its `OSError`
/// subclass, a panic as `RuntimeError`, anything else as `ValueError`.
fn py_err(e: FaceError) -> PyErr {
    let msg = e.to_string();
    match &e {
        FaceError::Panic(_) => PyRuntimeError::new_err(msg),
        _ => match e.io_error() {
            Some(io) => os_err(io, msg),
            None => PyValueError::new_err(msg),
        },
    }
}

/// `value` of the world-size argument `field`, at most `MAX_WORLD_SIZE`.
fn world_size(field: &'static str, value: usize) -> PyResult<usize> {
    check_size(field, value as u128, DC_MAX_WORLD_SIZE as u128, "MAX_WORLD_SIZE").map_err(py_err)?;
    Ok(value)
}

/// `value` of the micro-batch-count argument `field`, at most `MAX_MICRO_BATCHES`.
fn micro_batches(field: &'static str, value: usize) -> PyResult<usize> {
    check_size(field, value as u128, DC_MAX_MICRO_BATCHES.into(), "MAX_MICRO_BATCHES").map_err(py_err)?;
    Ok(value)
}

fn value_err(field: &str, msg: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{field}: {msg}"))
}

fn parse_check(check: &str) -> PyResult<CheckMode> {
    match check {
        "before" => Ok(CheckMode::BeforeMicroBatch),
        "predictive" => Ok(CheckMode::Predictive),
        other => Err(value_err("check", format!("{other:?}: must be \"before\" or \"predictive\""))),
    }
}

fn check_name(c: CheckMode) -> &'static str {
    c.name() // the core's one spelling of the check modes
}

/// The guardrails a tuner runs under (`recommend`, `Retuner`), each checked by name: the
/// fractions in [0, 1], `jitter_ns` finite and >= 0 (`Guardrails::validate`, the one rule).
fn guardrails(max_drop_rate: f64, min_batch_fraction: f64, min_gain: f64, jitter_ns: f64) -> PyResult<Guardrails> {
    let g = Guardrails {
        max_drop_rate: fraction("max_drop_rate", max_drop_rate)?,
        min_batch_fraction: fraction("min_batch_fraction", min_batch_fraction)?,
        min_gain: fraction("min_gain", min_gain)?,
        jitter_ns,
    };
    if g.validate().is_err() {
        return Err(value_err("jitter_ns", format!("{jitter_ns}: must be a finite number of ns >= 0")));
    }
    Ok(g)
}

/// The check a tuner scores thresholds under: None for "oracle" (the exact search over the
/// trace), else the check mode it replays (`parse_check`). Refuses `jitter_ns` above 0 with
/// the oracle: the jitter window is replayed, the oracle is not.
fn tuned_check(check: &str, jitter_ns: f64) -> PyResult<Option<CheckMode>> {
    let mode =
        if check == "oracle" {
            None
        } else {
            // The replayed checks' one spelling (`parse_check`), the oracle named beside them.
            Some(parse_check(check).map_err(|_| {
                value_err("check", format!("{check:?}: must be \"oracle\", \"before\" or \"predictive\""))
            })?)
        };
    if mode.is_none() && jitter_ns > 0.0 {
        return Err(value_err(
            "jitter_ns",
            format!(
                "{jitter_ns}: the jitter window is replayed, the oracle is not; use check=\"before\" or \"predictive\""
            ),
        ));
    }
    Ok(mode)
}

fn fraction(field: &str, v: f64) -> PyResult<f64> {
    if (0.0..=1.0).contains(&v) { Ok(v) } else { Err(value_err(field, format!("{v}: must be a fraction in [0, 1]"))) }
}

/// The DropCompute deadline policy of one job (`policy::decide`).
#[pyclass(module = "dropcompute._core", frozen)]
#[derive(Clone)]
pub struct Policy {
    cfg: DeadlineConfig,
    /// The kind (`Policy(kind=...)`, `dropcompute_capi::lengths::FaceKind`); None: a check mode.
    kind: Option<policy::Policy>,
    /// Declared bucket lengths (tokens, strictly ascending; empty: none).
    bucket_lengths: Vec<u32>,
    /// The run-time drop-rate guard's bound (`policy::DropGuard`, validated by
    /// `DropGuard::check`); None: no guard.
    drop_guard: Option<f64>,
}

/// The constructor's arguments, in `__reduce__`'s order.
type PolicyArgs = (Option<u64>, &'static str, u64, u32, Option<&'static str>, Vec<u32>, Option<f64>);

impl Policy {
    fn args(&self) -> PolicyArgs {
        let c = self.cfg;
        (
            c.threshold.as_ns(),
            check_name(c.check),
            c.warmup_steps,
            c.min_micro_batches,
            self.kind.map(policy::Policy::name),
            self.bucket_lengths.clone(),
            self.drop_guard,
        )
    }
}

/// `bound` checked by the one rule (`policy::DropGuard::check`), as a `ValueError` naming
/// `drop_guard` and the value.
fn guard_bound(bound: f64) -> PyResult<f64> {
    policy::DropGuard::check(bound).map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (threshold_ns=None, check="before", warmup_steps=3, min_micro_batches=1, kind=None, bucket_lengths=None, drop_guard=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = crate::args::opt_number)] threshold_ns: Option<u64>,
        check: &str,
        #[pyo3(from_py_with = crate::args::number)] warmup_steps: u64,
        #[pyo3(from_py_with = crate::args::number)] min_micro_batches: u32,
        kind: Option<&str>,
        #[pyo3(from_py_with = crate::args::opt_vec_number)] bucket_lengths: Option<Vec<u32>>,
        #[pyo3(from_py_with = crate::args::opt_number)] drop_guard: Option<f64>,
    ) -> PyResult<Self> {
        let drop_guard = drop_guard.map(guard_bound).transpose()?;
        let threshold = Threshold::from_ns(threshold_ns);
        let given = parse_check(check)?;
        let lengths = bucket_lengths.unwrap_or_default();
        let Some(kind) = kind else {
            if !lengths.is_empty() {
                return Err(value_err("bucket_lengths", "need a kind (length-predictive or cost-balance)"));
            }
            let cfg = DeadlineConfig { threshold, check: given, warmup_steps, min_micro_batches };
            return Ok(Self { cfg, kind: None, bucket_lengths: lengths, drop_guard });
        };
        // The one validation of both faces (the kind, the lengths with their index).
        let k = dropcompute_capi::lengths::FaceKind::new(kind, threshold, warmup_steps, min_micro_batches, &lengths)
            .map_err(py_err)?;
        // `check` left at its default, or the kind's own: never silently replaced.
        if check != "before" && given != k.cfg.check {
            return Err(value_err(
                "check",
                format!("{check:?}: kind {kind:?} runs the {:?} check", check_name(k.cfg.check)),
            ));
        }
        Ok(Self { cfg: k.cfg, kind: Some(k.kind), bucket_lengths: k.bucket_lengths, drop_guard })
    }

    /// Whether to start micro-batch `started` of step `step` after `elapsed_ns` of compute.
    #[pyo3(signature = (elapsed_ns, estimate_ns=None, *, step, started))]
    fn should_start(
        &self,
        #[pyo3(from_py_with = crate::args::number)] elapsed_ns: u64,
        #[pyo3(from_py_with = crate::args::opt_number)] estimate_ns: Option<u64>,
        #[pyo3(from_py_with = crate::args::number)] step: u64,
        #[pyo3(from_py_with = crate::args::number)] started: u32,
    ) -> bool {
        policy::decide(&self.cfg, step, started, elapsed_ns, estimate_ns).is_start()
    }

    #[getter]
    fn threshold_ns(&self) -> Option<u64> {
        self.cfg.threshold.as_ns()
    }
    #[getter]
    fn check(&self) -> &'static str {
        check_name(self.cfg.check)
    }
    #[getter]
    fn warmup_steps(&self) -> u64 {
        self.cfg.warmup_steps
    }
    #[getter]
    fn min_micro_batches(&self) -> u32 {
        self.cfg.min_micro_batches
    }
    /// The kind given to the constructor (None: a check mode alone).
    #[getter]
    fn kind(&self) -> Option<&'static str> {
        self.kind.map(policy::Policy::name)
    }
    /// The declared bucket lengths (tokens; empty: none).
    #[getter]
    fn bucket_lengths(&self) -> Vec<u32> {
        self.bucket_lengths.clone()
    }
    /// The run-time drop-rate guard's bound (a fraction in (0, 1]; None: no guard).
    #[getter]
    fn drop_guard(&self) -> Option<f64> {
        self.drop_guard
    }
    /// Pickling (a policy travels to spawned workers and into checkpoints): the constructor's
    /// arguments.
    fn __reduce__(slf: &Bound<'_, Self>) -> PyResult<(Py<PyAny>, PolicyArgs)> {
        Ok((slf.get_type().into_any().unbind(), slf.get().args()))
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Policy>().is_ok_and(|o| o.get().args() == self.args())
    }
    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let (t, c, w, m, k, b, g) = self.args();
        (t, c, w, m, k, b, g.map(f64::to_bits)).hash(&mut h);
        h.finish()
    }
    fn __repr__(&self) -> String {
        let mut extra = match self.kind {
            None => String::new(),
            Some(k) => format!(", kind={:?}, bucket_lengths={:?}", k.name(), self.bucket_lengths),
        };
        if let Some(g) = self.drop_guard {
            extra.push_str(&format!(", drop_guard={g}"));
        }
        format!(
            "Policy(threshold_ns={}, check={:?}, warmup_steps={}, min_micro_batches={}{extra})",
            self.cfg.threshold.as_ns().map_or("None".to_string(), |t| t.to_string()),
            check_name(self.cfg.check),
            self.cfg.warmup_steps,
            self.cfg.min_micro_batches
        )
    }
}

/// Online estimate of a rank's next micro-batch latency (`policy::LatencyEstimator`).
#[pyclass(module = "dropcompute._core")]
pub struct LatencyEstimator {
    /// Per length bucket, with the blind window (fed no bucket: the blind estimator exactly).
    inner: policy::BucketEstimator,
}

#[pymethods]
impl LatencyEstimator {
    #[new]
    #[pyo3(signature = (window=32, quantile=0.9))]
    fn new(
        #[pyo3(from_py_with = crate::args::number)] window: u64,
        #[pyo3(from_py_with = crate::args::number)] quantile: f64,
    ) -> PyResult<Self> {
        // The C API's check (window 1..=MAX_ESTIMATOR_WINDOW, quantile in [0, 1]) before the
        // window is allocated.
        Ok(Self { inner: dropcompute_capi::bucket_estimator(window, quantile).map_err(py_err)? })
    }
    /// Records a whole micro-batch's latency, under bucket `bucket` when given.
    #[pyo3(signature = (latency_ns, bucket=None))]
    fn observe(
        &mut self,
        #[pyo3(from_py_with = crate::args::number)] latency_ns: u64,
        #[pyo3(from_py_with = crate::args::opt_number)] bucket: Option<u32>,
    ) {
        self.inner.observe_for(bucket, latency_ns)
    }
    /// The estimate of bucket `bucket` (its own window, else the blind one), or blind.
    #[pyo3(signature = (bucket=None))]
    fn estimate(&mut self, #[pyo3(from_py_with = crate::args::opt_number)] bucket: Option<u32>) -> Option<u64> {
        self.inner.estimate_for(bucket)
    }
    fn __len__(&self) -> usize {
        self.inner.blind().len()
    }
}

/// One rank's walk through one step: the scheduler's own walker (`policy::walk::RankWalk`),
/// so a Python training loop decides exactly as the Rust scheduler (sync lag, warm-up, the
/// minimum micro-batches, the predictive estimate). See `dropcompute/_core.pyi`.
#[pyclass(module = "dropcompute._core")]
pub struct StepWalk {
    inner: dropcompute_capi::lengths::FaceWalk,
}

/// The walker's estimator: the caller's, or (none given) a fresh empty one, so that the
/// predictive check falls back to the before-check exactly as `Policy.should_start` without an
/// estimate does.
fn with_estimator<R>(
    est: Option<PyRefMut<'_, LatencyEstimator>>,
    f: impl FnOnce(&mut policy::BucketEstimator) -> R,
) -> R {
    match est {
        Some(mut e) => f(&mut e.inner),
        None => f(&mut policy::BucketEstimator::new(1, 1.0)),
    }
}

#[pymethods]
impl StepWalk {
    #[new]
    #[pyo3(signature = (policy, *, step, micro_batches, sync_lag=0))]
    fn new(
        policy: &Policy,
        #[pyo3(from_py_with = crate::args::number)] step: u64,
        #[pyo3(from_py_with = crate::args::number)] micro_batches: u64,
        #[pyo3(from_py_with = crate::args::number)] sync_lag: u32,
    ) -> PyResult<Self> {
        // The C API's check (at most MAX_MICRO_BATCHES) before the walk's buffers are allocated.
        let inner = dropcompute_capi::lengths::FaceWalk::with_lengths(
            policy.cfg,
            step,
            micro_batches,
            sync_lag,
            &policy.bucket_lengths,
        )
        .map_err(py_err)?;
        Ok(Self { inner })
    }

    /// Tells the walk each micro-batch's bucket (an index into the policy's bucket lengths;
    /// None: not known) and tokens, before its first launch (`FaceWalk::set_micro_batches`).
    #[pyo3(signature = (buckets, tokens))]
    fn set_micro_batches(
        &mut self,
        #[pyo3(from_py_with = crate::args::opt_vec_number)] buckets: Option<Vec<u32>>,
        #[pyo3(from_py_with = crate::args::vec_number)] tokens: Vec<u64>,
    ) -> PyResult<()> {
        self.inner.set_micro_batches(buckets.as_deref(), &tokens).map_err(py_err)
    }

    /// Tokens of the micro-batches started so far (0 when not told).
    fn tokens_started(&self) -> u64 {
        self.inner.tokens_started()
    }

    /// The next action: `("wait", upto)` (report the ends of launches `reported..upto` with
    /// `ended`; `upto` 0: nothing to report), `("launch", index)` (run micro-batch `index`),
    /// or `("done", stopped)` with `stopped` 1 when the deadline stopped the step, 0 when
    /// every micro-batch was started.
    #[pyo3(signature = (estimator=None))]
    fn next(&mut self, estimator: Option<PyRefMut<'_, LatencyEstimator>>) -> (&'static str, usize) {
        use policy::walk::{Next, WalkEnd};
        match with_estimator(estimator, |e| self.inner.walk_mut().next(e)) {
            Next::Wait { upto } => ("wait", upto),
            Next::Launch(l) => ("launch", l.micro_batch as usize),
            Next::Done(WalkEnd::Assignment) => ("done", 0),
            Next::Done(WalkEnd::Deadline(_)) => ("done", 1),
        }
    }

    /// Reports the end of launch `launch`: compute time from the clock start to its end
    /// (`end_ns`) and its duration (`duration_ns`, fed to `estimator`). Launches are reported
    /// in order; returns False (nothing recorded) for one out of order, repeated or not started.
    #[pyo3(signature = (launch, end_ns, duration_ns, estimator=None))]
    fn ended(
        &mut self,
        #[pyo3(from_py_with = crate::args::number)] launch: usize,
        #[pyo3(from_py_with = crate::args::number)] end_ns: u64,
        #[pyo3(from_py_with = crate::args::number)] duration_ns: u64,
        estimator: Option<PyRefMut<'_, LatencyEstimator>>,
    ) -> bool {
        with_estimator(estimator, |e| self.inner.walk_mut().ended(launch, end_ns, duration_ns, e))
    }

    /// Whether another launch follows the one `next` last returned, asked before it runs
    /// (`policy::walk::RankWalk::peek`): `("again", 0)`, `("last", 0)`, or `("wait", upto)`
    /// (report the ends of launches `reported()..upto` first, then ask again). With
    /// `sync_lag` >= 1 it never needs the end of the launch about to run.
    #[pyo3(signature = (estimator=None))]
    fn peek(&self, estimator: Option<PyRef<'_, LatencyEstimator>>) -> (&'static str, usize) {
        use policy::walk::Peek;
        let fresh;
        let est = match &estimator {
            Some(e) => &e.inner,
            None => {
                fresh = policy::BucketEstimator::new(1, 1.0);
                &fresh
            }
        };
        match self.inner.walk().peek(est) {
            Peek::Again => ("again", 0),
            Peek::Last => ("last", 0),
            Peek::Wait { upto } => ("wait", upto),
        }
    }

    /// Answers `("wait", 0)` with the compute time already elapsed (ns since the clock
    /// start): time before the first micro-batch counts against the deadline.
    fn clock_at(&mut self, #[pyo3(from_py_with = crate::args::number)] elapsed_ns: u64) {
        self.inner.walk_mut().clock_at(elapsed_ns)
    }

    /// Launches reported so far.
    fn reported(&self) -> usize {
        self.inner.walk().reported()
    }

    /// Micro-batches started so far.
    fn started(&self) -> usize {
        self.inner.walk().launches()
    }
}

/// Most samples a [`Dealer`]'s epoch holds: its shuffle materializes every sample id (8 bytes
/// each), so 2**28 samples are 2 GiB.
pub const MAX_DEALER_SAMPLES: u64 = 1 << 28;

/// One rank's replica of the job's one global epoch stream (`deal::RunData::global`, what
/// `train` and its replay deal by): each epoch the sample ids `0..samples` shuffled by
/// (seed, epoch), cut into micro-batches of `micro_batch_size`, dealt per step by an
/// assignment, every rank's not-started micro-batches back at the front in rank order. Every
/// rank holds a replica and settles it with the same gathered counts, so all replicas agree
/// without communicating. See `dropcompute/_core.pyi`.
#[pyclass(module = "dropcompute._core")]
pub struct Dealer {
    data: dropcompute::deal::RunData,
    rank: u32,
    world_size: usize,
    /// This rank's micro-batch count dealt by the pending [`Dealer::take`] (None between steps).
    dealt: Option<usize>,
    /// The last `take` dealt nothing to any rank.
    ended: bool,
}

#[pymethods]
impl Dealer {
    #[new]
    #[pyo3(signature = (samples, micro_batch_size, *, rank, world_size, seed=0, epochs=None))]
    fn new(
        #[pyo3(from_py_with = crate::args::number)] samples: u64,
        #[pyo3(from_py_with = crate::args::number)] micro_batch_size: usize,
        #[pyo3(from_py_with = crate::args::number)] rank: u32,
        #[pyo3(from_py_with = crate::args::number)] world_size: usize,
        #[pyo3(from_py_with = crate::args::number)] seed: u64,
        #[pyo3(from_py_with = crate::args::opt_number)] epochs: Option<u64>,
    ) -> PyResult<Self> {
        let world_size = world_size_arg(world_size)?;
        if samples == 0 || samples > MAX_DEALER_SAMPLES {
            return Err(value_err(
                "samples",
                format!("{samples}: must be in 1..={MAX_DEALER_SAMPLES} (MAX_DEALER_SAMPLES)"),
            ));
        }
        if micro_batch_size == 0 || micro_batch_size as u64 > samples {
            return Err(value_err(
                "micro_batch_size",
                format!("{micro_batch_size}: must be in 1..={samples} (samples)"),
            ));
        }
        if rank as usize >= world_size {
            return Err(value_err("rank", format!("{rank}: must be below world_size {world_size}")));
        }
        if epochs == Some(0) {
            return Err(value_err("epochs", "0: must be >= 1 (None: never ends)"));
        }
        let data = dropcompute::deal::RunData::global(samples, seed, micro_batch_size, 1, epochs);
        Ok(Self { data, rank, world_size, dealt: None, ended: false })
    }

    /// This rank's micro-batches of the next step, each a list of sample ids, dealt by
    /// `assignment` (micro-batches per rank, one entry per rank); fewer (or none) at the end of
    /// the stream. Call `settle` before the next `take`.
    fn take(
        &mut self,
        #[pyo3(from_py_with = crate::args::vec_number)] assignment: Vec<u32>,
    ) -> PyResult<Vec<Vec<u64>>> {
        use dropcompute::schedule::DataSource;
        if self.dealt.is_some() {
            return Err(PyRuntimeError::new_err("Dealer.take: the previous step is not settled (call settle first)"));
        }
        if assignment.len() != self.world_size {
            return Err(value_err(
                "assignment",
                format!("{} entries: must have one per rank ({})", assignment.len(), self.world_size),
            ));
        }
        for &a in &assignment {
            micro_batches("assignment", a as usize)?;
        }
        let mine = self.data.take_assigned(self.rank, &assignment);
        self.dealt = Some(mine.len());
        if self.dealt_total() == 0 {
            // The stream has ended: nothing to settle, the replica stays between steps.
            self.data.settle(self.rank, &vec![0; self.world_size], Vec::new(), true);
            self.dealt = None;
            self.ended = true;
        }
        Ok(mine.into_iter().map(|mb| mb.sample_ids).collect())
    }

    /// This rank's micro-batches of the next step dealt by predicted cost (`cost-balance`,
    /// `DataSource::take_dealt` with `dropcompute_capi::lengths::deal_by_cost`): the next
    /// N·`micro_batches` micro-batches of the stream, each's bucket `bucket_of(sample_ids)`
    /// (an index into `bucket_lengths`), dealt to the ranks longest predicted cost first
    /// (`estimator`'s per-bucket cost, which must be identical on every rank), at most
    /// 2·`micro_batches` each. Returns this rank's micro-batches and their buckets; at the
    /// end of an epoch (fewer than N·M left) dealt as `take` by M each. Settle with `settle`.
    #[pyo3(signature = (micro_batches, bucket_of, estimator, *, bucket_lengths=None))]
    fn take_by_cost(
        &mut self,
        #[pyo3(from_py_with = crate::args::number)] micro_batches: u32,
        bucket_of: &Bound<'_, PyAny>,
        estimator: PyRef<'_, LatencyEstimator>,
        #[pyo3(from_py_with = crate::args::opt_vec_number)] bucket_lengths: Option<Vec<u32>>,
    ) -> PyResult<(Vec<Vec<u64>>, Vec<u32>)> {
        use dropcompute::schedule::DataSource;
        if self.dealt.is_some() {
            return Err(PyRuntimeError::new_err(
                "Dealer.take_by_cost: the previous step is not settled (call settle first)",
            ));
        }
        if micro_batches == 0 {
            return Err(value_err("micro_batches", "0: must be >= 1"));
        }
        let m = self::micro_batches("micro_batches", micro_batches as usize)?;
        let n = self.world_size;
        let lengths = bucket_lengths.unwrap_or_default();
        let bucket = |ids: &[u64]| -> PyResult<u32> { crate::args::number::<u32>(&bucket_of.call1((ids.to_vec(),))?) };
        let mut failed: Option<PyErr> = None;
        let mut deal = |mbs: &[dropcompute::schedule::MicroBatch]| -> Vec<Vec<usize>> {
            let b: PyResult<Vec<u32>> = mbs.iter().map(|mb| bucket(&mb.sample_ids)).collect();
            let dealt = b.and_then(|b| {
                dropcompute_capi::lengths::deal_by_cost(&estimator.inner, &lengths, &b, n, 2 * m).map_err(py_err)
            });
            dealt.unwrap_or_else(|e| {
                failed = Some(e);
                Vec::new()
            })
        };
        let slices = self.data.take_dealt(self.rank, n * m, &mut deal);
        if let Some(e) = failed {
            return Err(e);
        }
        let Some(slices) = slices else {
            // The epoch's end: dealt by counts, M each.
            let mine = self.take(vec![micro_batches; n])?;
            let b = mine.iter().map(|ids| bucket(ids)).collect::<PyResult<Vec<u32>>>()?;
            return Ok((mine, b));
        };
        let mine: Vec<Vec<u64>> = slices
            .into_iter()
            .nth(self.rank as usize)
            .unwrap_or_default()
            .into_iter()
            .map(|mb| mb.sample_ids)
            .collect();
        self.dealt = Some(mine.len());
        let b = mine.iter().map(|ids| bucket(ids)).collect::<PyResult<Vec<u32>>>()?;
        Ok((mine, b))
    }

    /// Whether the last `take` dealt nothing to any rank: the stream has ended (every replica
    /// knows it at the same step, so every rank stops there).
    #[getter]
    fn ended(&self) -> bool {
        self.ended
    }

    /// Micro-batches the pending `take` dealt to all ranks together; 0 between steps.
    #[getter]
    fn dealt_total(&self) -> usize {
        match (&self.data, self.dealt) {
            (dropcompute::deal::RunData::Shared(s), Some(_)) => s.dealt().iter().map(Vec::len).sum(),
            _ => 0,
        }
    }

    /// Ends the step: `started[r]` is the number of micro-batches rank r started (identical on
    /// every rank, from the gathered counts); every rank's not-started ones go back to the
    /// front of the stream, rank 0's first.
    fn settle(&mut self, #[pyo3(from_py_with = crate::args::vec_number)] started: Vec<u32>) -> PyResult<()> {
        use dropcompute::schedule::DataSource;
        let Some(dealt) = self.dealt else {
            return Err(PyRuntimeError::new_err("Dealer.settle: no step was taken"));
        };
        if started.len() != self.world_size {
            return Err(value_err(
                "started",
                format!("{} entries: must have one per rank ({})", started.len(), self.world_size),
            ));
        }
        let mine = started[self.rank as usize] as usize;
        if mine > dealt {
            return Err(value_err("started", format!("rank {}: {mine} started of {dealt} dealt", self.rank)));
        }
        self.data.settle(self.rank, &started, Vec::new(), true);
        self.dealt = None;
        Ok(())
    }

    /// The current epoch (0-based).
    #[getter]
    fn epoch(&self) -> u64 {
        match &self.data {
            dropcompute::deal::RunData::Shared(s) => s.inner.epoch,
            dropcompute::deal::RunData::PerRank(s) => s.epoch,
        }
    }

    /// The replica's state as JSON (for a checkpoint; `Dealer.from_state` reads it back).
    fn state(&self) -> PyResult<String> {
        if self.dealt.is_some() {
            return Err(PyRuntimeError::new_err("Dealer.state: a step is taken but not settled"));
        }
        serde_json::to_string(&(&self.data, self.rank, self.world_size)).map_err(|e| value_err("state", e))
    }

    /// A replica from `state` (what `state` returned).
    #[staticmethod]
    fn from_state(state: &str) -> PyResult<Self> {
        let (data, rank, world_size): (dropcompute::deal::RunData, u32, usize) =
            serde_json::from_str(state).map_err(|e| value_err("state", format!("not a Dealer state: {e}")))?;
        let world_size = world_size_arg(world_size)?;
        if rank as usize >= world_size {
            return Err(value_err("state", format!("rank {rank} not below world_size {world_size}")));
        }
        Ok(Self { data, rank, world_size, dealt: None, ended: false })
    }
}

/// The run-time drop-rate guard (`policy::DropGuard`): whether the next step runs with the
/// threshold, from the run's cumulative global counts.
#[pyclass(module = "dropcompute._core")]
pub struct DropGuard {
    inner: policy::DropGuard,
}

#[pymethods]
impl DropGuard {
    #[new]
    fn new(#[pyo3(from_py_with = crate::args::number)] bound: f64) -> PyResult<Self> {
        Ok(Self { inner: policy::DropGuard::new(guard_bound(bound)?).map_err(|e| value_err("bound", e))? })
    }
    /// Whether a step handed `handed` (global, in the drop unit) runs with the threshold.
    fn enforces(&self, #[pyo3(from_py_with = crate::args::number)] handed: u64) -> bool {
        self.inner.enforces(handed)
    }
    /// Records a step's global counts (`DropGuard::record`).
    fn record(
        &mut self,
        #[pyo3(from_py_with = crate::args::number)] handed: u64,
        #[pyo3(from_py_with = crate::args::number)] started: u64,
        enforced: bool,
    ) {
        self.inner.record(handed, started, enforced);
    }
    #[getter]
    fn bound(&self) -> f64 {
        self.inner.bound()
    }
    /// (handed, dropped, reserve).
    #[getter]
    fn counts(&self) -> (u64, u64, u64) {
        self.inner.counts()
    }
    #[getter]
    fn drop_rate(&self) -> f64 {
        self.inner.drop_rate()
    }
    /// A guard restored from `counts` (a checkpoint).
    #[staticmethod]
    fn from_counts(
        #[pyo3(from_py_with = crate::args::number)] bound: f64,
        #[pyo3(from_py_with = crate::args::vec_number)] counts: Vec<u64>,
    ) -> PyResult<Self> {
        let &[h, d, r] = counts.as_slice() else {
            return Err(value_err("counts", format!("{counts:?}: must be (handed, dropped, reserve)")));
        };
        let inner = policy::DropGuard::from_counts(bound, h, d, r).map_err(|e| match e {
            policy::DropGuardError::Bound { .. } => value_err("bound", e),
            policy::DropGuardError::Counts { .. } => value_err("counts", e),
            policy::DropGuardError::Absent { .. } => value_err("state", e),
        })?;
        Ok(Self { inner })
    }
    fn __repr__(&self) -> String {
        let (h, d, r) = self.inner.counts();
        format!("DropGuard(bound={}, handed={h}, dropped={d}, reserve={r})", self.inner.bound())
    }
}

fn world_size_arg(n: usize) -> PyResult<usize> {
    if n == 0 {
        return Err(value_err("world_size", "0: must be >= 1"));
    }
    world_size("world_size", n)
}

/// The tuner's decision (see `dropcompute/_core.pyi`).
#[pyclass(module = "dropcompute._core", frozen, get_all)]
pub struct Verdict {
    enabled: bool,
    threshold_ns: Option<u64>,
    predicted_drop_rate: f64,
    predicted_speedup: f64,
    ideal_speedup: f64,
    ideal_threshold_ns: f64,
    scoring: String,
    refusal: Option<String>,
    reason: Option<String>,
}

#[pymethods]
impl Verdict {
    fn __repr__(&self) -> String {
        match &self.reason {
            None => format!(
                "Verdict(enabled=True, threshold_ns={:.0}, predicted_drop_rate={:.4}, predicted_speedup={:+.4}, scoring={:?})",
                self.threshold_ns.unwrap_or(0),
                self.predicted_drop_rate,
                self.predicted_speedup,
                self.scoring
            ),
            Some(r) => {
                format!("Verdict(enabled=False, refusal={:?}, reason={r:?})", self.refusal.as_deref().unwrap_or(""))
            }
        }
    }
}

/// Per-trace inputs: a file path, or an (N, M, steps) array of latencies (ns).
fn trace_from(py: Python<'_>, source: &Bound<'_, PyAny>, overhead_ns: f64) -> PyResult<LatencyTrace> {
    if !(overhead_ns.is_finite() && overhead_ns >= 0.0) {
        return Err(value_err("overhead_ns", format!("{overhead_ns}: must be finite and >= 0")));
    }
    if let Ok(arr) = source.extract::<PyReadonlyArray3<'_, f64>>() {
        let view = arr.as_array();
        let (n, m, s) = view.dim();
        if n == 0 || m == 0 || s == 0 {
            return Err(value_err("latencies_ns", format!("shape ({n}, {m}, {s}): every dimension must be >= 1")));
        }
        // Before the step-major copy: a broadcast array may have a huge shape and no memory.
        world_size("latencies_ns N", n)?;
        let cells = n as u128 * m as u128 * s as u128;
        check_size("latencies_ns N*M*steps", cells, MAX_FILLED_CELLS as u128, "MAX_TRACE_CELLS").map_err(py_err)?;
        let lat = to_step_major(view);
        return LatencyTrace::new(
            "array",
            (0..n as u32).collect(),
            (0..s as u64).collect(),
            m,
            lat,
            vec![overhead_ns; s],
        )
        .map_err(|e| value_err("latencies_ns", e));
    }
    // One path, or a list of them (every rank's compute log of one job, as `dropcompute tune
    // --trace A B ...` takes them).
    let paths: Vec<PathBuf> = match source.extract::<PathBuf>() {
        Ok(p) => vec![p],
        Err(_) => source.extract::<Vec<PathBuf>>().ok().filter(|v| !v.is_empty()).ok_or_else(|| {
            value_err(
                "source",
                "must be a path (str or os.PathLike), a non-empty list of paths (every rank's compute log) or a \
                 float64 array of shape (N, M, steps)",
            )
        })?,
    };
    let opts = LoadOptions { reference_overhead_ns: overhead_ns, ..Default::default() };
    py.detach(|| dropcompute_capi::load_trace_files(&paths, &opts)).map_err(py_err)
}

/// (N, M, S) -> the trace's layout `[(s * N + n) * M + m]`.
fn to_step_major(view: ArrayView3<'_, f64>) -> Vec<f64> {
    let (n, m, s) = view.dim();
    let mut out = Vec::with_capacity(n * m * s);
    for si in 0..s {
        for ni in 0..n {
            for mi in 0..m {
                out.push(view[[ni, mi, si]]);
            }
        }
    }
    out
}

fn refusal_name(r: &Refusal) -> &'static str {
    match r {
        Refusal::InsufficientGain { .. } => "min_gain",
        Refusal::MaxDropRate { .. } => "max_drop_rate",
        Refusal::MinBatchFraction { .. } => "min_batch_fraction",
    }
}

/// Recommend a threshold (`tune::recommend`).
#[pyfunction]
#[pyo3(signature = (source, *, check="oracle", max_drop_rate=0.10, min_batch_fraction=0.75, min_gain=0.02, min_micro_batches=1, overhead_ns=0.0, drop_guard=false, jitter_ns=0.0))]
#[allow(clippy::too_many_arguments)]
fn recommend(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    check: &str,
    #[pyo3(from_py_with = crate::args::number)] max_drop_rate: f64,
    #[pyo3(from_py_with = crate::args::number)] min_batch_fraction: f64,
    #[pyo3(from_py_with = crate::args::number)] min_gain: f64,
    #[pyo3(from_py_with = crate::args::number)] min_micro_batches: u32,
    #[pyo3(from_py_with = crate::args::number)] overhead_ns: f64,
    drop_guard: bool,
    #[pyo3(from_py_with = crate::args::number)] jitter_ns: f64,
) -> PyResult<Verdict> {
    let guardrails = guardrails(max_drop_rate, min_batch_fraction, min_gain, jitter_ns)?;
    let mode = tuned_check(check, jitter_ns)?;
    // The guard runs in the replay: the oracle (the exact search) has none.
    let guard = match (drop_guard, mode) {
        (false, _) => None,
        (true, None) => {
            return Err(value_err(
                "drop_guard",
                "True: the guard is replayed, the oracle is not; use check=\"before\" or \"predictive\"",
            ));
        }
        (true, Some(_)) => Some(guard_bound(max_drop_rate)?),
    };
    let trace = trace_from(py, source, overhead_ns)?;
    // tune::check_inputs (as `dropcompute tune`: enough steps and ranks, min_micro_batches
    // <= M), then the recommendation.
    let rec = py
        .detach(|| dropcompute_capi::recommend_checked(&trace, mode, guardrails, min_micro_batches, guard))
        .map_err(py_err)?;
    // The oracle's best admissible candidate: what an ideal (oracle-truncation) policy reaches.
    let (ideal_speedup, ideal_threshold_ns) =
        rec.ideal.best_admissible.map_or((0.0, 0.0), |c| (c.objective, c.threshold_ns));
    let base = Verdict {
        enabled: false,
        threshold_ns: None,
        predicted_drop_rate: 0.0,
        predicted_speedup: 0.0,
        ideal_speedup,
        ideal_threshold_ns,
        scoring: check.to_string(),
        refusal: None,
        reason: None,
    };
    Ok(match *dropcompute_capi::chosen_verdict(&rec, mode) {
        RsVerdict::Enable(c) => Verdict {
            enabled: true,
            // Whole ns, as `Policy(threshold_ns=...)` takes it (`Threshold::from_ns_f64`).
            threshold_ns: Threshold::from_ns_f64(c.threshold_ns).as_ns(),
            predicted_drop_rate: c.drop_rate,
            predicted_speedup: c.objective,
            ..base
        },
        RsVerdict::Decline(r) => {
            Verdict { refusal: Some(refusal_name(&r).to_string()), reason: Some(r.to_string()), ..base }
        }
    })
}

/// Replay a trace under a policy (`sim::replay`), with its drop-rate guard when it has one.
#[pyfunction]
#[pyo3(signature = (source, policy, *, overhead_ns=0.0))]
fn simulate<'py>(
    py: Python<'py>,
    source: &Bound<'py, PyAny>,
    policy: &Policy,
    #[pyo3(from_py_with = crate::args::number)] overhead_ns: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let trace = trace_from(py, source, overhead_ns)?;
    let cfg = policy.cfg;
    // The policy's own check, warm-up and minimum; no sync lag (a trace file has none).
    let exec = ExecutionModel {
        check: cfg.check,
        sync_lag: 0,
        warmup_steps: cfg.warmup_steps,
        min_micro_batches: cfg.min_micro_batches,
        drop_guard: policy.drop_guard,
    };
    let r = py.detach(|| replay(&trace, cfg.threshold, &exec));
    let d = PyDict::new(py);
    d.set_item("baseline_step_ns", r.baseline_step_ns)?;
    d.set_item("policy_step_ns", r.policy_step_ns)?;
    d.set_item("drop_rate", r.drop_rate)?;
    d.set_item("effective_speedup", r.effective_speedup)?;
    let s = r.per_step.len();
    d.set_item("baseline_per_step_ns", r.per_step.iter().map(|p| p.0).collect::<Vec<_>>().into_pyarray(py))?;
    d.set_item("policy_per_step_ns", r.per_step.iter().map(|p| p.1).collect::<Vec<_>>().into_pyarray(py))?;
    d.set_item("started_per_step", r.per_step.iter().map(|p| p.2).collect::<Vec<_>>().into_pyarray(py))?;
    d.set_item("enforced_per_step", r.enforced.clone())?;
    debug_assert_eq!(s, trace.num_steps());
    Ok(d)
}

/// Read a trace file into NumPy arrays.
#[pyfunction]
#[pyo3(signature = (path, *, overhead_ns=0.0))]
fn read_trace<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::args::number)] overhead_ns: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let t = trace_from(py, path, overhead_ns)?;
    let (s, n, m) = (t.num_steps(), t.world_size(), t.micro_batches());
    let d = PyDict::new(py);
    // (S, N, M) owned by NumPy without a copy, returned as its (N, M, S) transposed view.
    let arr = Array3::from_shape_vec((s, n, m), t.latencies_ns().to_vec())
        .map_err(|e| value_err("latencies_ns", e))?
        .into_pyarray(py);
    let view = arr.call_method1("transpose", ((1, 2, 0),))?;
    d.set_item("latencies_ns", view)?;
    d.set_item("overhead_ns", PyArray1::from_slice(py, t.overhead_ns()))?;
    d.set_item("ranks", PyArray1::from_slice(py, t.ranks()))?;
    d.set_item("steps", PyArray1::from_slice(py, t.steps()))?;
    d.set_item("source", t.source())?;
    Ok(d)
}

/// The cost-balanced deal of one step's micro-batches (`dropcompute_capi::lengths::deal_by_cost`:
/// `policy::cost_balance` over the estimator's per-bucket cost, the declared lengths the prior
/// of buckets not measured yet): each rank's indices into `buckets`, ascending.
#[pyfunction]
#[pyo3(signature = (estimator, buckets, *, ranks, cap, bucket_lengths=None))]
fn deal_by_cost(
    estimator: PyRef<'_, LatencyEstimator>,
    #[pyo3(from_py_with = crate::args::vec_number)] buckets: Vec<u32>,
    #[pyo3(from_py_with = crate::args::number)] ranks: usize,
    #[pyo3(from_py_with = crate::args::number)] cap: usize,
    #[pyo3(from_py_with = crate::args::opt_vec_number)] bucket_lengths: Option<Vec<u32>>,
) -> PyResult<Vec<Vec<usize>>> {
    let ranks = world_size("ranks", ranks)?;
    dropcompute_capi::lengths::deal_by_cost(&estimator.inner, &bucket_lengths.unwrap_or_default(), &buckets, ranks, cap)
        .map_err(py_err)
}

/// The divisor of the summed gradient (`schedule::divisor`); None = skip the step.
#[pyfunction]
#[pyo3(signature = (counts, normalization="realized", micro_batches=1, micro_batch_size=1, weighting="samples"))]
fn divisor(
    counts: PyReadonlyArray1<'_, u64>,
    normalization: &str,
    #[pyo3(from_py_with = crate::args::number)] micro_batches: u32,
    #[pyo3(from_py_with = crate::args::number)] micro_batch_size: u32,
    weighting: &str,
) -> PyResult<Option<f64>> {
    let weighting = match weighting {
        "samples" => dropcompute_capi::DC_WEIGHTING_SAMPLES,
        "tokens" => dropcompute_capi::DC_WEIGHTING_TOKENS,
        other => return Err(value_err("weighting", format!("{other:?}: must be \"samples\" or \"tokens\""))),
    };
    let code = match normalization {
        "realized" => dropcompute_capi::DC_NORMALIZATION_REALIZED,
        "nominal" => dropcompute_capi::DC_NORMALIZATION_NOMINAL,
        other => return Err(value_err("normalization", format!("{other:?}: must be \"realized\" or \"nominal\""))),
    };
    let counts = counts.as_slice().map_err(|e| value_err("counts", e))?;
    match dropcompute_capi::divisor_weighted(counts, code, weighting, micro_batches, micro_batch_size) {
        Ok(d) => Ok(Some(d)),
        Err(FaceError::SkipStep(_)) => Ok(None),
        Err(e) => Err(py_err(e)),
    }
}

/// Writes the compute log (`trace::compute_log`, the reference's columns plus ours).
#[pyclass(module = "dropcompute._core")]
pub struct ComputeLogWriter {
    path: PathBuf,
    inner: Option<RsWriter<BufWriter<File>>>,
}

#[pymethods]
impl ComputeLogWriter {
    #[new]
    fn new(path: PathBuf) -> PyResult<Self> {
        let f = File::create(&path).map_err(|e| os_err(e.kind(), format!("{}: cannot create: {e}", path.display())))?;
        Ok(Self { path, inner: Some(RsWriter::new(BufWriter::new(f))) })
    }

    /// Append one micro-batch row (`trace::compute_log::ComputeLogRecord`; times in ns on one
    /// monotonic clock per rank: `start_ns`, `clock_start_ns`, `deadline_ns`).
    #[pyo3(signature = (*, global_step, local_step, world_size, batch, computed_batch, compute_dropped, rank, start_ns, duration_ns, sentence_length=0, micro_batches=0, clock_start_ns=None, deadline_ns=0))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        #[pyo3(from_py_with = crate::args::number)] global_step: u64,
        #[pyo3(from_py_with = crate::args::number)] local_step: u32,
        #[pyo3(from_py_with = crate::args::number)] world_size: u32,
        #[pyo3(from_py_with = crate::args::number)] batch: u32,
        #[pyo3(from_py_with = crate::args::number)] computed_batch: u64,
        compute_dropped: bool,
        #[pyo3(from_py_with = crate::args::number)] rank: u32,
        #[pyo3(from_py_with = crate::args::number)] start_ns: u64,
        #[pyo3(from_py_with = crate::args::number)] duration_ns: u64,
        #[pyo3(from_py_with = crate::args::number)] sentence_length: u32,
        #[pyo3(from_py_with = crate::args::number)] micro_batches: u32,
        #[pyo3(from_py_with = crate::args::opt_number)] clock_start_ns: Option<u64>,
        #[pyo3(from_py_with = crate::args::number)] deadline_ns: u64,
    ) -> PyResult<()> {
        let w = self.inner.as_mut().ok_or_else(|| value_err("ComputeLogWriter", "closed"))?;
        let rec = ComputeLogRecord {
            global_step,
            local_step,
            world_size,
            batch,
            sentence_length,
            computed_batch,
            compute_dropped,
            iteration_time_ms: duration_ns as f64 / 1e6,
            rank,
            start_ns,
            duration_ns,
            // M (0: not recorded), the step's compute clock start on the start_ns clock (the
            // reader derives the step overhead from it) and its deadline (0: none); the tail
            // shape: whole micro-batches (the reader's default).
            micro_batches,
            clock_start_ns,
            deadline_ns,
            ..ComputeLogRecord::default()
        };
        w.write(&rec).map_err(|e| PyOSError::new_err(format!("{}: {e}", self.path.display())))
    }

    fn flush(&mut self) -> PyResult<()> {
        if let Some(w) = self.inner.as_mut() {
            w.flush().map_err(|e| PyOSError::new_err(format!("{}: {e}", self.path.display())))?;
        }
        Ok(())
    }

    fn close(&mut self) -> PyResult<()> {
        if let Some(w) = self.inner.take() {
            w.into_inner().map_err(|e| PyOSError::new_err(format!("{}: {e}", self.path.display())))?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&mut self, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }
}

/// Per-rank straggler statistics (`schedule::StragglerTracker`).
#[pyclass(module = "dropcompute._core")]
pub struct StragglerTracker {
    inner: dropcompute::schedule::StragglerTracker,
}

#[pymethods]
impl StragglerTracker {
    #[new]
    #[pyo3(signature = (world_size, alpha=0.1, chronic_fraction=0.5))]
    fn new(
        #[pyo3(from_py_with = crate::args::number)] world_size: usize,
        #[pyo3(from_py_with = crate::args::number)] alpha: f64,
        #[pyo3(from_py_with = crate::args::number)] chronic_fraction: f64,
    ) -> PyResult<Self> {
        if world_size == 0 {
            return Err(value_err("world_size", "0: must be >= 1"));
        }
        let world_size = self::world_size("world_size", world_size)?;
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(value_err("alpha", format!("{alpha}: must be in (0, 1]")));
        }
        let cf = fraction("chronic_fraction", chronic_fraction)?;
        Ok(Self { inner: dropcompute::schedule::StragglerTracker::new(world_size, alpha, cf) })
    }

    /// Feed one step: per rank the micro-batches dropped and the compute phase (ns). The
    /// chronic rule judges each rank's latency per computed micro-batch: `latency_ns` (one per
    /// rank) when given, else the compute phase (equivalent when every rank computed as many).
    #[pyo3(signature = (dropped, compute_ns, latency_ns=None))]
    fn observe(
        &mut self,
        dropped: PyReadonlyArray1<'_, u32>,
        compute_ns: PyReadonlyArray1<'_, u64>,
        latency_ns: Option<PyReadonlyArray1<'_, f64>>,
    ) -> PyResult<()> {
        let (d, c) = (dropped.as_array(), compute_ns.as_array());
        let n = self.inner.hits.len();
        if d.len() != n || c.len() != n {
            return Err(value_err(
                if d.len() != n { "dropped" } else { "compute_ns" },
                format!("lengths {} and {}: must both be world_size {n}", d.len(), c.len()),
            ));
        }
        let rows: Vec<RankStepStats> = d
            .iter()
            .zip(c.iter())
            .map(|(&dropped, &compute_ns)| RankStepStats { dropped, compute_ns, ..Default::default() })
            .collect();
        let per_mb: Vec<f64> = match latency_ns {
            Some(l) if l.as_array().len() != n => {
                return Err(value_err("latency_ns", format!("length {}: must be world_size {n}", l.as_array().len())));
            }
            Some(l) => l.as_array().to_vec(),
            None => c.iter().map(|&x| x as f64).collect(),
        };
        self.inner.observe(&rows, &per_mb);
        Ok(())
    }
    fn chronic(&self) -> Vec<u32> {
        self.inner.chronic()
    }
    fn labels(&self) -> Vec<&'static str> {
        (0..self.inner.hits.len() as u32).map(|r| self.inner.class(r).name()).collect()
    }
    #[getter]
    fn steps(&self) -> u64 {
        self.inner.steps()
    }
    #[getter]
    fn hits(&self) -> Vec<u64> {
        self.inner.hits.clone()
    }
    #[getter]
    fn ewma_compute_ns(&self) -> Vec<f64> {
        self.inner.ewma_compute_ns.clone()
    }
}

/// Closed-loop re-tuning (`tune::retune::Retuner`).
#[pyclass(module = "dropcompute._core")]
pub struct Retuner {
    inner: tune::retune::Retuner,
    /// N and M, the shape `on_step` takes.
    shape: (usize, usize),
    /// The configuration as text (`RetunerConfig`'s Debug form): what every rank must share.
    config: String,
    /// The check it replays (None: the oracle) and that check's sync lag.
    check: Option<CheckMode>,
    sync_lag: u32,
    /// The scored walk's fewest micro-batches per rank.
    min_micro_batches: u32,
}

#[pymethods]
impl Retuner {
    #[new]
    #[pyo3(signature = (world_size, micro_batches, *, period=200, probe_steps=20, hysteresis=0.01, max_drop_rate=0.10, min_batch_fraction=0.75, min_gain=0.02, min_micro_batches=1, check="oracle", sync_lag=0, jitter_ns=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = crate::args::number)] world_size: usize,
        #[pyo3(from_py_with = crate::args::number)] micro_batches: usize,
        #[pyo3(from_py_with = crate::args::number)] period: usize,
        #[pyo3(from_py_with = crate::args::number)] probe_steps: usize,
        #[pyo3(from_py_with = crate::args::number)] hysteresis: f64,
        #[pyo3(from_py_with = crate::args::number)] max_drop_rate: f64,
        #[pyo3(from_py_with = crate::args::number)] min_batch_fraction: f64,
        #[pyo3(from_py_with = crate::args::number)] min_gain: f64,
        #[pyo3(from_py_with = crate::args::number)] min_micro_batches: u32,
        check: &str,
        #[pyo3(from_py_with = crate::args::number)] sync_lag: u32,
        #[pyo3(from_py_with = crate::args::number)] jitter_ns: f64,
    ) -> PyResult<Self> {
        let world_size = self::world_size("world_size", world_size)?;
        let micro_batches = self::micro_batches("micro_batches", micro_batches)?;
        let mode = tuned_check(check, jitter_ns)?;
        if mode.is_none() && sync_lag > 0 {
            return Err(value_err(
                "sync_lag",
                format!("{sync_lag}: the oracle has no check to lag; use check=\"before\" or \"predictive\""),
            ));
        }
        let cfg = RetunerConfig {
            period,
            probe_steps,
            hysteresis,
            tune: TuneConfig {
                guardrails: guardrails(max_drop_rate, min_batch_fraction, min_gain, jitter_ns)?,
                min_micro_batches,
            },
            // The replayed check of the step that runs the threshold (its warm-up is the
            // step's own; the window replays from its first step).
            execution: mode.map(|check| ExecutionModel {
                check,
                sync_lag,
                warmup_steps: 0,
                min_micro_batches,
                drop_guard: None,
            }),
        };
        let inner = tune::retune::Retuner::new(cfg, world_size, micro_batches)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            inner,
            shape: (world_size, micro_batches),
            config: format!("{cfg:?}"),
            check: mode,
            sync_lag,
            min_micro_batches,
        })
    }

    /// Feed one step's (N, M) latency matrix (ns; NaN for dropped) and step time (ns).
    fn on_step<'py>(
        &mut self,
        py: Python<'py>,
        latencies_ns: PyReadonlyArray2<'py, f64>,
        #[pyo3(from_py_with = crate::args::number)] step_time_ns: f64,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        // The shape before the copy: a broadcast array may be huge and hold no memory.
        let view = latencies_ns.as_array();
        if view.dim() != self.shape {
            return Err(value_err(
                "latencies_ns",
                format!("shape {:?}: must be (world_size, micro_batches) = {:?}", view.dim(), self.shape),
            ));
        }
        let lat: Vec<f64> = view.iter().copied().collect();
        let inner = &mut self.inner;
        let ev = py.detach(|| inner.on_step(&lat, step_time_ns)).map_err(|e| value_err("latencies_ns", e))?;
        let Some(ev) = ev else { return Ok(None) };
        let d = PyDict::new(py);
        match ev {
            RetuneEvent::Tuned { threshold, changed, predicted, verdict } => {
                d.set_item("event", "tuned")?;
                d.set_item("threshold_ns", threshold.as_ns())?;
                d.set_item("changed", changed)?;
                d.set_item("predicted_speedup", predicted)?;
                if let RsVerdict::Decline(r) = verdict {
                    d.set_item("reason", r.to_string())?;
                }
            }
            RetuneEvent::Measured { threshold, predicted, measured, drop_rate } => {
                d.set_item("event", "measured")?;
                d.set_item("threshold_ns", threshold.as_ns())?;
                d.set_item("predicted_speedup", predicted)?;
                d.set_item("measured_speedup", measured)?;
                d.set_item("drop_rate", drop_rate)?;
            }
        }
        Ok(Some(d))
    }

    /// The threshold for the next step (ns), None = off.
    #[getter]
    fn threshold_ns(&self) -> Option<u64> {
        self.inner.threshold_for_next_step().as_ns()
    }

    /// N, the rows `on_step` takes.
    #[getter]
    fn world_size(&self) -> usize {
        self.shape.0
    }

    /// M, the columns `on_step` takes.
    #[getter]
    fn micro_batches(&self) -> usize {
        self.shape.1
    }

    /// The configuration (period, probe steps, hysteresis, guardrails) as text: equal on ranks
    /// that retune alike.
    #[getter]
    fn config(&self) -> &str {
        &self.config
    }
    /// The check it scores thresholds under: "oracle", "before" or "predictive".
    #[getter]
    fn check(&self) -> &'static str {
        self.check.map_or("oracle", check_name)
    }
    /// The replayed check's sync lag (micro-batches; 0 with the oracle).
    #[getter]
    fn sync_lag(&self) -> u32 {
        self.sync_lag
    }
    /// The fewest micro-batches a rank computes per step in the scored walk (the policy's
    /// `min_micro_batches` it must match).
    #[getter]
    fn min_micro_batches(&self) -> u32 {
        self.min_micro_batches
    }
}

/// The extension module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A panic (a bug) becomes pyo3's PanicException with its message; nothing is printed.
    dropcompute_capi::quiet_panics_everywhere();
    m.add_class::<Policy>()?;
    m.add_class::<DropGuard>()?;
    m.add_class::<LatencyEstimator>()?;
    m.add_class::<StepWalk>()?;
    m.add_class::<Verdict>()?;
    m.add_class::<ComputeLogWriter>()?;
    m.add_class::<StragglerTracker>()?;
    m.add_class::<Retuner>()?;
    m.add_class::<Dealer>()?;
    m.add_class::<steppolicy::StepPolicy>()?;
    m.add_class::<steppolicy::Assigner>()?;
    m.add_function(wrap_pyfunction!(steppolicy::backup_aggregated, m)?)?;
    m.add_function(wrap_pyfunction!(recommend, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(divisor, m)?)?;
    m.add_function(wrap_pyfunction!(deal_by_cost, m)?)?;
    m.add("MIN_STEPS", tune::MIN_STEPS)?;
    m.add("MAX_WORLD_SIZE", DC_MAX_WORLD_SIZE)?;
    m.add("MAX_MICRO_BATCHES", DC_MAX_MICRO_BATCHES)?;
    m.add("MAX_ESTIMATOR_WINDOW", DC_MAX_ESTIMATOR_WINDOW)?;
    m.add("MAX_TRACE_CELLS", MAX_FILLED_CELLS)?;
    m.add("MAX_DEALER_SAMPLES", MAX_DEALER_SAMPLES)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;

    Ok(())
}
