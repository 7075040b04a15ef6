//! What-if CSV traces from arbitrary bytes: never a panic, an abort or an unbounded allocation.
#![no_main]

use std::path::Path;

use dropcompute::trace::{LoadOptions, whatif};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let pipeline =
        if sel & 1 == 0 { whatif::PipelineAggregation::Bottleneck } else { whatif::PipelineAggregation::Sum };
    let opts = LoadOptions { allow_incomplete_steps: sel & 2 != 0, pipeline, ..LoadOptions::default() };
    let _ = whatif::load_csv_bytes(Path::new("fuzz.csv"), body, &opts);
});
