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

#[test]
fn missing_runtime_library_exits_3_naming_the_path() {
    let _g = serial();
    let (_d, lib) = hermetic::missing_path("libSynapse.so");
    let lib = lib.to_str().unwrap();
    let o =
        dropcompute(&["info", "--no-check"], &[("DROPCOMPUTE_BACKEND", "synapse"), ("DROPCOMPUTE_SYNAPSE_LIB", lib)]);
    let (code, err) = code_and_stderr(&o);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(lib), "{err}");
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
    let commands: [&[&str]; 6] = [
        &["info", "--backend", "mock", "--no-check"],
        &["tune", "--trace", file],
        &["simulate", "--workers", "4"],
        &["bench", "allreduce", "--ranks", "2"],
        &["validate", "--ranks", "4"],
        &["train", "--ranks", "2", "--steps", "1", "--threshold", "off"],
    ];
    let bad = [
        ("RUST_LOG", "[[["),
        ("HCCL_COMM_ID", "[::1]:1"),
        ("DROPCOMPUTE_MOCK_VERSION", "latest"),
        ("DROPCOMPUTE_MOCK_LOCK_DIR", file),
        ("TMPDIR", file),
    ];
    for args in commands {
        for (var, value) in bad {
            let (code, err) = code_and_stderr(&dropcompute(args, &[(var, value)]));
            assert_eq!(code, Some(2), "{args:?} {var}={value}: {err}");
            assert!(err.contains(var), "{args:?}: names {var}: {err}");
        }
    }
}
