//! The safe layer's error type.
//!
//! Owns: [`Error`], the one `#[non_exhaustive]` enum every `synapse` call returns, and
//! [`DropResult`] for explicit, fallible destruction (the `cust` pattern). Raw status codes stay
//! `habana_sys::synStatus` newtypes so an unknown code from C is carried, not lost.

use habana_sys::{LoadError, synStatus};

/// Errors of the safe Synapse layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Synapse call returned a non-success status.
    #[error("{call} failed: {status} ({description}){}", message.as_ref().map(|m| format!(": {m}")).unwrap_or_default())]
    Synapse {
        /// The C function, e.g. `synDeviceMalloc`.
        call: &'static str,
        /// The raw status code.
        status: synStatus,
        /// The library's brief description (`synStatusGetBriefDescription`).
        description: String,
        /// The library's last error message (`synGetLastErrorMessage`, 1.21+), if any.
        message: Option<String>,
    },
    /// The runtime library could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A length or size given to the safe layer does not match (checked before any C call).
    #[error("{what}: expected {expected}, got {got}")]
    SizeMismatch {
        /// What was compared, e.g. "copy_h2d element count".
        what: &'static str,
        /// The size required.
        expected: usize,
        /// The size given.
        got: usize,
    },
    /// An argument cannot be passed to C (e.g. a name containing NUL, a size over u32).
    #[error("invalid argument {what}: {value}")]
    InvalidArgument {
        /// The argument, e.g. "tensor name".
        what: &'static str,
        /// The offending value, rendered.
        value: String,
    },
    /// The environment selects a device that cannot be used (`HLS_MODULE_ID`,
    /// `HABANA_VISIBLE_MODULES`).
    #[error("environment variable {variable}={value:?}: {reason}")]
    Config {
        /// The variable name.
        variable: &'static str,
        /// Its value.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// An object cannot be destroyed because other handles still use it.
    #[error("{what} is still in use by {count} other handle(s)")]
    InUse {
        /// The object, e.g. "device 0 (module 3)".
        what: String,
        /// Number of other live handles.
        count: usize,
    },
    /// A graph operand does not fit its node (checked before the C call).
    #[error(transparent)]
    Graph(Box<OperandMismatch>),
    /// A recipe has no id for a tensor name (the runtime returned the all-ones invalid id).
    #[error("recipe {recipe} has no tensor named {tensor:?}")]
    UnknownTensor {
        /// The recipe.
        recipe: String,
        /// The tensor name.
        tensor: String,
    },
    /// A bounded wait ran out (e.g. a stream that did not drain while being destroyed).
    #[error("{what} did not complete within {after:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long was waited.
        after: std::time::Duration,
    },
}

impl Error {
    /// The raw status when this is a [`Error::Synapse`].
    pub fn status(&self) -> Option<synStatus> {
        match self {
            Error::Synapse { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A graph operand that does not fit its node: which node, which tensor, what the operation
/// requires and what was given (shapes are row-major).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: tensor {tensor}: expected {expected}, got {got}")]
pub struct OperandMismatch {
    /// The node name.
    pub node: String,
    /// The tensor name ("inputs"/"outputs" for an operand count).
    pub tensor: String,
    /// What the operation requires.
    pub expected: String,
    /// What was given.
    pub got: String,
}

/// Result of the safe layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Result of an explicit destruction: on failure the object is handed back so the caller can
/// retry or leak it deliberately (from `cust`).
pub type DropResult<T> = std::result::Result<(), (Error, T)>;
