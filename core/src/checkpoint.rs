//! Crash-safe checkpoint container: one file per checkpoint, written atomically, read back with
//! every length checked and a SHA-256 over the whole file.
//!
//! Owns: the file format, [`save`] (temp file, fsync, rename, fsync of the directory, retention
//! of the newest [`KEEP`] good checkpoints), [`read`] / [`decode`] and [`load_latest`].
//! Must not touch: what the metadata means (scheduler state, RNG states, ledger, config echo are
//! opaque JSON here) or what the tensors are (model parameters, optimizer state).
//!
//! # File format (version [`FORMAT_VERSION`], all integers little-endian)
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic [`MAGIC`] `"DCCKPT\0\0"` |
//! | 8 | 4 | format version `u32` |
//! | 12 | 4 | reserved, 0 |
//! | 16 | 8 | step `u64` |
//! | 24 | 8 | total file length in bytes `u64` (lets a reader tell truncation from corruption) |
//! | 32 | 8 | meta length in bytes `u64` |
//! | 40 | 8 | tensor count `u64` |
//! | 48 | meta length | metadata, JSON (UTF-8) |
//! | ... | per tensor | name length `u32`, name (UTF-8), element count `u64`, elements (f32, 4 bytes each, raw bits) |
//! | total - 32 | 32 | SHA-256 of every byte before it |
//!
//! f32 values are stored as their raw bits (`f32::to_bits`), so a round trip is bitwise exact,
//! NaN payloads included.
//!
//! # Durability (POSIX)
//! [`save`] writes `checkpoint-{step:010}.dcc.tmp`, `fsync`s it, renames it over
//! `checkpoint-{step:010}.dcc` (atomic within a file system) and `fsync`s the directory so the
//! rename itself survives a power loss. Only then are older checkpoints deleted. One writer per
//! directory is assumed (a second writer's temp files may be removed as stale).
#![forbid(unsafe_code)]

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// First 8 bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"DCCKPT\0\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed header (magic to tensor count).
pub const HEADER_LEN: usize = 48;
/// Bytes of the trailing SHA-256.
pub const DIGEST_LEN: usize = 32;
/// Good checkpoints kept by [`save`] (the new one and the newest previous good one).
pub const KEEP: usize = 2;
/// File name extension of a complete checkpoint.
pub const EXTENSION: &str = "dcc";

/// Smallest encoded tensor record: name length (4) + element count (8), empty name and data.
const MIN_TENSOR_RECORD: usize = 12;

/// One checkpoint: the step it was taken after, opaque metadata and named f32 tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Training step (number of optimizer steps completed).
    pub step: u64,
    /// Scheduler state, RNG states, ledger, config echo: opaque to this module.
    pub meta: serde_json::Value,
    /// Named tensors (model parameters, optimizer state), order preserved; values are stored
    /// bitwise (NaN payloads included).
    pub tensors: Vec<(String, Vec<f32>)>,
}

/// Why a checkpoint could not be written or read. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The bounded reader refused the file (`crate::input`, kind checkpoint: a directory, the
    /// size cap, a stop signal while waiting for a FIFO) or could not open it.
    #[error("{0}")]
    Input(#[from] crate::input::InputError),
    /// A file system call failed.
    #[error("checkpoint {path}: {op}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The call, e.g. "open", "fsync", "rename".
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with [`MAGIC`]: not a dropcompute checkpoint.
    #[error("{path} is not a dropcompute checkpoint (bad magic)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// Written by a format version this build cannot read.
    #[error("checkpoint {path} has format version {found}; this build reads version {supported}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads ([`FORMAT_VERSION`]).
        supported: u32,
    },
    /// The file is shorter than its header says (an interrupted copy, a full disk).
    #[error("checkpoint {path} is truncated: {got} bytes, expected {expected}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header announces (or [`HEADER_LEN`] when the header itself is cut).
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// The SHA-256 does not match the content: the file was corrupted after it was written.
    #[error("checkpoint {path}: checksum mismatch (file corrupted)")]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
    },
    /// Structurally invalid (lengths that do not add up, bad UTF-8 or JSON, a step that
    /// disagrees with the file name), or a checkpoint that cannot be encoded.
    #[error("checkpoint {path} is malformed: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the offending values.
        reason: String,
    },
    /// A sound checkpoint written by a job of another configuration (e.g. another `--check`):
    /// not malformed, and not resumable by this one.
    #[error("checkpoint {path} was written by a run with a different configuration: {differences}")]
    OtherConfiguration {
        /// The file.
        path: PathBuf,
        /// Each differing setting as "FLAG was X, this run has Y", in the caller's flag
        /// spellings, joined by "; ".
        differences: String,
    },
    /// [`load_latest`] found no readable checkpoint in the directory.
    #[error("no valid checkpoint in {dir} ({} corrupt file(s) skipped{})", corrupt.len(), list(corrupt))]
    NoCheckpoint {
        /// The directory searched.
        dir: PathBuf,
        /// Checkpoint files that exist but could not be read.
        corrupt: Vec<PathBuf>,
    },
}

fn list(p: &[PathBuf]) -> String {
    if p.is_empty() {
        return String::new();
    }
    format!(": {}", p.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
}

/// The newest valid checkpoint of a directory, and the newer files that were skipped.
#[derive(Debug)]
pub struct Loaded {
    /// The file it came from.
    pub path: PathBuf,
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// Newer checkpoint files that could not be read, newest first, with why (left on disk).
    pub skipped: Vec<(PathBuf, CheckpointError)>,
}

/// `checkpoint-{step:010}.dcc`: the file name of the checkpoint of `step`.
pub fn file_name(step: u64) -> String {
    format!("checkpoint-{step:010}.{EXTENSION}")
}

/// The step encoded in a checkpoint file name, `None` for other names (including `.tmp` files).
pub fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?.strip_suffix(".dcc")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Encodes a checkpoint into the file format (header, meta, tensors, SHA-256).
///
/// # Errors
/// [`CheckpointError::Malformed`] (with `path` as the label) when a tensor name is longer than
/// `u32::MAX` bytes.
pub fn encode(ckpt: &Checkpoint, path: &Path) -> Result<Vec<u8>, CheckpointError> {
    let meta = serde_json::to_vec(&ckpt.meta).map_err(|e| malformed(path, format!("meta: {e}")))?;
    let data_len: usize = ckpt.tensors.iter().map(|(n, v)| MIN_TENSOR_RECORD + n.len() + 4 * v.len()).sum();
    let total = HEADER_LEN + meta.len() + data_len + DIGEST_LEN;
    let mut b = Vec::with_capacity(total);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&ckpt.step.to_le_bytes());
    b.extend_from_slice(&(total as u64).to_le_bytes());
    b.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    b.extend_from_slice(&(ckpt.tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&meta);
    for (name, values) in &ckpt.tensors {
        let n = u32::try_from(name.len())
            .map_err(|_| malformed(path, format!("tensor name of {} bytes exceeds u32", name.len())))?;
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(values.len() as u64).to_le_bytes());
        for v in values {
            b.extend_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    let digest = Sha256::digest(&b);
    b.extend_from_slice(&digest);
    debug_assert_eq!(b.len(), total);
    Ok(b)
}

fn malformed(path: &Path, reason: String) -> CheckpointError {
    CheckpointError::Malformed { path: path.to_path_buf(), reason }
}

/// A bounds-checked reader over the body (after the checksum was verified).
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], CheckpointError> {
        let left = self.b.len() - self.at;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let s = &self.b[self.at..self.at + n];
                self.at += n;
                Ok(s)
            }
            _ => Err(malformed(self.path, format!("{what}: {n} bytes announced, {left} left at offset {}", self.at))),
        }
    }
    fn u32(&mut self, what: &str) -> Result<u32, CheckpointError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, CheckpointError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

/// Decodes a checkpoint from the bytes of a file (`path` only labels errors). Never panics;
/// every allocation is bounded by `bytes.len()`.
///
/// Checks, in order: magic ([`CheckpointError::BadMagic`]; a short prefix of the magic is
/// [`CheckpointError::Truncated`]), version ([`CheckpointError::UnsupportedVersion`]), length
/// against the header's total ([`CheckpointError::Truncated`], or `Malformed` for trailing
/// bytes), SHA-256 ([`CheckpointError::ChecksumMismatch`]), then the structure
/// ([`CheckpointError::Malformed`]).
pub fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
    let got = bytes.len() as u64;
    let truncated = |expected: u64| CheckpointError::Truncated { path: path.to_path_buf(), expected, got };
    let magic_seen = &bytes[..bytes.len().min(MAGIC.len())];
    if magic_seen != &MAGIC[..magic_seen.len()] {
        return Err(CheckpointError::BadMagic { path: path.to_path_buf() });
    }
    if bytes.len() < 12 {
        return Err(truncated(HEADER_LEN as u64));
    }
    let mut head = Cursor { b: bytes, at: 8, path };
    let found = head.u32("version")?;
    if found != FORMAT_VERSION {
        return Err(CheckpointError::UnsupportedVersion { path: path.to_path_buf(), found, supported: FORMAT_VERSION });
    }
    if bytes.len() < HEADER_LEN + DIGEST_LEN {
        return Err(truncated((HEADER_LEN + DIGEST_LEN) as u64));
    }
    let _reserved = head.u32("reserved")?;
    let step = head.u64("step")?;
    let total = head.u64("total length")?;
    if total > got {
        return Err(truncated(total));
    }
    if total < got {
        return Err(malformed(path, format!("{} trailing bytes after the announced length {total}", got - total)));
    }
    let (content, digest) = bytes.split_at(bytes.len() - DIGEST_LEN);
    if Sha256::digest(content).as_slice() != digest {
        return Err(CheckpointError::ChecksumMismatch { path: path.to_path_buf() });
    }
    let meta_len = head.u64("meta length")?;
    let count = head.u64("tensor count")?;
    let mut c = Cursor { b: content, at: HEADER_LEN, path };
    let meta = serde_json::from_slice(c.take(meta_len, "meta")?).map_err(|e| malformed(path, format!("meta: {e}")))?;
    let left = (content.len() - c.at) as u64;
    if count > left / MIN_TENSOR_RECORD as u64 {
        return Err(malformed(path, format!("{count} tensors cannot fit in the {left} bytes left")));
    }
    let mut tensors = Vec::with_capacity(count as usize);
    for i in 0..count {
        let n = c.u32("tensor name length")?;
        let name = std::str::from_utf8(c.take(u64::from(n), "tensor name")?)
            .map_err(|e| malformed(path, format!("tensor {i} name: {e}")))?
            .to_string();
        let elems = c.u64("element count")?;
        let data = c.take(elems.saturating_mul(4), "tensor data")?;
        let values = data.chunks_exact(4).map(|w| f32::from_bits(u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
        tensors.push((name, values.collect()));
    }
    if c.at != content.len() {
        return Err(malformed(path, format!("{} unused bytes after the last tensor", content.len() - c.at)));
    }
    Ok(Checkpoint { step, meta, tensors })
}

/// Reads and verifies one checkpoint file.
///
/// # Errors
/// [`CheckpointError::Input`] when the file cannot be opened or read through the bounded
/// reader (`crate::input`, kind checkpoint); otherwise as [`decode`].
pub fn read(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = crate::input::read(path, crate::input::InputKind::Checkpoint)?;
    decode(&bytes, path)
}

/// The checkpoint files of `dir` with their steps, newest (highest step) first.
fn list_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let io = |op: &'static str| move |source| CheckpointError::Io { path: dir.to_path_buf(), op, source };
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io("read_dir"))? {
        let entry = entry.map_err(io("read_dir"))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            out.push((step, entry.path()));
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    Ok(out)
}

/// [`read`] plus a check that the step in the file agrees with the step in its name.
fn read_named(path: &Path, step: u64) -> Result<Checkpoint, CheckpointError> {
    let c = read(path)?;
    if c.step != step {
        return Err(malformed(path, format!("file name says step {step}, header says step {}", c.step)));
    }
    Ok(c)
}

/// Writes `ckpt` durably into `dir` (created if missing) as [`file_name`]`(ckpt.step)`, then
/// deletes older good checkpoints so that the new one and the newest other good one remain
/// ([`KEEP`] = 2). Corrupt checkpoint files are never deleted (they are evidence); stale `.tmp`
/// files of an interrupted save are. Returns the path written.
///
/// # Errors
/// [`CheckpointError::Io`] naming the failed call (create_dir_all, create, write, fsync,
/// rename, fsync of the directory, remove); [`CheckpointError::Malformed`] from [`encode`].
/// When an error is returned before the rename, the previous checkpoints are untouched.
pub fn save(dir: &Path, ckpt: &Checkpoint) -> Result<PathBuf, CheckpointError> {
    let io = |path: &Path, op: &'static str| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, op, source }
    };
    fs::create_dir_all(dir).map_err(io(dir, "create_dir_all"))?;
    let path = dir.join(file_name(ckpt.step));
    let tmp = dir.join(format!("{}.tmp", file_name(ckpt.step)));
    let bytes = encode(ckpt, &path)?;
    {
        let mut f = File::create(&tmp).map_err(io(&tmp, "create"))?;
        f.write_all(&bytes).map_err(io(&tmp, "write"))?;
        f.sync_all().map_err(io(&tmp, "fsync"))?;
    }
    fs::rename(&tmp, &path).map_err(io(&tmp, "rename"))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir, "fsync of the directory"))?;
    prune(dir, ckpt.step)?;
    Ok(path)
}

/// Retention after a durable save of `newest`: keeps it and the highest-step other readable
/// checkpoint; deletes the remaining readable ones and stale temp files.
fn prune(dir: &Path, newest: u64) -> Result<(), CheckpointError> {
    let mut good = 1;
    for (step, path) in list_checkpoints(dir)? {
        if step == newest {
            continue;
        }
        match read_named(&path, step) {
            Ok(_) if good < KEEP => good += 1,
            Ok(_) => fs::remove_file(&path).map_err(|source| CheckpointError::Io { path, op: "remove", source })?,
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "keeping a corrupt checkpoint file"),
        }
    }
    let io = |op: &'static str| move |source| CheckpointError::Io { path: dir.to_path_buf(), op, source };
    for entry in fs::read_dir(dir).map_err(io("read_dir"))? {
        let entry = entry.map_err(io("read_dir"))?;
        let name = entry.file_name();
        let stale = name.to_str().and_then(|n| n.strip_suffix(".tmp")).and_then(step_of).is_some();
        if stale {
            let _ = fs::remove_file(entry.path()); // best effort: a leftover of a crashed save
        }
    }
    Ok(())
}

/// Unreadable checkpoint files with their errors.
pub type Skipped = Vec<(PathBuf, CheckpointError)>;

/// Every readable checkpoint step in `dir` (newest first) and the unreadable files with their
/// errors (left on disk). Reads each file in full (checksum verified).
///
/// # Errors
/// [`CheckpointError::Io`] when `dir` cannot be listed; [`CheckpointError::Input`] with
/// `InputError::Interrupted` when a stop signal arrived while waiting for a file (a FIFO): the
/// stop ends the search instead of skipping the file.
pub fn valid_steps(dir: &Path) -> Result<(Vec<u64>, Skipped), CheckpointError> {
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for (step, path) in list_checkpoints(dir)? {
        match read_named(&path, step) {
            Ok(_) => ok.push(step),
            Err(e @ CheckpointError::Input(crate::input::InputError::Interrupted { .. })) => return Err(e),
            Err(e) => bad.push((path, e)),
        }
    }
    Ok((ok, bad))
}

/// Reads the checkpoint of `step` in `dir` (the file [`file_name`] names).
///
/// # Errors
/// As [`read`]; [`CheckpointError::Malformed`] when the header's step differs.
pub fn read_step(dir: &Path, step: u64) -> Result<Checkpoint, CheckpointError> {
    read_named(&dir.join(file_name(step)), step)
}

/// Loads the newest readable checkpoint of `dir` (by the step in the file name). Newer files
/// that cannot be read are reported in [`Loaded::skipped`] (and logged) and left on disk.
///
/// # Errors
/// [`CheckpointError::Io`] when the directory cannot be listed;
/// [`CheckpointError::NoCheckpoint`] when no checkpoint file is readable.
pub fn load_latest(dir: &Path) -> Result<Loaded, CheckpointError> {
    let mut skipped = Vec::new();
    for (step, path) in list_checkpoints(dir)? {
        match read_named(&path, step) {
            Ok(checkpoint) => return Ok(Loaded { path, checkpoint, skipped }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable checkpoint");
                skipped.push((path, e));
            }
        }
    }
    Err(CheckpointError::NoCheckpoint { dir: dir.to_path_buf(), corrupt: skipped.into_iter().map(|s| s.0).collect() })
}
