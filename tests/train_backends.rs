//! `train` on every backend it can select (`DROPCOMPUTE_BACKEND`, `DROPCOMPUTE_SYNAPSE_LIB`):
//! the in-process mock, the mock shared library loaded through the same loader as libSynapse
//! (the path a Gaudi host takes, with the real library in its place), and a missing library.
//! The loaded mock is configured with the job's emulation settings like the in-process one, so
//! the two runs are bitwise identical: same steps.csv, same parameters.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;
#[path = "support/mock_library.rs"]
mod mock_library;

use std::path::Path;

/// Runs a short virtual-time `train` with `--out DIR` under `env`; returns (exit code, stderr).
fn train(out: &Path, env: &[(&str, &str)], extra: &[&str]) -> (Option<i32>, String) {
    let mut c = hermetic::dropcompute();
    c.args([
        "train",
        "--ranks",
        "2",
        "--steps",
        "12",
        "--time-mode",
        "virtual",
        "--threshold",
        "30",
        "--slow-rank",
        "1:2",
    ])
    .args(extra)
    .arg("--out")
    .arg(out);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run dropcompute");
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn the_mock_library_through_the_loader_trains_bitwise_like_the_in_process_mock() {
    let lib = mock_library::shared_library_path().expect("libmock_synapse.so");
    let lib = lib.to_str().expect("utf-8 path");
    for launch in ["threads", "processes"] {
        let (a, b) = (hermetic::temp_dir("inproc"), hermetic::temp_dir("library"));
        let (code, err) = train(a.path(), &[("DROPCOMPUTE_BACKEND", "mock")], &["--launch", launch]);
        assert_eq!(code, Some(0), "in-process mock, {launch}: {err}");
        let env = [("DROPCOMPUTE_BACKEND", "synapse"), ("DROPCOMPUTE_SYNAPSE_LIB", lib)];
        let (code, err) = train(b.path(), &env, &["--launch", launch]);
        assert_eq!(code, Some(0), "mock library, {launch}: {err}");
        // The tensors, bit for bit, through the product's reader (the header's metadata order is
        // not part of the comparison).
        let params = |d: &Path| {
            let (_, p) = dropcompute_train::params::load(&d.join("params_dropcompute.safetensors")).expect("params");
            p.into_iter().map(f32::to_bits).collect::<Vec<u32>>()
        };
        let pa = params(a.path());
        assert!(pa.len() > 1000, "{launch}: {} parameters", pa.len());
        assert!(pa == params(b.path()), "{launch}: parameters differ");
        let rows = |d: &Path| {
            let rows = dropcompute_train::metrics::read_csv(&d.join("steps.csv")).expect("steps.csv");
            rows.into_iter()
                .map(|r| (r.run, r.step, r.computed, r.dropped, r.divisor.to_bits(), r.loss.map(f64::to_bits)))
                .collect::<Vec<_>>()
        };
        let (ra, rb) = (rows(a.path()), rows(b.path()));
        // The slow rank and the 30 ms threshold make the run drop: the emulation settings reached
        // the loaded library (an unconfigured one would run at the cost model's microseconds).
        assert!(ra.iter().map(|r| r.3).sum::<u64>() > 0, "{launch}: nothing dropped: {ra:?}");
        assert_eq!(ra.len(), 36, "{launch}: 12 steps of two runs and of the prediction");
        assert_eq!(ra.iter().filter(|r| r.0 == "predicted").count(), 12, "{launch}");
        assert_eq!(ra, rb, "{launch}: steps.csv differs");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(b.path().join("report.json")).expect("report.json"))
                .expect("report.json");
        let backend = report["run"]["backend"].as_str().expect("run.backend").to_string();
        assert!(backend.contains("libmock_synapse.so"), "{launch}: backend {backend}");
    }
}

/// `$DROPCOMPUTE_SYNAPSE_LIB` naming a missing file: exit 2 naming the variable and the path
/// (the environment table), under the synapse and the automatic backend alike (auto used to
/// fall back to the mock silently, issue 24).
#[test]
fn a_missing_synapse_library_is_exit_2_naming_the_variable_and_path() {
    let (dir, missing) = hermetic::missing_path("libSynapse.so");
    let out = hermetic::temp_dir("out");
    let m = missing.to_str().expect("utf-8 path");
    for backend in ["synapse", "auto"] {
        let (code, err) = train(out.path(), &[("DROPCOMPUTE_BACKEND", backend), ("DROPCOMPUTE_SYNAPSE_LIB", m)], &[]);
        assert_eq!(code, Some(2), "{backend}: {err}");
        assert!(err.contains(m) && err.contains("DROPCOMPUTE_SYNAPSE_LIB"), "{backend}: {err}");
    }
    assert_eq!(std::fs::read_dir(out.path()).expect("out dir").count(), 0, "nothing written to --out");
    drop(dir);
}
