//! Acceptance on the real what-if traces shipped in data/traces (copies; see its README).
use std::path::PathBuf;

use dropcompute::policy::CheckMode;
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::{LoadOptions, load};
use dropcompute::tune::Guardrails;
use dropcompute::tune::recommend::replay_score;
use dropcompute::tune::{Refusal, TuneConfig, Verdict, tune};
use dropcompute_cli::commands::tune::{Args as TuneArgs, TuneJson, run_to};

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/traces").join(name)
}

#[test]
fn se_enables_a_positive_threshold_and_st_declines() {
    let loaded = load(&[trace("trace-SE.csv.gz"), trace("trace-ST.csv.gz")], &LoadOptions::default()).expect("load");
    let se = &loaded[0].trace;
    assert_eq!((se.world_size(), se.micro_batches(), se.num_steps()), (32, 8, 43));
    match tune(se, &TuneConfig::default()).verdict {
        Verdict::Enable(c) => {
            assert!(c.objective > 0.05, "{c:?}");
            assert!(c.drop_rate <= 0.10);
        }
        v => panic!("SE should enable dropping: {v:?}"),
    }
    let st = &loaded[1].trace;
    assert_eq!((st.world_size(), st.micro_batches(), st.num_steps()), (2, 4, 32));
    let r = tune(st, &TuneConfig::default());
    assert!(matches!(r.verdict, Verdict::Decline(Refusal::InsufficientGain { .. })), "{:?}", r.verdict);
    assert!(r.straggler_headroom < 0.02);
}

#[derive(clap::Parser)]
struct Wrap {
    #[command(flatten)]
    args: TuneArgs,
}

fn tune_args(extra: &[&str]) -> TuneArgs {
    let mut v = vec!["tune"];
    v.extend_from_slice(extra);
    <Wrap as clap::Parser>::try_parse_from(v).expect("flags").args
}

#[test]
fn tune_command_output_names_the_guardrail() {
    let st = trace("trace-ST.csv.gz");
    let args = tune_args(&["--trace", st.to_str().unwrap(), "--top-ranks", "2"]);
    let mut out = Vec::new();
    run_to(&args, &mut out).expect("run");
    let text = String::from_utf8(out).expect("utf8");
    assert!(text.contains("DECLINE") && text.contains("min_gain"), "{text}");
}

/// The fixture (trace-SE): the search's reference objective passes the 10 % drop-rate
/// guardrail (9.46 %) at a threshold that, executed with train's default predictive check,
/// drops 13.63 %. The verdict is now the replay under the check mode that will run, and the
/// guardrail judges the replay's drop rate; `tune --json` reads back with serde.
#[test]
fn the_guardrail_judges_the_replayed_drop_rate_not_the_model() {
    let se = trace("trace-SE.csv.gz");
    let loaded = load(std::slice::from_ref(&se), &LoadOptions::default()).expect("load");
    let t = &loaded[0].trace;
    let exec = ExecutionModel { warmup_steps: 0, ..ExecutionModel::default() };
    assert_eq!(exec.check, CheckMode::Predictive, "train's default check");
    let ideal = match tune(t, &TuneConfig::default()).verdict {
        Verdict::Enable(c) => c,
        v => panic!("{v:?}"),
    };
    assert!((ideal.drop_rate - 0.0946).abs() < 5e-4, "{ideal:?}");
    let executed = replay_score(t, ideal.threshold_ns, &exec);
    assert!((executed.drop_rate - 0.1363).abs() < 5e-4, "{executed:?}");

    let mut out = Vec::new();
    run_to(&tune_args(&["--trace", se.to_str().unwrap(), "--json"]), &mut out).expect("run");
    let v: Vec<TuneJson> = serde_json::from_slice(&out).expect("tune --json reads back");
    assert_eq!(v.len(), 1);
    let j = &v[0];
    assert_eq!((j.execution, j.guardrails), (exec, Guardrails::default()));
    let c = match j.verdict {
        Verdict::Enable(c) => c,
        other => panic!("{other:?}"),
    };
    // The verdict's numbers are the replay's, within the guardrail, at a later threshold.
    assert!(c.drop_rate <= 0.10 && c.threshold_ns > ideal.threshold_ns, "{c:?}");
    // (JSON floats read back to within an ulp or so.)
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
    assert!(close(j.replay.drop_rate, c.drop_rate) && close(j.replay.effective_speedup, c.objective), "{j:?}");
    let again = replay_score(t, c.threshold_ns, &exec);
    assert!(close(again.drop_rate, c.drop_rate) && close(again.objective, c.objective), "{again:?} vs {c:?}");
    // The ideal at the same threshold is printed beside it, and differs.
    let i = j.ideal_at_threshold.expect("ideal at the verdict's threshold");
    assert!(i.objective > c.objective, "{i:?} vs {c:?}");
    // The text names the ideal as not realizable.
    let mut text = Vec::new();
    run_to(&tune_args(&["--trace", se.to_str().unwrap()]), &mut text).expect("run");
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("ideal (not realizable on the device: a launched graph cannot stop mid-micro-batch)"),
        "{text}"
    );
    assert_eq!(text.matches("verdict:").count(), 1, "{text}");
}

#[test]
fn tune_sync_lag_must_be_below_the_micro_batches_and_changes_the_replay() {
    let se = trace("trace-SE.csv.gz");
    let e = run_to(&tune_args(&["--trace", se.to_str().unwrap(), "--sync-lag", "8"]), &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("--sync-lag 8"), "{e}");
    // The same bound for --min-micro-batches (more than the trace's 8 was accepted and gave a
    // meaningless +0.00 % verdict).
    let e = run_to(&tune_args(&["--trace", se.to_str().unwrap(), "--min-micro-batches", "9"]), &mut Vec::new())
        .unwrap_err();
    assert!(e.to_string().contains("--min-micro-batches 9") && e.to_string().contains("(8)"), "{e}");
    let json = |lag: &str| -> TuneJson {
        let mut out = Vec::new();
        run_to(
            &tune_args(&["--trace", se.to_str().unwrap(), "--json", "--check", "before", "--sync-lag", lag]),
            &mut out,
        )
        .expect("run");
        serde_json::from_slice::<Vec<TuneJson>>(&out).expect("json").remove(0)
    };
    let (l0, l2) = (json("0"), json("2"));
    assert_eq!((l0.execution.sync_lag, l2.execution.sync_lag), (0, 2));
    assert_ne!(l0.verdict, l2.verdict, "the lag changes what will run");
}

/// `tune --drop-guard F` replays every candidate with the run-time guard (as `train
/// --drop-guard` runs it): the JSON's execution carries the guard, and its verdict is the
/// guarded replay's score of its threshold; without the flag the verdict is the unguarded one.
#[test]
fn tune_drop_guard_scores_every_candidate_with_the_guard() {
    let se = trace("trace-SE.csv.gz");
    let loaded = load(std::slice::from_ref(&se), &LoadOptions::default()).expect("load");
    let t = &loaded[0].trace;
    let json = |extra: &[&str]| -> TuneJson {
        let mut argv = vec!["--trace", se.to_str().unwrap(), "--json", "--max-drop-rate", "0.2"];
        argv.extend_from_slice(extra);
        let mut out = Vec::new();
        run_to(&tune_args(&argv), &mut out).expect("run");
        serde_json::from_slice::<Vec<TuneJson>>(&out).expect("json").remove(0)
    };
    let (plain, guarded) = (json(&[]), json(&["--drop-guard", "0.03"]));
    assert_eq!((plain.execution.drop_guard, guarded.execution.drop_guard), (None, Some(0.03)));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
    for j in [&plain, &guarded] {
        let Verdict::Enable(c) = j.verdict else { panic!("{:?}", j.verdict) };
        // The verdict is the replay, under the execution the JSON names, of its threshold.
        let again = replay_score(t, c.threshold_ns, &j.execution);
        assert!(close(again.drop_rate, c.drop_rate) && close(again.objective, c.objective), "{again:?} vs {c:?}");
        assert!(c.drop_rate <= 0.2, "{c:?}");
    }
    // The guard holds what the unguarded verdict drops (above 3 %) near its bound: the guarded
    // run drops less than the unguarded one, and the guarded verdict's own threshold replayed
    // without the guard drops more than it does with it.
    let (Verdict::Enable(p), Verdict::Enable(g)) = (plain.verdict, guarded.verdict) else { unreachable!() };
    assert!(p.drop_rate > 0.03 && g.drop_rate < p.drop_rate && g.drop_rate <= 0.035, "{p:?} {g:?}");
    let unguarded = replay_score(t, g.threshold_ns, &plain.execution);
    assert!(unguarded.drop_rate > g.drop_rate, "{unguarded:?} {g:?}");
}

/// `tune --jitter-ms J` judges each candidate by its window t +- J (the JSON's guardrails carry
/// J in ns): on trace-SE (9.1 s steps) J = 300 ms moves the verdict off the point optimum (the
/// speedup falls steeply above it), the verdict carries its own replay, and both window ends
/// replay within the guardrails; J = 2 s leaves no window with the minimum gain: declined.
#[test]
fn tune_jitter_judges_each_threshold_by_its_window() {
    let se = trace("trace-SE.csv.gz");
    let loaded = load(std::slice::from_ref(&se), &LoadOptions::default()).expect("load");
    let t = &loaded[0].trace;
    let json = |jitter_ms: &str| -> TuneJson {
        let argv = ["--trace", se.to_str().unwrap(), "--json", "--max-drop-rate", "0.2", "--jitter-ms", jitter_ms];
        let mut out = Vec::new();
        run_to(&tune_args(&argv), &mut out).expect("run");
        serde_json::from_slice::<Vec<TuneJson>>(&out).expect("json").remove(0)
    };
    let (point, robust) = (json("0"), json("300"));
    assert_eq!((point.guardrails.jitter_ns, robust.guardrails.jitter_ns), (0.0, 3e8));
    let (Verdict::Enable(p), Verdict::Enable(r)) = (point.verdict, robust.verdict) else {
        panic!("{:?} {:?}", point.verdict, robust.verdict)
    };
    assert_ne!(p.threshold_ns, r.threshold_ns, "the window moves the verdict");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
    let own = replay_score(t, r.threshold_ns, &robust.execution);
    assert!(close(own.objective, r.objective) && close(own.drop_rate, r.drop_rate), "{own:?} vs {r:?}");
    for e in [r.threshold_ns - 3e8, r.threshold_ns + 3e8] {
        let w = replay_score(t, e, &robust.execution);
        assert!(w.drop_rate <= 0.2 && w.min_batch_fraction >= 0.75 && w.objective >= 0.02, "{w:?} at {e}");
    }
    // The point optimum's window does not hold: its upper end falls below the robust verdict's
    // worst, which is why it was passed over.
    let above = replay_score(t, p.threshold_ns + 3e8, &point.execution);
    let worst_r = [r.threshold_ns - 3e8, r.threshold_ns, r.threshold_ns + 3e8]
        .map(|e| replay_score(t, e, &robust.execution).objective)
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    assert!(above.objective < worst_r, "{above:?} vs {worst_r}");
    match json("2000").verdict {
        Verdict::Decline(Refusal::InsufficientGain { best_gain, min_gain, .. }) => {
            assert!(best_gain < min_gain && min_gain == 0.02, "{best_gain} {min_gain}");
        }
        other => panic!("expected InsufficientGain, got {other:?}"),
    }
}

/// The jitter-window tests' setting: trace-SE, the predictive check, and per jitter (ns) the
/// guardrails with a 20 % drop rate.
fn se_with_jitter() -> (dropcompute::trace::LatencyTrace, ExecutionModel, impl Fn(f64) -> dropcompute::tune::Recommend)
{
    let se = trace("trace-SE.csv.gz");
    let t = load(std::slice::from_ref(&se), &LoadOptions::default()).expect("load").remove(0).trace;
    let execution = ExecutionModel { check: CheckMode::Predictive, ..ExecutionModel::default() };
    let how = move |jitter_ns: f64| dropcompute::tune::Recommend {
        execution,
        guardrails: Guardrails { max_drop_rate: 0.2, jitter_ns, ..Guardrails::default() },
    };
    (t, execution, how)
}

/// Each step policy's threshold search (`tune::policies::best_threshold`, behind `simulate
/// --policy` and `train --policy P --threshold auto`) judges its candidates by the same jitter
/// window as DropCompute's (`tune::window`): on trace-SE with a 300 ms window the deadline it
/// picks for every policy with one replays within the guardrails at both ends of its window,
/// and a 2 s window leaves drop-before nothing to enable (as `tune` declines there).
#[test]
fn every_policys_threshold_search_honours_the_jitter_window() {
    use dropcompute::policy::{Policy, TailShape, Threshold};
    use dropcompute::sim::policies::replay_policy;
    use dropcompute::tune::policies::{best_threshold, train_run};
    let (trace_se, execution, how) = se_with_jitter();
    let t = &trace_se;
    let ideal = tune(t, &TuneConfig { guardrails: how(0.0).guardrails, min_micro_batches: 1 });
    let j = 3e8;
    for policy in [Policy::DropBefore, Policy::DropPredictive, Policy::ComputeBudget, Policy::RebalanceDrop] {
        let template = train_run(policy, 1, TailShape::default(), 0, Threshold::Off, execution);
        let Some((run, o)) = best_threshold(t, &how(j), &ideal, template) else { continue };
        let deadline = run.params.deadline(run.threshold).as_ns().expect("a deadline") as f64;
        for e in [deadline - j, deadline + j] {
            let at = if policy == Policy::ComputeBudget {
                let budget = Threshold::from_ms(e / 1e6).expect("a budget");
                dropcompute::sim::policies::PolicyRun {
                    params: dropcompute::policy::StepPolicy { budget, ..run.params },
                    ..run
                }
            } else {
                dropcompute::sim::policies::PolicyRun { threshold: Threshold::from_ns_f64(e), ..run }
            };
            let r = replay_policy(t, &at);
            assert!(r.drop_rate <= 0.2, "{policy}: {deadline} ns, window end {e}: {r:?}");
            if o.enabled {
                assert!(r.effective_speedup >= 0.02, "{policy}: window end {e}: {r:?}");
            }
        }
    }
    let template = train_run(Policy::DropBefore, 1, TailShape::default(), 0, Threshold::Off, execution);
    let none = best_threshold(t, &how(2e9), &ideal, template);
    assert!(none.as_ref().is_none_or(|(_, o)| !o.enabled), "{none:?}");
    assert!(best_threshold(t, &how(0.0), &ideal, template).is_some_and(|(_, o)| o.enabled));
}

/// The policy comparison (`tune --policy`, `simulate --policy/--trace`: `tune::policies::compare`,
/// a coordinate search replaying one point at a time) judges each threshold by the same jitter
/// window (`tune::window::window_of`): on trace-SE with a 1 s window every row's deadline
/// replays within the guardrails at both ends of its window (rebuilt here from the row: the
/// policy, its threshold or budget, quantile and cap; its own replay is the row's), and the
/// window changes what is chosen: without it some row's window end breaks the guardrail.
#[test]
fn the_policy_comparison_judges_each_threshold_by_its_jitter_window() {
    use dropcompute::policy::{LatencyEstimator, Policy, StepPolicy, TailShape, Threshold};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    use dropcompute::tune::policies::compare;
    let (trace_se, execution, how) = se_with_jitter();
    let t = &trace_se;
    let policies = [Policy::DropBefore, Policy::DropPredictive, Policy::ComputeBudget, Policy::RebalanceDrop];
    let j = 1e9;
    // The worst drop rate at the two ends of each row's window, by policy.
    let ends = |jitter_ns: f64| -> Vec<(Policy, f64, f64)> {
        let c = compare(t, &how(jitter_ns), &policies, TailShape::default(), 0);
        assert_eq!(c.jitter_ns, jitter_ns);
        let mut out = Vec::new();
        for row in &c.rows {
            let Some(ms) = (if row.policy == Policy::ComputeBudget { row.budget_ms } else { row.threshold_ms }) else {
                continue; // no admissible point: the synchronous run is reported
            };
            let base = PolicyRun {
                seed: 0,
                estimator_quantile: row.estimator_quantile.unwrap_or(LatencyEstimator::DEFAULT_QUANTILE),
                ..PolicyRun::new(StepPolicy::new(row.policy), Threshold::Off, execution)
            };
            let at = |ns: f64| match row.policy {
                Policy::ComputeBudget => PolicyRun {
                    params: StepPolicy {
                        budget: Threshold::from_ms(ns / 1e6).expect("a budget"),
                        budget_max_micro_batches: row.budget_max_micro_batches,
                        ..base.params
                    },
                    ..base
                },
                _ => PolicyRun { threshold: Threshold::from_ns_f64(ns), ..base },
            };
            let own = replay_policy(t, &at(ms * 1e6));
            assert!((own.effective_speedup - row.effective_speedup).abs() < 1e-12, "{row:?}: {own:?}");
            let worst = [ms * 1e6 - j, ms * 1e6 + j]
                .into_iter()
                .map(|ns| replay_policy(t, &at(ns.max(1.0))).drop_rate)
                .fold(0.0, f64::max);
            out.push((row.policy, ms, worst));
        }
        out
    };
    let windowed = ends(j);
    assert!(!windowed.is_empty());
    for (p, ms, worst) in &windowed {
        assert!(*worst <= 0.2, "{p}: {ms} ms: a window end drops {worst}");
    }
    // Without the window the search lands where a 1 s jitter breaks the guardrail.
    let point = ends(0.0);
    assert!(point.iter().any(|(_, _, worst)| *worst > 0.2), "{point:?} vs {windowed:?}");
}
