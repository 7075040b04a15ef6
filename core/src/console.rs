//! The one writer of the process's standard output and standard error: nothing in the product
//! writes to either through `print!`/`eprintln!` (which panic when the stream fails).
//!
//! - Standard output ([`out`], [`Stdout`]): a failed write is an error carrying a
//!   [`StreamError`] that names the stream. A closed reader (`EPIPE`, e.g. `| head -1`) is
//!   [`StreamError::is_closed`]: the binary then exits 0 quietly, as ripgrep and fd do; any
//!   other failure (`ENOSPC` of `>/dev/full`) is exit 6 naming `stdout`.
//! - Standard error ([`err`], [`Stderr`]): diagnostics, best effort. A failing stderr (closed,
//!   full) loses the message and never panics or changes the exit code: there is nowhere left
//!   to report it.
//!
//! Owns: how the two streams are written and what a failure of each means. Must not touch: what
//! is printed, exit codes (the binary's `cli::exit` reads [`StreamError`]).
#![forbid(unsafe_code)]

use std::io::{self, Write};

/// One of the process's standard streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        })
    }
}

/// A write to a standard stream failed.
#[derive(Debug, thiserror::Error)]
#[error("writing {stream}: {source}")]
pub struct StreamError {
    /// The stream.
    pub stream: Stream,
    /// The OS error (`EPIPE`, `ENOSPC`, ...).
    #[source]
    pub source: io::Error,
}

impl StreamError {
    /// Whether the reader went away (`EPIPE`): not a failure of the command, which stops
    /// printing and exits 0 quietly.
    pub fn is_closed(&self) -> bool {
        self.source.kind() == io::ErrorKind::BrokenPipe
    }

    /// The stream error an [`io::Error`] of [`Stdout`] carries, or the I/O error itself.
    ///
    /// # Errors
    /// The original error when it carries no [`StreamError`].
    pub fn from_io(e: io::Error) -> Result<Self, io::Error> {
        crate::input::carried(e)
    }

    /// The stream error an error chain carries, directly or inside an [`io::Error`] (the
    /// [`Stdout`] writer's errors reach callers as `io::Error`s).
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(s) = err.downcast_ref::<Self>() {
                return Some(s);
            }
            if let Some(s) =
                err.downcast_ref::<io::Error>().and_then(|io| io.get_ref()).and_then(|i| i.downcast_ref::<Self>())
            {
                return Some(s);
            }
            cur = err.source();
        }
        None
    }
}

/// Standard output as a [`Write`]r whose errors carry a [`StreamError`] (so a caller that
/// keeps the `io::Error` still tells `stdout` from a file). Each `write` writes all of `buf`
/// and flushes, so a failure surfaces at the write that met it, never in an exit hook.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut o = io::stdout().lock();
        o.write_all(buf).and_then(|()| o.flush()).map(|()| buf.len()).map_err(wrap(Stream::Stdout))
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().lock().flush().map_err(wrap(Stream::Stdout))
    }
}

fn wrap(stream: Stream) -> impl Fn(io::Error) -> io::Error {
    move |source| {
        // Already ours (a nested writer): keep it.
        if source.get_ref().is_some_and(|i| i.is::<StreamError>()) {
            return source;
        }
        io::Error::new(source.kind(), StreamError { stream, source })
    }
}

/// Writes `text` to standard output and flushes it.
///
/// # Errors
/// [`StreamError`] naming `stdout`.
pub fn out(text: &str) -> Result<(), StreamError> {
    let mut o = io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(|source| StreamError { stream: Stream::Stdout, source })
}

/// Writes `text` and a newline to standard error, best effort (see the module doc).
pub fn err(text: &str) {
    let mut e = io::stderr().lock();
    let _ = e.write_all(text.as_bytes()).and_then(|()| e.write_all(b"\n")).and_then(|()| e.flush());
}

/// Standard error as a [`Write`]r for a logger (`tracing_subscriber`'s writer): errors are
/// returned to the logger, which drops the line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().lock().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().lock().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_error_is_found_through_io_errors_and_epipe_is_closed() {
        let e = wrap(Stream::Stdout)(io::Error::from(io::ErrorKind::BrokenPipe));
        let found = StreamError::find(&e).expect("carried");
        assert!(found.is_closed());
        assert_eq!(found.stream, Stream::Stdout);
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        let full = wrap(Stream::Stdout)(io::Error::from_raw_os_error(28));
        let found = StreamError::find(&full).expect("carried");
        assert!(!found.is_closed());
        assert!(full.to_string().starts_with("writing stdout: "), "{full}");
        let plain = io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(StreamError::find(&plain).is_none(), "a file's EPIPE is not stdout's");
    }
}
