//! Crash-safe checkpoint and resume of `dropcompute train` (virtual time, so runs are exact):
//! a run SIGKILLed after a random step and resumed from its last checkpoint ends with final
//! parameters bitwise identical to an uninterrupted run; a corrupt newest checkpoint is skipped
//! (kept on disk) in favour of the previous good one; SIGTERM stops every rank at the same step
//! with a checkpoint and exit code 130.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

const BASE: [&str; 14] = [
    "train",
    "--ranks",
    "3",
    "--steps",
    "14",
    "--no-compare",
    "--threshold",
    "25",
    "--time-mode",
    "virtual",
    "--checkpoint-every",
    "3",
    "--seed",
    "5",
];

/// `root/name` (not created): `root` is the test's own temporary directory.
fn tmp(root: &tempfile::TempDir, name: &str) -> PathBuf {
    root.path().join(name)
}

fn train(extra: &[&str], env: Option<(&str, String)>) -> Output {
    let mut c = hermetic::dropcompute();
    c.args(BASE).args(extra);
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The final parameters' bits, read back from the run's parameters file.
fn params(out: &Path) -> Vec<u32> {
    let (_, p) = dropcompute_train::params::load(&out.join("params_dropcompute.safetensors")).unwrap();
    p.iter().map(|x| x.to_bits()).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A short run (3 ranks, 6 steps, a checkpoint every 2 steps) SIGKILLed at the start of each of
/// its steps in turn, then resumed: from step 3 on a checkpoint common to every rank exists
/// (rank r cannot finish step 2's all-reduce before every rank saved the checkpoint of step 2),
/// and the resumed run ends with parameters bitwise identical to the uninterrupted run. Before
/// the first checkpoint (steps 0 and 1) there is nothing to resume: exit 7, naming the
/// directory. At step 2 the kill may land while a rank still writes the checkpoint of step 2,
/// so either outcome is allowed there, but a resumed run must still be exact.
#[test]
fn a_run_killed_at_every_step_resumes_to_the_same_parameters() {
    let short = |extra: &[&str], env: Option<(&str, String)>| {
        let mut c = hermetic::dropcompute();
        c.args(["train", "--ranks", "3", "--steps", "6", "--no-compare", "--threshold", "25"])
            .args(["--time-mode", "virtual", "--checkpoint-every", "2", "--seed", "5"])
            .args(extra);
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        hermetic::output_within(&mut c, Duration::from_secs(300))
    };
    let root = hermetic::temp_dir("resume-every");
    let (ck, out) = (tmp(&root, "ck"), tmp(&root, "out"));
    let o = short(&["--checkpoint-dir", s(&ck), "--out", s(&out)], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = params(&out);
    let mut resumed = Vec::new();
    for kill_at in 0u64..6 {
        let (ck, out) = (tmp(&root, &format!("ck-{kill_at}")), tmp(&root, &format!("out-{kill_at}")));
        let o = short(
            &["--checkpoint-dir", s(&ck), "--out", s(&out)],
            Some(("DROPCOMPUTE_TEST_SIGKILL_AT", kill_at.to_string())),
        );
        assert!(!o.status.success(), "kill at step {kill_at}: the run must have been killed");
        assert!(!out.join("report.json").exists(), "kill at step {kill_at}: a killed run writes no outputs");
        std::fs::create_dir_all(&ck).unwrap(); // a kill before any save leaves no directory
        let o = short(&["--resume", s(&ck), "--out", s(&out)], None);
        let err = String::from_utf8_lossy(&o.stderr);
        match (kill_at, o.status.code()) {
            (0..=2, Some(7)) => assert!(err.contains(s(&ck)) || err.contains("checkpoint"), "{err}"),
            (2.., Some(0)) => {
                assert_eq!(
                    params(&out),
                    reference,
                    "resumed after a kill at step {kill_at}: bitwise identical parameters"
                );
                resumed.push(kill_at);
            }
            (_, code) => panic!("kill at step {kill_at}: resume exited {code:?}:\n{err}"),
        }
    }
    println!("kills at steps 0..6: resumed exactly after {resumed:?}, nothing to resume before");
    assert!(resumed.starts_with(&[2]) || resumed.starts_with(&[3]), "{resumed:?}");
    assert!(resumed.ends_with(&[3, 4, 5]), "every kill from step 3 on resumes: {resumed:?}");
}

#[test]
fn a_run_killed_between_checkpoints_resumes_to_the_same_parameters() {
    let root = hermetic::temp_dir("resume");
    let (ck_a, out_a) = (tmp(&root, "ck-a"), tmp(&root, "out-a"));
    let o = train(&["--checkpoint-dir", s(&ck_a), "--out", s(&out_a)], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = params(&out_a);

    // A kill between two checkpoints (every step of a short run: the test below).
    let kill_at = 7u64;
    let (ck_b, out_b) = (tmp(&root, "ck-b"), tmp(&root, "out-b"));
    let o = train(
        &["--checkpoint-dir", s(&ck_b), "--out", s(&out_b)],
        Some(("DROPCOMPUTE_TEST_SIGKILL_AT", kill_at.to_string())),
    );
    assert!(!o.status.success(), "the run must have been killed");
    assert!(!out_b.join("report.json").exists(), "a killed run writes no outputs");
    let o = train(&["--resume", s(&ck_b), "--out", s(&out_b)], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(params(&out_b), reference, "resumed after a kill at step {kill_at}: bitwise identical parameters");

    // Corrupt rank 1's newest checkpoint: the previous common step is used, the file is kept.
    let newest = std::fs::read_dir(ck_b.join("rank-1"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "dcc"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&newest, &bytes).unwrap();
    let out_c = tmp(&root, "out-c");
    let o = train(&["--resume", s(&ck_b), "--out", s(&out_c)], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("skipping") && err.contains(newest.file_name().unwrap().to_str().unwrap()), "{err}");
    assert!(newest.exists(), "the corrupt checkpoint is kept for inspection");
    assert_eq!(params(&out_c), reference, "resumed from the previous good checkpoint");

    // A checkpoint of another configuration is refused with the checkpoint exit code.
    let o = hermetic::dropcompute()
        .args(["train", "--ranks", "3", "--steps", "14", "--no-compare", "--time-mode", "virtual", "--seed", "6"])
        .args(["--resume", s(&ck_b)])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("written by a run with a different configuration"));
    let empty = tmp(&root, "empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = train(&["--resume", s(&empty)], None);
    assert_eq!(o.status.code(), Some(7), "{}", String::from_utf8_lossy(&o.stderr));
    for d in [ck_a, out_a, ck_b, out_b, out_c, empty] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn sigterm_stops_every_rank_at_the_same_step_with_a_checkpoint() {
    let root = hermetic::temp_dir("resume");
    let ck = tmp(&root, "ck-term");
    let mut child = hermetic::dropcompute()
        .args(["train", "--ranks", "3", "--steps", "100000", "--no-compare", "--threshold", "off"])
        .args(["--base-latency-ms", "1", "--checkpoint-every", "5", "--checkpoint-dir", s(&ck)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ready once rank 0 wrote its first periodic checkpoint: the signal handler is installed
    // (before training starts) and every rank is past initialisation.
    let ready = hermetic::wait_for_file(&ck.join("rank-0"), |n| n.ends_with(".dcc"), Duration::from_secs(300));
    if ready.is_none() {
        let _ = child.kill();
        panic!("no checkpoint within the hang guard: {:?}", child.wait_with_output());
    }
    let kill = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted: stopped after step"), "{err}");
    let steps: Vec<Vec<String>> = (0..3)
        .map(|r| {
            std::fs::read_dir(ck.join(format!("rank-{r}")))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .collect();
    assert!(!steps[0].is_empty());
    assert!(steps.iter().all(|s| *s == steps[0]), "every rank checkpointed the same step: {steps:?}");
    let _ = std::fs::remove_dir_all(ck);
}

#[test]
fn a_resumed_run_takes_the_new_run_length_and_refuses_one_already_done() {
    let root = hermetic::temp_dir("resume");
    let ck = tmp(&root, "ck-len");
    let o = hermetic::dropcompute()
        .args(["train", "--ranks", "2", "--steps", "6", "--no-compare", "--threshold", "off", "--time-mode", "virtual"])
        .args(["--checkpoint-every", "3", "--checkpoint-dir", s(&ck)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let again = |len: &[&str]| {
        let mut c = hermetic::dropcompute();
        c.args(["train", "--ranks", "2", "--no-compare", "--threshold", "off", "--time-mode", "virtual"])
            .args(len)
            .args(["--resume", s(&ck)]);
        hermetic::output_within(&mut c, Duration::from_secs(300))
    };
    let o = again(&["--steps", "6"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already at step 6; nothing to do"));
    // A steps-bounded checkpoint resumed with --epochs ends after those epochs.
    let o = again(&["--epochs", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(ck);
}

/// `--launch processes` hands every rank process the parent's validated job (configuration,
/// resume step), never a filtered argv: `--checkpoint-dir` and `--resume` reach the children.
/// A 3-rank process-mode run killed at step 7 (last checkpoint: step 6) and resumed in process
/// mode runs only steps 6..14 and ends bitwise identical to an uninterrupted process-mode run.
/// (Before, the children lost `--resume`, silently retrained from step 0 and reported 14 steps.)
#[test]
fn a_process_mode_run_resumes_from_its_checkpoint() {
    let root = hermetic::temp_dir("resume");
    let procs = ["--launch", "processes"];
    let (ck_a, out_a) = (tmp(&root, "proc-ck-a"), tmp(&root, "proc-out-a"));
    let o = train(&[&procs[..], &["--checkpoint-dir", s(&ck_a), "--out", s(&out_a)]].concat(), None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = params(&out_a);

    let (ck_b, out_b) = (tmp(&root, "proc-ck-b"), tmp(&root, "proc-out-b"));
    let o = train(
        &[&procs[..], &["--checkpoint-dir", s(&ck_b), "--out", s(&out_b)]].concat(),
        Some(("DROPCOMPUTE_TEST_SIGKILL_AT", "7".into())),
    );
    assert!(!o.status.success(), "every rank process kills itself at step 7");
    for r in 0..3 {
        let newest = ck_b.join(format!("rank-{r}")).join("checkpoint-0000000006.dcc");
        assert!(newest.exists(), "rank {r}'s checkpoints go to --checkpoint-dir: {}", newest.display());
    }
    let o = train(&[&procs[..], &["--resume", s(&ck_b), "--out", s(&out_b)]].concat(), None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out_b.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["config"]["launch"], "processes");
    assert_eq!(report["dropcompute"]["steps"], 8, "the rank processes resumed at step 6 of 14");
    assert!(params(&out_b) == reference, "process-mode resume: bitwise identical to the uninterrupted run");
    for p in [ck_a, out_a, ck_b, out_b] {
        let _ = std::fs::remove_dir_all(p);
    }
}

/// `--threshold auto` tuned on the baseline, then resumed (no baseline is re-run): the resumed
/// steps run at the threshold the checkpoint holds, not at an in-run re-tune (which probed
/// with the threshold off).
#[test]
fn a_resumed_auto_run_keeps_its_tuned_threshold() {
    let root = hermetic::temp_dir("resume-auto");
    let (ck, o1, o2) = (tmp(&root, "ck"), tmp(&root, "o1"), tmp(&root, "o2"));
    let common = ["train", "--ranks", "2", "--time-mode", "virtual", "--seed", "5", "--slow-rank", "1:1.5"];
    let run = |extra: &[&str]| hermetic::dropcompute().args(common).args(extra).output().unwrap();
    let a = run(&["--steps", "14", "--checkpoint-every", "5", "--checkpoint-dir", s(&ck), "--out", s(&o1)]);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let rows = |o: &Path| dropcompute_train::metrics::read_csv(&o.join("steps.csv")).unwrap();
    let tuned: Vec<Option<f64>> =
        rows(&o1).into_iter().filter(|r| r.run == "dropcompute").map(|r| r.threshold_ms).collect();
    assert!(tuned[0].is_some() && tuned.iter().all(|t| t == &tuned[0]), "auto enabled a threshold: {tuned:?}");
    let b = run(&["--steps", "18", "--resume", s(&ck), "--out", s(&o2)]);
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let resumed = rows(&o2);
    assert_eq!(resumed.iter().map(|r| r.step).collect::<Vec<_>>(), (10..18).collect::<Vec<_>>());
    assert!(resumed.iter().all(|r| r.threshold_ms == tuned[0]), "{resumed:?} vs {:?}", tuned[0]);
}

/// Issue 24 (found 9): a resumed run keeps its checkpoint's threshold, so `--threshold off` or
/// another value is refused naming both (it printed "threshold: off" and ran the checkpoint's);
/// the same value and `auto` resume.
#[test]
fn a_resumed_threshold_other_than_the_checkpoints_is_refused() {
    let root = hermetic::temp_dir("resume-threshold");
    let ck = tmp(&root, "ck");
    let first = hermetic::output_within(
        hermetic::dropcompute()
            .args(["train", "--ranks", "2", "--steps", "4", "--no-compare", "--threshold", "25"])
            .args(["--time-mode", "virtual", "--checkpoint-every", "2", "--checkpoint-dir", s(&ck)]),
        Duration::from_secs(300),
    );
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let resume = |threshold: &str| {
        hermetic::output_within(
            hermetic::dropcompute()
                .args(["train", "--ranks", "2", "--steps", "6", "--no-compare", "--threshold", threshold])
                .args(["--time-mode", "virtual", "--resume", s(&ck)]),
            Duration::from_secs(300),
        )
    };
    for (given, shown) in [("off", "off"), ("30", "30 ms")] {
        let o = resume(given);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--threshold {given}: {err}");
        assert!(err.contains(&format!("--threshold: {shown}:")) && err.contains("runs at 25 ms"), "{err}");
    }
    for ok in ["25", "auto"] {
        let o = resume(ok);
        assert!(o.status.success(), "--threshold {ok}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The held-off steps of `out`'s steps.csv (the DropCompute run's steps after the warm-up
/// whose threshold is off: the drop-rate guard held them off).
fn held_off(out: &Path) -> Vec<u64> {
    let mut r = csv::Reader::from_path(out.join("steps.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|x| x == name).unwrap();
    let (run, step, th) = (col("run"), col("step"), col("threshold_ms"));
    r.records()
        .map(|x| x.unwrap())
        .filter(|x| &x[run] == "dropcompute" && x[th].is_empty())
        .map(|x| x[step].parse().unwrap())
        .filter(|&s: &u64| s >= 3)
        .collect()
}

/// With the drop-rate guard, a run killed between checkpoints resumes with the guard's counts
/// (in the checkpoint's scheduler state): the same steps held off and bitwise identical
/// parameters as the uninterrupted run. At 0.2 the uninterrupted run enforces steps 3, 8 and
/// 13 only (each drops 21 of 3·M): a resumed guard without its counts would enforce the first
/// step after the checkpoint.
#[test]
fn a_guarded_run_resumes_with_its_guard() {
    let root = hermetic::temp_dir("resume-guard");
    let (ck_a, out_a) = (tmp(&root, "ck-a"), tmp(&root, "out-a"));
    let guard = ["--drop-guard", "0.2"];
    let o = train(&[&guard[..], &["--checkpoint-dir", s(&ck_a), "--out", s(&out_a)]].concat(), None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = held_off(&out_a);
    assert_eq!(reference, [4, 5, 6, 7, 9, 10, 11, 12], "the guard held these steps off");
    let (ck_b, out_b) = (tmp(&root, "ck-b"), tmp(&root, "out-b"));
    let o = train(
        &[&guard[..], &["--checkpoint-dir", s(&ck_b), "--out", s(&out_b)]].concat(),
        Some(("DROPCOMPUTE_TEST_SIGKILL_AT", "10".to_string())),
    );
    assert!(!o.status.success(), "the run must have been killed");
    let o = train(&[&guard[..], &["--resume", s(&ck_b), "--out", s(&out_b)]].concat(), None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The resumed run's steps.csv starts at its checkpoint's step.
    let resumed = held_off(&out_b);
    assert!(resumed.first().is_some_and(|&s| s <= 10), "{resumed:?}");
    assert_eq!(resumed, reference.iter().copied().filter(|&s| s >= resumed[0]).collect::<Vec<_>>());
    assert_eq!(params(&out_b), params(&out_a), "bitwise identical parameters");
    for d in [ck_a, out_a, ck_b, out_b] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A checkpoint whose drop-guard counts no run records (dropped above handed, or a reserve
/// above dropped: a hand-made or damaged file, re-sealed with a valid checksum) is refused on
/// resume with exit 7, naming the file and the counts; the run does not fall back to a fresh
/// guard.
#[test]
fn a_checkpoint_with_impossible_guard_counts_is_refused() {
    let root = hermetic::temp_dir("resume-guard-counts");
    let (ck, out) = (tmp(&root, "ck"), tmp(&root, "out"));
    let guard = ["--drop-guard", "0.2"];
    let o = train(&[&guard[..], &["--checkpoint-dir", s(&ck), "--out", s(&out)]].concat(), None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    type Counts = (u64, u64, u64);
    let bad_counts: [fn(Counts) -> Counts; 2] = [|(h, _, r)| (h, h + 1, r), |(h, d, _)| (h, d, d + 1)];
    for bad in bad_counts {
        let mut last = None;
        for rank in std::fs::read_dir(&ck).unwrap().flatten().filter(|e| e.path().is_dir()) {
            let loaded = dropcompute::checkpoint::load_latest(&rank.path()).expect("a checkpoint");
            let mut c = loaded.checkpoint;
            let g = &mut c.meta["scheduler"]["drop_guard"];
            let n = |k: &str| g[k].as_u64().expect(k);
            let (h, d, r) = bad((n("handed"), n("dropped"), n("reserve")));
            (g["handed"], g["dropped"], g["reserve"]) = (h.into(), d.into(), r.into());
            dropcompute::checkpoint::save(&rank.path(), &c).expect("re-sealed");
            last = Some((h, d, r));
        }
        let (h, d, r) = last.expect("rank directories");
        let o = train(&[&guard[..], &["--resume", s(&ck), "--out", s(&out)]].concat(), None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(7), "{err}");
        assert!(err.contains(&format!("handed {h}, dropped {d}, reserve {r}")) && err.contains("checkpoint-"), "{err}");
    }
    // No guard state at all in a guarded run's checkpoint: refused too (it used to start a
    // fresh guard silently).
    for rank in std::fs::read_dir(&ck).unwrap().flatten().filter(|e| e.path().is_dir()) {
        let mut c = dropcompute::checkpoint::load_latest(&rank.path()).expect("a checkpoint").checkpoint;
        c.meta["scheduler"]["drop_guard"] = serde_json::Value::Null;
        dropcompute::checkpoint::save(&rank.path(), &c).expect("re-sealed");
    }
    let o = train(&[&guard[..], &["--resume", s(&ck), "--out", s(&out)]].concat(), None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(err.contains("holds no drop guard counts") && err.contains("checkpoint-"), "{err}");
    for d in [ck, out] {
        let _ = std::fs::remove_dir_all(d);
    }
}
