//! SIGINT/SIGTERM in every phase of every long-running subcommand (issue 24): input (a FIFO no
//! one writes), tuning (`tune --policy all` on the 1.1 MB trace-SE, `simulate --policy all`
//! with its default workers: minutes of work), collectives (`bench allreduce` all-reducing;
//! `train --launch processes` whose ranks wait in an all-reduce for a SIGSTOPped peer) and
//! output (`simulate --csv`/`--svg` to a FIFO no one reads: the open blocks). Each row asserts
//! exit 130, a message saying the process was interrupted and by which signal, no panic or
//! backtrace, an end within a bound (the 1 s backstop of `dropcompute::signals::PROMPT_GRACE`,
//! or for `train` the collective timeout plus `COOPERATIVE_GRACE`, plus a margin), and no
//! process of the row left. The signal is sent once the process catches it and has been in its
//! phase for [`SETTLE`]; a row whose command ended before the signal fails (exit 0 is not 130).
#![cfg(all(feature = "mock", target_os = "linux"))] // train and bench on the CPU mock; /proc

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a row's process runs in its phase before the signal (readiness, not timing).
const SETTLE: Duration = Duration::from_millis(800);
/// Margin over the product's own bound (two shared cores).
const MARGIN: Duration = Duration::from_secs(10);
/// The mock's collective timeout in the collectives rows.
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Input,
    Tuning,
    Collectives,
    Output,
}

struct Row {
    phase: Phase,
    signal: &'static str,
    /// `FIFO` is replaced by a FIFO in the row's directory, `TRACE` by data/traces/trace-SE.
    args: &'static [&'static str],
    /// Stop rank 1 of a process-mode job first (its peers then wait in an all-reduce).
    stop_rank1: bool,
}

const ROWS: &[Row] = &[
    Row {
        phase: Phase::Input,
        signal: "INT",
        args: &[
            "train",
            "--ranks",
            "2",
            "--steps",
            "3",
            "--threshold",
            "20",
            "--time-mode",
            "virtual",
            "--data",
            "FIFO",
        ],
        stop_rank1: false,
    },
    Row { phase: Phase::Input, signal: "TERM", args: &["tune", "--trace", "FIFO"], stop_rank1: false },
    Row { phase: Phase::Input, signal: "TERM", args: &["simulate", "--trace", "FIFO"], stop_rank1: false },
    Row {
        phase: Phase::Tuning,
        signal: "TERM",
        args: &["tune", "--trace", "TRACE", "--policy", "all"],
        stop_rank1: false,
    },
    Row { phase: Phase::Tuning, signal: "INT", args: &["simulate", "--policy", "all"], stop_rank1: false },
    Row {
        phase: Phase::Collectives,
        signal: "TERM",
        args: &["bench", "allreduce", "--ranks", "2", "--max-bytes", "4096", "--iters", "100000000"],
        stop_rank1: false,
    },
    Row {
        phase: Phase::Collectives,
        signal: "INT",
        args: &[
            "bench",
            "allreduce",
            "--launch",
            "processes",
            "--ranks",
            "2",
            "--max-bytes",
            "4096",
            "--iters",
            "100000000",
        ],
        stop_rank1: false,
    },
    Row {
        phase: Phase::Collectives,
        signal: "TERM",
        args: &[
            "train",
            "--launch",
            "processes",
            "--ranks",
            "3",
            "--no-compare",
            "--steps",
            "1000000",
            "--threshold",
            "off",
            "--base-latency-ms",
            "1",
        ],
        stop_rank1: true,
    },
    Row {
        phase: Phase::Output,
        signal: "TERM",
        args: &["simulate", "--workers", "16", "--csv", "FIFO"],
        stop_rank1: false,
    },
    Row {
        phase: Phase::Output,
        signal: "INT",
        args: &["simulate", "--workers", "16", "--svg", "FIFO"],
        stop_rank1: false,
    },
];

/// Live (not zombie) processes whose environment holds `mark`: (pid, command line).
fn marked(mark: &str) -> Vec<(u32, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        if stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')) {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if environ.split(|&c| c == 0).any(|kv| kv == mark.as_bytes()) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            v.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    v
}

fn kill(sig: &str, pid: u32) {
    let _ = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status();
}

fn run_row(row: &Row, tmp: &Path) -> Result<Duration, String> {
    let fifo = tmp.join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo");
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/traces/trace-SE.csv.gz");
    let args: Vec<String> = row
        .args
        .iter()
        .map(|a| match *a {
            "FIFO" => fifo.display().to_string(),
            "TRACE" => trace.display().to_string(),
            a => a.to_string(),
        })
        .collect();
    let mark = format!("TMPDIR={}", tmp.display());
    let err_path = tmp.join("stderr.txt");
    let mut child = hermetic::dropcompute()
        .args(&args)
        .env("TMPDIR", tmp)
        .env("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", COLLECTIVE_TIMEOUT.as_millis().to_string())
        .current_dir(tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
        .spawn()
        .unwrap();
    let read_err = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let top = child.id();
    let sig = if row.signal == "INT" { 2 } else { 15 };
    let ready = hermetic::wait_until(Duration::from_secs(60), || {
        let ps = marked(&mark);
        let want = if row.stop_rank1 { 4 } else { 1 };
        (ps.len() >= want && ps.iter().all(|(p, _)| hermetic::catches(*p, sig))).then_some(ps)
    });
    let Some(ps) = ready else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("not ready; stderr:\n{}", read_err()));
    };
    if row.stop_rank1 {
        // Rank 1 stops once the ranks all-reduce (they mapped the communicator's region).
        let joined = |pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("/dev/shm/dropcompute-mock-"))
        };
        let kids: Vec<u32> = ps.iter().map(|(p, _)| *p).filter(|p| *p != top).collect();
        hermetic::wait_until(Duration::from_secs(60), || kids.iter().all(joined).then_some(()));
        let Some(r1) = ps.iter().find(|(_, c)| c.contains("rank-1.spec.json")).map(|(p, _)| *p) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("no rank 1 process".into());
        };
        kill("STOP", r1);
    }
    std::thread::sleep(SETTLE);
    if let Ok(Some(st)) = child.try_wait() {
        return Err(format!("ended before the signal ({st}): not in its phase; stderr:\n{}", read_err()));
    }
    let t = Instant::now();
    kill(row.signal, top);
    let bound = if row.stop_rank1 {
        COLLECTIVE_TIMEOUT + dropcompute::signals::COOPERATIVE_GRACE + MARGIN
    } else {
        dropcompute::signals::PROMPT_GRACE + MARGIN
    };
    let status = hermetic::wait_until(bound, || child.try_wait().unwrap());
    let took = t.elapsed();
    let left = hermetic::wait_until(Duration::from_secs(15), || marked(&mark).is_empty().then_some(()));
    let leftovers = marked(&mark);
    leftovers.iter().for_each(|(p, _)| kill("KILL", *p));
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("still running {took:?} after SIG{}; stderr:\n{}", row.signal, read_err()));
    };
    let err = read_err();
    let mut bad = Vec::new();
    if status.code() != Some(130) {
        bad.push(format!("exit {:?}, want 130", status.code()));
    }
    // "interrupted ... SIGTERM" (train, the backstop) or "stopped by SIGTERM" (the reader).
    let said = err.contains("interrupted") || err.contains("stopped by");
    if !said || !err.contains(&format!("SIG{}", row.signal)) {
        bad.push(format!("no 'interrupted' message naming SIG{}", row.signal));
    }
    if err.contains("panicked") || err.contains("stack backtrace") {
        bad.push("a panic or backtrace".into());
    }
    if left.is_none() {
        bad.push(format!("processes left: {leftovers:?}"));
    }
    if bad.is_empty() { Ok(took) } else { Err(format!("{}; stderr:\n{err}", bad.join("; "))) }
}

#[test]
fn a_stop_signal_ends_every_phase_of_every_subcommand_with_130() {
    let started = Instant::now();
    let mut failures = Vec::new();
    for row in ROWS {
        let tmp = hermetic::temp_dir("signal-phase");
        let what = format!("{:?} SIG{} {}", row.phase, row.signal, row.args.join(" "));
        match run_row(row, tmp.path()) {
            Ok(took) => eprintln!("{what}: exit 130 {:.2} s after the signal", took.as_secs_f64()),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    eprintln!("{} rows in {:.1} s", ROWS.len(), started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), ROWS.len(), failures.join("\n\n"));
}
