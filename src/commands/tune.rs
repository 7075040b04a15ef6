//! `dropcompute tune --trace FILE...`: recommend a threshold from traces.
//!
//! Owns: [`Args`], [`run`], [`run_to`] (flags and printing). Must not touch: the search
//! and the recommendation (`crate::tune::recommend`, shared with `train --threshold auto`).
//! Output per trace: shape and notes, the straggler headroom, the best threshold with predicted
//! drop rate and effective speedup, the guardrails' verdict, a replay of the recommended
//! threshold under both check modes (what the runtime, not the oracle, would get), per-rank
//! straggler attribution, and an SVG of predicted effective speedup vs threshold.

use std::io::Write;
use std::path::PathBuf;

use super::{CommandError, io_err};
use crate::plot::{Series, line_chart};
use crate::policy::CheckMode;
use crate::trace::whatif::PipelineAggregation;
use crate::trace::{LoadOptions, load};
use crate::tune::recommend::replay_at;
use crate::tune::straggler::{StragglerClass, StragglerConfig, attribute};
use crate::tune::{Guardrails, Recommend, Recommendation, Scoring, Verdict, recommend};

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
    /// Guardrail: maximum mean drop rate.
    #[arg(long, default_value_t = 0.10, allow_negative_numbers = true)]
    pub max_drop_rate: f64,
    /// Guardrail: minimum fraction of the global batch computed in every step.
    #[arg(long, default_value_t = 0.75, allow_negative_numbers = true)]
    pub min_batch_fraction: f64,
    /// Guardrail: minimum predicted effective speedup to enable dropping.
    #[arg(long, default_value_t = 0.02, allow_negative_numbers = true)]
    pub min_gain: f64,
    /// Micro-batches every rank always computes.
    #[arg(long, default_value_t = 1)]
    pub min_micro_batches: u32,
    /// Directory for the SVG plots (one per trace, `tune-<file stem>.svg`); none if absent.
    #[arg(long)]
    pub svg_dir: Option<PathBuf>,
    /// Ranks listed in the straggler attribution.
    #[arg(long, default_value_t = 5)]
    pub top_ranks: usize,
}

/// Run and print to stdout. Errors: see [`run_to`].
pub fn run(args: &Args) -> Result<(), CommandError> {
    run_to(args, &mut std::io::stdout().lock())
}

/// Run and print to `out`. Errors: trace errors (file, line, column), output I/O, plotting.
pub fn run_to(args: &Args, out: &mut dyn Write) -> Result<(), CommandError> {
    for (flag, v) in [
        ("--max-drop-rate", args.max_drop_rate),
        ("--min-batch-fraction", args.min_batch_fraction),
        ("--min-gain", args.min_gain),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(CommandError::Args(format!("{flag} {v}: must be a fraction in [0, 1]")));
        }
    }
    if !(args.overhead_ms.is_finite() && args.overhead_ms >= 0.0) {
        return Err(CommandError::Args(format!("--overhead-ms {}: must be finite and >= 0", args.overhead_ms)));
    }
    let opts = LoadOptions {
        allow_incomplete_steps: args.allow_incomplete_steps,
        reference_overhead_ns: args.overhead_ms * 1e6,
        pipeline: args.pipeline,
    };
    let how = Recommend {
        scoring: Scoring::Oracle,
        guardrails: Guardrails {
            max_drop_rate: args.max_drop_rate,
            min_batch_fraction: args.min_batch_fraction,
            min_gain: args.min_gain,
        },
        min_micro_batches: args.min_micro_batches,
    };
    for loaded in load(&args.traces, &opts)? {
        let t = &loaded.trace;
        if t.num_steps() < crate::tune::MIN_STEPS || t.world_size() < 2 {
            return Err(CommandError::Trace(crate::trace::TraceError::InsufficientData {
                source_name: t.source().to_string(),
                steps: t.num_steps(),
                ranks: t.world_size(),
                min_steps: crate::tune::MIN_STEPS,
            }));
        }
        let Recommendation { verdict, report: r } = recommend(t, &how);
        let compute = t.rank_compute_ns();
        let n = t.world_size();
        let mean_max =
            compute.chunks_exact(n).map(|c| c.iter().copied().fold(0.0, f64::max)).sum::<f64>() / t.num_steps() as f64;
        let mean_o = t.overhead_ns().iter().sum::<f64>() / t.num_steps() as f64;
        let mut s = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(s, "trace: {}", t.source());
        for note in &loaded.notes {
            let _ = writeln!(s, "  note: {note}");
        }
        if !loaded.completeness.dropped_steps.is_empty() {
            let _ = writeln!(
                s,
                "  incomplete steps removed (step, missing cells): {:?}",
                loaded.completeness.dropped_steps
            );
        }
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
        let b = r.best;
        let _ = writeln!(
            s,
            "  best threshold (unconstrained): {:.3} ms: predicted drop rate {:.2}%, step-time saving {:.2}%, effective speedup {:+.2}%",
            b.threshold_ns / 1e6,
            b.drop_rate * 100.0,
            b.step_saving * 100.0,
            b.objective * 100.0
        );
        match verdict {
            Verdict::Enable(c) => {
                let _ = writeln!(
                    s,
                    "  verdict: ENABLE threshold {:.3} ms: predicted drop rate {:.2}% (min batch {:.1}%), effective speedup {:+.2}%",
                    c.threshold_ns / 1e6,
                    c.drop_rate * 100.0,
                    c.min_batch_fraction * 100.0,
                    c.objective * 100.0
                );
                for (name, check) in
                    [("before-micro-batch", CheckMode::BeforeMicroBatch), ("predictive", CheckMode::Predictive)]
                {
                    let rp = replay_at(t, c.threshold(), check, args.min_micro_batches);
                    let _ = writeln!(
                        s,
                        "  replay ({name} check): drop rate {:.2}%, step {:.3} -> {:.3} ms, effective speedup {:+.2}%",
                        rp.drop_rate * 100.0,
                        rp.baseline_step_ns / 1e6,
                        rp.policy_step_ns / 1e6,
                        rp.effective_speedup * 100.0
                    );
                }
            }
            Verdict::Decline(why) => {
                let _ = writeln!(s, "  verdict: DECLINE (threshold off): {why}");
                if r.straggler_headroom < args.min_gain {
                    let _ = writeln!(
                        s,
                        "  why: only {:.2}% of the step is spent waiting for slower data-parallel ranks; the slowdown is not variance across ranks (structural, e.g. a slow pipeline stage present in every replica), so dropping micro-batches cannot recover it",
                        r.straggler_headroom * 100.0
                    );
                }
            }
        }
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
            let pts: Vec<(f64, f64)> = r
                .curve
                .iter()
                .step_by(step)
                .chain(std::iter::once(&r.best))
                .map(|c| (c.threshold_ns / 1e6, c.objective * 100.0))
                .collect();
            let mut pts = pts;
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let drops: Vec<(f64, f64)> =
                r.curve.iter().step_by(step).map(|c| (c.threshold_ns / 1e6, -c.drop_rate * 100.0)).collect();
            line_chart(
                &path,
                &format!("predicted effective speedup vs threshold: {stem}"),
                "threshold (ms)",
                "effective speedup (%), -drop rate (%)",
                false,
                &[
                    Series { name: "effective speedup %", points: pts, line: true },
                    Series { name: "- drop rate %", points: drops, line: true },
                    Series {
                        name: "best",
                        points: vec![(r.best.threshold_ns / 1e6, r.best.objective * 100.0)],
                        line: false,
                    },
                ],
            )
            .map_err(CommandError::Plot)?;
            let _ = writeln!(s, "  svg: {}", path.display());
        }
        out.write_all(s.as_bytes()).map_err(io_err("stdout"))?;
    }
    Ok(())
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
                CommandError::Trace(crate::trace::TraceError::InsufficientData {
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
