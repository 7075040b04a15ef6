//! `crate::launch` through the binary: `bench allreduce` in process mode (children started
//! with the hidden `rank-process` subcommand and a JSON spec, results read back), and a spec
//! the binary cannot run refused with its program named.

#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

/// Runs `dropcompute args` with none of the product's variables set.
fn dropcompute(args: &[&str]) -> std::process::Output {
    hermetic::dropcompute().args(args).output().unwrap()
}

#[test]
fn bench_allreduce_runs_its_ranks_as_processes() {
    let o = dropcompute(&[
        "bench",
        "allreduce",
        "--ranks",
        "3",
        "--launch",
        "processes",
        "--min-bytes",
        "4096",
        "--max-bytes",
        "16384",
        "--iters",
        "1",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("# all_reduce sum, 3 ranks, processes"), "{out}");
    // One row per size, from rank 0's result file: 4096 B = 1024 f32, 16384 B = 4096 f32.
    let rows: Vec<(u64, u64)> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    assert_eq!(rows, vec![(4096, 1024), (16384, 4096)], "{out}");
}

#[test]
fn a_rank_process_spec_of_an_unknown_program_is_refused() {
    let tmp = hermetic::temp_dir("launch-test");
    let dir = tmp.path();
    let spec = dir.join("spec.json");
    let json = serde_json::json!({
        "program": "nope", "rank": 0, "world_size": 1, "unique_id": "", "config": null,
        "result": dir.join("r.json"),
    });
    std::fs::write(&spec, serde_json::to_vec(&json).unwrap()).unwrap();
    let o = dropcompute(&["rank-process", spec.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("unknown rank program \"nope\""), "{err}");
    assert!(!dir.join("r.json").exists(), "no result written");
}
