//! The thread-local last error of each C API: what `synGetLastError` /
//! `synGetLastErrorMessage` and `hcclGetLastErrorMessage` report.
//!
//! The vendor keeps two slots (SynapseAI 1.21: `synGetLastError*` is per host thread in
//! libSynapse; `hcclGetLastErrorMessage` is HCL's own `thread_local`, NULL until an HCCL call
//! failed), so the mock keeps two per thread too (a failing `hccl*` call leaves
//! `synGetLastErrorMessage` alone and vice versa), with one implementation ([`Slot`]) selected
//! by the status type ([`HasLastError`]).
//!
//! Owns: the two thread-local slots. Must not touch: anything else of the crate (a leaf: it
//! imports only `habana-sys`); deciding what to record is the FFI guard's job (`cabi.rs`).

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::thread::LocalKey;

use habana_sys::{hcclResult_t, synStatus};

/// One API's last error on one thread: the status and "<C function>: <message>", or nothing
/// before the first failure.
pub(crate) struct Slot<S: 'static>(RefCell<Option<(S, CString)>>);

impl<S: Copy + 'static> Slot<S> {
    const fn new() -> Self {
        Self(RefCell::new(None))
    }
}

thread_local! {
    static SYN: Slot<synStatus> = const { Slot::new() };
    static HCCL: Slot<hcclResult_t> = const { Slot::new() };
}

/// A status type with a last-error slot (`synStatus`: the Synapse slot, also used by the
/// `dcmock_*` control ABI; `hcclResult_t`: the HCCL slot).
pub(crate) trait HasLastError: Copy + 'static {
    /// This API's slot.
    fn slot() -> &'static LocalKey<Slot<Self>>;
}

impl HasLastError for synStatus {
    fn slot() -> &'static LocalKey<Slot<Self>> {
        &SYN
    }
}

impl HasLastError for hcclResult_t {
    fn slot() -> &'static LocalKey<Slot<Self>> {
        &HCCL
    }
}

/// Records `status` and `msg` (NUL bytes become spaces) as this thread's last error of `S`'s API.
pub(crate) fn set<S: HasLastError>(status: S, msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    S::slot().with(|s| *s.0.borrow_mut() = Some((status, c)));
}

/// This thread's last error status of `S`'s API (None before the first failure).
pub(crate) fn status<S: HasLastError>() -> Option<S> {
    S::slot().with(|s| s.0.borrow().as_ref().map(|e| e.0))
}

/// Pointer to this thread's last error message of `S`'s API (None before the first failure).
/// Valid until the next failing call of that API on this thread (the string is replaced, not
/// mutated in place) or the end of the thread.
pub(crate) fn message_ptr<S: HasLastError>() -> Option<*const c_char> {
    S::slot().with(|s| s.0.borrow().as_ref().map(|e| e.1.as_ptr()))
}
