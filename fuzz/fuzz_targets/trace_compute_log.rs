//! Compute logs (ours and the DropCompute reference's) from arbitrary bytes: never a panic, an
//! abort or an unbounded allocation. The first byte picks the file name (which decides the
//! reference rank) and whether incomplete steps are allowed.
#![no_main]

use std::path::Path;

use dropcompute::trace::{LoadOptions, compute_log};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let name = if sel & 1 == 0 { "compute_logs_0.csv" } else { "ours.csv" };
    let opts = LoadOptions { allow_incomplete_steps: sel & 2 != 0, ..LoadOptions::default() };
    let _ = compute_log::load_log_bytes(Path::new(name), body, &opts);
});
