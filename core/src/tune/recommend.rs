//! The one threshold recommendation: from a latency trace, the execution that will run and
//! the guardrails to a [`Verdict`], used by `dropcompute tune` and by `train --threshold auto`.
//!
//! Owns: [`recommend`] (which candidates, how they are scored, which guardrails apply). Must
//! not touch: I/O, clocks, devices or environment variables: callers pass the execution model
//! and the guardrails (both commands from the same flags, `commands::GuardrailArgs`), so the
//! function is pure and every rank given the same trace reaches the same threshold.
//!
//! The verdict is what will run: each candidate threshold (the exact search's curve, at most
//! [`MAX_REPLAYED`] evenly spaced) is replayed through `sim::replay` under the check mode,
//! sync lag, warm-up and minimum micro-batches of the run ([`ExecutionModel`]); the guardrails
//! judge that replay (its drop rate, its smallest per-step batch fraction, its effective
//! speedup) and the best admissible replayed effective speedup wins (ties: smallest
//! threshold). With a drop-rate guard in the execution model ([`ExecutionModel::drop_guard`])
//! every candidate is replayed with the guard, so the guardrails judge the guarded drop rate
//! and speedup (the best guarded speedup whose guarded drop rate is within `max_drop_rate`
//! wins). The exact search of [`super::search`] (a micro-batch counts iff it ends by the
//! threshold) is kept beside it as [`Recommendation::ideal`]: the ideal that stopping
//! mid-micro-batch would give, not realizable on the device (a launched graph cannot stop
//! mid-micro-batch). With a jitter in the guardrails ([`Guardrails::jitter_ns`]) a candidate
//! is judged over the thresholds within that jitter of it (worst speedup, every one
//! admissible), so the verdict avoids the steep parts of the curve where a fraction of a ms
//! of host timing decides the step.
#![forbid(unsafe_code)]

use crate::policy::Threshold;
use crate::sim::replay::{ExecutionModel, ReplayReport, replay};
use crate::trace::{LatencyTrace, TraceError};

use super::search::{CandidateScore, Guardrails, Refusal, TuneConfig, TuneReport, Verdict, tune};

/// At most this many candidate thresholds are replayed.
pub const MAX_REPLAYED: usize = 200;

/// What to recommend under.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Recommend {
    /// How the run executes the deadline (check mode, sync lag, warm-up, minimum
    /// micro-batches).
    pub execution: ExecutionModel,
    /// Limits on the recommendation (drop rate and batch fraction are fractions in [0, 1];
    /// `min_gain` is an effective speedup, 0.02 = +2 %), judged on the replay.
    pub guardrails: Guardrails,
}

/// The recommendation and what it was computed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    /// The decision, judged on the replay under [`Recommend::execution`]: an enabled
    /// candidate's `objective` (effective speedup), `drop_rate`, `step_saving` (mean over steps
    /// of 1 - policy/recorded step time) and `min_batch_fraction` are the replay's.
    pub verdict: Verdict,
    /// The replay of the verdict's threshold (threshold off when declined).
    pub replay: ReplayReport,
    /// The exact search on the trace under the reference objective (a micro-batch counts iff it
    /// ends by the threshold): its curve, unconstrained best and verdict. Not realizable on the
    /// device; printed beside the verdict as the ideal.
    pub ideal: TuneReport,
}

/// Why a trace and an execution model cannot be tuned: the one validation of `dropcompute
/// tune`, the C API's `dc_recommend_file` and the Python `recommend` ([`check_inputs`]).
#[derive(Debug, thiserror::Error)]
pub enum TuneInputError {
    /// Fewer than [`super::MIN_STEPS`] steps at or after the warm-up, or fewer than 2 ranks
    /// (always [`TraceError::InsufficientData`]).
    #[error(transparent)]
    InsufficientData(TraceError),
    /// The sync lag is not below the trace's micro-batches per step (the check would never
    /// see a micro-batch end before the step's last launch).
    #[error("sync_lag {sync_lag}: must be < the micro-batches of {source_name} ({micro_batches})")]
    SyncLag {
        /// The execution model's sync lag (micro-batches).
        sync_lag: u32,
        /// The trace.
        source_name: String,
        /// Its micro-batches per rank and step (M).
        micro_batches: usize,
    },
    /// The execution model's drop-rate guard is not a fraction in (0, 1]
    /// ([`crate::policy::DropGuard::check`]).
    #[error(transparent)]
    DropGuard(#[from] crate::policy::DropGuardError),
    /// More micro-batches always computed than the trace has per step.
    #[error("min_micro_batches {min_micro_batches}: must be <= the micro-batches of {source_name} ({micro_batches})")]
    MinMicroBatches {
        /// The execution model's minimum micro-batches per step.
        min_micro_batches: u32,
        /// The trace.
        source_name: String,
        /// Its micro-batches per rank and step (M).
        micro_batches: usize,
    },
}

/// Checks that `trace` can be tuned under `execution`: at least [`super::MIN_STEPS`] steps
/// at or after `execution.warmup_steps` (the warm-up steps are replayed but not tuned on, as
/// in `train --threshold auto`) and 2 ranks, a sync lag below the trace's micro-batches M,
/// `min_micro_batches` <= M and a drop-rate guard (when given) in (0, 1]. The one validation of every face that tunes (CLI, C, Python).
///
/// # Errors
/// The first failed rule, in that order, as a [`TuneInputError`].
pub fn check_inputs(trace: &LatencyTrace, execution: &ExecutionModel) -> Result<(), TuneInputError> {
    let tuned = trace.steps().iter().filter(|&&s| s >= execution.warmup_steps).count();
    if tuned < super::MIN_STEPS || trace.world_size() < 2 {
        return Err(TuneInputError::InsufficientData(TraceError::InsufficientData {
            source_name: trace.source().to_string(),
            steps: tuned,
            warmup_removed: trace.num_steps() - tuned,
            ranks: trace.world_size(),
            min_steps: super::MIN_STEPS,
        }));
    }
    let m = trace.micro_batches();
    if execution.sync_lag as usize >= m {
        return Err(TuneInputError::SyncLag {
            sync_lag: execution.sync_lag,
            source_name: trace.source().to_string(),
            micro_batches: m,
        });
    }
    if execution.min_micro_batches as usize > m {
        return Err(TuneInputError::MinMicroBatches {
            min_micro_batches: execution.min_micro_batches,
            source_name: trace.source().to_string(),
            micro_batches: m,
        });
    }
    if let Some(bound) = execution.drop_guard {
        crate::policy::DropGuard::check(bound)?;
    }
    Ok(())
}

/// Recommends a threshold for `trace` under `how` (see the module doc). Pure and
/// deterministic; never fails (a trace with no droppable candidate yields
/// [`Verdict::Decline`] with [`Refusal::InsufficientGain`]).
pub fn recommend(trace: &LatencyTrace, how: &Recommend) -> Recommendation {
    let ideal =
        tune(trace, &TuneConfig { guardrails: how.guardrails, min_micro_batches: how.execution.min_micro_batches });
    let verdict = replay_verdict(trace, &ideal, how);
    let replay = replay(trace, verdict.threshold(), &how.execution);
    Recommendation { verdict, replay, ideal }
}

/// The score of `threshold_ns` replayed on `trace` under `exec`.
pub fn replay_score(trace: &LatencyTrace, threshold_ns: f64, exec: &ExecutionModel) -> CandidateScore {
    let cells = (trace.world_size() * trace.micro_batches()) as f64;
    let th = Threshold::from_ns_f64(threshold_ns);
    let r = replay(trace, th, exec);
    CandidateScore {
        threshold_ns,
        objective: r.effective_speedup,
        drop_rate: r.drop_rate,
        step_saving: r.per_step.iter().map(|&(b, p, _)| if b > 0.0 { 1.0 - p / b } else { 0.0 }).sum::<f64>()
            / r.per_step.len().max(1) as f64,
        min_batch_fraction: r.per_step.iter().map(|&(_, _, n)| n as f64 / cells).fold(1.0, f64::min),
    }
}

/// The replay scoring of [`recommend`]. Each candidate t (with `guardrails.jitter_ns` = j > 0:
/// each breakpoint and each breakpoint less j) is judged by its window: with j > 0 the replayed
/// candidates in [t - j, t + j] and the window's two ends (the lower end at 1 ns at least), summarized as the worst of them (smallest effective
/// speedup, step saving and batch fraction, largest drop rate); j = 0: t's own replay. The
/// guardrails judge and rank the windows, refusals carry the window's numbers, and an enabled
/// verdict carries t's own replay (what will run).
fn replay_verdict(trace: &LatencyTrace, ideal: &TuneReport, how: &Recommend) -> Verdict {
    let g = how.guardrails;
    let pts: Vec<f64> = ideal.curve.iter().map(|c| c.threshold_ns).filter(|t| *t > 0.0).collect();
    let stride = pts.len().div_ceil(MAX_REPLAYED).max(1);
    let grid: Vec<f64> = pts.iter().step_by(stride).copied().collect();
    let cands = super::window::candidates(&grid, g.jitter_ns);
    let judged = super::window::judge(&cands, g.jitter_ns, &mut |t| replay_score(trace, t, &how.execution));
    // (t's own replay, its window's worst): ties keep the earlier (smaller) threshold.
    let mut best_all: Option<(CandidateScore, CandidateScore)> = None;
    let mut best_adm: Option<(CandidateScore, CandidateScore)> = None;
    for (score, window) in &judged {
        let w = window.iter().fold(*score, |w, c| CandidateScore {
            threshold_ns: score.threshold_ns,
            objective: w.objective.min(c.objective),
            drop_rate: w.drop_rate.max(c.drop_rate),
            step_saving: w.step_saving.min(c.step_saving),
            min_batch_fraction: w.min_batch_fraction.min(c.min_batch_fraction),
        });
        if best_all.is_none_or(|(_, b)| w.objective > b.objective) {
            best_all = Some((*score, w));
        }
        let admissible = w.drop_rate <= g.max_drop_rate && w.min_batch_fraction >= g.min_batch_fraction;
        if admissible && best_adm.is_none_or(|(_, b)| w.objective > b.objective) {
            best_adm = Some((*score, w));
        }
    }
    let adm_gain = best_adm.map_or(0.0, |(_, w)| w.objective);
    match (best_adm, best_all) {
        (Some((c, w)), _) if w.objective >= g.min_gain => Verdict::Enable(c),
        (_, None) => {
            Verdict::Decline(Refusal::InsufficientGain { best_gain: 0.0, min_gain: g.min_gain, best_threshold_ns: 0.0 })
        }
        (_, Some((_, b))) if b.objective < g.min_gain => Verdict::Decline(Refusal::InsufficientGain {
            best_gain: b.objective,
            min_gain: g.min_gain,
            best_threshold_ns: b.threshold_ns,
        }),
        (_, Some((_, b))) if b.drop_rate > g.max_drop_rate => Verdict::Decline(Refusal::MaxDropRate {
            gain: b.objective,
            drop_rate: b.drop_rate,
            max_drop_rate: g.max_drop_rate,
            best_admissible_gain: adm_gain,
        }),
        (_, Some((_, b))) => Verdict::Decline(Refusal::MinBatchFraction {
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
    use crate::policy::CheckMode;
    use std::time::Duration;

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

    fn before() -> ExecutionModel {
        ExecutionModel {
            check: CheckMode::BeforeMicroBatch,
            sync_lag: 0,
            warmup_steps: 0,
            min_micro_batches: 1,
            drop_guard: None,
        }
    }

    #[test]
    fn check_inputs_refuses_short_traces_a_long_sync_lag_and_too_many_minimum_micro_batches() {
        // 2 ranks x M = 4 x 12 steps.
        let t = LatencyTrace::new("t12", vec![0, 1], (0..12).collect(), 4, vec![1.0; 96], vec![0.0; 12]).unwrap();
        let exec = |sync_lag, warmup_steps, min_micro_batches| ExecutionModel {
            check: CheckMode::Predictive,
            sync_lag,
            warmup_steps,
            min_micro_batches,
            drop_guard: None,
        };
        assert!(check_inputs(&t, &exec(3, 2, 4)).is_ok());
        // 12 steps, warm-up 3: 9 tuned < 10.
        match check_inputs(&t, &exec(0, 3, 1)) {
            Err(TuneInputError::InsufficientData(TraceError::InsufficientData { steps, ranks, min_steps, .. })) => {
                assert_eq!((steps, ranks, min_steps), (9, 2, 10));
            }
            other => panic!("{other:?}"),
        }
        let e = check_inputs(&t, &exec(4, 0, 1)).unwrap_err();
        assert_eq!(e.to_string(), "sync_lag 4: must be < the micro-batches of t12 (4)");
        let e = check_inputs(&t, &exec(0, 0, 5)).unwrap_err();
        assert!(matches!(e, TuneInputError::MinMicroBatches { min_micro_batches: 5, micro_batches: 4, .. }), "{e:?}");
        assert_eq!(e.to_string(), "min_micro_batches 5: must be <= the micro-batches of t12 (4)");
        // A drop-rate guard outside (0, 1], with its value.
        let e = check_inputs(&t, &ExecutionModel { drop_guard: Some(0.0), ..exec(0, 0, 1) }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "drop_guard 0: must be a finite fraction in (0, 1] (the largest cumulative drop rate)"
        );
        assert!(check_inputs(&t, &ExecutionModel { drop_guard: Some(0.1), ..exec(0, 0, 1) }).is_ok());
        // One rank.
        let one = LatencyTrace::new("one", vec![0], (0..12).collect(), 4, vec![1.0; 48], vec![0.0; 12]).unwrap();
        assert!(matches!(check_inputs(&one, &exec(0, 0, 1)), Err(TuneInputError::InsufficientData(_))));
    }

    fn replay_with(max_drop_rate: f64) -> Verdict {
        let how = Recommend {
            execution: before(),
            guardrails: Guardrails { max_drop_rate, min_batch_fraction: 0.0, min_gain: 0.02, jitter_ns: 0.0 },
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
            execution: before(),
            guardrails: Guardrails { max_drop_rate: 1.0, min_batch_fraction: 0.7, min_gain: 0.02, jitter_ns: 0.0 },
        };
        // τ=3 computes 5/8 < 0.7 of the batch; τ=4 computes 7/8.
        assert_eq!(enabled(recommend(&trace(), &how).verdict).threshold_ns, 4.0);
        how.guardrails = Guardrails { max_drop_rate: 1.0, min_batch_fraction: 0.0, min_gain: 2.0, jitter_ns: 0.0 };
        match recommend(&trace(), &how).verdict {
            Verdict::Decline(Refusal::InsufficientGain { best_threshold_ns, min_gain, .. }) => {
                assert_eq!((best_threshold_ns, min_gain), (3.0, 2.0));
            }
            other => panic!("expected InsufficientGain, got {other:?}"),
        }
    }

    fn replay_how(max_drop_rate: f64, min_gain: f64) -> Recommend {
        Recommend {
            execution: before(),
            guardrails: Guardrails { max_drop_rate, min_batch_fraction: 0.0, min_gain, jitter_ns: 0.0 },
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
        let r = replay(&two, c.threshold(), &before());
        assert_eq!(r.per_step.len(), 2);
        let savings: Vec<f64> = r.per_step.iter().map(|&(b, p, _)| 1.0 - p / b).collect();
        assert!(savings.iter().sum::<f64>() > 0.0, "{savings:?}");
        assert!((c.step_saving - (savings[0] + savings[1]) / 2.0).abs() < 1e-12, "{c:?} vs {savings:?}");
    }

    #[test]
    fn the_ideal_is_the_exact_search_and_the_verdict_is_the_replay() {
        let g = Guardrails { max_drop_rate: 0.25, min_batch_fraction: 0.0, min_gain: 0.02, jitter_ns: 0.0 };
        let r = recommend(&trace(), &Recommend { execution: before(), guardrails: g });
        assert_eq!(r.ideal, tune(&trace(), &TuneConfig { guardrails: g, min_micro_batches: 1 }));
        // Ideal at τ=4: rank 0 keeps 1, 2, 3 (drops the 4th), rank 1 keeps all up to 4: d = 2/8.
        let i = enabled(r.ideal.verdict);
        assert_eq!((i.threshold_ns, i.drop_rate), (4.0, 0.25));
        // The replay at τ=4 starts 7 of 8 (d = 1/8): the verdict's numbers are the replay's.
        let c = enabled(r.verdict);
        assert_eq!((c.threshold_ns, c.drop_rate), (4.0, 1.0 / 8.0));
        assert_eq!(r.replay.drop_rate, 1.0 / 8.0);
        assert!((r.replay.effective_speedup - c.objective).abs() < 1e-12);
    }

    /// The jitter window, hand-computed on `trace()` (before-check, no guard):
    /// τ=2.5 replays as τ=3 (d 3/8, 1.917); τ=3.5: rank 0 starts 4 (ends 6), rank 1 starts 3
    /// (ends 4): step 6, d 1/8, 1.042; τ=4.5 and τ=5: all 8 start, gain 0.
    /// Jitter 0.5, max drop rate 0.4: τ=3's window {2.5, 3, 3.5} is admissible (worst gain
    /// 1.042); τ=2's and τ=2.5's hold τ=2 (d 1/2); τ=3.5's {3, 3.5, 4} ties with τ=3's (the
    /// smaller wins); τ=4's holds τ=4.5 (gain 0): τ=3 is enabled and carries its own replay
    /// (1.917), not the window's. Jitter 1: τ=3's window holds τ=2 (d 1/2) and
    /// every admissible window holds a threshold that drops nothing: declined, the refusal
    /// carrying the windows' numbers (the best window is τ=2's or smaller, d >= 1/2; the best
    /// admissible gain 0).
    #[test]
    fn replay_with_jitter_judges_each_threshold_by_its_window() {
        let with = |jitter_ns: f64| {
            let mut how = replay_how(0.4, 0.02);
            how.guardrails.jitter_ns = jitter_ns;
            recommend(&trace(), &how).verdict
        };
        let c = enabled(with(0.5));
        assert_eq!((c.threshold_ns, c.drop_rate), (3.0, 3.0 / 8.0));
        assert!((c.objective - (0.625 * 14.0 / 3.0 - 1.0)).abs() < 1e-12, "{c:?}");
        let s = replay_score(&trace(), 3.5, &before());
        assert_eq!(s.drop_rate, 1.0 / 8.0);
        assert!((s.objective - (0.875 * 14.0 / 6.0 - 1.0)).abs() < 1e-12, "{s:?}");
        assert_eq!(replay_score(&trace(), 4.5, &before()).objective, 0.0);
        match with(1.0) {
            Verdict::Decline(Refusal::MaxDropRate { drop_rate, best_admissible_gain, .. }) => {
                assert!(drop_rate >= 0.5, "{drop_rate}");
                assert_eq!(best_admissible_gain, 0.0);
            }
            other => panic!("expected MaxDropRate, got {other:?}"),
        }
        // Jitter 0 is the point replay.
        assert_eq!(enabled(with(0.0)).threshold_ns, 3.0);
    }

    proptest::proptest! {
        /// Whatever the trace, jitter and guardrails: an enabled verdict's window ends (t +- j,
        /// the lower at 1 ns at least) replay within the guardrails and at least the minimum
        /// gain, and the verdict carries t's own replay.
        #[test]
        fn an_enabled_threshold_keeps_the_guardrails_across_its_jitter_window(
            n in 2usize..4, m in 2usize..5, steps in 1usize..4,
            lat in proptest::collection::vec(1u32..60, 48), jitter in 0.0f64..30.0,
            max_drop_rate in 0.0f64..0.6, min_batch_fraction in 0.0f64..0.8, min_gain in 0.0f64..0.3,
        ) {
            let lat: Vec<f64> = (0..n * m * steps).map(|i| f64::from(lat[i % lat.len()]) + (i / 48) as f64).collect();
            let t = LatencyTrace::new("p", (0..n as u32).collect(), (0..steps as u64).collect(), m, lat, vec![0.0; steps])
                .expect("valid trace");
            let how = Recommend {
                execution: before(),
                guardrails: Guardrails { max_drop_rate, min_batch_fraction, min_gain, jitter_ns: jitter },
            };
            if let Verdict::Enable(c) = recommend(&t, &how).verdict {
                proptest::prop_assert_eq!(c, replay_score(&t, c.threshold_ns, &how.execution));
                for e in [(c.threshold_ns - jitter).max(1.0), c.threshold_ns + jitter] {
                    let w = replay_score(&t, e, &how.execution);
                    proptest::prop_assert!(w.drop_rate <= max_drop_rate, "{:?} at {}", w, e);
                    proptest::prop_assert!(w.min_batch_fraction >= min_batch_fraction, "{:?} at {}", w, e);
                    proptest::prop_assert!(w.objective >= min_gain, "{:?} at {}", w, e);
                }
            }
        }
    }

    /// `Guardrails::validate` refuses a jitter below 0, NaN or infinite, naming `--jitter-ms`
    /// and the value in ms.
    #[test]
    fn guardrails_refuse_a_jitter_that_is_not_a_finite_number_of_ns_at_least_0() {
        for (v, want) in
            [(-1e6, Some("-1")), (f64::NAN, Some("NaN")), (f64::INFINITY, Some("inf")), (0.0, None), (2.5e6, None)]
        {
            let g = Guardrails { jitter_ns: v, ..Guardrails::default() };
            match (g.validate(), want) {
                (Ok(()), None) => {}
                (Err(e), Some(ms)) => assert_eq!(e, format!("--jitter-ms {ms}: must be a finite number of ms >= 0")),
                (got, want) => panic!("{v}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn the_verdict_replays_the_check_mode_and_sync_lag_that_will_run() {
        // With sync lag 1 the check before micro-batch i sees the end of i-2: at τ=3 rank 0
        // starts all 4 (mb 3 sees the end of mb 1 = 2 < 3), rank 1 starts 3 (mb 3 sees 3): the
        // same threshold drops 1/8, not 3/8, and the step is 6, not 3.
        let lag1 = ExecutionModel { sync_lag: 1, ..before() };
        let s0 = replay_score(&trace(), 3.0, &before());
        let s1 = replay_score(&trace(), 3.0, &lag1);
        assert_eq!((s0.drop_rate, s1.drop_rate), (3.0 / 8.0, 1.0 / 8.0));
        assert!((s1.objective - (0.875 * 14.0 / 6.0 - 1.0)).abs() < 1e-12, "{s1:?}");
    }
}
