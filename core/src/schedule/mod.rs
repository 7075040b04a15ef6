//! The DropCompute step scheduler: the host-side loop that runs one training step on one rank
//! (`../shared/reference/dropcompute.md` §2, with exact normalization, lockstep collectives and
//! a ledger so no sample is silently lost).
//!
//! Owns: the step loop ([`Scheduler`], [`Workload`]), its configuration ([`SchedulerConfig`]),
//! the data-source and ledger types, the per-rank count row gathered every step ([`CountRow`]),
//! the rescale rule ([`divisor()`]), the gradient recipes it launches ([`GradientOps`]) and the
//! step report. Must not touch: the deadline rule (`policy`, shared with the simulator), the
//! user's model (behind [`Workload`]), threshold search (`tune`; driven through
//! [`Scheduler::set_threshold`] / [`Scheduler::set_retuner`]).
#![forbid(unsafe_code)]

pub mod auto;
mod config;
mod count_row;
mod data;
mod divisor;
mod ops;
mod report;
mod step;

pub use config::{DropHandling, GradDtype, Normalization, SchedulerConfig, Weighting};
pub use count_row::{CountRow, CountRowError};
pub use data::{DataSource, DropFate, DropLedger, DropRecord, EpochQueue, MicroBatch, SharedSource};
pub use divisor::divisor;
pub use ops::{GradientOps, GradientRecipes, GradientScratch};
pub use report::{CHRONIC_MIN_STEPS, MicroBatchRecord, RankStepStats, SkipReason, StepReport, StragglerTracker};
pub use step::{Scheduler, SchedulerState, Workload, per_micro_batch_ns};

/// Error returned by a [`Workload`] (any error type).
pub type WorkloadError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a step (or the scheduler's construction) failed. Every variant names the rank, the step
/// and the call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A device call of the scheduler failed (launch, copy, event, allocation).
    #[error("rank {rank}, step {step}: {call} failed: {source}")]
    Device {
        /// Rank.
        rank: u32,
        /// Step (0 during construction).
        step: u64,
        /// The operation.
        call: &'static str,
        /// The runtime's error.
        #[source]
        source: crate::synapse::Error,
    },
    /// A collective failed: timeout, lost peer, asynchronous error, bad argument.
    #[error("rank {rank}, step {step}: {call} failed: {source}")]
    Collective {
        /// Rank.
        rank: u32,
        /// Step.
        step: u64,
        /// The operation.
        call: &'static str,
        /// The communicator's typed error (its flight recorder has the history).
        #[source]
        source: crate::hccl::HcclError,
    },
    /// The user's workload failed.
    #[error("rank {rank}, step {step}: workload {call} failed: {source}")]
    Workload {
        /// Rank.
        rank: u32,
        /// Step.
        step: u64,
        /// `launch_micro_batch` or `launch_optimizer`.
        call: &'static str,
        /// The workload's error.
        #[source]
        source: WorkloadError,
    },
    /// A micro-batch from the data source is unusable.
    #[error("rank {rank}, step {step}: bad micro-batch: {what}")]
    Data {
        /// Rank.
        rank: u32,
        /// Step.
        step: u64,
        /// What is wrong.
        what: String,
    },
    /// A rank's row of the gathered count matrix could not be encoded or decoded (a scheduler
    /// bug or a corrupted collective: every rank fills only its own row).
    #[error("rank {rank}, step {step}: count row of rank {row}: {source}")]
    Counts {
        /// Rank reporting the error.
        rank: u32,
        /// Step.
        step: u64,
        /// The rank whose row is bad.
        row: u32,
        /// What is wrong with the row.
        #[source]
        source: CountRowError,
    },
    /// An invalid configuration field.
    #[error("invalid scheduler configuration: {what} = {value}")]
    Config {
        /// The field.
        what: &'static str,
        /// Its value and the rule.
        value: String,
    },
    /// The threshold re-tuner rejected the step's latency matrix.
    #[error(transparent)]
    Retune(#[from] crate::tune::retune::RetuneError),
}
