//! The scheduler on a bucketed job (issue 26 items 4 and 5, the scheduler's side): ranks as
//! threads on the CPU mock in virtual time, every micro-batch's device time its length
//! bucket's (one recipe per bucket, its base latency the bucket's cost, no noise: all straggling
//! is the data's), the buckets and real token counts carried by the micro-batches
//! (`MicroBatch::bucket`, `MicroBatch::tokens`) as the text job's data source sets them.
//!
//! - the scheduler and the simulator decide alike on the scripted lengths: a synchronous run's
//!   reports become a length-carrying trace (`schedule::auto::trace_of_reports` +
//!   `with_report_lengths`), `sim::policies::replay_policy` replays it, and every step's
//!   assignment and parts started per rank equal the scheduler's, for the blind policies and
//!   the two length-aware ones (told the buckets: they decide otherwise than blind);
//! - the compute log the scheduler's reports write carries the bucket and token columns and
//!   loads back (`trace::load`, the loader of `simulate`/`tune --trace`) with the run's buckets
//!   and tokens, and its replay decides as the run;
//! - under every policy (`Policy::ALL`) an epoch of the one global stream computes every
//!   sample, hence every token, exactly once, the divisor of every step is the step's real
//!   tokens (token normalization), and the ledgers add up to the epoch's tokens; each rank's
//!   dropped tokens reach every rank's report (`RankStepStats::dropped_tokens`, through the
//!   count row) and the step's drop rate is in tokens;
//! - a run resumed from a checkpoint of its scheduler state (through `checkpoint::encode` /
//!   `decode`) decides exactly as the uninterrupted run; restored without the per-bucket
//!   estimators it does not.
#![cfg(all(feature = "mock", target_os = "linux"))]

use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use dropcompute::checkpoint::{self, Checkpoint};
use dropcompute::hccl::{Comm, CommOptions};
use dropcompute::mock::{self, MockConfig, MockControl, MockRecipe, TimeMode};
use dropcompute::mock_recipes;
use dropcompute::policy::{CheckMode, DeadlineConfig, Policy, StepPolicy, TailShape, Threshold};
use dropcompute::schedule::{
    DataSource, DropHandling, DropLedger, EpochQueue, GradDtype, GradientScratch, MicroBatch, Scheduler,
    SchedulerConfig, SchedulerState, SharedSource, StepReport, Weighting, Workload, WorkloadError,
};
use dropcompute::sim::policies::{PolicyRun, replay_policy};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::synapse::{Device, DeviceBuffer, HostBuffer, LaunchTensor, Recipe, Runtime, Stream};

/// Padded length of each bucket (tokens).
const LEN: [u64; 4] = [64, 128, 256, 512];
/// Device time of one micro-batch of each bucket (ns): roughly linear plus quadratic in the
/// length, as attention makes it.
const COST_NS: [u64; 4] = [10_000, 20_000, 45_000, 120_000];
/// Gradient elements.
const P: usize = 4;

/// Sample (unit) `id`'s bucket: a long one every fifth, else short to medium.
fn bucket_of(id: u64) -> u32 {
    if id.is_multiple_of(5) { 3 } else { (id % 3) as u32 }
}

/// Sample `id`'s real tokens: below its bucket's padded length.
fn tokens_of(id: u64) -> u64 {
    let len = LEN[bucket_of(id) as usize];
    len - (id * 7919) % (len / 2)
}

/// The mock is process-global: tests take turns and reconfigure it (virtual time, no noise).
fn serial(n: u32) -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    let g = L.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = MockConfig { devices: n, time_mode: TimeMode::Virtual, ..MockConfig::default() };
    MockControl::in_process().configure(&cfg).unwrap();
    g
}

fn runtime() -> &'static Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(mock::api()).unwrap())
}

/// The job's data: one global stream of units (one sample each, micro-batch size 1), each
/// micro-batch labelled with its bucket and real tokens, as the text job's `TokenCounted`
/// labels the plan's units.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Lengths {
    inner: SharedSource<EpochQueue>,
    /// The even units' micro-batches handed out without tokens (a step of mixed shapes).
    #[serde(default)]
    no_tokens_if_even: bool,
}

impl Lengths {
    fn new(units: u64) -> Self {
        Self { inner: SharedSource::new(EpochQueue::new((0..units).collect(), 1)), no_tokens_if_even: false }
    }
}

fn label(mut mb: MicroBatch) -> MicroBatch {
    mb.bucket = mb.sample_ids.iter().map(|&id| bucket_of(id)).max();
    mb.tokens = Some(mb.sample_ids.iter().map(|&id| tokens_of(id)).sum());
    mb
}

impl DataSource for Lengths {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        self.inner.next_micro_batch().map(label)
    }
    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        self.inner.requeue(dropped);
    }
    fn take_assigned(&mut self, rank: u32, assignment: &[u32]) -> Vec<MicroBatch> {
        let strip = |mut mb: MicroBatch| {
            if self.no_tokens_if_even && mb.sample_ids.iter().all(|id| id % 2 == 0) {
                mb.tokens = None;
            }
            mb
        };
        self.inner.take_assigned(rank, assignment).into_iter().map(label).map(strip).collect()
    }
    fn settle(&mut self, rank: u32, computed: &[u32], dropped: Vec<MicroBatch>, requeue: bool) {
        self.inner.settle(rank, computed, dropped, requeue);
    }
    fn take_dealt(
        &mut self,
        rank: u32,
        parts: usize,
        deal: &mut dyn FnMut(&[MicroBatch]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<MicroBatch>>> {
        let mut labelled = |raw: &[MicroBatch]| deal(&raw.iter().cloned().map(label).collect::<Vec<_>>());
        let slices = self.inner.take_dealt(rank, parts, &mut labelled)?;
        Some(slices.into_iter().map(|s| s.into_iter().map(label).collect()).collect())
    }
}

/// The model: one forward/backward recipe per bucket (a copy of the micro-batch's host
/// gradient, Σ over its samples of a small integer per element), its base latency the bucket's
/// cost; the optimizer does nothing (the tests check decisions and divisors).
struct BucketWork {
    fwd: Vec<Recipe>,
    input: DeviceBuffer<f32>,
    keep: Vec<HostBuffer<f32>>,
    /// (step, bucket, tokens) of every launch.
    launched: Vec<(u64, u32, u64)>,
}

impl BucketWork {
    fn new(rt: &Arc<Runtime>, s: &Stream) -> Self {
        let fwd = COST_NS
            .iter()
            .enumerate()
            .map(|(b, &ns)| {
                let r = MockRecipe::new(format!("len_fwd_b{b}"), "copy")
                    .tensor("src", 4 * P as u64)
                    .tensor("dst", 4 * P as u64)
                    .base_latency_ns(ns);
                mock_recipes::load(rt, r).unwrap()
            })
            .collect();
        Self { fwd, input: DeviceBuffer::alloc(s.device(), P).unwrap(), keep: vec![], launched: vec![] }
    }
}

impl Workload for BucketWork {
    fn launch_micro_batch(
        &mut self,
        s: &Stream,
        step: u64,
        _index: u32,
        mb: &MicroBatch,
        grad: &mut GradientScratch,
    ) -> Result<(), WorkloadError> {
        let b = mb.bucket.ok_or("a micro-batch without a bucket")?;
        let fwd = self.fwd.get(b as usize).ok_or("bucket out of range")?;
        let v: Vec<f32> = (0..P).map(|j| mb.sample_ids.iter().map(|&id| ((id + j as u64) % 7) as f32).sum()).collect();
        let h = HostBuffer::from_slice(s.device(), &v)?;
        s.copy_h2d(&h, &mut self.input)?;
        self.keep.push(h);
        let ids = fwd.tensor_ids(&["src", "dst"])?;
        let out = grad.as_f32_mut().ok_or("scratch is not f32")?;
        s.launch(fwd, &[LaunchTensor::by_id(ids[0], &self.input), LaunchTensor::by_id(ids[1], out)], None, &[])?;
        self.launched.push((step, b, mb.tokens.unwrap_or(0)));
        Ok(())
    }

    fn launch_optimizer(&mut self, _s: &Stream, _step: u64, _grad: &DeviceBuffer<f32>) -> Result<(), WorkloadError> {
        Ok(())
    }
}

/// What one rank returns.
struct RankRun {
    reports: Vec<StepReport>,
    launched: Vec<(u64, u32, u64)>,
    ledger: DropLedger,
    state: SchedulerState,
    data: Lengths,
}

/// One run of `n` ranks under `policy` over `steps` (stopping early after a step in which no
/// rank had data when `until_empty`), each rank's data `data[r]`, its scheduler state restored
/// from `states[r]` when given.
fn run(
    n: u32,
    cfg: &SchedulerConfig,
    policy: StepPolicy,
    data: Vec<Lengths>,
    states: Option<Vec<SchedulerState>>,
    steps: Range<u64>,
    until_empty: bool,
) -> Vec<RankRun> {
    let rt = runtime();
    let id = Comm::unique_id(rt).unwrap();
    let opts = CommOptions { timeout: Duration::from_secs(30), ..CommOptions::default() };
    std::thread::scope(|sc| {
        let hs: Vec<_> = data
            .into_iter()
            .enumerate()
            .map(|(rank, mut data)| {
                let (opts, steps, states) = (opts.clone(), steps.clone(), states.clone());
                sc.spawn(move || {
                    let rank = rank as u32;
                    let dev = Device::acquire(rt, rank).unwrap();
                    let comm = Comm::init_rank(&dev, n, &id, rank, opts).unwrap();
                    let ops = mock_recipes::gradient_ops(rt, cfg.gradient_len, cfg.grad_dtype).unwrap();
                    let mut sched = Scheduler::new(comm, cfg.clone(), ops).unwrap();
                    sched.set_policy(policy);
                    if let Some(s) = states {
                        sched.restore(s[rank as usize].clone()).expect("a state this run saved");
                    }
                    let mut work = BucketWork::new(rt, sched.stream());
                    let mut reports = vec![];
                    for step in steps {
                        let (rep, _) = sched.step(step, &mut data, &mut work).unwrap();
                        let empty = rep.global_computed() + rep.global_dropped() == 0;
                        reports.push(rep);
                        if until_empty && empty {
                            break;
                        }
                    }
                    RankRun {
                        reports,
                        launched: std::mem::take(&mut work.launched),
                        ledger: sched.ledger().clone(),
                        state: sched.state(),
                        data,
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The parts started per step and rank of `policy`'s run among `decided` (policy, started, ..).
fn of_started<T, U>(decided: &[(Policy, Vec<u32>, T, U)], policy: Policy) -> Vec<u32> {
    decided.iter().find(|d| d.0 == policy).map(|d| d.1.clone()).unwrap_or_default()
}

fn fixed(ns: u64) -> Threshold {
    Threshold::Fixed(Duration::from_nanos(ns))
}

/// M micro-batches of 1 unit, 2·M slots, the predictive check without warm-up, tokens as the
/// unit of work, dropped micro-batches `handling`.
fn cfg(m: u32, policy: Policy, threshold: Threshold, handling: DropHandling) -> SchedulerConfig {
    SchedulerConfig {
        micro_batches: m,
        max_micro_batches: Some(2 * m),
        micro_batch_size: 1,
        gradient_len: P,
        grad_dtype: GradDtype::F32,
        weighting: Weighting::Tokens,
        drop_handling: handling,
        policy: DeadlineConfig {
            threshold: if policy.has_deadline() || policy == Policy::ComputeBudget {
                threshold
            } else {
                Threshold::Off
            },
            check: policy.check_mode(CheckMode::Predictive),
            warmup_steps: 0,
            min_micro_batches: 1,
        },
        ..SchedulerConfig::default()
    }
}

fn started(reports: &[StepReport]) -> Vec<u32> {
    reports.iter().flat_map(|r| r.ranks.iter().map(|x| x.computed)).collect()
}

fn assigned(reports: &[StepReport]) -> Vec<u32> {
    reports.iter().flat_map(|r| r.assignment.iter().copied()).collect()
}

/// The scheduler and the simulator on scripted lengths (module doc). Dropped micro-batches
/// are discarded, so that every run's step s holds the stream's micro-batches of the
/// baseline's step s (with re-queueing the drops would shift the stream, and the trace's
/// recorded cells would no longer be the run's micro-batches).
#[test]
fn scheduler_and_simulator_decide_alike_on_scripted_lengths_with_buckets_passed() {
    let (n, m, steps) = (4u32, 4u32, 14u64);
    let units = u64::from(n * m) * steps;
    let threshold = fixed(130_000);
    let data = || (0..n).map(|_| Lengths::new(units)).collect::<Vec<_>>();
    let base = {
        let _g = serial(n);
        // M slots (the trace is N x M), the count row padded to the policy runs' 2·M.
        let c = SchedulerConfig {
            max_micro_batches: None,
            count_row_slots: Some(2 * m),
            ..cfg(m, Policy::Synchronous, Threshold::Off, DropHandling::Discard)
        };
        run(n, &c, StepPolicy::new(Policy::Synchronous), data(), None, 0..steps, false)
    };
    let per_rank: Vec<&[StepReport]> = base.iter().map(|r| &r.reports[..]).collect();
    let blind = dropcompute::schedule::auto::trace_of_reports(&base[0].reports).expect("baseline trace");
    let trace = dropcompute::schedule::auto::with_report_lengths(blind, &per_rank);
    let buckets = trace.buckets().expect("a length-carrying trace");
    // Cell (s, r, j) is stream unit s·N·M + r·M + j.
    assert!(buckets.iter().enumerate().all(|(k, &b)| b == bucket_of(k as u64)), "the trace's buckets are the data's");
    let tokens = trace.tokens().expect("a trace in tokens");
    assert!(tokens.iter().enumerate().all(|(k, &t)| t == tokens_of(k as u64)), "the trace's tokens are the data's");
    let all_tokens: u64 = tokens.iter().sum();

    // The compute log of the reports carries the buckets and the tokens, and loads back with
    // them through the loader of `simulate`/`tune --trace` (`trace::load`).
    let mut w = dropcompute::trace::compute_log::ComputeLogWriter::new(Vec::new());
    for r in &base {
        for rep in &r.reports {
            for row in rep.compute_log(m, Default::default()) {
                assert_eq!(
                    row.tokens,
                    Some(tokens_of(row.global_step * u64::from(n * m) + u64::from(row.rank * m + row.local_step)))
                );
                w.write(&row).unwrap();
            }
        }
    }
    let bytes = w.into_inner().unwrap();
    let header = String::from_utf8_lossy(&bytes[..bytes.iter().position(|&c| c == b'\n').unwrap()]).into_owned();
    assert!(header.ends_with(",clock_start_ns,bucket,tokens"), "{header}");
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("compute_log_baseline.csv");
    std::fs::write(&log_path, &bytes).unwrap();
    let loaded = dropcompute::trace::load(std::slice::from_ref(&log_path), &Default::default())
        .expect("the log loads")
        .remove(0);
    assert_eq!(loaded.trace.buckets(), Some(buckets), "the log's buckets are the run's");
    assert_eq!(loaded.trace.tokens(), Some(tokens), "the log's tokens are the run's");

    let mut decided = Vec::new();
    for policy in
        [Policy::Synchronous, Policy::DropBefore, Policy::DropPredictive, Policy::LengthPredictive, Policy::CostBalance]
    {
        let _g = serial(n);
        let c = cfg(m, policy, threshold, DropHandling::Discard);
        let runs = run(n, &c, StepPolicy::new(policy), data(), None, 0..steps, false);
        let exec = ExecutionModel { check: CheckMode::Predictive, warmup_steps: 0, ..ExecutionModel::default() };
        let sim = replay_policy(&trace, &PolicyRun::new(StepPolicy::new(policy), c.policy.threshold, exec));
        let rep = &runs[0].reports;
        // The replay of the trace read back from the compute log decides alike.
        let from_log = replay_policy(&loaded.trace, &PolicyRun::new(StepPolicy::new(policy), c.policy.threshold, exec));
        assert_eq!((&from_log.assigned, &from_log.started), (&sim.assigned, &sim.started), "{policy}: from the log");
        assert_eq!(sim.assigned, assigned(rep), "{policy}: the same assignment every step");
        assert_eq!(sim.started, started(rep), "{policy}: the same micro-batches started every step");
        for r in &runs {
            assert_eq!(assigned(&r.reports), assigned(rep), "{policy}: every rank holds the same assignment");
        }
        // Every step's divisor is the real tokens computed over every rank.
        for (s, x) in rep.iter().enumerate() {
            let tokens: u64 = runs.iter().flat_map(|r| &r.launched).filter(|l| l.0 == s as u64).map(|l| l.2).sum();
            assert_eq!(x.divisor, tokens as f64, "{policy} step {s}: divisor = real tokens");
            assert_eq!(x.ranks.iter().map(|r| r.tokens).sum::<u64>(), tokens);
        }
        // The replay counts tokens: the run's computed tokens over the epoch's, and its drop
        // rate is in tokens (not the micro-batches' when anything dropped).
        let computed: u64 = rep.iter().map(|x| x.ranks.iter().map(|r| r.tokens).sum::<u64>()).sum();
        assert_eq!(sim.tokens, Some((computed as f64, all_tokens as f64)), "{policy}: the replay's tokens");
        let lost = (all_tokens - computed) as f64 / all_tokens as f64;
        assert!((sim.drop_rate - lost).abs() < 1e-12, "{policy}: drop rate {} in tokens, {lost}", sim.drop_rate);
        if sim.lost > 0 {
            assert_ne!(sim.drop_rate, sim.lost as f64 / sim.nominal as f64, "{policy}: in micro-batches");
        }
        if policy == Policy::DropPredictive {
            // DropCompute's replay (what `tune::recommend` and its guardrail judge) too.
            let d = dropcompute::sim::replay::replay(&trace, c.policy.threshold, &exec).drop_rate;
            assert!((d - lost).abs() < 1e-12, "recommend's replay: drop rate {d} in tokens, {lost}");
        }
        decided.push((policy, started(rep), assigned(rep), sim.effective_speedup));
    }
    {
        // Fewer slots than the policy's cap (M < 2·M): the scheduler deals within its slots
        // (every rank M, the micro-batches dealt by cost), and the replay told them
        // (`PolicyRun::slots`) deals alike (`StepPolicy::deal_cap`); the replay at the default
        // cap (2·M, what it assumed before) deals some rank more than the run's slots.
        let policy = Policy::CostBalance;
        let _g = serial(n);
        let c = SchedulerConfig { max_micro_batches: Some(m), ..cfg(m, policy, threshold, DropHandling::Discard) };
        let runs = run(n, &c, StepPolicy::new(policy), data(), None, 0..steps, false);
        let rep = &runs[0].reports;
        let exec = ExecutionModel { check: CheckMode::Predictive, warmup_steps: 0, ..ExecutionModel::default() };
        let told = PolicyRun { slots: Some(m), ..PolicyRun::new(StepPolicy::new(policy), c.policy.threshold, exec) };
        let sim = replay_policy(&trace, &told);
        assert!(assigned(rep).iter().all(|&a| a == m), "the run deals within its slots");
        assert_eq!(sim.assigned, assigned(rep), "slots M: the same assignment every step");
        assert_eq!(sim.started, started(rep), "slots M: the same micro-batches started every step");
        assert_ne!(
            sim.started,
            of_started(&decided, Policy::CostBalance),
            "the deal within M slots differs from 2·M's"
        );
        let wide = replay_policy(&trace, &PolicyRun { slots: None, ..told });
        assert!(wide.assigned.iter().any(|&a| a > m), "at the cap of 2·M the replay deals more than the slots");
    }
    let of = |p: Policy| decided.iter().find(|d| d.0 == p).unwrap();
    // Told the buckets, the length-aware check decides otherwise than the blind one, and the
    // cost-balanced deal moves micro-batches between ranks (counts other than M).
    assert_ne!(of(Policy::LengthPredictive).1, of(Policy::DropPredictive).1, "length-predictive runs blind");
    assert!(of(Policy::CostBalance).2.iter().any(|&a| a != m), "cost-balance dealt M each every step");
    // A deadline chosen to force decisions, not tuned: these are no performance figures.
    eprintln!(
        "replayed speedup in tokens at {} ns: {}",
        threshold.as_ns().unwrap_or(0),
        decided.iter().map(|d| format!("{} {:+.3}", d.0, d.3)).collect::<Vec<_>>().join(", ")
    );
}

/// Every token computed exactly once per epoch under every policy, whole micro-batches and a
/// tail shape of split 2 (units are parts, two merged in a whole launch), with token
/// normalization (module doc).
#[test]
fn every_token_is_computed_exactly_once_per_epoch_under_every_policy() {
    let (n, m) = (3u32, 4u32);
    let units = u64::from(n * m) * 10;
    let all_tokens: u64 = (0..units).map(tokens_of).sum();
    let (mut dropping, mut dropped_tokens) = (0, 0);
    for (policy, split) in Policy::ALL.into_iter().flat_map(|p| [(p, 1u32), (p, 2)]) {
        let _g = serial(n);
        let c = SchedulerConfig {
            tail: TailShape::split(split),
            micro_batch_size: split, // parts of one unit
            ..cfg(m, policy, fixed(110_000), DropHandling::Requeue)
        };
        let data = (0..n).map(|_| Lengths::new(units)).collect();
        let runs = run(n, &c, StepPolicy::new(policy), data, None, 0..200, true);
        let policy = format!("{policy} split {split}");
        let rep = &runs[0].reports;
        assert_eq!(rep.last().map(|r| r.global_computed()), Some(0), "{policy}: the epoch ended within 200 steps");
        let mut ids: Vec<u64> = runs.iter().flat_map(|r| r.ledger.computed.iter().copied()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..units).collect::<Vec<_>>(), "{policy}: every sample exactly once");
        let computed_tokens: u64 = runs.iter().map(|r| r.ledger.computed_tokens).sum();
        assert_eq!(computed_tokens, all_tokens, "{policy}: the ledgers' tokens are the epoch's");
        for r in &runs {
            for d in &r.ledger.dropped {
                assert_eq!(d.tokens, Some(d.sample_ids.iter().map(|&id| tokens_of(id)).sum()), "{policy}: {d:?}");
            }
            assert_eq!(r.launched.iter().map(|l| l.2).sum::<u64>(), r.ledger.computed_tokens, "{policy}");
        }
        for x in rep.iter().filter(|x| x.skip.is_none()) {
            assert_eq!(x.divisor, x.ranks.iter().map(|r| r.tokens).sum::<u64>() as f64, "{policy} step {}", x.step);
        }
        // Each rank's dropped tokens (its ledger's drop records of the step) reach every rank's
        // report of the step through the count row, and the step's drop rate is in tokens:
        // dropped / (launched + dropped) tokens, from the ledgers and the launches.
        for (s, x) in rep.iter().enumerate() {
            let dropped_of = |r: &RankRun| -> u64 {
                r.ledger.dropped.iter().filter(|d| d.step == x.step).filter_map(|d| d.tokens).sum()
            };
            for (k, r) in runs.iter().enumerate() {
                for (j, other) in runs.iter().enumerate() {
                    assert_eq!(
                        other.reports[s].ranks[k].dropped_tokens,
                        dropped_of(r),
                        "{policy} step {}: rank {k}'s dropped tokens in rank {j}'s report",
                        x.step
                    );
                }
            }
            let dropped: u64 = runs.iter().map(dropped_of).sum();
            let computed: u64 = runs.iter().flat_map(|r| &r.launched).filter(|l| l.0 == x.step).map(|l| l.2).sum();
            let want = if dropped + computed > 0 { dropped as f64 / (dropped + computed) as f64 } else { 0.0 };
            assert!((x.drop_rate() - want).abs() < 1e-12, "{policy} step {}: {} != {want}", x.step, x.drop_rate());
            dropped_tokens += dropped;
        }
        dropping += runs.iter().map(|r| r.ledger.dropped.len()).sum::<usize>();
    }
    assert!(dropping > 0, "the deadline drops, so the re-queue is exercised");
    assert!(dropped_tokens > 0, "the dropped micro-batches carry tokens");
}

/// A resumed run decides as the uninterrupted one (module doc).
#[test]
fn a_resumed_run_decides_as_the_uninterrupted_one_with_the_bucket_estimators_checkpointed() {
    let (n, m, steps, cut) = (3u32, 4u32, 12u64, 5u64);
    let units = u64::from(n * m) * 40;
    for policy in [Policy::LengthPredictive, Policy::CostBalance] {
        let c = cfg(m, policy, fixed(110_000), DropHandling::Requeue);
        let p = StepPolicy::new(policy);
        let fresh = || (0..n).map(|_| Lengths::new(units)).collect::<Vec<_>>();
        let whole = {
            let _g = serial(n);
            run(n, &c, p, fresh(), None, 0..steps, false)
        };
        let first = {
            let _g = serial(n);
            run(n, &c, p, fresh(), None, 0..cut, false)
        };
        // Each rank's state and data through the checkpoint container and back.
        let (states, data): (Vec<SchedulerState>, Vec<Lengths>) = first
            .iter()
            .map(|r| {
                let meta = serde_json::json!({ "scheduler": r.state, "data": r.data });
                let ckpt = Checkpoint { step: cut, meta, tensors: vec![] };
                let bytes = checkpoint::encode(&ckpt, Path::new("ckpt")).unwrap();
                let back = checkpoint::decode(&bytes, Path::new("ckpt")).unwrap();
                let state: SchedulerState = serde_json::from_value(back.meta["scheduler"].clone()).unwrap();
                let data: Lengths = serde_json::from_value(back.meta["data"].clone()).unwrap();
                assert_eq!(state.bucket_estimator, r.state.bucket_estimator, "{policy}: round trip");
                assert_eq!(state.job_estimator, r.state.job_estimator, "{policy}: round trip");
                (state, data)
            })
            .unzip();
        assert!(states.iter().all(|s| s.bucket_estimator.as_ref().is_some_and(|e| e.has_buckets())), "{policy}");
        let job_buckets = states[0].job_estimator.as_ref().map(|e| e.buckets().count());
        assert_eq!(job_buckets, (policy == Policy::CostBalance).then_some(4), "{policy}: the job-wide costs");
        let resumed = {
            let _g = serial(n);
            run(n, &c, p, data.clone(), Some(states.clone()), cut..steps, false)
        };
        let tail = &whole[0].reports[cut as usize..];
        assert_eq!(assigned(&resumed[0].reports), assigned(tail), "{policy}: the same assignments");
        assert_eq!(started(&resumed[0].reports), started(tail), "{policy}: the same micro-batches started");
        for (a, b) in whole.iter().zip(&resumed) {
            assert_eq!(a.ledger, b.ledger, "{policy}: the same ledger");
        }
        // Without the per-bucket estimators (a checkpoint of the blind window alone) the
        // resumed run decides otherwise: the test sees what the checkpoint carries.
        let blind: Vec<SchedulerState> = states
            .iter()
            .map(|s| SchedulerState { bucket_estimator: None, job_estimator: None, ..s.clone() })
            .collect();
        let forgetful = {
            let _g = serial(n);
            run(n, &c, p, data, Some(blind), cut..steps, false)
        };
        assert_ne!(
            (assigned(&forgetful[0].reports), started(&forgetful[0].reports)),
            (assigned(tail), started(tail)),
            "{policy}: the bucket estimators changed no decision"
        );
    }
}

/// A micro-batch without tokens in a step whose others carry them (the scheduler's side of a
/// rank without shapes in a shaped step): under token weighting the scheduler refuses the step
/// with a typed `ScheduleError::Data` naming the rank and step before any launch, so no report
/// counts that micro-batch's work as 0 tokens (the replay counts such a rank's recorded tokens:
/// `sim::policies`' `a_rank_without_shapes_in_a_shaped_step_keeps_its_tokens`). One rank
/// (a peer would wait for its collective), M = 4, the even units without tokens.
#[test]
fn token_weighting_refuses_a_micro_batch_without_tokens_in_a_step() {
    let _g = serial(1);
    let rt = runtime();
    let id = Comm::unique_id(rt).unwrap();
    let dev = Device::acquire(rt, 0).unwrap();
    let comm = Comm::init_rank(&dev, 1, &id, 0, CommOptions::default()).unwrap();
    let c = cfg(4, Policy::Synchronous, Threshold::Off, DropHandling::Requeue);
    let ops = mock_recipes::gradient_ops(rt, c.gradient_len, c.grad_dtype).unwrap();
    let mut sched = Scheduler::new(comm, c, ops).unwrap();
    let mut work = BucketWork::new(rt, sched.stream());
    let mut data = Lengths { no_tokens_if_even: true, ..Lengths::new(40) };
    match sched.step(0, &mut data, &mut work) {
        Err(dropcompute::schedule::ScheduleError::Data { rank, step, what }) => {
            assert_eq!((rank, step), (0, 0));
            assert!(what.contains("token count"), "{what}");
        }
        other => panic!("refused with ScheduleError::Data, got {:?}", other.map(|(r, _)| r.step)),
    }
    assert!(work.launched.is_empty(), "nothing launched");
}
