//! The environment table: one row ([`Variable`]) per environment variable the product reads,
//! with its syntax, what unset means, what an empty value means, the subcommands that read it,
//! and its parser (the one the consumer uses, called, not copied). [`check_with`] walks the
//! table for one subcommand before any device or network call, so a variable is refused with
//! the same message (exit 2, naming the variable and the value) by every subcommand that reads
//! it (issue 24, found 7: `HLS_MODULE_ID=abc` was refused by `info` and accepted by `train`).
//!
//! **Empty values**: one rule for every row: an empty (or all-blank) value is refused with
//! [`EMPTY_REFUSED`] ("unset it instead"), never silently taken as unset, except the rows whose
//! [`Empty::Unset`] says why (`RUST_LOG` and `TMPDIR`: system conventions, where an empty value
//! means the default).
//!
//! **Libraries**: a variable or flag naming a library (`DROPCOMPUTE_SYNAPSE_LIB`, `--library`)
//! takes a path without `/` relative to the current directory (`habana_sys::library_path`),
//! never the system search path.
//!
//! The rows the user reads are rendered into README.md ("Environment variables"); a test
//! compares that table with [`table`]. Rows of the mock's variables exist with the cargo
//! feature `mock` (without it, the mock shared library checks them itself when loaded).
//!
//! Owns: [`table`], [`check_with`], [`EnvError`] (exit 2) and the parser of the test hook
//! `DROPCOMPUTE_TEST_SIGKILL_AT`. Must not touch: devices, sockets, files other than the
//! existence checks (directories, the named library), the resolver (`HCCL_COMM_ID` host names).
#![forbid(unsafe_code)]

use std::sync::LazyLock;

use crate::input::InputKind;

/// A bad value of an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {reason}")]
pub struct EnvError {
    /// The variable.
    pub variable: &'static str,
    /// Its value (lossy UTF-8), or `<N characters, not shown>` for a secret.
    pub value: String,
    /// The rule it breaks.
    pub reason: String,
}

/// The reason given for an empty value of a variable whose row is [`Empty::Refused`] (the
/// mock library words it alike: defined in `habana_sys`, which both depend on).
pub const EMPTY_REFUSED: &str = habana_sys::EMPTY_REFUSED;

/// The test hook of `train` (`train::workload`): `STEP[:RANK]`.
pub const ENV_TEST_SIGKILL_AT: &str = "DROPCOMPUTE_TEST_SIGKILL_AT";

/// Parses `DROPCOMPUTE_TEST_SIGKILL_AT`'s value: (step, optional rank).
///
/// # Errors
/// The reason when it is not `STEP` or `STEP:RANK` with unsigned integers.
pub fn parse_sigkill_at(v: &str) -> Result<(u64, Option<u32>), String> {
    let (s, r) = v.split_once(':').map_or((v, None), |(s, r)| (s, Some(r)));
    let step = s.trim().parse().map_err(|_| "expected STEP or STEP:RANK (unsigned integers)".to_string())?;
    let rank =
        r.map(|r| r.trim().parse().map_err(|_| "RANK after ':' is not an unsigned integer".to_string())).transpose()?;
    Ok((step, rank))
}

/// A subcommand of the `dropcompute` binary, as a reader of variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subcommand {
    /// `info`.
    Info,
    /// `train`.
    Train,
    /// `validate`.
    Validate,
    /// `tune`.
    Tune,
    /// `simulate`.
    Simulate,
    /// `bench allreduce`.
    BenchAllreduce,
    /// `bench kernels`.
    BenchKernels,
    /// `bench sim`.
    BenchSim,
    /// `bench scheduler`.
    BenchScheduler,
    /// The hidden rank process of `--launch processes` (`train`, `bench allreduce`).
    RankProcess,
}

impl Subcommand {
    /// Every subcommand.
    pub const ALL: [Self; 10] = [
        Self::Info,
        Self::Train,
        Self::Validate,
        Self::Tune,
        Self::Simulate,
        Self::BenchAllreduce,
        Self::BenchKernels,
        Self::BenchSim,
        Self::BenchScheduler,
        Self::RankProcess,
    ];

    /// Its words on the command line (`bench allreduce`); `rank process` for the hidden one.
    pub fn name(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Train => "train",
            Self::Validate => "validate",
            Self::Tune => "tune",
            Self::Simulate => "simulate",
            Self::BenchAllreduce => "bench allreduce",
            Self::BenchKernels => "bench kernels",
            Self::BenchSim => "bench sim",
            Self::BenchScheduler => "bench scheduler",
            Self::RankProcess => "rank process",
        }
    }
}

/// What an empty (or all-blank) value means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Empty {
    /// Refused with [`EMPTY_REFUSED`]: the rule of every product variable.
    Refused,
    /// Taken as unset; the text says whose convention makes this row an exception.
    Unset(&'static str),
}

/// One row of the environment table.
#[derive(Clone, Copy)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// Its syntax, for the user (README's table).
    pub syntax: &'static str,
    /// What unset means.
    pub unset: &'static str,
    /// What an empty value means.
    pub empty: Empty,
    /// The subcommands that read it.
    pub readers: &'static [Subcommand],
    /// A value the parser refuses (for the tests generated from the table and the docs).
    pub garbage: &'static str,
    /// A secret: the value is never echoed, only its length.
    pub secret: bool,
    /// The parser: the reason when a non-empty value is refused.
    pub parse: fn(&str) -> Result<(), String>,
}

impl std::fmt::Debug for Variable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variable").field("name", &self.name).field("readers", &self.readers).finish_non_exhaustive()
    }
}

impl Variable {
    /// Whether `command` reads this variable.
    pub fn read_by(&self, command: Subcommand) -> bool {
        self.readers.contains(&command)
    }

    /// Checks one value: the empty rule, then the parser.
    ///
    /// # Errors
    /// [`EnvError`] naming the variable, the value (or its length, for a secret) and the rule.
    pub fn check(&self, value: &str) -> Result<(), EnvError> {
        let bad = |reason: String| EnvError {
            variable: self.name,
            value: if self.secret {
                format!("<{} characters, not shown>", value.chars().count())
            } else {
                value.to_string()
            },
            reason,
        };
        if value.trim().is_empty() {
            return match self.empty {
                Empty::Refused => Err(bad(format!("{EMPTY_REFUSED}; unset: {}", self.unset))),
                Empty::Unset(_) => Ok(()),
            };
        }
        (self.parse)(value).map_err(bad)
    }
}

use Subcommand::{BenchAllreduce, BenchKernels, BenchScheduler, Info, RankProcess, Simulate, Train, Tune, Validate};

/// Every subcommand.
const ALL: &[Subcommand] = &Subcommand::ALL;
/// The subcommands that open a device (the backend, the library, the mock, the pinning).
const DEVICE: &[Subcommand] = &[Info, Train, Validate, BenchAllreduce, BenchScheduler, RankProcess];
/// The subcommands that run collectives (HCCL, the mock's collectives).
const COLLECTIVE: &[Subcommand] = &[Train, Validate, BenchAllreduce, RankProcess];
/// The subcommands with `--launch env` (the launcher's variables).
const LAUNCHER: &[Subcommand] = &[Train, BenchAllreduce, RankProcess];
/// `LOCAL_RANK`: the launcher's, and `info`'s device pinning.
const LOCAL_RANK_READERS: &[Subcommand] = &[Info, Train, BenchAllreduce, RankProcess];

/// The readers of an input kind's cap (`crate::input`).
fn cap_readers(kind: InputKind) -> &'static [Subcommand] {
    match kind {
        InputKind::Data => &[Train, Validate, RankProcess],
        InputKind::Params | InputKind::Checkpoint => &[Train, RankProcess],
        InputKind::Trace => &[Tune, Simulate, Validate],
        InputKind::Spec => &[Train, Validate, BenchAllreduce, RankProcess],
        InputKind::System => &[BenchKernels],
    }
}

fn existing_dir(v: &str) -> Result<(), String> {
    if std::path::Path::new(v).is_dir() { Ok(()) } else { Err("not an existing directory".into()) }
}

fn count(v: &str) -> Result<(), String> {
    crate::hccl::bootstrap::parse_count(v).map(drop)
}

fn module_pinning(name: &'static str) -> impl Fn(&str) -> Result<(), String> {
    // Local rank 0: only the syntax is judged here (the entry of a higher local rank is checked
    // where the rank picks its device, `hccl::bootstrap` and `synapse::Runtime`).
    move |v| {
        let only = |k: &str| (k == name).then(|| v.to_string());
        match crate::synapse::module_id_from_env(0, only) {
            Err(crate::synapse::Error::Config { reason, .. }) => Err(reason),
            _ => Ok(()),
        }
    }
}

fn synapse_lib(v: &str) -> Result<(), String> {
    let path = habana_sys::library_path(std::path::Path::new(v));
    if path.is_file() {
        Ok(())
    } else {
        let relative = if v.contains('/') { "" } else { " (a path without '/' is relative to the current directory)" };
        Err(format!("no library file at {}{relative}", path.display()))
    }
}

/// The launcher's numeric variables besides `LOCAL_RANK`: (name, what it is).
const LAUNCHER_NUMBERS: [(&str, &str); 10] = [
    ("RANK", "torchrun's rank"),
    ("WORLD_SIZE", "torchrun's world size"),
    ("LOCAL_WORLD_SIZE", "torchrun's processes on this host"),
    ("OMPI_COMM_WORLD_RANK", "Open MPI's rank"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's world size"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI's local rank"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI's processes on this host"),
    ("SLURM_PROCID", "Slurm's rank"),
    ("SLURM_NTASKS", "Slurm's world size"),
    ("SLURM_LOCALID", "Slurm's local rank"),
];

/// The launchers' job ids the one-host rendezvous keys its file by (`hccl::local`).
const ONE_HOST_JOB_IDS: [(&str, &str); 5] = [
    ("PMIX_NAMESPACE", "Open MPI's job id (PMIx namespace)"),
    ("OMPI_MCA_ess_base_jobid", "Open MPI's job id (older Open MPI)"),
    ("SLURM_JOB_ID", "Slurm's job id"),
    ("SLURM_STEP_ID", "Slurm's step id"),
    ("TORCHELASTIC_RUN_ID", "torchrun's run id"),
];

/// A job id: printable, no whitespace, at most 255 bytes (it becomes part of a file name).
fn job_id(v: &str) -> Result<(), String> {
    if v.len() > 255 {
        return Err(format!("{} bytes: at most 255", v.len()));
    }
    match v.chars().find(|c| c.is_whitespace() || c.is_control()) {
        Some(c) => Err(format!("contains {c:?}: a job id has no whitespace or control characters")),
        None => Ok(()),
    }
}

/// A default cap for the docs: `4 GiB`, `64 MiB`, else bytes.
fn binary_size(bytes: u64) -> String {
    match [(30, "GiB"), (20, "MiB"), (10, "KiB")].into_iter().find(|(shift, _)| bytes.is_multiple_of(1 << shift)) {
        Some((shift, unit)) => format!("{} {unit}", bytes >> shift),
        None => format!("{bytes} bytes"),
    }
}

static TABLE: LazyLock<Vec<Variable>> = LazyLock::new(build);

/// The environment table: one row per variable the product reads (see the module doc).
pub fn table() -> &'static [Variable] {
    &TABLE
}

/// The row of `name`, if the product reads it.
pub fn lookup_row(name: &str) -> Option<&'static Variable> {
    table().iter().find(|v| v.name == name)
}

/// A row under the empty rule ([`Empty::Refused`]), not a secret.
fn row(
    name: &'static str,
    syntax: &'static str,
    unset: &'static str,
    readers: &'static [Subcommand],
    garbage: &'static str,
    parse: fn(&str) -> Result<(), String>,
) -> Variable {
    Variable { name, syntax, unset, empty: Empty::Refused, readers, garbage, secret: false, parse }
}

fn build() -> Vec<Variable> {
    let mut t = vec![
        row(
            habana_sys::ENV_LIBRARY,
            "path of libSynapse.so (no `/`: relative to the current directory); must exist",
            "/usr/lib/habanalabs/libSynapse.so, else (auto backend) the CPU mock",
            DEVICE,
            "no-such-libSynapse.so",
            synapse_lib,
        ),
        row(crate::synapse::backend::ENV_BACKEND, "`auto`, `mock` or `synapse`", "auto", DEVICE, "gpu", |v| {
            crate::synapse::BackendChoice::parse(v).map(drop)
        }),
        row(
            "HLS_MODULE_ID",
            "module id (non-negative integer), the vendor's device pinning",
            "no pinning",
            DEVICE,
            "abc",
            |v| module_pinning("HLS_MODULE_ID")(v),
        ),
        row(
            "HABANA_VISIBLE_MODULES",
            "comma-separated module ids, entry LOCAL_RANK is used",
            "no pinning",
            DEVICE,
            "0,a",
            |v| module_pinning("HABANA_VISIBLE_MODULES")(v),
        ),
        row(
            habana_sys::comm_id::ENV_COMM_ID,
            "`ADDRESS:PORT`, split at the last `:` (the vendor's form: `::1:29500`, no brackets); host names resolved",
            "our TCP rendezvous",
            COLLECTIVE,
            "10.0.0.1",
            |v| habana_sys::comm_id::parse_comm_id(v).map(drop).map_err(|e| e.reason),
        ),
        row(
            "DROPCOMPUTE_MOCK_VERSION",
            "`MAJOR.MINOR[.PATCH]`, the version the mock reports",
            "the mock's own version",
            DEVICE,
            "latest",
            |v| {
                habana_sys::parse_version(v)
                    .map(drop)
                    .ok_or_else(|| "expected a version MAJOR.MINOR[.PATCH] (e.g. 1.21.0)".to_string())
            },
        ),
        row(
            "DROPCOMPUTE_MOCK_LOCK_DIR",
            "existing directory for the mock's cross-process device locks",
            "no cross-process locks",
            DEVICE,
            "/proc/self/status",
            existing_dir,
        ),
        Variable {
            empty: Empty::Unset("the C library's convention: empty means the default /tmp"),
            ..row("TMPDIR", "existing directory", "/tmp", ALL, "/proc/self/status", existing_dir)
        },
        Variable {
            empty: Empty::Unset("tracing's convention: an empty filter is the default level"),
            ..row(
                "RUST_LOG",
                "a tracing filter (`dropcompute=debug`); overrides -v",
                "warnings (-v debug, -vv trace)",
                ALL,
                "[[[",
                |v| {
                    tracing_subscriber::EnvFilter::try_new(v)
                        .map(drop)
                        .map_err(|e| format!("not a tracing filter: {e}"))
                },
            )
        },
        row(
            ENV_TEST_SIGKILL_AT,
            "`STEP[:RANK]` (test hook: the rank SIGKILLs itself at that step)",
            "off",
            &[Train, Validate, RankProcess],
            "four",
            |v| parse_sigkill_at(v).map(drop),
        ),
        row(
            "DROPCOMPUTE_LAUNCHER",
            "`torchrun`, `openmpi` or `slurm`: read only that launcher's variables",
            "every launcher present, which must agree",
            LAUNCHER,
            "pbs",
            crate::hccl::bootstrap::parse_launcher,
        ),
        row(
            "DROPCOMPUTE_RENDEZVOUS",
            "`HOST:PORT`, `IPv4:PORT` or `[IPv6]:PORT`: rank 0's address",
            "MASTER_ADDR and MASTER_PORT",
            LAUNCHER,
            "::1:29500",
            |v| crate::hccl::bootstrap::parse_rendezvous(v).map(drop),
        ),
        row(
            "MASTER_ADDR",
            "host name, IPv4 or IPv6 (`::1` or `[::1]`), no port",
            "DROPCOMPUTE_RENDEZVOUS or HCCL_COMM_ID needed for world size > 1",
            LAUNCHER,
            "[::1",
            |v| crate::hccl::bootstrap::parse_master_addr(v).map(drop),
        ),
        row("MASTER_PORT", "port in 1..=65535", "needed with MASTER_ADDR", LAUNCHER, "http", |v| {
            habana_sys::addr::parse_port(v).map(drop)
        }),
        Variable {
            secret: true,
            ..row(
                "DROPCOMPUTE_JOB_SECRET",
                "hex, at least 128 bits (`openssl rand -hex 16`); never echoed",
                "needed for world size > 1 over our TCP rendezvous",
                LAUNCHER,
                "abcd",
                |v| crate::hccl::rendezvous::JobSecret::from_hex(v).map(drop).map_err(|e| e.to_string()),
            )
        },
        row(
            "LOCAL_RANK",
            "torchrun's local rank (non-negative integer)",
            "0 for one rank",
            LOCAL_RANK_READERS,
            "x",
            count,
        ),
    ];
    for (name, what) in LAUNCHER_NUMBERS {
        let syntax: &'static str = Box::leak(format!("{what} (non-negative integer)").into_boxed_str());
        t.push(row(name, syntax, "not this launcher", LAUNCHER, "-1", count));
    }
    // The one-host rendezvous (`hccl::local`): the launchers' job ids (part of the private
    // file's name: an empty one would be shared by every job) and node counts.
    for (name, what) in ONE_HOST_JOB_IDS {
        let syntax: &'static str =
            Box::leak(format!("{what} (printable, no whitespace; at most 255 bytes)").into_boxed_str());
        t.push(row(name, syntax, "no one-host rendezvous for this launcher", LAUNCHER, "job 1", job_id));
    }
    for name in ["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"] {
        t.push(row(name, "Slurm's node count (non-negative integer)", "not one host", LAUNCHER, "-1", count));
    }
    t.push(row(
        "TORCHELASTIC_USE_AGENT_STORE",
        "`True`/`true`/`1` or `False`/`false`/`0`: torchrun's agent serves MASTER_ADDR:MASTER_PORT",
        "False",
        LAUNCHER,
        "maybe",
        |v| match v {
            "True" | "true" | "1" | "False" | "false" | "0" => Ok(()),
            _ => Err("expected True, true, 1, False, false or 0".into()),
        },
    ));
    t.push(Variable {
        empty: Empty::Unset("the XDG base directory convention: empty means unset"),
        ..row(
            "XDG_RUNTIME_DIR",
            "absolute path; the one-host rendezvous file's directory when it exists (else TMPDIR)",
            "TMPDIR",
            LAUNCHER,
            "run/user",
            |v| if v.starts_with('/') { Ok(()) } else { Err("not an absolute path (the XDG convention)".into()) },
        )
    });
    for kind in InputKind::ALL {
        t.push(row(
            kind.variable(),
            "bytes, optional suffix K, M, G (KiB, MiB, GiB); at least 1",
            Box::leak(binary_size(kind.default_cap()).into_boxed_str()),
            cap_readers(kind),
            "1.5M",
            |v| crate::input::parse_bytes(v).map(drop),
        ));
    }
    let mut line_readers: Vec<Subcommand> = Vec::new();
    for kind in InputKind::ALL.into_iter().filter(|k| k.line_capped()) {
        line_readers.extend(cap_readers(kind).iter().filter(|s| !line_readers.contains(s)).collect::<Vec<_>>());
    }
    t.push(row(
        crate::input::LINE_VARIABLE,
        "bytes, optional suffix K, M, G (KiB, MiB, GiB); at least 1",
        Box::leak(binary_size(crate::input::DEFAULT_LINE_CAP).into_boxed_str()),
        Box::leak(line_readers.into_boxed_slice()),
        "lots",
        |v| crate::input::parse_bytes(v).map(drop),
    ));
    #[cfg(feature = "mock")]
    t.extend([
        row(
            habana_mock::config::ENV_CONFIG,
            "the mock's configuration, a JSON object (`{\"devices\":2}`; an array or a scalar is refused); wins over DROPCOMPUTE_MOCK_DEVICES",
            "the default mock",
            DEVICE,
            "{devices:2}",
            |v| habana_mock::MockConfig::from_json(v).map(drop).map_err(|e| e.why),
        ),
        row(
            habana_mock::config::ENV_DEVICES,
            "mock device count in 1..=65536",
            "8, or the thread ranks",
            DEVICE,
            "0",
            |v| habana_mock::config::parse_devices(v).map(drop),
        ),
        row(
            habana_mock::config::ENV_TIMEOUT_MS,
            "the mock's collective timeout, ms in 1..=3600000",
            "30000",
            COLLECTIVE,
            "abc",
            |v| habana_mock::config::parse_timeout_ms(v).map(drop),
        ),
    ]);
    t
}

/// The table as Markdown (README.md's "Environment variables" section, kept equal by a test):
/// variable, syntax, unset, empty, read by.
pub fn markdown() -> String {
    let mut out = String::from("| variable | syntax | unset | empty | read by |\n|---|---|---|---|---|\n");
    for v in table() {
        let empty = match v.empty {
            Empty::Refused => "refused: unset it instead".to_string(),
            Empty::Unset(why) => format!("as unset ({why})"),
        };
        let readers = if v.readers.len() == Subcommand::ALL.len() {
            "every subcommand".to_string()
        } else {
            v.readers.iter().filter(|r| **r != Subcommand::RankProcess).map(|r| r.name()).collect::<Vec<_>>().join(", ")
        };
        out.push_str(&format!("| `{}` | {} | {} | {} | {} |\n", v.name, v.syntax, v.unset, empty, readers));
    }
    out
}

/// Checks every variable of the table that `command` reads and that is set, through `lookup`
/// (the process environment in [`check`]), in table order.
///
/// # Errors
/// The first bad one, as [`EnvError`].
pub fn check_with(command: Subcommand, lookup: impl Fn(&str) -> Option<String>) -> Result<(), EnvError> {
    for var in table().iter().filter(|v| v.read_by(command)) {
        if let Some(value) = lookup(var.name) {
            var.check(&value)?;
        }
    }
    Ok(())
}

/// [`check_with`] over the process environment.
///
/// # Errors
/// As [`check_with`].
pub fn check(command: Subcommand) -> Result<(), EnvError> {
    check_with(command, |k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_value_is_named_and_good_ones_pass() {
        let one =
            |k: &'static str, v: &'static str| check_with(Subcommand::Train, move |q| (q == k).then(|| v.to_string()));
        assert_eq!(one("HCCL_COMM_ID", "::1:29576"), Ok(()));
        assert_eq!(one("DROPCOMPUTE_MOCK_VERSION", "1.21.0"), Ok(()));
        assert_eq!(one("RUST_LOG", "dropcompute=debug"), Ok(()));
        assert_eq!(one("RUST_LOG", ""), Ok(()));
        assert_eq!(one("TMPDIR", " "), Ok(()));
        assert_eq!(one(ENV_TEST_SIGKILL_AT, "4:1"), Ok(()));
        assert_eq!(one("MASTER_ADDR", "[::1]"), Ok(()));
        for (k, v) in [
            ("HCCL_COMM_ID", "[::1]:29575"),
            ("DROPCOMPUTE_MOCK_VERSION", "latest"),
            ("DROPCOMPUTE_MOCK_LOCK_DIR", "/proc/self/status"),
            ("TMPDIR", "/proc/self/status"),
            ("RUST_LOG", "[[["),
            (ENV_TEST_SIGKILL_AT, "four"),
            (ENV_TEST_SIGKILL_AT, "4:x"),
            ("DROPCOMPUTE_BACKEND", ""),
            ("HLS_MODULE_ID", " "),
        ] {
            let e = one(k, v).unwrap_err();
            assert_eq!((e.variable, e.value.as_str()), (k, v));
        }
    }

    /// Every row: its garbage and an empty value are refused naming it (or, for the documented
    /// exceptions, the empty value passes); a secret is never echoed; names are unique.
    #[test]
    fn every_row_refuses_its_garbage_and_applies_the_empty_rule() {
        let mut names: Vec<&str> = table().iter().map(|v| v.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a variable has two rows");
        for var in table() {
            assert!(!var.readers.is_empty(), "{}: no reader", var.name);
            let e = var.check(var.garbage).expect_err(var.name);
            assert_eq!(e.variable, var.name);
            if var.secret {
                assert!(!e.to_string().contains(var.garbage), "{e}");
            }
            match (var.empty, var.check("")) {
                (Empty::Refused, Err(e)) => assert!(e.reason.contains("unset it instead"), "{e}"),
                (Empty::Unset(_), Ok(())) => {}
                (_, got) => panic!("{}: empty gave {got:?}", var.name),
            }
        }
    }

    #[test]
    fn a_variable_is_checked_only_by_its_readers() {
        let bad = |k: &'static str| move |q: &str| (q == k).then(|| "garbage".to_string());
        assert!(check_with(Subcommand::Simulate, bad("MASTER_PORT")).is_ok());
        assert!(check_with(Subcommand::Train, bad("MASTER_PORT")).is_err());
        assert!(check_with(Subcommand::Tune, bad("DROPCOMPUTE_MAX_TRACE_BYTES")).is_err());
    }
}
