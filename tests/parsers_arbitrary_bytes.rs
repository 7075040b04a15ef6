//! Arbitrary bytes into every parser that reads untrusted input (the same entry points the
//! cargo-fuzz targets in `fuzz/` drive): compute logs (ours and the reference's), What-if CSV,
//! the mock recipe file, the rendezvous hello, challenge and reply, the checkpoint reader, and
//! the graph builder's inputs (shapes, parameters).
//! Each must return a typed error or a value, never panic, and stay bounded in time and memory.
#![cfg(feature = "mock")] // runs on the CPU mock device

use std::path::Path;

use dropcompute::checkpoint;
use dropcompute::hccl::rendezvous::{self, JobSecret, NONCE_LEN, Reply};
use dropcompute::mock::{MockRecipe, RecipeFileError};
use dropcompute::synapse::graph;
use dropcompute::trace::compute_log::{self, REFERENCE_COLUMNS};
use dropcompute::trace::whatif::{self, WHATIF_COLUMNS};
use dropcompute::trace::{LoadOptions, TraceError};
use proptest::prelude::*;

fn graph_runtime() -> &'static std::sync::Arc<dropcompute::synapse::Runtime> {
    static RT: std::sync::OnceLock<std::sync::Arc<dropcompute::synapse::Runtime>> = std::sync::OnceLock::new();
    RT.get_or_init(|| dropcompute::synapse::Runtime::new(dropcompute::mock::api()).unwrap())
}

fn opts(allow: bool) -> LoadOptions {
    LoadOptions { allow_incomplete_steps: allow, ..LoadOptions::default() }
}

/// Every trace error names the input it came from (or is a shape/empty error about it).
fn named(e: &TraceError, name: &str) -> bool {
    e.to_string().contains(name) || matches!(e, TraceError::Shape(_))
}

/// CSV-ish text: a known header then rows of small numbers, booleans and junk, so the parsers
/// get past the header and reach the field and shape checks.
fn csv_body(header: &'static [&'static str]) -> impl Strategy<Value = String> {
    let field = prop_oneof![
        (0u64..6).prop_map(|v| v.to_string()),
        Just("4294967295".to_string()),
        Just("-1".to_string()),
        Just("true".to_string()),
        Just("False".to_string()),
        Just("1e308".to_string()),
        Just("NaN".to_string()),
        Just("forward-compute".to_string()),
        Just("backward-compute".to_string()),
        "[ -~]{0,6}",
    ];
    proptest::collection::vec(proptest::collection::vec(field, 0..13), 0..12).prop_map(move |rows| {
        let mut s = header.join(",");
        for r in rows {
            s.push('\n');
            s.push_str(&r.join(","));
        }
        s
    })
}

const OURS: [&str; 11] = [
    "global_step",
    "local_step",
    "world_size",
    "batch",
    "sentence_length",
    "computed_batch",
    "compute_dropped",
    "iteration_time_ms",
    "rank",
    "start_ns",
    "duration_ns",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn compute_log_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), allow: bool) {
        let name = Path::new("compute_logs_3.csv");
        if let Err(e) = compute_log::load_log_bytes(name, &bytes, &opts(allow)) {
            prop_assert!(named(&e, "compute_logs_3.csv"), "{e}");
        }
    }

    #[test]
    fn structured_compute_logs_never_panic(ours in csv_body(&OURS), reference in csv_body(&REFERENCE_COLUMNS), allow: bool) {
        let _ = compute_log::load_log_bytes(Path::new("ours.csv"), ours.as_bytes(), &opts(allow));
        let _ = compute_log::load_log_bytes(Path::new("compute_logs_0.csv"), reference.as_bytes(), &opts(allow));
    }

    #[test]
    fn whatif_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), body in csv_body(&WHATIF_COLUMNS), allow: bool) {
        if let Err(e) = whatif::load_csv_bytes(Path::new("w.csv"), &bytes, &opts(allow)) {
            prop_assert!(named(&e, "w.csv"), "{e}");
        }
        let _ = whatif::load_csv_bytes(Path::new("w.csv"), body.as_bytes(), &opts(allow));
    }

    /// Graph-builder inputs (any op, parameters, operand dtypes and shapes) on the in-process
    /// mock: the cargo-fuzz target `graph_builder`'s body (`graph::fuzzing::graph_builder_case`).
    #[test]
    fn graph_builder_inputs_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        let r = graph::fuzzing::graph_builder_case(graph_runtime(), &bytes);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn recipe_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        match MockRecipe::from_slice(&bytes, Path::new("r.json")) {
            Ok(r) => prop_assert!(r.validate(Path::new("r.json")).is_ok()),
            Err(RecipeFileError::Parse { .. } | RecipeFileError::Invalid { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected {e:?}"),
        }
    }

    #[test]
    fn rendezvous_messages_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..160),
        nonce in any::<[u8; NONCE_LEN]>(),
        world in 0u32..8,
    ) {
        let secret = JobSecret::from_hex(&"ab".repeat(16)).unwrap();
        prop_assert!(rendezvous::check_hello(&bytes, &secret, &nonce, world).is_err());
        if let Ok(n) = rendezvous::parse_challenge(&bytes) {
            prop_assert_eq!(&n[..], &bytes[8..]);
        }
        match rendezvous::check_reply(&bytes, &secret, &nonce, &nonce, 1) {
            Ok(Reply::Refused(r)) => prop_assert_eq!(bytes[0], 1, "{}", r),
            Ok(Reply::Payload(_)) => prop_assert!(false, "forged payload accepted"),
            Err(_) => {}
        }
    }

    #[test]
    fn checkpoint_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = checkpoint::decode(&bytes, Path::new("c.dcc"));
    }
}

#[test]
fn a_huge_micro_batch_index_is_bounded_not_an_allocation_failure() {
    // local_step = u32::MAX on one row: ranks x micro-batches would be 4 G cells per step.
    let mut csv = OURS.join(",");
    csv.push_str("\n0,4294967295,1,8,0,8,false,1.0,0,100,1000000\n0,0,1,8,0,8,false,1.0,0,100,1000000");
    let t0 = std::time::Instant::now();
    match compute_log::load_log_bytes(Path::new("ours.csv"), csv.as_bytes(), &opts(false)) {
        Err(TraceError::Ragged { count, missing, .. }) => {
            assert_eq!(count, (1usize << 32) - 2);
            assert_eq!(missing.len(), 20);
            assert_eq!(missing[0], (0, 0, 1));
        }
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < std::time::Duration::from_secs(30), "hang guard: {:?}", t0.elapsed());
}

#[test]
fn the_byte_entry_points_parse_valid_input_like_the_path_ones() {
    let mut csv = OURS.join(",");
    for step in 0..2 {
        for mb in 0..2 {
            csv.push_str(&format!("\n{step},{mb},1,8,0,8,false,1.0,0,{},2000", step * 10_000 + mb * 3000));
        }
    }
    let l = compute_log::load_log_bytes(Path::new("ours.csv"), csv.as_bytes(), &opts(false)).unwrap();
    assert_eq!((l.trace.num_steps(), l.trace.world_size(), l.trace.micro_batches()), (2, 1, 2));
    assert_eq!(l.trace.latencies_ns(), &[2000.0; 4]);
    let json = serde_json::json!({
        "format": dropcompute::mock::recipe::RECIPE_FORMAT,
        "version": dropcompute::mock::recipe::RECIPE_VERSION,
        "name": "n", "kernel": "copy", "tensors": [{"name": "a", "bytes": 4}, {"name": "b", "bytes": 8}]
    });
    let r = MockRecipe::from_slice(json.to_string().as_bytes(), Path::new("r.json")).unwrap();
    assert_eq!(r.tensors.iter().map(|t| t.bytes).collect::<Vec<_>>(), vec![4, 8]);
    let dup = json.to_string().replace("\"b\"", "\"a\"");
    let e = MockRecipe::from_slice(dup.as_bytes(), Path::new("r.json")).unwrap_err();
    assert!(matches!(e, RecipeFileError::Invalid { .. }) && e.to_string().contains("r.json"), "{e}");
}
