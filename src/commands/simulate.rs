//! `dropcompute simulate`: effective speedup and drop rate vs world size, Monte Carlo points
//! over the analytic curve.
//!
//! Owns: [`Args`], [`run`], [`run_to`], [`parse_workers`]. Must not touch the models
//! (`crate::sim`). The analytic curve is exact for `--noise normal`; for other noise models it is
//! the normal model with the same per-micro-batch mean and variance (CLT approximation, labelled
//! as such).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::{CommandError, io_err};
use crate::plot::{Series, line_chart};
use crate::policy::{CheckMode, PolicyConfig, Threshold};
use crate::sim::analytic::NormalModel;
use crate::sim::montecarlo::{MonteCarloConfig, Scenario, run as run_mc};
use crate::sim::noise::{LatencyModel, Noise};

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
    /// Threshold as a fraction of the mean compute time M·mean latency (ignored with
    /// --threshold-ms).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub threshold_frac: f64,
    /// Threshold in ms.
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
    /// Micro-batches simulated per world size (steps = budget / (N·M), clamped to 100..100000).
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
}

/// Parse "a,b,c" or "lo..hi" (1-2-5 grid plus both ends). Errors: [`CommandError::Args`].
pub fn parse_workers(spec: &str) -> Result<Vec<u32>, CommandError> {
    let bad = || CommandError::Args(format!("--workers {spec:?}: expected \"16,64\" or \"1..10000\" with values >= 1"));
    let mut v: Vec<u32> = if let Some((a, b)) = spec.split_once("..") {
        let (lo, hi): (u32, u32) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
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
        spec.split(',').map(|x| x.trim().parse::<u32>().map_err(|_| bad())).collect::<Result<_, _>>()?
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
    /// `--threshold-ms` <= 0; `--slow-factor` <= 0; `--micro-batches`, `--budget` = 0. (`--noise`
    /// is checked by its parser.)
    pub fn validate(&self) -> Result<(), CommandError> {
        let bad = |flag: &str, v: String, why: &str| Err(CommandError::Args(format!("--{flag} {v}: {why}")));
        let positive = [("base-ms", self.base_ms), ("slow-factor", self.slow_factor)];
        let non_negative =
            [("overhead-ms", self.overhead_ms), ("threshold-frac", self.threshold_frac), ("pause-ms", self.pause_ms)];
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
        Ok(())
    }
}

/// Run and print the CSV to stdout (or `--csv`). Errors: see [`run_to`].
pub fn run(args: &Args) -> Result<(), CommandError> {
    run_to(args, &mut std::io::stdout().lock())
}

/// Run; the CSV goes to `--csv` or else to `out`, and a one-line summary per N to `out` when
/// `--csv` is given. Errors: invalid arguments or model parameters, I/O, plotting.
pub fn run_to(args: &Args, out: &mut dyn Write) -> Result<(), CommandError> {
    args.validate()?;
    let workers = parse_workers(&args.workers)?;
    let noise = LatencyModel::new(args.base_ms * 1e6, args.noise.clone());
    let m = args.micro_batches;
    let tau = args.threshold_ms.map_or(args.threshold_frac * f64::from(m) * noise.mean_ns(), |t| t * 1e6);
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
    let policy = PolicyConfig {
        threshold: Threshold::Fixed(Duration::from_nanos(tau as u64)),
        check: args.check,
        ..PolicyConfig::default()
    };
    let model = NormalModel::new(noise.mean_ns(), noise.std_ns(), m, args.overhead_ms * 1e6)?;
    let analytic_label =
        if matches!(args.noise, Noise::Normal { .. }) { "analytic" } else { "analytic (normal approx.)" };
    let mut csv = String::from(
        "workers,steps,baseline_step_ms,baseline_se_ms,policy_step_ms,policy_se_ms,drop_rate,effective_speedup,analytic_baseline_step_ms,analytic_policy_step_ms,analytic_drop_rate,analytic_effective_speedup\n",
    );
    let (mut mc_pts, mut an_pts, mut mc_drop, mut an_drop) = (vec![], vec![], vec![], vec![]);
    let mut summary = String::new();
    for &n in &workers {
        let steps = (args.budget / (u64::from(n) * u64::from(m))).clamp(100, 100_000);
        let cfg = MonteCarloConfig { workers: n, steps, seed: args.seed, policy, estimator_quantile: 0.9 };
        let r = run_mc(&scenario, &cfg)?;
        let (ab, at) = (model.expected_step_time(u64::from(n)), model.expected_step_time_threshold(u64::from(n), tau));
        let ad = model.drop_rate_before_micro_batch(tau);
        let asp = (1.0 - ad) * ab / at - 1.0;
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
        summary += &format!(
            "N={n:>6}: step {:.3} -> {:.3} ms, drop rate {:.2}%, effective speedup {:+.2}% ({analytic_label} {:+.2}%)\n",
            r.baseline_step_ns.mean / 1e6,
            r.policy_step_ns.mean / 1e6,
            r.drop_rate * 100.0,
            r.effective_speedup * 100.0,
            asp * 100.0
        );
        mc_pts.push((f64::from(n), r.effective_speedup * 100.0));
        an_pts.push((f64::from(n), asp * 100.0));
        mc_drop.push((f64::from(n), r.drop_rate * 100.0));
        an_drop.push((f64::from(n), ad * 100.0));
    }
    match &args.csv {
        Some(p) => {
            std::fs::write(p, &csv).map_err(io_err(p.display().to_string()))?;
            out.write_all(summary.as_bytes()).map_err(io_err("stdout"))?;
        }
        None => out.write_all(csv.as_bytes()).map_err(io_err("stdout"))?,
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
            ],
        )
        .map_err(CommandError::Plot)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_spec_parsing() {
        assert_eq!(parse_workers("16, 64,200").expect("list"), vec![16, 64, 200]);
        assert_eq!(parse_workers("1..100").expect("range"), vec![1, 2, 5, 10, 20, 50, 100]);
        assert_eq!(parse_workers("3..30").expect("range"), vec![3, 5, 10, 20, 30]);
        assert!(parse_workers("0..5").is_err());
        assert!(parse_workers("a").is_err());
        assert!(parse_workers("5..2").is_err());
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
        // --noise is parsed into the shared noise type; a bad spec is a usage error naming it.
        let e = Cli::try_parse_from(["simulate", "--noise", "lognormal:9"]).err().expect("rejected").to_string();
        assert!(e.contains("lognormal:9") && e.contains("expected"), "{e}");
        let a = Cli::try_parse_from(["simulate", "--noise", "seqlen:8", "--check", "predictive"]).unwrap().a;
        assert_eq!((a.noise, a.check), (Noise::SeqLen { samples: 8 }, CheckMode::Predictive));
    }
}
