//! Common random numbers (issue 12): the mock's latency of (step, rank, micro-batch) is a pure
//! function of the seed and those indices, so the baseline and DropCompute runs of `train` see
//! the same latencies. A threshold that never triggers therefore measures exactly 1.000x with
//! identical step times in virtual time, for every noise model and with a slow rank; with a
//! threshold that drops, every micro-batch both runs compute took the same time in both.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::collections::HashMap;
use std::path::Path;

/// Runs `train` in virtual time with `extra` flags into `out` (the product's environment
/// cleared); panics with stderr on failure.
fn train(out: &Path, extra: &[&str]) {
    let o = hermetic::dropcompute()
        .args(["train", "--ranks", "4", "--micro-batches", "4", "--steps", "6", "--warmup-steps", "0"])
        .args(["--time-mode", "virtual", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .expect("run dropcompute");
    assert!(o.status.success(), "train {extra:?}: {}", String::from_utf8_lossy(&o.stderr));
}

fn report(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json")).expect("JSON")
}

/// (step, rank, micro-batch index within the step) -> duration_ns of every computed
/// micro-batch in a compute log.
fn durations(path: &Path) -> HashMap<(u64, u32, u32), u64> {
    let mut r = csv::Reader::from_path(path).expect("compute log");
    let h = r.headers().expect("header").clone();
    let col = |name: &str| h.iter().position(|c| c == name).unwrap_or_else(|| panic!("column {name}"));
    let (step, rank, dropped, dur) = (col("global_step"), col("rank"), col("compute_dropped"), col("duration_ns"));
    let mut next: HashMap<(u64, u32), u32> = HashMap::new();
    let mut out = HashMap::new();
    for rec in r.records() {
        let rec = rec.expect("row");
        let (s, k): (u64, u32) = (rec[step].parse().unwrap(), rec[rank].parse().unwrap());
        let i = next.entry((s, k)).or_insert(0);
        if &rec[dropped] == "false" {
            out.insert((s, k, *i), rec[dur].parse().unwrap());
        }
        *i += 1;
    }
    out
}

#[test]
fn a_threshold_that_never_triggers_measures_exactly_one() {
    let cases: [&[&str]; 5] = [
        &["--noise", "reference"],
        &["--noise", "lognormal:0.5", "--seed", "1"],
        &["--noise", "exponential:0.5", "--seed", "2"],
        &["--noise", "reference", "--slow-rank", "3:2"],
        &["--noise", "lognormal:0.5", "--slow-rank", "1:1.5", "--check", "before"],
    ];
    for (n, flags) in cases.iter().enumerate() {
        let tmp = hermetic::temp_dir(&format!("crn-never-{n}"));
        let out = tmp.path().join("o");
        let mut args = vec!["--threshold", "100000"];
        args.extend_from_slice(flags);
        train(&out, &args);
        let r = report(&out);
        assert_eq!(r["speedup"].as_f64(), Some(1.0), "{flags:?}: {}", r["speedup"]);
        assert_eq!(r["baseline"]["wall_s"], r["dropcompute"]["wall_s"], "{flags:?}");
        assert_eq!(r["dropcompute"]["samples_dropped"].as_u64(), Some(0), "{flags:?}");
        let (a, b) =
            (durations(&out.join("compute_log_baseline.csv")), durations(&out.join("compute_log_dropcompute.csv")));
        assert_eq!(a.len(), 4 * 4 * 6);
        assert_eq!(a, b, "{flags:?}");
    }
}

#[test]
fn micro_batches_computed_in_both_runs_took_the_same_time() {
    let tmp = hermetic::temp_dir("crn-drop");
    let out = tmp.path().join("o");
    train(&out, &["--threshold", "30", "--noise", "reference", "--slow-rank", "2:2", "--check", "before"]);
    let (a, b) =
        (durations(&out.join("compute_log_baseline.csv")), durations(&out.join("compute_log_dropcompute.csv")));
    assert_eq!(a.len(), 4 * 4 * 6, "the baseline computes everything");
    assert!(b.len() < a.len(), "the threshold drops some micro-batches: {} of {}", b.len(), a.len());
    for (k, d) in &b {
        assert_eq!(a.get(k), Some(d), "micro-batch (step, rank, index) {k:?}");
    }
}
