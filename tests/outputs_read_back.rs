//! Every file `train --out` writes is read back by the product (issue 12): both runs' compute
//! logs load with `tune --trace` (and through the library with the right shape and values), and
//! report.json's threshold is accepted by `train --threshold`.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;
use std::process::Output;

use dropcompute::trace::{LoadOptions, load};

/// Runs the binary with `args` (and `--out out` when given), the product's environment cleared.
fn dropcompute(args: &[&str], out: Option<&Path>) -> Output {
    let mut cmd = hermetic::dropcompute();
    cmd.args(args);
    if let Some(o) = out {
        cmd.arg("--out").arg(o);
    }
    cmd.output().expect("run dropcompute")
}

/// Distinct steps of a compute log with at least one dropped micro-batch.
fn steps_with_drops(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap();
    let steps: std::collections::BTreeSet<&str> =
        text.lines().skip(1).filter(|l| l.contains(",true,")).filter_map(|l| l.split(',').next()).collect();
    steps.len()
}

#[test]
fn compute_logs_with_drops_load_and_report_threshold_runs() {
    let dir = hermetic::temp_dir("read-back");
    let out = dir.path().join("o");
    let base = ["train", "--ranks", "3", "--micro-batches", "3", "--steps", "14", "--warmup-steps", "0"];
    let mut args = base.to_vec();
    // Before-check at 60 ms drops in a few steps (virtual time and keyed latencies: the same
    // steps every run) and leaves at least `tune::MIN_STEPS` others complete.
    args.extend(["--time-mode", "virtual", "--threshold", "60", "--check", "before"]);
    let o = dropcompute(&args, Some(&out));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for run in ["baseline", "dropcompute"] {
        let log = out.join(format!("compute_log_{run}.csv"));
        let t = dropcompute(&["tune", "--trace", log.to_str().unwrap()], None);
        assert!(t.status.success(), "tune --trace {run}: {}", String::from_utf8_lossy(&t.stderr));
        let text = String::from_utf8_lossy(&t.stdout);
        assert!(
            text.contains(&format!(
                "3 ranks x 3 micro-batches x {} steps",
                load(std::slice::from_ref(&log), &LoadOptions::default()).unwrap()[0].trace.num_steps()
            )),
            "{run}: {text}"
        );
        let loaded = load(std::slice::from_ref(&log), &LoadOptions::default()).expect("the library loads the log");
        let trace = &loaded[0].trace;
        // The DropCompute log keeps the shape (M from every row) but not the steps with drops.
        let steps = if run == "baseline" { 14 } else { 14 - steps_with_drops(&log) };
        assert_eq!((trace.world_size(), trace.micro_batches(), trace.num_steps()), (3, 3, steps), "{run}");
    }
    // The DropCompute run dropped on the slow rank: its log marks them, the trace keeps the shape.
    let log = std::fs::read_to_string(out.join("compute_log_dropcompute.csv")).unwrap();
    assert!(log.lines().skip(1).any(|l| l.contains(",true,")), "some micro-batch was dropped:\n{log}");
    assert!(steps_with_drops(&out.join("compute_log_dropcompute.csv")) <= 14 - dropcompute::tune::MIN_STEPS);
    // report.json's threshold is a valid --threshold.
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let ms = report["dropcompute"]["threshold_ms"].as_f64().expect("a threshold in ms");
    assert_eq!(ms, 60.0);
    let mut again = base.to_vec();
    let ms = ms.to_string();
    again.extend(["--time-mode", "virtual", "--no-compare", "--threshold", &ms]);
    let o = dropcompute(&again, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
