//! The C ABI of dropcompute: the deadline policy (`policy::decide`), the scheduler's step
//! walk (`policy::walk::RankWalk`, with the latency estimator of the predictive check), the threshold
//! recommendation from a trace file (`tune::recommend`) and the gradient divisor
//! (`schedule::divisor`), for training stacks written in C or C++. The header
//! `include/dropcompute.h` is generated from this file by cbindgen and checked current by
//! `tests/header.rs`.
//!
//! Owns: the C-facing types (opaque [`DcPolicy`], [`DcWalk`], [`DcEstimator`], [`DcStatus`]
//! codes, [`DcRecommendation`]),
//! the thread-local last-error message, and the panic guard of every exported function.
//! Must not touch: any decision logic (every function forwards to the crate's one
//! implementation), devices, collectives, environment variables.
//!
//! Conventions: every function returns a [`DcStatus`] (`DC_OK` = 0) and writes results through
//! out-pointers; on a non-zero status [`dc_last_error`] returns a message naming the argument
//! (and its value) or the file, and every out-pointer that is non-null and aligned holds its
//! documented neutral value (null handles, 0, false, an all-zero [`DcRecommendation`]), never
//! what it held before the call. Null and misaligned pointers are refused; every size argument
//! is checked against its documented cap (`DC_MAX_*`) before anything is allocated or a slice
//! is built; every file error (missing, a directory, permission) is `DC_IO`. No panic crosses
//! the boundary and none is printed into the host: each entry runs under `catch_unwind` with a
//! panic hook that records the message into [`dc_last_error`] instead of printing it (panics
//! outside these calls still reach the host's previous hook) and reports `DC_PANIC`. Times are
//! nanoseconds (u64 or f64 as documented).
//!
//! The Rust side ([`FaceError`], [`quiet`], [`load_trace`], [`divisor`], [`divisor_weighted`],
//! [`estimator`], [`bucket_estimator`], [`walk`], [`check_size`], and the length-aware face
//! layer [`lengths`]) is shared with the Python module, so both faces validate alike.
//!
//! Length buckets and tokens (`length-predictive`, `cost-balance`): [`dc_policy_new_kind`]
//! declares the bucket lengths, [`dc_walk_set_micro_batches`] tells a walk each micro-batch's
//! bucket and tokens ([`lengths::FaceWalk`], the scheduler's own walker told the buckets),
//! [`dc_estimator_observe`] / [`dc_estimator_estimate`] read and feed the per-bucket estimator
//! (`policy::BucketEstimator`; without buckets it is the blind estimator exactly, so the old
//! calls decide as before), [`dc_walk_tokens_started`] and [`dc_divisor_weighted`] divide by
//! tokens.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use dropcompute::policy::WalkEstimator;
use dropcompute::policy::{self, CheckMode, DeadlineConfig, Threshold};
use dropcompute::schedule::{CountRow, Normalization, SchedulerConfig, SkipReason, Weighting};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::{LatencyTrace, LoadOptions, TraceError};
use dropcompute::tune::{self, Guardrails, Recommend, Recommendation, Refusal, TuneInputError, Verdict};

pub mod lengths;

/// A status code returned by every function (a C `int32_t`; 0 = success). A newtype, not an
/// enum, so that a future code never makes an old caller's value invalid.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DcStatus(pub i32);

/// Success.
pub const DC_OK: DcStatus = DcStatus(0);
/// An argument is invalid (null pointer, out-of-range value); the message names it.
pub const DC_INVALID_ARGUMENT: DcStatus = DcStatus(1);
/// A file could not be read (message: the path and the OS error).
pub const DC_IO: DcStatus = DcStatus(2);
/// A trace file is malformed or inconsistent (message: file, line, column).
pub const DC_TRACE: DcStatus = DcStatus(3);
/// The trace is too small for a verdict (fewer than `DC_MIN_STEPS` complete steps or fewer than
/// 2 ranks).
pub const DC_INSUFFICIENT_DATA: DcStatus = DcStatus(4);
/// [`dc_divisor`]: the global computed count is zero; every rank skips the optimizer step.
pub const DC_SKIP_STEP: DcStatus = DcStatus(5);
/// A Rust panic was caught at the boundary (a bug; the message holds the panic text).
pub const DC_PANIC: DcStatus = DcStatus(6);

/// The fewest complete steps a trace needs for [`dc_recommend_file`] (`tune::MIN_STEPS`).
pub const DC_MIN_STEPS: u32 = 10;
const _: () = assert!(DC_MIN_STEPS as usize == tune::MIN_STEPS);

/// Check mode: start micro-batch k iff elapsed < threshold (the reference's behaviour).
pub const DC_CHECK_BEFORE: u32 = 0;
/// Check mode: start micro-batch k iff elapsed + estimate <= threshold.
pub const DC_CHECK_PREDICTIVE: u32 = 1;

/// Bucket of [`dc_estimator_observe`] / [`dc_estimator_estimate`]: not known (the blind window).
pub const DC_NO_BUCKET: u32 = u32::MAX;

/// Weighting of [`dc_divisor_weighted`]: the counts are samples.
pub const DC_WEIGHTING_SAMPLES: u32 = 0;
/// Weighting of [`dc_divisor_weighted`]: the counts are tokens ([`dc_walk_tokens_started`]).
pub const DC_WEIGHTING_TOKENS: u32 = 1;

/// Normalization: divide by the global computed count (DropCompute's rescale).
pub const DC_NORMALIZATION_REALIZED: u32 = 0;
/// Normalization: divide by the nominal N·M·b (the reference code).
pub const DC_NORMALIZATION_NOMINAL: u32 = 1;

/// Refusal code of a [`DcRecommendation`]: none (dropping enabled).
pub const DC_REFUSAL_NONE: u32 = 0;
/// Refusal: no threshold predicts at least `min_gain`.
pub const DC_REFUSAL_INSUFFICIENT_GAIN: u32 = 1;
/// Refusal: enough gain only above `max_drop_rate`.
pub const DC_REFUSAL_MAX_DROP_RATE: u32 = 2;
/// Refusal: enough gain only below `min_batch_fraction`.
pub const DC_REFUSAL_MIN_BATCH_FRACTION: u32 = 3;

/// Length of [`DcRecommendation::reason`] including the terminating NUL.
pub const DC_REASON_LEN: usize = 256;

/// Most ranks a call takes (`world_size` of [`dc_divisor`]; Python: `divisor`'s counts,
/// `StragglerTracker`, `Retuner`, a latency array's N): 2^20, far above a real job's, so that a
/// garbage length is refused before anything is allocated or read.
pub const DC_MAX_WORLD_SIZE: usize = 1 << 20;
/// Most micro-batches per rank and step a call takes (`micro_batches` of [`dc_walk_new`];
/// Python: `StepWalk`, `Retuner`): 2^20.
pub const DC_MAX_MICRO_BATCHES: u32 = 1 << 20;
/// Largest estimator window ([`dc_estimator_new`]; Python: `LatencyEstimator`): 2^20
/// latencies (16 MiB).
pub const DC_MAX_ESTIMATOR_WINDOW: usize = 1 << 20;

/// The deadline policy of one job (opaque; create with [`dc_policy_new`], free with
/// [`dc_policy_free`]). Immutable, so one handle may be shared by threads.
pub struct DcPolicy {
    cfg: DeadlineConfig,
    /// Declared bucket lengths ([`dc_policy_new_kind`]; empty from [`dc_policy_new`]).
    bucket_lengths: Vec<u32>,
}

/// Limits on a recommendation (fractions in [0, 1]; see `tune::Guardrails`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DcGuardrails {
    /// Largest admissible mean drop rate (default 0.10).
    pub max_drop_rate: f64,
    /// Smallest admissible fraction of the global batch computed in any step (default 0.75).
    pub min_batch_fraction: f64,
    /// Smallest predicted effective speedup that justifies dropping (default 0.02 = +2 %).
    pub min_gain: f64,
    /// Timing jitter the threshold must tolerate (ns, finite, >= 0; default 0): a candidate is
    /// judged by the worst replay within +-`jitter_ns` of it (`tune::Guardrails::jitter_ns`).
    /// Replayed recommendations only: refused with the ideal (`UINT32_MAX`) when above 0.
    pub jitter_ns: f64,
}

/// The result of [`dc_recommend_file`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DcRecommendation {
    /// True when dropping is recommended at `threshold_ns`.
    pub enabled: bool,
    /// The threshold (ns of compute time per step); 0 when declined.
    pub threshold_ns: f64,
    /// Predicted mean drop rate at the threshold (fraction); 0 when declined.
    pub predicted_drop_rate: f64,
    /// Predicted effective speedup at the threshold (0.1 = +10 %); when declined, the best
    /// predicted speedup that the guardrails refused.
    pub predicted_speedup: f64,
    /// `DC_REFUSAL_*` code.
    pub refusal: u32,
    /// NUL-terminated reason of a refusal (empty when enabled), truncated to fit.
    pub reason: [c_char; DC_REASON_LEN],
}

/// Why a call of a face failed: a status code and [`dc_last_error`]'s message in C, an
/// exception in Python (`python/src/lib.rs`). Every message names the argument and its value,
/// or the file.
#[derive(Debug, thiserror::Error)]
pub enum FaceError {
    /// A required pointer was null (`DC_INVALID_ARGUMENT`).
    #[error("{argument}: null pointer")]
    NullPointer {
        /// The argument's name.
        argument: &'static str,
    },
    /// An argument is out of its range (`DC_INVALID_ARGUMENT`; Python `ValueError`).
    #[error("{argument} {value}: {why}")]
    InvalidArgument {
        /// The argument's name (a field as `guardrails.min_gain`).
        argument: &'static str,
        /// Its value as given.
        value: String,
        /// What is required.
        why: String,
    },
    /// A size or length exceeds its documented cap, or a product of sizes overflows
    /// (`DC_INVALID_ARGUMENT`; Python `ValueError`); checked before any allocation.
    #[error("{argument} {value}: exceeds {cap_name} ({cap})")]
    TooLarge {
        /// The argument's name.
        argument: &'static str,
        /// Its value (a product of sizes is computed without overflow).
        value: u128,
        /// The cap.
        cap: u128,
        /// The cap's name (`DC_MAX_WORLD_SIZE`, ...).
        cap_name: &'static str,
    },
    /// Reading a trace failed: `DC_IO` for [`TraceError::Io`] and [`TraceError::Input`] (the
    /// bounded reader: unreadable, a directory, over a cap) (Python `OSError`, with the
    /// subclass of the OS error: `FileNotFoundError`, `IsADirectoryError`, `PermissionError`),
    /// `DC_INSUFFICIENT_DATA` for [`TraceError::InsufficientData`], else `DC_TRACE`.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// `tune::check_inputs` refused the trace and the execution (`DC_INSUFFICIENT_DATA` for too
    /// little data, `DC_INVALID_ARGUMENT` for `min_micro_batches` or the sync lag).
    #[error(transparent)]
    Tune(#[from] TuneInputError),
    /// A file holds several traces (`DC_TRACE`).
    #[error("{}: {count} traces in one input; pass one (or every rank's log of one job)", .path.display())]
    SeveralTraces {
        /// The file.
        path: PathBuf,
        /// Traces found.
        count: usize,
    },
    /// Every rank skips the optimizer step (`DC_SKIP_STEP`; Python `divisor` returns None).
    #[error("{}", skip_text(.0))]
    SkipStep(SkipReason),
    /// A Rust panic was caught at the boundary (`DC_PANIC`; a bug): its message and location.
    #[error("panic in dropcompute: {0}")]
    Panic(String),
}

fn skip_text(r: &SkipReason) -> String {
    match r {
        SkipReason::ZeroCount => "global computed count is zero: every rank skips the step".to_string(),
        SkipReason::NonFinite { ranks } => format!("non-finite gradient on ranks {ranks:?}"),
    }
}

impl FaceError {
    /// The C status code of this error.
    pub fn status(&self) -> DcStatus {
        match self {
            Self::NullPointer { .. } | Self::InvalidArgument { .. } | Self::TooLarge { .. } => DC_INVALID_ARGUMENT,
            Self::Trace(TraceError::Io { .. } | TraceError::Input(_)) => DC_IO,
            Self::Trace(TraceError::InsufficientData { .. }) => DC_INSUFFICIENT_DATA,
            Self::Trace(_) | Self::SeveralTraces { .. } => DC_TRACE,
            Self::Tune(TuneInputError::InsufficientData(_)) => DC_INSUFFICIENT_DATA,
            Self::Tune(_) => DC_INVALID_ARGUMENT,
            Self::SkipStep(_) => DC_SKIP_STEP,
            Self::Panic(_) => DC_PANIC,
        }
    }

    /// The kind of OS error of a file that could not be read (or of an input the bounded
    /// reader refused: a directory is `IsADirectory`, a cap or a stop `Other`), if this is one.
    pub fn io_error(&self) -> Option<std::io::ErrorKind> {
        use dropcompute::input::InputError as I;
        use std::io::ErrorKind as K;
        match self {
            Self::Trace(TraceError::Io { source, .. }) | Self::Trace(TraceError::Input(I::Io { source, .. })) => {
                Some(source.kind())
            }
            Self::Trace(TraceError::Input(I::Directory { .. })) => Some(K::IsADirectory),
            Self::Trace(TraceError::Input(_)) => Some(K::Other),
            _ => None,
        }
    }
}

/// `value` as an argument whose value is refused for `why`.
fn invalid(argument: &'static str, value: impl std::fmt::Display, why: impl Into<String>) -> FaceError {
    FaceError::InvalidArgument { argument, value: value.to_string(), why: why.into() }
}

/// `value` of the size argument `argument`, refused with [`FaceError::TooLarge`] above `cap`
/// (named `cap_name`). The one size check of both faces: call it before allocating.
///
/// # Errors
/// [`FaceError::TooLarge`] when `value > cap`.
pub fn check_size(argument: &'static str, value: u128, cap: u128, cap_name: &'static str) -> Result<(), FaceError> {
    if value > cap { Err(FaceError::TooLarge { argument, value, cap, cap_name }) } else { Ok(()) }
}

/// Refuses a null or misaligned pointer named `argument`.
fn require<T>(p: *const T, argument: &'static str) -> Result<(), FaceError> {
    if p.is_null() {
        return Err(FaceError::NullPointer { argument });
    }
    if !p.is_aligned() {
        return Err(invalid(argument, format!("{p:p}"), format!("not aligned to {} bytes", align_of::<T>())));
    }
    Ok(())
}

/// Writes the neutral `value` through `out` when it is non-null and aligned (the first thing
/// every entry with an out-pointer does, so a failure never leaves the caller's old value).
///
/// # Safety
/// `out` must be null, misaligned (then nothing is written) or valid for one write of `T`.
unsafe fn reset<T>(out: *mut T, value: T) {
    if !out.is_null() && out.is_aligned() {
        // SAFETY: non-null and aligned; valid for one write by the caller's contract. `write`
        // drops nothing (the `T`s written here are `Copy` or raw pointers).
        unsafe { out.write(value) }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Set while this thread runs a face's call under [`quiet`].
    static IN_FACE: Cell<bool> = const { Cell::new(false) };
    /// The message and location of the last panic the hook silenced on this thread.
    static PANIC_TEXT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Silence every panic of this library copy, not only those inside [`quiet`] (the Python
/// module: its extension carries its own copy of the standard library, so the hook sees only
/// its own panics).
static QUIET_EVERYWHERE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Installs, once per process, the panic hook of the faces: a panic inside [`quiet`] (or any
/// panic after [`quiet_panics_everywhere`]) is recorded for [`FaceError::Panic`] and printed
/// nowhere; any other goes to the hook that was installed before (the default prints it), so
/// the host's own panics and the command line keep their behaviour.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_face = IN_FACE.try_with(Cell::get).unwrap_or(false);
            if !(in_face || QUIET_EVERYWHERE.load(Ordering::Relaxed)) {
                return previous(info);
            }
            let mut text = payload_text(info.payload());
            if let Some(l) = info.location() {
                text = format!("{text} (at {}:{})", l.file(), l.line());
            }
            let _ = PANIC_TEXT.try_with(|t| *t.borrow_mut() = Some(text));
        }));
    });
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Makes every later panic of this library copy silent (recorded, not printed), for a host
/// that has no other Rust code in the same copy of the standard library (the Python
/// extension module, whose panics pyo3 raises as `PanicException`).
pub fn quiet_panics_everywhere() {
    QUIET_EVERYWHERE.store(true, Ordering::Relaxed);
    install_hook();
}

/// Runs `f` under `catch_unwind` with the faces' panic hook (see the module doc): a panic
/// prints nothing and becomes [`FaceError::Panic`] with its message and location.
///
/// # Errors
/// `f`'s error, or [`FaceError::Panic`].
pub fn quiet<R>(f: impl FnOnce() -> Result<R, FaceError>) -> Result<R, FaceError> {
    install_hook();
    let outer = IN_FACE.with(|c| c.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    IN_FACE.with(|c| c.set(outer));
    r.unwrap_or_else(|payload| {
        let text = PANIC_TEXT.with(|t| t.borrow_mut().take()).unwrap_or_else(|| payload_text(&*payload));
        Err(FaceError::Panic(text))
    })
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` under [`quiet`]: its error is recorded as the last error and returned as its
/// status; success clears the last error.
fn guard(f: impl FnOnce() -> Result<(), FaceError>) -> DcStatus {
    match quiet(f) {
        Ok(()) => {
            set_error("");
            DC_OK
        }
        Err(e) => {
            set_error(&e.to_string());
            e.status()
        }
    }
}

/// The message of the last failed call on this thread (empty after a successful call). The
/// pointer stays valid until the next `dc_*` call on the same thread; never null.
#[unsafe(no_mangle)]
pub extern "C" fn dc_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The check mode of a `DC_CHECK_*` code.
fn check_mode(code: u32) -> Result<CheckMode, FaceError> {
    match code {
        DC_CHECK_BEFORE => Ok(CheckMode::BeforeMicroBatch),
        DC_CHECK_PREDICTIVE => Ok(CheckMode::Predictive),
        other => Err(invalid("check_mode", other, "must be DC_CHECK_BEFORE (0) or DC_CHECK_PREDICTIVE (1)")),
    }
}

/// Creates a policy: `threshold_ns` < 0 turns the deadline off, otherwise it is the compute
/// deadline per step (ns); `check_mode` is `DC_CHECK_*`; steps `0..warmup_steps` never drop;
/// the first `min_micro_batches` micro-batches of a step always start.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `out` or an unknown `check_mode` (`*out` is then
/// null).
///
/// # Safety
/// `out` must be null or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_policy_new(
    threshold_ns: i64,
    check_mode_code: u32,
    warmup_steps: u64,
    min_micro_batches: u32,
    out: *mut *mut DcPolicy,
) -> DcStatus {
    // SAFETY: `out` is null or valid for one write by the caller's contract.
    unsafe { reset(out, std::ptr::null_mut()) };
    guard(|| {
        require(out, "out")?;
        let threshold = Threshold::from_ns(u64::try_from(threshold_ns).ok());
        let cfg = DeadlineConfig { threshold, check: check_mode(check_mode_code)?, warmup_steps, min_micro_batches };
        // SAFETY: `out` is non-null and, by the caller's contract, valid for one write.
        unsafe { *out = Box::into_raw(Box::new(DcPolicy { cfg, bucket_lengths: Vec::new() })) };
        Ok(())
    })
}

/// Creates the policy of kind `kind` (a NUL-terminated name: `drop-before`, `drop-predictive`,
/// `length-predictive` or `cost-balance`; its check mode is the kind's) with the declared
/// bucket lengths `bucket_lengths[0..n_buckets]` (padded lengths in tokens, strictly ascending,
/// at most 16; `n_buckets` 0: none, `bucket_lengths` may then be null). `threshold_ns`,
/// `warmup_steps` and `min_micro_batches` as in [`dc_policy_new`], which stays the policy of
/// a check mode without buckets.
///
/// Errors: `DC_INVALID_ARGUMENT` (`*out` null) for a null `out` or `kind`, a kind not listed, a
/// bucket length 0 or not above the one before (the message names its index), more than 16
/// lengths (checked before reading), a null `bucket_lengths` with `n_buckets` > 0.
///
/// # Safety
/// `kind` must be null or NUL-terminated; `bucket_lengths` null or readable for `n_buckets`
/// values; `out` null or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_policy_new_kind(
    kind: *const c_char,
    threshold_ns: i64,
    warmup_steps: u64,
    min_micro_batches: u32,
    bucket_lengths: *const u32,
    n_buckets: usize,
    out: *mut *mut DcPolicy,
) -> DcStatus {
    // SAFETY: `out` is null or valid for one write by the caller's contract.
    unsafe { reset(out, std::ptr::null_mut()) };
    guard(|| {
        require(out, "out")?;
        require(kind, "kind")?;
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let name = unsafe { CStr::from_ptr(kind) }.to_string_lossy();
        check_size("n_buckets", n_buckets as u128, policy::BucketTokens::MAX as u128, "BucketTokens::MAX")?;
        let lengths: &[u32] = if n_buckets == 0 {
            &[]
        } else {
            require(bucket_lengths, "bucket_lengths")?;
            // SAFETY: non-null, aligned, n_buckets <= 16 and readable for n_buckets values by
            // the caller's contract.
            unsafe { std::slice::from_raw_parts(bucket_lengths, n_buckets) }
        };
        let threshold = Threshold::from_ns(u64::try_from(threshold_ns).ok());
        let k = lengths::FaceKind::new(&name, threshold, warmup_steps, min_micro_batches, lengths)?;
        let p = DcPolicy { cfg: k.cfg, bucket_lengths: k.bucket_lengths };
        // SAFETY: non-null, aligned and, by the caller's contract, valid for one write.
        unsafe { *out = Box::into_raw(Box::new(p)) };
        Ok(())
    })
}

/// Whether to start the next micro-batch (`policy::decide`): `step` is the 0-based step index,
/// `started` the micro-batches already started in this step, `elapsed_ns` the compute time
/// elapsed in this step (ns since the previous optimizer step ended), `estimate_ns` the
/// estimated latency of the next micro-batch (ns; 0 = no estimate). Writes true to `out` to
/// start.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `policy` or `out` (`*out` is then false).
///
/// # Safety
/// `policy` must be null or a live handle from [`dc_policy_new`]; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_policy_should_start(
    policy: *const DcPolicy,
    step: u64,
    started: u32,
    elapsed_ns: u64,
    estimate_ns: u64,
    out: *mut bool,
) -> DcStatus {
    // SAFETY: `out` is null or writable by the caller's contract.
    unsafe { reset(out, false) };
    guard(|| {
        require(policy, "policy")?;
        require(out, "out")?;
        // SAFETY: non-null and, by the caller's contract, a live handle from dc_policy_new.
        let p = unsafe { &*policy };
        let est = (estimate_ns > 0).then_some(estimate_ns);
        let start = policy::decide(&p.cfg, step, started, elapsed_ns, est).is_start();
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *out = start };
        Ok(())
    })
}

/// Frees a policy (null is a no-op).
///
/// # Safety
/// `policy` must be null or a handle from [`dc_policy_new`] not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_policy_free(policy: *mut DcPolicy) {
    if !policy.is_null() {
        // SAFETY: by the caller's contract the handle came from Box::into_raw and is freed once.
        // Dropping a DeadlineConfig cannot panic.
        drop(unsafe { Box::from_raw(policy) });
    }
}

/// A rank's latency estimator of the predictive check (`policy::BucketEstimator`: per length
/// bucket, the nearest-rank quantile of a sliding window of that bucket's latencies, with the
/// blind window over every latency as its fallback; fed no bucket, it is the blind
/// `policy::LatencyEstimator` exactly), kept across steps (opaque; [`dc_estimator_new`],
/// [`dc_estimator_free`]). Not shared between threads without a lock.
pub struct DcEstimator {
    inner: policy::BucketEstimator,
}

/// One rank's walk through one step: the scheduler's own walker (`policy::walk::RankWalk`),
/// so a C or C++ training loop decides exactly as the Rust scheduler and the simulator
/// (opaque; [`dc_walk_new`], [`dc_walk_free`]).
pub struct DcWalk {
    inner: lengths::FaceWalk,
}

/// [`dc_walk_next`]: report the ends of launches `dc_walk_reported()..value` with
/// [`dc_walk_ended`] (value 0: the step's compute clock; optionally [`dc_walk_clock_at`]).
pub const DC_WALK_WAIT: u32 = 0;
/// [`dc_walk_next`]: run micro-batch `value` (0-based), then call again.
pub const DC_WALK_LAUNCH: u32 = 1;
/// [`dc_walk_next`]: the step is over; value 1 when the deadline stopped it, 0 when every
/// micro-batch was started.
pub const DC_WALK_DONE: u32 = 2;

/// Creates an estimator over the last `window` (1..=`DC_MAX_ESTIMATOR_WINDOW`) latencies
/// returning their `quantile` (in [0, 1]; the scheduler's default: window 32, quantile 0.9).
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `out`, `window` 0 or above
/// `DC_MAX_ESTIMATOR_WINDOW`, or a quantile outside [0, 1] or NaN (`*out` is then null).
///
/// # Safety
/// `out` must be null or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_estimator_new(window: usize, quantile: f64, out: *mut *mut DcEstimator) -> DcStatus {
    // SAFETY: `out` is null or valid for one write by the caller's contract.
    unsafe { reset(out, std::ptr::null_mut()) };
    guard(|| {
        require(out, "out")?;
        let e = DcEstimator { inner: bucket_estimator(window as u64, quantile)? };
        // SAFETY: non-null, aligned (checked) and valid for one write by the caller's contract.
        unsafe { *out = Box::into_raw(Box::new(e)) };
        Ok(())
    })
}

/// A latency estimator over `window` latencies returning their `quantile`: the one check of
/// both faces (window in 1..=[`DC_MAX_ESTIMATOR_WINDOW`], quantile in [0, 1]) before the
/// window is allocated.
///
/// # Errors
/// [`FaceError::InvalidArgument`] (window 0, quantile outside [0, 1] or NaN),
/// [`FaceError::TooLarge`] (window above the cap).
pub fn estimator(window: u64, quantile: f64) -> Result<policy::LatencyEstimator, FaceError> {
    if window == 0 {
        return Err(invalid("window", 0, "must be >= 1"));
    }
    check_size("window", window.into(), DC_MAX_ESTIMATOR_WINDOW as u128, "DC_MAX_ESTIMATOR_WINDOW")?;
    if !(0.0..=1.0).contains(&quantile) {
        return Err(invalid("quantile", quantile, "must be in [0, 1]"));
    }
    Ok(policy::LatencyEstimator::new(window as usize, quantile))
}

/// [`estimator`]'s checks, then a per-bucket estimator (`policy::BucketEstimator`) over
/// `window` latencies per bucket returning their `quantile`.
///
/// # Errors
/// As [`estimator`].
pub fn bucket_estimator(window: u64, quantile: f64) -> Result<policy::BucketEstimator, FaceError> {
    estimator(window, quantile)?;
    Ok(policy::BucketEstimator::new(window as usize, quantile))
}

/// The bucket of a C call: `DC_NO_BUCKET` reads as none.
fn c_bucket(bucket: u32) -> Option<u32> {
    (bucket != DC_NO_BUCKET).then_some(bucket)
}

/// Records the measured latency (ns) of a whole micro-batch of bucket `bucket` (an index into
/// the policy's declared bucket lengths; `DC_NO_BUCKET`: not known, the blind window only).
/// The walk feeds its estimator itself ([`dc_walk_ended`]); this call is for an estimator fed
/// from elsewhere (every rank's gathered latencies, a warm start).
///
/// Errors: `DC_INVALID_ARGUMENT` for a null or misaligned `estimator`.
///
/// # Safety
/// `estimator` must be null or a live handle from [`dc_estimator_new`], not used by another
/// thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_estimator_observe(estimator: *mut DcEstimator, bucket: u32, latency_ns: u64) -> DcStatus {
    guard(|| {
        require(estimator, "estimator")?;
        // SAFETY: non-null, aligned and, by the caller's contract, live and not aliased.
        unsafe { &mut *estimator }.inner.observe_for(c_bucket(bucket), latency_ns);
        Ok(())
    })
}

/// The estimate (ns) of the next whole micro-batch of bucket `bucket` (`DC_NO_BUCKET`: blind):
/// the bucket's own window, else the blind one; 0 when nothing was measured.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null or misaligned `estimator` or `out` (`*out` is then 0).
///
/// # Safety
/// `estimator` must be null or a live handle, not used by another thread meanwhile; `out` null
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_estimator_estimate(estimator: *mut DcEstimator, bucket: u32, out: *mut u64) -> DcStatus {
    // SAFETY: `out` is null or writable by the caller's contract.
    unsafe { reset(out, 0) };
    guard(|| {
        require(estimator, "estimator")?;
        require(out, "out")?;
        // SAFETY: non-null, aligned and, by the caller's contract, live and not aliased.
        let e = unsafe { &mut *estimator }.inner.estimate_for(c_bucket(bucket)).unwrap_or(0);
        // SAFETY: non-null, aligned and writable by the caller's contract.
        unsafe { *out = e };
        Ok(())
    })
}

/// Frees an estimator (null is a no-op).
///
/// # Safety
/// `estimator` must be null or a handle from [`dc_estimator_new`] not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_estimator_free(estimator: *mut DcEstimator) {
    if !estimator.is_null() {
        // SAFETY: by the caller's contract the handle came from Box::into_raw and is freed once.
        drop(unsafe { Box::from_raw(estimator) });
    }
}

/// The run-time drop-rate guard (`policy::DropGuard`, the rule of the Rust scheduler, the
/// replay and the Python step): whether the next step runs with the threshold in force, so
/// that the run's cumulative drop rate stays within a bound (opaque; [`dc_guard_new`],
/// [`dc_guard_free`]). Feed it every step's global counts (identical on every rank) and every
/// rank decides alike. Not shared between threads without a lock.
pub struct DcGuard {
    inner: policy::DropGuard,
}

/// Creates a guard holding the cumulative drop rate at or below `bound` (a fraction in (0, 1]:
/// 0.10 = 10 %), nothing recorded.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `out` or a bound outside (0, 1] or NaN (`*out` is
/// then null).
///
/// # Safety
/// `out` must be null or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_guard_new(bound: f64, out: *mut *mut DcGuard) -> DcStatus {
    // SAFETY: `out` is null or valid for one write by the caller's contract.
    unsafe { reset(out, std::ptr::null_mut()) };
    guard(|| {
        require(out, "out")?;
        let inner = policy::DropGuard::new(bound).map_err(|e| invalid("bound", bound, e.to_string()))?;
        // SAFETY: non-null, aligned (checked) and valid for one write by the caller's contract.
        unsafe { *out = Box::into_raw(Box::new(DcGuard { inner })) };
        Ok(())
    })
}

/// Whether the next step, handing out `handed` micro-batches over every rank (in the run's drop
/// unit), runs with the threshold in force (`*out` 1) or off (`*out` 0): `dropped + reserve <=
/// bound x (handed so far + handed)`, the reserve being the largest drop of an enforced step
/// so far (`policy::guard`'s module doc).
///
/// Errors: `DC_INVALID_ARGUMENT` for a null or misaligned `drop_guard` or `out` (`*out` is then 0).
///
/// # Safety
/// `drop_guard` must be null or a live handle from [`dc_guard_new`]; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_guard_enforces(drop_guard: *const DcGuard, handed: u64, out: *mut u32) -> DcStatus {
    // SAFETY: `out` is null or writable by the caller's contract.
    unsafe { reset(out, 0) };
    guard(|| {
        require(drop_guard, "drop_guard")?;
        require(out, "out")?;
        // SAFETY: non-null, aligned and, by the caller's contract, live.
        let yes = unsafe { &*drop_guard }.inner.enforces(handed);
        // SAFETY: non-null, aligned and writable by the caller's contract.
        unsafe { *out = u32::from(yes) };
        Ok(())
    })
}

/// Records a step's global counts: `handed` micro-batches handed out over every rank,
/// `started` of them started (above `handed`: no drop), `enforced` (non-zero) whether the step
/// ran with the threshold in force.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null or misaligned `drop_guard`.
///
/// # Safety
/// `drop_guard` must be null or a live handle from [`dc_guard_new`], not used by another thread
/// meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_guard_record(
    drop_guard: *mut DcGuard,
    handed: u64,
    started: u64,
    enforced: u32,
) -> DcStatus {
    guard(|| {
        require(drop_guard, "drop_guard")?;
        // SAFETY: non-null, aligned and, by the caller's contract, live and not aliased.
        unsafe { &mut *drop_guard }.inner.record(handed, started, enforced != 0);
        Ok(())
    })
}

/// Frees a guard (null is a no-op).
///
/// # Safety
/// `drop_guard` must be null or a handle from [`dc_guard_new`] not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_guard_free(drop_guard: *mut DcGuard) {
    if !drop_guard.is_null() {
        // SAFETY: by the caller's contract the handle came from Box::into_raw and is freed once.
        drop(unsafe { Box::from_raw(drop_guard) });
    }
}

/// Starts the walk of step `step` (0-based) for a rank handed `micro_batches` (at most
/// `DC_MAX_MICRO_BATCHES`) micro-batches under `policy`, the check lagging `sync_lag`
/// micro-batches behind the device.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `policy` or `out`, or `micro_batches` above
/// `DC_MAX_MICRO_BATCHES` (`*out` null then).
///
/// # Safety
/// `policy` must be null or a live handle from [`dc_policy_new`]; `out` null or valid for one
/// pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_new(
    policy: *const DcPolicy,
    step: u64,
    micro_batches: u32,
    sync_lag: u32,
    out: *mut *mut DcWalk,
) -> DcStatus {
    // SAFETY: `out` is null or valid for one write by the caller's contract.
    unsafe { reset(out, std::ptr::null_mut()) };
    guard(|| {
        require(out, "out")?;
        require(policy, "policy")?;
        // SAFETY: non-null, aligned and, by the caller's contract, a live handle from dc_policy_new.
        let p = unsafe { &*policy };
        let inner = lengths::FaceWalk::with_lengths(p.cfg, step, micro_batches.into(), sync_lag, &p.bucket_lengths)?;
        // SAFETY: non-null, aligned (checked) and valid for one write by the caller's contract.
        unsafe { *out = Box::into_raw(Box::new(DcWalk { inner })) };
        Ok(())
    })
}

/// The scheduler's walk of step `step` for a rank handed `micro_batches` micro-batches: the
/// one check of both faces (at most [`DC_MAX_MICRO_BATCHES`]) before its buffers are
/// allocated.
///
/// # Errors
/// [`FaceError::TooLarge`] for `micro_batches` above the cap.
pub fn walk(
    cfg: DeadlineConfig,
    step: u64,
    micro_batches: u64,
    sync_lag: u32,
) -> Result<policy::walk::RankWalk, FaceError> {
    check_size("micro_batches", micro_batches.into(), DC_MAX_MICRO_BATCHES.into(), "DC_MAX_MICRO_BATCHES")?;
    Ok(policy::walk::RankWalk::new(cfg, step, micro_batches as usize, policy::TailShape::default(), sync_lag))
}

/// Refuses a misaligned optional pointer named `argument` (null is accepted).
fn optional<T>(p: *const T, argument: &'static str) -> Result<(), FaceError> {
    if p.is_null() { Ok(()) } else { require(p, argument) }
}

/// The estimator behind `estimator`, or a fresh empty one (no estimate: the predictive check
/// then behaves as the before-check, as `dc_policy_should_start` with estimate 0 does).
///
/// # Safety
/// `estimator` must be null or a live handle from [`dc_estimator_new`] not used elsewhere
/// during the call.
unsafe fn with_estimator<R>(estimator: *mut DcEstimator, f: impl FnOnce(&mut policy::BucketEstimator) -> R) -> R {
    if estimator.is_null() {
        f(&mut policy::BucketEstimator::new(1, 1.0))
    } else {
        // SAFETY: non-null and, by the caller's contract, live and not aliased during the call.
        f(&mut unsafe { &mut *estimator }.inner)
    }
}

/// The walk's next action: writes `DC_WALK_WAIT`, `DC_WALK_LAUNCH` or `DC_WALK_DONE` to
/// `*kind` and its value to `*value` (see those constants). `estimator` may be null (no
/// predictive estimate).
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `walk`, `kind` or `value`, or a misaligned
/// `estimator`; each non-null `kind` and `value` then holds the neutral `DC_WALK_DONE` and 0
/// (a loop that ignores the status ends the step instead of waiting forever).
///
/// # Safety
/// `walk` must be null or a live handle from [`dc_walk_new`]; `estimator` null or a live
/// handle; `kind` and `value` null or writable; no handle used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_next(
    walk: *mut DcWalk,
    estimator: *mut DcEstimator,
    kind: *mut u32,
    value: *mut u64,
) -> DcStatus {
    // SAFETY: `kind` and `value` are null or writable by the caller's contract.
    unsafe {
        reset(kind, DC_WALK_DONE);
        reset(value, 0);
    }
    guard(|| {
        require(walk, "walk")?;
        require(kind, "kind")?;
        require(value, "value")?;
        optional(estimator, "estimator")?;
        use policy::walk::{Next, WalkEnd};
        // SAFETY: non-null and, by the caller's contract, live and not aliased.
        let w = unsafe { &mut *walk };
        // SAFETY: the caller's contract on `estimator`.
        let (k, v) = match unsafe { with_estimator(estimator, |e| w.inner.walk_mut().next(e)) } {
            Next::Wait { upto } => (DC_WALK_WAIT, upto as u64),
            Next::Launch(l) => (DC_WALK_LAUNCH, u64::from(l.micro_batch)),
            Next::Done(WalkEnd::Assignment) => (DC_WALK_DONE, 0),
            Next::Done(WalkEnd::Deadline(_)) => (DC_WALK_DONE, 1),
        };
        // SAFETY: non-null and writable by the caller's contract.
        unsafe {
            *kind = k;
            *value = v;
        }
        Ok(())
    })
}

/// Reports the end of launch `launch`: compute time from the step's clock start to its end
/// (`end_ns`) and its duration (`duration_ns`, fed to `estimator` when non-null). Launches are
/// reported in order.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `walk`, a misaligned `estimator`, or a launch out
/// of order, repeated or not started (nothing recorded).
///
/// # Safety
/// As [`dc_walk_next`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_ended(
    walk: *mut DcWalk,
    estimator: *mut DcEstimator,
    launch: u64,
    end_ns: u64,
    duration_ns: u64,
) -> DcStatus {
    guard(|| {
        require(walk, "walk")?;
        optional(estimator, "estimator")?;
        // SAFETY: non-null, aligned and, by the caller's contract, live and not aliased.
        let w = unsafe { &mut *walk };
        let expected = w.inner.walk().reported();
        let i = usize::try_from(launch).unwrap_or(usize::MAX);
        // SAFETY: the caller's contract on `estimator` (null or live; alignment checked).
        if unsafe { with_estimator(estimator, |e| w.inner.walk_mut().ended(i, end_ns, duration_ns, e)) } {
            Ok(())
        } else {
            Err(invalid(
                "launch",
                launch,
                format!("the next launch to report is {expected} (of {} started)", w.inner.walk().launches()),
            ))
        }
    })
}

/// Answers a `DC_WALK_WAIT` with value 0 with the compute time already elapsed (ns since the
/// clock start): time before the first micro-batch counts against the deadline.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `walk`.
///
/// # Safety
/// `walk` must be null or a live handle from [`dc_walk_new`], not used by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_clock_at(walk: *mut DcWalk, elapsed_ns: u64) -> DcStatus {
    guard(|| {
        require(walk, "walk")?;
        // SAFETY: non-null, aligned and, by the caller's contract, live and not aliased.
        unsafe { &mut *walk }.inner.walk_mut().clock_at(elapsed_ns);
        Ok(())
    })
}

/// Launches reported so far (0 for a null or misaligned `walk`).
///
/// # Safety
/// `walk` must be null or a live handle from [`dc_walk_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_reported(walk: *const DcWalk) -> u64 {
    if require(walk, "walk").is_err() {
        return 0;
    }
    // SAFETY: non-null and, by the caller's contract, a live handle.
    unsafe { &*walk }.inner.walk().reported() as u64
}

/// Tells the walk each of its `n` micro-batches' bucket (`buckets[j]`: an index into the
/// policy's declared bucket lengths, [`dc_policy_new_kind`]; `buckets` may be null: not known)
/// and tokens (`tokens[j]`, what [`dc_walk_tokens_started`] counts), micro-batch j in launch
/// order; call before the walk's first [`dc_walk_next`] (`lengths::FaceWalk::set_micro_batches`).
/// The predictive check before micro-batch j then uses bucket `buckets[j]`'s estimate, and its
/// latency is fed under that bucket.
///
/// Errors: `DC_INVALID_ARGUMENT` (nothing changed) for a null `walk` or `tokens`, a misaligned
/// pointer, `n` above `DC_MAX_MICRO_BATCHES` (checked before reading) or not the walk's
/// micro-batches, a bucket not below the number of declared lengths (the message names its
/// index and value), or a walk that has launched already.
///
/// # Safety
/// `walk` must be null or a live handle from [`dc_walk_new`], not used by another thread;
/// `buckets` null or readable for `n` values; `tokens` null or readable for `n` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_set_micro_batches(
    walk: *mut DcWalk,
    buckets: *const u32,
    tokens: *const u64,
    n: usize,
) -> DcStatus {
    guard(|| {
        require(walk, "walk")?;
        check_size("n", n as u128, DC_MAX_MICRO_BATCHES.into(), "DC_MAX_MICRO_BATCHES")?;
        require(tokens, "tokens")?;
        optional(buckets, "buckets")?;
        // SAFETY: non-null, aligned, n <= DC_MAX_MICRO_BATCHES (the byte length is far below
        // isize::MAX) and readable for n values by the caller's contract.
        let tokens = unsafe { std::slice::from_raw_parts(tokens, n) };
        let buckets = if buckets.is_null() {
            None
        } else {
            // SAFETY: as for `tokens`.
            Some(unsafe { std::slice::from_raw_parts(buckets, n) })
        };
        // SAFETY: non-null, aligned and, by the caller's contract, live and not aliased.
        unsafe { &mut *walk }.inner.set_micro_batches(buckets, tokens)
    })
}

/// Tokens of the micro-batches the walk has started (the sum of [`dc_walk_set_micro_batches`]'
/// tokens over the launches; 0 when not told). This rank's count for [`dc_divisor_weighted`]
/// with `DC_WEIGHTING_TOKENS`.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null or misaligned `walk` or `out` (`*out` is then 0).
///
/// # Safety
/// `walk` must be null or a live handle from [`dc_walk_new`]; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_tokens_started(walk: *const DcWalk, out: *mut u64) -> DcStatus {
    // SAFETY: `out` is null or writable by the caller's contract.
    unsafe { reset(out, 0) };
    guard(|| {
        require(walk, "walk")?;
        require(out, "out")?;
        // SAFETY: non-null, aligned and, by the caller's contract, a live handle; `out` writable.
        unsafe { *out = (*walk).inner.tokens_started() };
        Ok(())
    })
}

/// Frees a walk (null is a no-op).
///
/// # Safety
/// `walk` must be null or a handle from [`dc_walk_new`] not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_free(walk: *mut DcWalk) {
    if !walk.is_null() {
        // SAFETY: by the caller's contract the handle came from Box::into_raw and is freed once.
        drop(unsafe { Box::from_raw(walk) });
    }
}

/// The layout version of this header's structs and signatures: raised whenever a struct's
/// layout or a function's signature changes (2: `DcGuardrails.jitter_ns` added at its end; 1:
/// before). A program compares it with [`dc_abi_version`] at start-up: a library of another
/// version would read its structs with another layout.
pub const DC_ABI_VERSION: u32 = 2;

/// The layout version of the loaded library ([`DC_ABI_VERSION`] of the header it was built
/// from). Never fails.
#[unsafe(no_mangle)]
pub extern "C" fn dc_abi_version() -> u32 {
    DC_ABI_VERSION
}

/// The default guardrails (max drop rate 0.10, min batch fraction 0.75, min gain 0.02, jitter 0 ns).
#[unsafe(no_mangle)]
pub extern "C" fn dc_guardrails_default() -> DcGuardrails {
    let g = Guardrails::default();
    DcGuardrails {
        max_drop_rate: g.max_drop_rate,
        min_batch_fraction: g.min_batch_fraction,
        min_gain: g.min_gain,
        jitter_ns: g.jitter_ns,
    }
}

/// Recommends a threshold from one trace file (a compute log, the reference's compute log or a
/// What-if CSV; `.gz` accepted) through `tune::recommend`: with a `DC_CHECK_*` mode the
/// verdict is the replay under that check mode (no warm-up, no sync lag: a trace file has
/// neither), as `dropcompute tune --check MODE` prints it; with `UINT32_MAX` it is the ideal
/// (the reference objective, a micro-batch counts iff it ends by the threshold; not realizable
/// on the device). `guardrails` null = defaults; `min_micro_batches` as for the policy.
///
/// Errors (`*out` is then all zero: not enabled, threshold 0, refusal `DC_REFUSAL_NONE`,
/// empty reason): `DC_INVALID_ARGUMENT` (null path/out, non-UTF-8 path, guardrail outside
/// [0, 1] or NaN, a jitter below 0, NaN or infinite (or above 0 with the ideal), unknown mode, `min_micro_batches` above the trace's micro-batches per step:
/// the rule of `dropcompute tune --min-micro-batches`), `DC_IO` (a missing or unreadable file,
/// a directory), `DC_TRACE` (malformed, empty, ragged, several traces in one file),
/// `DC_INSUFFICIENT_DATA` (fewer than `DC_MIN_STEPS` steps or 2 ranks). A FIFO is read as a
/// file: the call blocks until a writer opens it, as `dropcompute tune` does.
///
/// # Safety
/// `path` must be null or a NUL-terminated string; `guardrails` null or readable; `out` null or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_recommend_file(
    path: *const c_char,
    replay_check_mode: u32,
    guardrails: *const DcGuardrails,
    min_micro_batches: u32,
    out: *mut DcRecommendation,
) -> DcStatus {
    // SAFETY: `out` is null or writable by the caller's contract.
    unsafe { reset(out, DcRecommendation::ZERO) };
    guard(|| {
        require(path, "path")?;
        require(out, "out")?;
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let path = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|e| invalid("path", format!("(byte {} not UTF-8)", e.valid_up_to()), "must be UTF-8"))?;
        let g = if guardrails.is_null() {
            dc_guardrails_default()
        } else {
            optional(guardrails, "guardrails")?;
            // SAFETY: non-null, aligned and readable by the caller's contract.
            unsafe { *guardrails }
        };
        for (name, v) in [
            ("guardrails.max_drop_rate", g.max_drop_rate),
            ("guardrails.min_batch_fraction", g.min_batch_fraction),
            ("guardrails.min_gain", g.min_gain),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(name, v, "must be a fraction in [0, 1]"));
            }
        }
        let check = if replay_check_mode == u32::MAX { None } else { Some(check_mode(replay_check_mode)?) };
        let guardrails = Guardrails {
            max_drop_rate: g.max_drop_rate,
            min_batch_fraction: g.min_batch_fraction,
            min_gain: g.min_gain,
            jitter_ns: g.jitter_ns,
        };
        // The one rule (`Guardrails::validate`); the fractions were checked above by field name.
        if guardrails.validate().is_err() {
            return Err(invalid("guardrails.jitter_ns", g.jitter_ns, "must be a finite number of ns >= 0"));
        }
        if check.is_none() && g.jitter_ns > 0.0 {
            return Err(invalid(
                "guardrails.jitter_ns",
                g.jitter_ns,
                "applies to a replayed recommendation; the ideal (UINT32_MAX) has none",
            ));
        }
        let rec = recommend_path(&PathBuf::from(path), check, guardrails, min_micro_batches)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *out = rec };
        Ok(())
    })
}

/// Loads the one trace of `path` and recommends (see [`dc_recommend_file`]; `check` `None` =
/// the ideal).
///
/// # Errors
/// As [`dc_recommend_file`].
pub fn recommend_path(
    path: &Path,
    check: Option<CheckMode>,
    guardrails: Guardrails,
    min_micro_batches: u32,
) -> Result<DcRecommendation, FaceError> {
    let t = load_trace(path, &LoadOptions::default())?;
    let rec = recommend_checked(&t, check, guardrails, min_micro_batches, None)?;
    Ok(to_recommendation(chosen_verdict(&rec, check)))
}

/// The execution a trace file is replayed under by the faces: `check` (`None`: the
/// predictive check, for the ideal), no warm-up, no sync lag (a trace file has neither).
pub fn trace_execution(check: Option<CheckMode>, min_micro_batches: u32) -> ExecutionModel {
    ExecutionModel {
        check: check.unwrap_or(CheckMode::Predictive),
        sync_lag: 0,
        warmup_steps: 0,
        min_micro_batches,
        drop_guard: None,
    }
}

/// `tune::check_inputs` (the validation of `dropcompute tune`: enough steps and ranks,
/// `min_micro_batches` <= M, a drop-rate guard in (0, 1]), then [`recommend_trace`]. Shared
/// with the Python extension.
///
/// # Errors
/// [`FaceError::Tune`] from `tune::check_inputs`.
pub fn recommend_checked(
    trace: &LatencyTrace,
    check: Option<CheckMode>,
    guardrails: Guardrails,
    min_micro_batches: u32,
    drop_guard: Option<f64>,
) -> Result<Recommendation, FaceError> {
    tune::check_inputs(trace, &ExecutionModel { drop_guard, ..trace_execution(check, min_micro_batches) })?;
    Ok(recommend_trace(trace, check, guardrails, min_micro_batches, drop_guard))
}

/// `tune::recommend` on `trace` as a trace file is executed ([`trace_execution`]) under
/// `check` (`None`: the predictive check; pick the ideal with [`chosen_verdict`]), every
/// candidate replayed with the drop-rate guard `drop_guard` when given
/// (`ExecutionModel::drop_guard`), without [`recommend_checked`]'s validation.
pub fn recommend_trace(
    trace: &LatencyTrace,
    check: Option<CheckMode>,
    guardrails: Guardrails,
    min_micro_batches: u32,
    drop_guard: Option<f64>,
) -> Recommendation {
    let execution = ExecutionModel { drop_guard, ..trace_execution(check, min_micro_batches) };
    tune::recommend(trace, &Recommend { execution, guardrails })
}

/// The verdict `check` asks for: the replayed one under a check mode, the ideal for `None`.
pub fn chosen_verdict(rec: &Recommendation, check: Option<CheckMode>) -> &Verdict {
    if check.is_some() { &rec.verdict } else { &rec.ideal.verdict }
}

/// Loads the one trace held by `path` ([`load_trace_files`] of one file).
///
/// # Errors
/// As [`load_trace_files`].
pub fn load_trace(path: &Path, opts: &LoadOptions) -> Result<LatencyTrace, FaceError> {
    load_trace_files(&[path.to_path_buf()], opts)
}

/// Loads the one trace held by `paths` together: one file, or every rank's compute log of one
/// job (merged by `trace::load` as `dropcompute tune --trace A B ...` merges them). Shared with
/// the Python extension.
///
/// # Errors
/// [`FaceError::Trace`] (`DC_IO`: missing, unreadable, a directory; `DC_TRACE`: malformed,
/// empty, logs of different jobs), [`FaceError::SeveralTraces`] (naming the first file).
pub fn load_trace_files(paths: &[PathBuf], opts: &LoadOptions) -> Result<LatencyTrace, FaceError> {
    let mut loaded = dropcompute::trace::load(paths, opts)?;
    if loaded.len() != 1 {
        let path = paths.first().cloned().unwrap_or_default();
        return Err(FaceError::SeveralTraces { path, count: loaded.len() });
    }
    Ok(loaded.remove(0).trace)
}

impl DcRecommendation {
    /// The all-zero value [`dc_recommend_file`] leaves in `*out` on failure.
    pub const ZERO: Self = Self {
        enabled: false,
        threshold_ns: 0.0,
        predicted_drop_rate: 0.0,
        predicted_speedup: 0.0,
        refusal: DC_REFUSAL_NONE,
        reason: [0; DC_REASON_LEN],
    };
}

/// The C view of a verdict.
pub fn to_recommendation(v: &Verdict) -> DcRecommendation {
    let mut r = DcRecommendation::ZERO;
    match v {
        Verdict::Enable(c) => {
            r.enabled = true;
            r.threshold_ns = c.threshold_ns;
            r.predicted_drop_rate = c.drop_rate;
            r.predicted_speedup = c.objective;
        }
        Verdict::Decline(refusal) => {
            let (code, gain) = match *refusal {
                Refusal::InsufficientGain { best_gain, .. } => (DC_REFUSAL_INSUFFICIENT_GAIN, best_gain),
                Refusal::MaxDropRate { gain, .. } => (DC_REFUSAL_MAX_DROP_RATE, gain),
                Refusal::MinBatchFraction { gain, .. } => (DC_REFUSAL_MIN_BATCH_FRACTION, gain),
            };
            r.refusal = code;
            r.predicted_speedup = gain;
            let text = refusal.to_string();
            for (dst, b) in r.reason.iter_mut().zip(text.bytes().take(DC_REASON_LEN - 1)) {
                *dst = b as c_char;
            }
        }
    }
    r
}

/// The divisor of the summed gradient of one step (`schedule::divisor`): `counts` holds each
/// rank's computed samples (or tokens) for `world_size` ranks; `normalization` is
/// `DC_NORMALIZATION_*`; `micro_batches` (M) and `micro_batch_size` (b) are used by the nominal
/// normalization (N·M·b, both >= 1 there). Writes the divisor to `out`.
///
/// Errors (`*out` is then 0): `DC_INVALID_ARGUMENT` (null `out`, null or misaligned `counts`
/// with `world_size` > 0, `world_size` above `DC_MAX_WORLD_SIZE` (checked before `counts` is
/// read), unknown normalization, nominal normalization with `micro_batches` or
/// `micro_batch_size` 0), `DC_SKIP_STEP` when the global count is zero (every rank skips the
/// optimizer step; also for `world_size` 0).
///
/// # Safety
/// `counts` must be null (only with `world_size` 0) or readable for `world_size` values; `out`
/// null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_divisor(
    counts: *const u64,
    world_size: usize,
    normalization: u32,
    micro_batches: u32,
    micro_batch_size: u32,
    out: *mut f64,
) -> DcStatus {
    // SAFETY: the same arguments under the same contract: `dc_divisor_weighted` with counts in
    // samples is this call (one set of checks).
    unsafe {
        dc_divisor_weighted(
            counts,
            world_size,
            normalization,
            DC_WEIGHTING_SAMPLES,
            micro_batches,
            micro_batch_size,
            out,
        )
    }
}

/// [`dc_divisor`] with the unit of `counts`: `weighting` `DC_WEIGHTING_SAMPLES` (as
/// [`dc_divisor`]) or `DC_WEIGHTING_TOKENS` (each rank's started tokens,
/// [`dc_walk_tokens_started`]: the realized divisor is the global tokens started, exact; the
/// nominal one stays N·M·b).
///
/// Errors: as [`dc_divisor`], and `DC_INVALID_ARGUMENT` for an unknown `weighting`.
///
/// # Safety
/// As [`dc_divisor`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_divisor_weighted(
    counts: *const u64,
    world_size: usize,
    normalization: u32,
    weighting: u32,
    micro_batches: u32,
    micro_batch_size: u32,
    out: *mut f64,
) -> DcStatus {
    // SAFETY: `out` is null or writable by the caller's contract.
    unsafe { reset(out, 0.0) };
    guard(|| {
        require(out, "out")?;
        check_size("world_size", world_size as u128, DC_MAX_WORLD_SIZE as u128, "DC_MAX_WORLD_SIZE")?;
        let counts: &[u64] = if world_size == 0 {
            &[]
        } else {
            require(counts, "counts")?;
            // SAFETY: non-null, aligned, world_size <= DC_MAX_WORLD_SIZE (so the slice's byte
            // length is far below isize::MAX) and readable for world_size values by the
            // caller's contract.
            unsafe { std::slice::from_raw_parts(counts, world_size) }
        };
        let d = divisor_weighted(counts, normalization, weighting, micro_batches, micro_batch_size)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *out = d };
        Ok(())
    })
}

/// [`dc_divisor`] on a slice (shared with the Python extension): the same checks, the
/// length against [`DC_MAX_WORLD_SIZE`] before the count rows are allocated.
///
/// # Errors
/// As [`dc_divisor`].
pub fn divisor(
    counts: &[u64],
    normalization: u32,
    micro_batches: u32,
    micro_batch_size: u32,
) -> Result<f64, FaceError> {
    divisor_weighted(counts, normalization, DC_WEIGHTING_SAMPLES, micro_batches, micro_batch_size)
}

/// [`divisor`] of counts in the unit `weighting` (`DC_WEIGHTING_SAMPLES` or
/// `DC_WEIGHTING_TOKENS`: `schedule::Weighting`; the realized divisor is then the global
/// tokens started), shared with the Python extension.
///
/// # Errors
/// As [`dc_divisor_weighted`].
pub fn divisor_weighted(
    counts: &[u64],
    normalization: u32,
    weighting: u32,
    micro_batches: u32,
    micro_batch_size: u32,
) -> Result<f64, FaceError> {
    check_size("world_size", counts.len() as u128, DC_MAX_WORLD_SIZE as u128, "DC_MAX_WORLD_SIZE")?;
    let normalization = match normalization {
        DC_NORMALIZATION_REALIZED => Normalization::Realized,
        DC_NORMALIZATION_NOMINAL => Normalization::Nominal,
        other => return Err(invalid("normalization", other, "must be 0 (realized) or 1 (nominal)")),
    };
    if normalization == Normalization::Nominal {
        for (name, v) in [("micro_batches", micro_batches), ("micro_batch_size", micro_batch_size)] {
            if v == 0 {
                return Err(invalid(name, 0, "must be >= 1 under the nominal normalization (N·M·b)"));
            }
        }
    }
    let weighting = match weighting {
        DC_WEIGHTING_SAMPLES => Weighting::Samples,
        DC_WEIGHTING_TOKENS => Weighting::Tokens,
        other => return Err(invalid("weighting", other, "must be 0 (samples) or 1 (tokens)")),
    };
    let rows: Vec<CountRow> = counts
        .iter()
        .map(|&c| match weighting {
            Weighting::Samples => CountRow { samples: c, ..Default::default() },
            Weighting::Tokens => CountRow { tokens: c, ..Default::default() },
        })
        .collect();
    let cfg = SchedulerConfig { normalization, weighting, micro_batches, micro_batch_size, ..Default::default() };
    dropcompute::schedule::divisor(&rows, &cfg).map_err(FaceError::SkipStep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_and_reported() {
        let s = guard(|| panic!("boom {}", 7));
        assert_eq!(s, DC_PANIC);
        // SAFETY: dc_last_error returns a valid NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(dc_last_error()) }.to_str().unwrap().to_string();
        // The message and where the panic was raised, recorded by the hook (not printed).
        assert!(msg.starts_with("panic in dropcompute: boom 7 (at dropcompute-capi/src/lib.rs:"), "{msg}");
        assert_eq!(guard(|| Ok(())), DC_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(dc_last_error()) }.to_bytes(), b"");
    }

    #[test]
    fn divisor_forwards_both_normalizations_and_the_skip() {
        assert_eq!(divisor(&[12, 0, 5], DC_NORMALIZATION_REALIZED, 4, 3).unwrap(), 17.0);
        assert_eq!(divisor(&[12, 0, 5], DC_NORMALIZATION_NOMINAL, 4, 3).unwrap(), 36.0);
        assert_eq!(divisor(&[0, 0], DC_NORMALIZATION_REALIZED, 4, 3).unwrap_err().status(), DC_SKIP_STEP);
        let e = divisor(&[1], 9, 4, 3).unwrap_err();
        assert_eq!(e.status(), DC_INVALID_ARGUMENT);
        assert!(e.to_string().starts_with("normalization 9"), "{e}");
    }

    /// The length calls x {null handle, null tokens, n not M, n above the cap, unknown bucket,
    /// unknown kind, unsorted lengths, unknown weighting}: the status, the message naming the
    /// index and value, the outs' neutral values; and the tokens divisor sums tokens.
    #[test]
    fn the_length_calls_refuse_bad_input_and_the_divisor_counts_tokens() {
        let lens = [64u32, 128];
        let kind = CString::new("length-predictive").unwrap();
        let mut p: *mut DcPolicy = stale();
        // SAFETY: valid NUL-terminated kind, lengths readable for 2, `p` writable.
        assert_eq!(unsafe { dc_policy_new_kind(kind.as_ptr(), 100, 0, 1, lens.as_ptr(), 2, &mut p) }, DC_OK);
        let bad = CString::new("rebalance").unwrap();
        let mut q: *mut DcPolicy = stale();
        // SAFETY: as above.
        let s = unsafe { dc_policy_new_kind(bad.as_ptr(), 100, 0, 1, lens.as_ptr(), 2, &mut q) };
        assert_eq!((s, q.is_null()), (DC_INVALID_ARGUMENT, true));
        assert!(last().starts_with("kind \"rebalance\": must be one of"), "{}", last());
        let unsorted = [128u32, 64];
        // SAFETY: as above.
        let s = unsafe { dc_policy_new_kind(kind.as_ptr(), 100, 0, 1, unsorted.as_ptr(), 2, &mut q) };
        assert_eq!(
            (s, last().as_str()),
            (DC_INVALID_ARGUMENT, "bucket_lengths [1] 64: must be above bucket_lengths[0] (128)")
        );
        // SAFETY: a null lengths pointer with a count is refused before reading.
        let s = unsafe { dc_policy_new_kind(kind.as_ptr(), 100, 0, 1, std::ptr::null(), 2, &mut q) };
        assert_eq!((s, last().as_str()), (DC_INVALID_ARGUMENT, "bucket_lengths: null pointer"));
        // SAFETY: a huge count is refused before reading.
        let s = unsafe { dc_policy_new_kind(kind.as_ptr(), 100, 0, 1, lens.as_ptr(), usize::MAX, &mut q) };
        assert_eq!(s, DC_INVALID_ARGUMENT);
        assert_eq!(last(), "n_buckets 18446744073709551615: exceeds BucketTokens::MAX (16)");
        let mut w: *mut DcWalk = stale();
        // SAFETY: live policy, writable out.
        assert_eq!(unsafe { dc_walk_new(p, 0, 3, 0, &mut w) }, DC_OK);
        let (b, t) = ([0u32, 2, 1], [64u64, 128, 128]);
        // SAFETY: live walk; the slices are readable for 3 values; other lengths are refused
        // before reading; the handles are freed once at the end.
        unsafe {
            assert_eq!(dc_walk_set_micro_batches(w, b.as_ptr(), t.as_ptr(), 3), DC_INVALID_ARGUMENT);
            assert_eq!(last(), "buckets [1] 2: must be a bucket index below 2 (the declared bucket lengths [64, 128])");
            assert_eq!(dc_walk_set_micro_batches(w, b.as_ptr(), t.as_ptr(), 2), DC_INVALID_ARGUMENT);
            assert_eq!(last(), "tokens of length 2: must hold one value per micro-batch (3)");
            assert_eq!(dc_walk_set_micro_batches(w, b.as_ptr(), std::ptr::null(), 3), DC_INVALID_ARGUMENT);
            assert_eq!(last(), "tokens: null pointer");
            assert_eq!(dc_walk_set_micro_batches(std::ptr::null_mut(), b.as_ptr(), t.as_ptr(), 3), DC_INVALID_ARGUMENT);
            assert_eq!(last(), "walk: null pointer");
            assert_eq!(dc_walk_set_micro_batches(w, b.as_ptr(), t.as_ptr(), usize::MAX), DC_INVALID_ARGUMENT);
            assert_eq!(last(), "n 18446744073709551615: exceeds DC_MAX_MICRO_BATCHES (1048576)");
            let good = [0u32, 1, 1];
            assert_eq!(dc_walk_set_micro_batches(w, good.as_ptr(), t.as_ptr(), 3), DC_OK);
            let mut tok = 9u64;
            assert_eq!(dc_walk_tokens_started(std::ptr::null(), &mut tok), DC_INVALID_ARGUMENT);
            assert_eq!(tok, 0);
            assert_eq!(dc_walk_tokens_started(w, &mut tok), DC_OK);
            assert_eq!(tok, 0, "nothing started");
            let mut est = 9u64;
            assert_eq!(dc_estimator_estimate(std::ptr::null_mut(), 0, &mut est), DC_INVALID_ARGUMENT);
            assert_eq!((last().as_str(), est), ("estimator: null pointer", 0));
            assert_eq!(dc_estimator_observe(std::ptr::null_mut(), 0, 5), DC_INVALID_ARGUMENT);
            dc_walk_free(w);
            dc_policy_free(p);
        }
        let call = |c: &[u64], n: u32, wt: u32| {
            let mut out = 7.0;
            // SAFETY: `c` readable for its length, `out` writable.
            let s = unsafe { dc_divisor_weighted(c.as_ptr(), c.len(), n, wt, 4, 3, &mut out) };
            (s, out)
        };
        assert_eq!(call(&[640, 1280], DC_NORMALIZATION_REALIZED, DC_WEIGHTING_TOKENS), (DC_OK, 1920.0));
        assert_eq!(call(&[640, 1280], DC_NORMALIZATION_NOMINAL, DC_WEIGHTING_TOKENS), (DC_OK, 24.0));
        assert_eq!(call(&[0, 0], DC_NORMALIZATION_REALIZED, DC_WEIGHTING_TOKENS), (DC_SKIP_STEP, 0.0));
        assert_eq!(call(&[1], DC_NORMALIZATION_REALIZED, 7), (DC_INVALID_ARGUMENT, 0.0));
        assert_eq!(last(), "weighting 7: must be 0 (samples) or 1 (tokens)");
    }

    /// The last error of this thread.
    fn last() -> String {
        // SAFETY: dc_last_error returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(dc_last_error()) }.to_str().unwrap().to_string()
    }

    /// A non-null, aligned, never dereferenced handle value: what a caller's stale `*out` may
    /// hold before a failed call.
    fn stale<T>() -> *mut T {
        std::ptr::NonNull::dangling().as_ptr()
    }

    /// A compute log of `ranks` x `micro_batches` x `steps` of 1 ms (rank 1's last
    /// micro-batch 6 ms on even steps).
    fn write_log(path: &Path, ranks: u32, micro_batches: u32, steps: u64) {
        use dropcompute::trace::compute_log::{ComputeLogRecord, ComputeLogWriter};
        let mut w = ComputeLogWriter::new(std::fs::File::create(path).unwrap());
        for step in 0..steps {
            for rank in 0..ranks {
                let mut start = 0;
                for mb in 0..micro_batches {
                    let last = rank == 1 && mb + 1 == micro_batches && step % 2 == 0;
                    let dur: u64 = if last { 6_000_000 } else { 1_000_000 };
                    let rec = ComputeLogRecord {
                        global_step: step,
                        local_step: mb,
                        world_size: ranks,
                        batch: 8,
                        computed_batch: 8 * u64::from(mb + 1),
                        iteration_time_ms: dur as f64 / 1e6,
                        rank,
                        start_ns: start,
                        duration_ns: dur,
                        ..ComputeLogRecord::default()
                    };
                    w.write(&rec).unwrap();
                    start += dur;
                }
            }
        }
        w.flush().unwrap();
    }

    /// Every handle constructor x {null out, null input handle, bad value, huge size}: the
    /// status, the message naming the argument and value, and `*out` reset to null (it held a
    /// stale non-null value before).
    #[test]
    fn constructors_refuse_bad_input_and_null_their_out() {
        let mut policy: *mut DcPolicy = std::ptr::null_mut();
        // SAFETY: `policy` is a valid out-pointer.
        assert_eq!(unsafe { dc_policy_new(100, DC_CHECK_BEFORE, 0, 1, &mut policy) }, DC_OK);
        type Call = Box<dyn Fn(*mut *mut u8) -> DcStatus>;
        let p = policy as *const DcPolicy;
        // SAFETY (every closure): the out-pointer is null or a valid `*mut *mut u8` cast to the
        // handle type (same size and alignment); `p` is live until freed below.
        let cases: Vec<(&str, Call, DcStatus, &str)> = vec![
            (
                "policy_new null out",
                Box::new(|_| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_policy_new(1, 0, 0, 1, std::ptr::null_mut()) }
                }),
                DC_INVALID_ARGUMENT,
                "out: null pointer",
            ),
            (
                "policy_new check_mode",
                Box::new(|o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_policy_new(1, 7, 0, 1, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "check_mode 7: must be DC_CHECK_BEFORE (0) or DC_CHECK_PREDICTIVE (1)",
            ),
            (
                "estimator_new null out",
                Box::new(|_| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_estimator_new(4, 0.9, std::ptr::null_mut()) }
                }),
                DC_INVALID_ARGUMENT,
                "out: null pointer",
            ),
            (
                "estimator_new window 0",
                Box::new(|o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_estimator_new(0, 0.9, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "window 0: must be >= 1",
            ),
            (
                "estimator_new window SIZE_MAX",
                Box::new(|o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_estimator_new(usize::MAX, 0.9, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "window 18446744073709551615: exceeds DC_MAX_ESTIMATOR_WINDOW (1048576)",
            ),
            (
                "estimator_new window cap + 1",
                Box::new(|o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_estimator_new(DC_MAX_ESTIMATOR_WINDOW + 1, 0.9, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "window 1048577: exceeds DC_MAX_ESTIMATOR_WINDOW (1048576)",
            ),
            (
                "estimator_new quantile NaN",
                Box::new(|o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_estimator_new(4, f64::NAN, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "quantile NaN: must be in [0, 1]",
            ),
            (
                "walk_new null out",
                Box::new(move |_| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).
                    unsafe { dc_walk_new(p, 0, 4, 0, std::ptr::null_mut()) }
                }),
                DC_INVALID_ARGUMENT,
                "out: null pointer",
            ),
            (
                "walk_new null policy",
                Box::new(|o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).

                    unsafe { dc_walk_new(std::ptr::null(), 0, 4, 0, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "policy: null pointer",
            ),
            (
                "walk_new micro_batches UINT32_MAX",
                Box::new(move |o| {
                    // SAFETY: the out-pointer is null or a valid handle slot; `p` is live (see above).
                    unsafe { dc_walk_new(p, 0, u32::MAX, 0, o.cast()) }
                }),
                DC_INVALID_ARGUMENT,
                "micro_batches 4294967295: exceeds DC_MAX_MICRO_BATCHES (1048576)",
            ),
        ];
        for (name, call, status, msg) in cases {
            let mut out: *mut u8 = stale();
            assert_eq!(call(&mut out), status, "{name}");
            assert_eq!(last(), msg, "{name}");
            // A null-out case passes no out; every other one must reset the stale value.
            assert!(name.ends_with("null out") || out.is_null(), "{name}: *out not reset");
        }
        // At the caps the constructors succeed.
        let mut e: *mut DcEstimator = stale();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { dc_estimator_new(DC_MAX_ESTIMATOR_WINDOW, 0.9, &mut e) }, DC_OK);
        let mut w: *mut DcWalk = stale();
        // SAFETY: valid out-pointer; `p` live.
        assert_eq!(unsafe { dc_walk_new(p, 0, DC_MAX_MICRO_BATCHES, 0, &mut w) }, DC_OK);
        assert!(!e.is_null() && !w.is_null());
        // SAFETY: handles from the constructors above, freed once.
        unsafe {
            dc_estimator_free(e);
            dc_walk_free(w);
            dc_policy_free(policy);
        }
    }

    /// The calls on a handle x {null handle, null out, misaligned pointer, out-of-order
    /// launch}: the status, the message and the outs' neutral values.
    #[test]
    fn calls_on_handles_refuse_null_and_misaligned_pointers_and_reset_their_outs() {
        let mut policy: *mut DcPolicy = std::ptr::null_mut();
        let mut walk: *mut DcWalk = std::ptr::null_mut();
        // SAFETY: valid out-pointers; the handles are freed at the end.
        unsafe {
            assert_eq!(dc_policy_new(100, DC_CHECK_BEFORE, 0, 1, &mut policy), DC_OK);
            assert_eq!(dc_walk_new(policy, 0, 4, 0, &mut walk), DC_OK);
        }
        let mut start = true;
        // SAFETY: null policy; `start` writable.
        assert_eq!(unsafe { dc_policy_should_start(std::ptr::null(), 0, 0, 0, 0, &mut start) }, DC_INVALID_ARGUMENT);
        assert_eq!((last().as_str(), start), ("policy: null pointer", false));
        // SAFETY: live policy, null out.
        assert_eq!(unsafe { dc_policy_should_start(policy, 0, 0, 0, 0, std::ptr::null_mut()) }, DC_INVALID_ARGUMENT);
        assert_eq!(last(), "out: null pointer");

        let (mut kind, mut value) = (DC_WALK_LAUNCH, 99u64);
        // SAFETY: null walk; kind and value writable.
        let s = unsafe { dc_walk_next(std::ptr::null_mut(), std::ptr::null_mut(), &mut kind, &mut value) };
        assert_eq!(s, DC_INVALID_ARGUMENT);
        assert_eq!((last().as_str(), kind, value), ("walk: null pointer", DC_WALK_DONE, 0));
        let mut value = 99u64;
        // SAFETY: live walk, null kind, value writable.
        let s = unsafe { dc_walk_next(walk, std::ptr::null_mut(), std::ptr::null_mut(), &mut value) };
        assert_eq!(s, DC_INVALID_ARGUMENT);
        assert_eq!((last().as_str(), value), ("kind: null pointer", 0));
        // Real memory, one byte past an 8-byte boundary: misaligned for every handle type.
        let mut words = [0u64; 8];
        let misaligned = words.as_mut_ptr().cast::<u8>().wrapping_add(1).cast::<DcEstimator>();
        let (mut kind, mut value) = (DC_WALK_LAUNCH, 99u64);
        // SAFETY: the misaligned estimator is refused before any dereference.
        assert_eq!(unsafe { dc_walk_next(walk, misaligned, &mut kind, &mut value) }, DC_INVALID_ARGUMENT);
        assert!(last().starts_with("estimator 0x") && last().contains(": not aligned to 8 bytes"), "{}", last());
        assert_eq!((kind, value), (DC_WALK_DONE, 0));
        // SAFETY: as above.
        assert_eq!(unsafe { dc_walk_ended(walk, misaligned, 0, 1, 1) }, DC_INVALID_ARGUMENT);
        // SAFETY: null walk.
        assert_eq!(unsafe { dc_walk_ended(std::ptr::null_mut(), std::ptr::null_mut(), 0, 1, 1) }, DC_INVALID_ARGUMENT);
        assert_eq!(last(), "walk: null pointer");
        // SAFETY: live walk; nothing launched yet.
        assert_eq!(unsafe { dc_walk_ended(walk, std::ptr::null_mut(), u64::MAX, 1, 1) }, DC_INVALID_ARGUMENT);
        assert_eq!(last(), "launch 18446744073709551615: the next launch to report is 0 (of 0 started)");
        // SAFETY: null walk.
        assert_eq!(unsafe { dc_walk_clock_at(std::ptr::null_mut(), 5) }, DC_INVALID_ARGUMENT);
        assert_eq!(last(), "walk: null pointer");
        // SAFETY: null and misaligned walks are refused without a dereference.
        assert_eq!(unsafe { dc_walk_reported(std::ptr::null()) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { dc_walk_reported(misaligned.cast::<DcWalk>()) }, 0);
        // SAFETY: handles from above, freed once; null frees are no-ops.
        unsafe {
            dc_walk_free(walk);
            dc_policy_free(policy);
            dc_walk_free(std::ptr::null_mut());
            dc_policy_free(std::ptr::null_mut());
            dc_estimator_free(std::ptr::null_mut());
        }
    }

    /// dc_divisor x {null out, null/misaligned counts, zero length, SIZE_MAX and cap + 1
    /// lengths, nominal with M or b 0, zero counts, unknown normalization}: the status, the
    /// message and `*out` 0 (it held 7 before).
    #[test]
    fn divisor_validates_sizes_before_reading_and_zeroes_out() {
        let counts = [3u64, 4];
        let c = counts.as_ptr();
        let bad = (c as usize + 1) as *const u64;
        // SAFETY (every call): `counts` is readable for 2 values; any other length is refused
        // before the pointer is read; `out` is writable.
        let call = |p: *const u64, n: usize, norm: u32, m: u32, b: u32| {
            let mut out = 7.0;
            // SAFETY: as said above the closure.
            let s = unsafe { dc_divisor(p, n, norm, m, b, &mut out) };
            (s, out, last())
        };
        let r = DC_NORMALIZATION_REALIZED;
        let nom = DC_NORMALIZATION_NOMINAL;
        let cases: Vec<((DcStatus, f64, String), DcStatus, &str)> = vec![
            (call(c, 2, r, 4, 3), DC_OK, ""),
            (call(c, 2, nom, 4, 3), DC_OK, ""),
            (call(std::ptr::null(), 2, r, 4, 3), DC_INVALID_ARGUMENT, "counts: null pointer"),
            (
                call(std::ptr::null(), 0, r, 4, 3),
                DC_SKIP_STEP,
                "global computed count is zero: every rank skips the step",
            ),
            (call(c, 0, r, 4, 3), DC_SKIP_STEP, "global computed count is zero: every rank skips the step"),
            (
                call(c, usize::MAX, r, 4, 3),
                DC_INVALID_ARGUMENT,
                "world_size 18446744073709551615: exceeds DC_MAX_WORLD_SIZE (1048576)",
            ),
            (
                call(c, DC_MAX_WORLD_SIZE + 1, r, 4, 3),
                DC_INVALID_ARGUMENT,
                "world_size 1048577: exceeds DC_MAX_WORLD_SIZE (1048576)",
            ),
            (
                call(std::ptr::null(), usize::MAX, r, 4, 3),
                DC_INVALID_ARGUMENT,
                "world_size 18446744073709551615: exceeds DC_MAX_WORLD_SIZE (1048576)",
            ),
            (
                call(c, 2, nom, 0, 3),
                DC_INVALID_ARGUMENT,
                "micro_batches 0: must be >= 1 under the nominal normalization (N·M·b)",
            ),
            (
                call(c, 2, nom, 4, 0),
                DC_INVALID_ARGUMENT,
                "micro_batch_size 0: must be >= 1 under the nominal normalization (N·M·b)",
            ),
            (call(c, 2, 9, 4, 3), DC_INVALID_ARGUMENT, "normalization 9: must be 0 (realized) or 1 (nominal)"),
        ];
        for (i, ((status, out, msg), want, want_msg)) in cases.into_iter().enumerate() {
            assert_eq!((status, msg.as_str()), (want, want_msg), "case {i}");
            if status == DC_OK {
                assert!(out == 7.0 || out == 24.0, "case {i}: {out}");
            } else {
                assert_eq!(out, 0.0, "case {i}: *out not zeroed");
            }
        }
        assert_eq!(call(c, 2, r, 4, 3).1, 7.0);
        assert_eq!(call(c, 2, nom, 4, 3).1, 24.0);
        let (s, out, msg) = call(bad, 2, r, 4, 3);
        assert_eq!((s, out), (DC_INVALID_ARGUMENT, 0.0));
        assert!(msg.starts_with("counts 0x") && msg.contains("not aligned to 8 bytes"), "{msg}");
        // SAFETY: null out is refused.
        assert_eq!(unsafe { dc_divisor(c, 2, r, 4, 3, std::ptr::null_mut()) }, DC_INVALID_ARGUMENT);
        assert_eq!(last(), "out: null pointer");
    }

    /// dc_recommend_file x {null path, null out, missing file, directory, empty file,
    /// non-UTF-8 path, NaN guardrail, min_micro_batches above M (4) and UINT32_MAX, too few
    /// steps}: the status, the message, and `*out` all zero (it held a stale enabled
    /// recommendation before).
    #[test]
    fn recommend_file_maps_files_to_io_validates_as_tune_and_zeroes_out() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("compute_log.csv");
        write_log(&good, 2, 4, 12);
        let short = dir.path().join("short.csv");
        write_log(&short, 2, 4, 3);
        let empty = dir.path().join("empty.csv");
        std::fs::write(&empty, b"").unwrap();
        let missing = dir.path().join("missing.csv");
        let cstr = |p: &Path| CString::new(p.to_str().unwrap()).unwrap();
        let (good_c, short_c, empty_c, missing_c, dir_c) =
            (cstr(&good), cstr(&short), cstr(&empty), cstr(&missing), cstr(dir.path()));
        let non_utf8 = CString::new(vec![b'/', 0xff, b'x']).unwrap();
        let nan = DcGuardrails { min_gain: f64::NAN, ..dc_guardrails_default() };
        let stale_rec = || {
            let mut r = DcRecommendation::ZERO;
            r.enabled = true;
            r.threshold_ns = 7.0;
            r.refusal = 9;
            r.reason[0] = b'x' as c_char;
            r
        };
        // SAFETY (every call): the paths are NUL-terminated or null, `g` null or readable,
        // `out` null or writable.
        let call = |path: *const c_char, g: *const DcGuardrails, kmin: u32, null_out: bool| {
            let mut out = stale_rec();
            let o: *mut DcRecommendation = if null_out { std::ptr::null_mut() } else { &mut out };
            // SAFETY: as said above the closure.
            let s = unsafe { dc_recommend_file(path, u32::MAX, g, kmin, o) };
            (s, out, last())
        };
        let (np, null): (*const c_char, *const DcGuardrails) = (std::ptr::null(), std::ptr::null());
        let cases = [
            ("null path", call(np, null, 1, false), DC_INVALID_ARGUMENT, "path: null pointer".to_string()),
            ("null out", call(good_c.as_ptr(), null, 1, true), DC_INVALID_ARGUMENT, "out: null pointer".into()),
            (
                "missing",
                call(missing_c.as_ptr(), null, 1, false),
                DC_IO,
                format!("trace file {}: cannot open: No such file or directory (os error 2)", missing.display()),
            ),
            (
                "directory",
                call(dir_c.as_ptr(), null, 1, false),
                DC_IO,
                format!("trace file {}: is a directory, not a file", dir.path().display()),
            ),
            (
                "empty",
                call(empty_c.as_ptr(), null, 1, false),
                DC_TRACE,
                format!("{}: unrecognised header [] (expected a compute log or a what-if trace)", empty.display()),
            ),
            (
                "non-UTF-8",
                call(non_utf8.as_ptr(), null, 1, false),
                DC_INVALID_ARGUMENT,
                "path (byte 1 not UTF-8): must be UTF-8".into(),
            ),
            (
                "NaN guardrail",
                call(good_c.as_ptr(), &nan, 1, false),
                DC_INVALID_ARGUMENT,
                "guardrails.min_gain NaN: must be a fraction in [0, 1]".into(),
            ),
            (
                "min_micro_batches 5 > M 4",
                call(good_c.as_ptr(), null, 5, false),
                DC_INVALID_ARGUMENT,
                format!("min_micro_batches 5: must be <= the micro-batches of {} (4)", good.display()),
            ),
            (
                "min_micro_batches UINT32_MAX",
                call(good_c.as_ptr(), null, u32::MAX, false),
                DC_INVALID_ARGUMENT,
                format!("min_micro_batches 4294967295: must be <= the micro-batches of {} (4)", good.display()),
            ),
            (
                "3 steps",
                call(short_c.as_ptr(), null, 1, false),
                DC_INSUFFICIENT_DATA,
                format!(
                    "{}: insufficient data: 3 complete step(s) x 2 rank(s); a verdict needs at least 10 steps and 2 ranks",
                    short.display()
                ),
            ),
        ];
        for (name, (status, out, msg), want, want_msg) in cases {
            assert_eq!((status, msg.as_str()), (want, want_msg.as_str()), "{name}");
            if name != "null out" {
                assert!(!out.enabled && out.threshold_ns == 0.0 && out.refusal == DC_REFUSAL_NONE, "{name}: {out:?}");
                assert!(out.reason.iter().all(|&b| b == 0), "{name}: reason not cleared");
            }
        }
        // M itself is accepted: the CLI's bound is inclusive.
        let (s, out, _) = call(good_c.as_ptr(), null, 4, false);
        assert_eq!(s, DC_OK);
        assert_eq!(out.refusal, DC_REFUSAL_INSUFFICIENT_GAIN, "4 of 4 always computed: nothing to drop: {out:?}");
    }
}
