//! Every launch mode x every fault, as real processes (issue 24, "a hostile world"): launch
//! modes `threads`, `processes`, and `env` under the real launchers `mpirun` (Open MPI) and
//! `python -m torch.distributed.run` on one host (no address or secret given: the one-host
//! rendezvous, `dropcompute::hccl::local`), each running `train` and `bench allreduce` with 3
//! ranks, x {a clean run, a rank SIGKILLed, a rank SIGSTOPped, the parent SIGTERMed, the
//! parent SIGKILLed} ("parent": the `dropcompute` process of threads and processes, the
//! launcher of env).
//!
//! Each row asserts: the exit code (0 clean; 130 for a SIGTERMed parent of threads and
//! processes, and every env rank interrupted alike; not 0 and not a panic's 101 for a dead or
//! stopped rank), a message (naming rank 1, the one faulted, or the stop), no panic or
//! backtrace, completion within a bound (the collective timeout, 2 s here, plus the
//! supervision grace plus a margin), no process of the row left (every process carrying the
//! row's private `TMPDIR` ends, the stopped one included), and no lost output (`train --out` is
//! either complete, with its `report.json`, or absent; a staging `.out.tmp-PID` is marked
//! incomplete by its name).
//!
//! Rows whose fault does not exist in a mode are listed as such: a thread rank cannot be
//! killed or stopped alone (the signal takes the whole process: that is the parent row).
//! `mpirun` or torch absent: the row prints `skipped: mpirun not installed` (or torch) and
//! passes; `.ci/run` installs both, so CI runs every row. The rows of one mode run in one test
//! function (cargo runs the modes in parallel; `train` and `bench` rows side by side); each
//! row's measured times are printed (`cargo test --test launch_faults -- --nocapture`).
//!
//! Measured (2026-12-02, two shared cores, the four modes in parallel): seconds from the fault
//! to the end of the top process (and of every process of the row, where later), train / bench:
//!
//! | mode | rank SIGKILL | rank SIGSTOP | parent SIGTERM | parent SIGKILL |
//! |---|---|---|---|---|
//! | threads | (no such fault) | (no such fault) | 0.18 / 0.05 | 0.02 / 0.11 |
//! | processes | 0.10 / 0.14 | 12.1 / 12.0-16.7 | 0.06-0.29 / 0.04 | 0.00 / 0.01 |
//! | mpirun | 0.04 / 0.05-0.10 | 2.06 / 2.1-8.1 | 1.16 / 1.10 | 0.01 (0.10) / 0.02 (1.1) |
//! | torchrun | 1.1-1.5 / 0.8-1.8 | 33.1-33.5 / 38.1-39.6 | 0.8-1.8 / 1.3-2.3 | 0.07 (0.21) / 0.14 (1.2) |
//!
//! A stopped rank: processes, the 2 s collective timeout + the parent's 10 s supervision grace;
//! mpirun, the collective timeout (its peers exit 5, mpirun SIGKILLs the rest); torchrun, its
//! agent's 30 s between SIGTERM and SIGKILL of a worker that does not end. The file takes about
//! 100-200 s (torchrun's rows; each torchrun start costs 2-5 s).
#![cfg(all(feature = "mock", target_os = "linux"))] // the CPU mock; /proc

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Ranks of every row.
const RANKS: u32 = 3;
/// The mock's collective timeout in every row (`DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS`).
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Margin over the collective timeout and the supervision grace (generous: two shared cores,
/// and the launchers' own kill escalation: torchrun waits up to 30 s between SIGTERM and
/// SIGKILL of a stopped worker).
const MARGIN: Duration = Duration::from_secs(40);
/// Readiness guard (a hang guard, not a timing assertion).
const READY: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Threads,
    Processes,
    Mpirun,
    Torchrun,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Program {
    Train,
    Bench,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Clean,
    RankKill,
    RankStop,
    ParentTerm,
    ParentKill,
}

const PROGRAMS: [Program; 2] = [Program::Train, Program::Bench];
const FAULTS: [Fault; 5] = [Fault::Clean, Fault::RankKill, Fault::RankStop, Fault::ParentTerm, Fault::ParentKill];

/// The venv's python with torch (ci/python_venv.sh), if present.
fn torch_python() -> Option<PathBuf> {
    let venv = std::env::var_os("DROPCOMPUTE_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/dropcompute-venv")))?;
    let py = venv.join("bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import torch.distributed.run"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(py)
}

fn mpirun_present() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Why `mode` cannot run here, if it cannot.
fn missing(mode: Mode) -> Option<&'static str> {
    match mode {
        Mode::Mpirun if !mpirun_present() => Some("mpirun not installed"),
        Mode::Torchrun if torch_python().is_none() => Some("torch not installed (ci/python_venv.sh)"),
        _ => None,
    }
}

/// The program's arguments: a long run (stopped by the fault), or a short one for `Clean`;
/// `train` writes `--out DIR/out` and its stop checkpoints to `DIR/ck`.
fn program_args(p: Program, fault: Fault, dir: &Path) -> Vec<String> {
    let out = dir;
    let v: Vec<&str> = match (p, fault) {
        (Program::Train, Fault::Clean) => {
            vec!["train", "--no-compare", "--steps", "4", "--threshold", "off", "--time-mode", "virtual"]
        }
        (Program::Train, _) => {
            vec!["train", "--no-compare", "--steps", "1000000", "--threshold", "off", "--base-latency-ms", "1"]
        }
        (Program::Bench, Fault::Clean) => vec!["bench", "allreduce", "--max-bytes", "4096", "--iters", "5"],
        (Program::Bench, _) => vec!["bench", "allreduce", "--max-bytes", "4096", "--iters", "100000000"],
    };
    let mut v: Vec<String> = v.into_iter().map(String::from).collect();
    if p == Program::Train {
        v.extend(["--out".to_string(), out.join("out").display().to_string()]);
        v.extend(["--checkpoint-dir".to_string(), out.join("ck").display().to_string()]);
    }
    v
}

/// The row's command; every process of the row inherits `TMPDIR=tmp` (the row's marker).
fn command(mode: Mode, p: Program, fault: Fault, tmp: &Path) -> Command {
    let exe = env!("CARGO_BIN_EXE_dropcompute");
    let mut args = program_args(p, fault, tmp);
    let n = RANKS.to_string();
    let mut c = match mode {
        Mode::Threads | Mode::Processes => {
            let launch = if mode == Mode::Threads { "threads" } else { "processes" };
            let at = if p == Program::Train { 1 } else { 2 };
            args.splice(at..at, ["--launch".to_string(), launch.to_string(), "--ranks".to_string(), n]);
            let mut c = hermetic::dropcompute();
            c.args(&args);
            c
        }
        Mode::Mpirun => {
            let mut c = Command::new("mpirun");
            hermetic::clear_product_env(&mut c);
            c.args(["--oversubscribe", "-np", &n, exe]).args(&args).args(["--launch", "env"]);
            // Open MPI refuses root without these (CI containers run as root).
            c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            c
        }
        Mode::Torchrun => {
            let mut c = Command::new(torch_python().expect("checked by missing()"));
            hermetic::clear_product_env(&mut c);
            c.args(["-m", "torch.distributed.run", "--nproc-per-node", &n, "--no-python", exe])
                .args(&args)
                .args(["--launch", "env"]);
            c
        }
    };
    c.env("TMPDIR", tmp).env("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", COLLECTIVE_TIMEOUT.as_millis().to_string());
    c.current_dir(tmp).stdin(Stdio::null());
    c
}

/// A live (not zombie) process of ours: pid, parent, command line, environment.
struct Proc {
    pid: u32,
    ppid: u32,
    cmdline: String,
    environ: Vec<String>,
}

fn procs() -> Vec<Proc> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&"Z") {
            continue;
        }
        let Some(ppid) = f.get(1).and_then(|p| p.parse().ok()) else { continue };
        let split = |b: Vec<u8>| -> Vec<String> {
            b.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
        };
        let cmdline = split(std::fs::read(e.path().join("cmdline")).unwrap_or_default()).join(" ");
        let environ = split(std::fs::read(e.path().join("environ")).unwrap_or_default());
        v.push(Proc { pid, ppid, cmdline, environ });
    }
    v
}

/// Every live process of the row (its `TMPDIR` is the row's private directory), the launcher
/// and the top process included.
fn row_procs(tmp: &Path) -> Vec<Proc> {
    let mark = format!("TMPDIR={}", tmp.display());
    procs().into_iter().filter(|p| p.environ.contains(&mark)).collect()
}

/// The row's rank processes: `dropcompute` processes of the row other than a process-mode
/// parent (threads: the one process).
fn ranks(mode: Mode, top: u32, tmp: &Path) -> Vec<Proc> {
    let exe = env!("CARGO_BIN_EXE_dropcompute");
    row_procs(tmp)
        .into_iter()
        .filter(|p| p.cmdline.starts_with(exe))
        .filter(|p| match mode {
            Mode::Threads => p.pid == top,
            Mode::Processes => p.ppid == top,
            _ => true,
        })
        .collect()
}

/// Whether `pid` catches SIGTERM (`SigCgt` of `/proc/pid/status`).
fn catches_term(pid: u32) -> bool {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    st.lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << 14) != 0)
}

/// Whether `pid` maps the mock's shared-memory region of a communicator (it joined one).
fn joined(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("/dev/shm/dropcompute-mock-"))
}

/// Rank 1's process.
fn rank1(mode: Mode, rs: &[Proc]) -> Option<u32> {
    rs.iter()
        .find(|p| match mode {
            Mode::Processes => p.cmdline.contains("rank-1.spec.json"),
            Mode::Mpirun => p.environ.iter().any(|e| e == "OMPI_COMM_WORLD_RANK=1"),
            Mode::Torchrun => p.environ.iter().any(|e| e == "RANK=1"),
            Mode::Threads => false,
        })
        .map(|p| p.pid)
}

fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// Waits until every rank runs and catches SIGTERM (and, with rank processes, joined the
/// communicator); returns rank 1's pid (threads: the process).
fn ready(mode: Mode, child: &mut Child, tmp: &Path) -> Result<u32, String> {
    let top = child.id();
    let want = if mode == Mode::Threads { 1 } else { RANKS as usize };
    let found = hermetic::wait_until(READY, || {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(Err(format!("ended before it was ready: {st}")));
        }
        let rs = ranks(mode, top, tmp);
        let up = rs.len() == want && rs.iter().all(|p| catches_term(p.pid) && (mode == Mode::Threads || joined(p.pid)));
        if !up {
            return None;
        }
        Some(match mode {
            Mode::Threads => Ok(top),
            _ => rank1(mode, &rs).ok_or_else(|| "no rank 1 among the rank processes".to_string()),
        })
    });
    found.unwrap_or_else(|| Err(format!("not ready within {READY:?}")))
}

/// What one row measured.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    /// From the fault to the end of the top process.
    to_end: Duration,
    /// From the fault to the end of the row's last process.
    to_all_gone: Duration,
    leftovers: Vec<String>,
}

fn run_row(mode: Mode, p: Program, fault: Fault, tmp: &Path) -> Result<Outcome, String> {
    let err_path = tmp.join("stderr.txt");
    let mut child = command(mode, p, fault, tmp)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let read_err = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let t = if fault == Fault::Clean {
        Instant::now()
    } else {
        let r1 = match ready(mode, &mut child, tmp) {
            Ok(pid) => pid,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                row_procs(tmp).iter().for_each(|p| signal("-KILL", p.pid));
                return Err(format!("{e}; stderr:\n{}", read_err()));
            }
        };
        let t = Instant::now();
        match fault {
            Fault::RankKill => signal("-KILL", r1),
            Fault::RankStop => signal("-STOP", r1),
            Fault::ParentTerm => signal("-TERM", child.id()),
            Fault::ParentKill => signal("-KILL", child.id()),
            Fault::Clean => unreachable!(),
        }
        t
    };
    let bound = COLLECTIVE_TIMEOUT + dropcompute::launch::SUPERVISION_GRACE + MARGIN;
    let status = hermetic::wait_until(bound, || child.try_wait().unwrap());
    let to_end = t.elapsed();
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        row_procs(tmp).iter().for_each(|p| signal("-KILL", p.pid));
        return Err(format!("still running {to_end:?} after the fault; stderr:\n{}", read_err()));
    };
    // The rank processes may end after the top one (a killed launcher's ranks notice it).
    let gone = hermetic::wait_until(bound, || row_procs(tmp).is_empty().then_some(()));
    let to_all_gone = t.elapsed();
    let leftovers: Vec<String> = row_procs(tmp).iter().map(|p| format!("{} {}", p.pid, p.cmdline)).collect();
    if gone.is_none() {
        row_procs(tmp).iter().for_each(|p| signal("-KILL", p.pid));
    }
    Ok(Outcome { code: status.code(), stderr: read_err(), to_end, to_all_gone, leftovers })
}

/// How each launcher names rank 1 in its failure message.
fn names_rank1(mode: Mode, stderr: &str) -> bool {
    match mode {
        // mpirun: "process rank 1 with PID ..."; ours: "rank 1".
        Mode::Threads | Mode::Processes | Mode::Mpirun => stderr.contains("rank 1"),
        // torchrun's failure table: "rank      : 1 (local_rank: 1)".
        Mode::Torchrun => stderr.contains("rank 1") || stderr.contains(": 1 (local_rank: 1)"),
    }
}

/// The row's checks; `Err` lists what failed.
fn check(mode: Mode, p: Program, fault: Fault, tmp: &Path, o: &Outcome) -> Result<(), String> {
    let mut bad = Vec::new();
    let err = &o.stderr;
    if err.contains("panicked") || err.contains("stack backtrace") || err.contains("RUST_BACKTRACE") {
        bad.push("a panic or backtrace".to_string());
    }
    if !o.leftovers.is_empty() {
        bad.push(format!("processes left: {:?}", o.leftovers));
    }
    match fault {
        Fault::Clean => {
            if o.code != Some(0) {
                bad.push(format!("exit {:?}, want 0", o.code));
            }
        }
        Fault::RankKill | Fault::RankStop => {
            if !o.code.is_some_and(|c| c != 0 && c != 101) {
                bad.push(format!("exit {:?}, want an error code", o.code));
            }
            if !names_rank1(mode, err) {
                bad.push("rank 1 not named".into());
            }
        }
        Fault::ParentTerm => {
            let interrupted = err.matches("interrupted").count();
            match mode {
                Mode::Threads | Mode::Processes if o.code != Some(130) => {
                    bad.push(format!("exit {:?}, want 130", o.code))
                }
                Mode::Mpirun | Mode::Torchrun if o.code == Some(0) || o.code.is_none() => {
                    bad.push(format!("launcher exit {:?}, want an error code", o.code))
                }
                _ => {}
            }
            // The stop is said (mpirun may cut the output of the ranks that end last, so one
            // message is the most every launcher guarantees) ...
            if interrupted == 0 {
                bad.push("no 'interrupted' message".into());
            }
            // ... and every rank of train stopped alike: one checkpoint each, at one step. Under
            // mpirun, whose SIGKILL follows its SIGTERM after 1 s, a rank of a loaded machine may
            // be killed before or while writing it: then it has no complete checkpoint (a `.tmp`
            // at most, which resume ignores), and every complete one is at the same step.
            if p == Program::Train && mode == Mode::Mpirun {
                let steps = hermetic::checkpoints(&tmp.join("ck"), RANKS);
                let complete: Vec<&String> = steps.iter().flatten().filter(|f| f.ends_with(".dcc")).collect();
                if complete.iter().any(|f| *f != complete[0]) {
                    bad.push(format!("the ranks' complete checkpoints are not of one step: {steps:?}"));
                }
            } else if p == Program::Train {
                let steps = hermetic::checkpoints(&tmp.join("ck"), RANKS);
                if steps[0].len() != 1 || steps.iter().any(|s| *s != steps[0]) {
                    bad.push(format!("not every rank stopped at one step with its checkpoint: {steps:?}"));
                }
            }
        }
        Fault::ParentKill => {}
    }
    if p == Program::Train {
        let out = tmp.join("out");
        // Anything else beside it is a staging directory, marked incomplete by its name.
        for e in std::fs::read_dir(tmp).unwrap().filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let known = ["out", "ck", "stderr.txt"].contains(&name.as_str()) || name.starts_with(".out.tmp-");
            let orphan_dir = fault == Fault::ParentKill && name.starts_with("dropcompute-ranks-"); // removed by the next run
            if !known && !orphan_dir && !name.starts_with("torchelastic_") && !name.starts_with("ompi.") {
                bad.push(format!("unexpected entry {name} beside --out"));
            }
        }
        let complete = out.join("report.json").is_file();
        if out.exists() && !complete {
            bad.push("--out exists without its report.json (half-written)".into());
        }
        if fault == Fault::Clean && !complete {
            bad.push("--out of a clean run is missing".into());
        }
    }
    if bad.is_empty() { Ok(()) } else { Err(bad.join("; ")) }
}

/// Runs the fault rows of `mode` x `p` in order; returns (rows run, failures).
fn program_rows(mode: Mode, p: Program) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut ran = 0;
    for fault in FAULTS {
        if mode == Mode::Threads && matches!(fault, Fault::RankKill | Fault::RankStop) {
            eprintln!("{mode:?} {p:?} {fault:?}: not a fault of this mode (a thread rank cannot be signalled alone)");
            continue;
        }
        let tmp = hermetic::temp_dir("launch-fault");
        ran += 1;
        match run_row(mode, p, fault, tmp.path()) {
            Err(e) => failures.push(format!("{mode:?} {p:?} {fault:?}: {e}")),
            Ok(o) => {
                eprintln!(
                    "{mode:?} {p:?} {fault:?}: exit {:?}, ended {:.2} s after the fault, every process {:.2} s",
                    o.code,
                    o.to_end.as_secs_f64(),
                    o.to_all_gone.as_secs_f64()
                );
                if let Err(e) = check(mode, p, fault, tmp.path(), &o) {
                    failures.push(format!("{mode:?} {p:?} {fault:?}: {e}; stderr:\n{}", o.stderr));
                }
            }
        }
    }
    (ran, failures)
}

/// Runs every (program, fault) row of `mode`, the two programs side by side (each row has its
/// own directory, job id and processes); failures are listed together.
fn rows(mode: Mode) {
    if let Some(why) = missing(mode) {
        eprintln!("skipped: {why} ({mode:?}: {} rows)", PROGRAMS.len() * FAULTS.len());
        return;
    }
    let started = Instant::now();
    let results: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = PROGRAMS.iter().map(|&p| s.spawn(move || program_rows(mode, p))).collect();
        hs.into_iter().map(|h| h.join().expect("a row thread panicked")).collect()
    });
    let ran: usize = results.iter().map(|r| r.0).sum();
    let failures: Vec<String> = results.into_iter().flat_map(|r| r.1).collect();
    eprintln!("{mode:?}: {ran} rows in {:.1} s", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {ran} rows failed:\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn threads_mode_under_every_fault() {
    rows(Mode::Threads);
}

#[test]
fn processes_mode_under_every_fault() {
    rows(Mode::Processes);
}

#[test]
fn env_mode_under_mpirun_under_every_fault() {
    rows(Mode::Mpirun);
}

#[test]
fn env_mode_under_torchrun_under_every_fault() {
    rows(Mode::Torchrun);
}
