//! Errors of the HCCL layer.
//!
//! Owns: [`HcclError`]. Raw codes stay `habana_sys::hcclResult_t` newtypes.

use std::time::Duration;

use habana_sys::hcclResult_t;

/// Errors of collectives and communicators.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HcclError {
    /// An HCCL call returned a non-success code.
    #[error("{call} failed: {code} ({description}){}", message.as_ref().map(|m| format!(": {m}")).unwrap_or_default())]
    Hccl {
        /// The C function, e.g. `hcclAllReduce`.
        call: &'static str,
        /// The raw result code.
        code: hcclResult_t,
        /// `hcclGetErrorString` of the code.
        description: String,
        /// `hcclGetLastErrorMessage` (1.21+), when the library gives one.
        message: Option<String>,
    },
    /// A collective did not complete within the watchdog's timeout.
    #[error("collective {op} #{seq} did not complete within {after:?} (communicator aborted)")]
    Timeout {
        /// The operation, e.g. "all_reduce".
        op: &'static str,
        /// Its sequence number on the communicator (1-based).
        seq: u64,
        /// The timeout that expired.
        after: Duration,
    },
    /// The library reported an asynchronous error (`hcclCommGetAsyncError`): a peer died, a link
    /// failed, or ranks disagreed about a collective.
    #[error("asynchronous communicator error {code}{}: {reason} (communicator aborted)", rank.map(|r| format!(" from rank {r}")).unwrap_or_default())]
    Peer {
        /// The peer rank named by the library's message, when it names one.
        rank: Option<u32>,
        /// The raw asynchronous error code.
        code: hcclResult_t,
        /// The library's message (`hcclCommGetAsyncErrorMessage`), or the code's description.
        reason: String,
    },
    /// A device-side failure of the Synapse layer (stream synchronization, event record).
    #[error(transparent)]
    Synapse(std::sync::Arc<crate::synapse::Error>),
    /// Distributing the unique id failed (rendezvous timeout, refused secret, unreachable rank 0).
    #[error(transparent)]
    Bootstrap(std::sync::Arc<super::rendezvous::RendezvousError>),
    /// An argument rejected before any C call (buffer lengths, ranks, roots, id bytes).
    #[error("invalid argument {what}: {value}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
        /// The offending value, rendered.
        value: String,
    },
}

/// Result of the HCCL layer.
pub type Result<T, E = HcclError> = std::result::Result<T, E>;

impl From<crate::synapse::Error> for HcclError {
    fn from(e: crate::synapse::Error) -> Self {
        HcclError::Synapse(std::sync::Arc::new(e))
    }
}
