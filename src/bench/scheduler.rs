//! `dropcompute bench scheduler`: the host-side cost the step scheduler adds per micro-batch
//! (deadline decision, bookkeeping, event reads) on top of the runtime calls a micro-batch needs
//! anyway, next to the cost of one empty recipe launch through the function table, measured in
//! the same run on the in-process mock (virtual time, a kernel that does nothing).
//!
//! Owns: the measurement and its report. Must not: assert on timings.
//!
//! Method: one rank (world size 1), threshold far away (decisions are evaluated but never
//! stop), sync lag M-1 so the host never waits inside the micro-batch loop. The scheduler's
//! host time per micro-batch is `StepReport::host_loop_ns / M` (the loop only: device
//! execution, the collective and the optimizer are outside it). The bare loop issues exactly the
//! runtime calls of a scheduled micro-batch (2 event records, the forward launch, the
//! accumulate launch) and nothing else. Overhead = scheduler - bare, per repetition; medians
//! over repetitions. Both loops launch JSON mock recipes (`mock_recipes::load`, a `noop`
//! forward and `mock_recipes::gradient_ops`), a test tool kept here on purpose: an empty kernel isolates
//! the scheduler's host cost from any graph's work. `train` and the scheduler's product path
//! launch graphs only.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dropcompute::hccl::{Comm, CommOptions};
use dropcompute::mock::{MockConfig, MockControl, MockRecipe, TimeMode};
use dropcompute::mock_recipes;
use dropcompute::policy::{CheckMode, DeadlineConfig, Threshold};
use dropcompute::schedule::{
    DataSource, GradDtype, GradientScratch, MicroBatch, Scheduler, SchedulerConfig, Workload, WorkloadError,
};
use dropcompute::synapse::graph::{DType, GraphArg, GraphBuilder, Op};
use dropcompute::synapse::{Device, DeviceBuffer, Event, LaunchTensor, Recipe, Runtime, Stream};

/// The target of the scheduler issue: overhead per micro-batch <= 2 µs.
pub const TARGET_US: f64 = 2.0;
/// Boxed error of the benchmark (mock, runtime, collective or scheduler).
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// Micro-batches per step.
const M: u32 = 64;
const GRAD_LEN: usize = 16;

/// Result of the benchmark (all µs per micro-batch unless stated).
#[derive(Debug, Clone)]
pub struct SchedulerBenchReport {
    /// Repetitions (medians are over these).
    pub reps: usize,
    /// Median host time per scheduled micro-batch inside `Scheduler::step`.
    pub scheduler_us: f64,
    /// Median host time per micro-batch of the bare runtime calls.
    pub bare_us: f64,
    /// Median of the per-repetition differences scheduler - bare: the scheduler's overhead.
    pub overhead_us: f64,
    /// Median cost of one empty recipe launch (`synLaunchWithExternalEventsExt`, noop kernel).
    pub empty_launch_us: f64,
    /// Median host cost of one launch of a compiled one-node device graph (`relu_fwd_f32` on
    /// 16 elements, `GraphRecipe::launch` with its checks), same run.
    pub graph_launch_us: f64,
}

impl fmt::Display for SchedulerBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scheduler host cost per micro-batch (in-process mock, noop kernel, medians of {} reps)",
            self.reps
        )?;
        writeln!(f, "  scheduler step loop   {:>8.3} us", self.scheduler_us)?;
        writeln!(f, "  bare runtime calls    {:>8.3} us  (2 event records, 2 launches)", self.bare_us)?;
        writeln!(f, "  one empty launch      {:>8.3} us", self.empty_launch_us)?;
        writeln!(
            f,
            "  one-node graph launch {:>8.3} us  ({:.2}x the empty launch; target <= {TARGET_US} us: {})",
            self.graph_launch_us,
            self.graph_launch_us / self.empty_launch_us.max(1e-9),
            if self.graph_launch_us <= TARGET_US { "met" } else { "NOT met" }
        )?;
        write!(
            f,
            "overhead {:.3} us per micro-batch (target <= {TARGET_US} us: {})",
            self.overhead_us,
            if self.overhead_us <= TARGET_US { "met" } else { "NOT met" }
        )
    }
}

struct Noop {
    recipe: Recipe,
    id: u64,
}

impl Workload for Noop {
    fn launch_micro_batch(
        &mut self,
        s: &Stream,
        _step: u64,
        _index: u32,
        _mb: &MicroBatch,
        grad: &mut GradientScratch,
    ) -> Result<(), WorkloadError> {
        let g = grad.as_f32_mut().ok_or("f32 scratch expected")?;
        Ok(s.launch(&self.recipe, &[LaunchTensor::by_id(self.id, g)], None, &[])?)
    }

    fn launch_optimizer(&mut self, _s: &Stream, _step: u64, _g: &DeviceBuffer<f32>) -> Result<(), WorkloadError> {
        Ok(())
    }
}

struct Repeat;

impl DataSource for Repeat {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        Some(MicroBatch::new(vec![0]))
    }
    fn requeue(&mut self, _dropped: Vec<MicroBatch>) {}
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Host µs per micro-batch of the scheduler's loop in one step.
fn time_step(s: &mut Scheduler, step: u64, w: &mut Noop) -> Result<f64, BenchError> {
    let (rep, _) = s.step(step, &mut Repeat, w)?;
    Ok(rep.host_loop_ns as f64 / 1e3 / f64::from(s.config().micro_batches))
}

/// Runs the benchmark with `reps` repetitions (>= 1). Configures the in-process mock (1 module,
/// virtual time), so it must run before any other mock device use in the process.
///
/// # Errors
/// Any mock, runtime, collective or scheduler error, boxed.
pub fn run_scheduler_bench(reps: usize) -> Result<SchedulerBenchReport, BenchError> {
    let reps = reps.max(3);
    MockControl::in_process().configure(&MockConfig {
        devices: 1,
        time_mode: TimeMode::Virtual,
        ..Default::default()
    })?;
    let rt = Runtime::new(dropcompute::mock::api())?;
    let dev = Device::acquire(&rt, 0)?;
    let id = Comm::unique_id(&rt)?;
    let comm = Comm::init_rank(&dev, 1, &id, 0, CommOptions::default())?;
    let recipe = mock_recipes::load(&rt, MockRecipe::new("bench_noop", "noop").tensor("x", (GRAD_LEN * 4) as u64))?;
    let rid = recipe.tensor_ids(&["x"])?[0];
    let mut work = Noop { recipe, id: rid };
    let mk = |m: u32| SchedulerConfig {
        micro_batches: m,
        sync_lag: m - 1,
        gradient_len: GRAD_LEN,
        policy: DeadlineConfig {
            threshold: Threshold::Fixed(Duration::from_secs(3600)),
            check: CheckMode::Predictive,
            warmup_steps: 0,
            min_micro_batches: 1,
        },
        ..SchedulerConfig::default()
    };
    let ops = |rt: &Arc<Runtime>| mock_recipes::gradient_ops(rt, GRAD_LEN, GradDtype::F32);
    let mut sched_s = Scheduler::new(comm, mk(M), ops(&rt)?)?;
    // Bare loop resources.
    let stream = Stream::new(&dev)?;
    let bare_ops = ops(&rt)?;
    let acc = DeviceBuffer::<f32>::alloc(&dev, GRAD_LEN)?;
    let mut scratch = GradientScratch::F32(DeviceBuffer::alloc(&dev, GRAD_LEN)?);
    let events: Vec<(Event, Event)> = (0..M)
        .map(|_| Ok((Event::new(&dev, true)?, Event::new(&dev, true)?)))
        .collect::<dropcompute::synapse::Result<_>>()?;
    let mb = MicroBatch::new(vec![0]);
    let mut g = GraphBuilder::new(&rt, dev.info()?.device_type)?;
    let gx = g.persistent("x", DType::F32, &[GRAD_LEN as u64])?;
    let gy = g.persistent("y", DType::F32, &[GRAD_LEN as u64])?;
    g.node("relu", &Op::Relu, &[gx], &[gy])?;
    let graph = g.compile("bench_relu")?;
    let (bx, by) = (DeviceBuffer::<f32>::alloc(&dev, GRAD_LEN)?, DeviceBuffer::<f32>::alloc(&dev, GRAD_LEN)?);
    let (mut sched, mut bare_v, mut over, mut empty, mut graph_v) = (vec![], vec![], vec![], vec![], vec![]);
    // One warm-up round, then `reps` measured ones.
    for rep in 0..=reps {
        let s_us = time_step(&mut sched_s, rep as u64, &mut work)?;
        sched_s.stream().synchronize()?;
        let t = Instant::now();
        for (a, b) in &events {
            a.record(&stream)?;
            work.launch_micro_batch(&stream, 0, 0, &mb, &mut scratch)?;
            bare_ops.accumulate(&stream, &acc, &scratch)?;
            b.record(&stream)?;
        }
        let b_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(M);
        stream.synchronize()?;
        let t = Instant::now();
        for _ in 0..M {
            work.launch_micro_batch(&stream, 0, 0, &mb, &mut scratch)?;
        }
        let e_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(M);
        stream.synchronize()?;
        let t = Instant::now();
        for _ in 0..M {
            graph.launch(&stream, &[GraphArg::new(gx, &bx), GraphArg::new(gy, &by)], None, &[])?;
        }
        let g_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(M);
        stream.synchronize()?;
        if rep > 0 {
            sched.push(s_us);
            bare_v.push(b_us);
            over.push(s_us - b_us);
            empty.push(e_us);
            graph_v.push(g_us);
        }
    }
    Ok(SchedulerBenchReport {
        reps,
        scheduler_us: median(sched),
        bare_us: median(bare_v),
        overhead_us: median(over),
        empty_launch_us: median(empty),
        graph_launch_us: median(graph_v),
    })
}
