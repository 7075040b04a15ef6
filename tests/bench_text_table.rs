//! `bench text-table` through the binary (issue 26's measured policy table): the tiny text job
//! (`--text-model tiny`, 400 documents, 4 ranks, M = 4, 10 steps: the fewest `--threshold auto`
//! tunes on; rank 1 slowed 1.3x, so the bound has a gain) and its output read back: one row per policy of `bench::text_table::POLICIES`, the
//! bound's row, every share equal to the row's speedup gain over the bound's gain to the print
//! precision, every error equal to (predicted − measured) / measured likewise; flags the command
//! sets are refused after `--` with exit 2.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

/// A number of a cell: "1.2345x" -> 1.2345, "12.3 %" -> 12.3, "+0.5 %" -> 0.5.
fn num(cell: &str) -> f64 {
    cell.trim().trim_end_matches('x').trim_end_matches('%').trim().parse().unwrap_or_else(|e| panic!("{cell:?}: {e}"))
}

/// The interval of a value printed as `v` with `decimals` decimals.
fn interval(v: f64, decimals: i32) -> (f64, f64) {
    let h = 0.5 * 10f64.powi(-decimals) + 1e-12;
    (v - h, v + h)
}

#[test]
fn the_table_has_every_policy_and_the_bound_with_consistent_shares() {
    let out = hermetic::dropcompute()
        .args([
            "bench",
            "text-table",
            "--ranks",
            "4",
            "--steps",
            "10",
            "--micro-batches",
            "4",
            "--",
            "--text-model",
            "tiny",
            "--text-documents",
            "400",
            "--micro-batch-size",
            "4",
            "--warmup-steps=0",
            // The tiny model's documents fill one bucket: a slow rank gives the bound a gain.
            "--slow-rank",
            "1:1.3",
        ])
        .output()
        .expect("run dropcompute");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // The wall time of every run, on stderr.
    for label in ["baseline", "drop-predictive", "length-predictive", "rebalance", "rebalance-drop", "cost-balance"] {
        assert!(stderr.contains(&format!("N = 4: {label} ran in ")), "{label}: {stderr}");
    }
    assert!(stdout.starts_with("N = 4, M = 4, 10 steps"), "{stdout}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| policy"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(
        names,
        ["drop-predictive", "length-predictive", "rebalance", "rebalance-drop", "cost-balance", "mean-cost bound"],
        "{stdout}"
    );
    assert!(rows.iter().all(|r| r.len() == 9), "{stdout}");
    let bound = rows.last().unwrap();
    let b = interval(num(bound[2]), 4);
    assert_eq!(bound[6], "100.0 %");
    let bound_gain = (b.0 - 1.0, b.1 - 1.0);
    assert!(bound_gain.0 > 0.0, "a slow rank leaves the bound a gain: {stdout}");
    for r in &rows[..rows.len() - 1] {
        let s = interval(num(r[2]), 4);
        assert!(s.0 > 0.0, "{r:?}");
        // share = (speedup - 1) / bound gain, bounded over the printed values' rounding.
        if bound_gain.0 > 0.0 {
            let share = num(r[6]) / 100.0;
            let lo = (s.0 - 1.0) / if s.0 >= 1.0 { bound_gain.1 } else { bound_gain.0 };
            let hi = (s.1 - 1.0) / if s.1 >= 1.0 { bound_gain.0 } else { bound_gain.1 };
            assert!(share >= lo - 0.0005 && share <= hi + 0.0005, "{r:?}: share {share} outside [{lo}, {hi}]");
        } else {
            assert_eq!(r[6], "n/a", "{r:?}");
        }
        // error = (predicted - measured) / measured, likewise.
        if r[3] != "-" {
            let p = interval(num(r[3]), 4);
            let e = num(r[4]) / 100.0;
            let (lo, hi) = ((p.0 - s.1) / s.1, (p.1 - s.0) / s.0);
            assert!(e >= lo - 0.0005 && e <= hi + 0.0005, "{r:?}: error {e} outside [{lo}, {hi}]");
        }
        // The policy that never drops reports no drops and no threshold.
        if r[0] == "rebalance" {
            assert_eq!((r[1], r[5]), ("off", "0.0 %"), "{r:?}");
        }
        let drop = num(r[5]);
        assert!((0.0..=100.0).contains(&drop), "{r:?}");
        // The held-out loss of the run next to the baseline's: "L (+D)" with D = L - baseline.
        let (loss, delta) = r[7].split_once(" (").unwrap_or_else(|| panic!("{r:?}"));
        assert!(num(loss) > 0.0 && num(delta.trim_end_matches(')')).is_finite(), "{r:?}");
    }
}

#[test]
fn flags_the_command_sets_are_refused_after_the_separator() {
    for flag in ["--policy", "--threshold", "--out"] {
        let out = hermetic::dropcompute()
            .args(["bench", "text-table", "--ranks", "4", "--", flag, "off"])
            .output()
            .expect("run dropcompute");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
}
