//! Argument parsing and dispatch for the `dropcompute` binary: the top-level parser ([`Cli`]),
//! logging setup ([`init_logging`]), dispatch to the library's per-subcommand modules
//! (`dropcompute_cli::commands::{info, train, validate, tune, simulate, bench}`, each with its `Args` and
//! `run`) and the hidden rank-process entry of `--launch processes`. Exit codes per failure
//! class are [`exit`]. Must not touch: flags of a subcommand or what a command does (both live
//! in `dropcompute_cli::commands`).

pub mod exit;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use dropcompute_cli::commands::{self, BoxError};

/// Errors of the command line, rendered with their causes by `main`: the library's typed errors,
/// boxed (classified by [`exit::classify`]).
pub type CliError = BoxError;

/// DropCompute for Intel Gaudi: straggler-robust synchronous data-parallel training.
#[derive(Debug, Parser)]
#[command(name = "dropcompute", version, about)]
pub struct Cli {
    /// More logging (-v debug, -vv trace). Logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the backend in use (CPU mock or Synapse at PATH), its version and devices, and run a
    /// short device self-check (copy round trip, a recipe launch timed by device events).
    Info(commands::info::Args),
    /// Recommend a threshold from latency traces (our compute log, the DropCompute reference's
    /// compute logs, or What-if traces), with guardrails and per-rank straggler attribution.
    Tune(commands::tune::Args),
    /// What-if simulation: effective speedup and drop rate vs world size (analytic curve over
    /// Monte Carlo points), as CSV and SVG.
    Simulate(commands::simulate::Args),
    /// Benchmarks printing ratios measured in one run.
    #[command(subcommand)]
    Bench(commands::bench::Args),
    /// Train an MLP on the handwritten digits (or --data) with N ranks on the CPU mock device:
    /// the synchronous baseline and DropCompute with the same seed, side by side. Needs the
    /// cargo feature `mock` (the model and gradient path are device graphs; the mock emulates
    /// the devices, their latency noise and slow ranks).
    #[cfg(feature = "mock")]
    Train(commands::train::Args),
    /// How close the simulator's predicted step time and effective speedup are to the measured
    /// ones over a grid of short `train` configurations (ranks, micro-batches, check mode, sync
    /// lag, slow rank, seeds): a row per configuration, then the median, p90 and worst error.
    #[cfg(feature = "mock")]
    Validate(commands::validate::Args),
    /// (internal) One rank process of `--launch processes` (`train`, `bench allreduce`): SPEC is
    /// the JSON `dropcompute::launch::ChildSpec` its parent wrote (program, rank, unique id and
    /// the parent's validated configuration).
    #[command(hide = true, name = dropcompute::launch::CHILD_SUBCOMMAND)]
    RankProcess {
        /// The spec file.
        spec: PathBuf,
    },
}

impl Command {
    /// The subcommand's name, for messages (`tune`, `bench`...).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Info(_) => "info",
            Self::Tune(_) => "tune",
            Self::Simulate(_) => "simulate",
            Self::Bench(_) => "bench",
            #[cfg(feature = "mock")]
            Self::Train(_) => "train",
            #[cfg(feature = "mock")]
            Self::Validate(_) => "validate",
            Self::RankProcess { .. } => dropcompute::launch::CHILD_SUBCOMMAND,
        }
    }
}

/// The rank program named in a spec file is not one this build runs.
#[derive(Debug, thiserror::Error)]
#[error("{path}: unknown rank program {program:?}")]
pub struct UnknownProgram {
    /// The spec file.
    pub path: PathBuf,
    /// The program it names.
    pub program: String,
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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| dropcompute::console::Stderr)
        .with_ansi(ansi)
        .try_init();
}

/// The environment table's name of a parsed command (`dropcompute::environment::Subcommand`).
fn subcommand(command: &Command) -> dropcompute::environment::Subcommand {
    use dropcompute::environment::Subcommand as S;
    match command {
        Command::Info(_) => S::Info,
        Command::Tune(_) => S::Tune,
        Command::Simulate(_) => S::Simulate,
        Command::Bench(b) => match b {
            #[cfg(feature = "mock")]
            commands::bench::Args::Kernels(_) => S::BenchKernels,
            commands::bench::Args::Allreduce(_) => S::BenchAllreduce,
            commands::bench::Args::Sim(_) => S::BenchSim,
            #[cfg(feature = "mock")]
            commands::bench::Args::Scheduler(_) => S::BenchScheduler,
            // `bench text-table` runs `train` jobs in threads on the in-process mock, as
            // `validate` does: it reads the variables `validate` reads.
            #[cfg(feature = "mock")]
            commands::bench::Args::TextTable(_) => S::Validate,
        },
        #[cfg(feature = "mock")]
        Command::Train(_) => S::Train,
        #[cfg(feature = "mock")]
        Command::Validate(_) => S::Validate,
        Command::RankProcess { .. } => S::RankProcess,
    }
}

/// Runs the parsed command. Errors: a bad value of an environment variable the command reads
/// ([`dropcompute::environment::EnvError`], exit 2, checked through the one environment table
/// before any device or network call, so every subcommand that reads a variable refuses it
/// alike), then the command's own (see each `commands::*::run`).
pub fn run(cli: Cli) -> Result<(), CliError> {
    // Stop signals are honoured in every phase of every subcommand: `train` stops at a step
    // boundary (its rank processes too: `rank_process`), `bench` at once, the rest within a
    // second (exit 130); `dropcompute::signals::exit_on_stop` is the backstop of all.
    dropcompute::signals::install();
    match &cli.command {
        Command::RankProcess { .. } => {}
        #[cfg(feature = "mock")]
        // The parent of rank processes outlasts its ranks' own backstops, so they report.
        Command::Train(a) => dropcompute::signals::exit_on_stop(
            match a.launch {
                dropcompute::launch::Launch::Processes => 2 * dropcompute::signals::COOPERATIVE_GRACE,
                _ => dropcompute::signals::COOPERATIVE_GRACE,
            },
            "train",
        ),
        // Reads no file that can block: a rank ends at once (a launcher such as mpirun
        // SIGKILLs its ranks about a second after its SIGTERM).
        Command::Bench(_) => dropcompute::signals::exit_on_stop(std::time::Duration::ZERO, "bench"),
        other => dropcompute::signals::exit_on_stop(dropcompute::signals::PROMPT_GRACE, other.name()),
    }
    dropcompute::environment::check(subcommand(&cli.command))?;
    match cli.command {
        Command::Info(a) => commands::info::run(&a),
        Command::Tune(a) => Ok(commands::tune::run(&a)?),
        Command::Simulate(a) => Ok(commands::simulate::run(&a)?),
        Command::Bench(b) => commands::bench::run(&b),
        #[cfg(feature = "mock")]
        Command::Train(a) => Ok(commands::train::run(&a)?),
        #[cfg(feature = "mock")]
        Command::Validate(a) => commands::validate::run(&a),
        Command::RankProcess { spec } => rank_process(&spec),
    }
}

/// The text printed for a failed command: `error: ` and the error, then one `  caused by: `
/// line per source in its chain, except a source whose text the line above already contains
/// (an error that embeds its source's message, as `#[error("...: {source}")]` does, would
/// otherwise print the same text twice).
pub fn error_report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("error: {e}");
    let mut shown = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !shown.contains(&text) {
            out.push_str(&format!("\n  caused by: {text}"));
        }
        shown = text;
        source = s.source();
    }
    out
}

/// Runs one rank process: dispatches on the spec's program.
fn rank_process(path: &std::path::Path) -> Result<(), CliError> {
    let spec = dropcompute::launch::ChildSpec::read(path)?;
    dropcompute::launch::bind_to_parent(&spec);
    let grace = match spec.program.as_str() {
        #[cfg(feature = "mock")]
        dropcompute_train::run::CHILD_PROGRAM => dropcompute::signals::COOPERATIVE_GRACE,
        _ => std::time::Duration::ZERO,
    };
    dropcompute::signals::exit_on_stop(grace, "a rank process");
    match spec.program.as_str() {
        #[cfg(feature = "mock")]
        dropcompute_train::run::CHILD_PROGRAM => Ok(commands::train::child(&spec)?),
        #[cfg(feature = "mock")]
        dropcompute_cli::bench::allreduce::CHILD_PROGRAM => commands::bench::allreduce_child(&spec),
        other => Err(UnknownProgram { path: path.to_path_buf(), program: other.to_owned() }.into()),
    }
}

#[cfg(test)]
mod tests {
    /// An error whose message embeds its source's (or not), for [`super::error_report`].
    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: String,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layer(text: &str, source: Option<Layer>) -> Layer {
        Layer { text: text.into(), source: source.map(Box::new) }
    }

    #[test]
    fn error_report_prints_each_distinct_cause_once() {
        let io = layer("No such file or directory (os error 2)", None);
        let embedding = layer("reading /x/y.csv: No such file or directory (os error 2)", Some(io));
        let top = layer("loading the trace", Some(embedding));
        assert_eq!(
            super::error_report(&top),
            "error: loading the trace\n  caused by: reading /x/y.csv: No such file or directory (os error 2)"
        );
        let plain = layer("outer", Some(layer("inner", Some(layer("root", None)))));
        assert_eq!(super::error_report(&plain), "error: outer\n  caused by: inner\n  caused by: root");
    }

    use clap::Parser;

    use super::Cli;

    /// Parses `argv` after the program name; the clap error on rejection.
    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["dropcompute"].iter().chain(argv))
    }

    /// A bad `--noise` is a usage error (exit 2) naming the flag and the value, for every
    /// command that takes it; the removed `--delay-factor` is refused the same way.
    #[test]
    fn bad_noise_exits_2_naming_the_value() {
        let cases: &[(&[&str], &str)] = &[
            (&["simulate", "--noise", "gaussian:1"], "gaussian:1"),
            #[cfg(feature = "mock")]
            (&["train", "--noise", "reference:-1"], "reference:-1"),
            #[cfg(feature = "mock")]
            (&["train", "--noise", "lognormal:9"], "lognormal:9"),
            #[cfg(feature = "mock")]
            (&["train", "--delay-factor", "2"], "--delay-factor"),
        ];
        for &(argv, named) in cases {
            let e = parse(argv).expect_err(&format!("{argv:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{argv:?}");
            let msg = e.to_string();
            assert!(msg.contains(named), "{argv:?}: {msg}");
        }
    }

    /// `bench allreduce --launch` takes `launch::Launch`'s names.
    #[test]
    fn bench_allreduce_launch_is_the_core_launch_type() {
        use dropcompute::launch::Launch;
        use dropcompute_cli::commands::bench::Args;
        for (name, want) in [("threads", Launch::Threads), ("processes", Launch::Processes), ("env", Launch::Env)] {
            let cli = parse(&["bench", "allreduce", "--launch", name]).expect("parses");
            let super::Command::Bench(Args::Allreduce(a)) = cli.command else { panic!("not bench allreduce") };
            assert_eq!(a.launch, want);
        }
        assert_eq!(parse(&["bench", "allreduce", "--launch", "mpi"]).expect_err("mpi").exit_code(), 2);
    }
}
