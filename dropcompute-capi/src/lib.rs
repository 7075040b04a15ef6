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
//! out-pointers; on a non-zero status [`dc_last_error`] returns a message naming the argument or
//! file. No panic crosses the boundary: each entry runs under `catch_unwind` and reports
//! `DC_PANIC`. Times are nanoseconds (u64 or f64 as documented).

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use dropcompute::policy::{self, CheckMode, DeadlineConfig, Threshold};
use dropcompute::schedule::{CountRow, Normalization, SchedulerConfig, SkipReason, Weighting};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::{LatencyTrace, LoadOptions, TraceError};
use dropcompute::tune::{self, Guardrails, Recommend, Recommendation, Refusal, Verdict};

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

/// The deadline policy of one job (opaque; create with [`dc_policy_new`], free with
/// [`dc_policy_free`]). Immutable, so one handle may be shared by threads.
pub struct DcPolicy {
    cfg: DeadlineConfig,
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

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` with the panic guard: its error is recorded as the last error, a panic becomes
/// `DC_PANIC`.
fn guard(f: impl FnOnce() -> Result<(), (DcStatus, String)>) -> DcStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_error("");
            DC_OK
        }
        Ok(Err((status, msg))) => {
            set_error(&msg);
            status
        }
        Err(payload) => {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_error(&format!("panic in dropcompute: {text}"));
            DC_PANIC
        }
    }
}

fn invalid(msg: impl Into<String>) -> (DcStatus, String) {
    (DC_INVALID_ARGUMENT, msg.into())
}

/// The message of the last failed call on this thread (empty after a successful call). The
/// pointer stays valid until the next `dc_*` call on the same thread; never null.
#[unsafe(no_mangle)]
pub extern "C" fn dc_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The check mode of a `DC_CHECK_*` code.
fn check_mode(code: u32) -> Result<CheckMode, (DcStatus, String)> {
    match code {
        DC_CHECK_BEFORE => Ok(CheckMode::BeforeMicroBatch),
        DC_CHECK_PREDICTIVE => Ok(CheckMode::Predictive),
        other => Err(invalid(format!("check_mode {other}: must be DC_CHECK_BEFORE (0) or DC_CHECK_PREDICTIVE (1)"))),
    }
}

/// Creates a policy: `threshold_ns` < 0 turns the deadline off, otherwise it is the compute
/// deadline per step (ns); `check_mode` is `DC_CHECK_*`; steps `0..warmup_steps` never drop;
/// the first `min_micro_batches` micro-batches of a step always start.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `out` or an unknown `check_mode`.
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
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: null pointer"));
        }
        let threshold = Threshold::from_ns(u64::try_from(threshold_ns).ok());
        let cfg = DeadlineConfig { threshold, check: check_mode(check_mode_code)?, warmup_steps, min_micro_batches };
        // SAFETY: `out` is non-null and, by the caller's contract, valid for one write.
        unsafe { *out = Box::into_raw(Box::new(DcPolicy { cfg })) };
        Ok(())
    })
}

/// Whether to start the next micro-batch (`policy::decide`): `step` is the 0-based step index,
/// `started` the micro-batches already started in this step, `elapsed_ns` the compute time
/// elapsed in this step (ns since the previous optimizer step ended), `estimate_ns` the
/// estimated latency of the next micro-batch (ns; 0 = no estimate). Writes true to `out` to
/// start.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `policy` or `out`.
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
    guard(|| {
        if policy.is_null() || out.is_null() {
            return Err(invalid(if policy.is_null() { "policy: null pointer" } else { "out: null pointer" }));
        }
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

/// A rank's latency estimator of the predictive check (`policy::LatencyEstimator`: the
/// nearest-rank quantile of a sliding window), kept across steps (opaque; [`dc_estimator_new`],
/// [`dc_estimator_free`]). Not shared between threads without a lock.
pub struct DcEstimator {
    inner: policy::LatencyEstimator,
}

/// One rank's walk through one step: the scheduler's own walker (`policy::walk::RankWalk`),
/// so a C or C++ training loop decides exactly as the Rust scheduler and the simulator
/// (opaque; [`dc_walk_new`], [`dc_walk_free`]).
pub struct DcWalk {
    inner: policy::walk::RankWalk,
}

/// [`dc_walk_next`]: report the ends of launches `dc_walk_reported()..value` with
/// [`dc_walk_ended`] (value 0: the step's compute clock; optionally [`dc_walk_clock_at`]).
pub const DC_WALK_WAIT: u32 = 0;
/// [`dc_walk_next`]: run micro-batch `value` (0-based), then call again.
pub const DC_WALK_LAUNCH: u32 = 1;
/// [`dc_walk_next`]: the step is over; value 1 when the deadline stopped it, 0 when every
/// micro-batch was started.
pub const DC_WALK_DONE: u32 = 2;

/// Creates an estimator over the last `window` (>= 1) latencies returning their `quantile`
/// (in [0, 1]; the scheduler's default: window 32, quantile 0.9).
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `out`, `window` 0 or a quantile outside [0, 1]
/// (`*out` is then set to null).
///
/// # Safety
/// `out` must be null or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_estimator_new(window: usize, quantile: f64, out: *mut *mut DcEstimator) -> DcStatus {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: null pointer"));
        }
        // SAFETY: `out` is non-null and, by the caller's contract, valid for one write.
        unsafe { *out = std::ptr::null_mut() };
        if window == 0 {
            return Err(invalid("window 0: must be >= 1"));
        }
        if !(0.0..=1.0).contains(&quantile) {
            return Err(invalid(format!("quantile {quantile}: must be in [0, 1]")));
        }
        let e = DcEstimator { inner: policy::LatencyEstimator::new(window, quantile) };
        // SAFETY: as above.
        unsafe { *out = Box::into_raw(Box::new(e)) };
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

/// Starts the walk of step `step` (0-based) for a rank handed `micro_batches` micro-batches
/// under `policy`, the check lagging `sync_lag` micro-batches behind the device.
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `policy` or `out` (`*out` null then).
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
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: null pointer"));
        }
        // SAFETY: `out` is non-null and, by the caller's contract, valid for one write.
        unsafe { *out = std::ptr::null_mut() };
        if policy.is_null() {
            return Err(invalid("policy: null pointer"));
        }
        // SAFETY: non-null and, by the caller's contract, a live handle from dc_policy_new.
        let cfg = unsafe { &*policy }.cfg;
        let inner =
            policy::walk::RankWalk::new(cfg, step, micro_batches as usize, policy::TailShape::default(), sync_lag);
        // SAFETY: as above.
        unsafe { *out = Box::into_raw(Box::new(DcWalk { inner })) };
        Ok(())
    })
}

/// The estimator behind `estimator`, or a fresh empty one (no estimate: the predictive check
/// then behaves as the before-check, as `dc_policy_should_start` with estimate 0 does).
///
/// # Safety
/// `estimator` must be null or a live handle from [`dc_estimator_new`] not used elsewhere
/// during the call.
unsafe fn with_estimator<R>(estimator: *mut DcEstimator, f: impl FnOnce(&mut policy::LatencyEstimator) -> R) -> R {
    if estimator.is_null() {
        f(&mut policy::LatencyEstimator::new(1, 1.0))
    } else {
        // SAFETY: non-null and, by the caller's contract, live and not aliased during the call.
        f(&mut unsafe { &mut *estimator }.inner)
    }
}

/// The walk's next action: writes `DC_WALK_WAIT`, `DC_WALK_LAUNCH` or `DC_WALK_DONE` to
/// `*kind` and its value to `*value` (see those constants). `estimator` may be null (no
/// predictive estimate).
///
/// Errors: `DC_INVALID_ARGUMENT` for a null `walk`, `kind` or `value`.
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
    guard(|| {
        if walk.is_null() || kind.is_null() || value.is_null() {
            return Err(invalid(if walk.is_null() { "walk: null pointer" } else { "kind/value: null pointer" }));
        }
        use policy::walk::{Next, WalkEnd};
        // SAFETY: non-null and, by the caller's contract, live and not aliased.
        let w = unsafe { &mut *walk };
        // SAFETY: the caller's contract on `estimator`.
        let (k, v) = match unsafe { with_estimator(estimator, |e| w.inner.next(e)) } {
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
/// Errors: `DC_INVALID_ARGUMENT` for a null `walk`, or a launch out of order, repeated or not
/// started (nothing recorded).
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
        if walk.is_null() {
            return Err(invalid("walk: null pointer"));
        }
        // SAFETY: non-null and, by the caller's contract, live and not aliased.
        let w = unsafe { &mut *walk };
        let expected = w.inner.reported();
        let i = usize::try_from(launch).unwrap_or(usize::MAX);
        // SAFETY: the caller's contract on `estimator`.
        if unsafe { with_estimator(estimator, |e| w.inner.ended(i, end_ns, duration_ns, e)) } {
            Ok(())
        } else {
            Err(invalid(format!(
                "launch {launch}: the next launch to report is {expected} (of {} started)",
                w.inner.launches()
            )))
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
        if walk.is_null() {
            return Err(invalid("walk: null pointer"));
        }
        // SAFETY: non-null and, by the caller's contract, live and not aliased.
        unsafe { &mut *walk }.inner.clock_at(elapsed_ns);
        Ok(())
    })
}

/// Launches reported so far (0 for a null `walk`).
///
/// # Safety
/// `walk` must be null or a live handle from [`dc_walk_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dc_walk_reported(walk: *const DcWalk) -> u64 {
    if walk.is_null() {
        return 0;
    }
    // SAFETY: non-null and, by the caller's contract, a live handle.
    unsafe { &*walk }.inner.reported() as u64
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

/// The default guardrails (max drop rate 0.10, min batch fraction 0.75, min gain 0.02).
#[unsafe(no_mangle)]
pub extern "C" fn dc_guardrails_default() -> DcGuardrails {
    let g = Guardrails::default();
    DcGuardrails { max_drop_rate: g.max_drop_rate, min_batch_fraction: g.min_batch_fraction, min_gain: g.min_gain }
}

/// Recommends a threshold from one trace file (a compute log, the reference's compute log or a
/// What-if CSV; `.gz` accepted) through `tune::recommend`: with a `DC_CHECK_*` mode the
/// verdict is the replay under that check mode (no warm-up, no sync lag: a trace file has
/// neither), as `dropcompute tune --check MODE` prints it; with `UINT32_MAX` it is the ideal
/// (the reference objective, a micro-batch counts iff it ends by the threshold; not realizable
/// on the device). `guardrails` null = defaults; `min_micro_batches` as for the policy.
///
/// Errors: `DC_INVALID_ARGUMENT` (null path/out, non-UTF-8 path, guardrail outside [0, 1],
/// unknown mode), `DC_IO` (unreadable file), `DC_TRACE` (malformed, ragged, several traces in
/// one file), `DC_INSUFFICIENT_DATA` (fewer than `DC_MIN_STEPS` steps or 2 ranks).
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
    guard(|| {
        if path.is_null() || out.is_null() {
            return Err(invalid(if path.is_null() { "path: null pointer" } else { "out: null pointer" }));
        }
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let path = unsafe { CStr::from_ptr(path) }.to_str().map_err(|_| invalid("path: not UTF-8"))?;
        let g = if guardrails.is_null() {
            dc_guardrails_default()
        } else {
            // SAFETY: non-null and readable by the caller's contract.
            unsafe { *guardrails }
        };
        for (name, v) in
            [("max_drop_rate", g.max_drop_rate), ("min_batch_fraction", g.min_batch_fraction), ("min_gain", g.min_gain)]
        {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(format!("guardrails.{name} {v}: must be a fraction in [0, 1]")));
            }
        }
        let check = if replay_check_mode == u32::MAX { None } else { Some(check_mode(replay_check_mode)?) };
        let guardrails = Guardrails {
            max_drop_rate: g.max_drop_rate,
            min_batch_fraction: g.min_batch_fraction,
            min_gain: g.min_gain,
        };
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
/// As [`dc_recommend_file`], as (status, message).
pub fn recommend_path(
    path: &std::path::Path,
    check: Option<CheckMode>,
    guardrails: Guardrails,
    min_micro_batches: u32,
) -> Result<DcRecommendation, (DcStatus, String)> {
    let t = load_trace(path, &LoadOptions::default())?;
    check_sufficient(&t)?;
    let rec = recommend_trace(&t, check, guardrails, min_micro_batches);
    Ok(to_recommendation(chosen_verdict(&rec, check)))
}

/// `tune::recommend` on `trace` as a trace file is executed (no warm-up, no sync lag) under
/// `check` (`None`: the predictive check; pick the ideal with [`chosen_verdict`]). Shared with
/// the Python extension.
pub fn recommend_trace(
    trace: &LatencyTrace,
    check: Option<CheckMode>,
    guardrails: Guardrails,
    min_micro_batches: u32,
) -> Recommendation {
    let execution = ExecutionModel {
        check: check.unwrap_or(CheckMode::Predictive),
        sync_lag: 0,
        warmup_steps: 0,
        min_micro_batches,
    };
    tune::recommend(trace, &Recommend { execution, guardrails })
}

/// The verdict `check` asks for: the replayed one under a check mode, the ideal for `None`.
pub fn chosen_verdict(rec: &Recommendation, check: Option<CheckMode>) -> &Verdict {
    if check.is_some() { &rec.verdict } else { &rec.ideal.verdict }
}

/// Loads the one trace held by `path` (shared with the Python extension).
///
/// # Errors
/// `DC_IO` (unreadable), `DC_TRACE` (malformed, or a file holding several traces).
pub fn load_trace(path: &std::path::Path, opts: &LoadOptions) -> Result<LatencyTrace, (DcStatus, String)> {
    let mut loaded = dropcompute::trace::load(&[path.to_path_buf()], opts).map_err(trace_error)?;
    if loaded.len() != 1 {
        return Err((DC_TRACE, format!("{}: {} traces in one input; pass one", path.display(), loaded.len())));
    }
    Ok(loaded.remove(0).trace)
}

/// `DC_INSUFFICIENT_DATA` unless `t` has at least `tune::MIN_STEPS` steps and 2 ranks (the
/// rule of `dropcompute tune`).
///
/// # Errors
/// `DC_INSUFFICIENT_DATA` with the trace's shape.
pub fn check_sufficient(t: &LatencyTrace) -> Result<(), (DcStatus, String)> {
    if t.num_steps() < tune::MIN_STEPS || t.world_size() < 2 {
        let e = TraceError::InsufficientData {
            source_name: t.source().to_string(),
            steps: t.num_steps(),
            ranks: t.world_size(),
            min_steps: tune::MIN_STEPS,
        };
        return Err((DC_INSUFFICIENT_DATA, e.to_string()));
    }
    Ok(())
}

/// The C view of a verdict.
pub fn to_recommendation(v: &Verdict) -> DcRecommendation {
    let mut r = DcRecommendation {
        enabled: false,
        threshold_ns: 0.0,
        predicted_drop_rate: 0.0,
        predicted_speedup: 0.0,
        refusal: DC_REFUSAL_NONE,
        reason: [0; DC_REASON_LEN],
    };
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

/// (status, message) of a trace error: `DC_IO` for unreadable files, else `DC_TRACE`.
pub fn trace_error(e: TraceError) -> (DcStatus, String) {
    let status = if matches!(e, TraceError::Io { .. } | TraceError::Input(_)) { DC_IO } else { DC_TRACE };
    (status, e.to_string())
}

/// The divisor of the summed gradient of one step (`schedule::divisor`): `counts` holds each
/// rank's computed samples (or tokens) for `world_size` ranks; `normalization` is
/// `DC_NORMALIZATION_*`; `micro_batches` (M) and `micro_batch_size` (b) are used by the nominal
/// normalization (N·M·b). Writes the divisor to `out`.
///
/// Errors: `DC_INVALID_ARGUMENT` (null pointers with `world_size` > 0, unknown normalization),
/// `DC_SKIP_STEP` when the global count is zero (every rank skips the optimizer step).
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
    guard(|| {
        if out.is_null() || (counts.is_null() && world_size > 0) {
            return Err(invalid(if out.is_null() { "out: null pointer" } else { "counts: null pointer" }));
        }
        let counts: &[u64] = if world_size == 0 {
            &[]
        } else {
            // SAFETY: non-null and readable for world_size values by the caller's contract.
            unsafe { std::slice::from_raw_parts(counts, world_size) }
        };
        let d = divisor(counts, normalization, micro_batches, micro_batch_size)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *out = d };
        Ok(())
    })
}

/// [`dc_divisor`] on a slice (shared with the Python extension).
///
/// # Errors
/// As [`dc_divisor`], as (status, message).
pub fn divisor(
    counts: &[u64],
    normalization: u32,
    micro_batches: u32,
    micro_batch_size: u32,
) -> Result<f64, (DcStatus, String)> {
    let normalization = match normalization {
        DC_NORMALIZATION_REALIZED => Normalization::Realized,
        DC_NORMALIZATION_NOMINAL => Normalization::Nominal,
        other => return Err(invalid(format!("normalization {other}: must be 0 (realized) or 1 (nominal)"))),
    };
    let rows: Vec<CountRow> = counts.iter().map(|&samples| CountRow { samples, ..Default::default() }).collect();
    let cfg = SchedulerConfig {
        normalization,
        weighting: Weighting::Samples,
        micro_batches,
        micro_batch_size,
        ..Default::default()
    };
    dropcompute::schedule::divisor(&rows, &cfg).map_err(|e| match e {
        SkipReason::ZeroCount => (DC_SKIP_STEP, "global computed count is zero: every rank skips the step".to_string()),
        SkipReason::NonFinite { ranks } => (DC_SKIP_STEP, format!("non-finite gradient on ranks {ranks:?}")),
    })
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
        assert_eq!(msg, "panic in dropcompute: boom 7");
        assert_eq!(guard(|| Ok(())), DC_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(dc_last_error()) }.to_bytes(), b"");
    }

    #[test]
    fn divisor_forwards_both_normalizations_and_the_skip() {
        assert_eq!(divisor(&[12, 0, 5], DC_NORMALIZATION_REALIZED, 4, 3), Ok(17.0));
        assert_eq!(divisor(&[12, 0, 5], DC_NORMALIZATION_NOMINAL, 4, 3), Ok(36.0));
        assert_eq!(divisor(&[0, 0], DC_NORMALIZATION_REALIZED, 4, 3).unwrap_err().0, DC_SKIP_STEP);
        let e = divisor(&[1], 9, 4, 3).unwrap_err();
        assert_eq!(e.0, DC_INVALID_ARGUMENT);
        assert!(e.1.starts_with("normalization 9"), "{}", e.1);
    }
}
