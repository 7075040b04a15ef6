//! `dropcompute simulate`: effective speedup and drop rate vs world size, Monte Carlo points
//! over the analytic curve.
//!
//! Owns: [`Args`], [`run`], [`run_to`], [`parse_workers`]. Must not touch the models
//! (`dropcompute::sim`). The analytic curve is exact for `--noise normal`; for other noise models it is
//! the normal model with the same per-micro-batch mean and variance (CLT approximation, labelled
//! as such). It is not shown (CSV `NaN`, the reason printed) where it does not model the
//! simulation: a worker's compute time skewed beyond [`MAX_ANALYTIC_SKEWNESS`] (heavy tails:
//! e.g. `lognormal:4`), slow workers, pauses or the predictive check ([`analytic_unavailable`]).

use std::io::Write;
use std::path::PathBuf;

use super::{CommandError, GuardrailArgs, io_err};
use dropcompute::policy::{CheckMode, DeadlineConfig, Policy, Threshold};
use dropcompute::sim::analytic::NormalModel;
use dropcompute::sim::montecarlo::{MonteCarloConfig, Scenario, run as run_mc};
use dropcompute::sim::noise::{LatencyModel, Noise};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::whatif::PipelineAggregation;
use dropcompute::tune::Recommend;
use dropcompute_plot::{Series, line_chart};

/// Arguments of `dropcompute simulate`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Latency noise (the factor on `--base-ms` per micro-batch): none, reference[:DELAY_FACTOR],
    /// lognormal:SIGMA, normal:CV, exponential:MEAN or seqlen:SAMPLES (the same syntax and
    /// models as `train --noise` and the mock device).
    #[arg(long, default_value = "reference")]
    pub noise: Noise,
    /// Base latency of one micro-batch before noise, ms (latency = base × factor; the mean is
    /// base × the factor's mean, e.g. 1.5 × base for the reference noise).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub base_ms: f64,
    /// Micro-batches per step M.
    #[arg(long, default_value_t = 12)]
    pub micro_batches: u32,
    /// Per-step overhead (all-reduce + optimizer), ms.
    #[arg(long, default_value_t = 3.0, allow_negative_numbers = true)]
    pub overhead_ms: f64,
    /// World sizes: a list "16,64,200" or a range "1..10000" (1-2-5 grid per decade).
    #[arg(long, default_value = "16,64,200,1000,10000")]
    pub workers: String,
    /// Threshold as a fraction of the mean compute time M·mean latency [default: 1]; not with
    /// --threshold-ms, nor with --policy / --trace (they tune each policy's threshold).
    #[arg(long, allow_negative_numbers = true, conflicts_with = "threshold_ms")]
    pub threshold_frac: Option<f64>,
    /// Threshold in ms; not with --policy / --trace (they tune each policy's threshold).
    #[arg(long, allow_negative_numbers = true)]
    pub threshold_ms: Option<f64>,
    /// Check mode.
    #[arg(long, value_enum, default_value_t = CheckMode::BeforeMicroBatch)]
    pub check: CheckMode,
    /// Persistently slow workers (0..k) and their latency multiplier.
    #[arg(long, default_value_t = 0)]
    pub slow_workers: u32,
    /// Latency multiplier of the slow workers.
    #[arg(long, default_value_t = 1.5, allow_negative_numbers = true)]
    pub slow_factor: f64,
    /// Pause (GC) every k steps per worker (0 = never) and its length in ms.
    #[arg(long, default_value_t = 0)]
    pub pause_every: u64,
    /// Pause length, ms.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub pause_ms: f64,
    /// Micro-batches simulated per world size (steps = budget / (N·M), at most 100000); every
    /// world size needs at least 100 steps (N·M·100 <= budget), else the command refuses.
    #[arg(long, default_value_t = 20_000_000)]
    pub budget: u64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CSV output (stdout if absent).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// SVG output (effective speedup and drop rate vs N); none if absent.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Replay these traces (the formats of `tune --trace`) instead of drawing latencies from
    /// `--noise`: every policy of `--policy` (default all) on each trace.
    #[arg(long = "trace", num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// Pipeline-parallel replica latency of what-if traces: bottleneck stage or sum.
    #[arg(long, value_enum, default_value_t = PipelineAggregation::Bottleneck)]
    pub pipeline: PipelineAggregation,
    /// Compare step policies (`all` or a comma-separated list of synchronous, drop-before,
    /// drop-predictive, backup-workers, compute-budget, rebalance, rebalance-drop,
    /// length-predictive, cost-balance; the last two use a trace's buckets): one table
    /// per trace, or per world size of `--workers` on [`MIN_STEPS`] Monte Carlo steps drawn
    /// from the noise model (`sim::montecarlo::sample_trace`). Each policy's parameter is
    /// tuned on the replay under the guardrails (`tune::policies`).
    #[arg(long)]
    pub policy: Option<String>,
    /// The guardrails of `--policy` (same flags and defaults as `tune` and `train`).
    #[command(flatten)]
    pub guardrails: GuardrailArgs,
    /// The tail shape of `--policy` (`policy::TailShape`).
    #[command(flatten)]
    pub tail: super::TailArgs,
    /// With `--policy`: print an array of `tune::policies::PolicyComparison` as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Fewest simulated steps per world size: below it the Monte Carlo standard error is too large
/// to compare (the budget must cover N·M·`MIN_STEPS` micro-batches).
pub const MIN_STEPS: u64 = 100;
/// Most simulated steps per world size.
pub const MAX_STEPS: u64 = 100_000;
/// Largest skewness of one worker's compute time (the sum of M micro-batch latencies: the
/// factor's skewness / √M) for which the normal-approximation analytic curve is shown. Above
/// it the normal model misjudges the tail that the maximum over N workers samples (measured
/// with this command, N = 16 and 1000, M = 12: reference noise, skewness 0.93, within 2.2
/// points of the Monte Carlo speedup; `lognormal:1`, skewness 1.79, 3.4 to 26 points off;
/// `lognormal:4`, about 7.6e9, 65 to 82 points off).
pub const MAX_ANALYTIC_SKEWNESS: f64 = 1.0;

/// Why the analytic curve does not model this simulation, `None` when it does: the predictive
/// check (the model is of the check before each micro-batch), slow workers or pauses (the model
/// has i.i.d. workers), or a compute-time skewness above [`MAX_ANALYTIC_SKEWNESS`].
pub fn analytic_unavailable(args: &Args) -> Option<String> {
    if args.check == CheckMode::Predictive {
        return Some("the analytic model is of the check before each micro-batch, not the predictive check".into());
    }
    if args.slow_workers > 0 {
        return Some("the analytic model has no slow workers (--slow-workers)".into());
    }
    if args.pause_every > 0 && args.pause_ms > 0.0 {
        return Some("the analytic model has no pauses (--pause-every)".into());
    }
    let skew = args.noise.skewness() / f64::from(args.micro_batches.max(1)).sqrt();
    (skew > MAX_ANALYTIC_SKEWNESS).then(|| {
        format!(
            "a worker's compute time under {} noise with M = {} has skewness {skew:.3e} > {MAX_ANALYTIC_SKEWNESS}: the normal approximation misjudges the tail the maximum over N workers samples",
            args.noise, args.micro_batches
        )
    })
}

/// One world size: an integer, also in scientific notation (`1e8`), in 1..=u32::MAX.
fn parse_count(x: &str) -> Option<u32> {
    let x = x.trim();
    x.parse::<u32>().ok().or_else(|| {
        let f: f64 = x.parse().ok()?;
        (f.is_finite() && f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f)).then_some(f as u32)
    })
}

/// Parse "a,b,c" or "lo..hi" (1-2-5 grid plus both ends); values may be written `1e4`.
/// Errors: [`CommandError::Args`].
pub fn parse_workers(spec: &str) -> Result<Vec<u32>, CommandError> {
    let bad = || CommandError::Args(format!("--workers {spec:?}: expected \"16,64\" or \"1..10000\" with values >= 1"));
    let mut v: Vec<u32> = if let Some((a, b)) = spec.split_once("..") {
        let (lo, hi) = (parse_count(a).ok_or_else(bad)?, parse_count(b).ok_or_else(bad)?);
        if lo == 0 || hi < lo {
            return Err(bad());
        }
        let mut v = vec![lo, hi];
        let mut decade = 1u64;
        while decade <= u64::from(hi) {
            for f in [1, 2, 5] {
                let x = decade * f;
                if x > u64::from(lo) && x < u64::from(hi) {
                    v.push(x as u32);
                }
            }
            decade *= 10;
        }
        v
    } else {
        spec.split(',').map(|x| parse_count(x).ok_or_else(bad)).collect::<Result<_, _>>()?
    };
    if v.contains(&0) || v.is_empty() {
        return Err(bad());
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

impl Args {
    /// Checks every numeric flag before any simulation.
    ///
    /// # Errors
    /// [`CommandError::Args`] naming the flag and its value: a non-finite number anywhere;
    /// `--base-ms` <= 0; `--overhead-ms`, `--threshold-frac`, `--pause-ms` < 0;
    /// `--threshold-ms` <= 0; `--slow-factor` <= 0; `--micro-batches`, `--budget` = 0;
    /// `--threshold-ms` or `--threshold-frac` with `--policy` or `--trace` (the comparison
    /// tunes each policy's threshold: a given one was ignored). (`--noise` is checked by its
    /// parser.)
    pub fn validate(&self) -> Result<(), CommandError> {
        let bad = |flag: &str, v: String, why: &str| Err(CommandError::Args(format!("--{flag} {v}: {why}")));
        // The guardrails are checked whether or not the run uses them (they were accepted as
        // NaN, 1.5 or -1 without --policy, exit 0: issue 24).
        self.guardrails.guardrails().map_err(CommandError::Args)?;
        let positive = [("base-ms", self.base_ms), ("slow-factor", self.slow_factor)];
        let non_negative = [
            ("overhead-ms", self.overhead_ms),
            ("threshold-frac", self.threshold_frac.unwrap_or(0.0)),
            ("pause-ms", self.pause_ms),
        ];
        for (flag, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return bad(flag, v.to_string(), "must be a finite number > 0");
            }
        }
        for (flag, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return bad(flag, v.to_string(), "must be a finite number >= 0");
            }
        }
        if let Some(t) = self.threshold_ms
            && !(t.is_finite() && t > 0.0)
        {
            return bad("threshold-ms", t.to_string(), "must be a finite number of ms > 0");
        }
        if self.micro_batches == 0 {
            return bad("micro-batches", "0".into(), "must be >= 1");
        }
        if self.budget == 0 {
            return bad("budget", "0".into(), "must be >= 1 simulated micro-batch");
        }
        // The policy comparison tunes every policy's own threshold: a given one was ignored.
        if self.policy.is_some() || !self.traces.is_empty() {
            let given = [("threshold-ms", self.threshold_ms), ("threshold-frac", self.threshold_frac)];
            if let Some((flag, Some(v))) = given.into_iter().find(|(_, v)| v.is_some()) {
                let with = if self.traces.is_empty() { "--policy" } else { "--trace" };
                return bad(
                    flag,
                    v.to_string(),
                    &format!(
                        "not used with {with}: the policy comparison tunes each policy's threshold on the replay; leave --{flag} out"
                    ),
                );
            }
        }
        Ok(())
    }
}

/// Run and print the CSV to stdout (or `--csv`). Errors: see [`run_to`].
pub fn run(args: &Args) -> Result<(), CommandError> {
    run_to(args, &mut dropcompute::console::Stdout)
}

/// Run; the CSV goes to `--csv` or else to `out`, and a one-line summary per N to `out` when
/// `--csv` is given. Errors: invalid arguments or model parameters, I/O, plotting.
pub fn run_to(args: &Args, out: &mut dyn Write) -> Result<(), CommandError> {
    args.validate()?;
    if !args.traces.is_empty() {
        return run_policies(args, out);
    }
    if args.policy.is_none() {
        args.tail.for_policy(None)?; // a tail flag without a policy comparison is refused
    }
    // The budget bounds the Monte Carlo steps of both paths (the policy comparison draws
    // MIN_STEPS steps per world size, then replays them per policy and parameter).
    let workers = parse_workers(&args.workers)?;
    let m = args.micro_batches;
    if let Some(&n) =
        workers.iter().find(|&&n| u64::from(n).saturating_mul(u64::from(m)).saturating_mul(MIN_STEPS) > args.budget)
    {
        return Err(CommandError::Args(format!(
            "--workers {n}: {MIN_STEPS} steps x {n} workers x {m} micro-batches = {} simulated micro-batches, above --budget {}; raise --budget or lower --workers",
            u128::from(n) * u128::from(m) * u128::from(MIN_STEPS),
            args.budget
        )));
    }
    if args.policy.is_some() {
        return run_policies(args, out);
    }
    if let Some(g) = args.guardrails.drop_guard {
        return Err(CommandError::Args(format!(
            "--drop-guard {g}: the guard replays with --policy or --trace (the threshold sweep guards nothing)"
        )));
    }
    args.guardrails.refuse_jitter("the threshold sweep of `simulate`").map_err(CommandError::Args)?;
    let noise = LatencyModel::new(args.base_ms * 1e6, args.noise.clone());
    let unavailable = analytic_unavailable(args);
    let tau =
        args.threshold_ms.map_or(args.threshold_frac.unwrap_or(1.0) * f64::from(m) * noise.mean_ns(), |t| t * 1e6);
    if !(tau.is_finite() && tau >= 0.0) {
        return Err(CommandError::Args(format!("threshold {tau} ns")));
    }
    let scenario = Scenario {
        slow_workers: args.slow_workers,
        slow_factor: args.slow_factor,
        pause_every: args.pause_every,
        pause_ns: args.pause_ms * 1e6,
        ..Scenario::iid(noise.clone(), m, args.overhead_ms * 1e6)
    };
    let policy =
        DeadlineConfig { threshold: Threshold::from_ns_f64(tau), check: args.check, ..DeadlineConfig::default() };
    let model = NormalModel::new(noise.mean_ns(), noise.std_ns(), m, args.overhead_ms * 1e6)?;
    let analytic_label =
        if matches!(args.noise, Noise::Normal { .. }) { "analytic" } else { "analytic (normal approx.)" };
    let mut csv = String::from(
        "workers,steps,baseline_step_ms,baseline_se_ms,policy_step_ms,policy_se_ms,drop_rate,effective_speedup,analytic_baseline_step_ms,analytic_policy_step_ms,analytic_drop_rate,analytic_effective_speedup\n",
    );
    let (mut mc_pts, mut an_pts, mut mc_drop, mut an_drop) = (vec![], vec![], vec![], vec![]);
    let mut summary = String::new();
    for &n in &workers {
        let steps = (args.budget / (u64::from(n) * u64::from(m))).clamp(MIN_STEPS, MAX_STEPS);
        let cfg = MonteCarloConfig { workers: n, steps, seed: args.seed, policy, estimator_quantile: 0.9 };
        let r = run_mc(&scenario, &cfg)?;
        let (ab, at, ad, asp) = if unavailable.is_some() {
            (f64::NAN, f64::NAN, f64::NAN, f64::NAN)
        } else {
            let (ab, at) =
                (model.expected_step_time(u64::from(n)), model.expected_step_time_threshold(u64::from(n), tau));
            let ad = model.drop_rate_before_micro_batch(tau);
            (ab, at, ad, (1.0 - ad) * ab / at - 1.0)
        };
        csv += &format!(
            "{n},{steps},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}\n",
            r.baseline_step_ns.mean / 1e6,
            r.baseline_step_ns.se / 1e6,
            r.policy_step_ns.mean / 1e6,
            r.policy_step_ns.se / 1e6,
            r.drop_rate,
            r.effective_speedup,
            ab / 1e6,
            at / 1e6,
            ad,
            asp
        );
        let analytic = if unavailable.is_some() {
            "analytic n/a".to_owned()
        } else {
            format!("{analytic_label} {:+.2}%", asp * 100.0)
        };
        summary += &format!(
            "N={n:>6}: step {:.3} -> {:.3} ms, drop rate {:.2}%, effective speedup {:+.2}% ({analytic})\n",
            r.baseline_step_ns.mean / 1e6,
            r.policy_step_ns.mean / 1e6,
            r.drop_rate * 100.0,
            r.effective_speedup * 100.0,
        );
        mc_pts.push((f64::from(n), r.effective_speedup * 100.0));
        mc_drop.push((f64::from(n), r.drop_rate * 100.0));
        if unavailable.is_none() {
            an_pts.push((f64::from(n), asp * 100.0));
            an_drop.push((f64::from(n), ad * 100.0));
        }
    }
    match &args.csv {
        Some(p) => {
            std::fs::write(p, &csv).map_err(io_err(p.display().to_string()))?;
            if let Some(why) = &unavailable {
                summary += &format!("analytic: not shown (NaN in the CSV): {why}\n");
            }
            out.write_all(summary.as_bytes()).map_err(io_err("stdout"))?;
        }
        None => {
            if let Some(why) = &unavailable {
                tracing::warn!("analytic columns are NaN: {why}");
            }
            out.write_all(csv.as_bytes()).map_err(io_err("stdout"))?
        }
    }
    if let Some(p) = &args.svg {
        let log_x = workers.len() > 1;
        line_chart(
            p,
            &format!("DropCompute, {} noise, M={m}, threshold {:.3} ms", args.noise, tau / 1e6),
            "workers N",
            "percent",
            log_x,
            &[
                Series { name: &format!("effective speedup % ({analytic_label})"), points: an_pts, line: true },
                Series { name: "effective speedup % (Monte Carlo)", points: mc_pts, line: false },
                Series { name: &format!("drop rate % ({analytic_label})"), points: an_drop, line: true },
                Series { name: "drop rate % (Monte Carlo)", points: mc_drop, line: false },
            ]
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect::<Vec<_>>(),
        )
        .map_err(CommandError::Plot)?;
    }
    Ok(())
}

/// `--policy` / `--trace`: the per-policy tables (module [`dropcompute::tune::policies`]).
/// Errors: bad flags, trace errors, model parameters, output I/O.
fn run_policies(args: &Args, out: &mut dyn Write) -> Result<(), CommandError> {
    let guardrails = args.guardrails.guardrails().map_err(CommandError::Args)?;
    let tail = args.tail.for_policy(Some(args.policy.as_deref().unwrap_or("all")))?;
    let policies = super::parse_policies(args.policy.as_deref().unwrap_or("all"))?;
    let execution = ExecutionModel {
        check: args.check,
        sync_lag: 0,
        warmup_steps: 0,
        min_micro_batches: 1,
        drop_guard: args.guardrails.drop_guard().map_err(CommandError::Args)?,
    };
    let how = Recommend { execution, guardrails };
    let mut comparisons = Vec::new();
    if args.traces.is_empty() {
        let noise = LatencyModel::new(args.base_ms * 1e6, args.noise.clone());
        let scenario = Scenario {
            slow_workers: args.slow_workers,
            slow_factor: args.slow_factor,
            pause_every: args.pause_every,
            pause_ns: args.pause_ms * 1e6,
            ..Scenario::iid(noise, args.micro_batches, args.overhead_ms * 1e6)
        };
        let workers = parse_workers(&args.workers)?;
        if let Some(n) = workers.iter().find(|&&n| n < 2) {
            return Err(CommandError::Args(format!("--workers {n}: --policy needs at least 2 workers")));
        }
        let bar = policy_bar(&workers, policies.len());
        // Long work shows progress: the bar on a terminal, else one line per policy finished
        // (a log or a pipe otherwise saw nothing for minutes with the default --workers).
        let lines = bar.is_hidden();
        let total = workers.len() * policies.len();
        let mut finished = 0usize;
        for n in workers {
            bar.set_message(format!("{n} workers: sampling"));
            let t = dropcompute::sim::montecarlo::sample_trace(&scenario, n, MIN_STEPS, args.seed)?;
            let mut done = |p: Policy| {
                bar.inc(u64::from(n));
                bar.set_message(format!("{n} workers: {p} done"));
                finished += 1;
                if lines {
                    dropcompute::console::err(&format!("simulate: {n} workers: {p} done ({finished}/{total})"));
                }
            };
            comparisons.push(dropcompute::tune::policies::compare_with_progress(
                &t, &how, &policies, tail, args.seed, &mut done,
            ));
        }
        bar.finish_and_clear();
    } else {
        let opts = dropcompute::trace::LoadOptions { pipeline: args.pipeline, ..Default::default() };
        for loaded in dropcompute::trace::load(&args.traces, &opts)? {
            // Enough data as `tune` judges it, by the same one check (a one-step trace got
            // ENABLE verdicts here while `tune` refused it).
            super::tune::check_trace(&loaded.trace, &execution)?;
            // What the loader changed, as `tune` prints it (a trace left without buckets ran
            // its length-aware rows blind, and nothing said so).
            super::print_loader_notes(&loaded, args.json, out)?;
            comparisons.push(dropcompute::tune::policies::compare(&loaded.trace, &how, &policies, tail, args.seed));
        }
    }
    let text = if args.json {
        serde_json::to_string_pretty(&comparisons).map_err(|e| CommandError::Args(format!("--json: {e}")))? + "\n"
    } else {
        comparisons.iter().map(super::policy_table).collect()
    };
    out.write_all(text.as_bytes()).map_err(io_err("stdout"))
}

/// Layout of the policy comparison's progress bar (stderr, a terminal only).
pub const POLICY_BAR_TEMPLATE: &str = "{elapsed_precise} [{bar:30}] {percent:>3}% (eta {eta}) {msg}";

/// The progress bar of a policy comparison over `workers` world sizes and `policies` policies:
/// each policy tuned at N workers advances it by N (its cost grows with N), so the bar and its
/// ETA move with the work. Drawn on stderr when stderr is a terminal, else hidden.
fn policy_bar(workers: &[u32], policies: usize) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    let total: u64 = workers.iter().map(|&n| u64::from(n) * policies as u64).sum();
    let target = if std::io::stderr().is_terminal() {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    };
    let bar = indicatif::ProgressBar::with_draw_target(Some(total), target);
    // The template is a constant; should indicatif reject it, keep its default style.
    if let Ok(style) = indicatif::ProgressStyle::with_template(POLICY_BAR_TEMPLATE) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bar counts N per policy and world size (hidden here: stderr is not a terminal in
    /// tests), and its template is one indicatif takes.
    #[test]
    fn the_policy_bar_weighs_each_world_size_by_its_workers() {
        let bar = policy_bar(&[16, 1000], 7);
        assert_eq!(bar.length(), Some(7 * 1016));
        bar.inc(16);
        assert_eq!(bar.position(), 16);
        assert!(indicatif::ProgressStyle::with_template(POLICY_BAR_TEMPLATE).is_ok());
    }

    #[test]
    fn workers_spec_parsing() {
        assert_eq!(parse_workers("16, 64,200").expect("list"), vec![16, 64, 200]);
        assert_eq!(parse_workers("1..100").expect("range"), vec![1, 2, 5, 10, 20, 50, 100]);
        assert_eq!(parse_workers("3..30").expect("range"), vec![3, 5, 10, 20, 30]);
        assert!(parse_workers("0..5").is_err());
        assert!(parse_workers("a").is_err());
        assert!(parse_workers("5..2").is_err());
        assert_eq!(parse_workers("1e8,16").expect("scientific"), vec![16, 100_000_000]);
        assert!(parse_workers("1.5").is_err() && parse_workers("1e10").is_err());
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn every_bad_flag_value_is_named_with_its_value() {
        use clap::Parser;
        let cases: [(&[&str], &str); 10] = [
            (&["--base-ms", "0"], "--base-ms 0"),
            (&["--base-ms", "-1"], "--base-ms -1"),
            (&["--overhead-ms", "inf"], "--overhead-ms inf"),
            (&["--threshold-frac", "-2"], "--threshold-frac -2"),
            (&["--threshold-ms", "0"], "--threshold-ms 0"),
            (&["--slow-factor", "0"], "--slow-factor 0"),
            (&["--pause-ms", "-3"], "--pause-ms -3"),
            (&["--micro-batches", "0"], "--micro-batches 0"),
            (&["--budget", "0"], "--budget 0"),
            (&["--workers", "0"], "--workers \"0\""),
        ];
        for (flags, want) in cases {
            let mut argv = vec!["simulate"];
            argv.extend_from_slice(flags);
            let args = Cli::try_parse_from(argv).expect("clap accepts the syntax").a;
            let e = run_to(&args, &mut Vec::new()).expect_err(want).to_string();
            assert!(e.contains(want), "{flags:?}: {e}");
        }
        let ok = Cli::try_parse_from(["simulate", "--workers", "4", "--budget", "1000"]).unwrap().a;
        assert!(ok.validate().is_ok());
        // A world size whose 100 steps exceed the budget is refused, naming both.
        let big = Cli::try_parse_from(["simulate", "--workers", "16,1e8"]).unwrap().a;
        let e = run_to(&big, &mut Vec::new()).expect_err("1e8 workers").to_string();
        assert!(
            e.contains("--workers 100000000") && e.contains("120000000000") && e.contains("--budget 20000000"),
            "{e}"
        );
        // The same bound holds for the policy comparison (it refused nothing and ran for minutes).
        let big = Cli::try_parse_from(["simulate", "--workers", "1e5", "--policy", "all"]).unwrap().a;
        let e = run_to(&big, &mut Vec::new()).expect_err("1e5 workers, --policy").to_string();
        assert!(e.contains("--workers 100000") && e.contains("--budget 20000000"), "{e}");
        // The tail shape: named with its value, and only with --policy (clap: a usage error).
        for (flags, want) in [
            (["--tail-split", "0"], "--tail-split 0"),
            (["--tail-split", "65"], "--tail-split 65"),
            (["--tail-cost", "1.5"], "--tail-cost 1.5"),
            (["--tail-cost", "0.6"], "needs --tail-split"),
        ] {
            let mut argv = vec!["simulate", "--workers", "4", "--policy", "all"];
            argv.extend_from_slice(&flags);
            let args = Cli::try_parse_from(argv).expect("clap accepts the syntax").a;
            let e = run_to(&args, &mut Vec::new()).expect_err(want).to_string();
            assert!(e.contains(want), "{flags:?}: {e}");
        }
        let a = Cli::try_parse_from(["simulate", "--tail-split", "2"]).unwrap().a;
        let e = run_to(&a, &mut Vec::new()).expect_err("needs --policy").to_string();
        assert!(e.contains("--tail-split 2: needs --policy"), "{e}");
        // --noise is parsed into the shared noise type; a bad spec is a usage error naming it.
        let e = Cli::try_parse_from(["simulate", "--noise", "lognormal:9"]).err().expect("rejected").to_string();
        assert!(e.contains("lognormal:9") && e.contains("expected"), "{e}");
        let a = Cli::try_parse_from(["simulate", "--noise", "seqlen:8", "--check", "predictive"]).unwrap().a;
        assert_eq!((a.noise, a.check), (Noise::SeqLen { samples: 8 }, CheckMode::Predictive));
    }

    /// A threshold given to the policy comparison (`--policy`, `--trace`), which tunes each
    /// policy's own, is refused naming the flag and the mode (it was ignored); without them it
    /// is the Monte Carlo's deadline; `--threshold-frac` with `--threshold-ms` is a usage error.
    #[test]
    fn a_threshold_the_policy_comparison_would_ignore_is_refused() {
        use clap::Parser;
        for threshold in [["--threshold-ms", "3"], ["--threshold-frac", "0.5"]] {
            for (mode, with) in [(&["--policy", "all"][..], "--policy"), (&["--trace", "/nonexistent.csv"], "--trace")]
            {
                let mut argv = vec!["simulate", "--workers", "4"];
                argv.extend_from_slice(&threshold);
                argv.extend_from_slice(mode);
                let args = Cli::try_parse_from(&argv).expect("clap accepts the syntax").a;
                let e = run_to(&args, &mut Vec::new()).expect_err("refused").to_string();
                assert!(
                    e.contains(&format!("{} {}: not used with {with}", threshold[0], threshold[1])),
                    "{argv:?}: {e}"
                );
            }
            let plain = Cli::try_parse_from(["simulate", "--workers", "4", threshold[0], threshold[1]]).unwrap().a;
            assert!(plain.validate().is_ok(), "{threshold:?} without --policy");
        }
        let both = ["simulate", "--threshold-ms", "3", "--threshold-frac", "0.5"];
        assert!(Cli::try_parse_from(both).is_err(), "the fraction was ignored beside --threshold-ms");
    }

    /// A compute log of a run that dealt beyond M (rank 0 handed M + 1 micro-batches a step,
    /// rank 1 M - 1, as cost-balance deals), every row with its bucket and tokens: the loader
    /// keeps neither for the trace (rank 1's unassigned cell has none). `simulate --trace`
    /// replayed it silently, its length-aware rows equal to drop-predictive's; it prints the
    /// loader's notes now, the same lines as `tune --trace` (one function), saying that the
    /// length-aware rows ran blind.
    #[test]
    fn simulate_trace_prints_the_loaders_notes_as_tune_does() {
        use clap::Parser;
        use dropcompute::trace::compute_log::{ComputeLogRecord, ComputeLogWriter};
        let (m, steps) = (2u32, 12u64);
        let mut w = ComputeLogWriter::new(Vec::new());
        for step in 0..steps {
            for (rank, handed) in [(0u32, m + 1), (1, m - 1)] {
                let mut t = step * 1_000_000;
                for mb in 0..handed {
                    let ns = 100_000 + 10_000 * u64::from(rank + mb);
                    w.write(&ComputeLogRecord {
                        global_step: step,
                        local_step: mb,
                        world_size: 2,
                        batch: 2,
                        computed_batch: 2 * u64::from(mb + 1),
                        iteration_time_ms: ns as f64 / 1e6,
                        rank,
                        start_ns: t,
                        duration_ns: ns,
                        micro_batches: m,
                        clock_start_ns: Some(step * 1_000_000),
                        bucket: Some(mb % 2),
                        tokens: Some(10 + u64::from(mb)),
                        ..ComputeLogRecord::default()
                    })
                    .expect("write");
                    t += ns;
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("compute_log_dropcompute.csv");
        std::fs::write(&log, w.into_inner().expect("flush")).unwrap();
        let path = log.to_str().unwrap();
        let notes = |text: &str| -> Vec<String> {
            text.lines().filter(|l| l.starts_with("  note: ")).map(str::to_owned).collect()
        };
        let argv = ["simulate", "--trace", path, "--policy", "drop-predictive,length-predictive,cost-balance"];
        let mut out = Vec::new();
        run_to(&Cli::try_parse_from(argv).unwrap().a, &mut out).expect("simulate --trace");
        let sim = String::from_utf8(out).unwrap();
        let got = notes(&sim);
        for want in ["did not assign", "have no bucket", "replay blind", "no token count", "past the nominal 2"] {
            assert!(got.iter().any(|n| n.contains(want)), "{want}: {sim}");
        }
        assert!(sim.contains(&format!("trace: {path}")), "{sim}");
        let mut out = Vec::new();
        let tune = <super::super::tune::Args as clap::Args>::augment_args(clap::Command::new("tune"))
            .try_get_matches_from(["tune", "--trace", path])
            .and_then(|m| <super::super::tune::Args as clap::FromArgMatches>::from_arg_matches(&m))
            .unwrap();
        super::super::tune::run_to(&tune, &mut out).expect("tune --trace");
        assert_eq!(notes(&String::from_utf8(out).unwrap()), got, "the same notes as tune");
    }

    fn summary_of(flags: &[&str]) -> (String, String) {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("sim.csv");
        let mut argv = vec!["simulate", "--csv", csv.to_str().unwrap(), "--budget", "400000"];
        argv.extend_from_slice(flags);
        let args = Cli::try_parse_from(argv).unwrap().a;
        let mut out = Vec::new();
        run_to(&args, &mut out).expect("simulate");
        (String::from_utf8(out).unwrap(), std::fs::read_to_string(csv).unwrap())
    }

    /// The fixture: `--noise lognormal:4` printed an analytic speedup of +63 % against
    /// a Monte Carlo -2 %. The normal approximation cannot model that tail: the column is NaN
    /// and the reason is printed; a near-normal noise keeps the analytic column, close to the
    /// Monte Carlo.
    #[test]
    fn the_analytic_column_is_withheld_with_its_reason_where_the_normal_model_fails() {
        let (text, csv) = summary_of(&["--noise", "lognormal:4", "--workers", "16"]);
        assert!(text.contains("analytic n/a") && text.contains("skewness") && text.contains("> 1"), "{text}");
        let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
        assert!(row[8..].iter().all(|v| v.parse::<f64>().unwrap().is_nan()), "{row:?}");
        assert!(row[7].parse::<f64>().unwrap().is_finite());
        let (text, csv) = summary_of(&["--noise", "lognormal:0.25", "--workers", "16"]);
        assert!(!text.contains("n/a"), "{text}");
        let row: Vec<f64> = csv.lines().nth(1).unwrap().split(',').map(|v| v.parse().unwrap()).collect();
        assert!((row[7] - row[11]).abs() < 0.015, "Monte Carlo {} vs analytic {}", row[7], row[11]);
        let (text, _) = summary_of(&["--workers", "16", "--slow-workers", "1"]);
        assert!(text.contains("no slow workers"), "{text}");
    }
}
