//! The `--out DIR` of `dropcompute train`, written all at once: [`StagedOut`].
//!
//! Owns: the hidden staging directory next to DIR, moving its files into DIR on
//! [`StagedOut::commit`], and removing it when a failed run drops it. Must not touch: what the
//! files contain (report, timeline and figure writers), devices, the clock.
//!
//! Guarantee: DIR never holds a half-written file of this run. Each file is written and fsynced
//! in the staging directory (same parent, so the same file system as DIR), then renamed into DIR
//! (rename(2) is atomic per file), then DIR is fsynced. The set of files is not switched
//! atomically: a crash during `commit` can leave some new files beside older ones
//! ("atomically-ish"). Same names are replaced. A reused DIR is emptied of the product's own
//! earlier files that this run does not write ([`is_own_output`]: e.g. a `--compare` run's
//! `compute_log_baseline.csv` under a later `--no-compare` run), so DIR never mixes two runs;
//! `train` says on stdout which it removed. Files of other names (the user's) are left alone.
//! (Emptied rather than refused: re-running into the same DIR is the common workflow, and
//! only names this product writes are ever removed.)
#![forbid(unsafe_code)]

use std::fs::{self, File};
use std::io::Write;
use std::path::{Component, Path, PathBuf};

/// Errors of [`StagedOut`].
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// `--out` names something that exists and is not a directory (e.g. a regular file).
    #[error("--out {}: exists and is not a directory", path.display())]
    NotADirectory {
        /// The `--out` path.
        path: PathBuf,
    },
    /// `--out` has no final component to stage beside (e.g. `/`).
    #[error("--out {}: cannot be used as an output directory (no parent)", path.display())]
    NoParent {
        /// The `--out` path.
        path: PathBuf,
    },
    /// An output file name is not a single plain component (empty, `..`, absolute, with `/`).
    #[error("output file name {name:?}: must be a plain file name")]
    BadName {
        /// The rejected name.
        name: String,
    },
    /// A file-system call failed; `op` names the call, `path` its argument.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The operation, e.g. "create", "rename", "fsync".
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + use<> {
    let path = path.to_path_buf();
    move |source| OutputError::Io { op, path, source }
}

/// Whether `name` is a file `train --out` writes (`summary::write_outputs`): `report.json`,
/// `timeline.json`, `steps.csv`, `figure.svg`, `compute_log_<run>.csv`, `ledger_<run>.json`,
/// `params_<run>.safetensors`.
pub fn is_own_output(name: &str) -> bool {
    let run = |prefix: &str, suffix: &str| {
        name.strip_prefix(prefix).and_then(|r| r.strip_suffix(suffix)).is_some_and(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        })
    };
    matches!(name, "report.json" | "timeline.json" | "steps.csv" | "figure.svg")
        || run("compute_log_", ".csv")
        || run("ledger_", ".json")
        || run("params_", ".safetensors")
}

/// What [`StagedOut::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The files of this run, in DIR, sorted.
    pub files: Vec<PathBuf>,
    /// The product's earlier files removed from DIR ([`is_own_output`] names this run did not
    /// write), sorted.
    pub removed: Vec<PathBuf>,
}

/// Output files staged in `.NAME.tmp-<pid>` beside `--out NAME`, moved into NAME by
/// [`StagedOut::commit`]. Dropping it uncommitted removes the staging directory (best effort,
/// errors ignored: `Drop` never panics).
#[derive(Debug)]
pub struct StagedOut {
    dir: PathBuf,
    staging: PathBuf,
    committed: bool,
}

impl StagedOut {
    /// Prepare staging for output directory `dir` (created at commit if absent). Creates the
    /// parent of `dir` if missing and a fresh staging directory (a stale one left by a killed
    /// run with the same pid is removed first).
    /// Errors: [`OutputError::NotADirectory`] if `dir` exists and is not a directory,
    /// [`OutputError::NoParent`] for `/`, [`OutputError::Io`] if the parent or the staging
    /// directory cannot be created.
    pub fn new(dir: &Path) -> Result<Self, OutputError> {
        if dir.exists() && !dir.is_dir() {
            return Err(OutputError::NotADirectory { path: dir.to_path_buf() });
        }
        // "out/." or ".." have no file name: resolve them (they exist, or the check is moot).
        let dir = match dir.file_name() {
            Some(_) => dir.to_path_buf(),
            None => dir.canonicalize().map_err(io("resolve", dir))?,
        };
        let name = dir.file_name().ok_or_else(|| OutputError::NoParent { path: dir.clone() })?;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Errors name the output directory the user gave (the parent or the staging directory
        // beside it is what failed; the OS error says why).
        fs::create_dir_all(&parent).map_err(io("create the parent directory of", &dir))?;
        let mut staged_name = std::ffi::OsString::from(".");
        staged_name.push(name);
        staged_name.push(format!(".tmp-{}", std::process::id()));
        let staging = parent.join(staged_name);
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(io("remove stale", &staging))?;
        }
        fs::create_dir(&staging).map_err(io("create the staging directory beside", &dir))?;
        Ok(Self { dir, staging, committed: false })
    }

    /// The final output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The staging directory (hidden, removed on drop or commit).
    pub fn staging_dir(&self) -> &Path {
        &self.staging
    }

    /// Path of `name` inside the staging directory, for writers that take a path (e.g. the SVG
    /// figure). Everything in the staging directory is moved at commit.
    /// Errors: [`OutputError::BadName`] unless `name` is one plain file-name component.
    pub fn path(&self, name: &str) -> Result<PathBuf, OutputError> {
        let mut comps = Path::new(name).components();
        match (comps.next(), comps.next()) {
            (Some(Component::Normal(c)), None) if c == name => Ok(self.staging.join(name)),
            _ => Err(OutputError::BadName { name: name.to_owned() }),
        }
    }

    /// Write `bytes` to staged file `name` (replacing it) and fsync it.
    /// Errors: [`OutputError::BadName`], [`OutputError::Io`] (create, write, fsync).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
        let path = self.path(name)?;
        let mut f = File::create(&path).map_err(io("create", &path))?;
        f.write_all(bytes).map_err(io("write", &path))?;
        f.sync_all().map_err(io("fsync", &path))
    }

    /// Move every staged file into the output directory (creating it), remove the product's
    /// earlier files this run did not write ([`is_own_output`]), fsync the files and the
    /// directory, and remove the staging directory. Returns the final paths and the removed
    /// ones, sorted.
    /// Errors: [`OutputError::NotADirectory`] if `--out` became a non-directory meanwhile,
    /// [`OutputError::Io`] (create, read, fsync, rename). On error the staging directory is
    /// removed; files already renamed stay in DIR (each complete).
    pub fn commit(mut self) -> Result<Committed, OutputError> {
        if self.dir.exists() && !self.dir.is_dir() {
            return Err(OutputError::NotADirectory { path: self.dir.clone() });
        }
        fs::create_dir_all(&self.dir).map_err(io("create", &self.dir))?;
        let mut names: Vec<_> = fs::read_dir(&self.staging)
            .map_err(io("read", &self.staging))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io("read", &self.staging))?;
        names.sort();
        let mut done = Vec::with_capacity(names.len());
        for name in names {
            let from = self.staging.join(&name);
            // Files written through `path()` by other writers may not be synced yet.
            File::open(&from).and_then(|f| f.sync_all()).map_err(io("fsync", &from))?;
            let to = self.dir.join(&name);
            fs::rename(&from, &to).map_err(io("rename", &from))?;
            done.push(to);
        }
        let mut stale: Vec<PathBuf> = fs::read_dir(&self.dir)
            .map_err(io("read", &self.dir))?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter(|e| e.file_name().to_str().is_some_and(is_own_output))
            .map(|e| e.path())
            .filter(|p| !done.contains(p))
            .collect();
        stale.sort();
        for p in &stale {
            fs::remove_file(p).map_err(io("remove the earlier", p))?;
        }
        // Directory fsync makes the renames durable (POSIX; a no-op error on some platforms).
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io("fsync", &self.dir))?;
        fs::remove_dir(&self.staging).map_err(io("remove", &self.staging))?;
        self.committed = true;
        Ok(Committed { files: done, removed: stale })
    }
}

impl Drop for StagedOut {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.staging);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh empty private directory (crate `tempfile`): its path, and the guard that removes
    /// it at the end of the test.
    struct Scratch(PathBuf, #[allow(dead_code)] tempfile::TempDir);
    impl Scratch {
        fn new(tag: &str) -> Self {
            let d = tempfile::Builder::new().prefix(&format!("dc-out-{tag}-")).tempdir().expect("scratch dir");
            Self(d.path().to_path_buf(), d)
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("read")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_moves_every_file_and_removes_staging() {
        let s = Scratch::new("commit");
        let out = s.0.join("nested").join("run1");
        let staged = StagedOut::new(&out).expect("stage");
        assert!(staged.staging_dir().starts_with(s.0.join("nested")));
        staged.write("report.json", b"{\"a\":1}").expect("write");
        fs::write(staged.path("figure.svg").expect("path"), "<svg/>").expect("external writer");
        assert!(!out.exists(), "nothing visible before commit");
        let files = staged.commit().expect("commit").files;
        assert_eq!(files, vec![out.join("figure.svg"), out.join("report.json")]);
        assert_eq!(fs::read_to_string(out.join("report.json")).expect("read"), "{\"a\":1}");
        assert_eq!(fs::read_to_string(out.join("figure.svg")).expect("read"), "<svg/>");
        assert_eq!(entries(&s.0.join("nested")), vec!["run1".to_owned()], "staging dir removed");
    }

    #[test]
    fn commit_replaces_same_names_and_keeps_others() {
        let s = Scratch::new("replace");
        let out = s.0.join("out");
        fs::create_dir(&out).expect("mkdir");
        fs::write(out.join("report.json"), "old").expect("w");
        fs::write(out.join("notes.txt"), "keep").expect("w");
        fs::write(out.join("compute_log_baseline.csv"), "earlier run").expect("w");
        fs::write(out.join("params_baseline.safetensors"), "earlier run").expect("w");
        let staged = StagedOut::new(&out).expect("stage");
        staged.write("report.json", b"new").expect("write");
        let done = staged.commit().expect("commit");
        assert_eq!(fs::read_to_string(out.join("report.json")).expect("r"), "new");
        assert_eq!(fs::read_to_string(out.join("notes.txt")).expect("r"), "keep");
        assert_eq!(done.files, vec![out.join("report.json")]);
        assert_eq!(done.removed, vec![out.join("compute_log_baseline.csv"), out.join("params_baseline.safetensors")]);
        assert_eq!(entries(&out), vec!["notes.txt".to_owned(), "report.json".to_owned()]);
        assert_eq!(entries(&s.0), vec!["out".to_owned()]);
    }

    #[test]
    fn own_outputs_are_the_names_train_writes() {
        for name in [
            "report.json",
            "timeline.json",
            "steps.csv",
            "figure.svg",
            "compute_log_baseline.csv",
            "compute_log_dropcompute.csv",
            "ledger_dropcompute.json",
            "params_baseline.safetensors",
        ] {
            assert!(is_own_output(name), "{name}");
        }
        for name in ["notes.txt", "compute_log_.csv", "report.json.bak", "params_x/y.safetensors", "steps.tsv"] {
            assert!(!is_own_output(name), "{name}");
        }
    }

    #[test]
    fn drop_without_commit_leaves_nothing() {
        let s = Scratch::new("drop");
        let out = s.0.join("out");
        {
            let staged = StagedOut::new(&out).expect("stage");
            staged.write("report.json", b"half").expect("write");
            assert_eq!(entries(&s.0).len(), 1, "only the staging dir exists");
        }
        assert!(entries(&s.0).is_empty(), "staging removed, DIR never created: {:?}", entries(&s.0));
    }

    #[test]
    fn drop_without_commit_leaves_existing_dir_untouched() {
        let s = Scratch::new("drop-existing");
        let out = s.0.join("out");
        fs::create_dir(&out).expect("mkdir");
        fs::write(out.join("report.json"), "previous run").expect("w");
        {
            let staged = StagedOut::new(&out).expect("stage");
            staged.write("report.json", b"failed run").expect("write");
        }
        assert_eq!(fs::read_to_string(out.join("report.json")).expect("r"), "previous run");
        assert_eq!(entries(&s.0), vec!["out".to_owned()]);
    }

    #[test]
    fn refuses_a_regular_file_as_out() {
        let s = Scratch::new("file");
        let f = s.0.join("report.txt");
        fs::write(&f, "x").expect("w");
        let err = StagedOut::new(&f).expect_err("file accepted");
        assert!(matches!(&err, OutputError::NotADirectory { path } if *path == f), "{err}");
        assert!(err.to_string().contains("report.txt"));
        assert_eq!(entries(&s.0), vec!["report.txt".to_owned()], "no staging dir left behind");
    }

    #[test]
    fn refuses_names_that_escape_the_directory() {
        let s = Scratch::new("names");
        let staged = StagedOut::new(&s.0.join("out")).expect("stage");
        for name in ["", "..", ".", "../x", "a/b", "/etc/passwd", "./x"] {
            let err = staged.path(name).expect_err(name);
            assert!(matches!(err, OutputError::BadName { .. }), "{name}: {err}");
        }
        assert!(staged.path("timeline-baseline.json").is_ok());
    }
}
