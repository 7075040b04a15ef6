//! The one step walker, property: the scheduler (the `train` job on the CPU mock, virtual time,
//! in-process ranks) and the simulator (`sim::policies::replay_policy_on`) fed the same random
//! latencies make the same per-step, per-rank decisions (assignment, parts handed out, parts
//! started) and the same step times (within 0.5 %: the overhead after the compute phase is the
//! baseline's), for every step policy x tail shape x check it accepts x sync lag.
//!
//! The same latencies: the mock draws every micro-batch's latency from its key (seed, module,
//! step, micro-batch index), so a synchronous job with 2·M micro-batches per rank records the
//! latency of every micro-batch the policy run may launch (its slots are 2·M). The simulator
//! replays the job's own baseline (its M columns, as `train` predicts) and takes the latencies
//! beyond M from that record through `ReplayData::latency`, the data dealt by the run's stream
//! (`dropcompute::deal::ReplayStream`). A tail part costs the tail cost times its whole
//! micro-batch in the simulator; the mock draws a tail part's noise apart, so the tail-shape
//! rows run without noise (each rank its own random slowdown and the base latency random).
//!
//! The length-aware policies (`length-predictive`, `cost-balance`) run here on the digits job,
//! which has no length buckets: the walk is told none, the per-bucket estimator falls back to
//! the blind one and the deal is M each, so these rows check that their blind path is the
//! scheduler's. Their bucketed path (the walk told the buckets, the cost-balanced deal) is
//! checked scheduler against simulator on scripted lengths in `core/tests/scheduler_lengths.rs`
//! (a bucketed workload on the mock, one recipe per bucket); the `train` job gains such rows
//! with its text task.
#![cfg(all(feature = "mock", target_os = "linux"))] // the CPU mock device

use clap::Parser;
use rand::Rng;

use dropcompute::deal::ReplayStream;
use dropcompute::policy::{CheckMode, Policy, Threshold};
use dropcompute::sim::policies::{ReplayData, replay_policy_on};
use dropcompute::trace::LatencyTrace;
use dropcompute_train::job::{Job, RankOutcome};
use dropcompute_train::run as job_run;

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    train: dropcompute_cli::commands::train::Args,
}

/// Runs `train` with `argv` (after the subcommand) in this process: outcomes[rank][run].
fn run_job(argv: &[String]) -> (Job, Vec<Vec<RankOutcome>>) {
    let cli = Cli::try_parse_from(std::iter::once("train".to_owned()).chain(argv.iter().cloned()))
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let cfg = cli.train.validate().unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let job = Job::prepare(cfg).expect("job");
    let rt = job_run::mock_runtime(&job).expect("mock runtime");
    let out = job_run::run_threads(&job, &rt, false).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    job_run::check_lockstep(&out).expect("lockstep");
    (job, out)
}

/// The run's stream, and the latencies beyond the baseline's M from the 2·M record.
struct Scripted {
    stream: ReplayStream,
    wide: LatencyTrace,
}

impl ReplayData for Scripted {
    fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
        self.stream.deal(index, assignment)
    }

    fn settle(&mut self, started: &[u32]) {
        self.stream.settle(started);
    }

    fn latency(&self, index: usize, rank: usize, micro_batch: usize) -> Option<f64> {
        let w = self.wide.micro_batches();
        (index < self.wide.num_steps() && micro_batch < w).then(|| self.wide.step_matrix(index)[rank * w + micro_batch])
    }
}

#[test]
fn scheduler_and_simulator_decide_alike_on_random_latencies_for_every_policy_tail_check_and_lag() {
    let mut rng = dropcompute::sim::rng::stream(20_231_201, 0);
    let mut rows = 0;
    let mut dropping = 0;
    let mut moved = 0;
    let mut worst = 0.0f64;
    for policy in Policy::ALL {
        for split in [1u32, 2] {
            for check in ["before", "predictive"] {
                for lag in [0u32, 1] {
                    let given = if check == "before" { CheckMode::BeforeMicroBatch } else { CheckMode::Predictive };
                    if policy.resolve_check(Some(given), given).is_err() {
                        continue; // drop-before / drop-predictive refuse the other check
                    }
                    let (n, m, steps) = (rng.random_range(3..=4u32), 4u32, 10u32);
                    let seed: u64 = rng.random_range(0..1_000_000);
                    let slow = rng.random_range(1..n);
                    let factor: f64 = rng.random_range(1.5..2.5);
                    let base_ms: f64 = rng.random_range(5.0..15.0);
                    // The deadline between 0.5 and 1.2 of a fast rank's mean compute (reference
                    // noise: mean factor 1.5).
                    let mean_compute = f64::from(m) * base_ms * if split == 1 { 1.5 } else { 1.0 };
                    let threshold = mean_compute * rng.random_range(0.5..1.2);
                    let noise = if split == 1 { "reference" } else { "none" };
                    let common = |micro_batches: u32| -> Vec<String> {
                        let mut a = vec![
                            "--ranks".into(),
                            n.to_string(),
                            "--micro-batches".into(),
                            micro_batches.to_string(),
                            "--steps".into(),
                            steps.to_string(),
                            "--seed".into(),
                            seed.to_string(),
                            "--slow-rank".into(),
                            format!("{slow}:{factor:.3}"),
                            "--base-latency-ms".into(),
                            format!("{base_ms:.3}"),
                            "--noise".into(),
                            noise.into(),
                            "--hidden".into(),
                            "16".into(),
                            "--time-mode".into(),
                            "virtual".into(),
                        ];
                        a.extend(["--warmup-steps".into(), "1".into()]);
                        a
                    };
                    let mut argv = common(m);
                    argv.extend(["--policy", policy.name(), "--check", check].map(String::from));
                    argv.extend(["--sync-lag".into(), lag.to_string(), "--tail-split".into(), split.to_string()]);
                    argv.extend(["--compare".into(), "--threshold".into()]);
                    argv.push(if policy.has_deadline() { format!("{threshold:.3}") } else { "off".into() });
                    if policy == Policy::BackupWorkers {
                        argv.extend(["--backup-workers".into(), "1".into()]);
                    }
                    let what = format!("{policy} split {split} check {check} lag {lag}: {}", argv.join(" "));
                    let (job, out) = run_job(&argv);
                    let (base, dc) = (&out[0][0], &out[0][1]);
                    // The 2·M record of the same latencies (keyed draws: the same key, the same
                    // latency, whatever the run computes).
                    let mut wide_argv = common(2 * m);
                    wide_argv.extend(["--no-compare", "--threshold", "off"].map(String::from));
                    let (_, wide_out) = run_job(&wide_argv);
                    let wide =
                        dropcompute::schedule::auto::trace_of_reports(&wide_out[0][0].reports).expect("wide trace");
                    assert_eq!(wide.num_steps(), steps as usize, "{what}");

                    let trace = dropcompute::schedule::auto::trace_of_reports(&base.reports).expect("baseline trace");
                    let threshold = dc
                        .threshold_ns
                        .map_or(Threshold::Off, |t| Threshold::Fixed(std::time::Duration::from_nanos(t)));
                    let mut data = Scripted { stream: job.replay_stream(), wide };
                    let r = replay_policy_on(&trace, &job.policy_run(threshold), &mut data);
                    assert_eq!(r.drawn_latencies, 0, "{what}: every latency known");
                    assert_eq!(r.per_step.len(), dc.reports.len(), "{what}");
                    let n = n as usize;
                    for (s, rep) in dc.reports.iter().enumerate() {
                        let cells = s * n..(s + 1) * n;
                        let started: Vec<u32> = rep.ranks.iter().map(|x| x.computed).collect();
                        let handed: Vec<u32> = rep.ranks.iter().map(|x| x.computed + x.dropped).collect();
                        assert_eq!(&r.assigned[cells.clone()], &rep.assignment[..], "{what}: step {s} assignment");
                        assert_eq!(&r.handed[cells.clone()], &handed[..], "{what}: step {s} handed out");
                        assert_eq!(&r.started[cells], &started[..], "{what}: step {s} started");
                        let (p, mes) = (r.per_step[s].1, rep.step_ns as f64);
                        // The step's overhead is the baseline's (collective, rescale, update):
                        // a step that drops differs from it by tens of microseconds.
                        assert!((p / mes - 1.0).abs() < 5e-3, "{what}: step {s} time {p} vs {mes}");
                        worst = worst.max((p / mes - 1.0).abs());
                        dropping += usize::from(rep.global_dropped() > 0);
                        moved += usize::from(rep.assignment.iter().any(|&a| a != m * split));
                    }
                    rows += 1;
                }
            }
        }
    }
    // drop-before, drop-predictive, length-predictive and cost-balance each run one check: 5
    // policies x both checks + 4 x one.
    assert_eq!(rows, (5 * 2 + 4) * 2 * 2);
    eprintln!(
        "{rows} configurations: {dropping} steps dropping, {moved} with work moved, worst step time error {:.4} %",
        worst * 100.0
    );
    // The random deadlines and slow ranks make the runs decide: steps drop and work moves.
    assert!(dropping > 50 && moved > 50, "{dropping} steps dropping, {moved} with work moved");
}
