//! Every file `train --out` writes is read back by the product (issue 12): both runs' compute
//! logs load with `tune --trace` (and through the library with the right shape and values);
//! report.json reads back with serde (straggler attribution: a slow rank is chronic; run
//! metadata) and its threshold, fixed or auto, given to `train --threshold` applies the same
//! deadline; steps.csv reads back with the csv crate and agrees with the compute logs and the
//! report; timeline.json follows the Chrome trace event format; the parameters file reads back
//! through `train::params` and starts a run with `--init-params`.
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
        // The DropCompute log keeps the shape and every step: each dropped micro-batch is a
        // censored cell, filled and counted (trace::compute_log), never a removed step.
        assert_eq!((trace.world_size(), trace.micro_batches(), trace.num_steps()), (3, 3, 14), "{run}");
        let dropped = std::fs::read_to_string(&log).unwrap().lines().filter(|l| l.contains(",true,")).count();
        let said = format!("{dropped} censored cell(s) in {} step(s)", steps_with_drops(&log));
        assert_eq!(loaded[0].notes.iter().any(|n| n.starts_with(&said)), dropped > 0, "{run}: {:?}", loaded[0].notes);
    }
    // The DropCompute run dropped on the slow rank: its log marks them, the trace keeps the shape.
    let log = std::fs::read_to_string(out.join("compute_log_dropcompute.csv")).unwrap();
    assert!(log.lines().skip(1).any(|l| l.contains(",true,")), "some micro-batch was dropped:\n{log}");
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

/// Checks `timeline.json` against the Chrome trace event format (JSON object form): every event
/// has `ph`, `pid` and `name`; complete events (`X`) have `ts`, `dur` >= 0 in microseconds and
/// a `tid`; instants (`i`) a `ts` and a `tid`; on one (pid, tid) row complete events are nested
/// or disjoint, never partially overlapping; every row and process with events is named by
/// `thread_name` / `process_name` metadata. Returns the complete events per row (µs).
fn check_chrome_trace(json: &[u8]) -> std::collections::BTreeMap<(u64, u64), Vec<(f64, f64)>> {
    use std::collections::{BTreeMap, BTreeSet};
    let v: serde_json::Value = serde_json::from_slice(json).expect("timeline.json is JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents array");
    let (mut rows, mut named_rows, mut named_pids, mut pids) =
        (BTreeMap::<(u64, u64), Vec<(f64, f64)>>::new(), BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {e}"));
        assert!(e["name"].is_string(), "no name: {e}");
        match ph {
            "M" => match e["name"].as_str() {
                Some("process_name") => assert!(named_pids.insert(pid) && e["args"]["name"].is_string(), "{e}"),
                Some("thread_name") => {
                    let tid = e["tid"].as_u64().expect("thread_name has a tid");
                    assert!(named_rows.insert((pid, tid)) && e["args"]["name"].is_string(), "{e}");
                }
                _ => {}
            },
            "X" | "i" => {
                let tid = e["tid"].as_u64().unwrap_or_else(|| panic!("no tid: {e}"));
                let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
                assert!(ts >= 0.0, "{e}");
                pids.insert(pid);
                let dur =
                    if ph == "X" { e["dur"].as_f64().unwrap_or_else(|| panic!("X without dur: {e}")) } else { 0.0 };
                assert!(dur >= 0.0, "negative duration: {e}");
                if ph == "i" {
                    assert_eq!(e["s"], "t", "thread-scoped instant: {e}");
                }
                rows.entry((pid, tid)).or_default();
                if ph == "X" {
                    rows.get_mut(&(pid, tid)).unwrap().push((ts, ts + dur));
                }
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert!(rows.keys().all(|k| named_rows.contains(k)), "unnamed rows: {:?} vs {named_rows:?}", rows.keys());
    assert_eq!(pids, named_pids, "every process with events is named");
    // Times are whole ns written as µs: compare in ns (rounded) so float noise is not an overlap.
    for (row, spans) in &mut rows {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<i64> = Vec::new();
        for &(a, z) in spans.iter() {
            let (a, z) = ((a * 1e3).round() as i64, (z * 1e3).round() as i64);
            while open.last().is_some_and(|&end| end <= a) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(z <= end, "row {row:?}: [{a}, {z}] ns partially overlaps a span ending at {end} ns");
            }
            open.push(z);
        }
    }
    rows
}

#[test]
fn timeline_follows_the_chrome_trace_format_in_real_time_and_processes() {
    let dir = hermetic::temp_dir("timeline");
    let out = dir.path().join("o");
    let args = ["train", "--ranks", "2", "--micro-batches", "3", "--steps", "4", "--warmup-steps", "1"];
    let mut args = args.to_vec();
    args.extend(["--base-latency-ms", "2", "--threshold", "4", "--launch", "processes", "--sync-lag", "1"]);
    let o = dropcompute(&args, Some(&out));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = check_chrome_trace(&std::fs::read(out.join("timeline.json")).unwrap());
    // Two runs (pid 1, 2) x two ranks, each with 4 collectives + 4 optimizer steps at least.
    assert_eq!(rows.keys().copied().collect::<Vec<_>>(), [(1, 0), (1, 1), (2, 0), (2, 1)]);
    assert!(rows.values().all(|s| s.len() >= 8), "{rows:?}");
}

/// Item 7 of issue 12 and the other outputs of one run: a persistently slow rank is named
/// chronic (stdout and report.json), report.json's metadata and threshold read back (the
/// threshold, given to `train --threshold`, reproduces the run), steps.csv agrees with
/// report.json, the timeline is a valid Chrome trace, and the parameters file is accepted by
/// `--init-params`.
#[test]
fn slow_rank_is_chronic_and_every_output_reads_back() {
    use dropcompute::tune::StragglerClass;
    use dropcompute_train::metrics::{StepMetrics, read_csv};
    use dropcompute_train::report::Report;
    let dir = hermetic::temp_dir("stragglers");
    let out = dir.path().join("o");
    let args = ["train", "--ranks", "4", "--steps", "30", "--slow-rank", "3:2", "--time-mode", "virtual"];
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let o = dropcompute(&args, Some(&out));
    let after = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let chronic_lines: Vec<&str> = stdout.lines().filter(|l| l.trim_end().ends_with("chronic")).collect();
    assert_eq!(chronic_lines.len(), 1, "{stdout}");
    assert_eq!(chronic_lines[0].split_whitespace().next(), Some("3"), "{stdout}");

    let rep: Report = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(rep.stragglers.ranks_of(StragglerClass::Chronic), [3]);
    assert_eq!((rep.stragglers.steps, rep.stragglers.min_steps), (30, dropcompute::tune::MIN_STEPS as u64));
    let r3 = &rep.stragglers.ranks[3];
    assert!(r3.slow_step_share >= 0.5 && r3.dropped_micro_batches > 0, "{r3:?}");
    // Metadata.
    let m = &rep.run;
    assert_eq!(m.args[1..], [&args[..], &["--out", out.to_str().unwrap()]].concat(), "the command line");
    assert_eq!((m.world_size, m.seed, m.launch.as_str(), m.time_mode.as_str()), (4, 0, "threads", "virtual"));
    assert_eq!((m.version.as_str(), m.backend.as_str()), (env!("CARGO_PKG_VERSION"), "cpu-mock (in-process)"));
    assert_eq!(m.cores, std::thread::available_parallelism().map_or(1, |n| n.get()));
    let start = humantime::parse_rfc3339(&m.start_time).expect("RFC 3339");
    assert!(m.start_time.ends_with('Z') && before <= start && start <= after, "{}", m.start_time);

    // steps.csv against report.json.
    let rows = read_csv(&out.join("steps.csv")).expect("steps.csv reads back");
    let run = |name: &str| -> Vec<StepMetrics> { rows.iter().filter(|r| r.run == name).cloned().collect() };
    let (base, dc, pred) = (run("baseline"), run("dropcompute"), run("predicted"));
    assert_eq!((base.len(), dc.len(), pred.len(), rows.len()), (30, 30, 30, 90));
    // The predicted rows: the replay of the baseline at the run's threshold, step by step next
    // to the run (recorded latencies only: the same counts, step times within 0.1 %), and their
    // mean is the predicted speedup's time.
    for (p, m) in pred.iter().zip(&dc) {
        assert_eq!((p.step, p.computed, p.dropped, p.divisor), (m.step, m.computed, m.dropped, m.divisor));
        // The overhead after the compute phase is the baseline's: a step that drops differs by
        // tens of microseconds (the slowest rank's time to the collective is another rank's).
        assert!((p.step_ms / m.step_ms - 1.0).abs() < 1e-3, "step {}: {} vs {}", m.step, p.step_ms, m.step_ms);
        assert_eq!((p.threshold_ms, p.policy.as_str(), p.loss), (m.threshold_ms, m.policy.as_str(), None));
    }
    assert!(!rep.prediction_estimate, "a drop policy replays recorded latencies only");
    for (name, rows, r) in [("baseline", &base, rep.baseline.as_ref().unwrap()), ("dropcompute", &dc, &rep.dropcompute)]
    {
        // Per step from the compute log: (computed micro-batches, dropped, computed samples,
        // dropped samples); an epoch's last micro-batch may hold fewer than 8 samples.
        let mut per_step = std::collections::BTreeMap::<u64, [u64; 4]>::new();
        let mut log = csv::Reader::from_path(out.join(format!("compute_log_{name}.csv"))).unwrap();
        for rec in log.deserialize::<dropcompute::trace::compute_log::ComputeLogRecord>() {
            let rec = rec.unwrap();
            let e = per_step.entry(rec.global_step).or_default();
            let d = usize::from(rec.compute_dropped);
            e[d] += 1;
            e[2 + d] += u64::from(rec.batch);
        }
        assert_eq!(per_step.len(), rows.len(), "{name}");
        for x in rows.iter() {
            let [c, d, cs, _] = per_step[&x.step];
            assert_eq!((x.computed, x.dropped, x.computed + x.dropped), (c, d, 4 * 8), "{name} step {}", x.step);
            assert_eq!(x.divisor, cs as f64, "{name} step {}: divisor = computed samples", x.step);
        }
        assert_eq!(per_step.values().map(|v| v[2]).sum::<u64>(), r.samples_computed);
        assert_eq!(per_step.values().map(|v| v[3]).sum::<u64>(), r.samples_dropped);
        assert_eq!(rows.last().unwrap().loss, Some(r.final_loss));
        // Virtual time: the run's wall time is the sum of its step times.
        assert!((rows.iter().map(|x| x.step_ms).sum::<f64>() / 1e3 - r.wall_s).abs() < 1e-6);
        assert!(rows.iter().all(|x| x.threshold_ms == r.threshold_ms));
    }
    check_chrome_trace(&std::fs::read(out.join("timeline.json")).unwrap());

    // ledger_<run>.json (one DropLedger per rank) against report.json: its computed sample ids
    // are the run's computed samples, its dropped micro-batches' ids the dropped samples.
    for (name, r) in [("baseline", rep.baseline.as_ref().unwrap()), ("dropcompute", &rep.dropcompute)] {
        let ledgers: Vec<dropcompute::schedule::DropLedger> =
            serde_json::from_slice(&std::fs::read(out.join(format!("ledger_{name}.json"))).unwrap()).unwrap();
        assert_eq!(ledgers.len(), 4, "{name}: one ledger per rank");
        let computed: u64 = ledgers.iter().map(|l| l.computed.len() as u64).sum();
        assert_eq!(computed, r.samples_computed, "{name}: ledger ids = computed samples");
        let dropped: u64 = ledgers.iter().flat_map(|l| &l.dropped).map(|d| d.sample_ids.len() as u64).sum();
        assert_eq!(dropped, r.samples_dropped, "{name}: ledger drops = dropped samples");
    }

    // report.json's threshold (auto: not a round number) given back to --threshold applies the
    // same deadline: the same threshold in the report and, with the same latencies (common
    // random numbers), the same drops in every step.
    let ms = rep.dropcompute.threshold_ms.expect("auto enabled a threshold");
    let out2 = dir.path().join("o2");
    let ms_arg = ms.to_string();
    let mut again = args.to_vec();
    again.extend(["--no-compare", "--threshold", &ms_arg]);
    let o = dropcompute(&again, Some(&out2));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep2: Report = serde_json::from_slice(&std::fs::read(out2.join("report.json")).unwrap()).unwrap();
    assert_eq!(rep2.dropcompute.threshold_ms, Some(ms));
    let dc2 = read_csv(&out2.join("steps.csv")).unwrap();
    let counts = |v: &[StepMetrics]| v.iter().map(|x| (x.step, x.computed, x.dropped)).collect::<Vec<_>>();
    assert_eq!(counts(&dc2), counts(&dc));

    // The parameters file initialises another run of the same model; a different model is a
    // data error (exit 6) naming the file.
    let p = out.join("params_dropcompute.safetensors");
    let (shape, trained) = dropcompute_train::params::load(&p).expect("safetensors reads back");
    assert_eq!(shape.param_len(), trained.len());
    let init =
        ["train", "--ranks", "2", "--steps", "1", "--time-mode", "virtual", "--no-compare", "--threshold", "off"];
    let mut warm = init.to_vec();
    warm.extend(["--lr", "1e-12", "--init-params", p.to_str().unwrap()]);
    let out3 = dir.path().join("o3");
    let o = dropcompute(&warm, Some(&out3));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep3: Report = serde_json::from_slice(&std::fs::read(out3.join("report.json")).unwrap()).unwrap();
    assert_eq!(rep3.config.init_params.as_deref(), p.to_str());
    // One step at lr 1e-12 leaves the trained model's predictions: its held-out accuracy.
    assert_eq!(rep3.dropcompute.accuracy, rep.dropcompute.accuracy);
    let mut other = warm.clone();
    other.extend(["--hidden", "16"]);
    let o = dropcompute(&other, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(err.contains("params_dropcompute.safetensors") && err.contains("hidden: 16"), "{err}");
}

/// `tune --warmup-steps` judges `train`'s baseline compute log the way `train --threshold auto`
/// judged that baseline (same warm-up, check, sync lag and guardrails): the same threshold, to
/// the nanosecond.
#[test]
fn tune_on_trains_compute_log_with_its_warm_up_gives_trains_auto_threshold() {
    let dir = hermetic::temp_dir("tune-warmup");
    let out = dir.path().join("o");
    let args = ["train", "--ranks", "4", "--steps", "16", "--slow-rank", "3:2", "--time-mode", "virtual"];
    let mut with_warmup = args.to_vec();
    with_warmup.extend(["--warmup-steps", "4"]);
    let o = dropcompute(&with_warmup, Some(&out));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let auto_ms = report["dropcompute"]["threshold_ms"].as_f64().expect("auto enabled a threshold");
    let log = out.join("compute_log_baseline.csv");
    let t = dropcompute(&["tune", "--trace", log.to_str().unwrap(), "--warmup-steps", "4", "--json"], None);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let v: serde_json::Value = serde_json::from_slice(&t.stdout).unwrap();
    assert_eq!(v[0]["execution"]["warmup_steps"], 4);
    assert_eq!(v[0]["execution"]["check"], "predictive");
    assert_eq!(v[0]["replay"]["threshold_ms"].as_f64(), Some(auto_ms), "{}", String::from_utf8_lossy(&t.stdout));
    // Warm-up steps do not count towards the minimum: 16 steps with 7 of warm-up leave 9 < 10.
    let t = dropcompute(&["tune", "--trace", log.to_str().unwrap(), "--warmup-steps", "7"], None);
    assert_eq!(t.status.code(), Some(6), "{}", String::from_utf8_lossy(&t.stderr));
    assert!(String::from_utf8_lossy(&t.stderr).contains("insufficient data: 9 complete step(s)"));
}

/// Issue 23 item 7, for every policy x tail shape (`--tail-split` 1 and 2): the DropCompute
/// run's compute log loads in `tune --trace` (exit 0) with every step and the nominal shape
/// (4 ranks x 4 micro-batches x 20 steps), its dropped micro-batches counted as censored cells
/// and the work its policy moved as unassigned ones (`trace::compute_log`), and the baseline's
/// compute log given to `tune --auto-for POLICY` with train's `--warmup-steps`, `--check`,
/// `--seed`, `--backup-workers` and tail shape gives the threshold the run used (report.json):
/// the log's trace is the one `train --threshold auto` tuned on (`schedule::auto::trace_of_reports`:
/// the same latencies, start offsets and overheads from the recorded clock starts) and the rule
/// is the same function (`tune::policies::auto_policy_threshold`, or `tune::recommend`).
#[test]
fn every_policys_logs_load_and_the_baseline_tunes_to_the_runs_threshold() {
    use dropcompute::policy::Policy;
    use dropcompute_cli::commands::tune::{AutoJson, TuneJson};
    let dir = hermetic::temp_dir("tune-every-policy");
    let mut enabled = 0;
    for policy in Policy::ALL {
        for split in ["1", "2"] {
            let what = format!("{policy} --tail-split {split}");
            let out = dir.path().join(format!("{policy}-{split}"));
            let mut args = vec!["train", "--ranks", "4", "--micro-batches", "4", "--steps", "20"];
            args.extend(["--slow-rank", "1:2", "--time-mode", "virtual", "--warmup-steps", "3"]);
            args.extend(["--policy", policy.name(), "--tail-split", split]);
            let o = dropcompute(&args, Some(&out));
            assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
            let report: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
            let used = report["dropcompute"]["threshold_ms"].as_f64();
            let cfg = &report["config"];
            assert_eq!(cfg["warmup_steps"], 3, "{what}");
            // The baseline's log tunes to the run's threshold.
            let base = out.join("compute_log_baseline.csv");
            let (seed, b) = (cfg["seed"].to_string(), cfg["backup_workers"].to_string());
            let check = cfg["check"].as_str().unwrap().to_string();
            let mut tune = vec!["tune", "--trace", base.to_str().unwrap(), "--warmup-steps", "3", "--json"];
            tune.extend(["--auto-for", policy.name(), "--tail-split", split, "--seed", &seed]);
            tune.extend(["--backup-workers", &b, "--check", &check]);
            let t = dropcompute(&tune, None);
            assert!(t.status.success(), "{what}: tune --auto-for: {}", String::from_utf8_lossy(&t.stderr));
            let auto: Vec<AutoJson> = serde_json::from_slice(&t.stdout).unwrap();
            assert_eq!(auto[0].threshold_ms, used, "{what}: the baseline's log tunes to the run's threshold");
            // The drop policies enable a threshold here (a 2x slow rank): the equality is not
            // only "off = off".
            if policy.drops() {
                assert!(used.is_some(), "{what}: a drop policy enables a threshold with a 2x slow rank");
                enabled += 1;
            }
            // The DropCompute run's log loads, every step kept, the fill counted.
            let dc = out.join("compute_log_dropcompute.csv");
            let t = dropcompute(&["tune", "--trace", dc.to_str().unwrap(), "--warmup-steps", "3", "--json"], None);
            assert!(
                t.status.success(),
                "{what}: tune --trace (DropCompute log): {}",
                String::from_utf8_lossy(&t.stderr)
            );
            let v: Vec<TuneJson> = serde_json::from_slice(&t.stdout).unwrap();
            assert_eq!((v[0].ranks, v[0].micro_batches, v[0].steps), (4, 4, 20), "{what}: every step kept");
            let text = std::fs::read_to_string(&dc).unwrap();
            let dropped = text.lines().any(|l| l.contains(",true,"));
            let notes = &v[0].notes;
            let says = |start: &str| notes.iter().any(|n| n.contains(start));
            assert_eq!(says("censored cell(s)"), dropped, "{what}: censored cells iff a row was dropped: {notes:?}");
            // Moved work: a rebalanced slow rank or a skipped backup worker holds fewer than M.
            let moves = matches!(policy, Policy::Rebalance | Policy::RebalanceDrop | Policy::BackupWorkers);
            assert_eq!(says("the policy did not assign"), moves, "{what}: unassigned cells: {notes:?}");
            // Tail launches are grouped into whole micro-batches (never with split 1).
            if split == "1" {
                assert!(!says("tail launch(es)"), "{what}: {notes:?}");
            }
        }
    }
    assert_eq!(
        enabled, 10,
        "drop-before, drop-predictive, rebalance-drop, length-predictive, cost-balance x 2 tail shapes"
    );
}

/// Why a censored cell takes the rank's mean over the log, not over its step: in virtual time
/// the DropCompute run draws the baseline's latencies (the same keyed draws), so the baseline's
/// log holds the true latency of every micro-batch the DropCompute run dropped. For both drop
/// policies, the DropCompute log's trace equals the baseline's on every measured cell, and its
/// censored cells (the log mean) are closer to the truth, by mean absolute error, than the
/// rank's mean in the step would be (the steps that drop are those whose measured
/// micro-batches were slow: a selected, upward-biased mean).
#[test]
fn censored_cells_take_the_ranks_log_mean_which_is_closer_to_the_truth_than_the_steps() {
    use dropcompute::trace::compute_log::ComputeLogRecord;
    let dir = hermetic::temp_dir("censored-fill");
    for policy in ["drop-predictive", "drop-before"] {
        let out = dir.path().join(policy);
        let mut args = vec!["train", "--ranks", "4", "--micro-batches", "4", "--steps", "20"];
        args.extend(["--slow-rank", "1:2", "--time-mode", "virtual", "--warmup-steps", "3", "--policy", policy]);
        let o = dropcompute(&args, Some(&out));
        assert!(o.status.success(), "{policy}: {}", String::from_utf8_lossy(&o.stderr));
        let trace = |run: &str| {
            let log = out.join(format!("compute_log_{run}.csv"));
            load(std::slice::from_ref(&log), &LoadOptions::default()).unwrap().remove(0).trace
        };
        let (base, dc) = (trace("baseline"), trace("dropcompute"));
        assert_eq!((dc.steps(), dc.ranks(), dc.micro_batches()), (base.steps(), base.ranks(), 4), "{policy}");
        let rows: Vec<ComputeLogRecord> = csv::Reader::from_path(out.join("compute_log_dropcompute.csv"))
            .unwrap()
            .deserialize()
            .map(Result::unwrap)
            .collect();
        let cell = |r: &ComputeLogRecord| {
            let s = dc.steps().iter().position(|&s| s == r.global_step).unwrap();
            (s * 4 + r.rank as usize) * 4 + r.local_step as usize
        };
        let (mut log_err, mut step_err, mut censored) = (0.0, 0.0, 0);
        for r in &rows {
            let i = cell(r);
            if !r.compute_dropped {
                assert_eq!(dc.latencies_ns()[i], base.latencies_ns()[i], "{policy}: a measured cell is the draw");
                continue;
            }
            let same: Vec<f64> = rows
                .iter()
                .filter(|x| (x.global_step, x.rank, x.compute_dropped) == (r.global_step, r.rank, false))
                .map(|x| x.duration_ns as f64)
                .collect();
            let truth = base.latencies_ns()[i];
            log_err += (dc.latencies_ns()[i] - truth).abs();
            step_err += (same.iter().sum::<f64>() / same.len() as f64 - truth).abs();
            censored += 1;
        }
        assert!(censored > 0, "{policy}: the run dropped");
        assert!(log_err < step_err, "{policy}: log mean MAE {} ms vs step mean {} ms", log_err / 1e6, step_err / 1e6);
        eprintln!(
            "{policy}: {censored} censored cells, MAE {:.2} ms (log mean) vs {:.2} ms (step mean)",
            log_err / censored as f64 / 1e6,
            step_err / censored as f64 / 1e6
        );
    }
}
