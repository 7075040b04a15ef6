//! Closed-loop re-tuning inside a running job, with hysteresis.
//!
//! Owns: [`Retuner`], a state machine fed once per step (on every rank, with the same
//! all-reduced N x M latency matrix and measured step time) that returns the threshold for the
//! next step. Must not touch: clocks, collectives or the scheduler's state.
//!
//! Cycle of `period` steps: the first `probe_steps` run with the threshold off (probe), the rest
//! with the threshold chosen at the end of the probe (enforce). Why probes: while a threshold is
//! enforced, micro-batches after it are never run, so their latencies (and any threshold above
//! the current one) cannot be evaluated; a short uncensored probe window keeps the statistics
//! honest. Hysteresis: at the end of a probe, the new optimum replaces the current threshold
//! only if, evaluated on the same probe window, its predicted objective beats the current
//! threshold's by at least `hysteresis` (absolute, in effective-speedup units); a guardrail
//! refusal turns dropping off. At the end of each enforce window the retuner reports predicted
//! vs measured effective speedup: measured = (1 - measured drop rate)·(mean probe step time)/
//! (mean enforce step time) - 1, the probe standing in for the baseline.

use super::recommend::{Recommend, recommend, replay_score};
use super::search::{TuneConfig, Verdict, objective_at, tune};
use crate::policy::Threshold;
use crate::sim::replay::ExecutionModel;
use crate::trace::LatencyTrace;

/// Configuration of the retuner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetunerConfig {
    /// Steps per cycle K (probe + enforce); must exceed `probe_steps`.
    pub period: usize,
    /// Steps with the threshold off at the start of each cycle (>= 1).
    pub probe_steps: usize,
    /// Minimum objective improvement to change an enforced threshold.
    pub hysteresis: f64,
    /// Search configuration (guardrails, min micro-batches).
    pub tune: TuneConfig,
    /// How the run executes the deadline (check mode, sync lag, minimum micro-batches): with
    /// it, every candidate is scored on the probe window replayed as the run executes it
    /// (`tune::recommend`, the same recommendation as `train --threshold auto` with a
    /// baseline; the window's steps are past warm-up, so its `warmup_steps` is not applied).
    /// `None`: the exact search's ideal objective (a micro-batch counts iff it ends by the
    /// threshold), which ignores the check mode.
    pub execution: Option<crate::sim::replay::ExecutionModel>,
}

impl Default for RetunerConfig {
    /// Period 200, probe 20 (10 % of steps at full batch), hysteresis 0.01, the ideal
    /// objective (no execution model).
    fn default() -> Self {
        Self { period: 200, probe_steps: 20, hysteresis: 0.01, tune: TuneConfig::default(), execution: None }
    }
}

/// Something the retuner decided or measured.
#[derive(Clone, Debug, PartialEq)]
pub enum RetuneEvent {
    /// End of a probe: the threshold for the enforce window.
    Tuned {
        /// Threshold now in force.
        threshold: Threshold,
        /// Whether it changed.
        changed: bool,
        /// Predicted effective speedup of the threshold in force (on the probe window).
        predicted: f64,
        /// The search's verdict on the probe window.
        verdict: Verdict,
    },
    /// End of an enforce window.
    Measured {
        /// Threshold that was in force.
        threshold: Threshold,
        /// Predicted effective speedup.
        predicted: f64,
        /// Measured effective speedup (see module doc).
        measured: f64,
        /// Measured drop rate.
        drop_rate: f64,
    },
}

/// Errors of [`Retuner`].
#[derive(Debug, thiserror::Error)]
pub enum RetuneError {
    /// Bad configuration.
    #[error("retuner config: {0}")]
    Config(String),
    /// The matrix has the wrong length.
    #[error("retuner: step matrix has {got} values, expected N*M = {expected}")]
    Shape {
        /// Length received.
        got: usize,
        /// N*M.
        expected: usize,
    },
}

/// The state machine (see the module doc).
#[derive(Clone, Debug)]
pub struct Retuner {
    cfg: RetunerConfig,
    world_size: usize,
    micro_batches: usize,
    pos: usize,
    threshold: Threshold,
    predicted: f64,
    probe_lat: Vec<f64>,
    probe_step_ns: Vec<f64>,
    probe_mean_ns: f64,
    enforce_step_ns: f64,
    enforce_steps: usize,
    enforce_computed: usize,
}

impl Retuner {
    /// New retuner for N ranks and M micro-batches; starts in a probe with the threshold off.
    /// Errors: [`RetuneError::Config`] if N, M or probe_steps is 0, period <= probe_steps, N·M
    /// overflows `usize` or the hysteresis is negative or not finite.
    pub fn new(cfg: RetunerConfig, world_size: usize, micro_batches: usize) -> Result<Self, RetuneError> {
        if world_size == 0 || micro_batches == 0 || cfg.probe_steps == 0 || cfg.period <= cfg.probe_steps {
            return Err(RetuneError::Config(format!(
                "N={world_size}, M={micro_batches}, period {} must exceed probe_steps {} >= 1",
                cfg.period, cfg.probe_steps
            )));
        }
        if world_size.checked_mul(micro_batches).is_none() {
            return Err(RetuneError::Config(format!("N={world_size} x M={micro_batches} overflows")));
        }
        if !(cfg.hysteresis.is_finite() && cfg.hysteresis >= 0.0) {
            return Err(RetuneError::Config(format!("hysteresis {}: must be finite and >= 0", cfg.hysteresis)));
        }
        Ok(Self {
            cfg,
            world_size,
            micro_batches,
            pos: 0,
            threshold: Threshold::Off,
            predicted: 0.0,
            probe_lat: Vec::new(),
            probe_step_ns: Vec::new(),
            probe_mean_ns: 0.0,
            enforce_step_ns: 0.0,
            enforce_steps: 0,
            enforce_computed: 0,
        })
    }

    /// The tuned threshold (enforced outside probes; [`Threshold::Off`] until the first probe
    /// ends or after a guardrail refusal).
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    /// Feed one completed step: the all-reduced N x M latency matrix (ns, row-major by rank;
    /// NaN for micro-batches not computed) and the measured step time (ns). Returns an event at
    /// the end of a probe or enforce window. A probe step containing NaN (it should not: the
    /// threshold is off) is excluded from the window. Errors: [`RetuneError::Shape`].
    pub fn on_step(&mut self, latencies_ns: &[f64], step_time_ns: f64) -> Result<Option<RetuneEvent>, RetuneError> {
        let cells = self.world_size * self.micro_batches;
        if latencies_ns.len() != cells {
            return Err(RetuneError::Shape { got: latencies_ns.len(), expected: cells });
        }
        let in_probe = self.pos < self.cfg.probe_steps;
        self.pos += 1;
        if in_probe {
            if latencies_ns.iter().all(|x| x.is_finite() && *x >= 0.0) {
                self.probe_lat.extend_from_slice(latencies_ns);
                self.probe_step_ns.push(step_time_ns);
            }
            if self.pos == self.cfg.probe_steps {
                return Ok(self.end_probe());
            }
            return Ok(None);
        }
        self.enforce_step_ns += step_time_ns;
        self.enforce_steps += 1;
        self.enforce_computed += latencies_ns.iter().filter(|x| x.is_finite()).count();
        if self.pos < self.cfg.period {
            return Ok(None);
        }
        self.pos = 0;
        let drop = 1.0 - self.enforce_computed as f64 / (self.enforce_steps * cells) as f64;
        let mean = self.enforce_step_ns / self.enforce_steps as f64;
        let measured = (1.0 - drop) * self.probe_mean_ns / mean - 1.0;
        let ev =
            RetuneEvent::Measured { threshold: self.threshold, predicted: self.predicted, measured, drop_rate: drop };
        self.enforce_step_ns = 0.0;
        self.enforce_steps = 0;
        self.enforce_computed = 0;
        self.reset_probe_window();
        Ok(Some(ev))
    }

    fn reset_probe_window(&mut self) {
        self.probe_lat.clear();
        self.probe_step_ns.clear();
    }

    fn end_probe(&mut self) -> Option<RetuneEvent> {
        let k = self.probe_step_ns.len();
        if k == 0 {
            return None;
        }
        self.probe_mean_ns = self.probe_step_ns.iter().sum::<f64>() / k as f64;
        let (n, m) = (self.world_size, self.micro_batches);
        let mut overhead = Vec::with_capacity(k);
        for (s, &st) in self.probe_step_ns.iter().enumerate() {
            let max_c = self.probe_lat[s * n * m..(s + 1) * n * m]
                .chunks_exact(m)
                .map(|r| r.iter().sum::<f64>())
                .fold(0.0, f64::max);
            overhead.push((st - max_c).max(0.0));
        }
        let trace = LatencyTrace::new(
            "retuner probe window",
            (0..n as u32).collect(),
            (0..k as u64).collect(),
            m,
            self.probe_lat.clone(),
            overhead,
        )
        .ok()?;
        let old = self.threshold;
        let (verdict, current_obj) = match self.cfg.execution {
            Some(exec) => {
                let how = Recommend {
                    execution: ExecutionModel { warmup_steps: 0, ..exec },
                    guardrails: self.cfg.tune.guardrails,
                };
                let cur = old.as_ns().map(|t| replay_score(&trace, t as f64, &how.execution).objective);
                (recommend(&trace, &how).verdict, cur)
            }
            None => {
                let cur =
                    old.as_ns().map(|t| objective_at(&trace, self.cfg.tune.min_micro_batches, t as f64).objective);
                (tune(&trace, &self.cfg.tune).verdict, cur)
            }
        };
        let (threshold, predicted) = match (verdict, current_obj) {
            (Verdict::Decline(_), _) => (Threshold::Off, 0.0),
            (Verdict::Enable(c), None) => (c.threshold(), c.objective),
            (Verdict::Enable(c), Some(cur)) => {
                if c.objective >= cur + self.cfg.hysteresis {
                    (c.threshold(), c.objective)
                } else {
                    (old, cur)
                }
            }
        };
        self.threshold = threshold;
        self.predicted = predicted;
        Some(RetuneEvent::Tuned { threshold, changed: threshold != old, predicted, verdict })
    }

    /// Threshold the scheduler should apply to the next step: off during probes, the tuned
    /// value while enforcing.
    pub fn threshold_for_next_step(&self) -> Threshold {
        if self.pos < self.cfg.probe_steps { Threshold::Off } else { self.threshold }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{DeadlineConfig, decide};
    use crate::sim::noise::{LatencyModel, Noise};
    use crate::sim::rng::{self, StableRng};

    /// Drive the retuner with a simulated job (reference noise, N = 16, M = 12) whose ranks
    /// apply `decide` with the threshold it returns; check the cycle, the hysteresis and that the
    /// measured speedup is positive and near the prediction.
    #[test]
    fn closed_loop_cycle_with_hysteresis() {
        let (n, m) = (16usize, 12usize);
        let cfg = RetunerConfig { period: 60, probe_steps: 20, hysteresis: 0.01, ..RetunerConfig::default() };
        let mut rt = Retuner::new(cfg, n, m).expect("valid");
        let sampler = LatencyModel::new(1e6, Noise::Reference { delay_factor: 1.0 }).sampler().expect("valid");
        let overhead = 3e6;
        let mut events = Vec::new();
        let mut thresholds_after_probe = Vec::new();
        for step in 0..180u64 {
            let th = rt.threshold_for_next_step();
            let policy = DeadlineConfig { threshold: th, warmup_steps: 0, ..DeadlineConfig::default() };
            let mut rng = rng::stream(5, step);
            let mut mat = vec![f64::NAN; n * m];
            let mut max_c = 0.0f64;
            for r in 0..n {
                let (mut el, mut k) = (0.0f64, 0u32);
                for j in 0..m {
                    let lat = rtp(&sampler, &mut rng);
                    if decide(&policy, step, k, el as u64, None).is_start() {
                        el += lat;
                        k += 1;
                        mat[r * m + j] = lat;
                    }
                }
                max_c = max_c.max(el);
            }
            if let Some(ev) = rt.on_step(&mat, max_c + overhead).expect("shape") {
                if let RetuneEvent::Tuned { threshold, .. } = &ev {
                    thresholds_after_probe.push(*threshold);
                }
                events.push(ev);
            }
        }
        assert_eq!(events.len(), 6, "{events:?}");
        assert!(matches!(events[0], RetuneEvent::Tuned { changed: true, .. }));
        for ev in &events {
            if let RetuneEvent::Measured { predicted, measured, .. } = ev {
                assert!(*predicted > 0.02, "{ev:?}");
                assert!(*measured > 0.0, "{ev:?}");
            }
        }
        // Hysteresis: later probes only change the threshold on a >= 1 % better objective.
        for ev in &events[1..] {
            if let RetuneEvent::Tuned { changed: true, verdict: Verdict::Enable(c), predicted, .. } = ev {
                assert_eq!(c.objective, *predicted);
            }
        }
        assert!(thresholds_after_probe.iter().all(|t| t.as_ns().is_some()));
        assert!(Retuner::new(RetunerConfig { period: 5, probe_steps: 5, ..cfg }, n, m).is_err());
        let e = Retuner::new(cfg, usize::MAX, 2).expect_err("N x M overflows");
        assert_eq!(e.to_string(), format!("retuner config: N={} x M=2 overflows", usize::MAX));
        for h in [f64::NAN, -0.01, f64::INFINITY] {
            let e = Retuner::new(RetunerConfig { hysteresis: h, ..cfg }, n, m).expect_err("bad hysteresis");
            assert!(e.to_string().contains(&format!("hysteresis {h}")), "{e}");
        }
        assert!(rt.on_step(&[0.0; 3], 1.0).is_err());
    }

    /// Issue 23 item 8: with an execution model the retuner scores candidates on the probe
    /// window replayed under the run's check mode, so the before-check and the predictive check
    /// get different thresholds, each the one `tune::recommend` gives on the same window.
    #[test]
    fn the_check_mode_of_the_run_chooses_the_threshold() {
        use crate::policy::CheckMode;
        let (n, m, k) = (8usize, 8usize, 12usize);
        let sampler = LatencyModel::new(1e6, Noise::Reference { delay_factor: 1.0 }).sampler().expect("valid");
        let mut lat = Vec::new();
        for step in 0..k as u64 {
            let mut rng = rng::stream(9, step);
            lat.push((0..n * m).map(|_| rtp(&sampler, &mut rng)).collect::<Vec<f64>>());
        }
        let overhead = 2e6;
        let step_ns = |mat: &[f64]| mat.chunks_exact(m).map(|r| r.iter().sum::<f64>()).fold(0.0, f64::max) + overhead;
        // The window as the retuner builds it: overhead = step time - the slowest compute.
        let max_c = |mat: &[f64]| mat.chunks_exact(m).map(|r| r.iter().sum::<f64>()).fold(0.0, f64::max);
        let oh: Vec<f64> = lat.iter().map(|mat| (step_ns(mat) - max_c(mat)).max(0.0)).collect();
        let trace = LatencyTrace::new("w", (0..n as u32).collect(), (0..k as u64).collect(), m, lat.concat(), oh)
            .expect("valid");
        let mut chosen = Vec::new();
        for check in [CheckMode::BeforeMicroBatch, CheckMode::Predictive] {
            let exec = ExecutionModel { check, sync_lag: 0, warmup_steps: 3, min_micro_batches: 1, drop_guard: None };
            let cfg =
                RetunerConfig { period: k + 5, probe_steps: k, execution: Some(exec), ..RetunerConfig::default() };
            let mut rt = Retuner::new(cfg, n, m).expect("valid");
            let mut ev = None;
            for mat in &lat {
                ev = rt.on_step(mat, step_ns(mat)).expect("shape").or(ev);
            }
            let Some(RetuneEvent::Tuned { threshold, .. }) = ev else { panic!("{ev:?}") };
            let how =
                Recommend { execution: ExecutionModel { warmup_steps: 0, ..exec }, guardrails: cfg.tune.guardrails };
            assert_eq!(threshold, recommend(&trace, &how).verdict.threshold(), "{check:?}");
            chosen.push(threshold);
        }
        assert_ne!(chosen[0], chosen[1], "the two checks tune differently");
        assert!(chosen.iter().all(|t| t.as_ns().is_some()), "{chosen:?}");
    }

    fn rtp(s: &crate::sim::noise::LatencySampler, r: &mut StableRng) -> f64 {
        s.sample(r)
    }
}
