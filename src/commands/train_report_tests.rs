//! Tests of `dropcompute_train::report` (the comparison table, report.json and metadata) that
//! build their configuration through `train`'s flags (`commands::train::Args::validate`).

use std::time::Duration;

use dropcompute::tune::StragglerClass;
use dropcompute_train::config::TrainConfig;
use dropcompute_train::report::*;

fn run(wall_ms: u64, steps: u64, computed: u64, dropped: u64, thr_ms: Option<u64>) -> RunMeasurements {
    RunMeasurements {
        wall: Duration::from_millis(wall_ms),
        steps,
        samples_computed: computed,
        samples_dropped: dropped,
        nominal_drop_rate: dropped as f64 / (computed + dropped).max(1) as f64,
        accuracy: 0.9525,
        final_loss: 0.12345,
        threshold: thr_ms.map(Duration::from_millis),
    }
}

fn echo() -> ConfigEcho {
    let args = <crate::commands::train::Args as clap::FromArgMatches>::from_arg_matches(
        &<crate::commands::train::Args as clap::Args>::augment_args(clap::Command::new("t")).get_matches_from([
            "t",
            "--noise",
            "lognormal:0.5",
            "--slow-rank",
            "2:3",
            "--epochs",
            "2",
        ]),
    )
    .expect("args");
    ConfigEcho::from(&args.validate().expect("valid"))
}

fn cfg() -> TrainConfig {
    let args = <crate::commands::train::Args as clap::FromArgMatches>::from_arg_matches(
        &<crate::commands::train::Args as clap::Args>::augment_args(clap::Command::new("t")).get_matches_from([
            "t",
            "--ranks",
            "4",
            "--seed",
            "9",
            "--launch",
            "processes",
        ]),
    )
    .expect("args");
    args.validate().expect("valid")
}

fn meta() -> RunMetadata {
    RunMetadata::new(&cfg(), "cpu-mock (in-process)".into(), std::time::UNIX_EPOCH + Duration::from_secs(86_400))
}

fn stragglers() -> StragglerReport {
    let rank = |rank, dropped, slow, class| RankStraggler {
        rank,
        dropped_micro_batches: dropped,
        slow_steps: slow,
        slow_step_share: slow as f64 / 20.0,
        compute_ms_ewma: 10.0 + f64::from(rank),
        class,
    };
    StragglerReport {
        run: "dropcompute".into(),
        steps: 20,
        min_steps: dropcompute::tune::MIN_STEPS as u64,
        unlabelled_because: None,
        ranks: vec![
            rank(0, 0, 0, StragglerClass::Normal),
            rank(1, 3, 2, StragglerClass::Transient),
            rank(2, 0, 0, StragglerClass::Normal),
            rank(3, 40, 18, StragglerClass::Chronic),
        ],
    }
}

#[test]
fn metadata_names_version_time_cores_and_command_line() {
    let m = meta();
    assert_eq!(m.start_time, "1970-01-02T00:00:00Z");
    assert_eq!(m.version, env!("CARGO_PKG_VERSION"));
    assert_eq!((m.world_size, m.seed, m.launch.as_str(), m.time_mode.as_str()), (4, 9, "processes", "real"));
    assert_eq!(m.cores, std::thread::available_parallelism().map_or(1, |n| n.get()));
    assert_eq!(m.args.len(), std::env::args_os().count());
}

fn line_of(t: &str, rank: &str) -> Option<String> {
    t.lines().find(|l| l.split_whitespace().next() == Some(rank)).map(str::to_owned)
}

#[test]
fn straggler_table_lists_ranks_that_hit_the_deadline() {
    let s = stragglers();
    assert_eq!(s.ranks_of(StragglerClass::Chronic), [3]);
    let t = s.table();
    let line = |rank: &str| t.lines().find(|l| l.split_whitespace().next() == Some(rank)).map(str::to_owned);
    assert_eq!(
        line("3").expect("rank 3").split_whitespace().collect::<Vec<_>>(),
        ["3", "40", "90.0", "13.000", "chronic"]
    );
    assert!(line("1").expect("rank 1").ends_with("transient"), "{t}");
    assert!(line("0").is_none() && t.contains("2 other rank(s): no deadline hit"), "{t}");
    assert!(t.starts_with("stragglers (dropcompute run, 20 steps; labels need >= 10 steps):"), "{t}");
    assert_eq!(t.lines().count(), 5, "title, column header, ranks 3 and 1, the others:\n{t}");
    // Nobody hit the deadline: the title and one line, no empty table.
    let quiet = StragglerReport {
        ranks: s.ranks.iter().map(|r| RankStraggler { slow_steps: 0, dropped_micro_batches: 0, ..r.clone() }).collect(),
        ..s.clone()
    };
    // A chronic rank without a hit (a rebalanced run) is still listed.
    let t = quiet.table();
    assert!(line_of(&t, "3").is_some_and(|l| l.ends_with("chronic")), "{t}");
    assert_eq!(t.lines().count(), 4, "title, column header, rank 3, the others:\n{t}");
    let normal = StragglerReport {
        ranks: quiet.ranks.iter().map(|r| RankStraggler { class: StragglerClass::Normal, ..r.clone() }).collect(),
        ..quiet.clone()
    };
    let t = normal.table();
    assert_eq!(t.lines().nth(1), Some("  all 4 ranks: no deadline hit"), "{t}");
    assert_eq!(t.lines().count(), 2, "{t}");
}

fn report() -> Report {
    // Baseline: 10 s, 60 steps, 30720 samples. DropCompute: 8 s, 60 steps, 28672 computed,
    // 2048 dropped.
    let b = RunReport::from_measurements(&run(10_000, 60, 30_720, 0, None)).expect("b");
    let d = RunReport::from_measurements(&run(8_000, 60, 28_672, 2_048, Some(25))).expect("d");
    Report::new(Some(b), d, Some(1.2), echo(), meta(), stragglers())
}

#[test]
fn rates_and_speedup_follow_their_definitions() {
    let r = report();
    let b = r.baseline.as_ref().expect("baseline");
    assert_eq!(b.samples_per_s, 3072.0);
    assert_eq!(b.steps_per_s, 6.0);
    assert_eq!(b.drop_rate, 0.0);
    assert_eq!(b.threshold_ms, None);
    assert_eq!(r.dropcompute.samples_per_s, 3584.0);
    assert_eq!(r.dropcompute.steps_per_s, 7.5);
    assert_eq!(r.dropcompute.drop_rate, 2048.0 / 30720.0);
    assert_eq!(r.dropcompute.dropped_of_handed_out, 2048.0 / 30720.0);
    assert_eq!(r.dropcompute.threshold_ms, Some(25.0));
    assert!((r.speedup.expect("speedup") - 3584.0 / 3072.0).abs() < 1e-12);
}

#[test]
fn no_baseline_means_no_measured_speedup() {
    let d = RunReport::from_measurements(&run(1_000, 5, 100, 0, Some(3))).expect("d");
    let r = Report::new(None, d, None, echo(), meta(), stragglers());
    assert_eq!(r.speedup, None);
    let t = comparison_table(&r);
    assert!(t.lines().any(|l| l.starts_with("effective speedup, measured") && l.trim_end().ends_with('-')), "{t}");
}

#[test]
fn bad_measurements_are_typed_errors() {
    let mut m = run(0, 1, 1, 0, None);
    assert!(matches!(RunReport::from_measurements(&m), Err(ReportError::Invalid { what: "wall", .. })));
    m.wall = Duration::from_secs(1);
    m.accuracy = f64::NAN;
    assert!(matches!(RunReport::from_measurements(&m), Err(ReportError::Invalid { what: "accuracy", .. })));
    m.accuracy = 1.5;
    assert!(RunReport::from_measurements(&m).is_err());
}

#[test]
fn json_round_trip_with_expected_keys() {
    let r = report();
    let json = r.to_json();
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    for k in ["baseline", "dropcompute", "speedup", "predicted_speedup", "config", "run", "stragglers"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert!(v["baseline"]["threshold_ms"].is_null());
    assert_eq!(v["dropcompute"]["threshold_ms"], 25.0);
    assert_eq!(v["config"]["noise"], "lognormal:0.5");
    // Enum flags echo their command-line names (the defaults here).
    let names = ["launch", "check", "normalization", "time_mode"].map(|k| v["config"][k].clone());
    assert_eq!(names, ["threads", "predictive", "realized", "real"].map(serde_json::Value::from));
    assert_eq!(v["config"]["epochs"], 2);
    assert!(v["config"]["steps"].is_null());
    assert_eq!(v["config"]["slow_ranks"], serde_json::json!([[2, 3.0]]));
    assert_eq!(v["run"]["start_time"], "1970-01-02T00:00:00Z");
    assert_eq!(v["stragglers"]["ranks"][3]["class"], "chronic");
    assert_eq!(serde_json::from_str::<Report>(&json).expect("back"), r);
}

#[test]
fn diverged_loss_is_null_in_json_and_nan_back() {
    let mut m = run(1_000, 5, 100, 0, None);
    m.final_loss = f64::NAN;
    let d = RunReport::from_measurements(&m).expect("d");
    let json = serde_json::to_string(&d).expect("ser");
    assert!(json.contains("\"final_loss\":null"), "{json}");
    assert!(serde_json::from_str::<RunReport>(&json).expect("de").final_loss.is_nan());
}

#[test]
fn table_has_every_number_aligned() {
    let t = comparison_table(&report());
    let row = |label: &str| -> Vec<String> {
        let l = t.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no row {label}:\n{t}"));
        l[label.len()..].split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(row("wall time (s)"), ["10.000", "8.000"]);
    assert_eq!(row("steps/s"), ["6.000", "7.500"]);
    assert_eq!(row("samples/s computed"), ["3072.0", "3584.0"]);
    assert_eq!(row("drop rate (%)"), ["0.00", "6.67"]);
    assert_eq!(row("threshold (ms)"), ["off", "25.000"]);
    assert_eq!(row("final train loss"), ["0.1235", "0.1235"]);
    assert_eq!(row("held-out accuracy (%)"), ["95.25", "95.25"]);
    assert_eq!(row("effective speedup, measured"), ["1.000x", "1.167x"]);
    assert_eq!(row("effective speedup, predicted"), ["-", "1.200x"]);
    let widths: Vec<usize> = t.lines().map(str::len).collect();
    assert!(widths.windows(2).all(|w| w[0] == w[1]), "ragged table:\n{t}");
    assert_eq!(t.lines().count(), 10);
}

/// The text task's table (tokens/s present) says its drop rate is in tokens; the digits
/// table's label is unchanged.
#[test]
fn the_text_tables_drop_rate_row_says_tokens() {
    let mut r = report();
    let digits = comparison_table(&r);
    assert!(digits.contains("drop rate (%) ") && !digits.contains("tokens"), "{digits}");
    r.dropcompute.tokens_per_s = Some(100.0);
    if let Some(b) = r.baseline.as_mut() {
        b.tokens_per_s = Some(80.0);
    }
    let text = comparison_table(&r);
    let line = text.lines().find(|l| l.starts_with("drop rate")).expect("a drop rate row");
    assert!(line.starts_with("drop rate (%, tokens)"), "{text}");
    assert_eq!(line.split_whitespace().rev().take(2).collect::<Vec<_>>(), ["6.67", "0.00"]);
    assert_eq!(text.lines().count(), 11, "tokens/s added");
}
