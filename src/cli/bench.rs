//! `dropcompute bench ...`: benchmarks that print ratios measured in one run against a named
//! baseline (never timed assertions in tests).

use clap::{Args, Subcommand};

use dropcompute::bench::kernels::{KernelBenchOptions, run_kernel_bench};
use dropcompute::sim::montecarlo::bench_simulator;

use super::CliError;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// f32 / bf16 scale-accumulate throughput in GB/s next to a plain memcpy of the same bytes
    /// (target: >= 0.7 of memcpy bandwidth beyond the last-level cache).
    Kernels(KernelArgs),
    /// Simulated micro-batches per second on one thread and on all cores (target >= 20 million/s
    /// on all cores).
    Sim(SimArgs),
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// World size simulated.
    #[arg(long, default_value_t = 10_000)]
    pub workers: u32,
    /// Steps simulated.
    #[arg(long, default_value_t = 1_000)]
    pub steps: u64,
}

#[derive(Debug, Args)]
pub struct KernelArgs {
    /// Interleaved repetitions per size (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
}

pub fn run(cmd: BenchCommand) -> Result<(), CliError> {
    match cmd {
        BenchCommand::Kernels(a) => {
            let opts = KernelBenchOptions { reps: a.reps.max(1), ..KernelBenchOptions::default() };
            let report = run_kernel_bench(&opts);
            println!("{report}");
            Ok(())
        }
        BenchCommand::Sim(a) => {
            let one = bench_simulator(a.workers, a.steps, 1)?;
            let all = bench_simulator(a.workers, a.steps, 0)?;
            println!("{one}");
            println!("{all}");
            println!(
                "parallel speedup: {:.2}x; target >= 20 million micro-batches/s on all cores: {}",
                all.micro_batches_per_second / one.micro_batches_per_second,
                if all.micro_batches_per_second >= 20e6 { "met" } else { "NOT met" }
            );
            Ok(())
        }
    }
}
