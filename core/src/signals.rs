//! The process's stop signals: SIGINT, SIGTERM and SIGHUP are recorded by a handler that only
//! stores the signal number (crate `signal-hook`); the work loops poll [`received`] and stop in
//! a coordinated way at a step boundary. The parent of rank processes forwards a received stop
//! signal to its children ([`forward`], used by `crate::launch::processes`), so `kill -TERM` of
//! the parent stops every rank as it stops thread ranks.
//!
//! Owns: which signals stop the job, the process-wide record of the first one received, and the
//! rule for which of them write a checkpoint ([`StopSignal::always_checkpoints`]). Must not
//! touch: what a stop does (the train loop, `crate::train::run`) or exit codes (`cli/exit.rs`:
//! 130 for every stop signal, the shell's "interrupted").
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// A signal that stops the job at the next step boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C): stop with a checkpoint.
    Interrupt,
    /// SIGTERM (`kill`, a scheduler's preemption): stop with a checkpoint.
    Terminate,
    /// SIGHUP (terminal closed): stop; a checkpoint only when checkpointing was asked for
    /// (`--checkpoint-every`, `--checkpoint-dir` or `--resume`).
    Hangup,
}

impl StopSignal {
    /// Every stop signal, in the order their numbers are registered.
    pub const ALL: [Self; 3] = [Self::Interrupt, Self::Terminate, Self::Hangup];

    /// The POSIX signal number (2, 15, 1 on Linux).
    pub fn number(self) -> i32 {
        match self {
            Self::Interrupt => signal_hook::consts::SIGINT,
            Self::Terminate => signal_hook::consts::SIGTERM,
            Self::Hangup => signal_hook::consts::SIGHUP,
        }
    }

    /// The signal's name (`SIGINT`, `SIGTERM`, `SIGHUP`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
            Self::Hangup => "SIGHUP",
        }
    }

    /// Whether the stop writes a checkpoint even when none was asked for: SIGINT and SIGTERM
    /// (the user or the scheduler asked to stop a job it may resume); SIGHUP does not.
    pub fn always_checkpoints(self) -> bool {
        !matches!(self, Self::Hangup)
    }

    fn from_number(n: usize) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.number() as usize == n)
    }
}

fn slot() -> &'static Arc<AtomicUsize> {
    static S: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
    S.get_or_init(|| Arc::new(AtomicUsize::new(0)))
}

/// Installs the handlers of [`StopSignal::ALL`] (once per process; later calls are no-ops). A
/// handler that cannot be installed is reported (warn): that signal then keeps its default
/// action (the job dies without a checkpoint).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for s in StopSignal::ALL {
            if let Err(e) = signal_hook::flag::register_usize(s.number(), Arc::clone(slot()), s.number() as usize) {
                tracing::warn!(signal = s.name(), error = %e, "no handler: this signal kills the job without a checkpoint");
            }
        }
    });
}

/// The stop signal received, if any (the most recent one when several arrived).
pub fn received() -> Option<StopSignal> {
    StopSignal::from_number(slot().load(Ordering::SeqCst))
}

/// How long [`exit_on_stop`] gives a command that stops at its own boundaries (`train`: the
/// next step, with its checkpoint; the bounded reader: its next 100 ms tick) before it ends
/// the process itself.
/// Generous: a step, its checkpoint and a rank process's start can take seconds on a loaded
/// machine, and the backstop's exit loses the step-boundary stop's checkpoint.
pub const COOPERATIVE_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// How long [`exit_on_stop`] gives the commands that read input files (`tune`, `simulate`,
/// `info`, `validate`): long enough for the bounded reader's own stop (which names the input).
/// `bench` reads none and gets no grace.
pub const PROMPT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The backstop that makes a stop signal end the process in every phase (input, tuning,
/// collectives, output): a thread polls [`received`] every 20 ms; `grace` after the first stop
/// signal, if the process still runs, it writes `dropcompute: interrupted by SIGTERM during
/// <what>; exiting` to stderr and exits with status 130 (128 + SIGINT, the shell's
/// "interrupted", for every stop signal alike). Outputs are written to a staging place and
/// moved into place whole, so an exit here leaves them complete or absent. Call once per
/// process, after [`install`]; a thread that cannot be started is reported (warn).
pub fn exit_on_stop(grace: std::time::Duration, what: &'static str) {
    let watch = move || {
        let s = loop {
            if let Some(s) = received() {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        std::thread::sleep(grace);
        crate::console::err(&format!("dropcompute: interrupted by {} during {what}; exiting", s.name()));
        std::process::exit(130);
    };
    if let Err(e) = std::thread::Builder::new().name("dc-stop-backstop".into()).spawn(watch) {
        tracing::warn!(error = %e, "no stop backstop: a stop signal is honoured only at step boundaries");
    }
}

/// Records `s` as if it had been received (tests; an embedding program's own stop request).
pub fn raise(s: StopSignal) {
    slot().store(s.number() as usize, Ordering::SeqCst);
}

/// Sends `s` to process `pid` (a rank process of ours). Errors (the process is gone) are
/// ignored: a child that already exited needs no stop.
pub fn forward(s: StopSignal, pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if let Ok(sig) = nix::sys::signal::Signal::try_from(s.number()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_numbers_round_trip_and_only_hangup_skips_the_checkpoint() {
        for s in StopSignal::ALL {
            assert_eq!(StopSignal::from_number(s.number() as usize), Some(s));
        }
        assert_eq!(StopSignal::from_number(0), None);
        assert_eq!(StopSignal::Terminate.number(), 15);
        assert!(StopSignal::Interrupt.always_checkpoints() && StopSignal::Terminate.always_checkpoints());
        assert!(!StopSignal::Hangup.always_checkpoints());
    }
}
