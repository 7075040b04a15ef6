//! The C-boundary kit shared by every `extern "C"` function of the mock (`syn*` in `ffi/`,
//! `hccl*` in `hccl/mod.rs`, `dcmock_*` in `control.rs`): the FFI guard, the status trait it is
//! generic over, pointer-argument helpers and the handle encoding.
//!
//! Owns: [`guard`] / [`guard_unfaultable`] / [`catch_or`] (fault injection, `catch_unwind`, last-error
//! recording: no panic ever unwinds across the C ABI), [`CStatus`], [`out`], [`c_str`],
//! [`slice`], [`read`], [`handle_to_raw`] / [`raw_to_handle`]. Must not touch: the registry or any mock
//! object; it imports only the leaves `error.rs`, `faults.rs` and `last_error.rs`.

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use habana_sys::{hcclResult_t, synStatus};

use crate::error::{MResult, MockError};
use crate::faults;
use crate::last_error::{self, HasLastError};

/// A C status newtype the guard can return: `synStatus` or `hcclResult_t`.
pub(crate) trait CStatus: HasLastError {
    /// Success.
    const SUCCESS: Self;
    /// Returned when the body panicked (synFail, hcclInternalError).
    const PANIC: Self;
    /// Returned for a null or malformed pointer argument.
    const INVALID_ARGUMENT: Self;
    /// The status of an armed `FailNextCall` fault (its raw code read as this type).
    fn from_fault(raw: i32) -> Self;
}

impl CStatus for synStatus {
    const SUCCESS: Self = synStatus::SUCCESS;
    const PANIC: Self = synStatus::FAIL;
    const INVALID_ARGUMENT: Self = synStatus::INVALID_ARGUMENT;
    fn from_fault(raw: i32) -> Self {
        synStatus(raw)
    }
}

impl CStatus for hcclResult_t {
    const SUCCESS: Self = hcclResult_t::SUCCESS;
    const PANIC: Self = hcclResult_t::INTERNAL_ERROR;
    const INVALID_ARGUMENT: Self = hcclResult_t::INVALID_ARGUMENT;
    fn from_fault(raw: i32) -> Self {
        hcclResult_t(raw)
    }
}

/// Runs `f` as the body of C function `name`: an armed `FailNextCall` fault for `name` first
/// (its status returned, "<name>: injected fault" recorded), then [`guard_unfaultable`].
pub(crate) fn guard<S: CStatus>(name: &'static str, f: impl FnOnce() -> MResult<(), S>) -> S {
    if let Some(raw) = faults::take(name) {
        let s = S::from_fault(raw);
        last_error::set(s, &format!("{name}: injected fault"));
        return s;
    }
    guard_unfaultable(name, f)
}

/// Runs `f` as the body of C function `name` with panics caught (`S::PANIC`) and failures
/// recorded as this thread's last error of `S`'s API ("<name>: <message>"); success leaves the
/// last error alone. No fault injection: used directly by the mock-only control ABI, which
/// faults must not reach.
pub(crate) fn guard_unfaultable<S: CStatus>(name: &str, f: impl FnOnce() -> MResult<(), S>) -> S {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => S::SUCCESS,
        Ok(Err(e)) => {
            last_error::set(e.status, &format!("{name}: {}", e.msg));
            e.status
        }
        Err(_) => {
            last_error::set(S::PANIC, &format!("{name}: internal error (panic) in the CPU mock"));
            S::PANIC
        }
    }
}

/// Runs `f` with panics caught, returning `fallback` on a panic: for the few C functions that
/// return a value other than a status (`hcclCommGetAsyncErrorMessage`), which therefore have no
/// status to report a panic with and record no last error.
pub(crate) fn catch_or<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Writes `v` to the out-pointer `p` (null: `S::INVALID_ARGUMENT` "null output pointer").
///
/// # Safety
/// `p` is null or valid for a write of `T`.
pub(crate) unsafe fn out<S: CStatus, T>(p: *mut T, v: T) -> MResult<(), S> {
    if p.is_null() {
        return Err(MockError::new(S::INVALID_ARGUMENT, "null output pointer"));
    }
    // SAFETY: non-null; valid for writes by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads a NUL-terminated string argument (None for null; invalid UTF-8 reads as U+FFFD).
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("\u{fffd}"))
}

/// The array argument `p[..n]` (empty for `n == 0`; null with `n > 0`: synInvalidArgument).
///
/// # Safety
/// `p` is null or points at `n` readable `T`s that outlive `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize) -> MResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(MockError::new(synStatus::INVALID_ARGUMENT, "null array with a nonzero length"));
    }
    // SAFETY: non-null, `n` elements readable by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A copy of the struct an input pointer argument points at; synInvalidArgument "null {what}"
/// for a null pointer.
///
/// # Safety
/// `p` is null or valid for a read of one `T`.
pub(crate) unsafe fn read<T: Copy>(p: *const T, what: &str) -> MResult<T> {
    if p.is_null() {
        return Err(MockError::new(synStatus::INVALID_ARGUMENT, format!("null {what}")));
    }
    // SAFETY: non-null and readable by the caller's contract.
    Ok(unsafe { *p })
}

/// Fake pointer value of handle id `id` (ids are spaced by 64 so a handle looks like an aligned
/// pointer). The mock never dereferences it.
pub(crate) fn handle_to_raw(id: u64) -> usize {
    (id as usize) << 6
}

/// The handle id of a fake pointer, or 0 (never a valid id) for anything not produced by
/// [`handle_to_raw`].
pub(crate) fn raw_to_handle(raw: usize) -> u64 {
    if raw & 63 != 0 { 0 } else { (raw >> 6) as u64 }
}

/// The handle id of a handle argument (`synStreamHandle`, `hcclComm_t`, ...).
pub(crate) fn h<T>(p: *mut T) -> u64 {
    raw_to_handle(p as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{HErr, fail};

    fn message<S: CStatus>() -> String {
        let p = last_error::message_ptr::<S>().expect("a last error");
        // SAFETY: the slot's pointer is a NUL-terminated string valid until the next failure on
        // this thread; copied at once.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn guard_reports_failures_and_panics_in_each_apis_own_slot() {
        std::thread::spawn(|| {
            assert_eq!(last_error::status::<synStatus>(), None);
            assert_eq!(guard("cabiTestOk", || Ok::<(), MockError>(())), synStatus::SUCCESS);
            assert_eq!(last_error::status::<synStatus>(), None, "success records nothing");
            let s = guard("cabiTestSyn", || fail(synStatus::BUSY, "why"));
            assert_eq!(s, synStatus::BUSY);
            assert_eq!(message::<synStatus>(), "cabiTestSyn: why");
            let s = guard("cabiTestHccl", || Err::<(), HErr>(HErr::new(hcclResult_t::SOCKET_ERROR, "gone")));
            assert_eq!(s, hcclResult_t::SOCKET_ERROR);
            assert_eq!(message::<hcclResult_t>(), "cabiTestHccl: gone");
            assert_eq!(message::<synStatus>(), "cabiTestSyn: why", "the Synapse slot is untouched");
            let s: hcclResult_t = guard_unfaultable("cabiTestPanic", || panic!("boom"));
            assert_eq!(s, hcclResult_t::INTERNAL_ERROR);
            assert_eq!(message::<hcclResult_t>(), "cabiTestPanic: internal error (panic) in the CPU mock");
            let s: synStatus = guard("cabiTestPanic", || panic!("boom"));
            assert_eq!(s, synStatus::FAIL);
            assert_eq!(last_error::status::<synStatus>(), Some(synStatus::FAIL));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn faults_reach_guard_but_not_guard_unfaultable() {
        faults::arm_fail_next("cabiTestFaulted".into(), hcclResult_t::BUSY.0, 2);
        let ran = std::cell::Cell::new(0);
        let body = || -> MResult<(), hcclResult_t> {
            ran.set(ran.get() + 1);
            Ok(())
        };
        assert_eq!(guard_unfaultable("cabiTestFaulted", body), hcclResult_t::SUCCESS);
        assert_eq!(guard("cabiTestFaulted", body), hcclResult_t::BUSY);
        assert_eq!(message::<hcclResult_t>(), "cabiTestFaulted: injected fault");
        let body = || -> MResult<()> {
            ran.set(ran.get() + 1);
            Ok(())
        };
        assert_eq!(guard("cabiTestFaulted", body), synStatus(hcclResult_t::BUSY.0));
        assert_eq!(guard("cabiTestFaulted", body), synStatus::SUCCESS);
        assert_eq!(ran.get(), 2, "a faulted call does not run its body");
    }

    #[test]
    fn handles_round_trip_and_forged_ones_are_zero() {
        assert_eq!(raw_to_handle(handle_to_raw(42)), 42);
        assert_eq!(raw_to_handle(handle_to_raw(42) + 1), 0);
        assert_eq!(catch_or(7, || panic!("boom")), 7);
    }
}
