//! Acceptance on the real what-if traces shipped in data/traces (copies; see its README).
use std::path::PathBuf;

use dropcompute::commands::tune::{Args as TuneArgs, run_to};
use dropcompute::trace::whatif::PipelineAggregation;
use dropcompute::trace::{LoadOptions, load};
use dropcompute::tune::{Refusal, TuneConfig, Verdict, tune};

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/traces").join(name)
}

#[test]
fn se_enables_a_positive_threshold_and_st_declines() {
    let loaded = load(&[trace("trace-SE.csv.gz"), trace("trace-ST.csv.gz")], &LoadOptions::default()).expect("load");
    let se = &loaded[0].trace;
    assert_eq!((se.world_size(), se.micro_batches(), se.num_steps()), (32, 8, 43));
    match tune(se, &TuneConfig::default()).verdict {
        Verdict::Enable(c) => {
            assert!(c.objective > 0.05, "{c:?}");
            assert!(c.drop_rate <= 0.10);
        }
        v => panic!("SE should enable dropping: {v:?}"),
    }
    let st = &loaded[1].trace;
    assert_eq!((st.world_size(), st.micro_batches(), st.num_steps()), (2, 4, 32));
    let r = tune(st, &TuneConfig::default());
    assert!(matches!(r.verdict, Verdict::Decline(Refusal::InsufficientGain { .. })), "{:?}", r.verdict);
    assert!(r.straggler_headroom < 0.02);
}

#[test]
fn tune_command_output_names_the_guardrail() {
    let args = TuneArgs {
        traces: vec![trace("trace-ST.csv.gz")],
        pipeline: PipelineAggregation::Bottleneck,
        allow_incomplete_steps: false,
        overhead_ms: 0.0,
        max_drop_rate: 0.1,
        min_batch_fraction: 0.75,
        min_gain: 0.02,
        min_micro_batches: 1,
        svg_dir: None,
        top_ranks: 2,
    };
    let mut out = Vec::new();
    run_to(&args, &mut out).expect("run");
    let text = String::from_utf8(out).expect("utf8");
    assert!(text.contains("DECLINE") && text.contains("min_gain"), "{text}");
}
