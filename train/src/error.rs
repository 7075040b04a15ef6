//! Why `train` stopped: [`TrainError`], the one error type of every `train` module.
//!
//! Owns: the error enum and its messages (each names the rank, file, flag or call involved).
//! Must not touch: anything else; this file imports no other `train` module except the leaf
//! error types it wraps (`args`, `data`, `mlp`, `output`, `report`, `figure`), so every module
//! can return it without an import cycle.
#![forbid(unsafe_code)]

use dropcompute::hccl::HcclError;
use dropcompute::schedule::ScheduleError;

use super::data::DataError;
use super::mlp::MlpError;

/// Everything that can stop `train`. Each names the rank, file, flag or call involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A bad command-line value.
    #[error(transparent)]
    Args(#[from] super::config::ArgError),
    /// The data file.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Writing standard output failed (`dropcompute::console`).
    #[error("{0}")]
    Stream(#[from] dropcompute::console::StreamError),
    /// The model shape does not fit the data.
    #[error("model: {0}")]
    Model(#[from] MlpError),
    /// More ranks than mock devices, or another impossible combination.
    #[error("{what}: {value}")]
    Config {
        /// The setting.
        what: &'static str,
        /// Its value and the rule.
        value: String,
    },
    /// Configuring the mock device failed.
    #[error("mock device configuration: {0}")]
    Mock(#[from] dropcompute::mock::MockControlError),
    /// A device call outside the step (acquire, allocation, copies).
    #[error("rank {rank}: {source}")]
    Device {
        /// Rank.
        rank: u32,
        /// The runtime's error.
        #[source]
        source: dropcompute::synapse::Error,
    },
    /// A collective outside the step (communicator init, loss all-reduce).
    #[error("rank {rank}: {call}: {source}")]
    Collective {
        /// Rank.
        rank: u32,
        /// The call.
        call: &'static str,
        /// The typed collective error.
        #[source]
        source: HcclError,
    },
    /// A training step failed.
    #[error(transparent)]
    Step(#[from] ScheduleError),
    /// Launcher environment (`--launch env`).
    #[error(transparent)]
    Bootstrap(#[from] dropcompute::hccl::bootstrap::ConfigError),
    /// A rank process of `--launch processes` failed.
    #[error("rank {rank} process: {why}")]
    Child {
        /// Rank.
        rank: u32,
        /// Its exit code (None: killed by a signal, or it exited 0 without a readable result).
        code: Option<i32>,
        /// Exit status and the tail of its stderr.
        why: String,
    },
    /// Outputs (`--out`).
    #[error(transparent)]
    Output(#[from] super::output::OutputError),
    /// A parameters file (`--init-params`) cannot be read or holds another model.
    #[error(transparent)]
    Params(#[from] super::params::ParamsError),
    /// Report assembly.
    #[error(transparent)]
    Report(#[from] super::report::ReportError),
    /// The figure.
    #[error(transparent)]
    Figure(#[from] super::figure::FigureError),
    /// File I/O outside `--out` (child result files, process spawning).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A bad environment variable (`dropcompute::environment`).
    #[error(transparent)]
    Env(#[from] dropcompute::environment::EnvError),
    /// More ranks on this host than devices (`dropcompute::launch::check_devices`), refused
    /// before any rank starts.
    #[error(transparent)]
    Infeasible(#[from] dropcompute::launch::Infeasible),
    /// A checkpoint could not be written or read (file and reason).
    #[error(transparent)]
    Checkpoint(#[from] dropcompute::checkpoint::CheckpointError),
    /// A stop signal (`dropcompute::signals`): every rank stopped after the same step and saved a
    /// checkpoint (SIGINT, SIGTERM; SIGHUP only when checkpointing was asked for).
    #[error("interrupted: stopped after step {step} ({signal}); {saved}")]
    Interrupted {
        /// Steps completed.
        step: u64,
        /// The signal this rank received (`SIGTERM`...), or `a peer's stop request`.
        signal: String,
        /// Where the checkpoint went (or why there is none).
        saved: String,
    },
    /// `--resume` of a checkpoint directory written by another world size.
    #[error(
        "--resume {}: the checkpoint was written with world size {checkpoint}, this run has world \
         size {run} (--ranks, or the launcher's world size, must equal the checkpoint's)",
        dir.display()
    )]
    WorldSizeMismatch {
        /// The checkpoint directory.
        dir: std::path::PathBuf,
        /// World size of the run that wrote it.
        checkpoint: u32,
        /// World size of this run.
        run: u32,
    },
    /// The text task (`--task text`): its corpus, split, plan or model (`rank` `None` while
    /// the job is prepared), or one rank's device work on the transformer.
    #[error("{}{source}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default())]
    Text {
        /// The rank, when one rank's device work failed.
        rank: Option<u32>,
        /// What failed.
        #[source]
        source: Box<super::transformer_train::TextTrainError>,
    },
    /// The ranks finished with different parameters (a lockstep violation; never expected).
    #[error("ranks diverged: rank {rank}'s final parameters differ from rank 0's")]
    Diverged {
        /// The first differing rank.
        rank: u32,
    },
}

impl From<dropcompute::launch::LaunchError> for TrainError {
    /// A failed rank process keeps its exit code ([`TrainError::Child`]); a panicked rank
    /// thread is a [`TrainError::Config`] naming the rank; spec and I/O problems name the file.
    fn from(e: dropcompute::launch::LaunchError) -> Self {
        use dropcompute::launch::LaunchError as L;
        match e {
            L::Child { rank, code, why } => TrainError::Child { rank, code, why },
            L::Panicked { rank } => TrainError::Config { what: "rank thread", value: format!("rank {rank} panicked") },
            L::Io { what, source } => TrainError::Io { what, source },
            L::Bootstrap(b) => TrainError::Bootstrap(b),
            other => TrainError::Config { what: "rank process", value: other.to_string() },
        }
    }
}
