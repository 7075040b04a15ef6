//! Faults and bad inputs at the level of the `dropcompute train` command: every environment
//! variable the crate reads, with bad values, fails before training with exit code 2 and a
//! message naming the variable and the value; a rank process killed in the middle of its
//! micro-batches makes the job fail with the collective exit code (5) within the collective
//! timeout, the survivors printing their flight recorder, and nothing written to `--out`.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::time::Duration;

/// (environment, extra flags, variable that must be named, value that must be named).
type Case<'a> = (Vec<(&'a str, &'a str)>, &'a [&'a str], &'a str, &'a str);

fn train(env: &[(&str, &str)], extra: &[&str]) -> (Option<i32>, String) {
    let mut c = hermetic::dropcompute();
    c.args(["train", "--steps", "2", "--ranks", "2", "--time-mode", "virtual", "--no-compare"]).args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn every_environment_variable_with_a_bad_value_is_named_with_its_value() {
    let launcher = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29511"),
    ];
    let env_mode = ["--launch", "env"];
    let cases: Vec<Case<'_>> = vec![
        (vec![("DROPCOMPUTE_MOCK_DEVICES", "abc")], &[], "DROPCOMPUTE_MOCK_DEVICES", "abc"),
        // Issue 13, case 6: zero devices exited 4 without naming the variable.
        (vec![("DROPCOMPUTE_MOCK_DEVICES", "0")], &[], "DROPCOMPUTE_MOCK_DEVICES", "0"),
        (vec![("DROPCOMPUTE_MOCK_CONFIG", "nope")], &[], "DROPCOMPUTE_MOCK_CONFIG", "nope"),
        (vec![("DROPCOMPUTE_MOCK_CONFIG", r#"{"devices":0}"#)], &[], "DROPCOMPUTE_MOCK_CONFIG", "devices = 0"),
        // serde read a JSON array into the struct's fields in order: exit 0.
        (vec![("DROPCOMPUTE_MOCK_CONFIG", "[]")], &[], "DROPCOMPUTE_MOCK_CONFIG", "expected a JSON object"),
        (vec![("DROPCOMPUTE_MOCK_CONFIG", "[1]")], &[], "DROPCOMPUTE_MOCK_CONFIG", "expected a JSON object"),
        (
            vec![("DROPCOMPUTE_MOCK_CONFIG", r#"[8,"gaudi2"]"#)],
            &[],
            "DROPCOMPUTE_MOCK_CONFIG",
            "expected a JSON object",
        ),
        (vec![("DROPCOMPUTE_MOCK_CONFIG", "7")], &[], "DROPCOMPUTE_MOCK_CONFIG", "expected a JSON object"),
        // The field, its value as typed and the rule (only "graph_gflops = -1" before).
        (
            vec![("DROPCOMPUTE_MOCK_CONFIG", r#"{"graph_gflops": -1}"#)],
            &[],
            "DROPCOMPUTE_MOCK_CONFIG",
            "graph_gflops = -1 (must be a positive finite number",
        ),
        (
            vec![("DROPCOMPUTE_MOCK_CONFIG", r#"{"copy_bandwidth_gbps": 1e-300}"#)],
            &[],
            "DROPCOMPUTE_MOCK_CONFIG",
            "copy_bandwidth_gbps = 1e-300 (must be a positive finite number",
        ),
        (vec![("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "0")], &[], "DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "\"0\""),
        (vec![("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "soon")], &[], "DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "soon"),
        (vec![("DROPCOMPUTE_BACKEND", "foo")], &[], "DROPCOMPUTE_BACKEND", "foo"),
        (vec![("RANK", "abc"), ("WORLD_SIZE", "2")], &env_mode, "RANK", "abc"),
        (vec![("RANK", "0"), ("WORLD_SIZE", "two")], &env_mode, "WORLD_SIZE", "two"),
        (vec![("RANK", "5"), ("WORLD_SIZE", "2")], &env_mode, "RANK", "5"),
        (
            {
                let mut v = launcher.to_vec();
                v.push(("HLS_MODULE_ID", "x"));
                v
            },
            &env_mode,
            "HLS_MODULE_ID",
            "x",
        ),
        (
            {
                let mut v = launcher.to_vec();
                v.push(("HABANA_VISIBLE_MODULES", "0,a"));
                v
            },
            &env_mode,
            "HABANA_VISIBLE_MODULES",
            "0,a",
        ),
        // Issue 24: thread ranks accepted these (exit 0) where `info` refused them.
        (vec![("HLS_MODULE_ID", "abc")], &[], "HLS_MODULE_ID", "abc"),
        (vec![("HLS_MODULE_ID", "-1")], &[], "HLS_MODULE_ID", "-1"),
        (vec![("HABANA_VISIBLE_MODULES", "abc")], &[], "HABANA_VISIBLE_MODULES", "abc"),
        (vec![("HABANA_VISIBLE_MODULES", "-1")], &["--launch", "processes"], "HABANA_VISIBLE_MODULES", "-1"),
        (vec![("HCCL_COMM_ID", "[::1]:29575")], &[], "HCCL_COMM_ID", "::1:29575"),
        (vec![("HCCL_COMM_ID", "nohost")], &[], "HCCL_COMM_ID", "nohost"),
        (vec![("DROPCOMPUTE_MOCK_VERSION", "latest")], &[], "DROPCOMPUTE_MOCK_VERSION", "latest"),
        (
            vec![("DROPCOMPUTE_MOCK_LOCK_DIR", "/proc/self/status")],
            &[],
            "DROPCOMPUTE_MOCK_LOCK_DIR",
            "/proc/self/status",
        ),
        (vec![("TMPDIR", "/proc/self/status")], &[], "TMPDIR", "/proc/self/status"),
        (vec![("RUST_LOG", "[[[")], &[], "RUST_LOG", "[[["),
        (vec![("DROPCOMPUTE_TEST_SIGKILL_AT", "four")], &[], "DROPCOMPUTE_TEST_SIGKILL_AT", "four"),
        (vec![("DROPCOMPUTE_LAUNCHER", "pbs")], &env_mode, "DROPCOMPUTE_LAUNCHER", "pbs"),
        (vec![("LOCAL_RANK", "x"), ("RANK", "0"), ("WORLD_SIZE", "1")], &env_mode, "LOCAL_RANK", "x"),
        (
            {
                let mut v = launcher.to_vec();
                v.push(("LOCAL_WORLD_SIZE", "0"));
                v
            },
            &env_mode,
            "LOCAL_WORLD_SIZE",
            "0",
        ),
        (vec![("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "z")], &env_mode, "OMPI_COMM_WORLD_SIZE", "z"),
        (vec![("OMPI_COMM_WORLD_RANK", "q"), ("OMPI_COMM_WORLD_SIZE", "1")], &env_mode, "OMPI_COMM_WORLD_RANK", "q"),
        (
            vec![("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_LOCAL_RANK", "w")],
            &env_mode,
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "w",
        ),
        (
            vec![("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "v")],
            &env_mode,
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "v",
        ),
        (vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "n")], &env_mode, "SLURM_NTASKS", "n"),
        (vec![("SLURM_PROCID", "p"), ("SLURM_NTASKS", "1")], &env_mode, "SLURM_PROCID", "p"),
        (vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_LOCALID", "l")], &env_mode, "SLURM_LOCALID", "l"),
        // The one-host rendezvous's job ids, node counts and directory (core/src/hccl/local.rs).
        (vec![("PMIX_NAMESPACE", "job 1")], &env_mode, "PMIX_NAMESPACE", "job 1"),
        (vec![("OMPI_MCA_ess_base_jobid", "job\t2")], &env_mode, "OMPI_MCA_ess_base_jobid", "job\\t2"),
        (vec![("SLURM_JOB_ID", "7 8")], &env_mode, "SLURM_JOB_ID", "7 8"),
        (vec![("SLURM_STEP_ID", "")], &env_mode, "SLURM_STEP_ID", "unset it instead"),
        (vec![("TORCHELASTIC_RUN_ID", "run id")], &env_mode, "TORCHELASTIC_RUN_ID", "run id"),
        (vec![("SLURM_STEP_NUM_NODES", "-1")], &env_mode, "SLURM_STEP_NUM_NODES", "-1"),
        (vec![("SLURM_NNODES", "two")], &env_mode, "SLURM_NNODES", "two"),
        (vec![("SLURM_JOB_NUM_NODES", "1.5")], &env_mode, "SLURM_JOB_NUM_NODES", "1.5"),
        (vec![("TORCHELASTIC_USE_AGENT_STORE", "maybe")], &env_mode, "TORCHELASTIC_USE_AGENT_STORE", "maybe"),
        (vec![("XDG_RUNTIME_DIR", "run/user")], &env_mode, "XDG_RUNTIME_DIR", "run/user"),
        (
            {
                let mut v = launcher.to_vec();
                v[4] = ("MASTER_PORT", "port");
                v
            },
            &env_mode,
            "MASTER_PORT",
            "port",
        ),
        (
            {
                let mut v = launcher.to_vec();
                v[3] = ("MASTER_ADDR", "0.0.0.0");
                v
            },
            &env_mode,
            "MASTER_ADDR",
            "0.0.0.0",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("DROPCOMPUTE_RENDEZVOUS", "host")],
            &env_mode,
            "DROPCOMPUTE_RENDEZVOUS",
            "host",
        ),
        (
            {
                let mut v = launcher.to_vec();
                v.push(("DROPCOMPUTE_JOB_SECRET", "abcd"));
                v
            },
            &env_mode,
            "DROPCOMPUTE_JOB_SECRET",
            // A secret is never echoed, only its length.
            "<4 characters, not shown>",
        ),
        // The input caps (core/src/input.rs): bytes with an optional K/M/G suffix, at least 1.
        (vec![("DROPCOMPUTE_MAX_DATA_BYTES", "lots")], &[], "DROPCOMPUTE_MAX_DATA_BYTES", "lots"),
        (vec![("DROPCOMPUTE_MAX_PARAMS_BYTES", "0")], &[], "DROPCOMPUTE_MAX_PARAMS_BYTES", "at least 1 byte"),
        (vec![("DROPCOMPUTE_MAX_TRACE_BYTES", "1T")], &[], "DROPCOMPUTE_MAX_TRACE_BYTES", "1T"),
        (vec![("DROPCOMPUTE_MAX_CHECKPOINT_BYTES", "-1")], &[], "DROPCOMPUTE_MAX_CHECKPOINT_BYTES", "-1"),
        (vec![("DROPCOMPUTE_MAX_SPEC_BYTES", "99999999999G")], &[], "DROPCOMPUTE_MAX_SPEC_BYTES", "64 bits"),
        (vec![("DROPCOMPUTE_MAX_SYSTEM_BYTES", "")], &[], "DROPCOMPUTE_MAX_SYSTEM_BYTES", "bytes"),
        (vec![("DROPCOMPUTE_MAX_LINE_BYTES", "1.5M")], &[], "DROPCOMPUTE_MAX_LINE_BYTES", "1.5M"),
    ];
    // Every variable the product reads has a row, except DROPCOMPUTE_SYNAPSE_LIB: train runs
    // the mock and never loads a library (`info` and `bench` exit 3 naming a missing path).
    // Only the variables `train` reads (the environment table's readers; the others are left
    // alone by `train` and covered per reader in tests/environment_table.rs).
    let reads = |var: &str| {
        dropcompute::environment::lookup_row(var)
            .is_some_and(|r| r.read_by(dropcompute::environment::Subcommand::Train))
    };
    for var in hermetic::PRODUCT_VARS.iter().filter(|v| **v != "DROPCOMPUTE_SYNAPSE_LIB" && reads(v)) {
        assert!(cases.iter().any(|(_, _, named, _)| named == var), "no bad-value row for {var}");
    }
    for (env, extra, var, value) in cases.into_iter().filter(|(_, _, var, _)| reads(var)) {
        let (code, err) = train(&env, extra);
        assert_eq!(code, Some(2), "{env:?}: {err}");
        assert!(err.contains(var) && err.contains(value), "{env:?}: message must name {var} and {value}: {err}");
        if var == "DROPCOMPUTE_JOB_SECRET" {
            assert!(!err.contains("abcd"), "the secret is echoed: {err}");
        }
    }
    // The backend variable, through `info` (train always runs the mock).
    let o = hermetic::dropcompute().arg("info").env("DROPCOMPUTE_BACKEND", "gpu").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("DROPCOMPUTE_BACKEND") && err.contains("gpu"), "{err}");
}

#[test]
fn a_rank_killed_mid_micro_batch_fails_the_job_with_the_collective_code() {
    let tmp = hermetic::temp_dir("killed-rank");
    let out = tmp.path().join("out");
    // Bounded by the collective timeout; the deadline only guards against a hang.
    let o = hermetic::output_within(
        hermetic::dropcompute()
            .args(["train", "--launch", "processes", "--ranks", "3", "--steps", "10", "--no-compare"])
            .args(["--threshold", "off", "--time-mode", "virtual", "--out", out.to_str().unwrap()])
            .env("DROPCOMPUTE_TEST_SIGKILL_AT", "4:1"),
        Duration::from_secs(300),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("rank 0 process"), "the first survivor's failure is reported: {err}");
    assert!(err.contains("flight recorder") && err.contains("seq="), "survivors dump their flight recorder: {err}");
    assert!(!out.exists(), "nothing written to --out");
}

#[test]
fn tune_flags_with_bad_values_are_named_with_their_values() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/data/traces/trace-SE.csv.gz");
    let cases: [(&str, &str); 7] = [
        ("--overhead-ms", "-1"),
        ("--overhead-ms", "NaN"),
        ("--max-drop-rate", "2"),
        ("--max-drop-rate", "-0.5"),
        ("--min-batch-fraction", "-0.1"),
        ("--min-gain", "NaN"),
        ("--min-gain", "inf"),
    ];
    for (flag, value) in cases {
        let o = hermetic::dropcompute().args(["tune", "--trace", trace, flag, value]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(&format!("{flag} {value}")), "{flag} {value}: {err}");
    }
}
