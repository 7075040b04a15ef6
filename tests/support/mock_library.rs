//! Test support: the path of the mock shared library `libmock_synapse.so` (crate
//! `mock-synapse`), built on first use with the test's own cargo profile, so tests can load the
//! mock through `habana_sys::SynapseApi::load_path` exactly like the real `libSynapse.so`.
//!
//! Lives in the tests, not in the library: the product never builds anything at run time.
#![allow(dead_code)]

use std::path::PathBuf;

/// Why [`shared_library_path`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedLibraryError {
    /// The running executable's path does not look like `<target>/<profile>/deps/<exe>` or
    /// `<target>/<profile>/<exe>`.
    #[error("cannot derive the target directory from {0}")]
    NoTargetDir(PathBuf),
    /// `cargo build -p mock-synapse` failed or could not run, and no library exists.
    #[error("building mock-synapse failed ({why}); expected {path}")]
    Build {
        /// The expected library path.
        path: PathBuf,
        /// Cargo's exit status or spawn error.
        why: String,
    },
}

/// Path of the mock shared library `libmock_synapse.so` for the running test or binary:
/// `<target>/<profile>/libmock_synapse.so`, derived from `std::env::current_exe()`. The first
/// call per process runs `cargo build -p mock-synapse` (same profile) so the library is never
/// stale; when cargo fails but a library exists, that one is used.
///
/// # Errors
/// [`SharedLibraryError`] when the path cannot be derived, or the library is absent and cannot
/// be built.
pub fn shared_library_path() -> Result<PathBuf, SharedLibraryError> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let r = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut dir = exe.parent().ok_or_else(|| exe.display().to_string())?.to_path_buf();
        if dir.file_name().is_some_and(|n| n == "deps" || n == "examples") {
            dir.pop();
        }
        let profile =
            dir.file_name().and_then(|n| n.to_str()).map(str::to_owned).ok_or_else(|| exe.display().to_string())?;
        let target = dir.parent().ok_or_else(|| exe.display().to_string())?.to_path_buf();
        let lib = dir.join("libmock_synapse.so");
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "mock-synapse", "--target-dir"]).arg(&target);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            p => {
                cmd.args(["--profile", p]);
            }
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        let status = cmd.status();
        match status {
            Ok(s) if s.success() => Ok(lib),
            _ if lib.exists() => Ok(lib),
            Ok(s) => Err(format!("{}|cargo exited with {s}", lib.display())),
            Err(e) => Err(format!("{}|cannot run cargo: {e}", lib.display())),
        }
    });
    match r {
        Ok(p) => Ok(p.clone()),
        Err(e) => match e.split_once('|') {
            Some((path, why)) => Err(SharedLibraryError::Build { path: PathBuf::from(path), why: why.to_string() }),
            None => Err(SharedLibraryError::NoTargetDir(PathBuf::from(e))),
        },
    }
}
