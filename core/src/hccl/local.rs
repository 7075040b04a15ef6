//! The one-host rendezvous: a launcher job whose every rank runs on this host, given no
//! rendezvous address, exchanges rank 0's loopback address and a fresh job secret through a
//! private file, so `mpirun -np 4 dropcompute train --launch env` (or `srun -N1`, or torchrun
//! on one host) needs no exported address or secret.
//!
//! Owns: when a job counts as one-host ([`one_host`]: every rank local, by the launcher's own
//! variables, and a job id the launcher gives every rank), the private file's place and form,
//! and its two sides ([`publish`] for rank 0, [`await_published`] for the others). Must not
//! touch: the wire protocol (`rendezvous`) or address parsing (`bootstrap`).
//!
//! # When
//! - Open MPI: `OMPI_COMM_WORLD_LOCAL_SIZE` equals `OMPI_COMM_WORLD_SIZE`; job id
//!   `PMIX_NAMESPACE`, else `OMPI_MCA_ess_base_jobid`.
//! - Slurm: `SLURM_STEP_NUM_NODES`, else `SLURM_NNODES`, else `SLURM_JOB_NUM_NODES` is 1; job
//!   id `SLURM_JOB_ID.SLURM_STEP_ID`.
//! - torchrun: `LOCAL_WORLD_SIZE` equals `WORLD_SIZE`; job id `TORCHELASTIC_RUN_ID` and
//!   `MASTER_PORT` (the port tells apart two standalone jobs with the default run id).
//!
//! A job spread over several hosts, or without a job id, never gets a guessed address: the
//! caller's "set DROPCOMPUTE_RENDEZVOUS" error stands.
//!
//! # The file
//! `<dir>/<launcher>-<job id>.rendezvous`, where `<dir>` is `$XDG_RUNTIME_DIR/dropcompute`
//! when that variable is set, else `$TMPDIR/dropcompute-rendezvous-<uid>` (`/tmp` without
//! `TMPDIR`): a directory of this user, mode 0700 (one with other owners or wider permissions
//! is refused). Rank 0 binds `127.0.0.1:0`, draws a fresh 128-bit secret and writes
//! `ADDR\nSECRET\nPID\n` to a 0600 file, renamed into place (readers never see half a file).
//! The others poll for it every [`POLL`] until the join timeout, stopping early at a stop
//! signal (`crate::signals`); a file whose PID is no longer alive (left by a SIGKILLed job of
//! the same id) is ignored. Rank 0 removes the file once every rank fetched the unique id (or
//! it failed), and the directory when it is then empty.
#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::bootstrap::Launcher;
use super::rendezvous::{JobSecret, RendezvousError};

/// How often a waiting rank looks for rank 0's file.
pub const POLL: Duration = Duration::from_millis(20);

/// A set, non-blank variable (trimmed).
fn get(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// A job id usable in a file name: ASCII letters, digits, `.`, `-` and `_` kept, anything else
/// `_` (a launcher's id is an integer, a namespace like `prterun-host-1234@1` or a UUID).
fn file_safe(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect()
}

/// The private file of a one-host job of `launcher` with `world_size` ranks, read through
/// `lookup`; `None` when the job is not known to be one-host or the launcher gives no job id.
/// Reads only the environment (no file system).
pub fn one_host(lookup: &impl Fn(&str) -> Option<String>, launcher: Launcher, world_size: u32) -> Option<PathBuf> {
    let n = world_size.to_string();
    let (key, job) = match launcher {
        Launcher::OpenMpi => {
            (get(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE")? == n).then_some(())?;
            ("openmpi", get(lookup, "PMIX_NAMESPACE").or_else(|| get(lookup, "OMPI_MCA_ess_base_jobid"))?)
        }
        Launcher::Slurm => {
            let nodes =
                ["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"].iter().find_map(|v| get(lookup, v))?;
            (nodes == "1").then_some(())?;
            ("slurm", format!("{}.{}", get(lookup, "SLURM_JOB_ID")?, get(lookup, "SLURM_STEP_ID")?))
        }
        Launcher::Torchrun => {
            (get(lookup, "LOCAL_WORLD_SIZE")? == n).then_some(())?;
            let port = get(lookup, "MASTER_PORT").unwrap_or_default();
            ("torchrun", format!("{}-{port}", get(lookup, "TORCHELASTIC_RUN_ID")?))
        }
        Launcher::Explicit | Launcher::Single => return None,
    };
    // XDG_RUNTIME_DIR only when it names an existing directory (containers and su sessions
    // often export one that does not exist): else TMPDIR.
    let dir = match get(lookup, "XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_dir()) {
        Some(d) => Path::new(&d).join("dropcompute"),
        None => {
            let tmp = get(lookup, "TMPDIR").unwrap_or_else(|| "/tmp".into());
            Path::new(&tmp).join(format!("dropcompute-rendezvous-{}", nix::unistd::getuid().as_raw()))
        }
    };
    Some(dir.join(format!("{key}-{}.rendezvous", file_safe(&job))))
}

fn file_err(path: &Path, why: impl Into<String>) -> RendezvousError {
    RendezvousError::LocalFile { path: path.to_path_buf(), why: why.into() }
}

/// Creates the private directory of `file` (mode 0700) or checks the existing one is this
/// user's and private.
fn private_dir(file: &Path) -> Result<&Path, RendezvousError> {
    let dir = file.parent().ok_or_else(|| file_err(file, "no parent directory"))?;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(file_err(dir, format!("create the private directory: {e}"))),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| file_err(dir, e.to_string()))?;
    let me = nix::unistd::getuid().as_raw();
    if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o077 != 0 {
        return Err(file_err(
            dir,
            format!(
                "not a private directory of user {me} (owner {}, mode {:o}): remove it or set XDG_RUNTIME_DIR",
                m.uid(),
                m.permissions().mode() & 0o7777
            ),
        ));
    }
    Ok(dir)
}

/// Rank 0's side: writes `addr` (its bound loopback address) and `secret` to `file` (0600,
/// renamed into place), creating the private directory. The returned guard removes the file,
/// and the directory when empty, when dropped.
///
/// # Errors
/// [`RendezvousError::LocalFile`] naming the directory or file and the OS error.
pub fn publish(file: &Path, addr: SocketAddr, secret: &JobSecret) -> Result<Published, RendezvousError> {
    let body = format!("{addr}\n{}\n{}\n", secret.to_hex(), std::process::id());
    // Another job's rank 0 may remove an empty directory between our create and our write.
    let mut last = None;
    for _ in 0..3 {
        let dir = private_dir(file)?;
        let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), file.file_name().unwrap_or_default().display()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(body.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, file));
        match written {
            Ok(()) => return Ok(Published(file.to_path_buf())),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                last = Some(e);
            }
        }
    }
    Err(file_err(file, format!("write: {}", last.map_or_else(String::new, |e| e.to_string()))))
}

/// Rank 0's published file; removed (with its directory when empty) on drop.
#[derive(Debug)]
pub struct Published(PathBuf);

impl Drop for Published {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir); // fails, as it should, while other jobs use it
        }
    }
}

/// What rank 0 published, when the file is complete, private and its writer alive.
fn read_published(file: &Path) -> Option<(SocketAddr, JobSecret)> {
    let m = std::fs::symlink_metadata(file).ok()?;
    if !m.is_file() || m.uid() != nix::unistd::getuid().as_raw() || m.permissions().mode() & 0o077 != 0 {
        return None;
    }
    let text = crate::input::read_to_string(file, crate::input::InputKind::Spec).ok()?;
    let mut lines = text.lines();
    let addr: SocketAddr = lines.next()?.parse().ok()?;
    let secret = JobSecret::from_hex(lines.next()?).ok()?;
    let pid: i32 = lines.next()?.parse().ok()?;
    let alive = !matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH));
    alive.then_some((addr, secret))
}

/// The other ranks' side: waits (polling every [`POLL`], at most `timeout`) for rank 0's file
/// and returns its address and secret.
///
/// # Errors
/// [`RendezvousError::LocalFile`] when `timeout` passes first (naming the file and rank 0);
/// [`RendezvousError::Interrupted`] when a stop signal arrives while waiting.
pub fn await_published(file: &Path, timeout: Duration) -> Result<(SocketAddr, JobSecret), RendezvousError> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(found) = read_published(file) {
            return Ok(found);
        }
        if let Some(s) = crate::signals::received() {
            return Err(RendezvousError::Interrupted { signal: s.name(), waiting_for: file.display().to_string() });
        }
        if Instant::now() >= end {
            return Err(file_err(file, format!("rank 0 did not publish its address within {timeout:?}")));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| v.iter().find(|(n, _)| n == k).map(|(_, x)| x.clone())
    }

    #[test]
    fn one_host_needs_every_rank_local_and_a_job_id_per_launcher() {
        let t = [("TMPDIR", "/t")];
        type Row = (Launcher, Vec<(&'static str, &'static str)>, u32, Option<&'static str>);
        let rows: [Row; 9] = [
            (
                Launcher::OpenMpi,
                vec![("OMPI_COMM_WORLD_LOCAL_SIZE", "4"), ("PMIX_NAMESPACE", "prterun-h-1@1")],
                4,
                Some("openmpi-prterun-h-1_1"),
            ),
            (
                Launcher::OpenMpi,
                vec![("OMPI_COMM_WORLD_LOCAL_SIZE", "4"), ("OMPI_MCA_ess_base_jobid", "77")],
                4,
                Some("openmpi-77"),
            ),
            (Launcher::OpenMpi, vec![("OMPI_COMM_WORLD_LOCAL_SIZE", "2"), ("PMIX_NAMESPACE", "9")], 4, None),
            (Launcher::OpenMpi, vec![("OMPI_COMM_WORLD_LOCAL_SIZE", "4")], 4, None),
            (
                Launcher::Slurm,
                vec![("SLURM_NNODES", "1"), ("SLURM_JOB_ID", "5"), ("SLURM_STEP_ID", "0")],
                4,
                Some("slurm-5.0"),
            ),
            (Launcher::Slurm, vec![("SLURM_NNODES", "2"), ("SLURM_JOB_ID", "5"), ("SLURM_STEP_ID", "0")], 4, None),
            (
                Launcher::Torchrun,
                vec![("LOCAL_WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "u-1"), ("MASTER_PORT", "29500")],
                2,
                Some("torchrun-u-1-29500"),
            ),
            (Launcher::Torchrun, vec![("LOCAL_WORLD_SIZE", "1"), ("TORCHELASTIC_RUN_ID", "u-1")], 2, None),
            (Launcher::Single, vec![], 1, None),
        ];
        for (launcher, vars, n, want) in rows {
            let all: Vec<(&str, &str)> = vars.iter().copied().chain(t).collect();
            let got = one_host(&env(&all), launcher, n);
            let want = want.map(|w| {
                PathBuf::from(format!("/t/dropcompute-rendezvous-{}", nix::unistd::getuid().as_raw()))
                    .join(format!("{w}.rendezvous"))
            });
            assert_eq!(got, want, "{launcher:?} {vars:?} n={n}");
        }
        let xdg = |dir: &'static str| {
            one_host(
                &env(&[("XDG_RUNTIME_DIR", dir), ("LOCAL_WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "r")]),
                Launcher::Torchrun,
                2,
            )
        };
        assert_eq!(xdg("/"), Some(PathBuf::from("/dropcompute/torchrun-r-.rendezvous")));
        // An XDG_RUNTIME_DIR that does not exist: TMPDIR's (here unset: /tmp) directory.
        let uid = nix::unistd::getuid().as_raw();
        assert_eq!(
            xdg("/no/such/run/user/1"),
            Some(PathBuf::from(format!("/tmp/dropcompute-rendezvous-{uid}/torchrun-r-.rendezvous")))
        );
    }

    #[test]
    fn a_published_file_is_private_read_back_and_removed_with_its_directory() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("private").join("j.rendezvous");
        let secret = JobSecret::random();
        let addr: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let guard = publish(&file, addr, &secret).unwrap();
        let dir_mode = std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        let file_mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!((dir_mode, file_mode), (0o700, 0o600));
        let (a, s) = await_published(&file, Duration::from_secs(5)).unwrap();
        assert_eq!((a, s.to_hex()), (addr, secret.to_hex()));
        drop(guard);
        assert!(!file.parent().unwrap().exists(), "file and empty directory removed");

        // A file left by a dead writer is ignored: the wait times out naming the file.
        std::fs::create_dir(file.parent().unwrap()).unwrap();
        std::fs::set_permissions(file.parent().unwrap(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let dead = format!("{addr}\n{}\n{}\n", secret.to_hex(), i32::MAX);
        std::fs::write(&file, dead).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = await_published(&file, Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("j.rendezvous") && e.to_string().contains("did not publish"), "{e}");

        // A directory others can read is refused, naming it.
        std::fs::set_permissions(file.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = publish(&file, addr, &secret).unwrap_err();
        assert!(e.to_string().contains("not a private directory"), "{e}");
    }
}
