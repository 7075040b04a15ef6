//! One behaviour suite of `dropcompute train`, run in every launch mode: threads (3 ranks),
//! processes (3 ranks) and env (one launcher rank, world size 1, where a test needs no
//! external launcher). Each case of issue 13 is asserted here:
//! - SIGTERM / SIGINT stop every rank at the same step with a checkpoint in `--checkpoint-dir`
//!   and exit 130 (SIGTERM was ignored in process mode);
//! - SIGHUP writes no checkpoint unless checkpointing was asked for (it wrote into
//!   ./dropcompute-checkpoints), and one when it was;
//! - a run killed mid-way resumes to bitwise-equal parameters (virtual time);
//! - `--resume` of a checkpoint of another world size exits 7 naming both sizes (threads said
//!   "no valid checkpoint", processes accepted it);
//! - `kill -9` of a process-mode parent takes its rank processes with it, and its temporary
//!   directory is removed by the next run; its ranks all-reduced through one shared-memory
//!   mapping (same host), already unlinked;
//! - exit codes per failure class (bad data 6, a killed rank 5, bad flag 2) in every mode;
//! - a rank process stopped with SIGSTOP ends the job (the parent kills it and names it).
//!
//! Readiness is read from `/proc` (every rank process exists and has its stop-signal handler
//! installed: `SigCgt`), never from a fixed sleep.
#![cfg(all(feature = "mock", target_os = "linux"))] // the CPU mock device; /proc

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A launch mode and the world size its runs use.
#[derive(Clone, Copy, Debug)]
struct Mode {
    launch: &'static str,
    ranks: u32,
}

const MODES: [Mode; 3] =
    [Mode { launch: "threads", ranks: 3 }, Mode { launch: "processes", ranks: 3 }, Mode { launch: "env", ranks: 1 }];

/// Generous hang guard for a whole run (not a timing assertion).
const HANG: Duration = Duration::from_secs(300);

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `dropcompute train` in `m` with `args`, the product's environment cleared.
fn train(m: Mode, args: &[&str]) -> Command {
    let mut c = hermetic::dropcompute();
    c.args(["train", "--launch", m.launch, "--ranks", &m.ranks.to_string(), "--no-compare"]).args(args);
    c
}

/// (pid, parent pid) of every process, from `/proc/*/stat`; zombies left out (a zombie has
/// ended; only its parent has not reaped it yet).
fn processes() -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&"Z") {
            continue;
        }
        if let Some(ppid) = f.get(1).and_then(|p| p.parse().ok()) {
            v.push((pid, ppid));
        }
    }
    v
}

fn alive(pid: u32) -> bool {
    processes().iter().any(|&(p, _)| p == pid)
}

/// Waits until `parent` (and, in process mode, its `m.ranks` rank processes) catch SIGINT,
/// SIGTERM and SIGHUP; returns the rank processes' pids.
fn ready(child: &mut Child, m: Mode) -> Vec<u32> {
    let parent = child.id();
    let want = if m.launch == "processes" { m.ranks as usize } else { 0 };
    let kids = hermetic::wait_until(HANG, || {
        let kids: Vec<u32> = processes().into_iter().filter(|&(_, pp)| pp == parent).map(|(p, _)| p).collect();
        let all = std::iter::once(parent).chain(kids.iter().copied());
        (kids.len() == want && all.into_iter().all(|p| [1, 2, 15].iter().all(|&sig| hermetic::catches(p, sig))))
            .then_some(kids)
    });
    match kids {
        Some(k) => k,
        None => {
            let _ = child.kill();
            panic!("{m:?}: ranks not ready within the hang guard: {:?}", child.wait());
        }
    }
}

fn kill(sig: &str, pid: u32) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

/// Sends `sig` to a running job and returns (exit code, stderr).
fn stop_with(m: Mode, sig: &str, cwd: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = train(m, &["--steps", "100000", "--threshold", "off", "--base-latency-ms", "1"])
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ready(&mut child, m);
    kill(sig, child.id());
    let status = hermetic::wait_until(HANG, || child.try_wait().unwrap());
    let Some(status) = status else {
        let _ = child.kill();
        panic!("{m:?} {sig}: still running after the hang guard");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

#[test]
fn sigterm_and_sigint_stop_every_rank_at_one_step_with_a_checkpoint_in_every_mode() {
    for m in MODES {
        for (sig, name) in [("-TERM", "SIGTERM"), ("-INT", "SIGINT")] {
            let tmp = hermetic::temp_dir("stop");
            let ck = tmp.path().join("ck");
            let (code, err) = stop_with(m, sig, tmp.path(), &["--checkpoint-dir", s(&ck)]);
            assert_eq!(code, Some(130), "{m:?} {name}: {err}");
            assert!(err.contains("interrupted: stopped after step") && err.contains(name), "{m:?}: {err}");
            let steps = hermetic::checkpoints(&ck, m.ranks);
            assert_eq!(steps[0].len(), 1, "{m:?} {name}: one checkpoint (the stop's) in --checkpoint-dir: {steps:?}");
            assert!(steps.iter().all(|s| *s == steps[0]), "{m:?} {name}: every rank at the same step: {steps:?}");
            assert!(!tmp.path().join("dropcompute-checkpoints").exists(), "{m:?}: the default directory is unused");
        }
    }
}

#[test]
fn sighup_writes_a_checkpoint_only_when_checkpointing_was_asked_for() {
    for m in MODES {
        let tmp = hermetic::temp_dir("hup");
        let (code, err) = stop_with(m, "-HUP", tmp.path(), &[]);
        assert_eq!(code, Some(130), "{m:?}: {err}");
        assert!(err.contains("SIGHUP") && err.contains("no checkpoint (none asked for"), "{m:?}: {err}");
        let written: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().filter_map(Result::ok).map(|e| e.path()).collect();
        assert!(written.is_empty(), "{m:?}: SIGHUP without checkpointing writes nothing: {written:?}");

        let ck = tmp.path().join("ck");
        let (code, err) = stop_with(m, "-HUP", tmp.path(), &["--checkpoint-dir", s(&ck)]);
        assert_eq!(code, Some(130), "{m:?}: {err}");
        let steps = hermetic::checkpoints(&ck, m.ranks);
        assert!(steps[0].len() == 1 && steps.iter().all(|s| *s == steps[0]), "{m:?}: asked for: {steps:?}");
    }
}

/// The final parameters of the DropCompute run as bit patterns (read through the product's
/// safetensors reader).
fn params(out: &Path) -> Vec<u32> {
    let (_, p) = dropcompute_train::params::load(&out.join("params_dropcompute.safetensors")).unwrap();
    p.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_run_killed_mid_way_resumes_to_bitwise_equal_parameters_in_every_mode() {
    let base = ["--steps", "8", "--threshold", "25", "--warmup-steps", "1", "--time-mode", "virtual", "--seed", "3"];
    for m in MODES {
        let tmp = hermetic::temp_dir("resume-modes");
        let (ck_a, out_a) = (tmp.path().join("ck-a"), tmp.path().join("out-a"));
        let o = hermetic::output_within(
            train(m, &base).args(["--checkpoint-every", "3", "--checkpoint-dir", s(&ck_a), "--out", s(&out_a)]),
            HANG,
        );
        assert!(o.status.success(), "{m:?}: {}", String::from_utf8_lossy(&o.stderr));
        let reference = params(&out_a);
        for kill_at in [4u64, 7] {
            let (ck, out) = (tmp.path().join(format!("ck-{kill_at}")), tmp.path().join(format!("out-{kill_at}")));
            let o = hermetic::output_within(
                train(m, &base)
                    .args(["--checkpoint-every", "3", "--checkpoint-dir", s(&ck), "--out", s(&out)])
                    .env("DROPCOMPUTE_TEST_SIGKILL_AT", kill_at.to_string()),
                HANG,
            );
            assert!(!o.status.success(), "{m:?}: killed at step {kill_at}");
            let o = hermetic::output_within(train(m, &base).args(["--resume", s(&ck), "--out", s(&out)]), HANG);
            assert!(o.status.success(), "{m:?}: {}", String::from_utf8_lossy(&o.stderr));
            let report: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
            let from = kill_at / 3 * 3;
            assert_eq!(report["dropcompute"]["steps"], 8 - from, "{m:?}: resumed at step {from}");
            assert!(params(&out) == reference, "{m:?}: killed at {kill_at}: bitwise-equal parameters after resume");
        }
    }
}

#[test]
fn resuming_with_another_world_size_exits_7_naming_both_sizes_in_every_mode() {
    let tmp = hermetic::temp_dir("resume-size");
    let ck = tmp.path().join("ck");
    let two = Mode { launch: "threads", ranks: 2 };
    let args = ["--steps", "4", "--threshold", "off", "--time-mode", "virtual", "--checkpoint-every", "2"];
    let o = hermetic::output_within(train(two, &args).args(["--checkpoint-dir", s(&ck)]), HANG);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for m in MODES {
        let o = hermetic::output_within(
            &mut train(m, &["--steps", "6", "--threshold", "off", "--time-mode", "virtual", "--resume", s(&ck)]),
            HANG,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(7), "{m:?}: {err}");
        let (a, b) = ("written with world size 2", format!("this run has world size {}", m.ranks));
        assert!(err.contains(a) && err.contains(&b), "{m:?}: both sizes named: {err}");
    }
}

#[test]
fn exit_codes_per_failure_class_are_the_same_in_every_mode() {
    let tmp = hermetic::temp_dir("exit-modes");
    let bad = tmp.path().join("bad.csv");
    std::fs::write(&bad, "1,2,3,0\n1,x,3,1\n").unwrap();
    for m in MODES {
        let run = |args: &[&str], env: Option<(&str, &str)>| {
            let mut c = train(m, &["--steps", "6", "--threshold", "off", "--time-mode", "virtual"]);
            c.args(args);
            if let Some((k, v)) = env {
                c.env(k, v);
            }
            let o = hermetic::output_within(&mut c, HANG);
            (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
        };
        let (code, err) = run(&["--data", s(&bad)], None);
        assert_eq!(code, Some(6), "{m:?} bad data file: {err}");
        let (code, err) = run(&["--micro-batches", "0"], None);
        assert_eq!(code, Some(2), "{m:?} bad flag: {err}");
        let (code, err) = run(&[], Some(("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "soon")));
        assert_eq!(code, Some(2), "{m:?} bad environment: {err}");
        assert!(err.contains("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS"), "{m:?}: {err}");
        if m.ranks > 1 {
            let (code, err) = run(&[], Some(("DROPCOMPUTE_TEST_SIGKILL_AT", "2:1")));
            let want = if m.launch == "threads" { None } else { Some(5) };
            // Threads: the process itself is the killed rank (no exit code); processes: the
            // survivors fail their collective (5).
            assert_eq!(code, want, "{m:?} a rank killed: {err}");
        }
    }
}

/// `kill -9` of the parent of `--launch processes`: every rank process ends (parent-death
/// signal) and the parent's temporary directory is removed by the next process-mode run.
#[test]
fn rank_processes_end_with_a_killed_parent_and_its_temp_dir_goes_with_the_next_run() {
    let tmp = hermetic::temp_dir("pdeath");
    let m = Mode { launch: "processes", ranks: 4 };
    let mut parent = train(m, &["--steps", "100000", "--threshold", "off", "--base-latency-ms", "1"])
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let kids = ready(&mut parent, m);
    let launch_dirs = || -> Vec<String> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("dropcompute-ranks-"))
            .collect()
    };
    assert_eq!(launch_dirs().len(), 1, "the parent's launch directory");
    // Same-host rank processes all-reduce through one shared mapping in /dev/shm (unlinked
    // once every rank mapped it, so nothing is left behind even by SIGKILL).
    let shm = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("/dev/shm/dropcompute-mock-") && l.ends_with("(deleted)"))
            .map(|l| l.split_whitespace().nth(4).unwrap_or("").to_string())
    };
    let inodes = hermetic::wait_until(HANG, || kids.iter().map(|&k| shm(k)).collect::<Option<Vec<_>>>());
    let inodes = inodes.expect("every rank process maps the shared-memory region");
    assert!(inodes.iter().all(|i| *i == inodes[0]), "one region per communicator: {inodes:?}");
    kill("-KILL", parent.id());
    let t = Instant::now();
    parent.wait().unwrap();
    let gone = hermetic::wait_until(Duration::from_secs(30), || kids.iter().all(|&k| !alive(k)).then_some(()));
    let took = t.elapsed();
    eprintln!("rank processes ended {took:?} after the parent's SIGKILL");
    assert!(gone.is_some(), "rank processes {kids:?} still alive 30 s after their parent's SIGKILL");
    // The killed parent could not remove its directory; the next run does.
    assert_eq!(launch_dirs().len(), 1, "left by the killed parent");
    let o = hermetic::output_within(
        train(
            Mode { launch: "processes", ranks: 2 },
            &["--steps", "2", "--threshold", "off", "--time-mode", "virtual"],
        )
        .env("TMPDIR", tmp.path()),
        HANG,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(launch_dirs(), Vec::<String>::new(), "the orphan and the new run's directory are removed");
}

/// `--launch env` without `--ranks` takes the world size from the launcher (it demanded
/// `--ranks` equal to it, whose default is 32), for torchrun, Open MPI and Slurm variables,
/// and its ranks end bitwise identical to thread ranks (same reduction order); an explicit
/// `--ranks` that differs is refused (exit 2) naming both values and the launcher variable.
#[test]
fn env_ranks_take_the_launchers_world_size_and_match_thread_ranks() {
    let tmp = hermetic::temp_dir("env-ranks");
    let args = ["--steps", "3", "--threshold", "30", "--warmup-steps", "1", "--micro-batches", "4", "--hidden", "16"];
    let args = [&args[..], &["--time-mode", "virtual", "--no-compare"]].concat();
    let t_out = tmp.path().join("threads");
    let o = hermetic::output_within(
        hermetic::dropcompute().args(["train", "--ranks", "3"]).args(&args).args(["--out", s(&t_out)]),
        HANG,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for launcher in ["torchrun", "openmpi", "slurm"] {
        let out = tmp.path().join(launcher);
        let outputs = hermetic::train_env_ranks(launcher, 3, &args, &out);
        for (r, o) in outputs.iter().enumerate() {
            assert!(o.status.success(), "{launcher} rank {r}: {}", String::from_utf8_lossy(&o.stderr));
        }
        assert!(params(&out.join("rank-0")) == params(&t_out), "{launcher}: env ranks = thread ranks bit for bit");

        let addr = hermetic::released_port();
        let o = hermetic::output_within(
            hermetic::dropcompute()
                .args(["train", "--launch", "env", "--ranks", "4", "--steps", "2"])
                .envs(hermetic::launcher_env(launcher, 0, 2, addr)),
            HANG,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{launcher}: {err}");
        let var = hermetic::launcher_env(launcher, 0, 2, addr)[1].0.clone();
        assert!(err.contains("--ranks: 4") && err.contains(&format!("{var}=2")), "{launcher}: both values: {err}");
    }
}

/// A rank process stopped with SIGSTOP mid-run no longer hangs the job (issue 24: the parent
/// waited for every child forever): its peers' collectives time out (the mock's timeout, 2 s
/// here), the parent kills the stopped rank `launch::SUPERVISION_GRACE` after their failure,
/// says which rank and what happened, exits with an error and leaves no rank process behind.
#[test]
fn a_stopped_rank_process_ends_the_job_naming_it() {
    let m = Mode { launch: "processes", ranks: 3 };
    let mut parent = train(m, &["--steps", "100000", "--threshold", "off", "--base-latency-ms", "1"])
        .env("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "2000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = parent.stderr.take().unwrap();
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let kids = ready(&mut parent, m);
    let cmdline = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let rank1 = *kids
        .iter()
        .find(|&&k| String::from_utf8_lossy(&cmdline(k)).contains("rank-1.spec.json"))
        .expect("rank 1's process");
    kill("-STOP", rank1);
    let t = Instant::now();
    let bound = Duration::from_secs(2) + dropcompute::launch::SUPERVISION_GRACE + Duration::from_secs(30);
    let status = hermetic::wait_until(bound, || parent.try_wait().unwrap());
    let took = t.elapsed();
    if status.is_none() {
        let _ = parent.kill();
        kids.iter().for_each(|&k| kill("-KILL", k));
        panic!("the job still runs {took:?} after rank 1 was stopped");
    }
    let err = drain.join().unwrap();
    eprintln!("the job ended {took:?} after rank 1 was stopped");
    let code = status.unwrap().code();
    assert!(code.is_some_and(|c| c != 0 && c != 101), "{code:?}: {err}");
    assert!(
        err.contains(&format!("rank 1 process (pid {rank1}) was stopped")) && err.contains("killed by the parent"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let gone = hermetic::wait_until(Duration::from_secs(10), || kids.iter().all(|&k| !alive(k)).then_some(()));
    assert!(gone.is_some(), "rank processes {kids:?} left behind");
}
