//! The library side of every `dropcompute` subcommand, one module each: [`info`], [`train`]
//! and [`validate`] (cargo feature `mock`), [`tune`], [`simulate`], [`bench`]. Each has its clap `Args` and a
//! `run`, so the binary (`src/main.rs`, `src/cli/`) only parses, sets up logging, dispatches and
//! maps errors to exit codes. [`BackendArgs`] are the backend flags shared by `info` and
//! `bench allreduce`.
//!
//! Owns: flag names, defaults and validation (each error naming the flag and value), and what
//! the commands print or write. Must not touch: the algorithms (`tune`, `sim`, `policy`,
//! `schedule`), the training job (`train`), the device layers (`synapse`, `hccl`) beyond calling
//! them, charts (`plot`), or process exit codes (the binary's `cli::exit`).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use dropcompute::synapse::{Backend, BackendChoice};

pub mod bench;
pub mod info;
pub mod simulate;
#[cfg(feature = "mock")]
pub mod train;
pub mod tune;
#[cfg(feature = "mock")]
pub mod validate;

/// The error of a command whose failures span several layers (`info`, `bench`, `train`): one of
/// the crate's typed errors ([`CommandError`], `synapse::Error`, `hccl::HcclError`,
/// `train::error::TrainError`, ...), boxed so the binary can classify it by downcasting
/// (`cli::exit::classify`) and print its source chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the commands themselves (the layers' own errors pass through typed).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Reading or validating a trace failed.
    #[error(transparent)]
    Trace(#[from] dropcompute::trace::TraceError),
    /// A model or simulation parameter was invalid.
    #[error(transparent)]
    Sim(#[from] dropcompute::sim::SimError),
    /// Writing output failed; `what` names the file or stream.
    #[error("writing {what}: {source}")]
    Io {
        /// Output name.
        what: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing standard output failed (`EPIPE`: the reader went away; `ENOSPC`, ...).
    #[error("{0}")]
    Stream(#[from] dropcompute::console::StreamError),
    /// Drawing the SVG failed.
    #[error("plot: {0}")]
    Plot(String),
    /// An argument is invalid; the message names the flag and its value, e.g.
    /// `--min-bytes 0 / --max-bytes 4096: need 0 < min <= max`.
    #[error("argument: {0}")]
    Args(String),
    /// An environment variable the command reads is invalid (e.g. `LOCAL_RANK` for `info`).
    #[error("environment variable {variable}={value:?}: {why}")]
    Env {
        /// The variable's name.
        variable: &'static str,
        /// Its value as found.
        value: String,
        /// What is required.
        why: &'static str,
    },
    /// `info`'s device self-check read back different data than it wrote.
    #[error("self-check failed: {0}")]
    SelfCheck(String),
}

/// Backend options shared by the subcommands that touch a device (`info`, `bench allreduce`).
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// Backend: auto (real libSynapse.so if installed, else the CPU mock), mock, or synapse.
    /// Defaults to $DROPCOMPUTE_BACKEND, else auto.
    #[arg(long, value_parser = ["auto", "mock", "synapse"])]
    pub backend: Option<String>,
    /// Runtime library to load (implies --backend synapse); also $DROPCOMPUTE_SYNAPSE_LIB.
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
}

impl BackendArgs {
    /// Resolves the flags (and environment) into a selected backend.
    ///
    /// # Errors
    /// [`CommandError::Args`] for `--library` with `--backend` other than `synapse`, or
    /// `--backend mock` in a build without the cargo feature `mock`; `synapse::Error` when
    /// `$DROPCOMPUTE_BACKEND` is invalid or the chosen backend cannot be loaded.
    pub fn select(&self) -> Result<Backend, BoxError> {
        let choice = match (&self.library, self.backend.as_deref()) {
            (Some(p), None | Some("synapse")) => BackendChoice::Synapse(Some(p.clone())),
            (Some(p), Some(other)) => {
                return Err(
                    CommandError::Args(format!("--library {} conflicts with --backend {other}", p.display())).into()
                );
            }
            #[cfg(feature = "mock")]
            (None, Some("mock")) => BackendChoice::Mock,
            #[cfg(not(feature = "mock"))]
            (None, Some("mock")) => {
                return Err(CommandError::Args(
                    "--backend mock: this build has no CPU mock (cargo feature `mock`)".into(),
                )
                .into());
            }
            (None, Some("synapse")) => BackendChoice::Synapse(None),
            (None, Some(_)) => BackendChoice::Auto,
            (None, None) => BackendChoice::from_env()?,
        };
        Ok(Backend::select(&choice)?)
    }
}

/// The guardrail flags of every command that recommends a threshold (`tune`, `train
/// --threshold auto`): one definition, so both have the same names and defaults
/// ([`dropcompute::tune::Guardrails::default`]).
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
pub struct GuardrailArgs {
    /// Guardrail: maximum mean drop rate of the replayed run (fraction in [0, 1]).
    #[arg(long, default_value_t = dropcompute::tune::Guardrails::default().max_drop_rate, allow_negative_numbers = true)]
    pub max_drop_rate: f64,
    /// Guardrail: minimum fraction of the global batch computed in every replayed step.
    #[arg(long, default_value_t = dropcompute::tune::Guardrails::default().min_batch_fraction, allow_negative_numbers = true)]
    pub min_batch_fraction: f64,
    /// Guardrail: minimum replayed effective speedup to enable dropping (0.02 = +2 %).
    #[arg(long, default_value_t = dropcompute::tune::Guardrails::default().min_gain, allow_negative_numbers = true)]
    pub min_gain: f64,
    /// The run-time drop-rate guard (`policy::DropGuard`, a fraction in (0, 1]): a step runs
    /// with the threshold off when enforcing it could take the run's cumulative drop rate above
    /// it. `train`: the second run holds it (digits task only: the text task counts tokens),
    /// its auto threshold and prediction replaying it; `tune`: every candidate is replayed with
    /// it; `simulate --policy/--trace`: each policy's replay runs it. Not given: no guard.
    #[arg(long, allow_negative_numbers = true)]
    pub drop_guard: Option<f64>,
    /// Timing jitter the recommended threshold must tolerate (ms, >= 0): a candidate is judged
    /// by the worst replay within +- this of it, every one within the guardrails
    /// (`tune::Guardrails::jitter_ns`). 0 (default): the point replay. Use about the spread of
    /// a micro-batch's host time between runs on a loaded host.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub jitter_ms: f64,
}

impl GuardrailArgs {
    /// The guardrails, checked.
    ///
    /// # Errors
    /// `"--FLAG VALUE: must be a fraction in [0, 1]"` for the first flag out of range, then
    /// `"--jitter-ms VALUE: must be a finite number of ms >= 0"`
    /// ([`dropcompute::tune::Guardrails::validate`]).
    pub fn guardrails(&self) -> Result<dropcompute::tune::Guardrails, String> {
        let g = dropcompute::tune::Guardrails {
            max_drop_rate: self.max_drop_rate,
            min_batch_fraction: self.min_batch_fraction,
            min_gain: self.min_gain,
            jitter_ns: self.jitter_ms * 1e6,
        };
        g.validate().map(|()| g)
    }

    /// Refuses `--jitter-ms` above 0 on a path that picks no threshold (`what`: the threshold
    /// sweep of `simulate`, which prints every threshold's replay).
    ///
    /// # Errors
    /// `"--jitter-ms J: WHAT does not judge thresholds by a jitter window; ..."` naming where
    /// the window applies.
    pub fn refuse_jitter(&self, what: &str) -> Result<(), String> {
        if self.jitter_ms > 0.0 {
            return Err(format!(
                "--jitter-ms {}: {what} does not judge thresholds by a jitter window; it applies to `tune` (its \
                 recommendation, --policy and --auto-for POLICY), `simulate --policy/--trace` and `train \
                 --threshold auto`",
                self.jitter_ms
            ));
        }
        Ok(())
    }

    /// `--drop-guard`, checked by the guard's own rule ([`dropcompute::policy::DropGuard::check`]).
    ///
    /// # Errors
    /// `"--drop-guard VALUE: must be a fraction in (0, 1]"` when given outside (0, 1] or not finite.
    pub fn drop_guard(&self) -> Result<Option<f64>, String> {
        self.drop_guard
            .map(|g| {
                dropcompute::policy::DropGuard::check(g)
                    .map_err(|_| format!("--drop-guard {g}: must be a fraction in (0, 1]"))
            })
            .transpose()
    }
}

/// A rejected tail flag: `--FLAG VALUE: why` ([`TailArgs::tail`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("--{flag} {value}: {why}")]
pub struct TailArgError {
    /// The flag without dashes (`tail-split` or `tail-cost`).
    pub flag: &'static str,
    /// The value given.
    pub value: String,
    /// What is required.
    pub why: String,
}

/// The second compiled shape ([`dropcompute::policy::TailShape`]) of `simulate`/`tune --policy` and
/// `train`: one definition, so all three spell and check it alike.
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
pub struct TailArgs {
    /// Split each micro-batch into this many tail parts (a second compiled shape of B/S
    /// samples, used near the deadline and for the remainder of a rebalanced assignment);
    /// 1 = whole micro-batches only.
    #[arg(long, default_value_t = 1)]
    pub tail_split: u32,
    /// Device time of a tail micro-batch as a fraction of a whole one's, in (0, 1]. Default
    /// 1/S (linear in samples: an assumption; on a Gaudi measure the two recipes' device
    /// times and pass the ratio; the mock runs the tail recipe at this cost).
    #[arg(long, allow_negative_numbers = true)]
    pub tail_cost: Option<f64>,
}

impl TailArgs {
    /// True when either flag differs from its default (a tail shape was asked for).
    pub fn given(&self) -> bool {
        self.tail_split != 1 || self.tail_cost.is_some()
    }

    /// [`TailArgs::tail`] for `simulate`/`tune`, which take it only with `--policy`.
    ///
    /// # Errors
    /// `"--FLAG VALUE: why"` as [`TailArgs::tail`]; `"--tail-split ...: needs --policy"` when
    /// a tail flag is given without a policy comparison.
    pub fn for_policy(&self, policy: Option<&str>) -> Result<dropcompute::policy::TailShape, CommandError> {
        if policy.is_none() && self.given() {
            let (flag, value) = if self.tail_split != 1 {
                ("tail-split", self.tail_split.to_string())
            } else {
                ("tail-cost", self.tail_cost.map(|c| c.to_string()).unwrap_or_default())
            };
            return Err(CommandError::Args(format!(
                "--{flag} {value}: needs --policy (the tail shape is a policy replay)"
            )));
        }
        self.tail().map_err(|e| CommandError::Args(e.to_string()))
    }

    /// The tail shape, checked.
    ///
    /// # Errors
    /// [`TailArgError`] naming `tail-split` when the split is 0 or above 64, `tail-cost` when
    /// the cost is not a finite number in (0, 1] or is given with split 1
    /// (`TailShape::checked`).
    pub fn tail(&self) -> Result<dropcompute::policy::TailShape, TailArgError> {
        self.tail_for(None)
    }

    /// The tail shape, checked by the core's one rule (`TailShape::checked`), for micro-batches
    /// of `micro_batch_size` samples when given (the split must divide it).
    ///
    /// # Errors
    /// [`TailArgError`] naming the flag (`tail-split` or `tail-cost`), its value and the rule.
    pub fn tail_for(&self, micro_batch_size: Option<u32>) -> Result<dropcompute::policy::TailShape, TailArgError> {
        dropcompute::policy::TailShape::checked(self.tail_split, self.tail_cost, micro_batch_size).map_err(|e| {
            TailArgError {
                flag: if e.field == "cost" { "tail-cost" } else { "tail-split" },
                why: e.why("--tail-split", "--micro-batch-size"),
                value: e.value,
            }
        })
    }
}

/// Writes `text` to standard output and flushes it through the one writer
/// (`dropcompute::console`): the stdout path of the subcommands that print (`info`, `bench`;
/// `tune`, `simulate` and `validate` write to `dropcompute::console::Stdout`). A closed stdout
/// is [`CommandError::Stream`] the binary turns into a quiet exit 0, a full one exit 6 naming
/// "stdout"; never a panic.
///
/// # Errors
/// [`CommandError::Stream`] when the write or the flush fails.
pub(crate) fn say(text: &str) -> Result<(), CommandError> {
    Ok(dropcompute::console::out(text)?)
}

/// The error of a failed write to `what`: [`CommandError::Stream`] when the writer was
/// standard output (`dropcompute::console::Stdout`), else [`CommandError::Io`] naming `what`.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CommandError {
    let what = what.into();
    move |source| match dropcompute::console::StreamError::from_io(source) {
        Ok(stream) => CommandError::Stream(stream),
        Err(source) => CommandError::Io { what, source },
    }
}

/// What the trace loader assumed, filled or removed for `loaded` (`trace::Loaded::notes` and
/// the incomplete steps removed), one indented line each ("  note: ..."), empty when nothing:
/// the one printing of `tune --trace` (every mode) and `simulate --trace`, so a replay never
/// runs on what the loader changed (e.g. a trace left without buckets: the length-aware
/// policies then replay blind) without saying so.
pub fn loader_notes(loaded: &dropcompute::trace::Loaded) -> String {
    let mut s = String::new();
    for note in &loaded.notes {
        s += &format!("  note: {note}\n");
    }
    if !loaded.completeness.dropped_steps.is_empty() {
        s += &format!("  incomplete steps removed (step, missing cells): {:?}\n", loaded.completeness.dropped_steps);
    }
    s
}

/// [`loader_notes`] where a policy comparison prints (`tune`/`simulate --trace --policy`):
/// under a `trace: SOURCE` line into the text output, or, with `--json` (the notes are no
/// field of `tune::policies::PolicyComparison`), on standard error, so standard output stays
/// one JSON document. Nothing when the loader noted nothing.
///
/// # Errors
/// [`CommandError::Stream`] / [`CommandError::Io`] when writing `out` fails.
pub(crate) fn print_loader_notes(
    loaded: &dropcompute::trace::Loaded,
    json: bool,
    out: &mut dyn std::io::Write,
) -> Result<(), CommandError> {
    let notes = loader_notes(loaded);
    if notes.is_empty() {
        return Ok(());
    }
    let text = format!("trace: {}\n{notes}", loaded.trace.source());
    if json {
        dropcompute::console::err(text.trim_end());
        Ok(())
    } else {
        out.write_all(text.as_bytes()).map_err(io_err("stdout"))
    }
}

/// Parses `--policy`: `all` or a comma-separated list of policy names
/// ([`dropcompute::policy::Policy::name`]), returned in [`dropcompute::policy::Policy::ALL`] order.
///
/// # Errors
/// [`CommandError::Args`] naming the unknown name and the accepted ones.
pub fn parse_policies(spec: &str) -> Result<Vec<dropcompute::policy::Policy>, CommandError> {
    use dropcompute::policy::Policy;
    if spec.trim() == "all" {
        return Ok(Policy::ALL.to_vec());
    }
    let mut v = Vec::new();
    for name in spec.split(',').map(str::trim) {
        let p = Policy::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            CommandError::Args(format!("--policy {name:?}: expected all or a list of {}", names.join(", ")))
        })?;
        v.push(p);
    }
    Ok(Policy::ALL.into_iter().filter(|p| v.contains(p)).collect())
}

/// The text table of `simulate`/`tune --policy`: one row per policy (its tuned parameter,
/// effective speedup, drop rate, batch-size spread, samples lost), then the ideal and the
/// straggler-free bound.
pub fn policy_table(c: &dropcompute::tune::policies::PolicyComparison) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let nm = (c.ranks * c.micro_batches) as f64;
    let _ = writeln!(
        s,
        "policies on {} ({} ranks x {} micro-batches x {} steps{}; realizable replay, guardrails on{}):",
        c.trace,
        c.ranks,
        c.micro_batches,
        c.steps,
        if c.tail.enabled() {
            format!("; tail shape 1/{} micro-batch at cost {:.3}", c.tail.parts(), c.tail.cost_fraction())
        } else {
            String::new()
        },
        if c.jitter_ns > 0.0 {
            format!(
                "; each threshold judged by its window of +-{:.3} ms (--jitter-ms), ranked by the worst replay in it",
                c.jitter_ns / 1e6
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "  {:<16} {:>9} {:>8} {:>17} {:>10}  {:<8} parameter",
        "policy", "speedup", "drop", "batch min..max", "lost mb", "verdict"
    );
    for r in &c.rows {
        let mut param = Vec::new();
        if let Some(t) = r.threshold_ms {
            param.push(format!("threshold {t:.3} ms"));
        }
        if let Some(q) = r.estimator_quantile {
            param.push(format!("estimator q {q}"));
        }
        if let Some(b) = r.backup_workers {
            param.push(format!("b = {b}"));
        }
        if let Some(b) = r.budget_ms {
            param.push(format!("budget {b:.3} ms"));
        }
        if let Some(c) = r.budget_max_micro_batches {
            param.push(format!("at most {c} micro-batches per rank"));
        }
        let _ = writeln!(
            s,
            "  {:<16} {:>+8.2}% {:>7.2}% {:>7.1}%..{:>6.1}% {:>10}  {:<8} {}",
            r.policy.name(),
            r.effective_speedup * 100.0,
            r.drop_rate * 100.0,
            r.min_batch_fraction * 100.0,
            r.max_batch_fraction * 100.0,
            // Whole micro-batches print as integers, parts (a tail shape) with 2 decimals.
            if r.lost_micro_batches.fract() == 0.0 {
                format!("{}", r.lost_micro_batches)
            } else {
                format!("{:.2}", r.lost_micro_batches)
            },
            if r.enabled { "enable" } else { "decline" },
            param.join(", ")
        );
    }
    let ideal = |name: &str, x: &dropcompute::tune::CandidateScore| {
        format!(
            "  {name:<16} {:>+8.2}% {:>7.2}% {:>7.1}%        {:>10}  {:<8} threshold {:.3} ms (not realizable)\n",
            x.objective * 100.0,
            x.drop_rate * 100.0,
            x.min_batch_fraction * 100.0,
            "",
            "ideal",
            x.threshold_ns / 1e6
        )
    };
    if let Some(a) = &c.ideal_admissible {
        s += &ideal("ideal", a);
    }
    s += &ideal("ideal (no guard)", &c.ideal_best);
    let _ = writeln!(
        s,
        "  {:<16} {:>+8.2}% {:>7.2}% {:>7.1}%..{:>6.1}% {:>10}  {:<8} every rank at the step's median rank",
        "straggler-free",
        c.straggler_free_speedup * 100.0,
        0.0,
        100.0,
        100.0,
        0,
        "bound"
    );
    let _ = nm;
    s
}
