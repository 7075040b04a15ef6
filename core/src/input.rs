//! The one bounded reader of every input file the product reads: training data (`train
//! --data`), parameters (`--init-params`), traces (`tune`/`simulate --trace`, `validate`'s
//! logs), checkpoints (`--resume`), the launch spec and result files of rank processes, and
//! system files (`/proc`, `/sys`). Each [`InputKind`] has a size cap (bytes, decoded for gzip)
//! and the line-based kinds a line-length cap (bytes); a file past a cap is refused with
//! [`InputError`] naming the file, the cap and the environment variable that raises it, before
//! a parser can buffer it (a 100 MB line, `/dev/zero`, a gzip bomb).
//!
//! Non-regular files: a directory is refused at once ([`InputError::Directory`]); a FIFO, a
//! character device or a socket is opened without blocking and read through `poll(2)` with a
//! 100 ms tick that checks the process's stop signal (`crate::signals::received`), so a FIFO
//! that no writer ever opens ends on SIGINT/SIGTERM/SIGHUP ([`InputError::Interrupted`], exit
//! 130) instead of hanging in `open(2)`.
//!
//! | kind | size cap (default) | line cap | variable |
//! |---|---|---|---|
//! | data | 1 GiB | 1 MiB | `DROPCOMPUTE_MAX_DATA_BYTES` |
//! | parameters | 256 MiB | none (binary) | `DROPCOMPUTE_MAX_PARAMS_BYTES` |
//! | trace | 4 GiB | 1 MiB | `DROPCOMPUTE_MAX_TRACE_BYTES` |
//! | checkpoint | 1 GiB | none (binary) | `DROPCOMPUTE_MAX_CHECKPOINT_BYTES` |
//! | launch spec | 64 MiB | none (JSON) | `DROPCOMPUTE_MAX_SPEC_BYTES` |
//! | system | 1 MiB | 1 MiB | `DROPCOMPUTE_MAX_SYSTEM_BYTES` |
//!
//! The line cap of every line-based kind is `DROPCOMPUTE_MAX_LINE_BYTES`. Values are bytes,
//! optionally with a binary suffix `K`, `M`, `G` (or `KiB`, `MiB`, `GiB`); a bad value is exit 2
//! before any command that reads the kind runs (a row each of `crate::environment`'s table).
//!
//! Owns: the caps, opening (regular or not), gzip detection of the text kinds (by the gzip
//! magic, not the name), the counting. Must not touch: what the bytes mean (each parser), exit codes.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What an input file is, which decides its caps ([`InputKind::default_cap`],
/// [`InputKind::line_capped`]) and the variable that raises them ([`InputKind::variable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// Training data, CSV or gzip CSV (`train --data`).
    Data,
    /// A safetensors parameters file (`train --init-params`).
    Params,
    /// A trace: compute log or what-if CSV (optionally gzip), or Parquet.
    Trace,
    /// A checkpoint file (`train --resume DIR`).
    Checkpoint,
    /// A rank process's JSON spec or result file, or a launch directory's owner file.
    Spec,
    /// A kernel-provided file (`/proc/meminfo`, `/sys/.../cache`).
    System,
}

impl InputKind {
    /// Every kind, in the order of the module table.
    pub const ALL: [Self; 6] = [Self::Data, Self::Params, Self::Trace, Self::Checkpoint, Self::Spec, Self::System];

    /// The kind's name in messages (`data`, `parameters`, `trace`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Params => "parameters",
            Self::Trace => "trace",
            Self::Checkpoint => "checkpoint",
            Self::Spec => "launch spec",
            Self::System => "system",
        }
    }

    /// The default size cap, in bytes (decoded bytes for a gzip file).
    pub fn default_cap(self) -> u64 {
        match self {
            Self::Data | Self::Checkpoint => 1 << 30,
            Self::Params => 256 << 20,
            Self::Trace => 4 << 30,
            Self::Spec => 64 << 20,
            Self::System => 1 << 20,
        }
    }

    /// The environment variable that sets the kind's size cap (bytes).
    pub fn variable(self) -> &'static str {
        match self {
            Self::Data => "DROPCOMPUTE_MAX_DATA_BYTES",
            Self::Params => "DROPCOMPUTE_MAX_PARAMS_BYTES",
            Self::Trace => "DROPCOMPUTE_MAX_TRACE_BYTES",
            Self::Checkpoint => "DROPCOMPUTE_MAX_CHECKPOINT_BYTES",
            Self::Spec => "DROPCOMPUTE_MAX_SPEC_BYTES",
            Self::System => "DROPCOMPUTE_MAX_SYSTEM_BYTES",
        }
    }

    /// Whether the kind is text read line by line, so [`LINE_VARIABLE`]'s cap applies.
    pub fn line_capped(self) -> bool {
        matches!(self, Self::Data | Self::Trace | Self::System)
    }

    /// Whether a gzip file of this kind is decompressed transparently (CSV kinds).
    fn gunzips(self) -> bool {
        matches!(self, Self::Data | Self::Trace)
    }
}

impl std::fmt::Display for InputKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable that sets the line cap of every line-based kind (bytes).
pub const LINE_VARIABLE: &str = "DROPCOMPUTE_MAX_LINE_BYTES";
/// The default line cap, in bytes (1 MiB: a trace row is under 200 bytes, a data row of the
/// digits about 200; only what is no such file, e.g. `/dev/zero`, reaches it).
pub const DEFAULT_LINE_CAP: u64 = 1 << 20;

/// How often a read of a FIFO or device that has no data checks the stop signal.
const STOP_TICK_MS: u16 = 100;

/// Errors of opening and reading an input; each names the file and its kind.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Opening or reading failed (absent file, permission, an I/O error).
    #[error("{kind} file {}: cannot {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Its kind.
        kind: InputKind,
        /// `open`, `read` or `stat`.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The path is a directory.
    #[error("{kind} file {}: is a directory, not a file", path.display())]
    Directory {
        /// The path.
        path: PathBuf,
        /// Its kind.
        kind: InputKind,
    },
    /// The file (decoded, for gzip) holds more than the kind's cap.
    #[error(
        "{kind} file {}: more than {cap} bytes (the cap of a {kind} file; raise it with {variable}=BYTES)",
        path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its kind.
        kind: InputKind,
        /// The cap, in bytes.
        cap: u64,
        /// The variable that raises it.
        variable: &'static str,
    },
    /// A line is longer than the line cap (no newline within `cap` bytes).
    #[error(
        "{kind} file {}: a line longer than {cap} bytes (the line cap; raise it with {variable}=BYTES)",
        path.display()
    )]
    LineTooLong {
        /// The file.
        path: PathBuf,
        /// Its kind.
        kind: InputKind,
        /// The cap, in bytes.
        cap: u64,
        /// The variable that raises it ([`LINE_VARIABLE`]).
        variable: &'static str,
    },
    /// A stop signal arrived while waiting for a FIFO or device to deliver data.
    #[error("{kind} file {}: stopped by {signal} while waiting for data (a FIFO or device no one writes)", path.display())]
    Interrupted {
        /// The file.
        path: PathBuf,
        /// Its kind.
        kind: InputKind,
        /// The signal's name.
        signal: &'static str,
    },
    /// The input must be a regular file (Parquet is read by seeking) and is not.
    #[error("{kind} file {}: {what}, not a regular file (this format is read by seeking)", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// Its kind.
        kind: InputKind,
        /// What it is (`a FIFO`, `a character device`, ...).
        what: &'static str,
    },
    /// A cap variable holds no valid size.
    #[error("{variable}={value:?}: {reason}")]
    BadCap {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        reason: String,
    },
}

impl InputError {
    /// The input error an [`io::Error`] returned by an [`Input`] carries (a cap, an
    /// interruption, a failed read), or the I/O error itself when it carries none (a gzip
    /// decoder's error, for instance).
    ///
    /// # Errors
    /// The original error when it does not carry an [`InputError`].
    pub fn from_io(e: io::Error) -> Result<Self, io::Error> {
        carried(e)
    }

    fn into_io(self) -> io::Error {
        let kind = match &self {
            Self::Io { source, .. } => source.kind(),
            // Not `ErrorKind::Interrupted`: `read_to_end` and friends retry that one.
            Self::Interrupted { .. } => io::ErrorKind::Other,
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, self)
    }
}

/// Parses a size in bytes: digits with an optional binary suffix `K`, `M`, `G`, `KiB`, `MiB`,
/// `GiB`; at least 1.
///
/// # Errors
/// The reason, for a message naming the variable.
pub fn parse_bytes(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, suffix) = v.split_at(digits);
    let shift = match suffix.trim() {
        "" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return Err("expected bytes: an integer with an optional suffix K, M, G (KiB, MiB, GiB)".into()),
    };
    let n: u64 = n.parse().map_err(|_| "expected bytes: an integer, e.g. 2G or 2147483648".to_string())?;
    let bytes = n.checked_mul(1 << shift).ok_or_else(|| "too large for 64 bits".to_string())?;
    if bytes == 0 {
        return Err("must be at least 1 byte".into());
    }
    Ok(bytes)
}

/// The caps in force for one kind, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Size cap (decoded bytes).
    pub total: u64,
    /// Line cap, for a line-based kind.
    pub line: Option<u64>,
}

/// The caps of `kind`: its variable's value, else its default ([`InputKind::default_cap`],
/// [`DEFAULT_LINE_CAP`]).
///
/// # Errors
/// [`InputError::BadCap`] when a variable is set to no valid size.
pub fn limits(kind: InputKind) -> Result<Limits, InputError> {
    let get = |var: &'static str, default: u64| match std::env::var(var) {
        Ok(v) => parse_bytes(&v).map_err(|reason| InputError::BadCap { variable: var, value: v, reason }),
        Err(_) => Ok(default),
    };
    Ok(Limits {
        total: get(kind.variable(), kind.default_cap())?,
        line: if kind.line_capped() { Some(get(LINE_VARIABLE, DEFAULT_LINE_CAP)?) } else { None },
    })
}

/// An open input, read through its caps. Every error of [`Read::read`] carries an
/// [`InputError`] (recover it with [`InputError::from_io`]) except a gzip decoder's own with a
/// payload (a corrupt stream); a stream cut short is `InputError::Io { op: "read" }` with
/// the decoder's `UnexpectedEof`.
pub struct Input {
    inner: Box<dyn Read + Send>,
    path: PathBuf,
    kind: InputKind,
    limits: Limits,
    total: u64,
    line: u64,
    gzip: bool,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input").field("path", &self.path).field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// What a non-regular, non-directory file type is, for messages.
fn describe(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// A FIFO, device or socket opened with `O_NONBLOCK`, read through `poll(2)` with a tick that
/// checks the stop signal.
struct Waiting {
    file: File,
    path: PathBuf,
    kind: InputKind,
}

impl Read for Waiting {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            if let Some(s) = crate::signals::received() {
                return Err(
                    InputError::Interrupted { path: self.path.clone(), kind: self.kind, signal: s.name() }.into_io()
                );
            }
            let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(STOP_TICK_MS)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
            match self.file.read(buf) {
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
                r => return r,
            }
        }
    }
}

/// The raw file: regular, or non-blocking behind [`Waiting`]; directories refused.
fn open_raw(path: &Path, kind: InputKind, limits: Limits) -> Result<Box<dyn Read + Send>, InputError> {
    let io = |op: &'static str| move |source| InputError::Io { path: path.into(), kind, op, source };
    let meta = std::fs::metadata(path).map_err(io("open"))?;
    let t = meta.file_type();
    if t.is_dir() {
        return Err(InputError::Directory { path: path.into(), kind });
    }
    if t.is_file() {
        // A regular file larger than the cap is refused before reading (a compressed file is
        // checked while decoding: its size on disk says little).
        if meta.len() > limits.total {
            return Err(too_large(path, kind, limits.total));
        }
        return Ok(Box::new(File::open(path).map_err(io("open"))?));
    }
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(path).map_err(io("open"))?;
    Ok(Box::new(Waiting { file, path: path.into(), kind }))
}

fn too_large(path: &Path, kind: InputKind, cap: u64) -> InputError {
    InputError::TooLarge { path: path.into(), kind, cap, variable: kind.variable() }
}

/// Opens `path` as an input of `kind`: refuses a directory, a regular file above the size cap,
/// and (while reading) more decoded bytes than the cap or a line above the line cap. A data or
/// trace file starting with the gzip magic is decompressed (every member), whatever its name.
///
/// # Errors
/// [`InputError::Io`], [`InputError::Directory`], [`InputError::TooLarge`],
/// [`InputError::BadCap`], [`InputError::Interrupted`] (a stop signal while waiting for the
/// gzip check's first bytes).
pub fn open(path: &Path, kind: InputKind) -> Result<Input, InputError> {
    let limits = limits(kind)?;
    let raw = open_raw(path, kind, limits)?;
    let mut gzip = false;
    let inner: Box<dyn Read + Send> = if kind.gunzips() {
        let mut buffered = BufReader::new(raw);
        let head = buffered.fill_buf().map_err(|e| read_error(path, kind, e))?;
        gzip = head.starts_with(&[0x1f, 0x8b]);
        if gzip { Box::new(flate2::bufread::MultiGzDecoder::new(buffered)) } else { Box::new(buffered) }
    } else {
        raw
    };
    Ok(Input { inner, path: path.into(), kind, limits, total: 0, line: 0, gzip })
}

impl Input {
    /// Whether the file is read through the gzip decoder (a corrupt stream's errors are then
    /// the decoder's; a truncated one's are `InputError::Io { op: "read" }`).
    pub fn is_gzip(&self) -> bool {
        self.gzip
    }
}

/// An I/O error of a read as an [`InputError`] (the one it carries, else `Io { op: "read" }`).
fn read_error(path: &Path, kind: InputKind, e: io::Error) -> InputError {
    InputError::from_io(e).unwrap_or_else(|source| InputError::Io { path: path.into(), kind, op: "read", source })
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            // An error without a payload (a failed read of the file, or a gzip stream cut
            // short: the decoder reports `UnexpectedEof` without one) or one carrying an
            // [`InputError`] becomes that typed error, naming the file. The decoder's errors
            // with a payload (a corrupt stream) pass as they are: the parser names the file
            // and line.
            Err(e) if e.get_ref().is_none() || e.get_ref().is_some_and(|i| i.is::<InputError>()) => {
                return Err(read_error(&self.path, self.kind, e).into_io());
            }
            Err(e) => return Err(e),
        };
        let got = &buf[..n];
        self.total += n as u64;
        if self.total > self.limits.total {
            return Err(too_large(&self.path, self.kind, self.limits.total).into_io());
        }
        if let Some(cap) = self.limits.line {
            self.line = match got.iter().rposition(|&b| b == b'\n') {
                Some(last) => (n - 1 - last) as u64,
                None => self.line + n as u64,
            };
            if self.line > cap {
                return Err(InputError::LineTooLong {
                    path: self.path.clone(),
                    kind: self.kind,
                    cap,
                    variable: LINE_VARIABLE,
                }
                .into_io());
            }
        }
        Ok(n)
    }
}

/// The whole (decoded) content of `path` as an input of `kind`.
///
/// # Errors
/// As [`open`], and every cap and read error of [`Input`] as its [`InputError`].
pub fn read(path: &Path, kind: InputKind) -> Result<Vec<u8>, InputError> {
    let mut input = open(path, kind)?;
    let mut bytes = Vec::new();
    input.read_to_end(&mut bytes).map_err(|e| read_error(path, kind, e))?;
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
///
/// # Errors
/// As [`read`]; [`InputError::Io`] (`InvalidData`) when the bytes are not UTF-8.
pub fn read_to_string(path: &Path, kind: InputKind) -> Result<String, InputError> {
    String::from_utf8(read(path, kind)?).map_err(|e| InputError::Io {
        path: path.into(),
        kind,
        op: "read",
        source: io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()),
    })
}

/// Checks that `path` is a regular file of at most the kind's cap (for a reader that seeks,
/// e.g. Parquet) and opens it.
///
/// # Errors
/// [`InputError::Io`], [`InputError::Directory`], [`InputError::NotRegular`],
/// [`InputError::TooLarge`], [`InputError::BadCap`].
pub fn open_regular(path: &Path, kind: InputKind) -> Result<File, InputError> {
    let limits = limits(kind)?;
    let meta =
        std::fs::metadata(path).map_err(|source| InputError::Io { path: path.into(), kind, op: "open", source })?;
    let t = meta.file_type();
    if t.is_dir() {
        return Err(InputError::Directory { path: path.into(), kind });
    }
    if !t.is_file() {
        return Err(InputError::NotRegular { path: path.into(), kind, what: describe(t) });
    }
    if meta.len() > limits.total {
        return Err(too_large(path, kind, limits.total));
    }
    File::open(path).map_err(|source| InputError::Io { path: path.into(), kind, op: "open", source })
}

/// The last `max` bytes (at most) of a regular file, lossy UTF-8 (a rank process's stderr).
/// Empty when the file is absent or not regular.
pub fn tail(path: &Path, max: u64) -> String {
    // Only `max` bytes are read whatever the size: no size cap applies.
    let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    let Some(mut f) = regular.then(|| File::open(path).ok()).flatten() else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.seek(io::SeekFrom::Start(len.saturating_sub(max))).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = f.take(max).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The typed error `E` an [`io::Error`] carries (a reader that can only return `io::Error`
/// wraps its own typed error in one: [`InputError`], `console::StreamError`), or the original
/// error when it carries none. The one unwrapping of both.
///
/// # Errors
/// The original error when it does not carry an `E`.
pub(crate) fn carried<E: std::error::Error + Send + Sync + 'static>(e: io::Error) -> Result<E, io::Error> {
    if !e.get_ref().is_some_and(|inner| inner.is::<E>()) {
        return Err(e);
    }
    let kind = e.kind();
    match e.into_inner().map(|inner| inner.downcast::<E>()) {
        Some(Ok(me)) => Ok(*me),
        Some(Err(other)) => Err(io::Error::new(kind, other)),
        None => Err(io::Error::from(kind)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("3 MiB"), Ok(3 << 20));
        assert_eq!(parse_bytes("1K"), Ok(1024));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("1T").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999G").is_err());
    }

    /// An endless line is refused at the line cap with the file, the cap and the variable
    /// named; short lines up to the size cap pass; the size cap counts decoded bytes.
    #[test]
    fn caps_refuse_long_lines_and_large_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let long = dir.path().join("long.csv");
        std::fs::write(&long, vec![b'1'; (DEFAULT_LINE_CAP + DEFAULT_LINE_CAP / 2) as usize]).expect("write");
        let e = read(&long, InputKind::Data).expect_err("long line");
        assert!(matches!(e, InputError::LineTooLong { cap: DEFAULT_LINE_CAP, variable: LINE_VARIABLE, .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("long.csv") && text.contains("1048576") && text.contains(LINE_VARIABLE), "{text}");
        // Binary kinds have no line cap.
        assert_eq!(
            read(&long, InputKind::Params).expect("no line cap").len(),
            long.metadata().expect("m").len() as usize
        );
        let short = dir.path().join("short.csv");
        std::fs::write(&short, "a,b\n".repeat(1 << 19)).expect("write");
        assert_eq!(read(&short, InputKind::Trace).expect("short lines").len(), 4 << 19);
        // A gzip of 2 MiB decoded, under a 1 MiB cap of... the System kind (not gunzipped) vs
        // a data file: decoded bytes count.
        let gz = dir.path().join("big.csv.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut enc, "1,2\n".repeat(1 << 19).as_bytes()).expect("gz");
        std::fs::write(&gz, enc.finish().expect("gz")).expect("write");
        assert_eq!(read(&gz, InputKind::Data).expect("decoded").len(), 4 << 19);
        let mut input = open(&gz, InputKind::Data).expect("open");
        input.limits.total = 1 << 20;
        let e = InputError::from_io(input.read_to_end(&mut Vec::new()).expect_err("capped")).expect("typed");
        assert!(
            matches!(e, InputError::TooLarge { cap: 1_048_576, variable: "DROPCOMPUTE_MAX_DATA_BYTES", .. }),
            "{e}"
        );
    }

    #[test]
    fn a_gzip_cut_anywhere_is_an_error_never_a_shorter_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut enc, "1,2,3\n".repeat(200).as_bytes()).expect("gz");
        let whole = enc.finish().expect("gz");
        // Two members: a cut at the boundary is a valid file holding the first member only.
        let two = [whole.clone(), whole.clone()].concat();
        assert_eq!(
            read_bytes_of(&dir, "two.csv.gz", &two).expect("two members").len(),
            2 * 1200,
            "every member decoded"
        );
        // (From 2 bytes: a one-byte file lacks the gzip magic and is read as text.)
        for cut in (2..two.len()).filter(|&c| c != whole.len()) {
            match read_bytes_of(&dir, "cut.csv.gz", &two[..cut]) {
                Ok(got) => panic!("cut at {cut} of {} read as {} bytes", two.len(), got.len()),
                Err(e) => {
                    let text = e.to_string();
                    let typed = InputError::from_io(e);
                    // A truncation names the file; a cut that leaves a corrupt header is the
                    // decoder's own error.
                    if let Ok(t) = typed {
                        assert!(matches!(t, InputError::Io { op: "read", .. }), "cut {cut}: {t}");
                        assert!(t.to_string().contains("cut.csv.gz"), "cut {cut}: {t}");
                    } else {
                        assert!(!text.is_empty(), "cut {cut}");
                    }
                }
            }
        }
    }

    /// Writes `bytes` to `name` in `dir` and reads it whole as training data.
    fn read_bytes_of(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> io::Result<Vec<u8>> {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        let mut out = Vec::new();
        open(&p, InputKind::Data).map_err(InputError::into_io)?.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn a_directory_and_a_missing_file_are_typed_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(matches!(read(dir.path(), InputKind::Checkpoint), Err(InputError::Directory { .. })));
        let e = read(&dir.path().join("absent"), InputKind::Params).expect_err("absent");
        assert!(matches!(&e, InputError::Io { op: "open", .. }) && e.to_string().contains("parameters file"), "{e}");
        assert!(matches!(open_regular(Path::new("/dev/null"), InputKind::Trace), Err(InputError::NotRegular { .. })));
    }

    #[test]
    fn dev_zero_ends_at_a_cap() {
        if !Path::new("/dev/zero").exists() {
            return;
        }
        let e = read(Path::new("/dev/zero"), InputKind::Data).expect_err("endless");
        assert!(matches!(e, InputError::LineTooLong { .. }), "{e}");
        let e = read(Path::new("/dev/zero"), InputKind::System).expect_err("endless");
        assert!(matches!(e, InputError::LineTooLong { .. } | InputError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn tail_reads_the_end() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("err.txt");
        std::fs::write(&p, "0123456789").expect("write");
        assert_eq!(tail(&p, 4), "6789");
        assert_eq!(tail(&p, 100), "0123456789");
        assert_eq!(tail(&dir.path().join("none"), 4), "");
    }
}
