//! The graph builder's inputs (op, parameters, operand dtypes and shapes) from arbitrary bytes,
//! built and compiled on the in-process CPU mock. The body is
//! `dropcompute::synapse::graph::fuzzing::graph_builder_case`, which `cargo test` also runs
//! (`tests/parsers_arbitrary_bytes.rs`): a typed error or a compiled graph, never a panic; what
//! the safe layer's checks accept compiles; the runtime never sees what the checks should catch.
#![no_main]

use std::sync::{Arc, OnceLock};

use dropcompute::synapse::Runtime;
use dropcompute::synapse::graph::fuzzing;
use libfuzzer_sys::fuzz_target;

fn rt() -> &'static Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(dropcompute::mock::api()).expect("the in-process mock initialises"))
}

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = fuzzing::graph_builder_case(rt(), data) {
        panic!("{violation}");
    }
});
