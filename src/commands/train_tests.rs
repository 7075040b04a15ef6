//! Tests of `commands::train`: every flag through the real clap parser, good and bad values.

use super::*;
use clap::Parser;

/// Stand-in for the binary's parser: a global `-v` counter and `train` as a subcommand, as in
/// `Cli`, so that a clash between `Args` and the global flags would show here.
#[derive(Debug, Parser)]
struct TestCli {
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: TestCmd,
}

#[derive(Debug, clap::Subcommand)]
enum TestCmd {
    Train(Args),
}

fn parse(extra: &[&str]) -> (u8, Args) {
    let argv = ["dropcompute", "train"].iter().chain(extra.iter());
    let cli = TestCli::try_parse_from(argv).unwrap_or_else(|e| panic!("clap rejected {extra:?}: {e}"));
    let TestCmd::Train(a) = cli.cmd;
    (cli.verbose, a)
}

fn config(extra: &[&str]) -> TrainConfig {
    parse(extra).1.validate().unwrap_or_else(|e| panic!("{extra:?} rejected: {e}"))
}

#[test]
fn defaults_match_the_documented_surface() {
    let c = config(&[]);
    assert_eq!((c.ranks, c.micro_batches, c.micro_batch_size), (32, 8, 8));
    assert_eq!(c.global_batch, 32 * 8 * 8);
    assert_eq!(c.threshold, ThresholdArg::Auto);
    assert_eq!(c.length, RunLength::Steps(60));
    assert_eq!(c.seed, 0);
    assert_eq!(c.launch, Launch::Threads);
    assert!(c.compare);
    assert_eq!(c.noise, Noise::Reference { delay_factor: 1.0 });
    assert!(c.slow_ranks.is_empty());
    assert_eq!(c.base_latency, Duration::from_millis(12));
    assert_eq!(c.check, CheckMode::Predictive);
    assert_eq!(c.sync_lag, 0);
    assert_eq!(c.normalization, Normalization::Realized);
    assert_eq!(c.bucket_bytes, 4 << 20);
    assert_eq!((c.lr, c.momentum, c.hidden, c.holdout), (0.2, 0.9, 128, 0.2));
    assert_eq!(c.warmup_steps, 3);
    assert_eq!(c.checkpoint_every, None);
    assert_eq!(c.time_mode, TimeMode::Real);
    assert_eq!((c.data, c.out, c.resume), (None, None, None));
    // One set of guardrail defaults for `train --threshold auto` and `tune`.
    assert_eq!(c.guardrails, dropcompute::tune::Guardrails::default());
    assert_eq!(
        c.guardrails,
        dropcompute::tune::Guardrails { max_drop_rate: 0.10, min_batch_fraction: 0.75, min_gain: 0.02, jitter_ns: 0.0 }
    );
}

/// Each task's defaults of the flags whose default depends on `--task` (`--ranks`,
/// `--micro-batch-size`, `--noise`, `--time-mode`, `--policy`, `--lr`), and that a flag given
/// wins over the task's default for both tasks.
#[test]
fn each_task_has_its_documented_defaults_and_a_given_flag_wins() {
    use dropcompute::policy::Policy;
    let digits = config(&[]);
    let text = config(&["--task", "text"]);
    let row = |c: &TrainConfig| (c.ranks, c.micro_batch_size, c.noise.clone(), c.time_mode, c.policy(), c.lr);
    assert_eq!(
        row(&digits),
        (32, 8, Noise::Reference { delay_factor: 1.0 }, TimeMode::Real, Policy::DropPredictive, 0.2)
    );
    assert_eq!(row(&text), (16, 2, Noise::None, TimeMode::Virtual, Policy::CostBalance, 3e-3));
    for task in ["digits", "text"] {
        let c = config(&[
            "--task",
            task,
            "--ranks",
            "4",
            "--micro-batch-size",
            "3",
            "--noise",
            "lognormal:0.5",
            "--time-mode",
            "real",
            "--policy",
            "rebalance",
            "--lr",
            "0.01",
        ]);
        assert_eq!(
            row(&c),
            (4, 3, Noise::LogNormal { mu: -0.125, sigma: 0.5 }, TimeMode::Real, Policy::Rebalance, 0.01),
            "{task}"
        );
    }
    // The digits' default policy follows a given --check; the text task's (cost-balance, the
    // predictive check) refuses the before-check, naming the default and what to give.
    let before = config(&["--check", "before"]);
    assert_eq!((before.policy(), before.check), (Policy::DropBefore, CheckMode::BeforeMicroBatch));
    let e = parse(&["--task", "text", "--check", "before"]).1.validate().expect_err("refused").to_string();
    assert!(e.contains("text task's default policy cost-balance") && e.contains("drop-before"), "{e}");
    let c = config(&["--task", "text", "--check", "before", "--policy", "drop-before"]);
    assert_eq!((c.policy(), c.check), (Policy::DropBefore, CheckMode::BeforeMicroBatch));
}

/// The guardrail flags are one definition (`commands::GuardrailArgs`) in `train`, `tune` and
/// `simulate`: the same names and defaults, and `--drop-guard` refused alike by every command
/// outside (0, 1] (the guard's own check, `policy::DropGuard::check`).
#[test]
fn train_tune_and_simulate_share_the_guardrail_flags() {
    use clap::CommandFactory;
    #[derive(clap::Parser)]
    struct Tune {
        #[command(flatten)]
        a: crate::commands::tune::Args,
    }
    #[derive(clap::Parser)]
    struct Simulate {
        #[command(flatten)]
        a: crate::commands::simulate::Args,
    }
    const NAMES: [&str; 5] = ["max-drop-rate", "min-batch-fraction", "min-gain", "drop-guard", "jitter-ms"];
    let flags = |cmd: clap::Command| -> Vec<(String, Option<String>)> {
        cmd.get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| NAMES.contains(&l)))
            .map(|a| {
                (
                    a.get_long().unwrap_or_default().to_owned(),
                    a.get_default_values().first().map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect()
    };
    let (train, tune) = (flags(TestCli::command().find_subcommand("train").cloned().unwrap()), flags(Tune::command()));
    assert_eq!(train.len(), 5);
    assert_eq!(train, tune);
    assert_eq!(train, flags(Simulate::command()));
    // Every command refuses a guard outside (0, 1] and a jitter below 0, NaN or infinite,
    // naming the flag and the value.
    let refusals = [
        ("--drop-guard", ["0", "1.5", "-0.1", "nan", "inf"], "must be a fraction in (0, 1]"),
        ("--jitter-ms", ["-1", "-0.001", "nan", "inf", "1e309"], "must be a finite number of ms >= 0"),
    ];
    for (flag, bads, why) in refusals {
        for bad in bads {
            let train_e = parse(&[flag, bad]).1.validate().expect_err(bad).to_string();
            let tune_args = <Tune as clap::Parser>::try_parse_from(["tune", "--trace", "t.csv", flag, bad]).unwrap().a;
            let tune_e = crate::commands::tune::run_to(&tune_args, &mut Vec::new()).expect_err(bad).to_string();
            let sim_args =
                <Simulate as clap::Parser>::try_parse_from(["simulate", "--policy", "all", flag, bad]).unwrap().a;
            let sim_e = crate::commands::simulate::run_to(&sim_args, &mut Vec::new()).expect_err(bad).to_string();
            for e in [&train_e, &tune_e, &sim_e] {
                assert!(e.contains(&format!("{flag} ")) && e.contains(why), "{flag} {bad}: {e}");
            }
        }
    }
    // The sweep picks no threshold: a jitter window is refused there, not ignored (the policy
    // comparisons and tune's recommendation take it: tests/tune_traces.rs).
    let a = <Simulate as clap::Parser>::try_parse_from(["simulate", "--jitter-ms", "1"]).unwrap().a;
    let e = crate::commands::simulate::run_to(&a, &mut Vec::new()).expect_err("refused").to_string();
    assert!(e.contains("--jitter-ms 1") && e.contains("threshold sweep"), "{e}");
    // simulate's threshold sweep has no run to guard: refused, not ignored.
    let sweep = <Simulate as clap::Parser>::try_parse_from(["simulate", "--drop-guard", "0.1"]).unwrap().a;
    let e = crate::commands::simulate::run_to(&sweep, &mut Vec::new()).expect_err("refused").to_string();
    assert!(e.contains("--drop-guard 0.1") && e.contains("--policy or --trace"), "{e}");
    let e = parse(&["--steps", "12"]).1.validate().unwrap_err().to_string();
    assert!(e.contains("insufficient data") && e.contains("10"), "{e}");
}

#[test]
fn good_values_are_parsed_into_the_config() {
    let p = PathBuf::from;
    type Check = fn(&TrainConfig) -> bool;
    let table: &[(&[&str], Check)] = &[
        (&["--ranks", "1"], |c| c.ranks == 1 && c.global_batch == 64),
        (&["--ranks", "1024"], |c| c.ranks == 1024),
        (&["--micro-batches", "3"], |c| c.micro_batches == 3 && c.global_batch == 32 * 3 * 8),
        (&["--micro-batch-size", "5"], |c| c.micro_batch_size == 5 && c.global_batch == 32 * 8 * 5),
        (&["--threshold", "off"], |c| c.threshold == ThresholdArg::Off && c.threshold.fixed().is_none()),
        (&["--threshold", "AUTO"], |c| c.threshold == ThresholdArg::Auto),
        (&["--threshold", "12.5"], |c| c.threshold.fixed() == Some(Duration::from_micros(12_500))),
        (&["--steps", "7", "--threshold", "20"], |c| c.length == RunLength::Steps(7)),
        (&["--steps", "13"], |c| c.length == RunLength::Steps(13) && c.threshold == ThresholdArg::Auto),
        (&["--steps", "5", "--no-compare"], |c| c.length == RunLength::Steps(5)),
        (&["--steps", "10", "--warmup-steps", "0"], |c| c.length == RunLength::Steps(10)),
        (&["--max-drop-rate", "0.25"], |c| c.guardrails.max_drop_rate == 0.25),
        (&["--min-batch-fraction", "0"], |c| c.guardrails.min_batch_fraction == 0.0),
        (&["--min-gain", "0.05"], |c| c.guardrails.min_gain == 0.05),
        (&["--epochs", "2"], |c| c.length == RunLength::Epochs(2)),
        (&["--seed", "42"], |c| c.seed == 42),
        (&["--launch", "threads"], |c| c.launch == Launch::Threads),
        (&["--launch", "processes"], |c| c.launch == Launch::Processes),
        (&["--launch", "env"], |c| c.launch == Launch::Env),
        (&["--no-compare"], |c| !c.compare),
        (&["--no-compare", "--compare"], |c| c.compare),
        (&["--compare", "--no-compare"], |c| !c.compare),
        (&["--noise", "none"], |c| c.noise == Noise::None),
        (&["--noise", "reference"], |c| c.noise == Noise::Reference { delay_factor: 1.0 }),
        (&["--noise", "reference:0"], |c| c.noise == Noise::Reference { delay_factor: 0.0 }),
        (&["--noise", "reference:2.5"], |c| c.noise == Noise::Reference { delay_factor: 2.5 }),
        (&["--noise", "lognormal:0.5"], |c| c.noise == Noise::LogNormal { mu: -0.125, sigma: 0.5 }),
        (&["--noise", "exponential:0.25"], |c| c.noise == Noise::Exponential { mean: 0.25 }),
        (&["--noise", "normal:0.2"], |c| c.noise == Noise::Normal { cv: 0.2 }),
        (&["--noise", "seqlen:4"], |c| c.noise == Noise::SeqLen { samples: 4 }),
        (&["--slow-rank", "3:2.5", "--slow-rank", "0:1.5"], |c| {
            c.slow_ranks == [SlowRank { rank: 3, factor: 2.5 }, SlowRank { rank: 0, factor: 1.5 }]
        }),
        (&["--ranks", "4", "--slow-rank", "3:2"], |c| c.slow_ranks == [SlowRank { rank: 3, factor: 2.0 }]),
        (&["--base-latency-ms", "0.25"], |c| c.base_latency == Duration::from_micros(250)),
        (&["--check", "before"], |c| c.check == CheckMode::BeforeMicroBatch),
        (&["--check", "predictive"], |c| c.check == CheckMode::Predictive),
        (&["--sync-lag", "7"], |c| c.sync_lag == 7),
        (&["--normalization", "nominal"], |c| c.normalization == Normalization::Nominal),
        (&["--normalization", "realized"], |c| c.normalization == Normalization::Realized),
        (&["--bucket-mb", "0.5"], |c| c.bucket_bytes == 524_288),
        (&["--lr", "0.01"], |c| c.lr == 0.01),
        (&["--momentum", "0"], |c| c.momentum == 0.0),
        (&["--hidden", "1"], |c| c.hidden == 1),
        (&["--holdout", "0.5"], |c| c.holdout == 0.5),
        (&["--warmup-steps", "0"], |c| c.warmup_steps == 0),
        (&["--checkpoint-every", "10"], |c| c.checkpoint_every.map(NonZeroU64::get) == Some(10)),
        (&["--time-mode", "virtual"], |c| c.time_mode == TimeMode::Virtual),
        (&["--time-mode", "real"], |c| c.time_mode == TimeMode::Real),
        (&["--tail-split", "4"], |c| c.tail == dropcompute::policy::TailShape::split(4)),
        (&["--tail-split", "2", "--tail-cost", "0.6"], |c| {
            c.tail == dropcompute::policy::TailShape { split: 2, cost: Some(0.6) }
        }),
        (&[], |c| c.tail == dropcompute::policy::TailShape::default()),
        (&[], |c| c.drop_guard.is_none()),
        (&["--drop-guard", "0.1"], |c| c.drop_guard == Some(0.1)),
    ];
    for (argv, check) in table {
        assert!(check(&config(argv)), "{argv:?}");
    }
    let c = config(&["--data", "d.csv", "--out", "o", "--resume", "r"]);
    assert_eq!((c.data, c.out, c.resume), (Some(p("d.csv")), Some(p("o")), Some(p("r"))));
}

#[test]
fn bad_values_name_the_flag_and_the_value() {
    // (argv, flag, value as it must appear in the message)
    let table: &[(&[&str], &str, &str)] = &[
        (&["--ranks", "0"], "ranks", "0"),
        (&["--ranks", "1025"], "ranks", "1025"),
        (&["--micro-batches", "0"], "micro-batches", "0"),
        (&["--micro-batch-size", "0"], "micro-batch-size", "0"),
        (&["--micro-batches", "4294967295"], "micro-batches", "4294967295"),
        (&["--micro-batches", "65537"], "micro-batches", "65537"),
        (&["--micro-batch-size", "4294967295"], "micro-batch-size", "4294967295"),
        (&["--micro-batch-size", "65537"], "micro-batch-size", "65537"),
        (&["--threshold", "-3"], "threshold", "-3"),
        (&["--threshold", "0"], "threshold", "0"),
        (&["--threshold", "NaN"], "threshold", "NaN"),
        (&["--threshold", "inf"], "threshold", "inf"),
        (&["--threshold", "fast"], "threshold", "fast"),
        (&["--threshold", "1e9"], "threshold", "1e9"),
        (&["--steps", "0"], "steps", "0"),
        (&["--epochs", "0"], "epochs", "0"),
        (&["--slow-rank", "99:2"], "slow-rank", "99:2"),
        (&["--ranks", "4", "--slow-rank", "4:2"], "slow-rank", "4:2"),
        (&["--slow-rank", "1:0"], "slow-rank", "1:0"),
        (&["--slow-rank", "1:-2"], "slow-rank", "1:-2"),
        (&["--slow-rank", "1:inf"], "slow-rank", "1:inf"),
        (&["--slow-rank", "1:2e6"], "slow-rank", "1:2e6"),
        (&["--slow-rank", "x:2"], "slow-rank", "x:2"),
        (&["--slow-rank", "3"], "slow-rank", "3"),
        (&["--slow-rank", "1:2", "--slow-rank", "1:3"], "slow-rank", "1:3"),
        (&["--base-latency-ms", "0"], "base-latency-ms", "0"),
        (&["--base-latency-ms", "-2"], "base-latency-ms", "-2"),
        (&["--base-latency-ms", "inf"], "base-latency-ms", "inf"),
        (&["--base-latency-ms", "1e300"], "base-latency-ms", "1e300"),
        (&["--sync-lag", "8"], "sync-lag", "8"),
        (&["--micro-batches", "2", "--sync-lag", "5"], "sync-lag", "5"),
        (&["--bucket-mb", "0"], "bucket-mb", "0"),
        (&["--bucket-mb", "1e-9"], "bucket-mb", "1e-9"),
        (&["--bucket-mb", "1e12"], "bucket-mb", "1e12"),
        (&["--bucket-mb", "NaN"], "bucket-mb", "NaN"),
        (&["--lr", "0"], "lr", "0"),
        (&["--lr", "-0.1"], "lr", "-0.1"),
        (&["--lr", "inf"], "lr", "inf"),
        (&["--momentum", "1"], "momentum", "1"),
        (&["--momentum", "-0.5"], "momentum", "-0.5"),
        (&["--momentum", "NaN"], "momentum", "NaN"),
        (&["--hidden", "0"], "hidden", "0"),
        (&["--hidden", "16385"], "hidden", "16385"),
        (&["--holdout", "0"], "holdout", "0"),
        (&["--holdout", "1"], "holdout", "1"),
        (&["--holdout", "NaN"], "holdout", "NaN"),
        (&["--max-drop-rate", "1.5"], "max-drop-rate", "1.5"),
        (&["--max-drop-rate", "NaN"], "max-drop-rate", "NaN"),
        (&["--min-batch-fraction", "-0.1"], "min-batch-fraction", "-0.1"),
        (&["--min-gain", "inf"], "min-gain", "inf"),
        (&["--jitter-ms", "-1"], "jitter-ms", "-1"),
        (&["--jitter-ms", "NaN"], "jitter-ms", "NaN"),
        // `--threshold auto` tunes on the baseline after warm-up: at least tune::MIN_STEPS.
        (&["--steps", "12"], "steps", "12"),
        (&["--steps", "20", "--warmup-steps", "11"], "steps", "20"),
        (&["--tail-split", "0"], "tail-split", "0"),
        (&["--tail-split", "65"], "tail-split", "65"),
        (&["--tail-split", "3"], "tail-split", "3"), // does not divide the default b = 16
        (&["--micro-batch-size", "6", "--tail-split", "4"], "tail-split", "4"),
        (&["--tail-split", "2", "--tail-cost", "0"], "tail-cost", "0"),
        (&["--tail-split", "2", "--tail-cost", "1.5"], "tail-cost", "1.5"),
        (&["--tail-split", "2", "--tail-cost", "NaN"], "tail-cost", "NaN"),
        (&["--tail-cost", "0.5"], "tail-cost", "0.5"), // no tail shape
        (&["--drop-guard", "0"], "drop-guard", "0"),
        (&["--drop-guard", "1.5"], "drop-guard", "1.5"),
        (&["--drop-guard", "NaN"], "drop-guard", "NaN"),
        (&["--task", "text", "--drop-guard", "0.1"], "drop-guard", "0.1"), // counts tokens
    ];
    for (argv, flag, value) in table {
        let err = parse(argv).1.validate().expect_err(&format!("{argv:?} accepted"));
        assert_eq!(err.flag, *flag, "{argv:?}: {err}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("--{flag} {value}:")), "{argv:?}: {msg}");
    }
}

#[test]
fn clap_rejects_what_it_owns() {
    // Unknown enum values, bad --noise specs, non-numbers for integer flags, the removed
    // --delay-factor and --steps with --epochs never reach validate(): clap's error names the
    // flag (and, for a value, the value).
    for argv in [
        &["--noise", "gaussian"][..],
        &["--noise", "lognormal:-1"],
        &["--noise", "lognormal:nan"],
        &["--noise", "lognormal:5"],
        &["--noise", "exponential:"],
        &["--noise", "exponential:1e300"],
        &["--noise", "none:1"],
        &["--noise", "reference:-1"],
        &["--noise", "reference:101"],
        &["--delay-factor", "2"],
        &["--launch", "mpi"],
        &["--check", "after"],
        &["--normalization", "mean"],
        &["--time-mode", "fast"],
        &["--ranks", "-1"],
        &["--micro-batches", "-2"],
        &["--seed", "-1"],
        &["--ranks", "many"],
        &["--sync-lag", "-1"],
        &["--steps", "5", "--epochs", "1"],
    ] {
        let argv_full = ["dropcompute", "train"].iter().chain(argv.iter());
        let err = TestCli::try_parse_from(argv_full).expect_err(&format!("{argv:?} accepted"));
        assert_eq!(err.exit_code(), 2, "{argv:?}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(argv[0]), "{argv:?}: {msg}");
        if argv[0] != "--delay-factor" && argv[0] != "--steps" {
            assert!(msg.contains(&format!("'{}'", argv[1])), "{argv:?}: {msg}");
        }
    }
}

#[test]
fn global_verbose_reaches_train() {
    let (v, a) = parse(&["-vv", "--ranks", "2"]);
    assert_eq!((v, a.ranks), (2, Some(2)));
    let (v, _) = parse(&["--verbose"]);
    assert_eq!(v, 1);
}

#[test]
fn threshold_keywords_are_case_insensitive_and_trimmed() {
    assert_eq!(ThresholdArg::parse(" Off "), Ok(ThresholdArg::Off));
    assert_eq!(ThresholdArg::parse("3600000"), Ok(ThresholdArg::Ms(3_600_000.0)));
    assert_eq!(ThresholdArg::Ms(f64::INFINITY).fixed(), None);
}

/// Each enum flag's accepted names are exactly the documented ones (README's flag table), in
/// this order, and each parses to the core type's variant.
#[test]
fn enum_flags_accept_exactly_their_documented_names() {
    use clap::ValueEnum;
    fn names<T: ValueEnum>() -> Vec<String> {
        T::value_variants().iter().filter_map(|v| v.to_possible_value()).map(|p| p.get_name().to_owned()).collect()
    }
    assert_eq!(names::<CheckMode>(), ["before", "predictive"]);
    assert_eq!(names::<Normalization>(), ["realized", "nominal"]);
    assert_eq!(names::<Launch>(), ["threads", "processes", "env"]);
    assert_eq!(names::<TimeMode>(), ["real", "virtual"]);
    assert_eq!(CheckMode::from_str("before", false), Ok(CheckMode::BeforeMicroBatch));
    assert_eq!(Normalization::from_str("nominal", false), Ok(Normalization::Nominal));
    assert_eq!(Launch::from_str("env", false), Ok(Launch::Env));
    assert_eq!(TimeMode::from_str("virtual", false), Ok(TimeMode::Virtual));
}

/// `--noise reference:2.5` (the former `--delay-factor 2.5`) reaches the mock device unchanged.
#[test]
fn reference_noise_with_a_delay_factor_reaches_the_jobs_mock_config() {
    let job = dropcompute_train::job::Job::prepare(config(&["--ranks", "2", "--noise", "reference:2.5"])).expect("job");
    assert_eq!(job.mock_config().expect("mock config").noise, Noise::Reference { delay_factor: 2.5 });
}

/// `--classes` describes `--data`: with the built-in digits (10 classes) another value is
/// refused naming the flag, never silently ignored; 10 (the default) and any value with
/// `--data` pass.
#[test]
fn classes_without_data_is_refused_unless_it_matches_the_digits() {
    let e = parse(&["--classes", "5"]).1.validate().unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("--classes") && text.contains("5") && text.contains("built-in digits have 10 classes"),
        "{text}"
    );
    assert_eq!(config(&["--classes", "10"]).classes, 10);
    assert_eq!(config(&["--classes", "5", "--data", "x.csv"]).classes, 5);
}

#[test]
fn a_real_device_refuses_every_emulation_flag_given_and_accepts_their_defaults() {
    use dropcompute_train::job::Job;
    let lib = "Synapse at /opt/habanalabs/libSynapse.so";
    let job = |extra: &[&str]| Job::prepare(config(extra)).expect("job");
    assert!(job(&[]).check_real_device(lib).is_ok(), "defaults are inert on a real device");
    assert!(job(&["--base-latency-ms", "12", "--noise", "reference"]).check_real_device(lib).is_ok());
    for (flags, named) in [
        (&["--base-latency-ms", "3"][..], "--base-latency-ms"),
        (&["--noise", "none"][..], "--noise"),
        (&["--slow-rank", "1:2"][..], "--slow-rank"),
        (&["--time-mode", "virtual"][..], "--time-mode virtual"),
    ] {
        let e = job(flags).check_real_device(lib).expect_err("refused").to_string();
        assert!(e.contains(named) && e.contains(lib), "{flags:?}: {e}");
    }
    let e = job(&["--noise", "none", "--slow-rank", "1:2"]).check_real_device(lib).expect_err("refused").to_string();
    assert!(e.contains("--noise, --slow-rank"), "every flag given is named: {e}");
    // The text task: its default noise (none) is inert; its default virtual time is named with
    // what to give, and `--time-mode real` runs; the digits' default noise is a given noise there.
    let text = |extra: &[&str]| job(&[&["--task", "text"][..], extra].concat());
    let e = text(&[]).check_real_device(lib).expect_err("virtual refused").to_string();
    assert!(e.contains("give --time-mode real") && !e.contains("--noise"), "{e}");
    assert!(text(&["--time-mode", "real"]).check_real_device(lib).is_ok());
    let e =
        text(&["--time-mode", "real", "--noise", "reference"]).check_real_device(lib).expect_err("noise").to_string();
    assert!(e.contains("--noise"), "{e}");
}

#[test]
fn the_checkpoint_fingerprint_names_the_step_policy_and_b() {
    use dropcompute_train::job::Job;
    let fp = |extra: &[&str]| Job::prepare(config(extra)).expect("job").fingerprint();
    // DropCompute of the configured check: the check names it (old checkpoints still resume).
    assert_eq!(fp(&[]), fp(&["--policy", "drop-predictive"]));
    assert_eq!(fp(&["--check", "before"]), fp(&["--policy", "drop-before"]));
    assert!(!fp(&[]).contains("policy="), "{}", fp(&[]));
    let others = ["synchronous", "compute-budget", "rebalance", "rebalance-drop", "backup-workers"];
    let mut seen = std::collections::BTreeSet::from([fp(&[]), fp(&["--check", "before"])]);
    for p in others {
        let f = fp(&["--policy", p, "--ranks", "4"]);
        assert!(f.contains(&format!("policy={p}")), "{p}: {f}");
        assert!(seen.insert(f.clone()), "{p}: fingerprint not unique: {f}");
    }
    let b = |n: &str| fp(&["--policy", "backup-workers", "--ranks", "4", "--backup-workers", n]);
    assert_ne!(b("1"), b("2"), "b is part of the fingerprint");
    // The tail shape (split and cost) too; split 1 leaves the fingerprint as it was.
    let t = |x: &[&str]| fp(&[&["--policy", "rebalance-drop", "--ranks", "4"], x].concat());
    assert_eq!(t(&[]), t(&["--tail-split", "1"]));
    assert!(t(&["--tail-split", "2"]).ends_with(" tail=2:0.5"), "{}", t(&["--tail-split", "2"]));
    assert_ne!(t(&["--tail-split", "2"]), t(&["--tail-split", "2", "--tail-cost", "0.6"]));
    // The drop-rate guard (its counts are in the checkpoint); none leaves it as it was.
    assert!(fp(&["--drop-guard", "0.1"]).ends_with(" drop_guard=0.1"), "{}", fp(&["--drop-guard", "0.1"]));
    assert!(!fp(&[]).contains("drop_guard"));
}

#[test]
fn only_the_policies_with_a_deadline_need_a_threshold() {
    // synchronous, rebalance and backup-workers run with the threshold off: `auto` needs no
    // baseline steps for them (12 steps after 3 warm-up steps is below the minimum of 10).
    for p in ["synchronous", "rebalance", "backup-workers"] {
        let c = config(&["--steps", "12", "--policy", p, "--ranks", "4"]);
        assert_eq!(
            c.policy(),
            <dropcompute::policy::Policy as clap::ValueEnum>::from_str(p, false).expect("policy"),
            "{p}"
        );
    }
    for p in ["drop-before", "drop-predictive", "compute-budget", "rebalance-drop"] {
        let e = parse(&["--steps", "12", "--policy", p]).1.validate().expect_err(p).to_string();
        assert!(e.contains("insufficient data"), "{p}: {e}");
    }
    // compute-budget without a budget would hand every rank 2·M micro-batches with no bound.
    let e = parse(&["--policy", "compute-budget", "--threshold", "off"]).1.validate().expect_err("off").to_string();
    assert!(e.contains("--threshold") && e.contains("needs a budget"), "{e}");
}

/// `--epochs E --threshold auto` is checked against the baseline's steps, counted from the
/// job's own units (`Job::units_described`): the text job counted the digits' empty set and
/// refused every `--epochs` run under every policy ("0 training samples"). Per task, policy
/// with a deadline and tail split: the baseline runs ceil(E x ceil(units / P) / (N x M x S))
/// steps, P the ids of a part (b/S samples; one text unit of b/S documents), a step
/// straddling an epoch's end; E is accepted when that leaves 10 steps after the warm-up, else
/// refused naming `--epochs`, the steps and the units.
#[test]
fn auto_epochs_count_the_jobs_own_units_for_every_task_and_policy() {
    use dropcompute_train::job::Job;
    use dropcompute_train::text_job::TextJob;
    let text = ["--task", "text", "--text-model", "tiny", "--text-documents", "200", "--micro-batch-size", "4"];
    let run = ["--ranks", "4", "--micro-batches", "4", "--warmup-steps=0", "--threshold", "auto"];
    let policies =
        ["drop-predictive", "drop-before", "length-predictive", "cost-balance", "compute-budget", "rebalance-drop"];
    // The digits: 1797 samples, round(0.2 x 1797) = 359 held out.
    let digits_units = 1797 - 359;
    for policy in policies {
        for split in [1u64, 2] {
            for task in ["text", "digits"] {
                let task_flags: &[&str] = if task == "text" { &text } else { &["--micro-batch-size", "32"] };
                let split_text = split.to_string();
                let flags = [task_flags, &run[..], &["--policy", policy, "--tail-split", &split_text]].concat();
                let with = |extra: &[&str]| config(&[&flags[..], extra].concat());
                // The units, independently of the job: the text plan's own count; the digits'
                // training split.
                let (units, described) = if task == "text" {
                    let n = TextJob::prepare(&with(&["--steps", "60"])).expect("text job").plan.units();
                    (n, format!("{n} training units of {} documents", 4 / split))
                } else {
                    (digits_units, format!("{digits_units} training samples"))
                };
                // Dealt in parts of one unit (text: S units of 4/S documents a micro-batch) or of
                // 32/S samples (digits: an epoch's last part short), N x M x S parts a step.
                let part = if task == "text" { 1 } else { 32 / split };
                let parts_per_step = 4 * 4 * split;
                let per_step = parts_per_step * part;
                let (mut accepted, mut refused) = (0, 0);
                for e in [1u64, 2, 5, 8, 14] {
                    let steps = (e * units.div_ceil(part)).div_ceil(parts_per_step);
                    let got = Job::prepare(with(&["--epochs", &e.to_string()]));
                    let at = format!("{task} {policy} S={split} E={e} ({steps} steps)");
                    if steps >= dropcompute::tune::MIN_STEPS as u64 {
                        got.unwrap_or_else(|err| panic!("{at}: refused: {err}"));
                        accepted += 1;
                    } else {
                        let err = got.expect_err(&at).to_string();
                        let want = format!(
                            "--epochs: {e}: the baseline runs {steps} step(s) ({described} x {e} epoch(s), {per_step} per step)"
                        );
                        assert!(err.starts_with(&want), "{at}: {err}\nwant {want}");
                        refused += 1;
                    }
                }
                assert!(accepted > 0 && refused > 0, "{task} {policy} S={split}: both outcomes in the table");
            }
        }
    }
}

/// Every refusal of the text job's data and plan (`TextJob::prepare`) names the flag the user
/// must change and its value ("FLAG: VALUE: ..."), in the grammar of its counts, and the fix it
/// gives works: `--text-documents` below the fewest `--holdout` splits into one held-out and
/// one training document (2 and 0 at 0.2: the minimum is 3, round(3 x 0.2) = 1; 5 at 0.9: 6,
/// round(5.4) = 5), above the corpus (15217); a `--holdout` of the whole corpus that holds out
/// none (round(15217 x 3e-5) = 0) or all (round(15217 x 0.99999) = 15217); a plan with fewer
/// units than ranks, named by what fixes it: more documents (2 training documents of 3, 4 ranks
/// of 2-document units need (4 - 1) x 2 + 1 = 7 training documents: 9 documents, 9 - round(1.8)
/// = 7), else a smaller `--micro-batch-size` (the corpus' 15217 - 3043 = 12174 training
/// documents for 16 ranks: units of at most 12173 / 15 = 811 documents; under `--tail-split 2`
/// b = 2 x 811), else fewer `--ranks` (761 training documents of one each).
#[test]
fn text_data_refusals_name_the_flag_and_value_and_their_fix_runs() {
    use dropcompute_train::error::TrainError;
    use dropcompute_train::job::Job;
    const BASE: [&str; 8] = ["--task", "text", "--text-model", "tiny", "--threshold", "off", "--steps", "1"];
    const ONE: [&str; 6] = ["--ranks", "1", "--micro-batches", "1", "--micro-batch-size", "1"];
    // (common flags, the bad pair, its fix, the flag named, the message's start, what it says)
    type Row =
        (&'static [&'static str], [&'static str; 2], [&'static str; 2], &'static str, &'static str, &'static str);
    let table: [Row; 10] = [
        (
            &ONE,
            ["--text-documents", "2"],
            ["--text-documents", "3"],
            "--text-documents",
            "2: at --holdout 0.2 it holds out none of 2 documents",
            "give at least 3",
        ),
        (
            &ONE,
            ["--text-documents", "0"],
            ["--text-documents", "3"],
            "--text-documents",
            "0: at --holdout 0.2 it holds out none of 0 documents",
            "give at least 3",
        ),
        (
            &["--ranks", "1", "--holdout", "0.9"],
            ["--text-documents", "5"],
            ["--text-documents", "6"],
            "--text-documents",
            "5: at --holdout 0.9 it holds out all 5 documents",
            "give at least 6",
        ),
        (
            &["--ranks", "1"],
            ["--text-documents", "4294967295"],
            ["--text-documents", "15217"],
            "--text-documents",
            "4294967295: the embedded corpus has 15217 documents",
            "at most 15217",
        ),
        (
            &["--ranks", "1"],
            ["--holdout", "0.99999"],
            ["--holdout", "0.9999"],
            "--holdout",
            "0.99999: of the 15217 documents of the embedded corpus it holds out all",
            "smaller --holdout",
        ),
        (
            &["--ranks", "1"],
            ["--holdout", "0.00003"],
            ["--holdout", "0.0001"],
            "--holdout",
            "0.00003: of the 15217 documents of the embedded corpus it holds out none",
            "larger --holdout",
        ),
        (
            &["--ranks", "4", "--micro-batch-size", "2"],
            ["--text-documents", "3"],
            ["--text-documents", "9"],
            "--text-documents",
            "3: 2 training documents (of 3, --holdout 0.2) make ",
            "of up to 2 documents, fewer than the 4 ranks (each rank needs one); give --text-documents 9 or more",
        ),
        (
            &["--ranks", "16"],
            ["--micro-batch-size", "1000"],
            ["--micro-batch-size", "811"],
            "--micro-batch-size",
            "1000: 12174 training documents (of 15217, --holdout 0.2) make",
            "give --micro-batch-size 811 or less",
        ),
        (
            &["--ranks", "16", "--tail-split", "2"],
            ["--micro-batch-size", "2000"],
            ["--micro-batch-size", "1622"],
            "--micro-batch-size",
            "2000: 12174 training documents (of 15217, --holdout 0.2) make",
            "give --micro-batch-size 1622 or less",
        ),
        (
            &["--text-documents", "15217", "--holdout", "0.95", "--micro-batch-size", "1"],
            ["--ranks", "1024"],
            ["--ranks", "761"],
            "--ranks",
            "1024: 761 training documents (of 15217, --holdout 0.95) make 761 training units of up to 1 document",
            "give --ranks 761 or fewer",
        ),
    ];
    for (common, bad, fix, flag, start, says) in table {
        let flags = |pair: [&'static str; 2]| -> Vec<&'static str> { [&BASE[..], common, &pair[..]].concat() };
        match Job::prepare(config(&flags(bad))) {
            Err(TrainError::Config { what, value }) => {
                assert_eq!(what, flag, "{bad:?}: {value}");
                assert!(value.starts_with(start) && value.contains(says), "{bad:?}: {value}\nwant {start} ... {says}");
                assert!(!value.contains(" 1 micro-batches") && !value.contains(" 1 training units"), "{value}");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        Job::prepare(config(&flags(fix))).unwrap_or_else(|e| panic!("{bad:?} fixed by {fix:?}: {e}"));
    }
}

/// A checkpoint of another configuration is refused naming each difference worded for the task:
/// `--task` first when it differs (and not the fields that follow from it: the parameter count,
/// the digits' training samples, always 0 for text, the text model and units), the parameter
/// count by `--text-model` for the text job and by `--hidden` and the data for the digits.
#[test]
fn checkpoint_differences_name_the_task_first_and_word_the_model_by_task() {
    use dropcompute_train::ckpt::differences;
    use dropcompute_train::job::Job;
    let fp = |extra: &[&str]| Job::prepare(config(extra)).expect("job").fingerprint();
    let text = |model: &str| fp(&["--ranks", "4", "--task", "text", "--text-model", model, "--text-documents", "400"]);
    let digits = fp(&["--ranks", "4"]);
    let (tiny, default) = (text("tiny"), text("default"));
    let digits_params = "the parameter count (--hidden and the data's features and classes) was";
    // (checkpoint, this run, the message's start, what it must say, what it must not)
    let table: [(&str, &str, &str, &str, &[&str]); 4] = [
        (
            &digits,
            &tiny,
            "--task was digits, this run has text",
            "--micro-batch-size was 8, this run has 2",
            &["parameter count", "training samples", "training units", "--text-model"],
        ),
        (
            &tiny,
            &digits,
            "--task was text, this run has digits",
            "--lr was",
            &["parameter count", "training samples", "training units", "--text-model"],
        ),
        (&default, &tiny, "", "the parameter count (--text-model) was", &["--hidden", "--task", "training samples"]),
        (&digits, &fp(&["--ranks", "4", "--hidden", "64"]), "", digits_params, &["--text-model", "--task"]),
    ];
    for (saved, want, start, says, never) in table {
        let d = differences(saved, want);
        assert!(d.starts_with(start) && d.contains(says), "{saved} -> {want}: {d}");
        for n in never {
            assert!(!d.contains(n), "{n} in {d}");
        }
    }
}

/// Every policy x `--threshold` (a number of ms, auto, off): a number with a policy that never
/// runs a deadline (synchronous, backup-workers, rebalance) is refused naming both flags (it
/// was ignored: exit 0, "threshold off"); auto and off stay accepted; the policies with a
/// deadline take the number.
#[test]
fn a_threshold_in_ms_is_refused_with_a_policy_that_never_uses_one() {
    use dropcompute::policy::Policy;
    for p in Policy::ALL {
        // Independent of `Policy::has_deadline`: the policies that run with the threshold off.
        let unused = matches!(p, Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance);
        for t in ["0.5", "auto", "off"] {
            let flags = ["--policy", p.name(), "--threshold", t, "--ranks", "4", "--steps", "20"];
            let got = parse(&flags).1.validate();
            match (unused, t, &got) {
                (true, "0.5", Err(e)) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("--threshold 0.5")
                            && e.contains(&format!("--policy {p}"))
                            && e.contains("auto or off"),
                        "{flags:?}: {e}"
                    );
                }
                (_, _, Ok(c)) => {
                    assert!(!(unused && t == "0.5"), "{flags:?}: accepted with threshold {:?}", c.threshold)
                }
                // compute-budget needs a budget (refused above, its own rule).
                (false, "off", Err(_)) if p == Policy::ComputeBudget => {}
                (_, _, Err(e)) => panic!("{flags:?}: {e}"),
            }
        }
    }
}
