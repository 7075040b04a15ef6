//! The environment table (`dropcompute::environment`) through the real binary (issue 24,
//! found 7): every variable x {empty, garbage} x every subcommand that reads it, rows generated
//! from the table itself (a new variable gets its rows without editing this file). Each row
//! asserts exit 2, a message naming the variable (and the value, or its length for a secret),
//! no backtrace, and completion within a bound. Plus: README's table equals the Rust table, the
//! hermetic scrub list covers it, a library named without `/` is taken relative to the current
//! directory (flag and variable alike), and the variables each subcommand does not read.

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;
use std::time::{Duration, Instant};

use dropcompute::environment::{self, Empty, Subcommand};

/// Arguments that parse (clap) for each subcommand; the environment check runs before the
/// command does anything, so a refused variable ends it at once.
fn argv(sub: Subcommand, missing: &Path) -> Vec<String> {
    let m = missing.display().to_string();
    let v: Vec<&str> = match sub {
        Subcommand::Info => vec!["info", "--no-check"],
        Subcommand::Train => vec!["train", "--steps", "1", "--time-mode", "virtual", "--no-compare"],
        Subcommand::Validate => vec!["validate"],
        Subcommand::Tune => vec!["tune", "--trace", &m],
        Subcommand::Simulate => vec!["simulate", "--workers", "2"],
        Subcommand::BenchAllreduce => vec!["bench", "allreduce", "--ranks", "2", "--max-bytes", "1024"],
        Subcommand::BenchKernels => vec!["bench", "kernels"],
        Subcommand::BenchSim => vec!["bench", "sim"],
        Subcommand::BenchScheduler => vec!["bench", "scheduler"],
        Subcommand::RankProcess => vec![dropcompute::launch::CHILD_SUBCOMMAND, &m],
    };
    v.into_iter().map(String::from).collect()
}

/// One run: (exit code, stderr, seconds).
fn run(args: &[String], vars: &[(&str, &str)], cwd: Option<&Path>) -> (Option<i32>, String, f64) {
    let mut c = hermetic::dropcompute();
    c.args(args);
    for (k, v) in vars {
        c.env(k, v);
    }
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let t = Instant::now();
    let o = hermetic::output_within(&mut c, Duration::from_secs(60));
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned(), t.elapsed().as_secs_f64())
}

fn no_backtrace(err: &str) -> bool {
    !err.contains("panicked") && !err.contains("RUST_BACKTRACE")
}

#[test]
fn every_variable_empty_and_garbage_in_every_subcommand_that_reads_it() {
    let (_tmp, missing) = hermetic::missing_path("trace.csv");
    // (variable, value, subcommand)
    let mut rows: Vec<(&'static environment::Variable, &'static str, Subcommand)> = Vec::new();
    for var in environment::table() {
        for &sub in var.readers {
            rows.push((var, var.garbage, sub));
            if var.empty == Empty::Refused {
                rows.push((var, "", sub));
            }
        }
    }
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|s| {
        let chunks: Vec<_> = rows.chunks(rows.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let missing = &missing;
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for &(var, value, sub) in chunk {
                        let (code, err, secs) = run(&argv(sub, missing), &[(var.name, value)], None);
                        let shown = if var.secret { "characters, not shown" } else { value };
                        let named = err.contains(var.name) && err.contains(shown);
                        let why_empty = !value.is_empty() || err.contains("unset it instead");
                        let leaked = var.secret && !value.is_empty() && err.contains(value);
                        if code != Some(2) || !named || !why_empty || leaked || !no_backtrace(&err) || secs > 30.0 {
                            bad.push(format!(
                                "{}={value:?} in {}: exit {code:?} in {secs:.1}s: {err}",
                                var.name,
                                sub.name()
                            ));
                        }
                    }
                    bad
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    eprintln!("{} rows in {:.1}s", rows.len(), started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), rows.len(), failures.join("\n"));
    assert!(rows.len() > 150, "the table generated only {} rows", rows.len());
}

/// The documented exceptions (an empty `RUST_LOG` or `TMPDIR` means the default) pass the
/// check in every reader, and every variable a subcommand does not read is left alone there.
#[test]
fn exceptions_and_non_readers_pass_the_check() {
    for var in environment::table() {
        for sub in Subcommand::ALL {
            let lookup_garbage = |k: &str| (k == var.name).then(|| var.garbage.to_string());
            let lookup_empty = |k: &str| (k == var.name).then(String::new);
            if !var.read_by(sub) {
                assert_eq!(environment::check_with(sub, lookup_garbage), Ok(()), "{} in {}", var.name, sub.name());
            } else if let Empty::Unset(_) = var.empty {
                assert_eq!(environment::check_with(sub, lookup_empty), Ok(()), "{} in {}", var.name, sub.name());
            }
        }
    }
    // Through the binary, a command that reads neither: `bench sim` with garbage launcher
    // variables and an empty RUST_LOG runs (exit 0).
    let args: Vec<String> = ["bench", "sim", "--workers", "2", "--steps", "10"].map(String::from).to_vec();
    let (code, err, _) = run(&args, &[("MASTER_PORT", "http"), ("RANK", "x"), ("RUST_LOG", "")], None);
    assert_eq!(code, Some(0), "{err}");
}

/// README.md's "Environment variables" table is the Rust table, rendered
/// (`environment::markdown`); `DROPCOMPUTE_BLESS=1` rewrites it.
#[test]
fn readme_table_matches_the_rust_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (begin, end) =
        ("<!-- environment table: generated from core/src/environment.rs -->\n", "<!-- end of environment table -->");
    let start = readme.find(begin).expect("README lacks the environment table's begin marker") + begin.len();
    let stop = start + readme[start..].find(end).expect("end marker");
    let want = environment::markdown();
    if std::env::var_os("DROPCOMPUTE_BLESS").is_some() {
        std::fs::write(&path, format!("{}{want}{}", &readme[..start], &readme[stop..])).unwrap();
        return;
    }
    assert_eq!(
        &readme[start..stop],
        want,
        "README's environment table is stale: DROPCOMPUTE_BLESS=1 cargo test --test environment_table"
    );
}

/// The hermetic helpers scrub every variable of the table (else a test's verdict would depend
/// on the calling shell), and list nothing the table lacks.
#[test]
fn the_hermetic_scrub_list_is_the_table() {
    let mut table: Vec<&str> = environment::table().iter().map(|v| v.name).filter(|n| *n != "TMPDIR").collect();
    let mut scrubbed: Vec<&str> = hermetic::PRODUCT_VARS.to_vec();
    table.sort_unstable();
    scrubbed.sort_unstable();
    assert_eq!(table, scrubbed);
}

/// A library named without `/` is the file in the current directory, never the system search
/// path (`dlopen` semantics), for the flag and the variable alike: a non-library file there is
/// refused as `./NAME` (not "No such file" from the search path).
#[test]
fn a_library_without_a_slash_is_relative_to_the_current_directory() {
    let dir = hermetic::temp_dir("lib-cwd");
    std::fs::write(dir.path().join("libfake.so"), b"not an ELF file").unwrap();
    let info: Vec<String> = ["info", "--no-check"].map(String::from).to_vec();
    let with_flag: Vec<String> = info.iter().cloned().chain(["--library".into(), "libfake.so".into()]).collect();
    type Case<'a> = (&'a [String], &'a [(&'a str, &'a str)]);
    let cases: [Case; 2] =
        [(&with_flag, &[]), (&info, &[("DROPCOMPUTE_SYNAPSE_LIB", "libfake.so"), ("DROPCOMPUTE_BACKEND", "synapse")])];
    for (args, vars) in cases {
        let (code, err, _) = run(args, vars, Some(dir.path()));
        assert_eq!(code, Some(3), "{vars:?}: {err}");
        assert!(err.contains("./libfake.so") && !err.contains("No such file"), "{vars:?}: {err}");
        assert!(no_backtrace(&err), "{err}");
    }
    // Missing under the automatic backend: refused naming the variable and the path (it used to
    // fall back to the mock silently in `train` and `bench`), exit 2, before any device call.
    for sub in [Subcommand::Train, Subcommand::BenchAllreduce, Subcommand::Info] {
        let (code, err, _) =
            run(&argv(sub, dir.path()), &[("DROPCOMPUTE_SYNAPSE_LIB", "libnone.so")], Some(dir.path()));
        assert_eq!(code, Some(2), "{}: {err}", sub.name());
        assert!(err.contains("DROPCOMPUTE_SYNAPSE_LIB") && err.contains("./libnone.so"), "{err}");
    }
    // The mock's timeout is the table's in `bench allreduce --library` too (it was exit 4 there).
    let mut args = argv(Subcommand::BenchAllreduce, dir.path());
    args.extend(["--library".into(), "libfake.so".into()]);
    let (code, err, _) = run(&args, &[("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS", "abc")], Some(dir.path()));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS") && err.contains("abc"), "{err}");
}
