//! The binary's exit codes per failure class (table in `src/cli/exit.rs` and README.md), run as
//! a real process: library missing / too old (3), device held by another process (4), bad
//! environment (2), unreadable data file (6).
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;
#[path = "support/mock_library.rs"]
mod mock_library;

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::process::Output;

/// Runs `dropcompute args` with only `env` of the product's variables set.
fn dropcompute(args: &[&str], env: &[(&str, &str)]) -> Output {
    hermetic::dropcompute().args(args).envs(env.iter().copied()).output().expect("run dropcompute")
}

/// The tests of this file take turns: while one holds a device lock file open, a concurrent
/// test's spawn (fork, then exec) briefly holds a copy of that descriptor, and with it the lock,
/// so "released" would race with an unrelated child process.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn code_and_stderr(o: &Output) -> (Option<i32>, String) {
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A missing library: exit 3 naming the path through `--library` (the loader's not found);
/// through `$DROPCOMPUTE_SYNAPSE_LIB` it is a bad value of the environment table (exit 2 naming
/// the variable and the path, before the backend is chosen), under every backend.
#[test]
fn missing_runtime_library_is_named_with_its_path() {
    let _g = serial();
    let (_d, lib) = hermetic::missing_path("libSynapse.so");
    let lib = lib.to_str().unwrap();
    let (code, err) = code_and_stderr(&dropcompute(&["info", "--no-check", "--library", lib], &[]));
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(lib), "{err}");
    for backend in ["synapse", "auto"] {
        let o =
            dropcompute(&["info", "--no-check"], &[("DROPCOMPUTE_BACKEND", backend), ("DROPCOMPUTE_SYNAPSE_LIB", lib)]);
        let (code, err) = code_and_stderr(&o);
        assert_eq!(code, Some(2), "{backend}: {err}");
        assert!(err.contains(lib) && err.contains("DROPCOMPUTE_SYNAPSE_LIB"), "{backend}: {err}");
    }
}

#[test]
fn too_old_runtime_library_exits_3_naming_the_version() {
    let _g = serial();
    let lib = mock_library::shared_library_path().expect("mock shared library");
    let lib = lib.to_str().unwrap();
    let o = dropcompute(&["info", "--no-check", "--library", lib], &[("DROPCOMPUTE_MOCK_VERSION", "1.15.0")]);
    let (code, err) = code_and_stderr(&o);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("1.15.0") && err.contains(lib), "{err}");
}

#[test]
fn bad_backend_variable_exits_2_and_bad_trace_file_exits_6() {
    let _g = serial();
    let (code, err) = code_and_stderr(&dropcompute(&["info"], &[("DROPCOMPUTE_BACKEND", "gpu")]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("DROPCOMPUTE_BACKEND") && err.contains("gpu"), "{err}");
    // The mock's device count is checked before any device call, naming the variable (was
    // exit 4 from synInitialize).
    for bad in ["abc", "0", "70000"] {
        let (code, err) = code_and_stderr(&dropcompute(&["info"], &[("DROPCOMPUTE_MOCK_DEVICES", bad)]));
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains("DROPCOMPUTE_MOCK_DEVICES") && err.contains(bad), "{err}");
    }
    let (_d, trace) = hermetic::missing_path("trace.csv");
    let (code, err) = code_and_stderr(&dropcompute(&["tune", "--trace", trace.to_str().unwrap()], &[]));
    assert_eq!(code, Some(6), "{err}");
    assert!(err.contains(trace.to_str().unwrap()), "{err}");
    // clap's own usage error keeps its code 2.
    let (code, _) = code_and_stderr(&dropcompute(&["info", "--no-such-flag"], &[]));
    assert_eq!(code, Some(2));
}

/// `$DROPCOMPUTE_MOCK_VERSION` that is not a version is a bad environment for every command
/// (exit 2); a well-formed but unsupported one is reported by the mock library and the loader
/// refuses the library (exit 3 naming library and version); the in-process mock,
/// which no loader checks, refuses it as a bad environment (exit 2 naming the variable) in
/// `info` and `train` alike (one check, `habana_mock::config::check_version_env`).
#[test]
fn a_bad_mock_version_is_refused_by_every_backend() {
    let _g = serial();
    let lib = mock_library::shared_library_path().expect("mock shared library");
    let lib = lib.to_str().unwrap();
    for v in ["xyz", "1.15.0"] {
        let env = [("DROPCOMPUTE_MOCK_VERSION", v)];
        let (code, err) = code_and_stderr(&dropcompute(&["info", "--no-check", "--library", lib], &env));
        // Not a version at all: the environment check refuses it before any library is loaded
        // (exit 2 naming the variable); a well-formed unsupported version reaches the loader.
        assert_eq!(code, Some(if v == "xyz" { 2 } else { 3 }), "{err}");
        let named = if v == "xyz" { "DROPCOMPUTE_MOCK_VERSION" } else { lib };
        assert!(err.contains(named) && err.contains(v), "{err}");
        for args in [
            &["info", "--backend", "mock", "--no-check"][..],
            &["train", "--ranks", "2", "--steps", "1", "--threshold", "off"],
        ] {
            let (code, err) = code_and_stderr(&dropcompute(args, &env));
            assert_eq!(code, Some(2), "{args:?} {v}: {err}");
            assert!(err.contains("DROPCOMPUTE_MOCK_VERSION") && err.contains(v), "{args:?}: {err}");
        }
    }
    // A supported version is accepted in process.
    let o = dropcompute(&["info", "--backend", "mock", "--no-check"], &[("DROPCOMPUTE_MOCK_VERSION", "1.22.1")]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("version:  1.22.1"));
}

#[test]
fn info_shows_module_0_and_skips_a_held_module() {
    let _g = serial();
    let tmp = hermetic::temp_dir("cli-module0");
    let d = tmp.path().to_str().unwrap();
    let env = [("DROPCOMPUTE_MOCK_LOCK_DIR", d)];
    let device_line = |o: &Output| {
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines().find(|l| l.starts_with("device:")).map(str::to_owned).unwrap_or_else(|| panic!("{out}"))
    };
    let line = device_line(&dropcompute(&["info", "--backend", "mock", "--no-check"], &env));
    assert!(line.contains(" module 0 "), "{line}");
    // Module 0 held by this process: the first free module, 1, is chosen and named.
    let held: File =
        OpenOptions::new().create(true).truncate(false).write(true).open(tmp.path().join("module-0.lock")).unwrap();
    held.try_lock().unwrap();
    let line = device_line(&dropcompute(&["info", "--backend", "mock", "--no-check"], &env));
    assert!(line.contains(" module 1 "), "{line}");
}

#[test]
fn device_held_by_another_process_exits_4_and_auto_selection_skips_it() {
    let _g = serial();
    let tmp = hermetic::temp_dir("cli-lock");
    let dir = tmp.path();
    // This test process plays "another process": it holds module 2's lock.
    let lock: PathBuf = dir.join("module-2.lock");
    let held: File = OpenOptions::new().create(true).truncate(false).write(true).open(&lock).unwrap();
    held.try_lock().unwrap();
    let d = dir.to_str().unwrap();
    let env = [("DROPCOMPUTE_MOCK_LOCK_DIR", d), ("HLS_MODULE_ID", "2")];
    let (code, err) = code_and_stderr(&dropcompute(&["info", "--backend", "mock", "--no-check"], &env));
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("synDeviceAlreadyAcquired") || err.contains("held by another process"), "{err}");
    // Module 3 is free: pinned to it, info succeeds.
    let env = [("DROPCOMPUTE_MOCK_LOCK_DIR", d), ("HLS_MODULE_ID", "3")];
    let o = dropcompute(&["info", "--backend", "mock", "--no-check"], &env);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    drop(held);
    // Released: module 2 can be acquired again.
    let env = [("DROPCOMPUTE_MOCK_LOCK_DIR", d), ("HLS_MODULE_ID", "2")];
    let o = dropcompute(&["info", "--backend", "mock", "--no-check"], &env);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("module 2"), "{}", String::from_utf8_lossy(&o.stdout));
}

/// Every subcommand refuses a bad value of a variable `dropcompute::environment` checks, before
/// doing anything else: exit 2 naming the variable and the value (a bad `RUST_LOG` used to be
/// ignored by `info`, `tune`, `simulate` and `validate`; a bracketed `HCCL_COMM_ID` made
/// `bench allreduce` exit 5 after a failed rendezvous).
#[test]
fn every_subcommand_refuses_a_bad_environment_value_with_exit_2() {
    let tmp = hermetic::temp_dir("env-every-command");
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let file = file.to_str().unwrap();
    use dropcompute::environment::{Subcommand, lookup_row};
    let commands: [(&[&str], Subcommand); 6] = [
        (&["info", "--backend", "mock", "--no-check"], Subcommand::Info),
        (&["tune", "--trace", file], Subcommand::Tune),
        (&["simulate", "--workers", "4"], Subcommand::Simulate),
        (&["bench", "allreduce", "--ranks", "2"], Subcommand::BenchAllreduce),
        (&["validate", "--ranks", "4"], Subcommand::Validate),
        (&["train", "--ranks", "2", "--steps", "1", "--threshold", "off"], Subcommand::Train),
    ];
    let bad = [
        ("RUST_LOG", "[[["),
        ("HCCL_COMM_ID", "[::1]:1"),
        ("DROPCOMPUTE_MOCK_VERSION", "latest"),
        ("DROPCOMPUTE_MOCK_LOCK_DIR", file),
        ("TMPDIR", file),
    ];
    // Each in every subcommand that reads it (the environment table's readers; the others
    // leave it alone, tests/environment_table.rs).
    for (args, sub) in commands {
        for (var, value) in bad.into_iter().filter(|(var, _)| lookup_row(var).is_some_and(|r| r.read_by(sub))) {
            let (code, err) = code_and_stderr(&dropcompute(args, &[(var, value)]));
            assert_eq!(code, Some(2), "{args:?} {var}={value}: {err}");
            assert!(err.contains(var), "{args:?}: names {var}: {err}");
        }
    }
}

/// The mock's own variables are checked up front by every command that runs mock devices, in
/// every launch mode: exit 2 naming the variable (`bench allreduce` used to exit 4 on a bad
/// `DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS`, from the device layer).
#[test]
fn mock_device_commands_refuse_a_bad_mock_variable_with_exit_2() {
    let commands: [&[&str]; 4] = [
        &["bench", "allreduce", "--ranks", "2", "--max-bytes", "4096", "--iters", "1", "--warmup", "0"],
        &[
            "bench",
            "allreduce",
            "--ranks",
            "2",
            "--launch",
            "processes",
            "--max-bytes",
            "4096",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &["train", "--ranks", "2", "--steps", "1", "--threshold", "off", "--time-mode", "virtual"],
        &[
            "train",
            "--ranks",
            "2",
            "--steps",
            "1",
            "--threshold",
            "off",
            "--time-mode",
            "virtual",
            "--launch",
            "processes",
        ],
    ];
    let bad = [
        ("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "abc"),
        ("DROPCOMPUTE_MOCK_DEVICES", "many"),
        ("DROPCOMPUTE_MOCK_CONFIG", "{not json"),
    ];
    for args in commands {
        for (var, value) in bad {
            let tmp = hermetic::temp_dir("bad-mock-var");
            let mut cmd = hermetic::dropcompute();
            cmd.current_dir(tmp.path()).args(args).env(var, value);
            let (code, err) = code_and_stderr(&cmd.output().unwrap());
            assert_eq!(code, Some(2), "{args:?} {var}={value}: {err}");
            assert!(err.contains(var), "{args:?}: names {var}: {err}");
        }
    }
}

/// `bench allreduce` refuses at once what `train` refuses: fewer mock devices than thread ranks
/// (it used to wait for the whole HCCL timeout and blame the init), an explicit `--ranks` other
/// than the launcher's world size under `--launch env` (it used to be ignored), and a
/// `--max-bytes` above the named limit (it was unbounded).
#[test]
fn bench_allreduce_refuses_what_train_refuses_at_once() {
    let quick = ["--max-bytes", "4096", "--iters", "1", "--warmup", "0"];
    let t0 = std::time::Instant::now();
    let mut args = vec!["bench", "allreduce", "--ranks", "2"];
    args.extend(quick);
    let o = dropcompute(&args, &[("DROPCOMPUTE_MOCK_DEVICES", "1"), ("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "600000")]);
    let (code, err) = code_and_stderr(&o);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("2 ranks on this host but only 1 devices (counted by $DROPCOMPUTE_MOCK_DEVICES=1"), "{err}");
    // Refused before any rank waited: far below the 600 s HCCL timeout set above.
    assert!(t0.elapsed() < std::time::Duration::from_secs(300), "took {:?}", t0.elapsed());
    // The same count with train (one shared rule).
    let o = dropcompute(
        &["train", "--ranks", "2", "--steps", "1", "--threshold", "off", "--time-mode", "virtual"],
        &[("DROPCOMPUTE_MOCK_DEVICES", "1")],
    );
    let (code, err) = code_and_stderr(&o);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("2 ranks on this host but only 1 devices (counted by $DROPCOMPUTE_MOCK_DEVICES=1"), "{err}");

    let torchrun = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
        ("DROPCOMPUTE_JOB_SECRET", "00112233445566778899aabbccddeeff"),
    ];
    let mut args = vec!["bench", "allreduce", "--launch", "env", "--ranks", "4"];
    args.extend(quick);
    let (code, err) = code_and_stderr(&dropcompute(&args, &torchrun));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--ranks: 4 but the launcher's world size is 2 (WORLD_SIZE=2)"), "{err}");

    let over = (dropcompute_cli::commands::bench::MAX_BENCH_BYTES + 1).to_string();
    let (code, err) = code_and_stderr(&dropcompute(&["bench", "allreduce", "--max-bytes", &over], &[]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("--max-bytes {over}: must be <= 1073741824")), "{err}");
}

/// Every output-writing flag of every subcommand, pointed under a regular file (so neither the
/// file nor its directory can be made): exit 6 (7 for the checkpoint directory, the checkpoint
/// class), and the error names the path the user gave
/// (`simulate --svg` into a missing directory used to print only plotters' I/O error).
#[test]
fn every_output_flag_names_its_path_when_it_cannot_be_written() {
    let tmp = hermetic::temp_dir("unwritable-outputs");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let under = |name: &str| file.join(name).to_str().unwrap().to_string();
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/data/traces/trace-ST.csv.gz");
    let quick_train = ["train", "--ranks", "2", "--steps", "1", "--threshold", "off", "--time-mode", "virtual"];
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec!["simulate".into(), "--workers".into(), "4".into(), "--csv".into(), under("sim.csv")], under("sim.csv")),
        (vec!["simulate".into(), "--workers".into(), "4".into(), "--svg".into(), under("sim.svg")], under("sim.svg")),
        (vec!["tune".into(), "--trace".into(), trace.into(), "--svg-dir".into(), under("figs")], under("figs")),
        (quick_train.iter().map(|s| s.to_string()).chain(["--out".into(), under("out")]).collect(), under("out")),
        (
            quick_train
                .iter()
                .map(|s| s.to_string())
                .chain(["--checkpoint-every".into(), "1".into(), "--checkpoint-dir".into(), under("ckpt")])
                .collect(),
            under("ckpt"),
        ),
    ];
    for (args, path) in cases {
        let o = hermetic::dropcompute().current_dir(tmp.path()).args(&args).output().unwrap();
        let (code, err) = code_and_stderr(&o);
        let expected = if args.iter().any(|a| a == "--checkpoint-dir") { 7 } else { 6 };
        assert_eq!(code, Some(expected), "{args:?}: {err}");
        assert!(err.contains(&path), "{args:?}: names {path}: {err}");
    }
}

/// Every subcommand that prints, with its standard output full (`/dev/full`): a typed error
/// naming stdout (exit 6), no panic; `train --out` still holds its report (the outputs are in
/// place before the terminal is written). A trace that is no trace (`/dev/zero`: one endless
/// line) is refused at once with exit 6 naming the file, not an aborted allocation (exit 134).
#[test]
fn a_full_stdout_and_an_endless_input_are_typed_errors() {
    let _g = serial();
    let dir = hermetic::temp_dir("full");
    let out = dir.path().join("out");
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/data/traces/trace-SE.csv.gz");
    let cases: [&[&str]; 6] = [
        &["info", "--no-check"],
        &["bench", "sim", "--workers", "8", "--steps", "2"],
        &[
            "train",
            "--ranks",
            "2",
            "--steps",
            "3",
            "--threshold",
            "off",
            "--time-mode",
            "virtual",
            "--out",
            out.to_str().unwrap(),
        ],
        &["tune", "--trace", trace],
        &["simulate", "--workers", "16"],
        &[
            "validate",
            "--ranks",
            "4",
            "--micro-batches",
            "4",
            "--check",
            "before",
            "--sync-lag",
            "0",
            "--slow-rank",
            "none",
            "--seeds",
            "0",
        ],
    ];
    for args in cases {
        let full = OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let o = hermetic::dropcompute().args(args).stdout(full).output().expect("run dropcompute");
        let (code, err) = code_and_stderr(&o);
        assert_eq!(code, Some(6), "{args:?}: {err}");
        assert!(err.contains("stdout") && !err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(out.join("report.json").is_file(), "train's outputs survive a full stdout");
    let (code, err) = code_and_stderr(&dropcompute(&["tune", "--trace", "/dev/zero"], &[]));
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains("DROPCOMPUTE_MAX_LINE_BYTES") && !err.contains("panicked"),
        "{err}"
    );
}

const TRACE_SE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/traces/trace-SE.csv.gz");

/// Issue 24 (found 8 and 9): a flag value without an effect, or a flag the subcommand sets
/// itself, is refused at once (exit 2, naming the flag and the value) instead of being run
/// silently (one iteration for `--iters 0`, an empty table for `--max-bytes 1`, guardrails of
/// NaN accepted, `--backup-workers` under another policy, `validate -- --resume` panicked).
#[test]
fn flags_without_an_effect_are_refused_naming_flag_and_value() {
    let cases: [(&[&str], &str); 11] = [
        (&["bench", "allreduce", "--iters", "0", "--ranks", "2", "--max-bytes", "4096"], "--iters 0"),
        (&["bench", "allreduce", "--min-bytes", "1", "--max-bytes", "1", "--ranks", "2"], "--max-bytes 1"),
        (&["simulate", "--workers", "16", "--max-drop-rate", "NaN"], "NaN"),
        (&["simulate", "--workers", "16", "--max-drop-rate", "1.5"], "1.5"),
        (&["simulate", "--workers", "16", "--min-gain", "-1"], "-1"),
        (
            &["train", "--policy", "drop-before", "--backup-workers", "99", "--steps", "2", "--no-compare"],
            "--backup-workers 99",
        ),
        (&["train", "--backup-workers", "2", "--steps", "2", "--no-compare"], "--backup-workers 2"),
        (&["validate", "--ranks", "4", "--seeds", "0", "--", "--resume", "d"], "--resume"),
        (&["validate", "--ranks", "4", "--seeds", "0", "--", "--resume=d"], "--resume"),
        (&["validate", "--ranks", "4", "--seeds", "0", "--", "--threshold", "NaN"], "`--threshold`"),
        (
            &["tune", "--trace", TRACE_SE, "--auto-for", "backup-workers", "--backup-workers", "1000"],
            "--backup-workers 1000",
        ),
    ];
    // One environment check in every subcommand that opens a device (issue 24, found 7): `bench`
    // with thread ranks accepted a bad module pin that `info` refused; `bench sim` opens none
    // and leaves the pinning alone.
    for (argv, reads) in [
        (&["bench", "allreduce", "--ranks", "2", "--max-bytes", "4096"][..], true),
        (&["info", "--no-check"], true),
        (&["bench", "sim", "--workers", "4", "--steps", "10"], false),
    ] {
        for (var, value) in [("HLS_MODULE_ID", "abc"), ("HABANA_VISIBLE_MODULES", "-1")] {
            let o = hermetic::output_within(
                hermetic::dropcompute().args(argv).env(var, value),
                std::time::Duration::from_secs(60),
            );
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(if reads { 2 } else { 0 }), "{var}={value} {argv:?}: {err}");
            assert_eq!(err.contains(var) && err.contains(value), reads, "{var}={value} {argv:?}: {err}");
        }
    }
    for (argv, named) in cases {
        let o = hermetic::output_within(hermetic::dropcompute().args(argv), std::time::Duration::from_secs(60));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{argv:?}: {err}");
        assert!(err.contains(named), "{argv:?} must name {named:?}: {err}");
        assert!(!err.contains("panicked"), "{argv:?}: {err}");
    }
}
