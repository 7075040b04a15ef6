//! Models of DropCompute: the analytic model (order statistics, §3.1-3.2 of
//! `../shared/reference/dropcompute.md`), the Monte Carlo simulator over noise models, and replay
//! of real traces. Pure: no FFI, no clocks; parallel with rayon but deterministic for a seed.
//!
//! Owns: [`SimError`] and the submodules. Must not touch: the scheduler's runtime or devices;
//! the per-worker stop decision is always [`crate::policy::decide`].
#![forbid(unsafe_code)]

pub mod analytic;
pub mod montecarlo;
pub mod noise;
pub mod policies;
pub mod replay;
pub mod rng;
pub mod special;

/// Errors of the models and the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A parameter is out of its domain; `what` names it, `value` shows it.
    #[error("invalid parameter {what}: {value}")]
    InvalidParameter {
        /// Parameter name.
        what: &'static str,
        /// Offending value.
        value: String,
    },
    /// The rayon thread pool could not be built.
    #[error("thread pool: {0}")]
    ThreadPool(String),
}
