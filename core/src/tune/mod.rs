//! Threshold tuning: the reference's search (`get_best_threshold`, digest §3.3) made exact and
//! deterministic, with guardrails, closed-loop re-tuning, collective-friendly statistics and
//! per-rank straggler attribution.
//!
//! Owns: [`search`] (objective + argmax + verdict), [`recommend`] (the one threshold
//! recommendation of `tune` and `train --threshold auto`), [`reduce`] (all-reduce layout),
//! [`retune`] (the state machine), [`straggler`] (attribution), [`policies`] (every step policy tuned and compared on a trace),
//! [`window`] (the jitter window both threshold searches judge a candidate by). Must not touch: I/O, clocks or
//! devices: every function is a pure function of its inputs, so every rank that holds the same
//! reduced statistics reaches the same threshold.
#![forbid(unsafe_code)]

pub mod policies;
pub mod recommend;
pub mod reduce;
pub mod retune;
pub mod search;
pub mod straggler;
pub mod window;

pub use recommend::{Recommend, Recommendation, TuneInputError, check_inputs, recommend};
pub use straggler::StragglerClass;

/// The fewest complete steps (and ranks: 2) a trace needs before `dropcompute tune` gives a
/// verdict and before any rank is labelled a chronic or transient straggler (here and in the
/// scheduler's `StragglerTracker`): below it a threshold or a label mostly fits noise, so the
/// answer is "insufficient data" instead.
pub const MIN_STEPS: usize = 10;
pub use search::{CandidateScore, Guardrails, Refusal, TuneConfig, TuneReport, Verdict, tune};
