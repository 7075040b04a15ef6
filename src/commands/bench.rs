//! `dropcompute bench ...`: benchmarks that print ratios measured in one run against a named
//! baseline (never timed assertions in tests).
//!
//! Owns: [`Args`] (the `bench` subcommands and their flags), [`run`], and the rank-process side
//! of `bench allreduce --launch processes` ([`allreduce_child`]). Must not touch: the
//! measurements themselves (`crate::bench`, `dropcompute::sim::montecarlo::bench_simulator`).
#![forbid(unsafe_code)]

use super::{BackendArgs, BoxError, CommandError};
use crate::bench::allreduce::{
    AllreduceOptions, AllreduceReport, AllreduceRow, BenchOp, CHILD_PROGRAM, join_and_measure, plan_sizes,
};
#[cfg(feature = "mock")]
use crate::bench::kernels::{KernelBenchOptions, run_kernel_bench};
use dropcompute::hccl::Comm;
#[cfg(feature = "mock")]
use dropcompute::launch::ChildSpec;
use dropcompute::launch::{self, Join, Launch, Ranks};
#[cfg(feature = "mock")]
use dropcompute::mock::{MockConfig, MockControl};
use dropcompute::sim::montecarlo::bench_simulator;
use dropcompute::synapse::Runtime;
#[cfg(feature = "mock")]
use dropcompute::synapse::{Backend, BackendChoice};

/// The `bench` subcommands (`kernels` and `scheduler` need the cargo feature `mock`).
#[derive(Debug, clap::Subcommand)]
pub enum Args {
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
    /// The text job's measured policy table (issue 26): for each --ranks, the synchronous
    /// baseline once, then drop-predictive, length-predictive, rebalance, rebalance-drop and
    /// cost-balance against it at --threshold auto (M 8, --noise none, virtual time); speedup
    /// measured and predicted, drop rate, share of the mean-cost bound's gain, held-out loss.
    #[cfg(feature = "mock")]
    TextTable(TextTableArgs),
}

/// Arguments of `bench text-table`.
#[cfg(feature = "mock")]
#[derive(Debug, clap::Args)]
pub struct TextTableArgs {
    /// World sizes, comma-separated: one table each.
    #[arg(long, value_delimiter = ',', default_value = "16,32", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub ranks: Vec<u32>,
    /// Steps of every run.
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// Micro-batches per rank per step M.
    #[arg(long, default_value_t = 8)]
    pub micro_batches: u32,
    /// Seed of every run (the same for the baseline and the policies).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// More `train` flags for every run, after `--` (e.g. `-- --text-model tiny
    /// --text-documents 60`). The flags this command sets (--task, --ranks, --steps,
    /// --micro-batches, --seed, --policy, --threshold, --noise, --time-mode) and those of
    /// `validate`'s refused list (--out, --launch, --compare, --no-compare, --resume) are
    /// refused.
    #[arg(last = true, allow_hyphen_values = true)]
    pub train_args: Vec<String>,
}

#[cfg(feature = "mock")]
impl TextTableArgs {
    /// The `train` argv of `policy`'s run at world size `ranks` (the program name first).
    fn train_argv(&self, ranks: u32, policy: dropcompute::policy::Policy) -> Vec<String> {
        let mut v: Vec<String> =
            ["train", "--task", "text", "--noise", "none", "--time-mode", "virtual"].map(str::to_owned).to_vec();
        for (flag, value) in [
            ("--ranks", ranks.to_string()),
            ("--steps", self.steps.to_string()),
            ("--micro-batches", self.micro_batches.to_string()),
            ("--seed", self.seed.to_string()),
            ("--policy", policy.name().to_owned()),
            ("--threshold", "auto".to_owned()),
        ] {
            v.push(flag.to_owned());
            v.push(value);
        }
        v.extend(self.train_args.iter().cloned());
        v
    }
}

/// The flags `bench text-table` sets itself (refused after `--`).
#[cfg(feature = "mock")]
const TEXT_TABLE_FLAGS: [&str; 9] =
    ["--task", "--ranks", "--steps", "--micro-batches", "--seed", "--policy", "--threshold", "--noise", "--time-mode"];

/// `bench text-table`: one table per `--ranks` value, printed as soon as it is measured.
///
/// # Errors
/// [`CommandError::Args`] for a flag after `--` that the command sets or refuses, or a `train`
/// flag that does not parse or validate (before any run); any `TrainError` of a run.
#[cfg(feature = "mock")]
pub fn text_table(a: &TextTableArgs) -> Result<(), BoxError> {
    let refused = TEXT_TABLE_FLAGS.iter().chain(super::validate::OVERRIDDEN_TRAIN_FLAGS.iter());
    for f in refused {
        if let Some(given) = a.train_args.iter().find(|x| x.as_str() == *f || x.starts_with(&format!("{f}="))) {
            return Err(CommandError::Args(format!(
                "bench text-table: `{given}` after -- is not accepted: the command sets {f} itself (or runs without it)"
            ))
            .into());
        }
    }
    if a.ranks.is_empty() {
        return Err(CommandError::Args("bench text-table: --ranks needs at least one world size".into()).into());
    }
    let config_of = |ranks: u32, p: dropcompute::policy::Policy| {
        let argv = a.train_argv(ranks, p);
        let cli = <super::validate::TrainCli as clap::Parser>::try_parse_from(&argv).map_err(|e| {
            dropcompute_train::error::TrainError::Config {
                what: "bench text-table: train flags",
                value: format!("{:?}: {e}", &argv[1..]),
            }
        })?;
        let mut cfg = cli.train.validate()?;
        cfg.compare = true;
        cfg.out = None;
        Ok::<_, dropcompute_train::error::TrainError>(cfg)
    };
    // Every flag of every run checked before the first run starts.
    for &n in &a.ranks {
        for p in crate::bench::text_table::POLICIES {
            config_of(n, p).map_err(|e| CommandError::Args(e.to_string()))?;
        }
    }
    for &n in &a.ranks {
        let mut done = |label: &str, s: f64| {
            dropcompute::console::err(&format!("bench text-table: N = {n}: {label} ran in {s:.1} s (wall)"));
        };
        let table = crate::bench::text_table::measure(&|p| config_of(n, p), &mut done)?;
        super::say(&format!("{table}\n"))?;
    }
    Ok(())
}

/// Arguments of `bench scheduler`.
#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 15)]
    pub reps: usize,
}

/// Arguments of `bench allreduce`.
#[derive(Debug, clap::Args)]
pub struct AllreduceArgs {
    /// World size (default 4; under `--launch env` the launcher's world size, which an
    /// explicit value must equal).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub ranks: Option<u32>,
    /// threads (one process, a device per thread), processes (one CPU-mock process per rank on
    /// loopback), or env (this process is one rank of a job started by mpirun, Slurm or torchrun;
    /// rank 0 prints the table).
    #[arg(long, value_enum, default_value_t = Launch::Threads)]
    pub launch: Launch,
    /// Element type.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
    /// Smallest message, bytes per rank. Sizes are the powers of four from here to
    /// --max-bytes, each rounded down to what the op moves (one element; one per rank for
    /// all_gather and reduce_scatter); every row lies within --min-bytes..=--max-bytes.
    #[arg(long, default_value_t = 4 << 10)]
    pub min_bytes: usize,
    /// Largest message, bytes per rank (at most [`MAX_BENCH_BYTES`]).
    #[arg(long, default_value_t = 256 << 20)]
    pub max_bytes: usize,
    /// Timed iterations per size and placement.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Untimed warm-up iterations per size and placement.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// The collective: all_reduce, all_gather, reduce_scatter or broadcast (from rank 0).
    #[arg(long, value_enum, default_value_t = BenchOp::AllReduce)]
    pub op: BenchOp,
    /// Backend selection.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Largest `bench allreduce --max-bytes`: 1 GiB per rank. Each rank holds a send and a
/// receive buffer of this size (all_gather: the world size times it), so on the CPU mock
/// with 4 ranks the default ceiling is already 8 GiB of host memory.
pub const MAX_BENCH_BYTES: usize = 1 << 30;

/// World size of `bench allreduce` when `--ranks` is absent (threads and processes).
pub const DEFAULT_BENCH_RANKS: u32 = 4;

/// Arguments of `bench sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// World size simulated.
    #[arg(long, default_value_t = 10_000)]
    pub workers: u32,
    /// Steps simulated.
    #[arg(long, default_value_t = 1_000)]
    pub steps: u64,
}

/// Arguments of `bench kernels`.
#[derive(Debug, clap::Args)]
pub struct KernelArgs {
    /// Interleaved repetitions per size (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Working-set sizes in bytes, comma-separated (default: 64 KiB x 4^k up to 4 x the LLC).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
}

/// Runs one benchmark and prints its table.
///
/// # Errors
/// `bench allreduce`: see [`allreduce`]; `bench sim`: `SimError` for a zero `--workers` or
/// `--steps`; `bench scheduler`: the mock runtime's errors.
pub fn run(cmd: &Args) -> Result<(), BoxError> {
    match cmd {
        #[cfg(feature = "mock")]
        Args::Kernels(a) => {
            if a.sizes.contains(&0) {
                return Err(super::CommandError::Args("--sizes: every size must be at least 1 byte".into()).into());
            }
            let opts =
                KernelBenchOptions { reps: a.reps.max(1), sizes: a.sizes.clone(), ..KernelBenchOptions::default() };
            let report = run_kernel_bench(&opts);
            super::say(&format!("{report}\n"))?;
            Ok(())
        }
        Args::Allreduce(a) => allreduce(a),
        #[cfg(feature = "mock")]
        Args::TextTable(a) => text_table(a),
        #[cfg(feature = "mock")]
        Args::Scheduler(a) => {
            super::say(&format!("{}\n", crate::bench::scheduler::run_scheduler_bench(a.reps)?))?;
            Ok(())
        }
        Args::Sim(a) => {
            let one = bench_simulator(a.workers, a.steps, 1)?;
            let all = bench_simulator(a.workers, a.steps, 0)?;
            super::say(&format!("{one}\n"))?;
            super::say(&format!("{all}\n"))?;
            super::say(&format!(
                "parallel speedup: {:.2}x; target >= 20 million micro-batches/s on all cores: {}\n",
                all.micro_batches_per_second / one.micro_batches_per_second,
                if all.micro_batches_per_second >= 20e6 { "met" } else { "NOT met" }
            ))?;
            Ok(())
        }
    }
}

/// `bench allreduce`: the bandwidth table over message sizes `--min-bytes..=--max-bytes`.
///
/// # Errors
/// [`CommandError::Args`] for `--min-bytes` 0 or above `--max-bytes`, `--max-bytes` above
/// [`MAX_BENCH_BYTES`], an explicit `--ranks` other than the launcher's world size under
/// `--launch env` (naming both and the variable), or `--launch processes` on a backend other
/// than the CPU mock; the mock's `ConfigError` (a bad mock variable); backend selection, runtime, launcher-environment,
/// launch and HCCL errors of the ranks; `launch::Infeasible` for more ranks on this host than
/// devices (before any rank starts).
pub fn allreduce(a: &AllreduceArgs) -> Result<(), BoxError> {
    if a.min_bytes == 0 || a.min_bytes > a.max_bytes {
        return Err(CommandError::Args(format!(
            "--min-bytes {} / --max-bytes {}: need 0 < min <= max",
            a.min_bytes, a.max_bytes
        ))
        .into());
    }
    if a.max_bytes > MAX_BENCH_BYTES {
        return Err(CommandError::Args(format!(
            "--max-bytes {}: must be <= {MAX_BENCH_BYTES} (1 GiB per rank; each rank holds a send and a receive buffer)",
            a.max_bytes
        ))
        .into());
    }
    if a.iters == 0 {
        return Err(CommandError::Args("--iters 0: must be >= 1 (timed iterations per size)".into()).into());
    }
    let ranks_given = a.ranks.is_some();
    let ranks = a.ranks.unwrap_or(DEFAULT_BENCH_RANKS);
    // One size rule for every op (`plan_sizes`), judged here for threads and processes and
    // again by every launcher rank on the launcher's world size.
    let opts = AllreduceOptions {
        sizes: plan_sizes(a.min_bytes, a.max_bytes, a.op, &a.dtype, ranks).map_err(size_error)?,
        iters: a.iters,
        warmup: a.warmup,
        dtype: a.dtype.clone(),
        op: a.op,
    };
    let backend = a.backend.select()?;
    // The mock's environment is checked up front (exit 2 naming the variable), as `train`
    // does, and an emulated device (the in-process mock or the mock library) gets a device
    // per rank of this host unless the user fixed the count (`MockConfig::from_env_for_ranks`).
    #[cfg(feature = "mock")]
    {
        let ranks_here = if a.launch == Launch::Env { 1 } else { ranks };
        let cfg = MockConfig::from_env_for_ranks(ranks_here)?;
        if backend.is_mock() {
            MockControl::in_process().configure(&cfg)?;
        } else if let Some(control) = backend.library_path().and_then(|p| MockControl::from_library(p).ok()) {
            control.configure(&cfg)?;
        }
    }
    let rt = Runtime::new(backend.api.clone())?;
    // Feasibility before any rank starts (`launch::check_devices`, as `train`): threads and
    // processes put every rank on this host; a launcher rank judges its host in `rank`.
    if a.launch != Launch::Env {
        launch::check_devices(&rt, ranks)?;
    }
    let unique_id = || Comm::unique_id(&rt).map_err(BoxError::from);
    // Every rank checks the launcher's world size against an explicit --ranks before joining.
    let stdout_failed = std::sync::Mutex::new(None);
    let rank = |join: &Join| -> Result<Vec<AllreduceRow>, BoxError> {
        if let Join::Env(boot) = join
            && ranks_given
            && ranks != boot.world_size
        {
            return Err(CommandError::Args(format!(
                "--ranks: {} but the launcher's world size is {} ({})",
                ranks,
                boot.world_size,
                boot.world_size_source()
            ))
            .into());
        }
        if let Join::Env(boot) = join {
            launch::check_devices(&rt, boot.local_world_size.unwrap_or(boot.local_rank + 1))?;
        }
        let sized;
        let opts = match join {
            Join::Env(boot) => {
                sized = AllreduceOptions {
                    sizes: plan_sizes(a.min_bytes, a.max_bytes, a.op, &a.dtype, boot.world_size).map_err(size_error)?,
                    ..opts.clone()
                };
                &sized
            }
            Join::UniqueId { .. } => &opts,
        };
        // Rank 0 prints each row as it is measured, through the one stdout writer: a long run
        // shows progress and an interrupted one keeps the rows it printed. A failing stdout
        // never takes rank 0 out of the collectives (its peers would wait for the HCCL
        // timeout): the first error is kept, printing stops, and it is returned at the end.
        if join.rank() != 0 {
            return join_and_measure(&rt, join, opts, &mut |_| Ok(()));
        }
        let print = |text: &str| {
            let mut failed = stdout_failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if failed.is_none()
                && let Err(e) = super::say(text)
            {
                *failed = Some(e);
            }
        };
        print(&AllreduceReport::header(a.op, join.world_size(), &mode_of(join)));
        join_and_measure(&rt, join, opts, &mut |row| {
            print(&AllreduceReport::row_line(row));
            Ok(())
        })
    };
    let (printed, world_size, rows) = match launch::dispatch(a.launch, ranks, unique_id, CHILD_PROGRAM, &opts, rank)? {
        Ranks::All(results) => {
            // A thread rank's collective error follows another rank's failure (as in train).
            let secondary = |e: &BoxError| e.downcast_ref::<dropcompute::hccl::HcclError>().is_some();
            let rows = launch::root_cause(results, secondary)?.into_iter().next().unwrap_or_default();
            // Thread rank 0 printed its rows; rank processes cannot (their stdout is not
            // the terminal's), so their table is printed whole here.
            (a.launch == Launch::Threads, ranks, rows)
        }
        Ranks::This { join, result } => {
            let rows = result?;
            if join.rank() != 0 {
                return Ok(());
            }
            (true, join.world_size(), rows)
        }
    };
    if let Some(e) = stdout_failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        return Err(e.into());
    }
    let mode = if a.launch == Launch::Processes { "processes".to_owned() } else { "threads".to_owned() };
    let report = AllreduceReport { mode, ranks: world_size, op: a.op, rows };
    if printed {
        super::say(&format!("{}\n", report.footer()))?;
    } else {
        super::say(&format!("{report}\n"))?;
    }
    Ok(())
}

/// No size fits the op: a usage error (exit 2) naming the flags.
fn size_error(e: crate::bench::allreduce::NoSizeFits) -> CommandError {
    CommandError::Args(e.to_string())
}

/// How the table names the launch mode of `join`'s job: "threads", or the launcher's name
/// with "one process per rank".
fn mode_of(join: &Join) -> String {
    match join {
        Join::Env(boot) => format!("{:?}, one process per rank", boot.launcher),
        Join::UniqueId { .. } => "threads".to_owned(),
    }
}

/// One rank process of `bench allreduce --launch processes` (see `dropcompute::launch`): joins
/// the parent's communicator on its own CPU mock and writes its rows as the result.
///
/// # Errors
/// The spec's configuration is not `AllreduceOptions` (`launch::LaunchError`), the mock
/// backend cannot start, or joining / measuring fails (HCCL, device errors).
#[cfg(feature = "mock")]
pub fn allreduce_child(spec: &ChildSpec) -> Result<(), BoxError> {
    let opts: AllreduceOptions = spec.config()?;
    let rt = Runtime::new(Backend::select(&BackendChoice::Mock)?.api)?;
    let rows = join_and_measure(&rt, &spec.join()?, &opts, &mut |_| Ok(()))?;
    spec.write_result(&rows)?;
    Ok(())
}
