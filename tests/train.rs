//! `dropcompute train` end to end on the mock: a small thread-mode job through the library
//! (loss falls, reports consistent, timeline rows), and the CLI in thread and process mode
//! giving bitwise-identical parameters with the threshold off.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;

use clap::Parser;
use dropcompute_cli::commands::train::Args as TrainArgs;
use dropcompute_train::job::{Job, RunKind};
use dropcompute_train::output::StagedOut;
use dropcompute_train::report::RunMetadata;
use dropcompute_train::run;
use dropcompute_train::summary;
use dropcompute_train::{metrics, params};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    train: TrainArgs,
}

/// The validated job of `train args`, prepared without the calling shell's product variables
/// (`Job::prepare` reads `DROPCOMPUTE_MOCK_DEVICES`).
fn job(args: &[&str]) -> Job {
    hermetic::scrub_process_env();
    let mut v = vec!["train"];
    v.extend_from_slice(args);
    let cfg = Cli::parse_from(v).train.validate().unwrap();
    Job::prepare(cfg).unwrap()
}

/// The in-process mock is one per test process: tests that configure it take turns.
fn in_process_mock() -> std::sync::MutexGuard<'static, ()> {
    hermetic::scrub_process_env();
    static L: std::sync::Mutex<()> = std::sync::Mutex::new(());
    L.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn a_small_job_learns_and_its_reports_are_consistent() {
    let _mock = in_process_mock();
    let j =
        job(&["--ranks", "4", "--steps", "16", "--time-mode", "virtual", "--base-latency-ms", "1", "--threshold", "9"]);
    let rt = run::mock_runtime(&j).unwrap();
    let out = run::run_threads(&j, &rt, false).unwrap();
    run::check_lockstep(&out).unwrap();
    assert_eq!(out.len(), 4);
    let m = j.cfg.micro_batches;
    for (r, runs) in out.iter().enumerate() {
        assert_eq!(runs.len(), 2, "baseline and DropCompute");
        for o in runs {
            assert_eq!(o.reports.len(), 16);
            assert!(mean(&o.loss[12..]) < 0.7 * mean(&o.loss[..3]), "{:?} loss must fall: {:?}", o.kind, o.loss);
            for rep in &o.reports {
                // Every rank has data every step: computed + dropped = scheduled = M.
                assert!(rep.ranks.iter().all(|x| x.computed + x.dropped == m));
                // This rank's own records agree with the gathered row.
                let mine = &rep.ranks[r];
                let computed = rep.micro_batches.iter().filter(|mb| !mb.dropped).count() as u32;
                let samples: u64 = rep.micro_batches.iter().filter(|mb| !mb.dropped).map(|mb| mb.samples).sum();
                assert_eq!((computed, samples), (mine.computed, mine.samples));
                // The divisor is the global computed count (realized normalization).
                assert_eq!(rep.divisor, rep.ranks.iter().map(|x| x.samples).sum::<u64>() as f64);
            }
        }
        let base = &runs[0];
        assert_eq!(base.kind, RunKind::Baseline);
        assert!(base.reports.iter().all(|r| r.global_dropped() == 0));
    }
    let dc = &out[0][1];
    assert!(dc.reports.iter().any(|r| r.global_dropped() > 0), "a 9 ms threshold drops in this setting");
    assert!(dc.reports[..j.cfg.warmup_steps as usize].iter().all(|r| r.global_dropped() == 0));

    let tmp = hermetic::temp_dir("train-test");
    let dir = tmp.path().join("out");
    let staged = StagedOut::new(&dir).unwrap();
    let meta = RunMetadata::new(&j.cfg, "cpu-mock (in-process)".into(), std::time::SystemTime::now());
    let predicted = summary::job_prediction(&j, &out);
    let rep = summary::report(&j, &out, meta, predicted.as_ref()).unwrap();
    summary::write_outputs(&staged, &j, &rep, &out, predicted.as_ref()).unwrap();
    staged.commit().unwrap();
    // The parameters files hold each run's final parameters bit for bit, in the model's shape.
    for (i, run) in ["baseline", "dropcompute"].iter().enumerate() {
        let (shape, params) = params::load(&dir.join(format!("params_{run}.safetensors"))).unwrap();
        assert_eq!(shape, j.shape, "{run}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&params), bits(&out[0][i].params), "{run}");
        assert_ne!(bits(&params), bits(&j.init), "{run} trained");
    }
    // steps.csv: one row per step per run, the reports' counts, divisor, step time and loss.
    let rows = metrics::read_csv(&dir.join("steps.csv")).unwrap();
    assert_eq!(rows.len(), 3 * 16, "baseline, dropcompute and predicted rows");
    assert_eq!(rows.iter().filter(|r| r.run == "predicted").count(), 16);
    for (i, run) in ["baseline", "dropcompute"].iter().enumerate() {
        let o = &out[0][i];
        let mine: Vec<_> = rows.iter().filter(|r| r.run == *run).collect();
        assert_eq!(mine.len(), o.reports.len());
        for (row, rep) in mine.iter().zip(&o.reports) {
            assert_eq!(row.step, rep.step);
            assert_eq!(row.computed + row.dropped, 4 * u64::from(m), "{run} step {}", rep.step);
            assert_eq!((row.computed, row.dropped), (rep.global_computed(), rep.global_dropped()));
            assert_eq!(row.divisor, rep.global_samples() as f64, "realized normalization");
            assert_eq!(row.step_ms, rep.step_ns as f64 / 1e6);
            assert_eq!(row.loss, Some(o.loss[rep.step as usize]));
            assert!(row.compute_ms <= row.step_ms);
        }
        assert_eq!(mine.iter().map(|r| r.dropped).sum::<u64>() > 0, i == 1, "only DropCompute drops");
    }
    let tl: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("timeline.json")).unwrap()).unwrap();
    let names: Vec<(u64, String)> = tl["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    for pid in [1, 2] {
        let mut rows: Vec<&str> = names.iter().filter(|(p, _)| *p == pid).map(|(_, n)| n.as_str()).collect();
        rows.sort_unstable();
        assert_eq!(rows, vec!["rank 0", "rank 1", "rank 2", "rank 3"]);
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert!(report["dropcompute"]["accuracy"].as_f64().unwrap() > 0.8);
    assert!(report["speedup"].as_f64().is_some());
    let log = std::fs::read_to_string(dir.join("compute_log_dropcompute.csv")).unwrap();
    assert_eq!(log.lines().count() - 1, 4 * 16 * m as usize, "one row per scheduled micro-batch");
    // Every column of both compute logs, against the StepReports they were written from.
    assert_ne!(j.cfg.micro_batch_size, 4, "world size and batch must differ to tell their columns apart");
    assert_compute_log_matches(&dir.join("compute_log_baseline.csv"), &out, 0, m);
    assert_compute_log_matches(&dir.join("compute_log_dropcompute.csv"), &out, 1, m);
}

/// The columns of our compute log, in order (the reference's eight, then ours).
const COMPUTE_LOG_COLUMNS: [&str; 18] = [
    "global_step",
    "local_step",
    "world_size",
    "batch",
    "sentence_length",
    "computed_batch",
    "compute_dropped",
    "iteration_time_ms",
    "rank",
    "start_ns",
    "duration_ns",
    "micro_batches",
    "split",
    "parts",
    "cost",
    "deadline_ns",
    "clock_start_ns",
    "bucket",
];

/// Checks every row and column of the compute log at `path` (written by `train` for run
/// `run` of `outcomes`) against the `StepReport`s of that run: rows rank by rank, step by step,
/// micro-batch by micro-batch; each value recomputed here from the report's fields (not
/// through `StepReport::compute_log`): computed_batch is this rank's running sum of computed
/// samples in the step, iteration_time_ms = duration_ns / 1e6; micro_batches = `m`, whole
/// micro-batches only (split, parts and cost 1), clock_start_ns = the end of the rank's last
/// computed micro-batch minus its compute time (or the drop time when none was computed),
/// deadline_ns = that plus the step's threshold (0 without one); bucket empty (no buckets).
fn assert_compute_log_matches(path: &Path, outcomes: &[Vec<dropcompute_train::job::RankOutcome>], run: usize, m: u32) {
    let mut rd = csv::Reader::from_path(path).unwrap();
    let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, COMPUTE_LOG_COLUMNS, "{}", path.display());
    let rows: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
    let mut i = 0;
    let (mut dropped, mut distinct_start_duration) = (0, 0);
    for runs in outcomes {
        let o = &runs[run];
        for rep in &o.reports {
            let mut computed = 0u64;
            let t0 = match rep.micro_batches.iter().rfind(|mb| !mb.dropped) {
                Some(last) => last.start_ns + last.duration_ns - rep.ranks[o.rank as usize].compute_ns,
                None => rep.micro_batches[0].start_ns,
            };
            // The clock start is the end of the previous step's update (`step_end_ns`).
            if let Some(prev) = o.reports.iter().find(|r| r.step + 1 == rep.step) {
                assert_eq!(t0, prev.step_end_ns, "{} step {} rank {}: clock start", path.display(), rep.step, o.rank);
            }
            let deadline = rep.threshold_ns.map_or(0, |t| t0 + t);
            for mb in &rep.micro_batches {
                if !mb.dropped {
                    computed += mb.samples;
                }
                let row = rows.get(i).unwrap_or_else(|| panic!("{}: only {} rows", path.display(), rows.len()));
                let want: [String; 18] = [
                    rep.step.to_string(),
                    mb.micro_batch.to_string(),
                    rep.world_size.to_string(),
                    mb.samples.to_string(),
                    "0".into(),
                    computed.to_string(),
                    mb.dropped.to_string(),
                    (mb.duration_ns as f64 / 1e6).to_string(),
                    o.rank.to_string(),
                    mb.start_ns.to_string(),
                    mb.duration_ns.to_string(),
                    m.to_string(),
                    "1".into(),
                    "1".into(),
                    "1.0".into(),
                    deadline.to_string(),
                    t0.to_string(),
                    // The digits job has no length buckets.
                    String::new(),
                ];
                for (c, w) in COMPUTE_LOG_COLUMNS.iter().zip(&want) {
                    let got = &row[header.iter().position(|h| h == c).unwrap()];
                    if *c == "iteration_time_ms" {
                        assert_eq!(
                            got.parse::<f64>().unwrap(),
                            w.parse::<f64>().unwrap(),
                            "{} row {i} {c}",
                            path.display()
                        );
                    } else {
                        assert_eq!(got, w, "{} row {i} column {c}", path.display());
                    }
                }
                assert_eq!((mb.step, rep.rank), (rep.step, o.rank));
                dropped += usize::from(mb.dropped);
                distinct_start_duration += usize::from(mb.start_ns != mb.duration_ns);
                i += 1;
            }
        }
    }
    assert_eq!(i, rows.len(), "{}: one row per scheduled micro-batch", path.display());
    // The values can tell swapped columns apart.
    assert!(distinct_start_duration > 0);
    assert_eq!(dropped > 0, run == 1, "{}: only the DropCompute run drops here", path.display());
}

/// `--threshold auto` runs with `tune::recommend` on the baseline run's trace under the job's
/// drop-rate guardrail (`--max-drop-rate`): a tighter cap picks a larger threshold whose
/// replayed drop rate stays within it, and a zero cap turns dropping off.
#[test]
fn auto_threshold_honours_the_drop_rate_guardrail() {
    let _mock = in_process_mock();
    use dropcompute::tune::{Verdict, recommend};
    let mut chosen = Vec::new();
    for cap in [0.25, 0.05, 0.0] {
        let mut j = job(&["--ranks", "4", "--steps", "40", "--time-mode", "virtual", "--threshold", "auto"]);
        j.cfg.guardrails.max_drop_rate = cap;
        j.cfg.guardrails.min_batch_fraction = 0.0;
        let rt = run::mock_runtime(&j).unwrap();
        let out = run::run_threads(&j, &rt, false).unwrap();
        let (base, dc) = (&out[0][0], &out[0][1]);
        assert_eq!((base.kind, dc.kind), (RunKind::Baseline, RunKind::DropCompute));
        let trace = dropcompute::schedule::auto::trace_of_reports(&base.reports).unwrap();
        let verdict = recommend(&trace, &j.auto_recommend()).verdict;
        // Every rank runs with rank 0's recommendation.
        for runs in &out {
            assert_eq!(runs[1].threshold_ns, verdict.threshold().as_ns(), "cap {cap}");
        }
        match verdict {
            Verdict::Enable(c) => assert!(c.drop_rate <= cap && c.drop_rate > 0.0, "cap {cap}: {c:?}"),
            Verdict::Decline(_) => assert!(dc.reports.iter().all(|r| r.global_dropped() == 0)),
        }
        chosen.push(dc.threshold_ns);
    }
    let (loose, tight) = (chosen[0].expect("0.25 enables"), chosen[1].expect("0.05 enables"));
    assert!(tight > loose, "a tighter cap needs a later deadline: {tight} vs {loose} ns");
    assert_eq!(chosen[2], None, "a zero drop-rate cap leaves the threshold off");
}

/// A rank process of `--launch processes` sees exactly its parent's validated job: the
/// `JobSpec` (every flag, `--resume`, `--checkpoint-dir`, the resume step and the auto guardrail)
/// survives the JSON of the spec file the child reads (`launch::ChildSpec`), and the child's
/// rebuilt `Job` describes itself with the same spec.
#[test]
fn a_rank_process_receives_the_parents_validated_config() {
    use dropcompute::launch::ChildSpec;
    use dropcompute_train::job::JobSpec;
    hermetic::scrub_process_env();
    let tmp = hermetic::temp_dir("train-spec");
    let dir = tmp.path();
    let ck = dir.join("ck");
    let args = [
        "train",
        "--ranks",
        "3",
        "--micro-batches",
        "5",
        "--micro-batch-size",
        "4",
        "--threshold",
        "7.5",
        "--epochs",
        "2",
        "--seed",
        "11",
        "--launch",
        "processes",
        "--no-compare",
        "--noise",
        "lognormal:0.3",
        "--slow-rank",
        "1:1.5",
        "--base-latency-ms",
        "3",
        "--check",
        "before",
        "--sync-lag",
        "1",
        "--normalization",
        "nominal",
        "--bucket-mb",
        "0.5",
        "--lr",
        "0.05",
        "--momentum",
        "0.8",
        "--hidden",
        "24",
        "--holdout",
        "0.3",
        "--warmup-steps",
        "2",
        "--checkpoint-every",
        "4",
        "--time-mode",
        "virtual",
        "--resume",
        ck.to_str().unwrap(),
        "--checkpoint-dir",
        ck.to_str().unwrap(),
    ];
    let cfg = Cli::parse_from(args).train.validate().unwrap();
    assert_eq!(cfg.resume.as_deref(), Some(ck.as_path()));
    assert_eq!(cfg.checkpoint_dir, ck);
    let mut cfg = cfg;
    cfg.guardrails.max_drop_rate = 0.125;
    let spec = JobSpec { cfg, resume_step: Some(4) };
    let child = ChildSpec {
        program: run::CHILD_PROGRAM.into(),
        rank: 2,
        world_size: 3,
        unique_id: "00ff".into(),
        config: serde_json::to_value(&spec).unwrap(),
        result: dir.join("rank-2.result.json"),
        parent_pid: 0,
    };
    let path = dir.join("rank-2.spec.json");
    std::fs::write(&path, serde_json::to_vec(&child).unwrap()).unwrap();
    let seen: JobSpec = ChildSpec::read(&path).unwrap().config().unwrap();
    assert_eq!(seen, spec);
    let job = Job::from_spec(seen).unwrap();
    assert_eq!(job.spec(), spec);
    assert_eq!((job.resume_step, job.cfg.guardrails.max_drop_rate, job.shape.hidden), (Some(4), 0.125, 24));
    // A spec that is not a train job is refused with the file named, not half-used.
    let bad = ChildSpec { config: serde_json::json!({"sizes": [4]}), ..child };
    std::fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
    let err = ChildSpec::read(&path).unwrap().config::<JobSpec>().unwrap_err();
    assert!(err.to_string().contains("config"), "{err}");
}

fn train_cli(out: &Path, ranks: u32, threshold: &str, extra: &[&str]) -> Vec<u32> {
    let _ = std::fs::remove_dir_all(out);
    let o = hermetic::dropcompute()
        .args(["train", "--ranks", &ranks.to_string(), "--steps", "3", "--micro-batches", "4", "--hidden", "16"])
        .args(["--threshold", threshold, "--warmup-steps", "1", "--no-compare", "--time-mode", "virtual"])
        .args(["--out", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, p) = params::load(&out.join("params_dropcompute.safetensors")).unwrap();
    p.iter().map(|x| x.to_bits()).collect()
}

/// Thread ranks and process ranks reduce every gradient element in the same documented order
/// (rank 0, 1, …, n-1: the mock's reduce-scatter and its shared-memory all-reduce), so `train`
/// ends with bitwise-identical parameters in both modes for any world size, with and without a
/// threshold that drops micro-batches. (Before, the process ranks' ring summed each segment
/// starting at a different rank: 838 of 9,610 floats differed at 3 ranks.)
#[test]
fn process_ranks_give_the_same_parameters_as_thread_ranks() {
    let tmp = hermetic::temp_dir("train-modes");
    let base = tmp.path();
    for n in [1u32, 2, 3, 5, 8] {
        for threshold in ["off", "30"] {
            let t_out = base.join(format!("threads-{n}-{threshold}"));
            let threads = train_cli(&t_out, n, threshold, &["--launch", "threads"]);
            let procs =
                train_cli(&base.join(format!("procs-{n}-{threshold}")), n, threshold, &["--launch", "processes"]);
            assert!(!threads.is_empty());
            assert_eq!(threads.len(), procs.len());
            let differing = threads.iter().zip(&procs).filter(|(a, b)| a != b).count();
            assert_eq!(
                differing,
                0,
                "{n} ranks, threshold {threshold}: bitwise identical final parameters ({differing} of {} differ)",
                threads.len()
            );
            if threshold != "off" {
                let report: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(t_out.join("report.json")).unwrap()).unwrap();
                let drop = report["dropcompute"]["drop_rate"].as_f64().unwrap();
                assert!(drop > 0.0 && drop < 1.0, "{n} ranks: the threshold drops some micro-batches: {drop}");
            }
        }
    }
}

#[test]
fn bad_inputs_fail_before_anything_is_written() {
    let tmp = hermetic::temp_dir("train-bad");
    let out = tmp.path().join("out");
    let bad_csv = tmp.path().join("bad.csv");
    let missing = tmp.path().join("missing").join("d.csv");
    let missing = missing.to_str().unwrap();
    std::fs::write(&bad_csv, "1,2,3,0\n1,x,3,1\n").unwrap();
    let cases: Vec<(Vec<String>, &str, i32)> = vec![
        (vec!["--ranks".into(), "0".into()], "--ranks 0", 2),
        (vec!["--micro-batches".into(), "0".into()], "--micro-batches 0", 2),
        (vec!["--threshold".into(), "-3".into()], "--threshold -3", 2),
        (vec!["--threshold".into(), "NaN".into()], "--threshold NaN", 2),
        (vec!["--data".into(), missing.into()], missing, 6),
        (vec!["--data".into(), bad_csv.display().to_string()], ":2: column 2", 6),
    ];
    for (args, needle, code) in cases {
        let _ = std::fs::remove_dir_all(&out);
        let o = hermetic::dropcompute()
            .arg("train")
            .args(&args)
            .args(["--out", out.to_str().unwrap(), "--steps", "10", "--warmup-steps", "0", "--time-mode", "virtual"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none(), "nothing written for {args:?}");
    }
    let o = hermetic::dropcompute()
        .args(["train", "--ranks", "9", "--steps", "1", "--threshold", "5", "--time-mode", "virtual"])
        .env("DROPCOMPUTE_MOCK_DEVICES", "8")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("9 ranks on this host but only 8 devices"), "{err}");
}

/// `--threshold auto` on an epoch-bounded run whose baseline has fewer than `tune::MIN_STEPS`
/// steps after warm-up (4 ranks x 8 x 8 samples a step: one epoch of the digits is 6 steps) is
/// refused with "insufficient data" instead of a threshold fitted to noise, by `Job::prepare`
/// once the data is loaded (before any device call; the ranks found it after the baseline).
#[test]
fn auto_threshold_refuses_a_baseline_shorter_than_the_minimum() {
    hermetic::scrub_process_env();
    let args = ["train", "--ranks", "4", "--epochs", "1", "--time-mode", "virtual", "--threshold", "auto"];
    let cfg = Cli::parse_from(args).train.validate().unwrap();
    let e = Job::prepare(cfg).map(|_| ()).expect_err("too few steps to tune").to_string();
    assert!(e.contains("insufficient data") && e.contains("at least 10"), "{e}");
    assert!(e.contains("--epochs") && e.contains("the baseline runs 6 step(s)"), "{e}");
}

/// The progress bar with stdout redirected to a file and stderr a terminal (a pty): drawn on
/// stderr, ends at 6/6 (it showed 2/6 after the first step and 7/6 at the end, and nothing at
/// all when stdout was not a terminal), never shows `loss NaN` (the first loss is known only
/// after the second step).
#[test]
fn the_progress_bar_counts_steps_and_draws_whenever_stderr_is_a_terminal() {
    use std::io::Read;
    let tmp = hermetic::temp_dir("progress");
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let stdout = std::fs::File::create(tmp.path().join("stdout.txt")).unwrap();
    let mut child = hermetic::dropcompute()
        .args(["train", "--ranks", "2", "--steps", "6", "--threshold", "off", "--no-compare", "--time-mode", "virtual"])
        .stdout(stdout)
        .stderr(std::process::Stdio::from(pty.slave))
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    // The child and the Command dropped every copy of the slave: reading ends (EIO) at its end.
    let mut master = std::fs::File::from(pty.master);
    let mut drawn = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        drawn.extend_from_slice(&buf[..n]);
    }
    let drawn = String::from_utf8_lossy(&drawn);
    assert!(status.success(), "{drawn}");
    let counts: Vec<&str> =
        drawn.match_indices("/6 steps").map(|(i, _)| drawn[..i].rsplit(' ').next().unwrap()).collect();
    assert!(!counts.is_empty(), "a bar is drawn on the terminal stderr: {drawn:?}");
    assert_eq!(counts.last(), Some(&"6"), "ends at 6/6: {counts:?}");
    assert!(counts.iter().all(|c| c.parse::<u32>().is_ok_and(|c| c <= 6)), "never past 6/6: {counts:?}");
    assert!(!drawn.contains("NaN"), "no NaN loss: {drawn:?}");
    let table = std::fs::read_to_string(tmp.path().join("stdout.txt")).unwrap();
    assert!(!table.contains("/6 steps"), "stdout keeps only the table: {table}");
}
