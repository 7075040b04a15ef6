//! Argument parsing and dispatch for the `dropcompute` binary. Each subcommand lives in its own
//! module; this one only wires them.

mod bench;
pub mod exit;
mod info;
#[cfg(feature = "mock")]
mod train;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use dropcompute::synapse::{Backend, BackendChoice};

/// Errors of the command line, rendered with their causes by `main`.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

/// DropCompute for Intel Gaudi: straggler-robust synchronous data-parallel training.
#[derive(Debug, Parser)]
#[command(name = "dropcompute", version, about)]
pub struct Cli {
    /// More logging (-v debug, -vv trace). Logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the backend in use (CPU mock or Synapse at PATH), its version and devices, and run a
    /// short device self-check (copy round trip, a recipe launch timed by device events).
    Info(info::InfoArgs),
    /// Recommend a threshold from latency traces (our compute log, the DropCompute reference's
    /// compute logs, or What-if traces), with guardrails and per-rank straggler attribution.
    Tune(dropcompute::commands::tune::TuneArgs),
    /// What-if simulation: effective speedup and drop rate vs world size (analytic curve over
    /// Monte Carlo points), as CSV and SVG.
    Simulate(dropcompute::commands::simulate::SimulateArgs),
    /// Benchmarks printing ratios measured in one run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Train an MLP on the handwritten digits (or --data) with N ranks on the CPU mock device:
    /// the synchronous baseline and DropCompute with the same seed, side by side. Needs the
    /// cargo feature `mock` (the model kernels run on the CPU mock until device graphs land).
    #[cfg(feature = "mock")]
    Train(dropcompute::train::args::TrainArgs),
    /// (internal) One rank process of `--launch processes` (`train`, `bench allreduce`): SPEC is
    /// the JSON `dropcompute::launch::ChildSpec` its parent wrote (program, rank, unique id and
    /// the parent's validated configuration).
    #[command(hide = true, name = dropcompute::launch::CHILD_SUBCOMMAND)]
    RankProcess {
        /// The spec file.
        spec: PathBuf,
    },
}

/// Backend options shared by the subcommands that touch a device.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Backend: auto (real libSynapse.so if installed, else the CPU mock), mock, or synapse.
    /// Defaults to $DROPCOMPUTE_BACKEND, else auto.
    #[arg(long, value_parser = ["auto", "mock", "synapse"])]
    pub backend: Option<String>,
    /// Runtime library to load (implies --backend synapse); also $DROPCOMPUTE_SYNAPSE_LIB.
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
}

impl BackendArgs {
    /// Resolves the flags (and environment) into a selected backend.
    pub fn select(&self) -> Result<Backend, CliError> {
        let choice = match (&self.library, self.backend.as_deref()) {
            (Some(p), None | Some("synapse")) => BackendChoice::Synapse(Some(p.clone())),
            (Some(_), Some(other)) => {
                return Err(format!("--library conflicts with --backend {other}").into());
            }
            #[cfg(feature = "mock")]
            (None, Some("mock")) => BackendChoice::Mock,
            #[cfg(not(feature = "mock"))]
            (None, Some("mock")) => {
                return Err("--backend mock: this build has no CPU mock (cargo feature `mock`)".into());
            }
            (None, Some("synapse")) => BackendChoice::Synapse(None),
            (None, Some(_)) => BackendChoice::Auto,
            (None, None) => BackendChoice::from_env()?,
        };
        Ok(Backend::select(&choice)?)
    }
}

/// Installs the tracing subscriber: warnings by default, `-v` debug, `-vv` trace; `RUST_LOG`
/// overrides.
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Info(a) => info::run(&a),
        Command::Tune(a) => Ok(dropcompute::commands::tune::run(&a)?),
        Command::Simulate(a) => Ok(dropcompute::commands::simulate::run(&a)?),
        Command::Bench(b) => bench::run(b),
        #[cfg(feature = "mock")]
        Command::Train(a) => train::run(&a),
        Command::RankProcess { spec } => rank_process(&spec),
    }
}

/// Runs one rank process: dispatches on the spec's program.
fn rank_process(path: &std::path::Path) -> Result<(), CliError> {
    let spec = dropcompute::launch::ChildSpec::read(path)?;
    match spec.program.as_str() {
        #[cfg(feature = "mock")]
        dropcompute::train::run::CHILD_PROGRAM => train::child(&spec),
        #[cfg(feature = "mock")]
        dropcompute::bench::allreduce::CHILD_PROGRAM => bench::allreduce_child(&spec),
        other => Err(format!("{}: unknown rank program {other:?}", path.display()).into()),
    }
}
