//! `dropcompute bench ...`: benchmarks that print ratios measured in one run against a named
//! baseline (never timed assertions in tests).

use clap::{Args, Subcommand};

use dropcompute::bench::allreduce::{
    AllreduceOptions, AllreduceReport, AllreduceRow, CHILD_PROGRAM, join_and_measure, run_threads, sizes_between,
};
#[cfg(feature = "mock")]
use dropcompute::bench::kernels::{KernelBenchOptions, run_kernel_bench};
use dropcompute::hccl::Comm;
#[cfg(feature = "mock")]
use dropcompute::launch::ChildSpec;
use dropcompute::launch::{self, Join, Launch};
#[cfg(feature = "mock")]
use dropcompute::mock::{MockConfig, MockControl};
use dropcompute::sim::montecarlo::bench_simulator;
use dropcompute::synapse::Runtime;
#[cfg(feature = "mock")]
use dropcompute::synapse::{Backend, BackendChoice};

use super::CliError;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// f32 / bf16 scale-accumulate throughput in GB/s next to a plain memcpy of the same bytes
    /// (target: >= 0.7 of memcpy bandwidth beyond the last-level cache).
    #[cfg(feature = "mock")]
    Kernels(KernelArgs),
    /// All-reduce bandwidth table (size, count, dtype, time, algbw, busbw), nccl-tests style, with
    /// ranks as threads of this process or as separate processes on loopback.
    Allreduce(AllreduceArgs),
    /// Simulated micro-batches per second on one thread and on all cores (target >= 20 million/s
    /// on all cores).
    Sim(SimArgs),
    /// Host-side scheduler overhead per micro-batch (decision + bookkeeping) next to the bare
    /// runtime calls and one empty launch, on the in-process mock (target <= 2 us).
    #[cfg(feature = "mock")]
    Scheduler(SchedulerArgs),
}

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 15)]
    pub reps: usize,
}

#[derive(Debug, Args)]
pub struct AllreduceArgs {
    /// World size.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub ranks: u32,
    /// threads (one process, a device per thread), processes (one CPU-mock process per rank on
    /// loopback), or env (this process is one rank of a job started by mpirun, Slurm or torchrun;
    /// rank 0 prints the table).
    #[arg(long, value_enum, default_value_t = Launch::Threads)]
    pub launch: Launch,
    /// Element type.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
    /// Smallest message, bytes per rank.
    #[arg(long, default_value_t = 4 << 10)]
    pub min_bytes: usize,
    /// Largest message, bytes per rank.
    #[arg(long, default_value_t = 256 << 20)]
    pub max_bytes: usize,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    #[command(flatten)]
    pub backend: super::BackendArgs,
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
        #[cfg(feature = "mock")]
        BenchCommand::Kernels(a) => {
            let opts = KernelBenchOptions { reps: a.reps.max(1), ..KernelBenchOptions::default() };
            let report = run_kernel_bench(&opts);
            println!("{report}");
            Ok(())
        }
        BenchCommand::Allreduce(a) => allreduce(&a),
        #[cfg(feature = "mock")]
        BenchCommand::Scheduler(a) => {
            println!("{}", dropcompute::bench::scheduler::run_scheduler_bench(a.reps)?);
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

fn allreduce(a: &AllreduceArgs) -> Result<(), CliError> {
    if a.min_bytes == 0 || a.min_bytes > a.max_bytes {
        return Err(format!("--min-bytes {} / --max-bytes {}: need 0 < min <= max", a.min_bytes, a.max_bytes).into());
    }
    let opts = AllreduceOptions {
        sizes: sizes_between(a.min_bytes, a.max_bytes),
        iters: a.iters.max(1),
        warmup: 1,
        dtype: a.dtype.clone(),
    };
    let backend = a.backend.select()?;
    #[cfg(feature = "mock")]
    if backend.is_mock() && a.ranks > 8 && a.launch == Launch::Threads {
        let cfg = MockConfig { devices: a.ranks, ..MockConfig::from_env()? };
        MockControl::in_process().configure(&cfg)?;
    }
    if a.launch == Launch::Processes && !backend.is_mock() {
        return Err("--launch processes spawns CPU-mock ranks; on Gaudi run one process per device under \
                    mpirun/torchrun instead"
            .into());
    }
    let rt = Runtime::new(backend.api.clone())?;
    let report = match a.launch {
        Launch::Threads => run_threads(&rt, a.ranks, &opts)?,
        Launch::Env => {
            let boot = dropcompute::hccl::bootstrap::Bootstrap::from_env()?;
            let rows = join_and_measure(&rt, &Join::Env(boot.clone()), &opts)?;
            if boot.rank != 0 {
                return Ok(());
            }
            AllreduceReport { mode: format!("{:?}, one process per rank", boot.launcher), ranks: boot.world_size, rows }
        }
        Launch::Processes => {
            // The coordinator behind the unique id lives in this process, which waits for the
            // children; each child runs its own mock device.
            let id = Comm::unique_id(&rt)?;
            let results = launch::processes::<_, Vec<AllreduceRow>>(CHILD_PROGRAM, a.ranks, &id, &opts)?;
            let mut rows = None;
            for r in results {
                rows.get_or_insert(r?);
            }
            AllreduceReport { mode: "processes".into(), ranks: a.ranks, rows: rows.unwrap_or_default() }
        }
    };
    println!("{report}");
    Ok(())
}

/// One rank process of `bench allreduce --launch processes` (see `dropcompute::launch`): joins
/// the parent's communicator on its own CPU mock and writes its rows as the result.
#[cfg(feature = "mock")]
pub fn allreduce_child(spec: &ChildSpec) -> Result<(), CliError> {
    let opts: AllreduceOptions = spec.config()?;
    let rt = Runtime::new(Backend::select(&BackendChoice::Mock)?.api)?;
    let rows = join_and_measure(&rt, &spec.join()?, &opts)?;
    spec.write_result(&rows)?;
    Ok(())
}
