//! The exact threshold search and its guardrails.
//!
//! Model (digest §3.3, REPO `get_best_threshold`): oracle truncation. For a threshold τ, in
//! step s, rank n keeps micro-batch m iff m < k_min (the policy's `min_micro_batches`) or its
//! completion time c_{s,n,m} = Σ_{j≤m} t_{s,n,j} <= τ. Then
//! - d_s = dropped / (N·M),
//! - new compute time = max over ranks of the last kept completion time
//!   = max(max_n c_{s,n,k_min-1}, largest c_{s,·,·} <= τ),
//! - s_s = (baseline_s - new_s) / (baseline_s + overhead_s), baseline_s = max_n c_{s,n,M-1},
//! - objective = mean over steps of (1 - d_s)/(1 - s_s) - 1 (predicted effective speedup).
//!
//! The objective is piecewise constant in τ and changes only at observed completion times, so
//! evaluating every distinct completion time is exact (the reference samples a 200-point
//! linspace). Argmax ties go to the smallest threshold. A sweep over candidates in ascending
//! order with one pointer per step costs O(S·N·M·log + C·S).
//!
//! The runtime policy is not an oracle: with `CheckMode::BeforeMicroBatch` the last started
//! micro-batch may finish after τ (digest §3.3 item 6); `sim::replay` measures that on a trace.

use crate::policy::Threshold;
use crate::trace::LatencyTrace;

/// Limits on what the tuner may recommend (`tune` and `train --threshold auto` take them from
/// the same flags, `--max-drop-rate`, `--min-batch-fraction`, `--min-gain`, with the
/// [`Default`] values).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Guardrails {
    /// Largest admissible mean drop rate (fraction). Default 0.10 (about the rate the paper's
    /// authors report as harmless for accuracy; digest §3.4).
    pub max_drop_rate: f64,
    /// Smallest admissible fraction of the global batch computed in any step. Default 0.75.
    pub min_batch_fraction: f64,
    /// Smallest predicted effective speedup that justifies dropping at all. Default 0.02.
    pub min_gain: f64,
    /// Timing jitter the recommended threshold must tolerate (ns, finite, >= 0; `--jitter-ms`):
    /// the replayed recommendation ([`super::recommend`]) admits a candidate t only if every
    /// replayed threshold in [t - jitter, t + jitter] keeps the other guardrails, and ranks it
    /// by the smallest effective speedup there. Why: on a host whose micro-batch times move by
    /// a fraction of a ms between the tuning run and the run, a threshold on a steep part of
    /// the speedup curve predicts its own run badly (issue 25: -4.4 to +6.9 %). Default 0 (the
    /// point replay). The exact search ([`super::tune`], the oracle) ignores it. Absent from a
    /// serialized file written before it existed: 0.
    #[serde(default)]
    pub jitter_ns: f64,
}

impl Default for Guardrails {
    fn default() -> Self {
        Self { max_drop_rate: 0.10, min_batch_fraction: 0.75, min_gain: 0.02, jitter_ns: 0.0 }
    }
}

impl Guardrails {
    /// Checks that every limit is a fraction in [0, 1] and the jitter a finite number of ns
    /// >= 0.
    ///
    /// # Errors
    /// The flag name (`--max-drop-rate`, `--min-batch-fraction`, `--min-gain`) and the value of
    /// the first limit that is not, as `"--FLAG VALUE: must be a fraction in [0, 1]"`; then
    /// `"--jitter-ms VALUE: must be a finite number of ms >= 0"` (VALUE in ms).
    pub fn validate(&self) -> Result<(), String> {
        for (flag, v) in [
            ("--max-drop-rate", self.max_drop_rate),
            ("--min-batch-fraction", self.min_batch_fraction),
            ("--min-gain", self.min_gain),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{flag} {v}: must be a fraction in [0, 1]"));
            }
        }
        if !(self.jitter_ns.is_finite() && self.jitter_ns >= 0.0) {
            // As typed for ordinary values, in exponent form beyond them (no 300-digit number).
            let ms = self.jitter_ns / 1e6;
            let shown = if ms.is_finite() && ms.abs() >= 1e9 { format!("{ms:e}") } else { ms.to_string() };
            return Err(format!("--jitter-ms {shown}: must be a finite number of ms >= 0"));
        }
        Ok(())
    }
}

/// Tuner configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TuneConfig {
    /// Guardrails.
    pub guardrails: Guardrails,
    /// Micro-batches every rank always keeps (the policy's `min_micro_batches`).
    pub min_micro_batches: u32,
}

impl Default for TuneConfig {
    fn default() -> Self {
        Self { guardrails: Guardrails::default(), min_micro_batches: 1 }
    }
}

/// Predicted outcome of one candidate threshold.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CandidateScore {
    /// Threshold (ns of compute time since the step's compute clock started).
    pub threshold_ns: f64,
    /// Predicted effective speedup (mean over steps of (1-d)/(1-s) - 1).
    pub objective: f64,
    /// Mean drop rate over steps.
    pub drop_rate: f64,
    /// Mean relative step-time saving s.
    pub step_saving: f64,
    /// Smallest per-step fraction of the global batch computed.
    pub min_batch_fraction: f64,
}

impl CandidateScore {
    /// The threshold as a policy value (rounded to whole ns).
    pub fn threshold(&self) -> Threshold {
        Threshold::from_ns_f64(self.threshold_ns)
    }
}

/// Why the tuner declined to enable dropping, with the numbers.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "guardrail", rename_all = "snake_case")]
pub enum Refusal {
    /// No threshold predicts at least `min_gain`. JSON tag `min_gain`, the guardrail's name
    /// as the text and the flag (`--min-gain`) spell it (older files: `insufficient_gain`).
    #[serde(rename = "min_gain", alias = "insufficient_gain")]
    InsufficientGain {
        /// Best predicted effective speedup over all candidates.
        best_gain: f64,
        /// Required.
        min_gain: f64,
        /// Where it was reached.
        best_threshold_ns: f64,
    },
    /// Enough gain exists only above the drop-rate limit.
    MaxDropRate {
        /// Gain of the best unconstrained threshold.
        gain: f64,
        /// Its drop rate.
        drop_rate: f64,
        /// The limit.
        max_drop_rate: f64,
        /// Best gain among admissible thresholds.
        best_admissible_gain: f64,
    },
    /// Enough gain exists only below the global-batch floor.
    MinBatchFraction {
        /// Gain of the best unconstrained threshold.
        gain: f64,
        /// Its smallest per-step batch fraction.
        batch_fraction: f64,
        /// The floor.
        min_batch_fraction: f64,
        /// Best gain among admissible thresholds.
        best_admissible_gain: f64,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Refusal::InsufficientGain { best_gain, min_gain, best_threshold_ns } => write!(
                f,
                "guardrail min_gain: best predicted effective speedup {:+.2}% (at {:.3} ms) < required {:+.2}%",
                best_gain * 100.0,
                best_threshold_ns / 1e6,
                min_gain * 100.0
            ),
            Refusal::MaxDropRate { gain, drop_rate, max_drop_rate, best_admissible_gain } => write!(
                f,
                "guardrail max_drop_rate: a {:+.2}% speedup needs drop rate {:.2}% > limit {:.2}%; best within limits {:+.2}%",
                gain * 100.0,
                drop_rate * 100.0,
                max_drop_rate * 100.0,
                best_admissible_gain * 100.0
            ),
            Refusal::MinBatchFraction { gain, batch_fraction, min_batch_fraction, best_admissible_gain } => write!(
                f,
                "guardrail min_batch_fraction: a {:+.2}% speedup computes only {:.2}% of the global batch in some step < floor {:.2}%; best within limits {:+.2}%",
                gain * 100.0,
                batch_fraction * 100.0,
                min_batch_fraction * 100.0,
                best_admissible_gain * 100.0
            ),
        }
    }
}

/// The tuner's decision (JSON: `{"enable": {...}}` or `{"decline": {"guardrail": ...}}`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Enable dropping at this threshold.
    Enable(CandidateScore),
    /// Keep the threshold off, because of this guardrail.
    Decline(Refusal),
}

impl Verdict {
    /// The threshold to run with ([`Threshold::Off`] when declined).
    pub fn threshold(&self) -> Threshold {
        match self {
            Verdict::Enable(c) => c.threshold(),
            Verdict::Decline(_) => Threshold::Off,
        }
    }
}

/// Everything the tuner computed.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneReport {
    /// Every candidate, ascending threshold: 0 (drop all droppable micro-batches), then every
    /// distinct completion time of a droppable micro-batch (the last drops nothing: objective 0).
    pub curve: Vec<CandidateScore>,
    /// Unconstrained argmax.
    pub best: CandidateScore,
    /// Argmax among candidates within the drop-rate and batch-fraction guardrails.
    pub best_admissible: Option<CandidateScore>,
    /// The decision.
    pub verdict: Verdict,
    /// Mean over steps of (max_n T_n - mean_n T_n)/(max_n T_n + overhead): the share of the step
    /// spent waiting for slower ranks, an upper bound on what dropping can recover.
    pub straggler_headroom: f64,
}

struct StepIndex {
    sorted_all: Vec<f64>,
    sorted_droppable: Vec<f64>,
    floor: f64,
    baseline: f64,
    raw: f64,
    p_all: usize,
    p_drop: usize,
}

/// Run the exact search on `trace` (see the module doc). Pure and deterministic.
pub fn tune(trace: &LatencyTrace, cfg: &TuneConfig) -> TuneReport {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let kmin = (cfg.min_micro_batches as usize).min(m);
    let cells = (n * m) as f64;
    let mut steps: Vec<StepIndex> = Vec::with_capacity(trace.num_steps());
    let mut candidates = Vec::with_capacity(trace.latencies_ns().len());
    let mut headroom = 0.0;
    for si in 0..trace.num_steps() {
        let mat = trace.step_matrix(si);
        let mut all = Vec::with_capacity(n * m);
        let mut droppable = Vec::with_capacity(n * m);
        let (mut floor, mut baseline, mut sum_t) = (0.0f64, 0.0f64, 0.0f64);
        for row in mat.chunks_exact(m) {
            let mut c = 0.0;
            for (j, &t) in row.iter().enumerate() {
                c += t;
                all.push(c);
                if j >= kmin {
                    droppable.push(c);
                } else if j + 1 == kmin {
                    floor = floor.max(c);
                }
            }
            baseline = baseline.max(c);
            sum_t += c;
        }
        all.sort_by(f64::total_cmp);
        droppable.sort_by(f64::total_cmp);
        candidates.extend_from_slice(&droppable);
        let raw = baseline + trace.overhead_ns()[si];
        if raw > 0.0 {
            headroom += (baseline - sum_t / n as f64) / raw;
        }
        steps.push(StepIndex {
            sorted_all: all,
            sorted_droppable: droppable,
            floor,
            baseline,
            raw,
            p_all: 0,
            p_drop: 0,
        });
    }
    // τ = 0 stands for the interval below the smallest completion time (drop all droppable).
    candidates.push(0.0);
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    let s_count = steps.len() as f64;
    let g = cfg.guardrails;
    let mut curve = Vec::with_capacity(candidates.len());
    for &tau in &candidates {
        let (mut obj, mut drop, mut save, mut min_frac) = (0.0, 0.0, 0.0, 1.0f64);
        for st in &mut steps {
            while st.p_all < st.sorted_all.len() && st.sorted_all[st.p_all] <= tau {
                st.p_all += 1;
            }
            while st.p_drop < st.sorted_droppable.len() && st.sorted_droppable[st.p_drop] <= tau {
                st.p_drop += 1;
            }
            let last_kept = if st.p_all > 0 { st.sorted_all[st.p_all - 1] } else { 0.0 };
            let new = st.floor.max(last_kept);
            let d = (st.sorted_droppable.len() - st.p_drop) as f64 / cells;
            let s = if st.raw > 0.0 { (st.baseline - new) / st.raw } else { 0.0 };
            obj += (1.0 - d) / (1.0 - s) - 1.0;
            drop += d;
            save += s;
            min_frac = min_frac.min(1.0 - d);
        }
        curve.push(CandidateScore {
            threshold_ns: tau,
            objective: obj / s_count,
            drop_rate: drop / s_count,
            step_saving: save / s_count,
            min_batch_fraction: min_frac,
        });
    }
    let argmax = |it: &mut dyn Iterator<Item = &CandidateScore>| {
        it.fold(None, |best: Option<CandidateScore>, c| match best {
            Some(b) if b.objective >= c.objective => Some(b),
            _ => Some(*c),
        })
    };
    let best = argmax(&mut curve.iter()).unwrap_or(curve[curve.len() - 1]);
    let admissible =
        |c: &&CandidateScore| c.drop_rate <= g.max_drop_rate && c.min_batch_fraction >= g.min_batch_fraction;
    let best_admissible = argmax(&mut curve.iter().filter(admissible));
    let adm_gain = best_admissible.map_or(0.0, |c| c.objective);
    let verdict = match best_admissible {
        Some(c) if c.objective >= g.min_gain => Verdict::Enable(c),
        _ if best.objective < g.min_gain => Verdict::Decline(Refusal::InsufficientGain {
            best_gain: best.objective,
            min_gain: g.min_gain,
            best_threshold_ns: best.threshold_ns,
        }),
        _ if best.drop_rate > g.max_drop_rate => Verdict::Decline(Refusal::MaxDropRate {
            gain: best.objective,
            drop_rate: best.drop_rate,
            max_drop_rate: g.max_drop_rate,
            best_admissible_gain: adm_gain,
        }),
        _ => Verdict::Decline(Refusal::MinBatchFraction {
            gain: best.objective,
            batch_fraction: best.min_batch_fraction,
            min_batch_fraction: g.min_batch_fraction,
            best_admissible_gain: adm_gain,
        }),
    };
    TuneReport { curve, best, best_admissible, verdict, straggler_headroom: headroom / s_count }
}

/// Brute-force objective of one threshold (f64 oracle for tests and for evaluating a threshold
/// not in the candidate list): direct per-rank truncation, O(S·N·M).
pub fn objective_at(trace: &LatencyTrace, min_micro_batches: u32, tau_ns: f64) -> CandidateScore {
    let (n, m) = (trace.world_size(), trace.micro_batches());
    let kmin = (min_micro_batches as usize).min(m);
    let (mut obj, mut drop, mut save, mut min_frac) = (0.0, 0.0, 0.0, 1.0f64);
    for si in 0..trace.num_steps() {
        let (mut base, mut new, mut dropped) = (0.0f64, 0.0f64, 0usize);
        for row in trace.step_matrix(si).chunks_exact(m) {
            let (mut c, mut last) = (0.0, 0.0);
            for (j, &t) in row.iter().enumerate() {
                c += t;
                if j < kmin || c <= tau_ns {
                    last = c;
                } else {
                    dropped += 1;
                }
            }
            base = base.max(c);
            new = new.max(last);
        }
        let raw = base + trace.overhead_ns()[si];
        let d = dropped as f64 / (n * m) as f64;
        let s = if raw > 0.0 { (base - new) / raw } else { 0.0 };
        obj += (1.0 - d) / (1.0 - s) - 1.0;
        drop += d;
        save += s;
        min_frac = min_frac.min(1.0 - d);
    }
    let k = trace.num_steps() as f64;
    CandidateScore {
        threshold_ns: tau_ns,
        objective: obj / k,
        drop_rate: drop / k,
        step_saving: save / k,
        min_batch_fraction: min_frac,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One spelling of a refusal: the JSON tag is the guardrail's name in the text (and the
    /// flag's), for every variant; the older tag still reads.
    #[test]
    fn a_refusal_has_one_spelling_in_text_and_json() {
        for r in [
            Refusal::InsufficientGain { best_gain: 0.01, min_gain: 0.02, best_threshold_ns: 1e6 },
            Refusal::MaxDropRate { gain: 0.1, drop_rate: 0.2, max_drop_rate: 0.1, best_admissible_gain: 0.0 },
            Refusal::MinBatchFraction {
                gain: 0.1,
                batch_fraction: 0.5,
                min_batch_fraction: 0.75,
                best_admissible_gain: 0.0,
            },
        ] {
            let v = serde_json::to_value(r).unwrap();
            let tag = v["guardrail"].as_str().unwrap().to_string();
            assert!(r.to_string().starts_with(&format!("guardrail {tag}:")), "{tag} vs {r}");
            assert_eq!(serde_json::from_value::<Refusal>(v).unwrap(), r);
        }
        let old = serde_json::json!({"guardrail": "insufficient_gain", "best_gain": 0.0, "min_gain": 0.02, "best_threshold_ns": 0.0});
        assert!(matches!(serde_json::from_value::<Refusal>(old).unwrap(), Refusal::InsufficientGain { .. }));
    }

    /// The check mode's JSON name is its command-line name (`tune --json`, `validate --json`,
    /// report.json all agree); the older names still read.
    #[cfg(feature = "clap")]
    #[test]
    fn check_mode_json_is_the_command_line_name() {
        use crate::policy::CheckMode;
        for c in [CheckMode::BeforeMicroBatch, CheckMode::Predictive] {
            let name = clap::ValueEnum::to_possible_value(&c).unwrap().get_name().to_string();
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::Value::from(name.clone()));
            assert_eq!(serde_json::from_value::<CheckMode>(name.into()).unwrap(), c);
        }
        assert_eq!(serde_json::from_str::<CheckMode>("\"Predictive\"").unwrap(), CheckMode::Predictive);
        assert_eq!(serde_json::from_str::<CheckMode>("\"BeforeMicroBatch\"").unwrap(), CheckMode::BeforeMicroBatch);
    }

    fn trace(n: usize, m: usize, s: usize, lat: Vec<f64>, overhead: f64) -> LatencyTrace {
        LatencyTrace::new("t", (0..n as u32).collect(), (0..s as u64).collect(), m, lat, vec![overhead; s])
            .expect("valid")
    }

    #[test]
    fn hand_computed_example() {
        // 2 ranks, M = 2, 2 identical steps: rank 0 [1, 1], rank 1 [1, 5]; overhead 2.
        // τ = 2: rank 1 drops its second micro-batch: d = 1/4, new = 2, base = 6, raw = 8,
        // s = 4/8, objective = 0.75/0.5 - 1 = 0.5 (every figure a mean over the 2 steps).
        let t = trace(2, 2, 2, [1.0, 1.0, 1.0, 5.0].repeat(2), 2.0);
        let cfg = TuneConfig {
            guardrails: Guardrails { max_drop_rate: 0.5, min_batch_fraction: 0.5, min_gain: 0.1, jitter_ns: 0.0 },
            min_micro_batches: 1,
        };
        let r = tune(&t, &cfg);
        assert_eq!(r.best.threshold_ns, 2.0);
        assert!((r.best.objective - 0.5).abs() < 1e-12);
        assert!((r.best.drop_rate - 0.25).abs() < 1e-12);
        assert!(matches!(r.verdict, Verdict::Enable(c) if c.threshold_ns == 2.0));
        // The saving and the batch fraction of that candidate, and the headroom: (max - mean
        // rank compute) / (max + overhead) = (6 - 4) / 8.
        assert!((r.best.step_saving - 0.5).abs() < 1e-12);
        assert!((r.best.min_batch_fraction - 0.75).abs() < 1e-12);
        assert!((r.straggler_headroom - 0.25).abs() < 1e-12, "{}", r.straggler_headroom);
        // With a 10 % drop limit the same gain is refused, naming the guardrail.
        let strict = TuneConfig { guardrails: Guardrails { max_drop_rate: 0.1, ..cfg.guardrails }, ..cfg };
        match tune(&t, &strict).verdict {
            Verdict::Decline(Refusal::MaxDropRate { drop_rate, max_drop_rate, .. }) => {
                assert!((drop_rate - 0.25).abs() < 1e-12 && max_drop_rate == 0.1);
            }
            v => panic!("expected MaxDropRate, got {v:?}"),
        }
        // Boundaries: a best gain exactly at the minimum is not "insufficient" (the drop limit
        // refuses it); a drop rate exactly at the limit is admissible, so the batch fraction
        // refuses it.
        let at_gain = TuneConfig { guardrails: Guardrails { min_gain: 0.5, ..strict.guardrails }, ..cfg };
        assert!(matches!(tune(&t, &at_gain).verdict, Verdict::Decline(Refusal::MaxDropRate { .. })));
        let at_drop = TuneConfig {
            guardrails: Guardrails { max_drop_rate: 0.25, min_batch_fraction: 0.8, min_gain: 0.1, jitter_ns: 0.0 },
            ..cfg
        };
        match tune(&t, &at_drop).verdict {
            Verdict::Decline(Refusal::MinBatchFraction { batch_fraction, .. }) => assert_eq!(batch_fraction, 0.75),
            v => panic!("expected MinBatchFraction, got {v:?}"),
        }
    }

    #[test]
    fn identical_ranks_never_gain() {
        let t = trace(4, 3, 2, vec![2.0; 24], 1.0);
        let r = tune(&t, &TuneConfig::default());
        assert!(r.best.objective.abs() < 1e-12);
        assert!(matches!(r.verdict, Verdict::Decline(Refusal::InsufficientGain { .. })));
        assert_eq!(r.straggler_headroom, 0.0);
    }

    /// A step of zero latencies and zero overhead (raw step time 0) counts as no saving and no
    /// headroom: every figure stays finite.
    #[test]
    fn an_all_zero_step_gives_finite_zeros() {
        let t = trace(2, 2, 1, vec![0.0; 4], 0.0);
        let r = tune(&t, &TuneConfig::default());
        assert_eq!(r.straggler_headroom, 0.0);
        for c in &r.curve {
            assert!(c.objective == 0.0 && c.step_saving == 0.0, "{c:?}");
        }
        let o = objective_at(&t, 1, 0.0);
        assert!(o.objective == 0.0 && o.step_saving == 0.0, "{o:?}");
    }

    proptest! {
        #[test]
        fn chosen_threshold_maximizes_objective(n in 1usize..5, m in 1usize..5, s in 1usize..4,
                                                seed in proptest::collection::vec(1u32..100, 64),
                                                overhead in 0.0f64..50.0, kmin in 0u32..3) {
            let lat: Vec<f64> = (0..n * m * s).map(|i| f64::from(seed[i % seed.len()]) * (1.0 + (i / 64) as f64)).collect();
            let t = trace(n, m, s, lat, overhead);
            let cfg = TuneConfig { min_micro_batches: kmin, ..TuneConfig::default() };
            let r = tune(&t, &cfg);
            for c in &r.curve {
                // The sweep equals the brute-force oracle at every candidate...
                let o = objective_at(&t, kmin, c.threshold_ns);
                prop_assert!((o.objective - c.objective).abs() < 1e-12);
                prop_assert!((o.drop_rate - c.drop_rate).abs() < 1e-12);
                prop_assert!((o.step_saving - c.step_saving).abs() < 1e-12);
                prop_assert!((o.min_batch_fraction - c.min_batch_fraction).abs() < 1e-12);
                // ...and the chosen one is >= every candidate.
                prop_assert!(r.best.objective >= c.objective);
            }
            // Ties go to the smallest threshold.
            let first = r.curve.iter().find(|c| c.objective == r.best.objective).map(|c| c.threshold_ns);
            prop_assert_eq!(first, Some(r.best.threshold_ns));
            // Thresholds between candidates cannot beat the best (piecewise constant objective).
            for w in r.curve.windows(2) {
                let mid = objective_at(&t, kmin, 0.5 * (w[0].threshold_ns + w[1].threshold_ns));
                prop_assert!(mid.objective <= r.best.objective + 1e-12);
            }
        }
    }
}
