//! The length-aware policies measured on a scripted length-tailed trace (issue 26, item 5):
//! each policy tuned on the replay (`tune::policies::compare`, the rows of `tune --policy`)
//! under the default guardrails, on the same trace (paired), beside the mean-cost bound (every
//! rank given the step's mean cost) and the median straggler-free bound.
//!
//! The trace: N ranks x M = 8 micro-batches x 60 steps, no noise. Each micro-batch's padded
//! length is the bucket (64, 128, 256 or 512 tokens) of a Pareto draw (scale 32 tokens, shape
//! 1.2: P(L > 128) = 0.19, P(L > 256) = 0.08), its device time a·L + b·L² (a = 8000 ns per
//! token, b = 40 ns per token²: 0.68, 1.68, 4.67 and 14.6 ms), the step overhead 10 ms: all
//! straggling is the data's. The table printed is what README's length-aware table states
//! (`cargo test -p dropcompute --test length_policies -- --nocapture`; 25 s in the dev
//! profile on this 2-core machine). A second test writes such a trace as a compute log with the
//! `bucket` column and replays it from the file, as `simulate`/`tune --trace` read it.

use dropcompute::policy::{CheckMode, Policy, TailShape};
use dropcompute::sim::replay::ExecutionModel;
use dropcompute::trace::LatencyTrace;
use dropcompute::tune::Guardrails;
use dropcompute::tune::policies::{PolicyComparison, compare, mean_cost_bound_speedup, straggler_free_speedup};
use dropcompute::tune::recommend::Recommend;
use rand::Rng;

/// Bucket lengths (tokens).
const BUCKETS: [f64; 4] = [64.0, 128.0, 256.0, 512.0];
/// Linear cost per token (ns).
const A_NS: f64 = 8_000.0;
/// Quadratic (attention) cost per token² (ns).
const B_NS: f64 = 40.0;

/// The scripted length-tailed trace (module doc) with its buckets.
fn length_trace(n: usize, m: usize, steps: usize, seed: u64) -> LatencyTrace {
    let mut g = dropcompute::sim::rng::stream(seed, 0);
    let cells = n * m * steps;
    let mut buckets = Vec::with_capacity(cells);
    let mut lat = Vec::with_capacity(cells);
    for _ in 0..cells {
        let u: f64 = g.random_range(0.0..1.0);
        let len = 32.0 * (1.0 - u).powf(-1.0 / 1.2);
        let b = BUCKETS.iter().position(|&l| len <= l).unwrap_or(BUCKETS.len() - 1);
        let l = BUCKETS[b];
        buckets.push(b as u32);
        lat.push(A_NS * l + B_NS * l * l);
    }
    LatencyTrace::new(
        format!("lengths n{n}"),
        (0..n as u32).collect(),
        (0..steps as u64).collect(),
        m,
        lat,
        vec![10e6; steps],
    )
    .and_then(|t| t.with_buckets(buckets))
    .expect("valid trace")
}

fn row(c: &PolicyComparison, p: Policy) -> &dropcompute::tune::policies::PolicyOutcome {
    c.rows.iter().find(|r| r.policy == p).expect("row")
}

#[test]
fn length_aware_policies_beat_blind_dropping_and_rebalancing_on_data_stragglers() {
    let policies = [
        Policy::Synchronous,
        Policy::DropPredictive,
        Policy::Rebalance,
        Policy::RebalanceDrop,
        Policy::LengthPredictive,
        Policy::CostBalance,
    ];
    for n in [16usize, 32] {
        let t = length_trace(n, 8, 60, 26);
        let how = Recommend {
            execution: ExecutionModel {
                check: CheckMode::Predictive,
                sync_lag: 0,
                warmup_steps: t.warmup_end(3),
                min_micro_batches: 1,
                drop_guard: None,
            },
            guardrails: Guardrails::default(),
        };
        let c = compare(&t, &how, &policies, TailShape::default(), 1);
        let bound = mean_cost_bound_speedup(&t);
        eprintln!(
            "N = {n}, M = 8: mean-cost bound {:+.2} %, median straggler-free bound {:+.2} %",
            bound * 100.0,
            straggler_free_speedup(&t) * 100.0
        );
        eprintln!("| policy | speedup | of the bound's gain | drop rate | threshold ms |");
        for r in &c.rows {
            eprintln!(
                "| {} | {:+.2} % | {:.0} % | {:.2} % | {} |",
                r.policy,
                r.effective_speedup * 100.0,
                r.effective_speedup / bound * 100.0,
                r.drop_rate * 100.0,
                r.threshold_ms.map_or("-".into(), |t| format!("{t:.2}"))
            );
        }
        let s = |p| row(&c, p).effective_speedup;
        for p in policies {
            assert!(row(&c, p).drop_rate <= 0.10 + 1e-12, "N {n} {p}: the guardrail");
        }
        // Measured (module doc, 2026-12-02): cost-balance +73.8 % (N 16) and +85.6 % (N 32),
        // 95 % of the mean-cost bound's gain both; length-predictive +37.2 % / +45.8 %;
        // drop-predictive +12.4 % / +16.3 %; rebalance -2.2 % / -3.4 %; rebalance-drop
        // +10.7 % / +14.0 %. Asserted with margins: cost-balance reaches 90 % of the bound's
        // gain (issue 26's target) and beats blind dropping and rebalancing by 30 points; the
        // bucket-aware check beats the blind one by 10.
        assert!(s(Policy::CostBalance) >= 0.9 * bound, "N {n}: {} of {bound}", s(Policy::CostBalance));
        for blind in [Policy::DropPredictive, Policy::Rebalance, Policy::RebalanceDrop] {
            assert!(s(Policy::CostBalance) > s(blind) + 0.30, "N {n}: cost-balance vs {blind}");
        }
        assert!(s(Policy::LengthPredictive) > s(Policy::DropPredictive) + 0.10, "N {n}");
        // Balancing without dropping cannot beat the mean-cost bound (a rounding margin).
        assert!(s(Policy::CostBalance) <= bound + 0.01, "N {n}");
    }
}

/// The length-carrying trace through a file: the scripted trace written as our compute log
/// with the `bucket` column loads back (`trace::load`, what `simulate`/`tune --trace` read) with
/// the same latencies and buckets, and cost-balance deals it as it deals the trace in memory.
#[test]
fn a_compute_log_with_buckets_replays_the_length_aware_policies() {
    use dropcompute::policy::{StepPolicy, Threshold};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    use dropcompute::trace::compute_log::{ComputeLogRecord, ComputeLogWriter};
    let (n, m, steps) = (4usize, 8usize, 10usize);
    let t = length_trace(n, m, steps, 7);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("compute_log_baseline.csv");
    let mut w = ComputeLogWriter::new(std::fs::File::create(&path).expect("create"));
    let buckets = t.buckets().expect("buckets");
    for s in 0..steps {
        for r in 0..n {
            // One second per step: the loader derives the overhead from the period.
            let mut start = s as u64 * 1_000_000_000;
            for j in 0..m {
                let k = (s * n + r) * m + j;
                let dur = t.latencies_ns()[k] as u64;
                w.write(&ComputeLogRecord {
                    global_step: s as u64,
                    local_step: j as u32,
                    world_size: n as u32,
                    batch: 4,
                    computed_batch: 4 * (j as u64 + 1),
                    iteration_time_ms: dur as f64 / 1e6,
                    rank: r as u32,
                    start_ns: start,
                    duration_ns: dur,
                    micro_batches: m as u32,
                    bucket: Some(buckets[k]),
                    ..ComputeLogRecord::default()
                })
                .expect("write");
                start += dur;
            }
        }
    }
    w.flush().expect("flush");
    drop(w);
    let loaded = dropcompute::trace::load(&[path], &Default::default()).expect("load");
    let back = &loaded[0].trace;
    assert_eq!(back.latencies_ns(), t.latencies_ns());
    assert_eq!(back.buckets(), t.buckets());
    let run = PolicyRun::new(
        StepPolicy::new(Policy::CostBalance),
        Threshold::Off,
        ExecutionModel {
            check: CheckMode::Predictive,
            sync_lag: 0,
            warmup_steps: 0,
            min_micro_batches: 1,
            drop_guard: None,
        },
    );
    let (a, b) = (replay_policy(back, &run), replay_policy(&t, &run));
    assert_eq!(a.assigned, b.assigned);
    assert_eq!(a.compute_ns, b.compute_ns);
    assert!(a.assigned.iter().any(|&x| x != m as u32), "the deal moved micro-batches");
}

/// Cost-balance's step 0 with the padded length prior (`policy::BucketTokens` in the step
/// policy): no bucket is measured yet, so without the prior every micro-batch costs the same and
/// the deal is the blind one (contiguous slices); with it the micro-batches are dealt longest
/// first by padded tokens. No deadline (nothing dropped), so a step's time is its slowest
/// rank's sum of latencies plus the overhead: step 0 with the prior equals that of the deal by
/// padded tokens (each rank's load summed here from the trace's latencies), and is below the
/// blind deal's.
#[test]
fn cost_balance_deals_step_zero_by_padded_length_with_the_prior() {
    use dropcompute::policy::{BucketTokens, StepPolicy, Threshold, cost_balance};
    use dropcompute::sim::policies::{PolicyRun, replay_policy};
    let (n, m) = (16, 8);
    let trace = length_trace(n, m, 3, 11);
    let exec = ExecutionModel { check: CheckMode::Predictive, warmup_steps: 0, ..ExecutionModel::default() };
    let tokens: Vec<u64> = BUCKETS.iter().map(|&l| 2 * l as u64).collect(); // 2 documents per micro-batch
    let run = |prior: BucketTokens| {
        let params = StepPolicy { bucket_tokens: prior, ..StepPolicy::new(Policy::CostBalance) };
        replay_policy(&trace, &PolicyRun::new(params, Threshold::Off, exec))
    };
    let (with, blind) = (run(BucketTokens::new(&tokens).unwrap()), run(BucketTokens::default()));
    let lat = trace.step_matrix(0);
    let b = trace.step_buckets(0).unwrap();
    let load = |deal: &[Vec<usize>]| deal.iter().map(|c| c.iter().map(|&k| lat[k]).sum::<f64>()).fold(0.0, f64::max);
    let costs: Vec<f64> = b.iter().map(|&x| tokens[x as usize] as f64).collect();
    let by_length = load(&cost_balance(&costs, n, 2 * m)) + 10e6;
    let contiguous = load(&(0..n).map(|r| (r * m..(r + 1) * m).collect::<Vec<_>>()).collect::<Vec<_>>()) + 10e6;
    assert!((with.per_step[0].1 - by_length).abs() <= 1e-6 * by_length, "{} vs {by_length}", with.per_step[0].1);
    assert!((blind.per_step[0].1 - contiguous).abs() <= 1e-6 * contiguous, "{} vs {contiguous}", blind.per_step[0].1);
    assert!(with.per_step[0].1 < blind.per_step[0].1, "{} vs {}", with.per_step[0].1, blind.per_step[0].1);
}
