//! The step scheduler on the mock, ranks as threads, virtual device time (deterministic):
//! normalization against an f64 oracle (proptest), exact deadline decisions for latency
//! scripts in both check modes and several sync lags, warm-up, host-clock independence,
//! lockstep collective ledgers, the drop ledger over an epoch, and the measured overshoot under
//! the reference noise.
#![cfg(feature = "mock")] // runs on the CPU mock device

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use dropcompute::hccl::{Comm, CommOptions};
use dropcompute::mock::{self, DeviceOverride, Fault, MockConfig, MockControl, MockRecipe, Noise, TimeMode};
use dropcompute::mock_recipes;
use dropcompute::policy::rebalance::RankLatencyTracker;
use dropcompute::policy::{CheckMode, DeadlineConfig, RebalanceConfig, Rebalancer, Threshold, backup_aggregated};
use dropcompute::schedule::{
    DataSource, DropHandling, EpochQueue, GradDtype, GradientScratch, MicroBatch, Normalization, Scheduler,
    SchedulerConfig, SharedSource, SkipReason, StepReport, Weighting, Workload, WorkloadError, per_micro_batch_ns,
};
use dropcompute::synapse::{Device, DeviceBuffer, HostBuffer, LaunchTensor, Recipe, Runtime, Stream};
use half::bf16;
use proptest::prelude::*;

const FWD: &str = "test_fwd";
/// The tail shape's forward recipe of [`TestWork`] (launched for micro-batches of at most
/// `TestWork::tail_max_samples` samples).
const FWD_TAIL: &str = "test_fwd_tail";

/// The mock is process-global: tests take turns and reconfigure it.
fn serial(cfg: &MockConfig) -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    let g = L.lock().unwrap_or_else(|p| p.into_inner());
    let ctl = MockControl::in_process();
    ctl.inject_fault(&Fault::ClearAll).unwrap();
    ctl.configure(cfg).unwrap();
    g
}

fn runtime() -> &'static Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(mock::api()).unwrap())
}

/// Virtual time, no noise, `n` modules, the forward recipe of module r scripted with
/// `scripts[r]` (other launches take their base latency).
fn mock_cfg(n: u32, scripts: &[Vec<u64>]) -> MockConfig {
    MockConfig {
        devices: n.max(1),
        time_mode: TimeMode::Virtual,
        per_device: scripts
            .iter()
            .enumerate()
            .map(|(m, s)| DeviceOverride {
                module_id: m as u32,
                slowdown: 1.0,
                noise: None,
                script_ns: s.clone(),
                script_recipe: Some(FWD.into()),
            })
            .collect(),
        ..MockConfig::default()
    }
}

/// Gradient element j contributed by sample s: a small integer, exact in f32 and bf16 sums.
fn g(s: u64, j: usize) -> f64 {
    ((s * 31 + j as u64 * 7) % 17) as f64 - 8.0
}

/// The test model: the forward/backward recipe copies a host-prepared gradient (sum of g over
/// the micro-batch's samples) into the scratch; the optimizer is `params += -1 * grad`.
struct TestWork {
    p: usize,
    dtype: GradDtype,
    fwd: Recipe,
    fwd_tail: Recipe,
    /// Micro-batches of at most this many samples run on `fwd_tail` (0: never).
    tail_max_samples: usize,
    opt: Recipe,
    params: DeviceBuffer<f32>,
    neg_one: DeviceBuffer<f32>,
    input_f32: DeviceBuffer<f32>,
    input_bf16: DeviceBuffer<bf16>,
    keep_f32: Vec<HostBuffer<f32>>,
    keep_bf16: Vec<HostBuffer<bf16>>,
    /// (step, sample ids) launched.
    launched: Vec<(u64, Vec<u64>)>,
    optimizer_calls: Vec<u64>,
    nan_at_step: Option<u64>,
    host_delay: Duration,
}

impl TestWork {
    fn new(rt: &Arc<Runtime>, s: &Stream, p: usize, dtype: GradDtype, base_ns: (u64, u64, u64)) -> Self {
        let (fwd_base_ns, tail_base_ns, opt_base_ns) = base_ns;
        let dev = s.device();
        let xb = match dtype {
            GradDtype::F32 => 4 * p,
            GradDtype::Bf16 => 2 * p,
        } as u64;
        let fwd = mock_recipes::load(
            rt,
            MockRecipe::new(FWD, "copy").tensor("src", xb).tensor("dst", xb).base_latency_ns(fwd_base_ns),
        )
        .unwrap();
        let fwd_tail = mock_recipes::load(
            rt,
            MockRecipe::new(FWD_TAIL, "copy").tensor("src", xb).tensor("dst", xb).base_latency_ns(tail_base_ns),
        )
        .unwrap();
        let opt = MockRecipe::new("test_sgd", "scale_accumulate_f32")
            .tensor("acc", 4 * p as u64)
            .tensor("x", 4 * p as u64)
            .tensor("scale", 4);
        let opt = if opt_base_ns > 0 { opt.base_latency_ns(opt_base_ns) } else { opt };
        let opt = mock_recipes::load(rt, opt).unwrap();
        let mut params = DeviceBuffer::alloc(dev, p).unwrap();
        s.copy_h2d(&HostBuffer::from_slice(dev, &vec![0f32; p]).unwrap(), &mut params).unwrap();
        let mut neg_one = DeviceBuffer::alloc(dev, 1).unwrap();
        s.copy_h2d(&HostBuffer::from_slice(dev, &[-1f32]).unwrap(), &mut neg_one).unwrap();
        s.synchronize().unwrap();
        Self {
            p,
            dtype,
            fwd,
            fwd_tail,
            tail_max_samples: 0,
            opt,
            params,
            neg_one,
            input_f32: DeviceBuffer::alloc(dev, p).unwrap(),
            input_bf16: DeviceBuffer::alloc(dev, p).unwrap(),
            keep_f32: vec![],
            keep_bf16: vec![],
            launched: vec![],
            optimizer_calls: vec![],
            nan_at_step: None,
            host_delay: Duration::ZERO,
        }
    }

    fn params(&self, s: &Stream) -> Vec<f32> {
        let mut h = HostBuffer::zeroed(s.device(), self.p).unwrap();
        s.copy_d2h(&self.params, &mut h).unwrap();
        h.to_vec().unwrap()
    }
}

impl Workload for TestWork {
    fn launch_micro_batch(
        &mut self,
        s: &Stream,
        step: u64,
        _index: u32,
        mb: &MicroBatch,
        grad: &mut GradientScratch,
    ) -> Result<(), WorkloadError> {
        std::thread::sleep(self.host_delay);
        let mut v: Vec<f64> = (0..self.p).map(|j| mb.sample_ids.iter().map(|&s| g(s, j)).sum()).collect();
        if self.nan_at_step == Some(step) {
            v[self.p / 2] = f64::NAN;
        }
        let fwd = if mb.sample_ids.len() <= self.tail_max_samples { &self.fwd_tail } else { &self.fwd };
        let ids = fwd.tensor_ids(&["src", "dst"])?;
        match self.dtype {
            GradDtype::F32 => {
                let h = HostBuffer::from_slice(s.device(), &v.iter().map(|&x| x as f32).collect::<Vec<_>>())?;
                s.copy_h2d(&h, &mut self.input_f32)?;
                self.keep_f32.push(h);
                let out = grad.as_f32_mut().ok_or("scratch is not f32")?;
                s.launch(
                    fwd,
                    &[LaunchTensor::by_id(ids[0], &self.input_f32), LaunchTensor::by_id(ids[1], out)],
                    None,
                    &[],
                )?;
            }
            GradDtype::Bf16 => {
                let h = HostBuffer::from_slice(s.device(), &v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>())?;
                s.copy_h2d(&h, &mut self.input_bf16)?;
                self.keep_bf16.push(h);
                let out = grad.as_bf16_mut().ok_or("scratch is not bf16")?;
                s.launch(
                    fwd,
                    &[LaunchTensor::by_id(ids[0], &self.input_bf16), LaunchTensor::by_id(ids[1], out)],
                    None,
                    &[],
                )?;
            }
        }
        self.launched.push((step, mb.sample_ids.clone()));
        Ok(())
    }

    fn launch_optimizer(&mut self, s: &Stream, step: u64, grad: &DeviceBuffer<f32>) -> Result<(), WorkloadError> {
        let ids = self.opt.tensor_ids(&["acc", "x", "scale"])?;
        s.launch(
            &self.opt,
            &[
                LaunchTensor::by_id(ids[0], &self.params),
                LaunchTensor::by_id(ids[1], grad),
                LaunchTensor::by_id(ids[2], &self.neg_one),
            ],
            None,
            &[],
        )?;
        self.optimizer_calls.push(step);
        Ok(())
    }
}

/// What one rank returns.
struct RankRun {
    reports: Vec<StepReport>,
    launched: Vec<(u64, Vec<u64>)>,
    optimizer_calls: Vec<u64>,
    params: Vec<f32>,
    ledger: Vec<(u64, String, String, usize)>,
    drop_ledger: dropcompute::schedule::DropLedger,
}

struct World {
    n: u32,
    cfg: SchedulerConfig,
    steps: u64,
    fwd_base_ns: u64,
    /// Base latency of the optimizer recipe (0: the mock's default).
    opt_base_ns: u64,
    /// Base latency of the tail recipe, and the samples up to which a micro-batch runs on it.
    tail: (u64, usize),
    /// Per-rank data source factory.
    data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync>,
    nan: Option<(u32, u64)>,
    host_delay: Duration,
    /// Called on every rank's scheduler before the first step (e.g. to set a policy).
    prepare: Option<Prepare>,
}

/// A per-rank setup hook of [`World`].
type Prepare = Box<dyn Fn(&mut Scheduler) + Sync>;

impl World {
    /// `n` ranks, `steps` steps, forward latency from the scripts only, no NaN, no host delay.
    fn new(
        n: u32,
        cfg: SchedulerConfig,
        steps: u64,
        data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync>,
    ) -> Self {
        Self {
            n,
            cfg,
            steps,
            fwd_base_ns: 0,
            opt_base_ns: 0,
            tail: (0, 0),
            data,
            nan: None,
            host_delay: Duration::ZERO,
            prepare: None,
        }
    }
}

fn run(w: &World) -> Vec<RankRun> {
    let rt = runtime();
    let id = Comm::unique_id(rt).unwrap();
    let opts = CommOptions { timeout: Duration::from_secs(30), ..CommOptions::default() };
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..w.n)
            .map(|rank| {
                let opts = opts.clone();
                sc.spawn(move || {
                    let dev = Device::acquire(rt, rank).unwrap();
                    let comm = Comm::init_rank(&dev, w.n, &id, rank, opts).unwrap();
                    let ops = mock_recipes::gradient_ops(rt, w.cfg.gradient_len, w.cfg.grad_dtype).unwrap();
                    let mut sched = Scheduler::new(comm, w.cfg.clone(), ops).unwrap();
                    if let Some(p) = &w.prepare {
                        p(&mut sched);
                    }
                    let mut work = TestWork::new(
                        rt,
                        sched.stream(),
                        w.cfg.gradient_len,
                        w.cfg.grad_dtype,
                        (w.fwd_base_ns, w.tail.0, w.opt_base_ns),
                    );
                    work.tail_max_samples = w.tail.1;
                    work.host_delay = w.host_delay;
                    if let Some((r, s)) = w.nan
                        && r == rank
                    {
                        work.nan_at_step = Some(s);
                    }
                    let mut data = (w.data)(rank);
                    let mut reports = vec![];
                    for step in 0..w.steps {
                        let (rep, _) = sched.step(step, data.as_mut(), &mut work).unwrap();
                        reports.push(rep);
                    }
                    let params = work.params(sched.stream());
                    let ledger = sched
                        .comm()
                        .flight_recorder()
                        .entries()
                        .into_iter()
                        .map(|e| (e.seq, e.op.to_string(), e.dtype.to_string(), e.count))
                        .collect();
                    RankRun {
                        reports,
                        launched: std::mem::take(&mut work.launched),
                        optimizer_calls: work.optimizer_calls.clone(),
                        params,
                        ledger,
                        drop_ledger: sched.ledger().clone(),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn fixed(ns: u64) -> Threshold {
    Threshold::Fixed(Duration::from_nanos(ns))
}

/// A data source handing out `m` micro-batches per step forever: ids `rank * 1e6 + counter`,
/// sizes from `sizes` (cycled), tokens = 3 * samples + rank.
struct Endless {
    rank: u32,
    next: u64,
    sizes: Vec<usize>,
    k: usize,
    back: Vec<MicroBatch>,
}

impl DataSource for Endless {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        if let Some(mb) = self.back.pop() {
            return Some(mb);
        }
        let n = self.sizes[self.k % self.sizes.len()];
        self.k += 1;
        let ids: Vec<u64> = (0..n as u64).map(|i| u64::from(self.rank) * 1_000_000 + self.next + i).collect();
        self.next += n as u64;
        Some(MicroBatch { tokens: Some(3 * n as u64 + u64::from(self.rank)), sample_ids: ids, bucket: None })
    }
    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        self.back.extend(dropped.into_iter().rev());
    }
}

fn endless(sizes: Vec<usize>) -> Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> {
    Box::new(move |rank| Box::new(Endless { rank, next: 0, sizes: sizes.clone(), k: 0, back: vec![] }))
}

fn base_cfg(m: u32, b: u32, p: usize) -> SchedulerConfig {
    SchedulerConfig {
        micro_batches: m,
        micro_batch_size: b,
        gradient_len: p,
        bucket_bytes: 4 * 5, // several buckets even for tiny gradients
        policy: DeadlineConfig {
            threshold: Threshold::Off,
            check: CheckMode::BeforeMicroBatch,
            warmup_steps: 0,
            min_micro_batches: 1,
        },
        ..SchedulerConfig::default()
    }
}

/// The f64 oracle of the parameters after all steps: params = -Σ_step (Σ computed g) / divisor,
/// with divisor = global computed samples (or tokens) for realized, N·M·b for nominal, and a
/// zero global weight skipping the step. Returns (params, divisor per step).
fn oracle(
    runs: &[RankRun],
    cfg: &SchedulerConfig,
    steps: u64,
    tokens_of: impl Fn(u32, usize) -> u64,
) -> (Vec<f64>, Vec<f64>) {
    let p = cfg.gradient_len;
    let n = runs.len() as f64;
    let mut params = vec![0f64; p];
    let mut divisors = vec![];
    for step in 0..steps {
        let mut sum = vec![0f64; p];
        let mut weight = 0u64;
        for (r, run) in runs.iter().enumerate() {
            for (_, ids) in run.launched.iter().filter(|(s, _)| *s == step) {
                for (j, acc) in sum.iter_mut().enumerate() {
                    *acc += ids.iter().map(|&s| g(s, j)).sum::<f64>();
                }
                weight += match cfg.weighting {
                    Weighting::Samples => ids.len() as u64,
                    Weighting::Tokens => tokens_of(r as u32, ids.len()),
                };
            }
        }
        if weight == 0 {
            divisors.push(0.0);
            continue;
        }
        let d = match cfg.normalization {
            Normalization::Realized => weight as f64,
            Normalization::Nominal => n * f64::from(cfg.micro_batches) * f64::from(cfg.micro_batch_size),
        };
        divisors.push(d);
        for (x, s) in params.iter_mut().zip(&sum) {
            *x -= s / d;
        }
    }
    (params, divisors)
}

/// Per-rank constant forward latency making rank r compute exactly `c` micro-batches at a
/// non-warm-up step in predictive mode under threshold `t` (k = 0): L = t / (c + 1/2), or 2t for
/// c = 0 (the estimate alone overshoots).
fn latency_for(c: u32, t: u64) -> u64 {
    if c == 0 { 2 * t } else { (t as f64 / (f64::from(c) + 0.5)) as u64 }
}

fn assert_lockstep(runs: &[RankRun]) {
    for r in runs {
        assert_eq!(r.ledger, runs[0].ledger, "collective ledgers differ between ranks");
    }
    assert!(!runs[0].ledger.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn the_update_equals_the_f64_oracle(
        n in 1u32..=8,
        m in 1u32..=4,
        computed in proptest::collection::vec(0u32..=4, 8),
        sizes in proptest::collection::vec(1usize..=4, 1..6),
        nominal in any::<bool>(),
        tokens in any::<bool>(),
        bf in any::<bool>(),
    ) {
        let t = 1_000_000u64;
        let c: Vec<u32> = computed.iter().take(n as usize).map(|&c| c.min(m)).collect();
        let scripts: Vec<Vec<u64>> = c.iter().map(|&c| vec![latency_for(c, t); 2 * m as usize]).collect();
        let _g = serial(&mock_cfg(n, &scripts));
        let mut cfg = base_cfg(m, 2, 7);
        cfg.policy = DeadlineConfig { threshold: fixed(t), check: CheckMode::Predictive, warmup_steps: 1, min_micro_batches: 0 };
        cfg.normalization = if nominal { Normalization::Nominal } else { Normalization::Realized };
        cfg.weighting = if tokens { Weighting::Tokens } else { Weighting::Samples };
        cfg.grad_dtype = if bf { GradDtype::Bf16 } else { GradDtype::F32 };
        let w = World { fwd_base_ns: 1000, ..World::new(n, cfg.clone(), 2, endless(sizes)) };
        let runs = run(&w);
        let (want, divisors) = oracle(&runs, &cfg, 2, |r, len| 3 * len as u64 + u64::from(r));
        for (r, run) in runs.iter().enumerate() {
            // The designed decisions: everything at the warm-up step, c[r] after it.
            prop_assert_eq!(run.reports[0].ranks[r].computed, m);
            prop_assert_eq!(run.reports[1].ranks[r].computed, c[r]);
            prop_assert_eq!(run.reports[1].ranks[r].dropped, m - c[r]);
            let skipped = run.reports.iter().filter(|rep| rep.skip.is_some()).count();
            prop_assert_eq!(run.optimizer_calls.len(), 2 - skipped, "one optimizer update per non-skipped step");
            for (rep, d) in run.reports.iter().zip(&divisors) {
                prop_assert_eq!(rep.divisor, *d);
                prop_assert_eq!(rep.skip.is_some(), *d == 0.0);
                if *d == 0.0 {
                    prop_assert_eq!(rep.skip.clone(), Some(SkipReason::ZeroCount));
                }
            }
            for (j, (&got, &want)) in run.params.iter().zip(&want).enumerate() {
                prop_assert!((f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0), "rank {r} param {j}: {got} vs {want}");
            }
            prop_assert_eq!(&run.params, &runs[0].params);
        }
        assert_lockstep(&runs);
    }
}

/// Expected computed micro-batches of one rank at a non-warm-up step, from first principles:
/// micro-batch i starts iff the device time known to the host (the end of micro-batch i-1-k,
/// i.e. the sum of the scripted latencies before it) is below the threshold, or, predictive,
/// that time plus the estimate fits.
fn expected_computed(lat: &[u64], t: u64, k: usize, estimate: Option<u64>, min_mb: usize) -> u32 {
    let mut done = 0;
    for i in 0..lat.len() {
        let known: u64 = if i > k { lat[..i - k].iter().sum() } else { 0 };
        let go = i < min_mb || (known < t && estimate.is_none_or(|e| known + e <= t));
        if !go {
            break;
        }
        done += 1;
    }
    done
}

#[test]
fn scripted_latencies_give_the_exact_decisions_for_each_check_mode_and_sync_lag() {
    let m = 6u32;
    let t = 6_500u64;
    let before: [Vec<u64>; 2] = [vec![3000, 1000, 4000, 2000, 1000, 5000], vec![1000; 6]];
    for k in 0..3u32 {
        let _g = serial(&mock_cfg(2, &before));
        let mut cfg = base_cfg(m, 1, 8);
        cfg.sync_lag = k;
        cfg.policy.threshold = fixed(t);
        let w = World::new(2, cfg, 1, endless(vec![1]));
        let runs = run(&w);
        for r in 0..2 {
            let want = expected_computed(&before[r], t, k as usize, None, 1);
            assert_eq!(runs[r].reports[0].ranks[r].computed, want, "before-check, rank {r}, lag {k}");
            assert_eq!(runs[0].reports[0].ranks[r].computed, want, "rank 0's view of rank {r}");
        }
        assert_lockstep(&runs);
    }
    // Hand-derived anchors of the oracle above (rank 0): lag 0 stops after 3000+1000+4000 >= t.
    assert_eq!(expected_computed(&before[0], t, 0, None, 1), 3);
    assert_eq!(expected_computed(&before[0], t, 1, None, 1), 4);
    assert_eq!(expected_computed(&before[0], t, 2, None, 1), 5);

    let lat = [1500u64, 2500];
    let t = 7_000u64;
    for k in 0..3u32 {
        let scripts: Vec<Vec<u64>> = lat.iter().map(|&l| vec![l; 2 * m as usize]).collect();
        let _g = serial(&mock_cfg(2, &scripts));
        let mut cfg = base_cfg(m, 1, 8);
        cfg.sync_lag = k;
        cfg.policy =
            DeadlineConfig { threshold: fixed(t), check: CheckMode::Predictive, warmup_steps: 1, min_micro_batches: 1 };
        let w = World::new(2, cfg, 2, endless(vec![1]));
        let runs = run(&w);
        for r in 0..2 {
            assert_eq!(runs[r].reports[0].ranks[r].computed, m, "warm-up step never drops");
            let want = expected_computed(&vec![lat[r]; m as usize], t, k as usize, Some(lat[r]), 1);
            assert_eq!(runs[r].reports[1].ranks[r].computed, want, "predictive, rank {r}, lag {k}");
        }
    }
    assert_eq!(expected_computed(&[1500; 6], 7000, 0, Some(1500), 1), 4);
}

#[test]
fn warm_up_steps_never_drop_and_the_minimum_is_kept() {
    let _g = serial(&mock_cfg(2, &[vec![1000; 40], vec![1000; 40]]));
    let mut cfg = base_cfg(4, 1, 4);
    cfg.policy = DeadlineConfig {
        threshold: fixed(100),
        check: CheckMode::BeforeMicroBatch,
        warmup_steps: 2,
        min_micro_batches: 2,
    };
    let w = World::new(2, cfg, 4, endless(vec![1]));
    let runs = run(&w);
    for run in &runs {
        let computed: Vec<u32> = run.reports.iter().map(|r| r.ranks[0].computed).collect();
        assert_eq!(computed, vec![4, 4, 2, 2]);
        assert!(run.reports[2].hit_threshold(0));
    }
}

#[test]
fn a_host_clock_jump_changes_nothing() {
    let script = vec![vec![3000, 1000, 4000, 2000, 1000, 5000, 2500, 900, 3000, 1200, 800, 4000]; 2];
    let go = |delay: Duration| {
        let _g = serial(&mock_cfg(2, &script));
        let mut cfg = base_cfg(6, 1, 8);
        cfg.sync_lag = 1;
        cfg.policy.threshold = fixed(6_500);
        let w = World { host_delay: delay, ..World::new(2, cfg, 2, endless(vec![1])) };
        run(&w)
    };
    let a = go(Duration::ZERO);
    let b = go(Duration::from_millis(15));
    for (ra, rb) in a.iter().zip(&b) {
        for (x, y) in ra.reports.iter().zip(&rb.reports) {
            assert_eq!(
                x.ranks.iter().map(|r| (r.computed, r.dropped, r.compute_ns)).collect::<Vec<_>>(),
                y.ranks.iter().map(|r| (r.computed, r.dropped, r.compute_ns)).collect::<Vec<_>>()
            );
            let d = |r: &StepReport| r.micro_batches.iter().map(|m| (m.duration_ns, m.dropped)).collect::<Vec<_>>();
            assert_eq!(d(x), d(y));
        }
        assert_eq!(ra.params, rb.params);
    }
    assert!(a[0].reports.iter().any(|r| r.global_dropped() > 0), "the scenario drops");
}

#[test]
fn lockstep_holds_with_a_rank_that_computes_nothing_and_a_non_finite_gradient() {
    let t = 1_000_000;
    let m = 3u32;
    let c = [3u32, 2, 0, 1];
    let scripts: Vec<Vec<u64>> = c.iter().map(|&c| vec![latency_for(c, t); 3 * m as usize]).collect();
    let _g = serial(&mock_cfg(4, &scripts));
    let mut cfg = base_cfg(m, 1, 9);
    cfg.policy =
        DeadlineConfig { threshold: fixed(t), check: CheckMode::Predictive, warmup_steps: 1, min_micro_batches: 0 };
    let w = World { nan: Some((1, 1)), ..World::new(4, cfg, 3, endless(vec![2])) };
    let runs = run(&w);
    assert_lockstep(&runs);
    for run in &runs {
        assert_eq!(run.reports[1].skip, Some(SkipReason::NonFinite { ranks: vec![1] }));
        assert_eq!(run.reports[1].ranks[2].computed, 0);
        assert_eq!(run.reports[2].skip, None);
        assert_eq!(run.optimizer_calls, vec![0, 2]);
        assert_eq!(run.params, runs[0].params, "state identical on every rank");
    }
    let all_nan = runs.iter().flat_map(|r| r.params.iter()).any(|v| !v.is_finite());
    assert!(!all_nan, "the non-finite gradient never reached the parameters");
}

#[test]
fn over_an_epoch_every_sample_is_computed_exactly_once_when_requeued() {
    let n = 3u32;
    let per_rank = 40u64;
    let scripts: Vec<Vec<u64>> =
        (0..n).map(|r| (0..200u64).map(|i| 1000 + ((i * 7919 + u64::from(r) * 104_729) % 3000)).collect()).collect();
    for handling in [DropHandling::Requeue, DropHandling::Discard] {
        let _g = serial(&mock_cfg(n, &scripts));
        let mut cfg = base_cfg(4, 2, 4);
        cfg.policy.threshold = fixed(5_500);
        cfg.drop_handling = handling;
        let data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> = Box::new(move |r| {
            let ids: Vec<u64> = (0..per_rank).map(|i| u64::from(r) * per_rank + i).collect();
            Box::new(EpochQueue::new(ids, 2))
        });
        let w = World::new(n, cfg, per_rank / 2, data);
        let runs = run(&w);
        let mut computed: Vec<u64> = runs.iter().flat_map(|r| r.drop_ledger.computed.iter().copied()).collect();
        computed.sort_unstable();
        let drops: usize = runs.iter().map(|r| r.drop_ledger.dropped.len()).sum();
        assert!(drops > 0, "the scenario must drop");
        match handling {
            DropHandling::Requeue => {
                assert_eq!(computed, (0..u64::from(n) * per_rank).collect::<Vec<_>>(), "each sample exactly once");
            }
            DropHandling::Discard => {
                let discarded: u64 = runs.iter().map(|r| r.drop_ledger.discarded_samples()).sum();
                computed.dedup();
                assert_eq!(
                    computed.len() as u64,
                    runs.iter().map(|r| r.drop_ledger.computed.len() as u64).sum::<u64>()
                );
                assert!(discarded > 0);
                assert!(computed.len() as u64 + discarded <= u64::from(n) * per_rank);
            }
        }
    }
}

/// Rebalance (+ drop) over a whole epoch of one global stream (`SharedSource`) with rank 2
/// three times slower per micro-batch: every rank reports the same assignment each step, it
/// always sums to N·M (global batch kept), rank 2 gets fewer micro-batches once the tracker
/// calls it chronic (after CHRONIC_MIN_STEPS steps), the divisor is the global computed sample
/// count, and every sample id of the epoch is computed exactly once over all ranks, none lost.
/// The assignments equal what the pure `policy::Rebalancer` gives when fed, step by step, a
/// fresh `policy::rebalance::RankLatencyTracker` with each rank's compute time per computed
/// micro-batch from the gathered reports (the same code and inputs `sim::policies` uses).
#[test]
fn rebalancing_over_an_epoch_keeps_the_global_batch_and_every_sample_exactly_once() {
    let (n, m) = (4u32, 4u32);
    let samples = 2 * 4 * 4 * 24; // 24 full steps of micro-batches of 2
    let scripts: Vec<Vec<u64>> = (0..n)
        .map(|r| {
            let base = if r == 2 { 3_000 } else { 1_000 };
            (0..400u64).map(|i| base + (i * 7919 + u64::from(r) * 104_729) % 97).collect()
        })
        .collect();
    for threshold in [Threshold::Off, fixed(6_000)] {
        let _g = serial(&mock_cfg(n, &scripts));
        let mut cfg = base_cfg(m, 2, 4);
        cfg.max_micro_batches = Some(2 * m);
        cfg.policy.threshold = threshold;
        let data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> =
            Box::new(move |_| Box::new(SharedSource::new(EpochQueue::new((0..samples).collect(), 2))));
        let mut w = World::new(n, cfg.clone(), 30, data);
        // With a threshold the policy is rebalance-drop (rebalance alone has no deadline).
        use dropcompute::policy::{Policy, StepPolicy};
        let policy = if threshold == Threshold::Off { Policy::Rebalance } else { Policy::RebalanceDrop };
        w.prepare = Some(Box::new(move |s: &mut Scheduler| s.set_policy(StepPolicy::new(policy))));
        let runs = run(&w);
        for step in 0..30usize {
            let a = &runs[0].reports[step].assignment;
            assert!(runs.iter().all(|r| &r.reports[step].assignment == a), "step {step}: ranks agree on {a:?}");
            assert_eq!(a.iter().sum::<u32>(), n * m, "step {step}: global batch kept");
            let rep = &runs[0].reports[step];
            if rep.skip.is_none() {
                assert_eq!(rep.divisor, rep.global_samples() as f64, "step {step}: divisor = computed samples");
            }
        }
        let first = &runs[0].reports[0].assignment;
        assert_eq!(first, &vec![m; n as usize]);
        let last = &runs[0].reports[20].assignment;
        assert!(last[2] < m && last.iter().enumerate().all(|(r, &a)| r == 2 || a >= m), "{last:?}");
        let mut computed: Vec<u64> = runs.iter().flat_map(|r| r.drop_ledger.computed.iter().copied()).collect();
        computed.sort_unstable();
        assert_eq!(computed, (0..samples).collect::<Vec<_>>(), "{threshold:?}: every sample exactly once");
        if threshold != Threshold::Off {
            assert!(runs.iter().any(|r| !r.drop_ledger.dropped.is_empty()), "the deadline drops some");
        }
        // The same decisions from the pure policy code fed with the gathered reports.
        let mut t = RankLatencyTracker::new(n as usize, Default::default());
        let mut r = Rebalancer::new(n as usize, m, RebalanceConfig::default());
        for step in 0..29usize {
            let rep = &runs[0].reports[step];
            t.observe(&per_micro_batch_ns(rep, &Default::default()));
            let next = r.update(t.ewma_latency_ns(), &t.chronic()).to_vec();
            assert_eq!(next, runs[0].reports[step + 1].assignment, "step {}", step + 1);
        }
    }
}

/// The scheduler and the simulator make the same decisions for every policy the scheduler
/// runs as the simulator does: a synchronous run's reports become a trace
/// (`dropcompute::schedule::auto::trace_of_reports`), `sim::policies::replay_policy` replays it under the policy,
/// and its per-step, per-rank assignment and started micro-batches equal the scheduler's on
/// the same scripted latencies (each rank at a constant latency, so a micro-batch beyond the
/// trace's M takes the same latency in both). Both drive the one walker and assignment step.
#[test]
fn scheduler_and_simulator_decide_alike_on_scripted_latencies() {
    use dropcompute::policy::{Policy, StepPolicy};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    use dropcompute::sim::replay::ExecutionModel;
    let (n, m) = (4u32, 4u32);
    let scripts: Vec<Vec<u64>> = (0..n).map(|r| vec![if r == 1 { 25_000 } else { 10_000 }; 400]).collect();
    let base = {
        let _g = serial(&mock_cfg(n, &scripts));
        let data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> = endless(vec![1]);
        run(&World::new(n, base_cfg(m, 1, 4), 16, data))
    };
    let trace = dropcompute::schedule::auto::trace_of_reports(&base[0].reports).unwrap();
    let t = 45_000u64; // fast ranks: 4 x 10 µs fit; slow rank: 2 x 25 µs start
    for policy in Policy::ALL {
        let _g = serial(&mock_cfg(n, &scripts));
        let mut cfg = base_cfg(m, 1, 4);
        cfg.max_micro_batches = (policy != Policy::Synchronous && policy != Policy::DropBefore).then_some(2 * m);
        cfg.policy.check = policy.check_mode(CheckMode::BeforeMicroBatch);
        cfg.policy.threshold =
            if policy.drops() || policy == Policy::ComputeBudget { fixed(t) } else { Threshold::Off };
        let data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> =
            Box::new(move |_| Box::new(SharedSource::new(EpochQueue::new((0..100_000).collect(), 1))));
        let mut w = World::new(n, cfg.clone(), 16, data);
        w.prepare = Some(Box::new(move |s: &mut Scheduler| s.set_policy(StepPolicy::new(policy))));
        let runs = run(&w);
        let exec = ExecutionModel { check: CheckMode::BeforeMicroBatch, warmup_steps: 0, ..ExecutionModel::default() };
        let threshold = cfg.policy.threshold;
        // The simulator takes the compute budget from the policy's parameters (ms).
        let params = StepPolicy { budget: Threshold::Fixed(Duration::from_nanos(t)), ..StepPolicy::new(policy) };
        let sim = replay_policy(&trace, &PolicyRun::new(params, threshold, exec));
        let assigned: Vec<u32> = runs[0].reports.iter().flat_map(|r| r.assignment.iter().copied()).collect();
        let started: Vec<u32> = runs[0].reports.iter().flat_map(|r| r.ranks.iter().map(|x| x.computed)).collect();
        assert_eq!(sim.assigned, assigned, "{policy}: same assignment every step");
        assert_eq!(sim.started, started, "{policy}: same micro-batches started every step");
        if policy.rebalances() {
            assert!(assigned[assigned.len() - n as usize + 1] < m, "{policy}: the slow rank shed work");
        }
    }
}

/// The drop-rate guard (`SchedulerConfig::drop_guard`) in the scheduler: the same steps held
/// off as the replay with `ExecutionModel::drop_guard`. 4 ranks x M = 4, rank 1 at 25 µs, the
/// others 10 µs, before-check at 45 µs: an enforced step drops rank 1's last 2 of the 16
/// (12.5 %). At 5 %, by the rule `dropped + reserve <= 0.05 · (handed + 16)`: steps 0, 4, 7,
/// 9, 12, 14 enforced (e.g. step 4: 2 + 2 <= 0.05 · 80), the others held off (threshold off:
/// every micro-batch starts, the report says threshold off), 12 of 256 dropped after 16 steps.
#[test]
fn scheduler_and_simulator_hold_off_the_same_steps_under_the_drop_guard() {
    use dropcompute::policy::{Policy, StepPolicy};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    use dropcompute::sim::replay::ExecutionModel;
    let (n, m, steps) = (4u32, 4u32, 16u64);
    let scripts: Vec<Vec<u64>> = (0..n).map(|r| vec![if r == 1 { 25_000 } else { 10_000 }; 400]).collect();
    let base = {
        let _g = serial(&mock_cfg(n, &scripts));
        run(&World::new(n, base_cfg(m, 1, 4), steps, endless(vec![1])))
    };
    let trace = dropcompute::schedule::auto::trace_of_reports(&base[0].reports).unwrap();
    let _g = serial(&mock_cfg(n, &scripts));
    let mut cfg = base_cfg(m, 1, 4);
    cfg.policy.check = CheckMode::BeforeMicroBatch;
    cfg.policy.threshold = fixed(45_000);
    cfg.drop_guard = Some(0.05);
    let runs = run(&World::new(n, cfg.clone(), steps, endless(vec![1])));
    let enforced: Vec<bool> = runs[0].reports.iter().map(|r| r.threshold_ns.is_some()).collect();
    let want: Vec<bool> = (0..steps).map(|s| [0, 4, 7, 9, 12, 14].contains(&s)).collect();
    assert_eq!(enforced, want);
    let started: Vec<u64> = runs[0].reports.iter().map(|r| r.global_computed()).collect();
    assert_eq!(started, want.iter().map(|&e| if e { 14 } else { 16 }).collect::<Vec<u64>>());
    for r in &runs[1..] {
        let other: Vec<bool> = r.reports.iter().map(|r| r.threshold_ns.is_some()).collect();
        assert_eq!(other, enforced, "every rank decides alike");
    }
    let exec = ExecutionModel {
        check: CheckMode::BeforeMicroBatch,
        warmup_steps: 0,
        drop_guard: Some(0.05),
        ..ExecutionModel::default()
    };
    let sim = replay_policy(&trace, &PolicyRun::new(StepPolicy::new(Policy::DropBefore), cfg.policy.threshold, exec));
    assert_eq!(sim.enforced, enforced);
    let ranks: Vec<u32> = runs[0].reports.iter().flat_map(|r| r.ranks.iter().map(|x| x.computed)).collect();
    assert_eq!(sim.started, ranks);
    assert!((sim.drop_rate - 12.0 / 256.0).abs() < 1e-12, "{}", sim.drop_rate);
}

/// The tail shape (split 2, half micro-batches at half the device time): the scheduler and
/// the simulator start the same parts, whole and tail, for every policy that uses it; the
/// slow rank fills the slack before the deadline with a tail micro-batch; the parts computed
/// carry exactly the samples the counts say.
#[test]
fn scheduler_and_simulator_agree_with_a_tail_shape() {
    use dropcompute::policy::{Policy, StepPolicy, TailShape};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    use dropcompute::sim::replay::ExecutionModel;
    let (n, m) = (4u32, 4u32);
    // Whole micro-batches scripted (rank 1: 25 µs, the others 10 µs); a tail micro-batch takes
    // its base 5 µs times the rank's slowdown: half of the rank's whole one.
    let slow = |r: u32| if r == 1 { 2.5 } else { 1.0 };
    let cfg_mock = {
        let mut c = mock_cfg(n, &(0..n).map(|r| vec![(10_000.0 * slow(r)) as u64; 2000]).collect::<Vec<_>>());
        for o in &mut c.per_device {
            o.slowdown = slow(o.module_id);
        }
        c
    };
    let base = {
        let _g = serial(&cfg_mock);
        run(&World::new(n, base_cfg(m, 2, 4), 12, endless(vec![2])))
    };
    let trace = dropcompute::schedule::auto::trace_of_reports(&base[0].reports).unwrap();
    let t = 45_000u64; // fast ranks: 4 x 10 µs fit; slow: 25 + 12.5 fits, a whole second does not
    let tail = TailShape::split(2);
    for policy in [Policy::DropPredictive, Policy::ComputeBudget, Policy::Rebalance, Policy::RebalanceDrop] {
        let _g = serial(&cfg_mock);
        let mut cfg = base_cfg(m, 2, 4);
        cfg.tail = tail;
        cfg.max_micro_batches = (policy != Policy::DropPredictive).then_some(2 * m);
        cfg.policy.check = policy.check_mode(CheckMode::Predictive);
        cfg.policy.threshold =
            if policy.drops() || policy == Policy::ComputeBudget { fixed(t) } else { Threshold::Off };
        // Parts of b/S = 1 sample.
        let data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> =
            Box::new(move |_| Box::new(SharedSource::new(EpochQueue::new((0..100_000).collect(), 1))));
        let mut w = World::new(n, cfg.clone(), 12, data);
        w.tail = (5_000, 1);
        // Rebalancing in parts: at least S = 2 parts per rank (the default minimum, in parts).
        w.prepare =
            Some(Box::new(move |s: &mut Scheduler| s.set_policy(StepPolicy { tail, ..StepPolicy::new(policy) })));
        let runs = run(&w);
        let exec = ExecutionModel { check: CheckMode::Predictive, warmup_steps: 0, ..ExecutionModel::default() };
        let params = StepPolicy { budget: Threshold::Fixed(Duration::from_nanos(t)), tail, ..StepPolicy::new(policy) };
        let sim = replay_policy(&trace, &PolicyRun::new(params, cfg.policy.threshold, exec));
        let assigned: Vec<u32> = runs[0].reports.iter().flat_map(|r| r.assignment.iter().copied()).collect();
        let started: Vec<u32> = runs[0].reports.iter().flat_map(|r| r.ranks.iter().map(|x| x.computed)).collect();
        assert_eq!(sim.split, 2);
        assert_eq!(sim.assigned, assigned, "{policy}: same assignment (parts) every step");
        assert_eq!(sim.started, started, "{policy}: same parts started every step");
        for rep in &runs[0].reports {
            // Every rank's samples computed = its parts (1 sample each).
            for x in &rep.ranks {
                assert_eq!(x.samples, u64::from(x.computed), "{policy} step {}", rep.step);
            }
        }
        if policy == Policy::DropPredictive {
            // From step 1 (the estimator has seen the slow rank): 1 whole + 1 tail = 3 parts.
            assert!(started.chunks(n as usize).skip(1).all(|s| s == [8, 3, 8, 8]), "{started:?}");
            // The launches of rank 1 in step 1: a whole micro-batch of 2 samples, then a tail of 1.
            let l1: Vec<usize> = runs[1].launched.iter().filter(|(s, _)| *s == 1).map(|(_, ids)| ids.len()).collect();
            assert_eq!(l1, vec![2, 1]);
        }
        if policy.rebalances() {
            let last = &assigned[assigned.len() - n as usize..];
            // The slow rank sheds work; an odd part count runs its last part as a tail.
            assert!(last[1] < 2 * m && last.iter().any(|a| a % 2 == 1), "{policy}: {last:?}");
            assert_eq!(last.iter().sum::<u32>(), 2 * m * n, "{policy}: the global batch in parts");
        }
    }
}

/// Clock skew hidden by drops (issue 26): rank 1 is slowed 3x (its forward scripted at 25 µs
/// per micro-batch, the fast ranks' at 10 µs; its update, 3 µs on the others, and every other
/// launch 3x the others'), so it starts every step late. In the synchronous baseline the slow rank ends last
/// and its lag is part of the step; under `drop-predictive` at 45 µs it computes one
/// micro-batch (25 µs, ends before the fast ranks' 40 µs even with its lag), so the lag is
/// hidden behind the fast ranks. The trace of the baseline's reports carries the skew
/// (`trace_of_reports`: the clock starts of the gathered count rows), and the replay's step
/// time, `max_r(skew_r + offset_r + compute_r) + overhead`, equals rank 0's measured step time
/// in every step, to the nanosecond; the same trace with its skew folded back into the
/// overhead (the rule before the skew) over-predicts every dropping step by the skew.
#[test]
fn the_replay_keeps_a_slow_ranks_clock_skew_where_drops_hide_it() {
    use dropcompute::policy::{Policy, StepPolicy};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    use dropcompute::sim::replay::ExecutionModel;
    let (n, m, steps) = (4u32, 4u32, 8u64);
    let slow = |r: u32| if r == 1 { 3.0 } else { 1.0 };
    let cfg_mock = {
        let mut c = mock_cfg(n, &(0..n).map(|r| vec![if r == 1 { 25_000 } else { 10_000 }; 400]).collect::<Vec<_>>());
        for o in &mut c.per_device {
            o.slowdown = slow(o.module_id);
        }
        c
    };
    let data = || -> Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> {
        Box::new(move |_| Box::new(SharedSource::new(EpochQueue::new((0..100_000).collect(), 1))))
    };
    let base = {
        let _g = serial(&cfg_mock);
        run(&World { opt_base_ns: 3_000, ..World::new(n, base_cfg(m, 1, 4), steps, data()) })
    };
    let trace = dropcompute::schedule::auto::trace_of_reports(&base[0].reports).unwrap();
    let skews = trace.skews_ns();
    // From step 1 on, rank 1 starts late (its slower update); rank 0 is never the late one.
    for s in 1..steps as usize {
        let row = &skews[s * n as usize..(s + 1) * n as usize];
        assert!(row[1] > 0.0 && row[1] < 15_000.0, "step {s}: skews {row:?}");
        assert_eq!(row.iter().copied().fold(f64::INFINITY, f64::min), 0.0, "step {s}: {row:?}");
        assert_eq!(row[0], 0.0, "step {s}: {row:?}");
    }
    let t = 45_000u64;
    let policy = Policy::DropPredictive;
    let runs = {
        let _g = serial(&cfg_mock);
        let mut cfg = base_cfg(m, 1, 4);
        cfg.policy.check = CheckMode::Predictive;
        cfg.policy.threshold = fixed(t);
        let mut w = World { opt_base_ns: 3_000, ..World::new(n, cfg, steps, data()) };
        w.prepare = Some(Box::new(move |s: &mut Scheduler| s.set_policy(StepPolicy::new(policy))));
        run(&w)
    };
    let exec = ExecutionModel { check: CheckMode::Predictive, warmup_steps: 0, ..ExecutionModel::default() };
    let run_of = |tr: &dropcompute::trace::LatencyTrace| {
        replay_policy(tr, &PolicyRun::new(StepPolicy::new(policy), fixed(t), exec))
    };
    let sim = run_of(&trace);
    let started: Vec<u32> = runs[0].reports.iter().flat_map(|r| r.ranks.iter().map(|x| x.computed)).collect();
    assert_eq!(sim.started, started, "same micro-batches started every step");
    assert!(started.chunks(n as usize).skip(1).all(|s| s == [4, 1, 4, 4]), "the slow rank is cut: {started:?}");
    // Before the skew: the same trace, the skew left in the overhead (step - max compute).
    let blind = {
        let off: Vec<f64> = trace
            .steps()
            .iter()
            .zip(trace.overhead_ns())
            .enumerate()
            .map(|(s, (_, o))| {
                let row = &skews[s * n as usize..(s + 1) * n as usize];
                let ends: Vec<f64> = (0..n as usize)
                    .map(|r| trace.start_offsets_ns()[s * n as usize + r] + trace.rank_compute_ns()[s * n as usize + r])
                    .collect();
                let with = ends.iter().zip(row).map(|(e, k)| e + k).fold(0.0f64, f64::max);
                o + with - ends.iter().copied().fold(0.0f64, f64::max)
            })
            .collect();
        trace.clone().with_skews(vec![0.0; skews.len()]).unwrap().with_overhead(off).unwrap()
    };
    let old = run_of(&blind);
    for (s, rep) in runs[0].reports.iter().enumerate() {
        let measured = rep.step_ns as f64;
        assert_eq!(sim.per_step[s].1, measured, "step {s}: replayed vs measured step time");
        assert_eq!(sim.per_step[s].0, base[0].reports[s].step_ns as f64, "step {s}: the baseline replays itself");
        if s > 0 {
            let lag = skews[s * n as usize + 1];
            assert_eq!(old.per_step[s].1 - measured, lag, "step {s}: the rule without skew is long by the lag");
        }
    }
}

/// Backup workers as the device runs them: the rank predicted slowest (per-micro-batch
/// latency EWMA × M, `policy::backup_aggregated`) computes nothing from step 1 on, the others M;
/// every rank agrees; b = 0 runs every rank (and equals the synchronous run bitwise).
#[test]
fn backup_workers_skip_the_rank_predicted_slowest_and_b_zero_is_synchronous() {
    let (n, m) = (3u32, 3u32);
    let scripts: Vec<Vec<u64>> =
        (0..n).map(|r| vec![if r == 1 { 5_000 } else { 1_000 + 10 * u64::from(r) }; 200]).collect();
    let mut params = Vec::new();
    for b in [None, Some(0u32), Some(1)] {
        let _g = serial(&mock_cfg(n, &scripts));
        let cfg = base_cfg(m, 1, 4);
        let data: Box<dyn Fn(u32) -> Box<dyn DataSource + Send> + Sync> =
            Box::new(move |_| Box::new(SharedSource::new(EpochQueue::new((0..300).collect(), 1))));
        let mut w = World::new(n, cfg, 6, data);
        if let Some(b) = b {
            use dropcompute::policy::{Policy, StepPolicy};
            let params = StepPolicy { backup_workers: b, ..StepPolicy::new(Policy::BackupWorkers) };
            w.prepare = Some(Box::new(move |s: &mut Scheduler| s.set_policy(params)));
        }
        let runs = run(&w);
        for step in 0..6usize {
            let a = &runs[0].reports[step].assignment;
            assert!(runs.iter().all(|r| &r.reports[step].assignment == a));
            let want = match b {
                Some(1) if step > 0 => {
                    let mut t = RankLatencyTracker::new(n as usize, Default::default());
                    for rep in &runs[0].reports[..step] {
                        t.observe(&per_micro_batch_ns(rep, &Default::default()));
                    }
                    let finish: Vec<f64> = t.ewma_latency_ns().iter().map(|l| l * f64::from(m)).collect();
                    backup_aggregated(&finish, 1).into_iter().map(|k| if k { m } else { 0 }).collect()
                }
                _ => vec![m; n as usize],
            };
            assert_eq!(a, &want, "b = {b:?}, step {step}");
        }
        if b == Some(1) {
            assert_eq!(runs[0].reports[3].assignment, vec![m, 0, m], "rank 1 is the backup");
            assert_eq!(runs[0].reports[3].ranks[1].computed, 0);
        }
        params.push(runs[0].params.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
    assert_eq!(params[0], params[1], "b = 0 equals the synchronous run bitwise");
    assert_ne!(params[0], params[2]);
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
fn deadline_overshoot_under_the_reference_noise_is_bounded() {
    let n = 4u32;
    let m = 8u32;
    let base = 1_000_000u64;
    let t = 9_000_000u64; // 0.75 of M x mean latency (mean factor 1.5)
    for check in [CheckMode::BeforeMicroBatch, CheckMode::Predictive] {
        let mut mc = mock_cfg(n, &[]);
        mc.noise = Noise::Reference { delay_factor: 1.0 };
        mc.seed = 11;
        let _g = serial(&mc);
        let mut cfg = base_cfg(m, 1, 16);
        cfg.policy = DeadlineConfig { threshold: fixed(t), check, warmup_steps: 3, min_micro_batches: 1 };
        let w = World { fwd_base_ns: base, ..World::new(n, cfg, 40, endless(vec![1])) };
        let runs = run(&w);
        let compute: Vec<u64> = runs.iter().flat_map(|r| r.reports[3..].iter().map(|rep| rep.compute_ns)).collect();
        let mbs: Vec<u64> = runs
            .iter()
            .flat_map(|r| {
                r.reports.iter().flat_map(|rep| rep.micro_batches.iter().filter(|m| !m.dropped).map(|m| m.duration_ns))
            })
            .collect();
        let drop_rate: f64 = runs[0].reports[3..].iter().map(|r| r.drop_rate()).sum::<f64>() / 37.0;
        let (med, med_mb) = (median(compute), median(mbs));
        eprintln!(
            "{check:?}: median compute {med} ns, threshold {t}, median micro-batch {med_mb}, drop rate {drop_rate:.3}"
        );
        assert!(drop_rate > 0.0);
        match check {
            CheckMode::BeforeMicroBatch => assert!(med <= t + med_mb, "{med} > {t} + {med_mb}"),
            CheckMode::Predictive => assert!(med as f64 <= t as f64 * 1.05, "{med} > 1.05 x {t}"),
        }
    }
}
