//! Test support: hermetic processes, directories, ports and readiness waits, so a test's
//! verdict does not depend on the calling shell, the machine's file system or its timing.
//!
//! - [`dropcompute`] / [`test_child`]: a `Command` for the product binary or for the running
//!   test executable with every variable the product reads ([`PRODUCT_VARS`],
//!   [`PRODUCT_PREFIXES`]) removed; the test adds back only what it sets (`.env(k, v)`).
//! - [`scrub_process_env`]: the same for the test process itself (in-process tests that reach
//!   `MockConfig::from_env`, `Device::acquire_any`, `Bootstrap::from_env`...).
//! - [`temp_dir`]: a fresh private directory removed on drop (crate `tempfile`).
//! - [`missing_path`]: a path guaranteed not to exist (inside a fresh temporary directory),
//!   instead of `/nonexistent`, which is the home of `nobody` on some systems.
//! - [`listener`]: a socket bound to port 0 and kept open, instead of reserve-release-rebind.
//! - [`wait_for_line`] / [`wait_for_file`]: readiness with a deadline, instead of fixed sleeps.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Every variable the product (root crate, habana-mock, habana-sys) or the test harness's own
/// child protocol reads, by exact name. Found with
/// `grep -rn 'env::var\|var_os\|ENV_' src habana-mock/src habana-sys/src` (constants
/// `ENV_BACKEND`, `ENV_CONFIG`, `ENV_DEVICES`, `ENV_TIMEOUT_MS`,
/// `ENV_VERSION`, `ENV_LOCK_DIR`, `ENV_COMM_ID`, `ENV_LIBRARY`; the launcher table in
/// `core/src/hccl/bootstrap.rs`; `core/src/synapse/runtime.rs` and `src/cli/info.rs` for the module
/// pinning; `RUST_LOG` through `EnvFilter::try_from_default_env` in `src/cli/mod.rs`).
/// The names under [`PRODUCT_PREFIXES`] are listed too so the list documents them; any other
/// variable under those prefixes is removed as well.
/// `tests/environment_table.rs` keeps this list equal to the environment table
/// (`dropcompute::environment::table`, less `TMPDIR`, which the tests' own processes need).
pub const PRODUCT_VARS: &[&str] = &[
    // Root crate.
    "DROPCOMPUTE_BACKEND",
    "DROPCOMPUTE_TEST_SIGKILL_AT",
    "DROPCOMPUTE_LAUNCHER",
    "DROPCOMPUTE_RENDEZVOUS",
    "DROPCOMPUTE_JOB_SECRET",
    "RUST_LOG",
    // Core: the input caps (core/src/input.rs).
    "DROPCOMPUTE_MAX_DATA_BYTES",
    "DROPCOMPUTE_MAX_PARAMS_BYTES",
    "DROPCOMPUTE_MAX_TRACE_BYTES",
    "DROPCOMPUTE_MAX_CHECKPOINT_BYTES",
    "DROPCOMPUTE_MAX_SPEC_BYTES",
    "DROPCOMPUTE_MAX_SYSTEM_BYTES",
    "DROPCOMPUTE_MAX_LINE_BYTES",
    // habana-sys.
    "DROPCOMPUTE_SYNAPSE_LIB",
    // habana-mock.
    "DROPCOMPUTE_MOCK_CONFIG",
    "DROPCOMPUTE_MOCK_DEVICES",
    "DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS",
    "DROPCOMPUTE_MOCK_VERSION",
    "DROPCOMPUTE_MOCK_LOCK_DIR",
    "HCCL_COMM_ID",
    // Device pinning.
    "HLS_MODULE_ID",
    "HABANA_VISIBLE_MODULES",
    // Launchers: torchrun, Open MPI, Slurm.
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "TORCHELASTIC_RUN_ID",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "TORCHELASTIC_USE_AGENT_STORE",
    "XDG_RUNTIME_DIR",
];

/// Prefixes of variable families the product or its launchers use (MPI's PMI, Slurm, Open MPI,
/// HCCL, torchrun's agent, the product's own): every variable starting with one of them is
/// removed too (the one-host rendezvous's job ids and node counts are also rows of the
/// environment table, listed above).
pub const PRODUCT_PREFIXES: &[&str] = &["DROPCOMPUTE_", "HCCL_", "OMPI_", "SLURM_", "PMI_", "PMIX_", "TORCHELASTIC_"];

/// Prefix of the test files' own child-process protocol (`DC_FAULT_CHILD`, `DC_HCCL_CHILD`,
/// `DC_RANK`, `DC_ID`...): removed from [`dropcompute`] / [`test_child`] commands (a stray
/// value would turn a test binary into a child), never from the test process itself.
pub const TEST_PROTOCOL_PREFIX: &str = "DC_";

/// Set by [`test_child`] on the child: [`scrub_process_env`] then keeps the environment the
/// parent test gave the child.
pub const CHILD_MARK: &str = "DC_HERMETIC_CHILD";

/// Whether `name` is one the product may read ([`PRODUCT_VARS`] or under [`PRODUCT_PREFIXES`]).
pub fn is_product_var(name: &str) -> bool {
    PRODUCT_VARS.contains(&name) || PRODUCT_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// [`PRODUCT_VARS`] plus every variable of this process's environment that is a product
/// variable or (with `protocol`) starts with [`TEST_PROTOCOL_PREFIX`].
fn product_vars_to_clear(protocol: bool) -> Vec<String> {
    let mut v: Vec<String> = PRODUCT_VARS.iter().map(|s| s.to_string()).collect();
    for (k, _) in std::env::vars_os() {
        let clear = |k: &&str| is_product_var(k) || (protocol && k.starts_with(TEST_PROTOCOL_PREFIX));
        if let Some(k) = k.to_str().filter(clear)
            && !v.iter().any(|x| x == k)
        {
            v.push(k.to_string());
        }
    }
    v
}

/// Removes every product variable and test-protocol variable from `cmd`'s environment (the
/// rest, e.g. `PATH`, `HOME`, `CARGO_*`, is inherited). Variables set on `cmd` afterwards are
/// kept.
pub fn clear_product_env(cmd: &mut Command) -> &mut Command {
    for k in product_vars_to_clear(true) {
        cmd.env_remove(k);
    }
    cmd
}

/// A `Command` for the `dropcompute` binary under test with the product's variables cleared.
pub fn dropcompute() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dropcompute"));
    clear_product_env(&mut c);
    c
}

/// A `Command` re-running the current test executable (a child role of the test file) with
/// the product's variables cleared, marked with [`CHILD_MARK`].
pub fn test_child() -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current test executable"));
    clear_product_env(&mut c);
    c.env(CHILD_MARK, "1");
    c
}

/// Whether this process is a child started by [`test_child`] (its environment, product
/// variables included, was chosen by the parent test).
pub fn is_test_child() -> bool {
    std::env::var_os(CHILD_MARK).is_some()
}

/// Removes every product variable from this test process's environment, once per process
/// (later calls wait for the first to finish, then return). Call it at the start of every
/// in-process test that reaches code reading the environment, before any thread of the test
/// reads it. Tests that need a variable set it themselves afterwards (serialized). In a child
/// started by [`test_child`] it does nothing: the parent already chose that environment.
pub fn scrub_process_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if is_test_child() {
            return;
        }
        for k in product_vars_to_clear(false) {
            // SAFETY: std's environment accessors take one process-wide lock; the product and
            // the mock read the environment only through them (no C getenv in this process).
            unsafe { std::env::remove_var(k) };
        }
    });
}

/// A fresh private directory under the system temporary directory, named
/// `dropcompute-<tag>-XXXXXX`, removed (with its contents) when the returned value drops.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("dropcompute-{tag}-")).tempdir().expect("create temporary directory")
}

/// A path that does not exist: `<fresh temporary directory>/missing/<name>`. Keep the returned
/// directory alive while the path is used.
pub fn missing_path(name: &str) -> (tempfile::TempDir, PathBuf) {
    let d = temp_dir("missing");
    let p = d.path().join("missing").join(name);
    assert!(!p.exists());
    (d, p)
}

/// A listener on 127.0.0.1, port chosen by the kernel, kept open (hand it over; never close it
/// and bind its port again: another process can take the port in between).
pub fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
}

/// Reads `from` line by line on a thread until a line satisfies `ready`, or `from` ends, or
/// `deadline` passes (a hang guard, not a timing assertion: pick it generously). Returns the
/// matching line, or `Err` with everything read so far. The reader thread keeps draining `from`
/// after the match, so the child never blocks on a full pipe; `rest` receives those lines.
pub fn wait_for_line<R: Read + Send + 'static>(
    from: R,
    ready: impl Fn(&str) -> bool,
    deadline: Duration,
) -> (Result<String, String>, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let end = Instant::now() + deadline;
    let mut seen = String::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if ready(&line) => return (Ok(line), rx),
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return (Err(format!("no ready line within {deadline:?}; read:\n{seen}")), rx);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return (Err(format!("stream ended before a ready line; read:\n{seen}")), rx);
            }
        }
    }
}

/// Polls (every 10 ms) until `found()` returns `Some`, or `deadline` passes (a hang guard).
pub fn wait_until<T>(deadline: Duration, mut found: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + deadline;
    loop {
        if let Some(t) = found() {
            return Some(t);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until a directory entry of `dir` satisfies `matches` (the file was created), or
/// `deadline` passes; returns its path.
pub fn wait_for_file(dir: &Path, matches: impl Fn(&str) -> bool, deadline: Duration) -> Option<PathBuf> {
    wait_until(deadline, || {
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&matches))
    })
}

/// Runs `cmd` to completion and returns its output like `Command::output` (stdout and stderr
/// piped and drained on threads), but kills it and panics with its stderr if it still runs
/// after `deadline` (a hang guard, not a timing assertion: pick it generously).
pub fn output_within(cmd: &mut Command, deadline: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let status = wait_until(deadline, || child.try_wait().expect("wait for child"));
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        let err = err.join().unwrap_or_default();
        panic!("{cmd:?} still running after {deadline:?} (hang guard); stderr:\n{}", String::from_utf8_lossy(&err));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// A loopback address whose port was free a moment ago: bound as port 0, then released. Only
/// for APIs under test that take an address and bind or connect themselves (a `TcpListener`
/// cannot be handed to them); pair it with [`retry_on_fresh_port`], since another process can
/// take the port between the release and the API's own bind.
pub fn released_port() -> std::net::SocketAddr {
    listener().local_addr().expect("local address")
}

/// Runs `attempt` on a fresh [`released_port`] until `raced` says the result was not caused by
/// another process taking the port, at most 5 times; returns the last result (assert on it:
/// a real failure stays a failure).
pub fn retry_on_fresh_port<T>(mut attempt: impl FnMut(std::net::SocketAddr) -> T, raced: impl Fn(&T) -> bool) -> T {
    let mut last = attempt(released_port());
    for _ in 1..5 {
        if !raced(&last) {
            break;
        }
        last = attempt(released_port());
    }
    last
}

/// The variables `launcher` ("torchrun", "openmpi", anything else: Slurm) sets for `rank` of
/// `n` on one node, plus the rendezvous at `addr` and a job secret.
pub fn launcher_env(launcher: &str, rank: u32, n: u32, addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let (r, size, local) = match launcher {
        "torchrun" => ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        "openmpi" => ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        _ => ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    };
    vec![
        (r.into(), rank.to_string()),
        (size.into(), n.to_string()),
        (local.into(), rank.to_string()),
        ("MASTER_ADDR".into(), addr.ip().to_string()),
        ("MASTER_PORT".into(), addr.port().to_string()),
        ("DROPCOMPUTE_JOB_SECRET".into(), "00112233445566778899aabbccddeeff".into()),
    ]
}

/// Runs `n` rank processes of `dropcompute train --launch env ARGS` under `launcher`'s
/// variables ([`launcher_env`]), rank r writing `--out out/rank-r`, on a fresh rendezvous port
/// (retried when another process took it); returns their outputs in rank order.
pub fn train_env_ranks<S: AsRef<std::ffi::OsStr>>(launcher: &str, n: u32, args: &[S], out: &Path) -> Vec<Output> {
    retry_on_fresh_port(
        |addr| {
            let kids: Vec<_> = (0..n)
                .map(|r| {
                    dropcompute()
                        .args(["train", "--launch", "env"])
                        .args(args)
                        .arg("--out")
                        .arg(out.join(format!("rank-{r}")))
                        .envs(launcher_env(launcher, r, n, addr))
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped())
                        .spawn()
                        .expect("spawn a rank process")
                })
                .collect();
            kids.into_iter().map(|k| k.wait_with_output().expect("rank process output")).collect::<Vec<_>>()
        },
        |outs| outs.iter().any(|o| String::from_utf8_lossy(&o.stderr).contains("in use")),
    )
}

/// Sorted checkpoint file names of ranks `0..ranks` under `ck` (`ck/rank-R/`; none: empty).
pub fn checkpoints(ck: &Path, ranks: u32) -> Vec<Vec<String>> {
    (0..ranks)
        .map(|r| {
            let mut v: Vec<String> = std::fs::read_dir(ck.join(format!("rank-{r}")))
                .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            v.sort();
            v
        })
        .collect()
}

/// Whether `pid` has a handler for signal `sig` installed (`SigCgt` of `/proc/pid/status`).
pub fn catches(pid: u32, sig: u32) -> bool {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    st.lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}
