//! `dropcompute bench ...`: benchmarks that print ratios measured in one run against a named
//! baseline (never timed assertions in tests).

use clap::{Args, Subcommand};

use std::time::Duration;

use dropcompute::bench::allreduce::{
    AllreduceOptions, AllreduceReport, join_and_measure, measure_rank, run_threads, sizes_between,
};
#[cfg(feature = "mock")]
use dropcompute::bench::kernels::{KernelBenchOptions, run_kernel_bench};
use dropcompute::hccl::CommOptions;
use dropcompute::hccl::bootstrap::Bootstrap;
use dropcompute::hccl::{Comm, UniqueId};
#[cfg(feature = "mock")]
use dropcompute::mock::{MockConfig, MockControl};
use dropcompute::sim::montecarlo::bench_simulator;
use dropcompute::synapse::{Backend, BackendChoice, Device, Runtime, Stream};

use super::CliError;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// f32 / bf16 scale-accumulate throughput in GB/s next to a plain memcpy of the same bytes
    /// (target: >= 0.7 of memcpy bandwidth beyond the last-level cache). Needs the mock.
    #[cfg(feature = "mock")]
    Kernels(KernelArgs),
    /// All-reduce bandwidth table (size, count, dtype, time, algbw, busbw), nccl-tests style, with
    /// ranks as threads of this process or as separate processes on loopback.
    Allreduce(AllreduceArgs),
    /// (internal) one rank of `bench allreduce --launch processes`.
    #[command(hide = true)]
    AllreduceChild(AllreduceChildArgs),
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
    #[arg(long, default_value = "threads", value_parser = ["threads", "processes", "env"])]
    pub launch: String,
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
pub struct AllreduceChildArgs {
    /// This rank.
    #[arg(long)]
    pub rank: u32,
    /// World size.
    #[arg(long)]
    pub ranks: u32,
    /// Unique id, in its hex text form (`UniqueId`'s `Display`; parsed in the command, as a
    /// 1 KiB `UniqueId` field would bloat the command enum).
    #[arg(long)]
    pub id: String,
    /// Options, JSON.
    #[arg(long)]
    pub opts: String,
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
        BenchCommand::AllreduceChild(a) => allreduce_child(&a),
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
    if backend.is_mock() && a.ranks > 8 && a.launch == "threads" {
        let cfg = MockConfig { devices: a.ranks, ..MockConfig::from_env()? };
        MockControl::in_process().configure(&cfg)?;
    }
    if a.launch == "processes" && !backend.is_mock() {
        return Err("--launch processes spawns CPU-mock ranks; on Gaudi run one process per device under \
                    mpirun/torchrun instead"
            .into());
    }
    let rt = Runtime::new(backend.api.clone())?;
    let report = match a.launch.as_str() {
        "threads" => run_threads(&rt, a.ranks, &opts)?,
        "env" => {
            let boot = Bootstrap::from_env()?;
            let dev = Device::acquire_for_local_rank(&rt, boot.local_rank)?;
            let stream = Stream::new(&dev)?;
            let comm = dropcompute::hccl::join(&dev, &boot, Duration::from_secs(120), CommOptions::default())?;
            let rows = measure_rank(&comm, &stream, &opts)?;
            comm.destroy().map_err(|b| b.0)?;
            if boot.rank != 0 {
                return Ok(());
            }
            AllreduceReport { mode: format!("{:?}, one process per rank", boot.launcher), ranks: boot.world_size, rows }
        }
        _ => {
            // The coordinator behind the unique id lives in this process, which waits for the
            // children; each child runs its own mock device.
            let id = Comm::unique_id(&rt)?;
            let exe = std::env::current_exe()?;
            let opts_json = serde_json::to_string(&opts)?;
            let children: Vec<_> = (0..a.ranks)
                .map(|rank| {
                    std::process::Command::new(&exe)
                        .args([
                            "bench",
                            "allreduce-child",
                            "--rank",
                            &rank.to_string(),
                            "--ranks",
                            &a.ranks.to_string(),
                        ])
                        .args(["--id", &id.to_string(), "--opts", &opts_json])
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                })
                .collect::<Result<_, _>>()?;
            let mut rows = None;
            for (rank, child) in children.into_iter().enumerate() {
                let out = child.wait_with_output()?;
                if !out.status.success() {
                    return Err(format!("rank {rank} process failed: {}", out.status).into());
                }
                if rank == 0 {
                    rows = Some(serde_json::from_slice(&out.stdout)?);
                }
            }
            AllreduceReport { mode: "processes".into(), ranks: a.ranks, rows: rows.unwrap_or_default() }
        }
    };
    println!("{report}");
    Ok(())
}

fn allreduce_child(a: &AllreduceChildArgs) -> Result<(), CliError> {
    let opts: AllreduceOptions = serde_json::from_str(&a.opts)?;
    let id: UniqueId = a.id.parse().map_err(|e| format!("--id {:?}: {e}", a.id))?;
    #[cfg(feature = "mock")]
    let rt = Runtime::new(Backend::select(&BackendChoice::Mock)?.api)?;
    #[cfg(not(feature = "mock"))]
    let rt = Runtime::new(Backend::select(&BackendChoice::Auto)?.api)?;
    let rows = join_and_measure(&rt, &id, a.rank, a.ranks, &opts)?;
    if a.rank == 0 {
        println!("{}", serde_json::to_string(&rows)?);
    }
    Ok(())
}
