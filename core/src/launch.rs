//! One way to run N ranks: as threads of this process, as child processes of this process on
//! loopback, or as one rank of a job started by an external launcher (mpirun, Slurm,
//! torchrun). Used by `train` (`train::run`), `bench allreduce` and the tests.
//!
//! Owns: [`Launch`], the one dispatcher [`dispatch`] (over the three modes), the thread driver
//! [`threads`], the process driver [`processes`], the
//! child side ([`ChildSpec`], read by the hidden `rank-process` subcommand), and [`Join`] (how
//! a rank joins the communicator in each mode), and the one feasibility check of ranks against
//! devices ([`check_devices`], [`Infeasible`]: it only counts them). Must not touch: what a rank
//! does (the caller's closure or program), devices beyond counting them (the caller acquires its
//! own) or argv filtering: a child never re-parses the parent's command line.
//!
//! Process mode, the whole hidden mechanism: the parent writes one JSON [`ChildSpec`] per rank
//! (program name, rank, world size, the unique id of the communicator whose coordinator lives
//! in the parent, the parent's validated configuration, the result path) into a private
//! temporary directory and starts `<current exe> rank-process <spec file>` ([`CHILD_SUBCOMMAND`]).
//! The child dispatches on [`ChildSpec::program`], runs its rank and writes its result as JSON
//! to [`ChildSpec::result`]; stdout is discarded, stderr kept for the error message.
//!
//! Supervision: the parent watches its rank processes. Once one fails, or once every one still
//! running is stopped (SIGSTOP) while another has ended, the ones still running
//! [`SUPERVISION_GRACE`] later are SIGKILLed and named on stderr (a stopped or hung rank
//! otherwise kept the parent waiting forever after its peers' collectives had timed out).
//!
//! Lifetime: a child ends with its parent. [`bind_to_parent`] (the first thing a rank process
//! does) asks the kernel for SIGKILL when the parent thread that spawned it exits
//! (`PR_SET_PDEATHSIG`, Linux) and exits at once if the parent is already gone, so `kill -9` of
//! the parent leaves no rank training. A stop signal the parent receives (SIGINT, SIGTERM,
//! SIGHUP: `crate::signals`) is forwarded to every child, which stops at the next step like a
//! thread rank. A rank of [`Launch::Env`] under a launcher ends with it too
//! ([`watch_launcher`]: re-parented, it stops as on SIGTERM, and exits after
//! [`LAUNCHER_GONE_GRACE`]). The temporary directory is removed when [`processes`] returns; one left by a
//! parent that was SIGKILLed (it holds an `owner.pid` file naming a process that no longer
//! exists) is removed by the next [`processes`] call of any `dropcompute` using the same
//! temporary directory.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::hccl::bootstrap::{Bootstrap, ConfigError, Launcher};
use crate::hccl::{Comm, CommOptions, HcclError, UniqueId};
use crate::synapse::Device;

/// The hidden subcommand a rank process is started with: `dropcompute rank-process SPEC`.
pub const CHILD_SUBCOMMAND: &str = "rank-process";

/// How long a launcher rank waits for the rendezvous of [`Join::Env`].
pub const ENV_JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// How the ranks of a job are started. Command-line names (`--launch` of `train` and
/// `bench allreduce`): `threads`, `processes`, `env`; JSON names: `"Threads"`, `"Processes"`,
/// `"Env"` (serde's default, kept for specs written by earlier builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Launch {
    /// One thread per rank in this process ([`threads`]).
    #[cfg_attr(feature = "clap", value(help = "One thread per rank in this process"))]
    Threads,
    /// One child process per rank, spawned by this process ([`processes`]).
    #[cfg_attr(feature = "clap", value(help = "One child process per rank, spawned by this process"))]
    Processes,
    /// This process is one rank; rank and world size come from the launcher's environment
    /// ([`Join::from_env`]).
    #[cfg_attr(
        feature = "clap",
        value(
            help = "This process is one rank of a job started by an external launcher (rank and world size from the environment)"
        )
    )]
    Env,
}

/// Why ranks could not be started or finished (the rank's own errors are the caller's type).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A rank thread panicked.
    #[error("rank {rank}: thread panicked")]
    Panicked {
        /// Rank.
        rank: u32,
    },
    /// A rank process failed or left no readable result.
    #[error("rank {rank} process: {why}")]
    Child {
        /// Rank.
        rank: u32,
        /// Its exit code (`None`: killed by a signal, or exited 0 without a readable result).
        code: Option<i32>,
        /// Exit status and the tail of its stderr, or why its result is unreadable.
        why: String,
    },
    /// File or process I/O (spec and result files, spawning, waiting).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A rank-process spec that cannot be written or read (file and reason).
    #[error("rank-process spec {}: {why}", path.display())]
    Spec {
        /// The spec file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A spec whose content does not fit (configuration of another program, malformed unique
    /// id, unserializable result), naming the rank.
    #[error("rank {rank} process spec: {why}")]
    BadSpec {
        /// Rank.
        rank: u32,
        /// What does not fit.
        why: String,
    },
    /// The launcher environment of [`Launch::Env`].
    #[error(transparent)]
    Bootstrap(#[from] ConfigError),
    /// A spec or result file was refused by the bounded reader (`crate::input`, kind launch
    /// spec) or could not be read.
    #[error("{0}")]
    Input(#[from] crate::input::InputError),
}

/// How one rank joins the communicator of its job.
// One `Join` per rank, built once: the 1 KiB unique id inline costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Join {
    /// Through a unique id created by the parent ([`Launch::Threads`], [`Launch::Processes`]).
    UniqueId {
        /// The id (its coordinator lives in the process that created it).
        id: UniqueId,
        /// This rank, `< world_size`.
        rank: u32,
        /// Number of ranks.
        world_size: u32,
    },
    /// Through the launcher's environment ([`Launch::Env`]).
    Env(Bootstrap),
}

impl Join {
    /// The launcher environment's join ([`Bootstrap::from_env`]).
    ///
    /// # Errors
    /// [`LaunchError::Bootstrap`] naming the variable and value that are missing or invalid.
    pub fn from_env() -> Result<Self, LaunchError> {
        Ok(Self::Env(Bootstrap::from_env()?))
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        match self {
            Self::UniqueId { rank, .. } => *rank,
            Self::Env(b) => b.rank,
        }
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        match self {
            Self::UniqueId { world_size, .. } => *world_size,
            Self::Env(b) => b.world_size,
        }
    }

    /// Joins the communicator on `device` (`hcclCommInitRank`, or the launcher's rendezvous
    /// with [`ENV_JOIN_TIMEOUT`]).
    ///
    /// # Errors
    /// The collective layer's error (bad id, timeout, rendezvous failure).
    pub fn comm(&self, device: &Device, opts: CommOptions) -> Result<Comm, HcclError> {
        match self {
            Self::UniqueId { id, rank, world_size } => Comm::init_rank(device, *world_size, id, *rank, opts),
            Self::Env(b) => crate::hccl::join(device, b, ENV_JOIN_TIMEOUT, opts),
        }
    }
}

/// A job that cannot run on the devices this host has: refused before any rank acquires a
/// device or opens a socket (exit 2). Before this check such a job waited for the HCCL init
/// timeout (about 30 s) and ended with a collective error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Infeasible {
    /// Fewer devices than the ranks that need one on this host.
    #[error(
        "{ranks} ranks on this host but only {devices} devices (counted by {counted_by}): lower --ranks \
         or give the host more devices"
    )]
    TooFewDevices {
        /// Ranks of this host that each acquire a device (threads and processes: the world
        /// size; `--launch env`: the launcher's local world size).
        ranks: u32,
        /// Devices the runtime reports (`synDeviceGetCount`).
        devices: u32,
        /// Where the count came from: the mock's variable that fixes it, or the library asked.
        counted_by: String,
    },
    /// A rank's buffers do not fit its device's free memory.
    #[error(
        "{what} needs {need} bytes of device memory per rank but the device has {free} free (synDeviceGetMemoryInfo): \
         lower {flag}"
    )]
    TooLittleMemory {
        /// What needs the memory (e.g. "the largest size of bench allreduce").
        what: String,
        /// Bytes needed per rank.
        need: u64,
        /// Bytes free on the device.
        free: u64,
        /// The flag that sizes it.
        flag: &'static str,
    },
    /// The runtime could not say how many devices it has.
    #[error("counting the devices (synDeviceGetCount): {0}")]
    Count(#[source] crate::synapse::Error),
}

/// The one feasibility check of ranks against devices, for every launch mode and backend:
/// `ranks_here` ranks of this host each acquire their own device of `rt`, so the runtime
/// (the in-process mock, the mock library, or a real libSynapse) is asked its device count
/// (`synDeviceGetCount`) before any rank starts. When `rt` is a CPU mock (in-process, or the
/// mock library: it exports `dcmock_configure`) the message names the variable that fixed
/// the count (`$DROPCOMPUTE_MOCK_CONFIG`'s `"devices"` or `$DROPCOMPUTE_MOCK_DEVICES`), else
/// the library asked.
///
/// # Errors
/// [`Infeasible::TooFewDevices`] naming the ranks, the devices and where the count came from;
/// [`Infeasible::Count`] when the runtime fails to answer.
pub fn check_devices(rt: &crate::synapse::Runtime, ranks_here: u32) -> Result<(), Infeasible> {
    let devices = rt.device_count().map_err(Infeasible::Count)?;
    if ranks_here <= devices {
        return Ok(());
    }
    let (origin, emulated) = match rt.api().origin() {
        habana_sys::ApiOrigin::InProcess(name) => (format!("the in-process {name}"), true),
        #[cfg(feature = "mock")]
        habana_sys::ApiOrigin::Library(p) => {
            (p.display().to_string(), crate::mock::MockControl::from_library(p).is_ok())
        }
        #[cfg(not(feature = "mock"))]
        habana_sys::ApiOrigin::Library(p) => (p.display().to_string(), false),
    };
    #[cfg(feature = "mock")]
    let fixed = emulated.then(crate::mock::MockConfig::devices_fixed_by).flatten();
    #[cfg(not(feature = "mock"))]
    let fixed: Option<String> = {
        let _ = emulated; // no emulator in this build
        None
    };
    let counted_by = match fixed {
        Some(var) => format!("{var}, for {origin}"),
        None => format!("synDeviceGetCount of {origin}"),
    };
    Err(Infeasible::TooFewDevices { ranks: ranks_here, devices, counted_by })
}

/// What the ranks of one [`dispatch`] returned.
#[derive(Debug)]
pub enum Ranks<R> {
    /// [`Launch::Threads`] and [`Launch::Processes`]: every rank's result, in rank order.
    All(Vec<R>),
    /// [`Launch::Env`]: this process's join (its rank, the world size and the launcher's
    /// bootstrap, read once) and its result.
    This {
        /// How this rank joined ([`Join::Env`]; boxed: a `Join` holds a 1 KiB unique id).
        join: Box<Join>,
        /// Its result.
        result: R,
    },
}

/// The one launch dispatcher of `train` and `bench allreduce`: runs `rank(join)` for every rank
/// as `mode` says. [`Launch::Threads`]: `n` scoped threads of this process joining the
/// communicator of `unique_id()`; [`Launch::Processes`]: `n` child processes running the rank
/// program `program` with `config` ([`processes`]; the child side calls its own rank function
/// from the hidden `rank-process` subcommand); [`Launch::Env`]: this process is the one rank the
/// launcher's environment names ([`Join::from_env`]). A panicked thread and a failed child
/// become the caller's error through `E: From<LaunchError>`.
///
/// # Errors
/// The outer error: `unique_id`'s, a bad launcher environment ([`LaunchError::Bootstrap`]), or
/// the process driver's (temporary directory, spec files, spawning). The ranks' own errors are
/// inside [`Ranks`].
pub fn dispatch<C, R, E>(
    mode: Launch,
    n: u32,
    unique_id: impl FnOnce() -> Result<UniqueId, E>,
    program: &str,
    config: &C,
    rank: impl Fn(&Join) -> Result<R, E> + Sync,
) -> Result<Ranks<Result<R, E>>, E>
where
    C: Serialize,
    R: Send + DeserializeOwned,
    E: Send + From<LaunchError>,
{
    match mode {
        Launch::Threads => {
            let id = unique_id()?;
            let results = threads(n, |r| rank(&Join::UniqueId { id, rank: r, world_size: n }));
            Ok(Ranks::All(results.into_iter().map(|r| r.map_err(E::from).and_then(|x| x)).collect()))
        }
        Launch::Processes => {
            let id = unique_id()?;
            let results = processes::<C, R>(program, n, &id, config).map_err(E::from)?;
            Ok(Ranks::All(results.into_iter().map(|r| r.map_err(E::from)).collect()))
        }
        Launch::Env => {
            let join = Join::from_env().map_err(E::from)?;
            if let Join::Env(b) = &join
                && matches!(b.launcher, Launcher::Torchrun | Launcher::OpenMpi | Launcher::Slurm)
            {
                watch_launcher(b.rank);
            }
            let result = rank(&join);
            Ok(Ranks::This { join: Box::new(join), result })
        }
    }
}

/// The ranks' results in rank order, or the error that caused the job's failure: the first
/// error (in rank order) that is not `secondary` (e.g. a thread rank's collective timeout,
/// which follows another rank's failure), else the first secondary one; the one rule of
/// `train` and `bench allreduce`. A failed rank process is never secondary: its error carries
/// its exit status and stderr (a survivor's names the lost peer and dumps its flight recorder).
///
/// # Errors
/// The root-cause error as described.
pub fn root_cause<R, E>(results: Vec<Result<R, E>>, secondary: impl Fn(&E) -> bool) -> Result<Vec<R>, E> {
    let mut first_secondary = None;
    let mut ok = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(e) if secondary(&e) => {
                first_secondary.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match first_secondary {
        Some(e) => Err(e),
        None => Ok(ok),
    }
}

/// Runs `f(rank)` for `rank` in `0..n`, each on its own scoped thread, and returns the results
/// indexed by rank (a panicking rank gives [`LaunchError::Panicked`]).
pub fn threads<R: Send>(n: u32, f: impl Fn(u32) -> R + Sync) -> Vec<Result<R, LaunchError>> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..n).map(|rank| s.spawn(move || f(rank))).collect();
        hs.into_iter().zip(0..n).map(|(h, rank)| h.join().map_err(|_| LaunchError::Panicked { rank })).collect()
    })
}

/// What a rank process is told (JSON, one file per rank; see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildSpec {
    /// Which rank program the child runs (e.g. `"train"`, `"bench-allreduce"`).
    pub program: String,
    /// This rank, `< world_size`.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// The parent's unique id in its text form (`UniqueId`'s `Display`, lower-case hex).
    pub unique_id: String,
    /// The parent's validated configuration of the program.
    pub config: serde_json::Value,
    /// Where the child writes its result (JSON).
    pub result: PathBuf,
    /// The parent's process id (0 in specs of earlier builds: not checked).
    #[serde(default)]
    pub parent_pid: u32,
}

/// Binds this rank process's lifetime to its parent: SIGKILL when the parent (the thread that
/// spawned it) exits (`prctl(PR_SET_PDEATHSIG)`); then, if the parent named in `spec` is
/// already gone (this process was re-parented), exits with status 137 (128 + SIGKILL) at
/// once. Call it before any work. A `prctl` failure is reported (warn) and the rank runs on.
pub fn bind_to_parent(spec: &ChildSpec) {
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        tracing::warn!(error = %e, "PR_SET_PDEATHSIG failed: this rank may outlive a killed parent");
    }
    if spec.parent_pid != 0 && nix::unistd::getppid().as_raw() as u32 != spec.parent_pid {
        crate::console::err(&format!("rank {}: parent process {} is gone; exiting", spec.rank, spec.parent_pid));
        std::process::exit(137);
    }
}

/// How long a rank of [`Launch::Env`] whose launcher died keeps running to stop at a step
/// boundary (as on SIGTERM) before it exits on its own (a rank blocked in a collective).
pub const LAUNCHER_GONE_GRACE: Duration = SUPERVISION_GRACE;

/// Ends a [`Launch::Env`] rank with its launcher (mpirun, torchrun's agent, slurmstepd: this
/// process's parent): a thread polls the parent process id every 100 ms; once this process is
/// re-parented (the launcher was SIGKILLed) it says so on stderr, records SIGTERM
/// (`crate::signals::raise`: the rank stops at the next step boundary, with its checkpoint,
/// exit 130) and, still running [`LAUNCHER_GONE_GRACE`] later, exits with status 137. Nothing
/// is watched when this process is already an orphan (parent pid 1).
pub fn watch_launcher(rank: u32) {
    let launcher = nix::unistd::getppid();
    if launcher.as_raw() <= 1 {
        return;
    }
    let watch = move || {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            if nix::unistd::getppid() != launcher {
                break;
            }
        }
        crate::console::err(&format!(
            "dropcompute: rank {rank}: its launcher (pid {launcher}) is gone; stopping as on SIGTERM"
        ));
        crate::signals::raise(crate::signals::StopSignal::Terminate);
        std::thread::sleep(LAUNCHER_GONE_GRACE);
        crate::console::err(&format!(
            "dropcompute: rank {rank}: still running {} s after its launcher (pid {launcher}) died; exiting",
            LAUNCHER_GONE_GRACE.as_secs()
        ));
        std::process::exit(137);
    };
    if let Err(e) = std::thread::Builder::new().name("dc-launcher-watch".into()).spawn(watch) {
        tracing::warn!(error = %e, "no launcher watch: this rank may outlive a killed launcher");
    }
}

impl ChildSpec {
    /// Reads a spec file written by [`processes`].
    ///
    /// # Errors
    /// [`LaunchError::Io`] when unreadable; [`LaunchError::Spec`] when it is not a spec.
    pub fn read(path: &Path) -> Result<Self, LaunchError> {
        let bytes = crate::input::read(path, crate::input::InputKind::Spec)?;
        // An array would be read into the spec's fields in order (serde's sequence form).
        habana_sys::require_json_object(&bytes)
            .map_err(|why| LaunchError::Spec { path: path.to_path_buf(), why: why.to_owned() })?;
        serde_json::from_slice(&bytes).map_err(|e| LaunchError::Spec { path: path.to_path_buf(), why: e.to_string() })
    }

    /// The program's configuration, typed.
    ///
    /// # Errors
    /// [`LaunchError::BadSpec`] when it does not deserialize as `C`.
    pub fn config<C: DeserializeOwned>(&self) -> Result<C, LaunchError> {
        serde_json::from_value(self.config.clone())
            .map_err(|e| LaunchError::BadSpec { rank: self.rank, why: format!("config of {:?}: {e}", self.program) })
    }

    /// How this rank joins the parent's communicator.
    ///
    /// # Errors
    /// [`LaunchError::BadSpec`] for a malformed unique id.
    pub fn join(&self) -> Result<Join, LaunchError> {
        let bad = |why: String| LaunchError::BadSpec { rank: self.rank, why };
        let id: UniqueId = self.unique_id.parse().map_err(|e| bad(format!("unique_id {:?}: {e}", self.unique_id)))?;
        Ok(Join::UniqueId { id, rank: self.rank, world_size: self.world_size })
    }

    /// Writes this rank's result to [`Self::result`].
    ///
    /// # Errors
    /// [`LaunchError::Io`] when the file cannot be written; [`LaunchError::BadSpec`] when `r`
    /// does not serialize.
    pub fn write_result<R: Serialize>(&self, r: &R) -> Result<(), LaunchError> {
        let json =
            serde_json::to_vec(r).map_err(|e| LaunchError::BadSpec { rank: self.rank, why: format!("result: {e}") })?;
        std::fs::write(&self.result, json)
            .map_err(|source| LaunchError::Io { what: format!("write {}", self.result.display()), source })
    }
}

/// Runs rank program `program` as `n` child processes of the current executable (see the
/// module doc), every child given `config` and joining `id`, and returns their results indexed
/// by rank.
///
/// # Errors
/// The outer error when the temporary directory, a spec file or a process cannot be created
/// (already-started children are waited for first); per rank, [`LaunchError::Child`] with its
/// exit status and stderr tail, or when its result does not deserialize as `R`.
pub fn processes<C: Serialize, R: DeserializeOwned>(
    program: &str,
    n: u32,
    id: &UniqueId,
    config: &C,
) -> Result<Vec<Result<R, LaunchError>>, LaunchError> {
    let exe =
        std::env::current_exe().map_err(|source| LaunchError::Io { what: "current executable".into(), source })?;
    let dir = TempDir::new(program)?;
    let config = serde_json::to_value(config)
        .map_err(|e| LaunchError::Spec { path: dir.path().to_path_buf(), why: format!("config: {e}") })?;
    let mut children = Vec::new();
    let mut spawn_err = None;
    for rank in 0..n {
        match spawn(&exe, dir.path(), program, rank, n, id, &config) {
            Ok(c) => children.push(c),
            Err(e) => {
                spawn_err = Some(e);
                break;
            }
        }
    }
    let statuses = wait_forwarding_signals(&mut children);
    let mut results = Vec::new();
    for ((rank, _, spec, err), status) in children.into_iter().zip(statuses) {
        results.push(status.and_then(|status| {
            if status.success() {
                let bytes = crate::input::read(&spec.result, crate::input::InputKind::Spec).map_err(|e| {
                    LaunchError::Child {
                        rank,
                        code: status.code(),
                        why: format!("no result in {}: {e}", spec.result.display()),
                    }
                })?;
                serde_json::from_slice(&bytes).map_err(|e| LaunchError::Child {
                    rank,
                    code: status.code(),
                    why: format!("bad result file: {e}"),
                })
            } else {
                let tail = crate::input::tail(&err, 64 << 10);
                let tail: Vec<&str> = tail.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                Err(LaunchError::Child {
                    rank,
                    code: status.code(),
                    why: format!("{status}; its stderr ends:\n    {}", tail.join("\n    ")),
                })
            }
        }));
    }
    match spawn_err {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

/// How long the parent of [`processes`] lets its remaining rank processes run once a rank has
/// failed (or once every rank still running is stopped, e.g. by SIGSTOP, while another has
/// ended): their peers' collectives fail within the collective timeout, so a rank still there
/// after that margin is hung or stopped; it is SIGKILLed and named (the job then ends within
/// the collective timeout plus this margin instead of never).
pub const SUPERVISION_GRACE: Duration = Duration::from_secs(10);

/// The scheduler state of process `pid` from `/proc/<pid>/stat` (`'R'`, `'S'`, `'T'` stopped,
/// `'t'` traced, `'Z'` zombie...), `None` where it cannot be read (not Linux, already reaped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits for every child, polling every 10 ms; a stop signal this process received
/// (`crate::signals`) is forwarded to every child still running, once per signal. Supervision:
/// once a child has failed, or once every child still running is stopped while another has
/// ended, the children still running [`SUPERVISION_GRACE`] later are SIGKILLed; why is said
/// on this process's stderr and appended to the child's stderr file (so its
/// [`LaunchError::Child`] names it).
fn wait_forwarding_signals(children: &mut [Spawned]) -> Vec<Result<std::process::ExitStatus, LaunchError>> {
    let mut done: Vec<Option<Result<std::process::ExitStatus, LaunchError>>> =
        (0..children.len()).map(|_| None).collect();
    let mut forwarded = None;
    // Since when, and why, the remaining children are on notice.
    let mut notice: Option<(std::time::Instant, String)> = None;
    loop {
        if let Some(s) = crate::signals::received()
            && forwarded != Some(s)
        {
            for (i, (_, child, _, _)) in children.iter().enumerate() {
                if done[i].is_none() {
                    crate::signals::forward(s, child.id());
                }
            }
            forwarded = Some(s);
        }
        for (i, (rank, child, _, _)) in children.iter_mut().enumerate() {
            if done[i].is_none() {
                match child.try_wait() {
                    Ok(Some(st)) => {
                        if !st.success() && notice.is_none() {
                            notice = Some((std::time::Instant::now(), format!("rank {rank} failed ({st})")));
                        }
                        done[i] = Some(Ok(st));
                    }
                    Ok(None) => {}
                    Err(source) => {
                        done[i] = Some(Err(LaunchError::Io { what: format!("wait for rank {rank}"), source }))
                    }
                }
            }
        }
        if done.iter().all(Option::is_some) {
            return done.into_iter().flatten().collect();
        }
        let running: Vec<usize> = (0..children.len()).filter(|&i| done[i].is_none()).collect();
        let stopped = |i: &usize| matches!(process_state(children[*i].1.id()), Some('T' | 't'));
        if notice.is_none() && running.len() < children.len() && running.iter().all(stopped) {
            notice = Some((std::time::Instant::now(), "every other rank ended".into()));
        }
        if let Some((since, why)) = &notice
            && since.elapsed() >= SUPERVISION_GRACE
        {
            for i in running {
                let (rank, child, _, err) = &mut children[i];
                let state = match process_state(child.id()) {
                    Some('T' | 't') => "stopped",
                    Some('D') => "in an uninterruptible wait",
                    _ => "still running",
                };
                let line = format!(
                    "dropcompute: rank {rank} process (pid {}) was {state} {} s after {why}: killed by the parent",
                    child.id(),
                    SUPERVISION_GRACE.as_secs()
                );
                eprintln!("{line}");
                let _ = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&*err)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()));
                let _ = child.kill();
            }
            notice = None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Name prefix of the temporary directories of [`processes`].
const TEMP_PREFIX: &str = "dropcompute-ranks-";
/// The file in such a directory naming the process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// A private directory of this process (`<temp>/dropcompute-ranks-<program>-<pid>-<k>`, with
/// an [`OWNER_FILE`]), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(program: &str) -> Result<Self, LaunchError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir();
        remove_orphans(&root);
        let p = root.join(format!("{TEMP_PREFIX}{program}-{}-{k}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let what = format!("create {}", p.display());
        std::fs::create_dir_all(&p).map_err(|source| LaunchError::Io { what: what.clone(), source })?;
        let this = Self(p);
        std::fs::write(this.0.join(OWNER_FILE), std::process::id().to_string())
            .map_err(|source| LaunchError::Io { what, source })?;
        Ok(this)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the directories of [`processes`] under `root` whose owner process no longer exists
/// (a parent killed by SIGKILL could not remove its own). A directory whose owner file is
/// missing, unreadable or names a live process is kept.
fn remove_orphans(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for e in entries.filter_map(Result::ok) {
        if !e.file_name().to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX)) {
            continue;
        }
        let owner = crate::input::read_to_string(&e.path().join(OWNER_FILE), crate::input::InputKind::Spec)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        let Some(pid) = owner.filter(|&p| p > 0) else { continue };
        let gone =
            matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH));
        if gone {
            tracing::debug!(dir = %e.path().display(), pid, "removing the directory of a dead launcher");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

type Spawned = (u32, std::process::Child, ChildSpec, PathBuf);

fn spawn(
    exe: &Path,
    dir: &Path,
    program: &str,
    rank: u32,
    n: u32,
    id: &UniqueId,
    config: &serde_json::Value,
) -> Result<Spawned, LaunchError> {
    let spec = ChildSpec {
        program: program.to_string(),
        rank,
        world_size: n,
        unique_id: id.to_string(),
        config: config.clone(),
        result: dir.join(format!("rank-{rank}.result.json")),
        parent_pid: std::process::id(),
    };
    let path = dir.join(format!("rank-{rank}.spec.json"));
    let json = serde_json::to_vec(&spec).map_err(|e| LaunchError::Spec { path: path.clone(), why: e.to_string() })?;
    std::fs::write(&path, json)
        .map_err(|source| LaunchError::Io { what: format!("write {}", path.display()), source })?;
    let err = dir.join(format!("rank-{rank}.stderr"));
    let stderr = std::fs::File::create(&err)
        .map_err(|source| LaunchError::Io { what: format!("create {}", err.display()), source })?;
    let child = std::process::Command::new(exe)
        .arg(CHILD_SUBCOMMAND)
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|source| LaunchError::Io { what: format!("spawn rank {rank}"), source })?;
    Ok((rank, child, spec, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_return_results_by_rank_and_name_a_panicking_rank() {
        let r = threads(4, |rank| {
            assert_ne!(rank, 2, "rank 2 fails");
            rank * 10
        });
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].as_ref().ok(), Some(&0));
        assert_eq!(r[3].as_ref().ok(), Some(&30));
        assert!(matches!(r[2], Err(LaunchError::Panicked { rank: 2 })), "{:?}", r[2]);
    }

    #[test]
    fn a_spec_round_trips_its_config_and_unique_id() {
        let dir = TempDir::new("spec-test").unwrap();
        let id = UniqueId::from_bytes(&[7u8; 32]).unwrap();
        let spec = ChildSpec {
            program: "p".into(),
            rank: 1,
            world_size: 3,
            unique_id: id.to_string(),
            config: serde_json::json!({"a": 1, "b": [2.5, null]}),
            result: dir.path().join("r.json"),
            parent_pid: 0,
        };
        let path = dir.path().join("s.json");
        std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
        let back = ChildSpec::read(&path).unwrap();
        assert_eq!(back, spec);
        assert_eq!(back.config::<serde_json::Value>().unwrap()["b"][0], 2.5);
        match back.join().unwrap() {
            Join::UniqueId { id: j, rank, world_size } => {
                assert_eq!((j.to_bytes(), rank, world_size), (id.to_bytes(), 1, 3));
            }
            other => panic!("{other:?}"),
        }
        let bad = ChildSpec { unique_id: "zz".into(), ..spec };
        assert!(matches!(bad.join(), Err(LaunchError::BadSpec { rank: 1, .. })));
        let err = back.config::<Vec<u32>>().unwrap_err();
        assert!(matches!(err, LaunchError::BadSpec { rank: 1, .. }), "{err}");
        // A spec file handed over as an array (serde reads it into the fields in order) or a
        // scalar is refused as not an object, naming the file.
        let fields = serde_json::to_value(&back).unwrap();
        let order = ["program", "rank", "world_size", "unique_id", "config", "result", "parent_pid"];
        let as_array = serde_json::Value::Array(order.iter().map(|k| fields[*k].clone()).collect());
        for text in [serde_json::to_string(&as_array).unwrap(), "[]".into(), "3".into()] {
            std::fs::write(&path, &text).unwrap();
            match ChildSpec::read(&path) {
                Err(LaunchError::Spec { path: p, why }) => {
                    assert_eq!((p, why.as_str()), (path.clone(), habana_sys::NOT_A_JSON_OBJECT), "{text}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
