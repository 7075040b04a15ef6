//! A C program compiled against include/dropcompute.h and the static library uses the policy,
//! the recommendation and the divisor; its printed recommendation equals the Rust library's.

use std::path::{Path, PathBuf};
use std::process::Command;

use dropcompute::policy::CheckMode;
use dropcompute::trace::compute_log::{ComputeLogRecord, ComputeLogWriter};
use dropcompute::trace::{LoadOptions, load};
use dropcompute::tune::{Guardrails, Verdict};
use dropcompute_capi::{chosen_verdict, recommend_trace};

/// 2 ranks x 4 micro-batches x 12 steps of 1 ms, rank 1's last micro-batch 6 ms on even steps:
/// a trace where dropping pays off (the straggler waits are half the step).
fn write_trace(path: &Path) {
    let mut w = ComputeLogWriter::new(std::fs::File::create(path).unwrap());
    for step in 0..12u64 {
        for rank in 0..2u32 {
            let mut start = 0;
            for mb in 0..4u32 {
                let dur: u64 = if rank == 1 && mb == 3 && step % 2 == 0 { 6_000_000 } else { 1_000_000 };
                w.write(&ComputeLogRecord {
                    global_step: step,
                    local_step: mb,
                    world_size: 2,
                    batch: 8,
                    sentence_length: 0,
                    computed_batch: 8 * u64::from(mb + 1),
                    compute_dropped: false,
                    iteration_time_ms: dur as f64 / 1e6,
                    rank,
                    start_ns: start,
                    duration_ns: dur,
                    ..ComputeLogRecord::default()
                })
                .unwrap();
                start += dur;
            }
        }
    }
    w.flush().unwrap();
}

/// target/debug (the test binary lives in target/debug/deps).
fn target_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let start = line.find(&format!("{key}=")).unwrap_or_else(|| panic!("{key} missing in {line}")) + key.len() + 1;
    let rest = &line[start..];
    if key == "reason" { rest } else { rest.split(' ').next().unwrap() }
}

/// Compiles `tests/c/{source}` against the header and the static library into `dir`.
fn compile(dir: &Path, source: &str) -> PathBuf {
    let lib = target_dir().join("libdropcompute_capi.a");
    assert!(lib.exists(), "{} not built", lib.display());
    let exe = dir.join(source.trim_end_matches(".c"));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c").join(source))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "compiling {source} failed");
    exe
}

/// A real C host calls every entry point with hostile input (tests/c/hostile.c: null
/// pointers, zero, SIZE_MAX and above-cap lengths, a directory, a missing file, an empty file,
/// `min_micro_batches` above M): each returns its status with the out-pointer reset, and
/// nothing at all reaches the host's stderr (no panic message, no backtrace), even with
/// `RUST_BACKTRACE=1`.
#[test]
fn hostile_inputs_from_a_c_host_get_statuses_reset_outs_and_a_silent_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("compute_log.csv");
    write_trace(&trace);
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, b"").unwrap();
    let sub = dir.path().join("a_directory.csv");
    std::fs::create_dir(&sub).unwrap();
    let exe = compile(dir.path(), "hostile.c");
    let out = Command::new(&exe)
        .arg(&sub)
        .arg(dir.path().join("missing.csv"))
        .arg(&empty)
        .arg(&trace)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hostile cases failed:\n{stderr}\n{stdout}");
    assert_eq!(stderr, "", "the library wrote to the host's stderr");
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/hostile.c")).unwrap();
    let cases = source.matches("  CASE(\"").count();
    assert!(cases >= 35, "{cases} cases");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), cases, "{stdout}");
    for name in ["divisor SIZE_MAX", "recommend directory", "recommend min_micro_batches > M", "divisor nominal M 0"] {
        assert!(stdout.lines().any(|l| l == format!("ok {name}")), "{name} missing: {stdout}");
    }
}

#[test]
fn c_program_uses_policy_recommend_and_divisor() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("compute_log.csv");
    write_trace(&trace);
    let exe = compile(dir.path(), "program.c");
    let out = Command::new(&exe).arg(&trace).output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "C program failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));

    let t = load(std::slice::from_ref(&trace), &LoadOptions::default()).unwrap().remove(0).trace;
    let cases = [
        ("oracle", None, Guardrails::default()),
        ("strict", Some(CheckMode::BeforeMicroBatch), Guardrails { max_drop_rate: 0.0, ..Guardrails::default() }),
        (
            "jitter",
            Some(CheckMode::BeforeMicroBatch),
            Guardrails { max_drop_rate: 0.3, jitter_ns: 1e6, ..Guardrails::default() },
        ),
    ];
    for (name, check, guardrails) in cases {
        let line = stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} line: {stdout}"));
        let rec = recommend_trace(&t, check, guardrails, 1, None);
        let v = *chosen_verdict(&rec, check);
        let num = |k: &str| field(line, k).parse::<f64>().unwrap();
        match v {
            Verdict::Enable(c) => {
                assert_eq!(field(line, "enabled"), "1", "{name}: {line}");
                assert_eq!(num("threshold_ns"), c.threshold_ns);
                assert_eq!(num("drop_rate"), c.drop_rate);
                assert_eq!(num("speedup"), c.objective);
                assert!(c.objective > 0.02, "{name}: the trace is built to pay off: {c:?}");
            }
            Verdict::Decline(r) => {
                assert_eq!(field(line, "enabled"), "0", "{name}: {line}");
                assert_eq!(field(line, "reason"), r.to_string());
                assert_eq!(num("threshold_ns"), 0.0);
            }
        }
        if name == "oracle" {
            assert!(matches!(v, Verdict::Enable(_)), "default guardrails enable on this trace: {v:?}");
        } else if name == "jitter" {
            // The C struct's jitter reached the recommendation: without it the same guardrails
            // enable the 3 ms plateau top (drop 1/4); every 1 ms window there holds a threshold
            // that drops half or nothing.
            let point = recommend_trace(&t, check, Guardrails { max_drop_rate: 0.3, ..Guardrails::default() }, 1, None);
            assert!(matches!(chosen_verdict(&point, check), Verdict::Enable(_)), "{point:?}");
            assert!(matches!(v, Verdict::Decline(_)), "{v:?}");
        } else {
            assert!(matches!(v, Verdict::Decline(_)), "max_drop_rate 0 refuses: {v:?}");
            assert_eq!(field(line, "refusal"), "2", "{line}");
        }
    }
}

/// The scripted length-aware job of [`length_predictive_c_walk_decides_as_the_rust_walker`]:
/// per step, each micro-batch's bucket, real tokens and latency (ns), long buckets slow.
fn length_script(steps: u64, m: usize, lens: &[u32]) -> Vec<(Vec<u32>, Vec<u64>, Vec<u64>)> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..steps)
        .map(|_| {
            let b: Vec<u32> = (0..m).map(|_| (next() % lens.len() as u64) as u32).collect();
            let t: Vec<u64> = b.iter().map(|&k| u64::from(lens[k as usize]) * 4 - next() % 30).collect();
            let l: Vec<u64> = b.iter().map(|&k| u64::from(lens[k as usize]) / 4 + next() % 7).collect();
            (b, t, l)
        })
        .collect()
}

/// The Rust walker (`policy::walk::RankWalk` over `policy::BucketEstimator`, told the buckets
/// when `bucketed`) on the script, driven as tests/c/lengths.c drives the C walk: per step the
/// launched micro-batches, whether the deadline stopped it, and the tokens started.
fn rust_walks(
    threshold_ns: u64,
    m: usize,
    script: &[(Vec<u32>, Vec<u64>, Vec<u64>)],
    bucketed: bool,
) -> (Vec<(Vec<u32>, u64, u64)>, dropcompute::policy::BucketEstimator) {
    use dropcompute::policy::walk::{Next, RankWalk, WalkEnd};
    use dropcompute::policy::{BucketEstimator, DeadlineConfig, TailShape, Threshold};
    let cfg = DeadlineConfig {
        threshold: Threshold::from_ns(Some(threshold_ns)),
        check: CheckMode::Predictive,
        warmup_steps: 0,
        min_micro_batches: 1,
    };
    let mut est = BucketEstimator::new(32, 0.9);
    let mut out = Vec::new();
    for (s, (b, t, l)) in script.iter().enumerate() {
        let mut w = RankWalk::new(cfg, s as u64, m, TailShape::default(), 0);
        if bucketed {
            w.set_buckets(b);
        }
        let (mut launched, mut ends) = (Vec::new(), Vec::new());
        let stopped = loop {
            match w.next(&mut est) {
                Next::Launch(x) => {
                    let d = l[x.micro_batch as usize];
                    ends.push(ends.last().copied().unwrap_or(0) + d);
                    launched.push(x.micro_batch);
                }
                Next::Wait { upto } => {
                    while w.reported() < upto {
                        let i = w.reported();
                        assert!(w.ended(i, ends[i], l[launched[i] as usize], &mut est));
                    }
                }
                Next::Done(end) => break u64::from(matches!(end, WalkEnd::Deadline(_))),
            }
        };
        let tokens = launched.iter().map(|&j| t[j as usize]).sum();
        out.push((launched, stopped, tokens));
    }
    (out, est)
}

/// tests/c/lengths.c walks a `length-predictive` job through the C API (declared bucket
/// lengths, each step's buckets and tokens, a per-bucket estimator kept across steps): every
/// step's launches, stop and tokens, every bucket's final estimate and the tokens divisor equal
/// those of the Rust walker driven the same way; and the buckets matter (the same walker
/// asked blind decides differently on this script).
#[test]
fn length_predictive_c_walk_decides_as_the_rust_walker() {
    use std::io::Write;
    let (threshold, m, steps, lens) = (400u64, 8usize, 12u64, [64u32, 128, 512]);
    let script = length_script(steps, m, &lens);
    let mut input = format!("{threshold} {m} {steps} {} {} {} {}\n", lens.len(), lens[0], lens[1], lens[2]);
    for (b, t, l) in &script {
        for row in [b.iter().map(|&k| u64::from(k)).collect::<Vec<_>>(), t.clone(), l.clone()] {
            input += &row.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
            input += "\n";
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "lengths.c");
    let mut child = Command::new(&exe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "lengths.c failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));

    let (want, mut est) = rust_walks(threshold, m, &script, true);
    let mut lines = stdout.lines();
    for (s, (launched, stopped, tokens)) in want.iter().enumerate() {
        let line = lines.next().unwrap_or_else(|| panic!("no line for step {s}: {stdout}"));
        let l: Vec<String> = launched.iter().map(u32::to_string).collect();
        assert_eq!(line, format!("step={s} launched={} stopped={stopped} tokens={tokens}", l.join(",")));
    }
    for b in 0..lens.len() as u32 {
        use dropcompute::policy::WalkEstimator;
        let e = est.estimate_for(Some(b)).unwrap_or(0);
        assert_eq!(lines.next(), Some(format!("estimate bucket={b} ns={e}").as_str()));
    }
    let total: u64 = want.iter().map(|w| w.2).sum();
    assert_eq!(lines.next(), Some(format!("divisor={total}.0").as_str()));
    // The script exercises the deadline, and the bucket estimate changes decisions.
    assert!(want.iter().any(|w| w.1 == 1) && want.iter().any(|w| w.1 == 0), "{want:?}");
    let (blind, _) = rust_walks(threshold, m, &script, false);
    assert_ne!(blind, want, "the buckets change no decision on this script");
}
