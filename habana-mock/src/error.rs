//! The error type of every mock operation, for both APIs: a status code and a message.
//!
//! Owns: [`MockError`] (generic over the status newtype: `synStatus` for `syn*` calls and the
//! `dcmock_*` control ABI, `hcclResult_t` for `hccl*` calls), [`MResult`], [`HErr`] and
//! [`fail`]. Must not touch: anything else of the crate (a leaf: it imports only `habana-sys`);
//! recording the error as the thread's last error is the FFI guard's job (`cabi.rs`).

use habana_sys::{hcclResult_t, synStatus};

/// A failed mock call or operation: the status to return and the message for the API's
/// last-error query (`synGetLastErrorMessage` or `hcclGetLastErrorMessage`).
#[derive(Debug, Clone)]
pub(crate) struct MockError<S = synStatus> {
    /// The status code returned to the C caller.
    pub status: S,
    /// Why, without the C function name (the guard prefixes it).
    pub msg: String,
}

impl<S> MockError<S> {
    /// An error with `status` and `msg`.
    pub(crate) fn new(status: S, msg: impl Into<String>) -> Self {
        Self { status, msg: msg.into() }
    }
}

/// The result of a mock operation (`synStatus` errors unless `S` says otherwise).
pub(crate) type MResult<T, S = synStatus> = Result<T, MockError<S>>;

/// The error of an HCCL call or collective.
pub(crate) type HErr = MockError<hcclResult_t>;

/// Shorthand for an `Err(MockError)`.
pub(crate) fn fail<T, S>(status: S, msg: impl Into<String>) -> MResult<T, S> {
    Err(MockError::new(status, msg))
}
