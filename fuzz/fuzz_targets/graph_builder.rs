//! The graph builder's inputs (op, parameters, operand dtypes and shapes) from arbitrary bytes,
//! built and compiled on the in-process CPU mock: a typed error or a compiled graph, never a
//! panic; what the safe layer's checks accept compiles.
#![no_main]

use std::sync::{Arc, OnceLock};

use dropcompute::synapse::Runtime;
use dropcompute::synapse::graph::{self, fuzzing};
use libfuzzer_sys::fuzz_target;

fn rt() -> &'static Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(dropcompute::mock::api()).expect("the in-process mock initialises"))
}

fuzz_target!(|data: &[u8]| {
    if let Some((op, ins, outs)) = fuzzing::node_from_bytes(data) {
        fn operand((k, (dt, shape)): (usize, &(graph::DType, Vec<u64>))) -> graph::Operand<'_> {
            graph::Operand { name: ["a", "b", "c", "d", "e"][k], dtype: *dt, shape }
        }
        let i: Vec<_> = ins.iter().enumerate().map(operand).collect();
        let o: Vec<_> = outs.iter().enumerate().map(operand).collect();
        let checked = op.check("fuzz", &i, &o).is_ok();
        let built = fuzzing::build_and_compile(rt(), &op, &ins, &outs);
        if checked && !ins.iter().chain(&outs).any(|(_, s)| s.contains(&0)) {
            assert!(built.is_ok(), "{op:?}: checks passed, build failed: {built:?}");
        }
    }
});
