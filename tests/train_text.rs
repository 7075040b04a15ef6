//! `train --task text` (issue 26 item 6): the text transformer through the digits job's driver.
//! A tiny run (`--text-model tiny`, 4 ranks, M = 4, one epoch of 800 documents, virtual time,
//! `--noise none`) per policy, table-driven, whose outputs the product reads back: both compute
//! logs through `simulate --trace` and `trace::load` (bucket and tokens columns on every row);
//! the ledgers in tokens (every unit of the plan computed exactly once in the epoch, on some
//! rank, under every policy; the ledger's tokens equal the sum of steps.csv's divisors, the
//! compute log's computed tokens and report.json's); report.json's metric (held-out loss per
//! token, no accuracy) and its speedup in tokens. The flags that do not apply to the text task
//! are refused with exit 2 naming the flag; a digits report carries none of the text fields.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use dropcompute::trace::{LoadOptions, load};

#[path = "support/tiny_text.rs"]
mod tiny_text;

/// The tiny text job (`tiny_text::TINY_TEXT`) with this file's flags.
fn text_args() -> Vec<&'static str> {
    [&tiny_text::TINY_TEXT[..], &["--epochs", "1"]].concat()
}

fn dropcompute(args: &[&str]) -> Output {
    hermetic::dropcompute().args(args).output().expect("run dropcompute")
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of a CSV file as header -> value maps.
fn csv_rows(path: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines.map(|l| header.iter().map(|h| h.to_string()).zip(l.split(',').map(str::to_owned)).collect()).collect()
}

#[test]
fn text_job_outputs_read_back_under_every_policy() {
    // (policy, threshold, extra flags): the fixed deadline of 0.5 ms drops in most steps of the
    // tiny model (a micro-batch of bucket 16 costs about 0.16 ms here); the tail split runs the
    // second model of b/2 documents and its own loss accumulator.
    let table: [(&str, &str, &[&str]); 6] = [
        ("drop-predictive", "0.5", &[]),
        ("drop-before", "0.5", &[]),
        ("length-predictive", "0.5", &[]),
        ("cost-balance", "0.5", &[]),
        ("synchronous", "off", &[]),
        ("drop-predictive", "0.5", &["--tail-split", "2"]),
    ];
    let dir = hermetic::temp_dir("train-text");
    let mut units_of_run = Vec::new();
    for (row, (policy, threshold, extra)) in table.into_iter().enumerate() {
        let out = dir.path().join(row.to_string());
        let mut args = text_args();
        args.extend(["--policy", policy, "--threshold", threshold, "--out", out.to_str().unwrap()]);
        args.extend(extra);
        let o = dropcompute(&args);
        assert!(o.status.success(), "{policy}: {}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("held-out loss (nats/token)") && stdout.contains("tokens/s computed"), "{stdout}");
        assert!(!stdout.contains("held-out accuracy"), "{stdout}");

        let report = json(&out.join("report.json"));
        assert_eq!(report["config"]["task"], "text", "{policy}");
        assert_eq!(report["config"]["text_model"], "tiny", "{policy}");
        let steps = csv_rows(&out.join("steps.csv"));
        for run in ["baseline", "dropcompute"] {
            let r = &report[run];
            assert!(r["accuracy"].is_null(), "{policy}/{run}: the text task has no accuracy");
            let holdout = r["holdout_loss_per_token"].as_f64().expect("the text metric");
            // Below uniform over the 258 token ids (ln 258 = 5.553) after one epoch, and
            // positive.
            assert!(holdout > 0.0 && holdout < 258f64.ln(), "{policy}/{run}: held-out loss {holdout}");
            let tokens = r["tokens_computed"].as_u64().expect("tokens computed");

            // Ledger: every unit of the epoch computed exactly once over the ranks (dropped
            // ones re-queued), its tokens those of steps.csv's divisors and the compute log.
            let ledger = json(&out.join(format!("ledger_{run}.json")));
            let ranks = ledger.as_array().expect("one ledger per rank");
            assert_eq!(ranks.len(), 4);
            let mut ids: Vec<u64> = ranks
                .iter()
                .flat_map(|l| l["computed"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()))
                .collect();
            ids.sort_unstable();
            let n = ids.len() as u64;
            assert_eq!(ids, (0..n).collect::<Vec<_>>(), "{policy}/{run}: each unit once in the epoch");
            for l in ranks {
                for d in l["dropped"].as_array().unwrap() {
                    assert_eq!(d["fate"], "Requeued", "{policy}/{run}: {d}");
                }
            }
            let ledger_tokens: u64 = ranks.iter().map(|l| l["computed_tokens"].as_u64().unwrap()).sum();
            let divisors: f64 =
                steps.iter().filter(|s| s["run"] == run).map(|s| s["divisor"].parse::<f64>().unwrap()).sum();
            assert_eq!(ledger_tokens as f64, divisors, "{policy}/{run}: ledger tokens vs divisors");
            assert_eq!(ledger_tokens, tokens, "{policy}/{run}: ledger tokens vs report.json");
            units_of_run.push((row, run, n, ledger_tokens));

            // The compute log: bucket and tokens on every row, its computed tokens the ledger's;
            // read back by the library and by `simulate --trace`.
            let log = out.join(format!("compute_log_{run}.csv"));
            let rows = csv_rows(&log);
            assert!(rows.iter().all(|r| !r["bucket"].is_empty() && !r["tokens"].is_empty()), "{policy}/{run}");
            let log_tokens: u64 = rows
                .iter()
                .filter(|r| r["compute_dropped"] == "false")
                .map(|r| r["tokens"].parse::<u64>().unwrap())
                .sum();
            assert_eq!(log_tokens, ledger_tokens, "{policy}/{run}: compute log tokens");
            let loaded = load(std::slice::from_ref(&log), &LoadOptions::default()).expect("the library loads the log");
            assert_eq!(loaded[0].trace.world_size(), 4, "{policy}/{run}");
            let sim = dropcompute(&["simulate", "--trace", log.to_str().unwrap()]);
            assert!(sim.status.success(), "simulate --trace {policy}/{run}: {}", String::from_utf8_lossy(&sim.stderr));
            let said = String::from_utf8_lossy(&sim.stdout);
            assert!(said.contains("length-predictive") && said.contains("cost-balance"), "{said}");
        }
        // The measured speedup is in tokens per second.
        let (b, d) = (report["baseline"]["tokens_per_s"].as_f64(), report["dropcompute"]["tokens_per_s"].as_f64());
        let speedup = report["speedup"].as_f64().expect("a measured speedup");
        assert!((speedup - d.unwrap() / b.unwrap()).abs() < 1e-12, "{policy}: {speedup}");
    }
    // Every run of every policy computed the epoch's tokens; both runs of a row its units (a
    // row with a tail split deals units of b/2 documents).
    let (_, _, _, t0) = units_of_run[0];
    for pair in units_of_run.chunks(2) {
        let [(row, _, n_base, _), (_, _, n, _)] = [pair[0], pair[1]];
        assert_eq!(n, n_base, "row {row}: both runs compute the epoch's units");
    }
    for &(row, run, _, t) in &units_of_run {
        assert_eq!(t, t0, "row {row}/{run}: the epoch's tokens");
    }
}

#[test]
fn text_refuses_the_flags_that_do_not_apply() {
    // (extra flags, the flag named)
    let table: [(&[&str], &str); 6] = [
        (&["--data", "x.csv"], "--data"),
        (&["--classes", "3"], "--classes"),
        (&["--hidden", "64"], "--hidden"),
        (&["--momentum", "0.5"], "--momentum"),
        (&["--base-latency-ms", "3"], "--base-latency-ms"),
        (&["--text-documents", "1"], "--text-documents"),
    ];
    for (extra, flag) in table {
        let mut args = text_args();
        args.extend(extra);
        let o = dropcompute(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
    // The text flags without the text task.
    for (extra, flag) in [(&["--text-model", "tiny"], "--text-model"), (&["--text-documents", "9"], "--text-documents")]
    {
        let mut args = vec!["train", "--ranks", "2", "--steps", "1", "--threshold", "off"];
        args.extend(extra);
        let o = dropcompute(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
}

#[test]
fn a_digits_report_has_no_text_fields() {
    let dir = hermetic::temp_dir("train-digits-echo");
    let out = dir.path().join("o");
    let args = ["train", "--ranks", "2", "--micro-batches", "2", "--steps", "2", "--threshold", "off"];
    let mut args = args.to_vec();
    args.extend(["--time-mode", "virtual", "--out", out.to_str().unwrap()]);
    let o = dropcompute(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(out.join("report.json")).unwrap();
    for key in ["\"task\"", "text_model", "holdout_loss_per_token", "tokens_computed", "tokens_per_s"] {
        assert!(!text.contains(key), "{key} in a digits report:\n{text}");
    }
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(report["dropcompute"]["accuracy"].as_f64().is_some_and(|a| (0.0..=1.0).contains(&a)));
    assert!(out.join("params_dropcompute.safetensors").exists());
}

#[test]
fn a_text_job_deals_plan_units_and_keeps_the_per_node_cost_of_its_bucket_recipes() {
    use dropcompute_train::transformer_graphs::forward_backward_recipe_name;
    let argv = ["t", "--task", "text", "--text-model", "tiny", "--text-documents", "400", "--ranks", "4"];
    let mut argv = argv.to_vec();
    argv.extend(["--micro-batch-size", "4", "--tail-split", "2", "--threshold", "1", "--noise", "none"]);
    let args = <dropcompute_cli::commands::train::Args as clap::FromArgMatches>::from_arg_matches(
        &<dropcompute_cli::commands::train::Args as clap::Args>::augment_args(clap::Command::new("t"))
            .get_matches_from(argv),
    )
    .expect("args");
    let job = dropcompute_train::job::Job::prepare(args.validate().expect("valid")).expect("a text job");
    let text = job.text.as_ref().expect("the text inputs");
    // Units of b/S = 2 documents, dealt one id per part; the baseline merges two.
    assert_eq!((text.rows, text.unit_rows, job.part_size()), (4, 2, 1));
    assert_eq!(job.units(), text.plan.units());
    assert_eq!(job.param_len(), text.model.param_len());
    // The training documents of 400 (`--holdout` 0.2 held out), every one in one unit of at
    // most 2 documents.
    let mut docs: Vec<u32> = (0..text.plan.units()).flat_map(|u| text.plan.unit(u).unwrap().docs.clone()).collect();
    assert!(text.plan.units() >= text.train.len() as u64 / 2);
    docs.sort_unstable();
    assert_eq!(docs, (0..text.train.len() as u32).collect::<Vec<_>>());
    assert_eq!(text.train.len(), 320);
    assert!(text.holdout_tokens > 0 && !text.holdout.is_empty());
    let m = job.mock_config().expect("a mock configuration");
    // No base latency: each bucket's recipe costs its per-node model; the tail recipe of each
    // bucket draws its whole recipe's noise.
    assert!(m.graph_base_latency_ns.is_empty(), "{:?}", m.graph_base_latency_ns);
    let alias: Vec<(String, String)> = m.graph_noise_alias.into_iter().collect();
    let mut want: Vec<(String, String)> = [8, 16]
        .into_iter()
        .map(|len| {
            (forward_backward_recipe_name(&text.model, len, 2), forward_backward_recipe_name(&text.model, len, 4))
        })
        .collect();
    want.sort();
    assert_eq!(alias, want);
}

#[test]
fn validate_covers_the_text_task() {
    // `validate` runs the text job from its `train` flags after `--` (both runs, the
    // prediction from the baseline's length-carrying trace, the measurement) for the blind and
    // the two length-aware policies. Without a slow rank, and with rank 3 slowed 2x at sync lag
    // 0 (its slower update starts it late every step, a lag its cut work hides: the replay
    // keeps the clock skew the baseline's count rows measured), the prediction reproduces the
    // run in virtual time (the error of validate's recorded target, 0.5 %).
    let o = dropcompute(&[
        "validate",
        "--ranks",
        "4",
        "--micro-batches",
        "4",
        "--steps",
        "12",
        "--threshold",
        "0.5",
        "--check",
        "predictive",
        "--time-mode",
        "virtual",
        "--seeds",
        "0",
        "--sync-lag",
        "0",
        "--slow-rank",
        "none,3:2",
        "--policy",
        "drop-predictive,length-predictive,cost-balance",
        "--json",
        "--",
        "--task",
        "text",
        "--text-model",
        "tiny",
        "--text-documents",
        "800",
        "--micro-batch-size",
        "4",
        "--noise",
        "none",
    ]);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 6, "{v}");
    for r in rows {
        assert!(r["drop_rate_measured"].as_f64().unwrap() > 0.0, "{r}");
        for err in ["speedup_error", "step_error"] {
            let e = r[err].as_f64().unwrap();
            assert!(e.abs() < 0.005, "{err} {e}: {r}");
        }
    }
}

/// `--threshold auto` tunes the length-aware policies on their own replay with the buckets and
/// tokens of every rank's baseline (`schedule::auto::choose` with every rank's reports): the
/// threshold the run used (report.json) and the drop rate its replay predicted (its stdout)
/// are those `tune --auto-for POLICY` finds on the baseline's compute log, whose rows carry
/// every rank's bucket and tokens (another path to the same trace: the log, not the reports).
/// The same log without those two columns replays blind to another drop rate here, so the
/// equality is not "blind = blind" (before, `train` tuned `length-predictive` as blind
/// `drop-predictive`, and `cost-balance` on a blind replay).
#[test]
fn auto_tunes_the_length_aware_policies_on_every_ranks_buckets() {
    use dropcompute_cli::commands::tune::AutoJson;
    let dir = hermetic::temp_dir("text-auto");
    for policy in ["length-predictive", "cost-balance"] {
        let out = dir.path().join(policy);
        let mut args = tiny_text::TINY_TEXT.to_vec();
        // A 2x slow rank: a deadline within the guardrails exists (without one both paths are off).
        args.extend(["--steps", "16", "--slow-rank", "1:2", "--policy", policy, "--threshold", "auto"]);
        args.extend(["--out", out.to_str().unwrap()]);
        let o = dropcompute(&args);
        assert!(o.status.success(), "{policy}: {}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        let report = json(&out.join("report.json"));
        let used = report["dropcompute"]["threshold_ms"].as_f64();
        let cfg = &report["config"];
        let (seed, check) = (cfg["seed"].to_string(), cfg["check"].as_str().unwrap().to_string());
        let base = out.join("compute_log_baseline.csv");
        // The log without its bucket and tokens columns: the blind trace.
        let text = std::fs::read_to_string(&base).unwrap();
        let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
        let keep: Vec<usize> = (0..header.len()).filter(|&i| header[i] != "bucket" && header[i] != "tokens").collect();
        assert_eq!(keep.len() + 2, header.len(), "{policy}: the log has both columns");
        let blind: String = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                keep.iter().map(|&i| f[i]).collect::<Vec<_>>().join(",") + "\n"
            })
            .collect();
        let blind_log = out.join("compute_log_blind.csv");
        std::fs::write(&blind_log, blind).unwrap();
        let tune = |log: &Path| -> AutoJson {
            let mut a = vec!["tune", "--trace", log.to_str().unwrap(), "--warmup-steps", "0", "--json"];
            a.extend(["--auto-for", policy, "--seed", &seed, "--check", &check]);
            let t = dropcompute(&a);
            assert!(t.status.success(), "{policy}: tune --auto-for: {}", String::from_utf8_lossy(&t.stderr));
            let mut auto: Vec<AutoJson> = serde_json::from_slice(&t.stdout).unwrap();
            assert!(auto[0].policy_replay, "{policy}: tuned on its own replay");
            auto.remove(0)
        };
        let (aware, blind) = (tune(&base), tune(&blind_log));
        assert!(used.is_some(), "{policy}: a threshold is enabled");
        assert_eq!(used, aware.threshold_ms, "{policy}: the baseline's log tunes to the run's threshold");
        // train prints its replay's drop rate to 2 decimals (`run::resolve_threshold`).
        let said = |a: &AutoJson| format!("drop rate {:.2} %", a.drop_rate.expect("enabled") * 100.0);
        assert_ne!(said(&aware), said(&blind), "{policy}: the buckets change the replay");
        assert!(stdout.contains(&said(&aware)), "{policy}: {} in {stdout}", said(&aware));
    }
}
