//! Library side of the `tune` and `simulate` CLI commands: clap argument structs and `run`
//! functions, so the binary only dispatches. Owns argument parsing, text/CSV/SVG output; must
//! not touch the algorithms (in `tune` and `sim`).
#![forbid(unsafe_code)]

pub mod plot;
pub mod simulate;
pub mod tune;

/// Errors of the commands.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Reading or validating a trace failed.
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
    /// A model or simulation parameter was invalid.
    #[error(transparent)]
    Sim(#[from] crate::sim::SimError),
    /// Writing output failed; `what` names the file or stream.
    #[error("writing {what}: {source}")]
    Io {
        /// Output name.
        what: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Drawing the SVG failed.
    #[error("plot: {0}")]
    Plot(String),
    /// An argument is invalid (message names it).
    #[error("argument: {0}")]
    Args(String),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CommandError {
    let what = what.into();
    move |source| CommandError::Io { what, source }
}
