//! `dropcompute tune --trace FILE...`: recommend a threshold from traces.
//!
//! Owns: [`Args`], [`run`], [`run_to`] (flags and printing), [`TuneJson`] and [`AutoJson`] (the
//! `--json` forms). Must not touch: the search and the recommendation (`dropcompute::tune::recommend`, shared
//! with `train --threshold auto`, with the same guardrail flags, [`super::GuardrailArgs`]).
//! Output per trace: shape and notes, the straggler headroom, the verdict (the replay of the
//! recommended threshold under the check mode and sync lag that will run, judged by the
//! guardrails), beside it the ideal (the reference objective: a micro-batch counts iff it ends
//! by the threshold; not realizable on the device), per-rank straggler attribution, and an SVG
//! of the ideal and replayed effective speedup vs threshold. `--auto-for POLICY` instead prints
//! the threshold `train --policy POLICY --threshold auto` runs with on the trace ([`AutoJson`]):
//! train's rule, the same functions (`tune::policies::tunes_on_policy_replay`,
//! `auto_policy_threshold`, `train_run`, or `tune::recommend`).

use std::io::Write;
use std::path::PathBuf;

use super::{CommandError, GuardrailArgs, io_err};
use dropcompute::policy::CheckMode;
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::whatif::PipelineAggregation;
use dropcompute::trace::{LoadOptions, load};
use dropcompute::tune::recommend::replay_score;
use dropcompute::tune::straggler::{StragglerClass, StragglerConfig, attribute};
use dropcompute::tune::{CandidateScore, Guardrails, Recommend, Recommendation, TuneInputError, Verdict, recommend};
use dropcompute_plot::{Series, line_chart};

/// Arguments of `dropcompute tune`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Trace files: our compute logs, the reference's compute_logs_{rank}.csv (merged by rank),
    /// or what-if traces (.csv / .csv.gz; each tuned separately).
    #[arg(long = "trace", required = true, num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// Pipeline-parallel replica latency: bottleneck stage (default) or sum over stages.
    #[arg(long, value_enum, default_value_t = PipelineAggregation::Bottleneck)]
    pub pipeline: PipelineAggregation,
    /// Drop (and list) steps with missing micro-batches instead of failing.
    #[arg(long)]
    pub allow_incomplete_steps: bool,
    /// Overhead per step (ms) assumed for reference compute logs (they record no step time).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub overhead_ms: f64,
    /// The guardrails, judged on the replay (same flags and defaults as `train`).
    #[command(flatten)]
    pub guardrails: GuardrailArgs,
    /// The tail shape of `--policy` (`policy::TailShape`).
    #[command(flatten)]
    pub tail: super::TailArgs,
    /// Deadline check the run will use (default predictive, train's); the verdict replays it.
    /// With `--auto-for drop-before` or `drop-predictive` (which fix their own check) a
    /// different value is refused; in a `--policy` list it applies to the policies that take it.
    #[arg(long, value_enum)]
    pub check: Option<CheckMode>,
    /// Micro-batches the run's deadline check lags behind the device (train's `--sync-lag`,
    /// default 0); must be below the trace's micro-batches.
    #[arg(long, default_value_t = ExecutionModel::default().sync_lag)]
    pub sync_lag: u32,
    /// Micro-batches every rank always computes; must be at most the trace's micro-batches.
    #[arg(long, default_value_t = 1)]
    pub min_micro_batches: u32,
    /// The first this many steps of each trace (counted, whatever their ids: trace-SE's start
    /// at 16) never drop in the replay and do not count towards the minimum of steps to tune
    /// on: give `train`'s `--warmup-steps` (default 3) to judge its compute log as `train
    /// --threshold auto` judges its baseline. Default 0 (every step of a trace from elsewhere
    /// is tuned on). A warm-up that leaves too few steps is refused naming this flag.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    /// Print the verdict of every trace as JSON (an array of `TuneJson`) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Directory for the SVG plots (one per trace, `tune-<file stem>.svg`); none if absent.
    #[arg(long)]
    pub svg_dir: Option<PathBuf>,
    /// Ranks listed in the straggler attribution.
    #[arg(long, default_value_t = 5)]
    pub top_ranks: usize,
    /// Compare step policies instead of recommending a threshold: `all` or a comma-separated
    /// list (synchronous, drop-before, drop-predictive, backup-workers, compute-budget,
    /// rebalance, rebalance-drop, length-predictive, cost-balance: the last two use the trace's
    /// buckets when it carries them); each policy's parameter is tuned on the replay under the
    /// guardrails and printed beside the ideal and the straggler-free bound (`--json`: an array
    /// of `tune::policies::PolicyComparison`).
    #[arg(long)]
    pub policy: Option<String>,
    /// Seed of the micro-batches drawn beyond the trace's M (`--policy` with rebalancing or a
    /// compute budget; `--auto-for`: give train's `--seed`, default 0 there).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the threshold `train --policy POLICY --threshold auto` runs with when this trace
    /// is its baseline (the baseline run's compute log), by train's own rule
    /// (`tune::policies::tunes_on_policy_replay`): DropCompute's recommendation for
    /// `drop-before`/`drop-predictive` without a tail shape, else the best threshold (the
    /// budget of `compute-budget`) on the replay of POLICY with `--tail-split`/`--tail-cost`,
    /// `--backup-workers` and `--seed` as given to train; off for a policy without a deadline.
    /// Give train's `--warmup-steps` and `--check` too (the check of drop-before and
    /// drop-predictive is their own, as in train). `--json`: an array of `AutoJson`.
    #[arg(long, value_enum, conflicts_with = "policy")]
    pub auto_for: Option<dropcompute::policy::Policy>,
    /// b of `--auto-for backup-workers` (train's `--backup-workers`).
    #[arg(long, default_value_t = 1)]
    pub backup_workers: u32,
}

/// `tune --auto-for POLICY --json`: one element per trace.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AutoJson {
    /// The trace (file names).
    pub trace: String,
    /// The policy of the run (`--auto-for`).
    pub policy: dropcompute::policy::Policy,
    /// Its tail shape.
    pub tail: dropcompute::policy::TailShape,
    /// True when train tunes it on the policy replay, false for DropCompute's recommendation.
    pub policy_replay: bool,
    /// The threshold the run uses (the budget of `compute-budget`), ms; `null` for off.
    pub threshold_ms: Option<f64>,
    /// The replayed effective speedup at it (0.05 = +5 %); `null` when off.
    pub effective_speedup: Option<f64>,
    /// The replayed drop rate at it; `null` when off.
    pub drop_rate: Option<f64>,
    /// What the loader assumed or filled (the trace's notes).
    pub notes: Vec<String>,
}

/// The replayed run at one threshold (times in ms).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplayJson {
    /// Threshold, ms; `null` for off.
    pub threshold_ms: Option<f64>,
    /// Mean recorded step time, ms.
    pub baseline_step_ms: f64,
    /// Mean replayed step time at the threshold, ms.
    pub policy_step_ms: f64,
    /// Replayed drop rate (fraction).
    pub drop_rate: f64,
    /// Replayed effective speedup (0.05 = +5 %).
    pub effective_speedup: f64,
}

/// `tune --json`: one element per trace.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuneJson {
    /// The trace (file names).
    pub trace: String,
    /// Ranks N.
    pub ranks: usize,
    /// Micro-batches per rank per step M.
    pub micro_batches: usize,
    /// Complete steps.
    pub steps: usize,
    /// The execution replayed (check mode, sync lag, warm-up steps as `--warmup-steps` counts
    /// them: the trace's first steps, whatever their ids; minimum micro-batches).
    pub execution: ExecutionModel,
    /// The guardrails that judged the replay.
    pub guardrails: Guardrails,
    /// The verdict: enable (with the replay's threshold, drop rate, batch fraction and effective
    /// speedup) or decline (the guardrail and its numbers).
    pub verdict: Verdict,
    /// The replay of the verdict's threshold (off when declined).
    pub replay: ReplayJson,
    /// The reference objective at the verdict's threshold (a micro-batch counts iff it ends by
    /// the threshold): not realizable on the device; `null` when declined.
    pub ideal_at_threshold: Option<CandidateScore>,
    /// The best threshold under the reference objective (unconstrained), not realizable.
    pub ideal_best: CandidateScore,
    /// Share of the step spent waiting for slower ranks.
    pub straggler_headroom: f64,
    /// What the loader assumed or filled (e.g. a DropCompute run's dropped micro-batches:
    /// `trace::compute_log`).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// Run and print to stdout. Errors: see [`run_to`].
pub fn run(args: &Args) -> Result<(), CommandError> {
    run_to(args, &mut dropcompute::console::Stdout)
}

/// The ideal (reference objective) at `threshold_ns`: the curve's candidate with the largest
/// threshold at or below it (the objective is piecewise constant between candidates).
fn ideal_at(curve: &[CandidateScore], threshold_ns: f64) -> Option<CandidateScore> {
    curve.iter().rev().find(|c| c.threshold_ns <= threshold_ns).map(|c| CandidateScore { threshold_ns, ..*c })
}

/// Run and print to `out`. Errors: bad flags ([`CommandError::Args`]: a guardrail outside
/// [0, 1], `--sync-lag` not below a trace's micro-batches), trace errors (file, line, column;
/// insufficient data), output I/O, plotting.
pub fn run_to(args: &Args, out: &mut dyn Write) -> Result<(), CommandError> {
    let guardrails = args.guardrails.guardrails().map_err(CommandError::Args)?;
    let tail = args.tail.for_policy(args.policy.as_deref().or(args.auto_for.map(dropcompute::policy::Policy::name)))?;
    if !(args.overhead_ms.is_finite() && args.overhead_ms >= 0.0) {
        return Err(CommandError::Args(format!("--overhead-ms {}: must be finite and >= 0", args.overhead_ms)));
    }
    let opts = LoadOptions {
        allow_incomplete_steps: args.allow_incomplete_steps,
        reference_overhead_ns: args.overhead_ms * 1e6,
        pipeline: args.pipeline,
    };
    let base = ExecutionModel {
        check: match args.auto_for {
            Some(p) => p.resolve_check(args.check, ExecutionModel::default().check).map_err(|own| {
                CommandError::Args(format!(
                    "--check {}: --auto-for {p} runs the {own} check; give --check {own} or leave --check out",
                    args.check.map_or("", CheckMode::name)
                ))
            })?,
            None => args.check.unwrap_or(ExecutionModel::default().check),
        },
        sync_lag: args.sync_lag,
        warmup_steps: 0,
        min_micro_batches: args.min_micro_batches,
        drop_guard: args.guardrails.drop_guard().map_err(CommandError::Args)?,
    };
    let policies = args.policy.as_deref().map(super::parse_policies).transpose()?;
    let mut comparisons = Vec::new();
    let mut json = Vec::new();
    let mut autos = Vec::new();
    for loaded in load(&args.traces, &opts)? {
        let t = &loaded.trace;
        // --warmup-steps counts this trace's steps; the replay compares step ids.
        let execution = ExecutionModel { warmup_steps: t.warmup_end(args.warmup_steps), ..base };
        let how = Recommend { execution, guardrails };
        check_trace(t, &execution)?;
        if let Some(p) = args.auto_for {
            let ranks = t.ranks().len();
            if p == dropcompute::policy::Policy::BackupWorkers && args.backup_workers as usize >= ranks {
                return Err(CommandError::Args(format!(
                    "--backup-workers {}: must be < the ranks of {} ({ranks}), as train's",
                    args.backup_workers,
                    t.source()
                )));
            }
            let a = auto_for(t, &how, p, tail, args, &loaded.notes);
            if args.json {
                autos.push(a);
            } else {
                let mut s = format!("trace: {}\n", t.source());
                s += &super::loader_notes(&loaded);
                s += &format!(
                    "  train --policy {p}{} --threshold auto ({}) runs with threshold {}\n",
                    if tail.enabled() { format!(" --tail-split {}", tail.parts()) } else { String::new() },
                    if a.policy_replay { "best on the policy replay" } else { "DropCompute's recommendation" },
                    a.threshold_ms.map_or("off".to_string(), |ms| format!(
                        "{ms:.6} ms: replayed drop rate {:.2}%, effective speedup {:+.2}%",
                        a.drop_rate.unwrap_or(0.0) * 100.0,
                        a.effective_speedup.unwrap_or(0.0) * 100.0
                    ))
                );
                out.write_all(s.as_bytes()).map_err(io_err("stdout"))?;
            }
            continue;
        }
        if let Some(ps) = &policies {
            let c = dropcompute::tune::policies::compare(t, &how, ps, tail, args.seed);
            super::print_loader_notes(&loaded, args.json, out)?;
            if !args.json {
                out.write_all(super::policy_table(&c).as_bytes()).map_err(io_err("stdout"))?;
            }
            comparisons.push(c);
            continue;
        }
        let Recommendation { verdict, replay: rp, ideal: r } = recommend(t, &how);
        let ideal_here = match verdict {
            Verdict::Enable(c) => ideal_at(&r.curve, c.threshold_ns),
            Verdict::Decline(_) => None,
        };
        if args.json {
            json.push(TuneJson {
                trace: t.source().to_string(),
                ranks: t.world_size(),
                micro_batches: t.micro_batches(),
                steps: t.num_steps(),
                // The warm-up as given (steps counted), not the step id it ends at.
                execution: ExecutionModel { warmup_steps: args.warmup_steps, ..execution },
                guardrails,
                verdict,
                replay: ReplayJson {
                    threshold_ms: verdict.threshold().as_ns().map(|ns| ns as f64 / 1e6),
                    baseline_step_ms: rp.baseline_step_ns / 1e6,
                    policy_step_ms: rp.policy_step_ns / 1e6,
                    drop_rate: rp.drop_rate,
                    effective_speedup: rp.effective_speedup,
                },
                ideal_at_threshold: ideal_here,
                ideal_best: r.best,
                straggler_headroom: r.straggler_headroom,
                notes: loaded.notes.clone(),
            });
            continue;
        }
        let compute = t.rank_compute_ns();
        let n = t.world_size();
        let mean_max =
            compute.chunks_exact(n).map(|c| c.iter().copied().fold(0.0, f64::max)).sum::<f64>() / t.num_steps() as f64;
        let mean_o = t.overhead_ns().iter().sum::<f64>() / t.num_steps() as f64;
        let mut s = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(s, "trace: {}", t.source());
        s += &super::loader_notes(&loaded);
        let _ = writeln!(
            s,
            "  shape: {} ranks x {} micro-batches x {} steps; mean step {:.3} ms = compute (slowest rank) {:.3} ms + overhead {:.3} ms",
            n,
            t.micro_batches(),
            t.num_steps(),
            (mean_max + mean_o) / 1e6,
            mean_max / 1e6,
            mean_o / 1e6
        );
        let _ = writeln!(
            s,
            "  straggler headroom: {:.2}% of the step is spent waiting for slower ranks",
            r.straggler_headroom * 100.0
        );
        let check = execution.check.name();
        let _ = writeln!(
            s,
            "  replayed as it will run: {check} check, sync lag {}, {} micro-batch(es) always computed{}; guardrails: drop rate <= {:.2}%, batch >= {:.1}% in every step, gain >= {:+.2}%{}",
            args.sync_lag,
            args.min_micro_batches,
            execution.drop_guard.map_or_else(String::new, |g| format!(", drop guard {:.2}%", g * 100.0)),
            guardrails.max_drop_rate * 100.0,
            guardrails.min_batch_fraction * 100.0,
            guardrails.min_gain * 100.0,
            if guardrails.jitter_ns > 0.0 {
                format!(", all within +-{:.3} ms of the threshold (--jitter-ms)", guardrails.jitter_ns / 1e6)
            } else {
                String::new()
            }
        );
        const IDEAL: &str = "ideal (not realizable on the device: a launched graph cannot stop mid-micro-batch)";
        match verdict {
            Verdict::Enable(c) => {
                let _ = writeln!(
                    s,
                    "  verdict: ENABLE threshold {:.3} ms: replayed drop rate {:.2}% (min batch {:.1}%), step {:.3} -> {:.3} ms, effective speedup {:+.2}%",
                    c.threshold_ns / 1e6,
                    c.drop_rate * 100.0,
                    c.min_batch_fraction * 100.0,
                    rp.baseline_step_ns / 1e6,
                    rp.policy_step_ns / 1e6,
                    c.objective * 100.0
                );
                if let Some(i) = ideal_here {
                    let _ = writeln!(
                        s,
                        "  {IDEAL}: at {:.3} ms drop rate {:.2}%, effective speedup {:+.2}%",
                        i.threshold_ns / 1e6,
                        i.drop_rate * 100.0,
                        i.objective * 100.0
                    );
                }
            }
            Verdict::Decline(why) => {
                let window = if guardrails.jitter_ns > 0.0 {
                    format!(
                        " (each threshold judged by the worst replay within +-{:.3} ms of it)",
                        guardrails.jitter_ns / 1e6
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(s, "  verdict: DECLINE (threshold off): {why}{window}");
                if r.straggler_headroom < guardrails.min_gain {
                    let _ = writeln!(
                        s,
                        "  why: only {:.2}% of the step is spent waiting for slower data-parallel ranks; the slowdown is not variance across ranks (structural, e.g. a slow pipeline stage present in every replica), so dropping micro-batches cannot recover it",
                        r.straggler_headroom * 100.0
                    );
                }
            }
        }
        let b = r.best;
        let _ = writeln!(
            s,
            "  {IDEAL}, best unconstrained: {:.3} ms: drop rate {:.2}%, effective speedup {:+.2}%",
            b.threshold_ns / 1e6,
            b.drop_rate * 100.0,
            b.objective * 100.0
        );
        let att = attribute(t, &StragglerConfig::default());
        let chronic = att.iter().filter(|a| a.class == StragglerClass::Chronic).count();
        let transient = att.iter().filter(|a| a.class == StragglerClass::Transient).count();
        let _ = writeln!(
            s,
            "  stragglers (slow = >5% above the step median): {chronic} chronic, {transient} transient, {} normal",
            n - chronic - transient
        );
        for a in att.iter().take(args.top_ranks) {
            let _ = writeln!(
                s,
                "    rank {:>4}: {:<9} slow in {:5.1}% of steps, slowest in {:5.1}%, mean excess {:+.1}%, recent (EWMA) {:+.1}%",
                a.rank,
                format!("{:?}", a.class).to_lowercase(),
                a.slow_fraction * 100.0,
                a.slowest_fraction * 100.0,
                a.mean_excess * 100.0,
                a.ewma_excess * 100.0
            );
        }
        if chronic > 0 && matches!(verdict, Verdict::Decline(_)) {
            let _ = writeln!(
                s,
                "  hint: chronic stragglers are structural (same ranks every step); rebalance the work instead of dropping it"
            );
        }
        if let Some(dir) = &args.svg_dir {
            std::fs::create_dir_all(dir).map_err(io_err(dir.display().to_string()))?;
            let stem =
                t.source().rsplit('/').next().unwrap_or("trace").split('.').next().unwrap_or("trace").to_string();
            let path = dir.join(format!("tune-{stem}.svg"));
            let step = (r.curve.len() / 1500).max(1);
            let mut pts: Vec<(f64, f64)> = r
                .curve
                .iter()
                .step_by(step)
                .chain(std::iter::once(&r.best))
                .map(|c| (c.threshold_ns / 1e6, c.objective * 100.0))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let replayed: Vec<(f64, f64)> = r
                .curve
                .iter()
                .step_by((r.curve.len() / 100).max(1))
                .filter(|c| c.threshold_ns > 0.0)
                .map(|c| {
                    let sc = replay_score(t, c.threshold_ns, &execution);
                    (c.threshold_ns / 1e6, sc.objective * 100.0)
                })
                .collect();
            let drops: Vec<(f64, f64)> =
                r.curve.iter().step_by(step).map(|c| (c.threshold_ns / 1e6, -c.drop_rate * 100.0)).collect();
            let mut series = vec![
                Series { name: "ideal effective speedup % (not realizable)", points: pts, line: true },
                Series { name: "replayed effective speedup % (as it will run)", points: replayed, line: true },
                Series { name: "- ideal drop rate %", points: drops, line: true },
            ];
            if let Verdict::Enable(c) = verdict {
                series.push(Series {
                    name: "verdict",
                    points: vec![(c.threshold_ns / 1e6, c.objective * 100.0)],
                    line: false,
                });
            }
            line_chart(
                &path,
                &format!("effective speedup vs threshold: {stem}"),
                "threshold (ms)",
                "effective speedup (%), -drop rate (%)",
                false,
                &series,
            )
            .map_err(CommandError::Plot)?;
            let _ = writeln!(s, "  svg: {}", path.display());
        }
        out.write_all(s.as_bytes()).map_err(io_err("stdout"))?;
    }
    if args.json && args.auto_for.is_some() {
        let text = serde_json::to_string_pretty(&autos).map_err(|e| CommandError::Args(format!("--json: {e}")))?;
        out.write_all(text.as_bytes()).and_then(|()| out.write_all(b"\n")).map_err(io_err("stdout"))?;
    } else if args.json && policies.is_some() {
        let text =
            serde_json::to_string_pretty(&comparisons).map_err(|e| CommandError::Args(format!("--json: {e}")))?;
        out.write_all(text.as_bytes()).and_then(|()| out.write_all(b"\n")).map_err(io_err("stdout"))?;
    } else if args.json {
        let text = serde_json::to_string_pretty(&json).map_err(|e| CommandError::Args(format!("--json: {e}")))?;
        out.write_all(text.as_bytes()).and_then(|()| out.write_all(b"\n")).map_err(io_err("stdout"))?;
    }
    Ok(())
}

/// The one validation of every face that tunes (`tune::check_inputs`; the C API and Python
/// call it too), for `tune` and `simulate --trace` alike, its messages naming the flags
/// (`--warmup-steps` in the insufficient-data message when the warm-up removed steps).
///
/// # Errors
/// [`CommandError::Trace`] for too few steps or ranks, [`CommandError::Args`] for
/// `--sync-lag` or `--min-micro-batches` beyond the trace's micro-batches.
pub(crate) fn check_trace(
    t: &dropcompute::trace::LatencyTrace,
    execution: &ExecutionModel,
) -> Result<(), CommandError> {
    dropcompute::tune::check_inputs(t, execution).map_err(|e| match e {
        TuneInputError::InsufficientData(e) => CommandError::Trace(e),
        TuneInputError::SyncLag { sync_lag, source_name, micro_batches } => CommandError::Args(format!(
            "--sync-lag {sync_lag}: must be < the micro-batches of {source_name} ({micro_batches})"
        )),
        TuneInputError::MinMicroBatches { min_micro_batches, source_name, micro_batches } => CommandError::Args(format!(
            "--min-micro-batches {min_micro_batches}: must be <= the micro-batches of {source_name} ({micro_batches})"
        )),
        // No flag sets a guard yet (the execution model's default is none).
        TuneInputError::DropGuard(e) => CommandError::Args(e.to_string()),
    })
}

/// `--auto-for p` on trace `t` (see the flag): train's rule, one implementation
/// (`tune::policies::auto_threshold` over `train_run`: the policy replay for
/// `tunes_on_policy_replay`, `tune::recommend` otherwise), the threshold off for a policy without a deadline (as the
/// scheduler's `set_policy`).
fn auto_for(
    t: &dropcompute::trace::LatencyTrace,
    how: &Recommend,
    p: dropcompute::policy::Policy,
    tail: dropcompute::policy::TailShape,
    args: &Args,
    notes: &[String],
) -> AutoJson {
    use dropcompute::tune::policies::{auto_threshold, train_run, tunes_on_policy_replay};
    // The check the run executes: the policy's own (drop-before, drop-predictive), as train's
    // configuration sets it, else `--check`.
    let execution = ExecutionModel { check: p.check_mode(how.execution.check), ..how.execution };
    let how = &Recommend { execution, ..*how };
    let policy_replay =
        tunes_on_policy_replay(&dropcompute::policy::StepPolicy { tail, ..dropcompute::policy::StepPolicy::new(p) });
    let template = policy_replay
        .then(|| train_run(p, args.backup_workers, tail, args.seed, dropcompute::policy::Threshold::Off, execution));
    let choice = auto_threshold(t, how, template);
    let (ns, outcome) = (choice.threshold().as_ns(), choice.outcome());
    let (speedup, drop_rate) = (outcome.map(|o| o.0), outcome.map(|o| o.1));
    let ns = ns.filter(|_| p.has_deadline());
    AutoJson {
        trace: t.source().to_string(),
        policy: p,
        tail,
        policy_replay,
        threshold_ms: ns.map(|ns| ns as f64 / 1e6),
        effective_speedup: ns.and(speedup),
        drop_rate: ns.and(drop_rate),
        notes: notes.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn guardrail_flags_outside_zero_one_are_rejected_before_reading_traces() {
        for (flag, value) in [
            ("--max-drop-rate", "nan"),
            ("--max-drop-rate", "5"),
            ("--min-batch-fraction", "-1"),
            ("--min-gain", "inf"),
        ] {
            let arg = format!("{flag}={value}");
            let w = Wrap::try_parse_from(["tune", "--trace", "/nonexistent.csv", arg.as_str()]).unwrap();
            let err = run_to(&w.args, &mut Vec::new()).unwrap_err();
            match err {
                CommandError::Args(m) => assert!(m.starts_with(flag), "{m}"),
                other => panic!("{flag} {value}: expected an argument error, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_one_step_trace_is_insufficient_data_not_a_verdict() {
        // The fixture: a compute log with 4 rows (2 ranks x 2 micro-batches, 1 step),
        // rank 1 taking 30 ms and 90 ms.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("one-step.csv");
        std::fs::write(
            &log,
            "global_step,local_step,world_size,batch,sentence_length,computed_batch,compute_dropped,iteration_time_ms,rank,start_ns,duration_ns\n\
             0,0,2,8,0,8,false,10,0,0,10000000\n0,1,2,8,0,16,false,10,0,10000000,10000000\n\
             0,0,2,8,0,8,false,30,1,0,30000000\n0,1,2,8,0,16,false,90,1,30000000,90000000\n",
        )
        .unwrap();
        let args = Wrap::try_parse_from(["tune", "--trace", log.to_str().unwrap()]).unwrap().args;
        let mut out = Vec::new();
        let e = run_to(&args, &mut out).unwrap_err();
        assert!(
            matches!(
                e,
                CommandError::Trace(dropcompute::trace::TraceError::InsufficientData {
                    steps: 1,
                    ranks: 2,
                    min_steps: 10,
                    ..
                })
            ),
            "{e:?}"
        );
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("verdict") && !text.contains("chronic"), "no verdict, no label: {text}");
    }
}
