//! The one threshold recommendation: from a latency trace and guardrails to a [`Verdict`],
//! used by `dropcompute tune` and by `train --threshold auto`.
//!
//! Owns: [`recommend`] (which candidates, how they are scored, which guardrails apply) and
//! [`replay_at`] (the policy a recommended threshold runs under when replayed). Must not touch:
//! I/O, clocks, devices or environment variables: callers pass the guardrails (`train` reads
//! `$DROPCOMPUTE_AUTO_MAX_DROP`, `tune` its flags), so the function is pure and every rank
//! given the same trace reaches the same threshold.
//!
//! Two scorings, because the runtime policy is not an oracle:
//! - [`Scoring::Oracle`]: the exact search of [`super::search`] (every distinct completion
//!   time, oracle truncation); the verdict is [`TuneReport::verdict`]. What `tune` prints.
//! - [`Scoring::Replay`]: the search's curve thresholds (at most [`MAX_REPLAYED`], evenly
//!   spaced) each replayed through `sim::replay` under the run's check mode; the best replayed
//!   effective speedup among candidates within the guardrails wins (ties: smallest threshold).
//!   This matters for the predictive check, which stops earlier than the oracle at the same
//!   threshold. What `train --threshold auto` runs with.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::policy::{CheckMode, PolicyConfig, Threshold};
use crate::sim::replay::{ReplayReport, replay};
use crate::trace::LatencyTrace;

use super::search::{CandidateScore, Guardrails, Refusal, TuneConfig, TuneReport, Verdict, tune};

/// At most this many candidate thresholds are replayed by [`Scoring::Replay`].
pub const MAX_REPLAYED: usize = 200;

/// How the candidate thresholds are scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// The search's own oracle objective (exact, every candidate).
    Oracle,
    /// Replay through the deadline policy with this check mode (see the module doc).
    Replay(CheckMode),
}

/// What to recommend under.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recommend {
    /// How candidates are scored.
    pub scoring: Scoring,
    /// Limits on the recommendation (drop rate and batch fraction are fractions in [0, 1];
    /// `min_gain` is an effective speedup, 0.02 = +2 %).
    pub guardrails: Guardrails,
    /// Micro-batches every rank always computes (the policy's `min_micro_batches`).
    pub min_micro_batches: u32,
}

/// The recommendation and what it was computed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    /// The decision. With [`Scoring::Replay`], an enabled candidate's `objective`, `drop_rate`,
    /// `step_saving` (mean over steps of 1 - policy/recorded step time) and
    /// `min_batch_fraction` are the replay's, not the oracle's.
    pub verdict: Verdict,
    /// The exact search on the trace (its curve, unconstrained best and oracle verdict).
    pub report: TuneReport,
}

/// The policy of `threshold` replayed on a trace: `check`, no warm-up (a trace holds
/// post-warm-up steps only), `min_micro_batches`.
pub fn replay_at(trace: &LatencyTrace, threshold: Threshold, check: CheckMode, min_micro_batches: u32) -> ReplayReport {
    replay(trace, &PolicyConfig { threshold, check, warmup_steps: 0, min_micro_batches })
}

/// Recommends a threshold for `trace` under `how` (see the module doc). Pure and
/// deterministic; never fails (a trace with no droppable candidate yields
/// [`Verdict::Decline`] with [`Refusal::InsufficientGain`]).
pub fn recommend(trace: &LatencyTrace, how: &Recommend) -> Recommendation {
    let report = tune(trace, &TuneConfig { guardrails: how.guardrails, min_micro_batches: how.min_micro_batches });
    let verdict = match how.scoring {
        Scoring::Oracle => report.verdict,
        Scoring::Replay(check) => replay_verdict(trace, &report, check, how),
    };
    Recommendation { verdict, report }
}

/// The replay scoring of [`recommend`].
fn replay_verdict(trace: &LatencyTrace, report: &TuneReport, check: CheckMode, how: &Recommend) -> Verdict {
    let g = how.guardrails;
    let cells = (trace.world_size() * trace.micro_batches()) as f64;
    let pts: Vec<f64> = report.curve.iter().map(|c| c.threshold_ns).filter(|t| *t > 0.0).collect();
    let stride = pts.len().div_ceil(MAX_REPLAYED).max(1);
    // (score, speedup ratio): ties keep the earlier (smaller) threshold.
    let mut best_all: Option<(CandidateScore, f64)> = None;
    let mut best_adm: Option<(CandidateScore, f64)> = None;
    for &t in pts.iter().step_by(stride) {
        let th = Threshold::Fixed(Duration::from_nanos(t.round() as u64));
        let r = replay_at(trace, th, check, how.min_micro_batches);
        let score = CandidateScore {
            threshold_ns: t,
            objective: r.effective_speedup,
            drop_rate: r.drop_rate,
            step_saving: r.per_step.iter().map(|&(b, p, _)| if b > 0.0 { 1.0 - p / b } else { 0.0 }).sum::<f64>()
                / r.per_step.len().max(1) as f64,
            min_batch_fraction: r.per_step.iter().map(|&(_, _, n)| n as f64 / cells).fold(1.0, f64::min),
        };
        let ratio = r.effective_speedup + 1.0;
        if best_all.is_none_or(|(_, s)| ratio > s) {
            best_all = Some((score, ratio));
        }
        let admissible = score.drop_rate <= g.max_drop_rate && score.min_batch_fraction >= g.min_batch_fraction;
        if admissible && best_adm.is_none_or(|(_, s)| ratio > s) {
            best_adm = Some((score, ratio));
        }
    }
    let adm_gain = best_adm.map_or(0.0, |(c, _)| c.objective);
    match (best_adm, best_all) {
        (Some((c, s)), _) if s >= 1.0 + g.min_gain => Verdict::Enable(c),
        (_, None) => {
            Verdict::Decline(Refusal::InsufficientGain { best_gain: 0.0, min_gain: g.min_gain, best_threshold_ns: 0.0 })
        }
        (_, Some((b, s))) if s < 1.0 + g.min_gain => Verdict::Decline(Refusal::InsufficientGain {
            best_gain: b.objective,
            min_gain: g.min_gain,
            best_threshold_ns: b.threshold_ns,
        }),
        (_, Some((b, _))) if b.drop_rate > g.max_drop_rate => Verdict::Decline(Refusal::MaxDropRate {
            gain: b.objective,
            drop_rate: b.drop_rate,
            max_drop_rate: g.max_drop_rate,
            best_admissible_gain: adm_gain,
        }),
        (_, Some((b, _))) => Verdict::Decline(Refusal::MinBatchFraction {
            gain: b.objective,
            batch_fraction: b.min_batch_fraction,
            min_batch_fraction: g.min_batch_fraction,
            best_admissible_gain: adm_gain,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 ranks, M = 4, one step, no overhead. Rank 0 [1, 1, 1, 3] (completion 1, 2, 3, 6),
    /// rank 1 [1, 2, 1, 10] (completion 1, 3, 4, 14); recorded step 14.
    /// Replayed with the before-micro-batch check (start while elapsed < τ):
    /// τ=2: started 2+2, step 3, d=4/8, speedup 0.5·14/3-1 = 1.333;
    /// τ=3: started 3+2, step 3, d=3/8, 0.625·14/3-1 = 1.917 (the unconstrained best);
    /// τ=4: started 4+3, step 6, d=1/8, 0.875·14/6-1 = 1.042;
    /// τ=6 and τ=14: nothing dropped, 0.
    fn trace() -> LatencyTrace {
        let lat = vec![1.0, 1.0, 1.0, 3.0, 1.0, 2.0, 1.0, 10.0];
        LatencyTrace::new("t", vec![0, 1], vec![0], 4, lat, vec![0.0]).expect("valid trace")
    }

    fn replay_with(max_drop_rate: f64) -> Verdict {
        let how = Recommend {
            scoring: Scoring::Replay(CheckMode::BeforeMicroBatch),
            guardrails: Guardrails { max_drop_rate, min_batch_fraction: 0.0, min_gain: 0.02 },
            min_micro_batches: 1,
        };
        recommend(&trace(), &how).verdict
    }

    fn enabled(v: Verdict) -> CandidateScore {
        match v {
            Verdict::Enable(c) => c,
            other => panic!("expected Enable, got {other:?}"),
        }
    }

    #[test]
    fn replay_picks_the_best_replayed_threshold_without_a_binding_guardrail() {
        let c = enabled(replay_with(1.0));
        assert_eq!(c.threshold_ns, 3.0);
        assert_eq!(c.drop_rate, 3.0 / 8.0);
        assert!((c.objective - (0.625 * 14.0 / 3.0 - 1.0)).abs() < 1e-12, "{c:?}");
        assert!((c.step_saving - 11.0 / 14.0).abs() < 1e-12, "{c:?}");
        assert_eq!(c.min_batch_fraction, 5.0 / 8.0);
        assert_eq!(c.threshold(), Threshold::Fixed(Duration::from_nanos(3)));
    }

    #[test]
    fn replay_honours_the_drop_rate_guardrail() {
        // 3/8 > 0.25: the best admissible is τ=4 (drop rate 1/8), not the faster τ=3.
        let c = enabled(replay_with(0.25));
        assert_eq!(c.threshold_ns, 4.0);
        assert_eq!(c.drop_rate, 1.0 / 8.0);
        assert!((c.objective - (0.875 * 14.0 / 6.0 - 1.0)).abs() < 1e-12, "{c:?}");
        // Exactly at the limit is admissible.
        assert_eq!(enabled(replay_with(3.0 / 8.0)).threshold_ns, 3.0);
        // Below every dropping candidate's rate: declined, naming the guardrail and the numbers.
        match replay_with(0.1) {
            Verdict::Decline(Refusal::MaxDropRate { gain, drop_rate, max_drop_rate, best_admissible_gain }) => {
                assert_eq!((drop_rate, max_drop_rate, best_admissible_gain), (3.0 / 8.0, 0.1, 0.0));
                assert!((gain - (0.625 * 14.0 / 3.0 - 1.0)).abs() < 1e-12);
            }
            other => panic!("expected MaxDropRate, got {other:?}"),
        }
    }

    #[test]
    fn replay_honours_the_batch_fraction_floor_and_the_min_gain() {
        let mut how = Recommend {
            scoring: Scoring::Replay(CheckMode::BeforeMicroBatch),
            guardrails: Guardrails { max_drop_rate: 1.0, min_batch_fraction: 0.7, min_gain: 0.02 },
            min_micro_batches: 1,
        };
        // τ=3 computes 5/8 < 0.7 of the batch; τ=4 computes 7/8.
        assert_eq!(enabled(recommend(&trace(), &how).verdict).threshold_ns, 4.0);
        how.guardrails = Guardrails { max_drop_rate: 1.0, min_batch_fraction: 0.0, min_gain: 2.0 };
        match recommend(&trace(), &how).verdict {
            Verdict::Decline(Refusal::InsufficientGain { best_threshold_ns, min_gain, .. }) => {
                assert_eq!((best_threshold_ns, min_gain), (3.0, 2.0));
            }
            other => panic!("expected InsufficientGain, got {other:?}"),
        }
    }

    fn replay_how(max_drop_rate: f64, min_gain: f64) -> Recommend {
        Recommend {
            scoring: Scoring::Replay(CheckMode::BeforeMicroBatch),
            guardrails: Guardrails { max_drop_rate, min_batch_fraction: 0.0, min_gain },
            min_micro_batches: 1,
        }
    }

    /// `min_gain` is a gain over 1.0x: τ=4 replays at 0.875·14/6 = 2.04x (gain 1.04), which
    /// clears a 0.5 minimum gain.
    #[test]
    fn replay_min_gain_is_a_gain_not_a_ratio() {
        assert_eq!(enabled(recommend(&trace(), &replay_how(0.25, 0.5)).verdict).threshold_ns, 4.0);
        assert!(matches!(recommend(&trace(), &replay_how(0.25, 1.1)).verdict, Verdict::Decline(_)));
    }

    /// Which guardrail a refusal names: the batch-fraction floor when it, not the drop rate,
    /// excludes the best candidate; a best gain exactly at the minimum gain is enough gain (the
    /// refusal is then the guardrail's, not InsufficientGain).
    #[test]
    fn replay_refusals_name_the_binding_guardrail() {
        let mut how = replay_how(1.0, 0.02);
        how.guardrails.min_batch_fraction = 0.95;
        match recommend(&trace(), &how).verdict {
            Verdict::Decline(Refusal::MinBatchFraction { batch_fraction, min_batch_fraction, .. }) => {
                assert_eq!((batch_fraction, min_batch_fraction), (5.0 / 8.0, 0.95));
            }
            other => panic!("expected MinBatchFraction, got {other:?}"),
        }
        let best = enabled(replay_with(1.0));
        match recommend(&trace(), &replay_how(0.1, best.objective)).verdict {
            Verdict::Decline(Refusal::MaxDropRate { gain, .. }) => assert_eq!(gain, best.objective),
            other => panic!("expected MaxDropRate at exactly the minimum gain, got {other:?}"),
        }
    }

    /// Ties keep the smaller threshold: with no drop allowed, τ=6 and τ=14 both replay at 1.0x
    /// and a zero minimum gain enables τ=6.
    #[test]
    fn replay_ties_keep_the_smallest_threshold() {
        assert_eq!(enabled(recommend(&trace(), &replay_how(0.0, 0.0)).verdict).threshold_ns, 6.0);
    }

    /// step_saving is the mean over steps of 1 - replayed / recorded step time (two steps, the
    /// second all 1 ns micro-batches), not their sum.
    #[test]
    fn replay_step_saving_is_the_mean_over_steps() {
        let lat = vec![1.0, 1.0, 1.0, 3.0, 1.0, 2.0, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let two = LatencyTrace::new("t", vec![0, 1], vec![0, 1], 4, lat, vec![0.0, 0.0]).expect("valid trace");
        let c = enabled(recommend(&two, &replay_how(1.0, 0.02)).verdict);
        let r = replay_at(&two, c.threshold(), CheckMode::BeforeMicroBatch, 1);
        assert_eq!(r.per_step.len(), 2);
        let savings: Vec<f64> = r.per_step.iter().map(|&(b, p, _)| 1.0 - p / b).collect();
        assert!(savings.iter().sum::<f64>() > 0.0, "{savings:?}");
        assert!((c.step_saving - (savings[0] + savings[1]) / 2.0).abs() < 1e-12, "{c:?} vs {savings:?}");
    }

    #[test]
    fn oracle_scoring_is_the_search_verdict() {
        let g = Guardrails { max_drop_rate: 0.25, min_batch_fraction: 0.0, min_gain: 0.02 };
        let how = Recommend { scoring: Scoring::Oracle, guardrails: g, min_micro_batches: 1 };
        let r = recommend(&trace(), &how);
        assert_eq!(r.verdict, tune(&trace(), &TuneConfig { guardrails: g, min_micro_batches: 1 }).verdict);
        // Oracle at τ=4: rank 0 keeps 1, 2, 3 (drops the 4th), rank 1 keeps all up to 4: d = 2/8.
        let c = enabled(r.verdict);
        assert_eq!((c.threshold_ns, c.drop_rate), (4.0, 0.25));
    }
}
