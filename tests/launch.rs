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

/// `bench allreduce` in the nccl-tests shape for every `--op`, in threads and processes: one
/// row per size with out-of-place (and, for all_reduce, in-place) columns, no wrong element
/// against the f64 reference, and the footer with the average busbw equal to the mean of the
/// rows' busbw columns.
#[test]
fn bench_collectives_check_every_element_and_print_the_nccl_tests_footer() {
    for launch in ["threads", "processes"] {
        for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"] {
            let o = dropcompute(&[
                "bench",
                "allreduce",
                "--ranks",
                "3",
                "--launch",
                launch,
                "--op",
                op,
                "--dtype",
                "bf16",
                "--min-bytes",
                "4096",
                "--max-bytes",
                "65536",
                "--iters",
                "2",
                "--warmup",
                "1",
            ]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{launch} {op}: {out}\n{}", String::from_utf8_lossy(&o.stderr));
            assert!(out.starts_with(&format!("# {op}")), "{out}");
            let rows: Vec<Vec<&str>> =
                out.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
            assert_eq!(rows.len(), 3, "{launch} {op}: sizes 4, 16, 64 KiB: {out}");
            let mut busbw = Vec::new();
            for r in &rows {
                // size count type | time algbw busbw #wrong | time algbw busbw #wrong
                assert_eq!(r.len(), 13, "{out}");
                assert_eq!(r[7], "0", "{launch} {op}: out-of-place #wrong: {out}");
                busbw.push(r[6].parse::<f64>().unwrap());
                if op == "all_reduce" {
                    assert_eq!(r[12], "0", "{launch}: in-place #wrong: {out}");
                    busbw.push(r[11].parse::<f64>().unwrap());
                } else {
                    assert_eq!(r[12], "n/a", "{out}");
                }
            }
            assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
            let avg: f64 =
                out.lines().find_map(|l| l.strip_prefix("# Avg bus bandwidth    : ")).unwrap().parse().unwrap();
            let mean = busbw.iter().sum::<f64>() / busbw.len() as f64;
            assert!((avg - mean).abs() <= 0.002, "{launch} {op}: footer {avg} vs mean of rows {mean}: {out}");
        }
    }
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
