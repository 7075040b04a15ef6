//! The hostile world (issue 24), table-driven, run as real processes:
//! - every file input (`train --data`, `--init-params`, `--resume DIR`'s checkpoint files, `tune
//!   --trace`, `simulate --trace`) x {`/dev/zero`, a FIFO no one writes (SIGTERM sent), a
//!   directory, an empty file, a 100 MB single line, a truncated gzip}: the exit code of the
//!   README's table, a message naming the input, no panic or backtrace, an end within a bound,
//!   and for `train` a previous `--out` untouched with no staging directory left;
//! - every subcommand x {stdout a closed pipe, stdout `/dev/full`, stderr `/dev/full`}: a quiet
//!   exit 0, exit 6 naming stdout, exit 0; `train`'s `--out` written in each case.
//!
//! Every row runs; the failures are listed together.
#![cfg(feature = "mock")] // train, validate and bench kernels|scheduler run on the CPU mock

#[path = "support/hermetic.rs"]
mod hermetic;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Longest a row may take (generous: the suite shares two cores with other builds).
const ROW_BOUND: Duration = Duration::from_secs(20);
/// How long a FIFO row waits before it sends SIGTERM.
const FIFO_WAIT: Duration = Duration::from_millis(400);
/// Longest the stop may take after SIGTERM (the reader's tick is 100 ms).
const STOP_BOUND: Duration = Duration::from_secs(5);

/// The fast `train` of every row (virtual time, 3 steps, a fixed threshold: no tuning).
const TRAIN: &[&str] = &["train", "--ranks", "2", "--steps", "3", "--threshold", "20", "--time-mode", "virtual"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Hostile {
    DevZero,
    Fifo,
    Directory,
    Empty,
    LongLine,
    TruncatedGzip,
}

const HOSTILE: [Hostile; 6] =
    [Hostile::DevZero, Hostile::Fifo, Hostile::Directory, Hostile::Empty, Hostile::LongLine, Hostile::TruncatedGzip];

/// How a row ended.
struct Ran {
    status: ExitStatus,
    stderr: String,
    took: Duration,
}

/// Runs `cmd` (stdin null; stdout as set by the caller, else null; stderr to a file unless
/// `stderr` is given), sending SIGTERM after `term_after` when set; kills it past [`ROW_BOUND`].
fn run(mut cmd: Command, term_after: Option<Duration>, stderr: Option<Stdio>) -> Ran {
    let dir = hermetic::temp_dir("hostile-stderr");
    let err_path = dir.path().join("stderr");
    let err = match stderr {
        Some(s) => s,
        None => Stdio::from(std::fs::File::create(&err_path).expect("stderr file")),
    };
    let start = Instant::now();
    let mut child = cmd.stdin(Stdio::null()).stderr(err).spawn().expect("spawn dropcompute");
    if let Some(after) = term_after {
        std::thread::sleep(after);
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    }
    let status = hermetic::wait_until(ROW_BOUND, || child.try_wait().expect("wait"));
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().expect("wait after kill")
    });
    let took = start.elapsed();
    Ran { status, stderr: std::fs::read_to_string(&err_path).unwrap_or_default(), took }
}

fn dropcompute(args: &[String]) -> Command {
    let mut c = hermetic::dropcompute();
    c.args(args).stdout(Stdio::null());
    c
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_string()).collect()
}

fn no_panic(r: &Ran) -> Result<(), String> {
    if r.stderr.contains("panicked") || r.stderr.contains("RUST_BACKTRACE") || r.status.code() == Some(101) {
        return Err(format!("panicked: {}", r.stderr));
    }
    Ok(())
}

/// The shared hostile files of one test: a 100 MB line, a truncated gzip, an empty file.
struct World {
    dir: tempfile::TempDir,
    long_line: PathBuf,
    truncated_gz: PathBuf,
    empty: PathBuf,
}

impl World {
    fn new() -> Self {
        let dir = hermetic::temp_dir("hostile");
        let long_line = dir.path().join("long.csv");
        std::fs::write(&long_line, vec![b'7'; 100 << 20]).expect("100 MB line");
        let truncated_gz = dir.path().join("truncated.csv.gz");
        // The shipped digits, cut in half: a gzip stream that ends early.
        let gz = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv.gz")).expect("digits");
        std::fs::write(&truncated_gz, &gz[..gz.len() / 2]).expect("truncated gzip");
        let empty = dir.path().join("empty.csv");
        std::fs::write(&empty, "").expect("empty");
        Self { dir, long_line, truncated_gz, empty }
    }

    /// Puts hostile input `h` at `at` (a FIFO, a directory or a symlink to the shared file).
    fn place(&self, h: Hostile, at: &Path) {
        let link = |to: &Path| std::os::unix::fs::symlink(to, at).expect("symlink");
        match h {
            Hostile::DevZero => link(Path::new("/dev/zero")),
            Hostile::Fifo => {
                assert!(Command::new("mkfifo").arg(at).status().expect("mkfifo").success(), "mkfifo {}", at.display());
            }
            Hostile::Directory => std::fs::create_dir(at).expect("dir"),
            Hostile::Empty => link(&self.empty),
            Hostile::LongLine => link(&self.long_line),
            Hostile::TruncatedGzip => link(&self.truncated_gz),
        }
    }
}

/// A file input: its flag's arguments given the hostile path, and the exit code of each case
/// (`None`: a command without a stop handler dies of SIGTERM).
struct FileInput {
    name: &'static str,
    /// Is a `--resume DIR`: the hostile file is each rank's checkpoint inside DIR.
    resume: bool,
    args: fn(&Path) -> Vec<String>,
    code: fn(Hostile) -> Option<i32>,
}

fn train_with(flag: &str, p: &Path) -> Vec<String> {
    let mut v = s(TRAIN);
    v.extend([flag.to_string(), p.display().to_string()]);
    v
}

/// Every file input x every hostile case.
#[test]
fn every_file_input_refuses_every_hostile_file() {
    let world = World::new();
    let inputs = [
        FileInput {
            name: "train --data",
            resume: false,
            args: |p| train_with("--data", p),
            code: |h| Some(if h == Hostile::Fifo { 130 } else { 6 }),
        },
        FileInput {
            name: "train --init-params",
            resume: false,
            args: |p| train_with("--init-params", p),
            code: |h| Some(if h == Hostile::Fifo { 130 } else { 6 }),
        },
        FileInput {
            name: "train --resume",
            resume: true,
            args: |p| train_with("--resume", p),
            code: |h| Some(if h == Hostile::Fifo { 130 } else { 7 }),
        },
        FileInput {
            name: "tune --trace",
            resume: false,
            args: |p| s(&["tune", "--trace", &p.display().to_string()]),
            code: |h| if h == Hostile::Fifo { None } else { Some(6) },
        },
        FileInput {
            name: "simulate --trace",
            resume: false,
            args: |p| s(&["simulate", "--trace", &p.display().to_string()]),
            code: |h| if h == Hostile::Fifo { None } else { Some(6) },
        },
    ];
    let mut failures = Vec::new();
    let mut rows = 0;
    let start = Instant::now();
    for (i, input) in inputs.iter().enumerate() {
        for h in HOSTILE {
            rows += 1;
            let row = format!("{} x {h:?}", input.name);
            let root = world.dir.path().join(format!("row-{i}-{h:?}"));
            std::fs::create_dir(&root).expect("row dir");
            let (path, named) = if input.resume {
                let dir = root.join("ckpt");
                for r in 0..2 {
                    let rank = dir.join(format!("rank-{r}"));
                    std::fs::create_dir_all(&rank).expect("rank dir");
                    world.place(h, &rank.join(dropcompute::checkpoint::file_name(3)));
                }
                (dir.clone(), dir)
            } else if h == Hostile::DevZero {
                (PathBuf::from("/dev/zero"), PathBuf::from("/dev/zero"))
            } else {
                let p = root.join(if h == Hostile::TruncatedGzip { "input.csv.gz" } else { "input.csv" });
                world.place(h, &p);
                (p.clone(), p)
            };
            let mut args = (input.args)(&path);
            let out = root.join("out");
            let is_train = args[0] == "train";
            if is_train {
                std::fs::create_dir(&out).expect("out");
                std::fs::write(out.join("report.json"), "previous run").expect("previous");
                args.extend(["--out".to_string(), out.display().to_string()]);
            }
            let mut cmd = dropcompute(&args);
            if input.resume && h == Hostile::DevZero {
                // 1 GiB of zeros per rank at the default cap: the row checks the variable.
                cmd.env("DROPCOMPUTE_MAX_CHECKPOINT_BYTES", "8M");
            }
            let ran = run(cmd, (h == Hostile::Fifo).then_some(FIFO_WAIT), None);
            let check = || -> Result<(), String> {
                no_panic(&ran)?;
                let want = (input.code)(h);
                let got = ran.status.code();
                match want {
                    Some(c) if got != Some(c) => return Err(format!("exit {got:?}, want {c}: {}", ran.stderr)),
                    None if !(ran.status.signal() == Some(15) || got == Some(130)) => {
                        return Err(format!("{:?}, want SIGTERM or 130", ran.status));
                    }
                    _ => {}
                }
                if got.is_some() && !ran.stderr.contains(&named.display().to_string()) {
                    return Err(format!("stderr does not name {}: {}", named.display(), ran.stderr));
                }
                if input.resume && h == Hostile::DevZero && !ran.stderr.contains("DROPCOMPUTE_MAX_CHECKPOINT_BYTES") {
                    return Err(format!("the cap's variable is not named: {}", ran.stderr));
                }
                let line_cap_named =
                    ran.stderr.contains("1048576") && ran.stderr.contains("DROPCOMPUTE_MAX_LINE_BYTES");
                if h == Hostile::LongLine && want == Some(6) && input.name != "train --init-params" && !line_cap_named {
                    return Err(format!("the line cap is not named: {}", ran.stderr));
                }
                let bound = if h == Hostile::Fifo { FIFO_WAIT + STOP_BOUND } else { ROW_BOUND };
                if ran.took > bound {
                    return Err(format!("took {:?} > {bound:?}", ran.took));
                }
                if is_train {
                    let kept = std::fs::read_to_string(out.join("report.json")).unwrap_or_default();
                    if kept != "previous run" {
                        return Err(format!("--out lost its previous report: {kept:?}"));
                    }
                    let stray: Vec<_> = std::fs::read_dir(&root)
                        .expect("row dir")
                        .filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
                        .collect();
                    if !stray.is_empty() {
                        return Err(format!("staging left behind: {stray:?}"));
                    }
                }
                Ok(())
            };
            eprintln!("{row}: {:?} in {:?}", ran.status, ran.took);
            if let Err(why) = check() {
                failures.push(format!("{row}: {why}"));
            }
        }
    }
    eprintln!("hostile file rows: {rows} in {:?}", start.elapsed());
    assert_eq!(rows, 30);
    assert!(failures.is_empty(), "{} of {rows} rows failed:\n{}", failures.len(), failures.join("\n"));
}

/// Every subcommand x {stdout a closed pipe, stdout `/dev/full`, stderr `/dev/full`}.
#[test]
fn every_subcommand_survives_failing_standard_streams() {
    let dir = hermetic::temp_dir("hostile-streams");
    // A compute log long enough for tune's verdict (10 steps after warm-up, 2 ranks).
    let log_out = dir.path().join("log");
    let mut args = s(TRAIN);
    args[4] = "16".into();
    args.extend(s(&["--no-compare", "--out", &log_out.display().to_string()]));
    let made = run(dropcompute(&args), None, None);
    assert_eq!(made.status.code(), Some(0), "{}", made.stderr);
    let log = log_out.join("compute_log_dropcompute.csv").display().to_string();
    let commands: Vec<(&str, Vec<String>)> = vec![
        ("info", s(&["info", "--no-check"])),
        ("train", s(TRAIN)),
        ("tune", s(&["tune", "--trace", &log])),
        ("simulate", s(&["simulate", "--workers", "4"])),
        (
            "validate",
            s(&[
                "validate",
                "--ranks",
                "4",
                "--seeds",
                "0",
                "--steps",
                "4",
                "--threshold",
                "20",
                "--time-mode",
                "virtual",
            ]),
        ),
        ("bench sim", s(&["bench", "sim", "--workers", "4", "--steps", "10"])),
        ("bench kernels", s(&["bench", "kernels", "--reps", "1", "--sizes", "65536"])),
        (
            "bench allreduce",
            s(&["bench", "allreduce", "--ranks", "2", "--min-bytes", "1024", "--max-bytes", "1024", "--iters", "1"]),
        ),
        ("bench scheduler", s(&["bench", "scheduler", "--reps", "1"])),
        // clap's own output: --help and --version through the same writer (QA: exit 0 on a full
        // stdout).
        ("--help", s(&["--help"])),
        ("train --help", s(&["train", "--help"])),
        ("--version", s(&["--version"])),
    ];
    #[derive(Clone, Copy, Debug)]
    enum Fault {
        StdoutClosedPipe,
        StdoutFull,
        StderrFull,
    }
    let mut failures = Vec::new();
    let mut rows = 0;
    let start = Instant::now();
    for (name, args) in &commands {
        for fault in [Fault::StdoutClosedPipe, Fault::StdoutFull, Fault::StderrFull] {
            rows += 1;
            let row = format!("{name} x {fault:?}");
            let out = dir.path().join(format!("out-{}-{fault:?}", name.replace(' ', "-")));
            let mut args = args.clone();
            if *name == "train" {
                args.extend(["--out".to_string(), out.display().to_string()]);
            }
            let mut cmd = dropcompute(&args);
            let mut stderr = None;
            match fault {
                Fault::StdoutClosedPipe => {
                    let (reader, writer) = std::io::pipe().expect("pipe");
                    drop(reader);
                    cmd.stdout(writer);
                }
                Fault::StdoutFull => {
                    cmd.stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full"));
                }
                Fault::StderrFull => {
                    stderr = Some(Stdio::from(
                        std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full"),
                    ));
                }
            }
            let ran = run(cmd, None, stderr);
            let check = || -> Result<(), String> {
                no_panic(&ran)?;
                let code = ran.status.code();
                match fault {
                    Fault::StdoutClosedPipe if code != Some(0) || !ran.stderr.is_empty() => {
                        return Err(format!("exit {code:?}, want a quiet 0; stderr: {}", ran.stderr));
                    }
                    Fault::StdoutFull if code != Some(6) || !ran.stderr.contains("writing stdout") => {
                        return Err(format!("exit {code:?}, want 6 naming stdout; stderr: {}", ran.stderr));
                    }
                    Fault::StderrFull if code != Some(0) => return Err(format!("exit {code:?}, want 0")),
                    _ => {}
                }
                if ran.took > ROW_BOUND {
                    return Err(format!("took {:?}", ran.took));
                }
                if *name == "train" && !out.join("report.json").is_file() {
                    return Err(format!("--out {} has no report.json", out.display()));
                }
                Ok(())
            };
            if let Err(why) = check() {
                failures.push(format!("{row}: {why}"));
            }
        }
    }
    // A failing stderr keeps the failure's exit code (the message is lost, not the class).
    rows += 1;
    let mut cmd = dropcompute(&s(&["tune", "--trace", &dir.path().join("absent.csv").display().to_string()]));
    cmd.stdout(Stdio::null());
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let ran = run(cmd, None, Some(Stdio::from(full)));
    if ran.status.code() != Some(6) {
        failures.push(format!("tune --trace absent x StderrFull: {:?}, want exit 6", ran.status));
    }
    eprintln!("hostile stream rows: {rows} in {:?}", start.elapsed());
    assert_eq!(rows, 37);
    assert!(failures.is_empty(), "{} of {rows} rows failed:\n{}", failures.len(), failures.join("\n"));
}
