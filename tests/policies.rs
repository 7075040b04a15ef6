//! `tune --policy` and `simulate --policy`: the per-policy tables on the shipped what-if traces
//! (copies in data/traces), read back from `--json` and checked against direct replays.
use std::path::PathBuf;

use dropcompute::policy::{CheckMode, Policy, StepPolicy, TailShape, Threshold};
use dropcompute::sim::policies::{PolicyRun, replay_policy};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::whatif::PipelineAggregation;
use dropcompute::trace::{LoadOptions, load};
use dropcompute::tune::policies::PolicyComparison;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/traces").join(name)
}

#[derive(clap::Parser)]
struct Tune {
    #[command(flatten)]
    args: dropcompute_cli::commands::tune::Args,
}

#[derive(clap::Parser)]
struct Simulate {
    #[command(flatten)]
    args: dropcompute_cli::commands::simulate::Args,
}

fn tune_json(extra: &[&str]) -> Vec<PolicyComparison> {
    let mut v = vec!["tune", "--json"];
    v.extend_from_slice(extra);
    let args = <Tune as clap::Parser>::try_parse_from(v).expect("flags").args;
    let mut out = Vec::new();
    dropcompute_cli::commands::tune::run_to(&args, &mut out).expect("tune");
    serde_json::from_slice(&out).expect("tune --policy --json reads back")
}

fn simulate_out(extra: &[&str]) -> Vec<u8> {
    let mut v = vec!["simulate"];
    v.extend_from_slice(extra);
    let args = <Simulate as clap::Parser>::try_parse_from(v).expect("flags").args;
    let mut out = Vec::new();
    dropcompute_cli::commands::simulate::run_to(&args, &mut out).expect("simulate");
    out
}

/// Every row of the table is the replay of the parameter it prints, within the guardrails when
/// enabled; synchronous is exactly 0; backup workers with b = 0 is exactly synchronous.
#[test]
fn every_row_is_the_replay_of_its_printed_parameter() {
    let se = trace("trace-SE.csv.gz");
    let st = trace("trace-ST.csv.gz");
    let cs = tune_json(&["--trace", se.to_str().unwrap(), st.to_str().unwrap(), "--policy", "all"]);
    assert_eq!(cs.len(), 2);
    let loaded = load(&[se, st], &LoadOptions::default()).expect("load");
    let exec = ExecutionModel { warmup_steps: 0, ..ExecutionModel::default() };
    rows_are_replays(&cs, &loaded, exec);
    for c in &cs {
        assert_eq!(c.rows.iter().map(|r| r.policy).collect::<Vec<_>>(), Policy::ALL.to_vec());
        assert_eq!(c.rows[0].effective_speedup, 0.0);
        // A straggler-free bound is an upper bound on no-drop policies that keep the batch.
        assert!(c.straggler_free_speedup >= c.rows[5].effective_speedup - 1e-12);
    }
    assert!(cs.iter().all(|c| c.tail == TailShape::default()));
    // trace-SE drops profitably, trace-ST (structural, two ranks) does not.
    assert!(cs[0].rows[1].enabled && cs[0].rows[1].effective_speedup > 0.05, "{:?}", cs[0].rows[1]);
    assert!(!cs[1].rows[1].enabled);
    let b0 = replay_policy(
        &loaded[0].trace,
        &PolicyRun::new(
            StepPolicy { backup_workers: 0, ..StepPolicy::new(Policy::BackupWorkers) },
            Threshold::Off,
            exec,
        ),
    );
    let sync =
        replay_policy(&loaded[0].trace, &PolicyRun::new(StepPolicy::new(Policy::Synchronous), Threshold::Off, exec));
    assert_eq!(b0.per_step, sync.per_step);
    assert_eq!(b0.effective_speedup.to_bits(), sync.effective_speedup.to_bits());
}

/// Every row of `cs` (tuned on `loaded`) is the replay of the parameters it prints.
fn rows_are_replays(cs: &[PolicyComparison], loaded: &[dropcompute::trace::Loaded], exec: ExecutionModel) {
    for (c, l) in cs.iter().zip(loaded) {
        let t = &l.trace;
        for r in &c.rows {
            if r.enabled {
                assert!(r.drop_rate <= 0.10 && r.min_batch_fraction >= 0.75 && r.effective_speedup >= 0.02, "{r:?}");
                assert!(r.max_batch_fraction <= 1.0, "{r:?}");
            }
            let th = r.threshold_ms.and_then(Threshold::from_ms).unwrap_or(Threshold::Off);
            let params = StepPolicy {
                backup_workers: r.backup_workers.unwrap_or(1),
                budget: r.budget_ms.and_then(Threshold::from_ms).unwrap_or(Threshold::Off),
                budget_max_micro_batches: r.budget_max_micro_batches,
                tail: c.tail,
                ..StepPolicy::new(r.policy)
            };
            let mut run = PolicyRun::new(params, th, exec);
            if let Some(q) = r.estimator_quantile {
                run.estimator_quantile = q;
            }
            if !r.enabled && r.effective_speedup == 0.0 && r.drop_rate == 0.0 {
                continue; // declined without an admissible candidate: the synchronous figures
            }
            let p = replay_policy(t, &run);
            assert!((p.effective_speedup - r.effective_speedup).abs() < 1e-9, "{r:?} vs {}", p.effective_speedup);
            assert!((p.drop_rate - r.drop_rate).abs() < 1e-12, "{r:?}");
            assert_eq!(p.lost as f64 / f64::from(p.split), r.lost_micro_batches);
        }
    }
}

/// The tail shape (half micro-batches) on trace-SE, both pipeline models: every printed row
/// is its replay, and the best realizable policy reaches the targets (+20 % summed,
/// +12 % bottleneck) within the guardrails under the linear tail cost (whole micro-batches
/// stay below them: README's table).
#[test]
fn the_tail_shape_on_trace_se_is_replayed_and_beats_whole_micro_batches() {
    let se = trace("trace-SE.csv.gz");
    let exec = ExecutionModel { warmup_steps: 0, ..ExecutionModel::default() };
    for (pipeline, target) in [("sum", 0.20), ("bottleneck", 0.12)] {
        let p = if pipeline == "sum" { PipelineAggregation::Sum } else { PipelineAggregation::Bottleneck };
        let loaded = load(std::slice::from_ref(&se), &LoadOptions { pipeline: p, ..Default::default() }).expect("load");
        let policies = "drop-predictive,compute-budget";
        let args = ["--trace", se.to_str().unwrap(), "--pipeline", pipeline, "--policy", policies];
        let half = tune_json(&[&args[..], &["--tail-split", "2"]].concat());
        assert_eq!(half[0].tail, TailShape::split(2));
        rows_are_replays(&half, &loaded, exec);
        let best = |cs: &[PolicyComparison]| {
            cs[0].rows.iter().filter(|r| r.enabled).map(|r| r.effective_speedup).fold(f64::MIN, f64::max)
        };
        assert!(best(&half) >= target, "{pipeline}: {} < {target}", best(&half));
    }
}

/// `simulate --trace --policy --json` is the same comparison as `tune` (same check mode), and
/// a policy list selects rows; the text table names each row, the ideal and the bound.
#[test]
fn simulate_trace_policy_matches_tune_and_prints_the_table() {
    let se = trace("trace-SE.csv.gz");
    let list = "rebalance,drop-before,backup-workers";
    let from_tune = tune_json(&["--trace", se.to_str().unwrap(), "--policy", list, "--check", "before"]);
    let out = simulate_out(&["--trace", se.to_str().unwrap(), "--policy", list, "--json"]);
    let from_sim: Vec<PolicyComparison> = serde_json::from_slice(&out).expect("simulate --json reads back");
    assert_eq!(from_sim, from_tune);
    assert_eq!(
        from_sim[0].rows.iter().map(|r| r.policy).collect::<Vec<_>>(),
        vec![Policy::DropBefore, Policy::BackupWorkers, Policy::Rebalance]
    );
    let text = String::from_utf8(simulate_out(&["--trace", se.to_str().unwrap(), "--policy", "drop-before"])).unwrap();
    for want in ["drop-before", "ideal", "straggler-free", "trace-SE"] {
        assert!(text.contains(want), "{want}: {text}");
    }
    // A bad policy name is refused, naming it.
    let args = <Simulate as clap::Parser>::try_parse_from(["simulate", "--policy", "drop-after"]).unwrap().args;
    let e = dropcompute_cli::commands::simulate::run_to(&args, &mut Vec::new()).expect_err("bad name").to_string();
    assert!(e.contains("drop-after") && e.contains("rebalance-drop"), "{e}");
}

/// Monte Carlo: one slow worker at 2x (8 workers, 100 steps, the first 10 before the tracker
/// labels it): rebalancing recovers most of the loss without losing a sample; dropping stays
/// within the guardrail by dropping about half of the slow worker's share.
#[test]
fn monte_carlo_policy_table_with_a_chronic_slow_worker() {
    let out = simulate_out(&[
        "--workers",
        "8",
        "--noise",
        "normal:0.05",
        "--slow-workers",
        "1",
        "--slow-factor",
        "2",
        "--policy",
        "synchronous,drop-before,rebalance",
        "--json",
    ]);
    let c: Vec<PolicyComparison> = serde_json::from_slice(&out).expect("read back");
    assert_eq!((c[0].ranks, c[0].micro_batches, c[0].steps), (8, 12, 100));
    let (sync, drop, reb) = (&c[0].rows[0], &c[0].rows[1], &c[0].rows[2]);
    assert_eq!(sync.effective_speedup, 0.0);
    assert_eq!(reb.lost_micro_batches, 0.0);
    assert!(reb.effective_speedup > 0.4 && reb.drop_rate == 0.0, "{reb:?}");
    assert!(drop.drop_rate <= 0.10 && drop.drop_rate > 0.04 && drop.lost_micro_batches > 0.0, "{drop:?}");
    let _ = CheckMode::Predictive;
}
