//! Process exit codes: one per failure class, so launchers and job scripts can tell a broken
//! install from a dead peer from a bad input file without parsing messages.
//!
//! Owns: [`ExitClass`] (the table below) and [`classify`], which walks an error's source chain
//! and downcasts the crate's typed errors. It stays in the binary: exit codes are a property of
//! the process, the library only returns typed errors (a rank's exit code reaches it as
//! `TrainError::Child { code }`, classified here). Must not touch: the errors themselves or how they are
//! printed (`main` prints the chain).
//!
//! | code | class | examples |
//! |---:|---|---|
//! | 0 | success | |
//! | 1 | internal / other | a bug, an invariant, an error this table does not know |
//! | 2 | usage / bad input | clap's own code for bad flags; bad environment variables (`DROPCOMPUTE_BACKEND`, `HLS_MODULE_ID`, launcher variables, mock config), invalid parameters; more ranks on a host than devices (`launch::check_devices`) |
//! | 3 | runtime library | `libSynapse.so` missing (`--library`, the default path), too old, not loadable, a missing symbol (a `DROPCOMPUTE_SYNAPSE_LIB` naming a missing file is exit 2: a bad environment value) |
//! | 4 | device | acquire failed or the device is held by another process, a device/stream error, a device timeout |
//! | 5 | collective | HCCL call failed, collective timeout (watchdog), peer lost, asynchronous HCCL error, rendezvous failure |
//! | 6 | data file | an input file (data, parameters, trace, recipe) unreadable, malformed, a directory or above its cap (`dropcompute::input`); output file not writable; stdout or stderr full (`ENOSPC`) |
//! | 7 | checkpoint | checkpoint truncated, corrupt, wrong version, unwritable, none found |
//!
//! `train --launch processes` maps a failed rank process to its own exit code's class, and a
//! rank killed by a signal to the collective class (its peers lost it).
//! | 130 | interrupted | SIGINT/SIGTERM (128 + SIGINT, the shell convention), also while waiting for an input FIFO |
//!
//! A stdout closed by its reader (`EPIPE`, `| head -1`) is not a failure: `main` exits 0 without
//! a message, as ripgrep and fd do.
#![forbid(unsafe_code)]

use std::error::Error;
use std::process::ExitCode;

use dropcompute::checkpoint::CheckpointError;
use dropcompute::console::StreamError;
use dropcompute::hccl::HcclError;
use dropcompute::hccl::bootstrap::ConfigError as LaunchConfigError;
use dropcompute::hccl::rendezvous::RendezvousError;
use dropcompute::input::InputError;
use dropcompute::schedule::ScheduleError;
use dropcompute::sim::SimError;
use dropcompute::trace::TraceError;
use dropcompute_cli::commands::CommandError;
use habana_sys::LoadError;

/// A failure class and its process exit code (see the module table).
#[cfg_attr(not(feature = "mock"), allow(dead_code))] // `Interrupted` comes from `train` only
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// 0.
    Success,
    /// 1: a bug or an error of unknown type.
    Internal,
    /// 2: bad flags (clap exits with 2 itself), environment or parameters.
    Usage,
    /// 3: the runtime library is missing, too old or lacks a symbol.
    Library,
    /// 4: device acquisition or device execution failed.
    Device,
    /// 5: a collective or the rendezvous failed (timeout, peer lost, asynchronous error).
    Collective,
    /// 6: an input or output data file is unreadable, malformed or unwritable.
    DataFile,
    /// 7: a checkpoint could not be written or read.
    Checkpoint,
    /// 130: interrupted by SIGINT/SIGTERM.
    Interrupted,
}

impl ExitClass {
    /// The process exit code of the class.
    pub fn code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Internal => 1,
            Self::Usage => 2,
            Self::Library => 3,
            Self::Device => 4,
            Self::Collective => 5,
            Self::DataFile => 6,
            Self::Checkpoint => 7,
            Self::Interrupted => 130,
        }
    }

    /// The class as a [`ExitCode`] for `main`.
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(self.code())
    }
}

fn synapse(e: &dropcompute::synapse::Error) -> ExitClass {
    use dropcompute::synapse::Error as E;
    match e {
        E::Load(_) => ExitClass::Library,
        E::Config { .. } => ExitClass::Usage,
        // A stream's asynchronous collective failure surfaces at a synchronize as synFailHccl.
        E::Synapse { status, .. } if *status == habana_sys::synStatus::FAIL_HCCL => ExitClass::Collective,
        E::Synapse { .. } | E::Timeout { .. } => ExitClass::Device,
        _ => ExitClass::Internal,
    }
}

fn hccl(e: &HcclError) -> ExitClass {
    match e {
        HcclError::Synapse(inner) => synapse(inner),
        HcclError::InvalidArgument { .. } => ExitClass::Internal,
        HcclError::Bootstrap(r) => rendezvous(r),
        _ => ExitClass::Collective,
    }
}

/// A rendezvous failure is a collective one, except a stop signal while waiting (130).
fn rendezvous(e: &RendezvousError) -> ExitClass {
    match e {
        RendezvousError::Interrupted { .. } => ExitClass::Interrupted,
        _ => ExitClass::Collective,
    }
}

/// The class of one error, ignoring its sources; `None` for types this table does not know.
fn from_code(code: Option<i32>) -> ExitClass {
    match code {
        Some(2) => ExitClass::Usage,
        Some(3) => ExitClass::Library,
        Some(4) => ExitClass::Device,
        Some(5) => ExitClass::Collective,
        Some(6) => ExitClass::DataFile,
        Some(7) => ExitClass::Checkpoint,
        Some(130) => ExitClass::Interrupted,
        // Killed by a signal (e.g. SIGKILL): its peers lost it, a collective failure.
        None => ExitClass::Collective,
        Some(_) => ExitClass::Internal,
    }
}

fn schedule(e: &ScheduleError) -> ExitClass {
    match e {
        ScheduleError::Device { source, .. } => synapse(source),
        ScheduleError::Collective { source, .. } => hccl(source),
        ScheduleError::Workload { source, .. } => classify(&**source),
        ScheduleError::Data { .. } | ScheduleError::Config { .. } => ExitClass::Usage,
        _ => ExitClass::Internal,
    }
}

/// Classes of the errors that exist only with the cargo feature `mock` (the training job and
/// the mock's own configuration and recipe files).
#[cfg(feature = "mock")]
fn mock_only(e: &(dyn Error + 'static)) -> Option<ExitClass> {
    use dropcompute::mock::RecipeFileError;
    use dropcompute::mock::config::ConfigError as MockConfigError;
    use dropcompute_train::error::TrainError;
    if let Some(t) = e.downcast_ref::<TrainError>() {
        return Some(train(t));
    }
    if e.is::<RecipeFileError>() {
        return Some(ExitClass::DataFile);
    }
    e.is::<MockConfigError>().then_some(ExitClass::Usage)
}

#[cfg(not(feature = "mock"))]
fn mock_only(_: &(dyn Error + 'static)) -> Option<ExitClass> {
    None
}

#[cfg(feature = "mock")]
fn train(e: &dropcompute_train::error::TrainError) -> ExitClass {
    use dropcompute_train::error::TrainError;
    match e {
        TrainError::Args(_) | TrainError::Model(_) | TrainError::Config { .. } | TrainError::Bootstrap(_) => {
            ExitClass::Usage
        }
        TrainError::Mock(_) | TrainError::Env(_) => ExitClass::Usage,
        TrainError::Data(_)
        | TrainError::Stream(_)
        | TrainError::Output(_)
        | TrainError::Figure(_)
        | TrainError::Io { .. }
        | TrainError::Params(_) => ExitClass::DataFile,
        TrainError::Device { source, .. } => synapse(source),
        TrainError::Collective { source, .. } => hccl(source),
        TrainError::Step(s) => schedule(s),
        TrainError::Child { code, .. } => from_code(*code),
        TrainError::Infeasible(i) => infeasible(i),
        TrainError::Checkpoint(_) | TrainError::WorldSizeMismatch { .. } => ExitClass::Checkpoint,
        TrainError::Interrupted { .. } => ExitClass::Interrupted,
        // The text task: a device failure is classed as the runtime's; the corpus, split,
        // plan and sizes are the job's configuration (embedded data: no user file).
        TrainError::Text { source, .. } => match source.as_ref() {
            dropcompute_train::transformer_train::TextTrainError::Device { source, .. } => synapse(source),
            _ => ExitClass::Usage,
        },
        _ => ExitClass::Internal,
    }
}

/// More ranks than devices is a usage error (exit 2); a runtime that cannot count its devices
/// is classed as its error.
fn infeasible(e: &dropcompute::launch::Infeasible) -> ExitClass {
    match e {
        dropcompute::launch::Infeasible::Count(s) => synapse(s),
        _ => ExitClass::Usage,
    }
}

fn one(e: &(dyn Error + 'static)) -> Option<ExitClass> {
    if let Some(i) = e.downcast_ref::<dropcompute::launch::Infeasible>() {
        return Some(infeasible(i));
    }
    if let Some(c) = mock_only(e) {
        return Some(c);
    }
    if let Some(s) = e.downcast_ref::<ScheduleError>() {
        return Some(schedule(s));
    }
    if e.is::<LoadError>() {
        return Some(ExitClass::Library);
    }
    if let Some(s) = e.downcast_ref::<dropcompute::synapse::Error>() {
        return Some(synapse(s));
    }
    if let Some(h) = e.downcast_ref::<HcclError>() {
        return Some(hccl(h));
    }
    if let Some(r) = e.downcast_ref::<RendezvousError>() {
        return Some(rendezvous(r));
    }
    if e.is::<CheckpointError>() {
        return Some(ExitClass::Checkpoint);
    }
    if e.is::<TraceError>() || e.is::<InputError>() || e.is::<StreamError>() {
        return Some(ExitClass::DataFile);
    }
    if e.is::<LaunchConfigError>() || e.is::<SimError>() || e.is::<dropcompute::environment::EnvError>() {
        return Some(ExitClass::Usage);
    }
    // A failed rank process keeps its exit code's class (killed by a signal: collective).
    if let Some(dropcompute::launch::LaunchError::Child { code, .. }) = e.downcast_ref() {
        return Some(from_code(*code));
    }
    // `launch::dispatch` wraps a bad launcher environment (its source is transparent).
    if let Some(dropcompute::launch::LaunchError::Bootstrap(_)) = e.downcast_ref() {
        return Some(ExitClass::Usage);
    }
    // A failed rank process of `bench allreduce --launch processes` has its own exit code's
    // class, as `train`'s (`TrainError::Child`): a rank that refused an infeasible size exits 2.
    if let Some(dropcompute::launch::LaunchError::Child { code, .. }) = e.downcast_ref() {
        return Some(from_code(*code));
    }
    if let Some(c) = e.downcast_ref::<CommandError>() {
        return Some(match c {
            // A plot fails when its SVG cannot be written (the drawing itself has no other
            // failure on valid data): an output file, like `Io`.
            CommandError::Trace(_) | CommandError::Io { .. } | CommandError::Plot(_) | CommandError::Stream(_) => {
                ExitClass::DataFile
            }
            CommandError::Sim(_) | CommandError::Args(_) | CommandError::Env { .. } => ExitClass::Usage,
            _ => ExitClass::Internal,
        });
    }
    None
}

/// The exit class of an error: the first error in its source chain (outermost first) whose type
/// is known; [`ExitClass::Internal`] when none is. Transparent wrappers (`HcclError::Synapse`,
/// `synapse::Error::Load`, `CommandError::Trace`) are looked through explicitly, since they do
/// not appear as sources.
pub fn classify(e: &(dyn Error + 'static)) -> ExitClass {
    // The bounded reader's stop and cap-variable errors keep their class whichever file kind
    // (data, trace, checkpoint) wraps them.
    let mut cur = Some(e);
    while let Some(err) = cur {
        match err.downcast_ref::<InputError>() {
            Some(InputError::Interrupted { .. }) => return ExitClass::Interrupted,
            Some(InputError::BadCap { .. }) => return ExitClass::Usage,
            _ => {}
        }
        cur = err.source();
    }
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(c) = one(err) {
            return c;
        }
        cur = err.source();
    }
    ExitClass::Internal
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    /// An opaque wrapper whose source is `inner` (as `anyhow`-style context would be).
    #[derive(Debug, thiserror::Error)]
    #[error("while running the command")]
    struct Context(#[source] Box<dyn Error + Send + Sync>);

    #[test]
    fn every_known_type_maps_to_its_documented_code() {
        let p = || PathBuf::from("/x");
        let cases: Vec<(Box<dyn Error + Send + Sync>, u8)> = vec![
            (Box::new(LoadError::NotFound { tried: vec![p()] }), 3),
            (Box::new(dropcompute::synapse::Error::Load(LoadError::NotFound { tried: vec![] })), 3),
            (
                Box::new(dropcompute::synapse::Error::Synapse {
                    call: "synDeviceAcquireByModuleId",
                    status: habana_sys::synStatus::DEVICE_ALREADY_ACQUIRED,
                    description: "synDeviceAlreadyAcquired".into(),
                    message: None,
                }),
                4,
            ),
            (
                Box::new(dropcompute::synapse::Error::Synapse {
                    call: "synEventSynchronize",
                    status: habana_sys::synStatus::FAIL_HCCL,
                    description: "synFailHccl".into(),
                    message: None,
                }),
                5,
            ),
            (
                Box::new(dropcompute::synapse::Error::Config {
                    variable: "HLS_MODULE_ID",
                    value: "x".into(),
                    reason: "not a number".into(),
                }),
                2,
            ),
            (Box::new(HcclError::Timeout { op: "all_reduce", seq: 3, after: Duration::from_secs(1) }), 5),
            (
                Box::new(HcclError::Synapse(std::sync::Arc::new(dropcompute::synapse::Error::Timeout {
                    what: "stream".into(),
                    after: Duration::from_secs(1),
                }))),
                4,
            ),
            (Box::new(CheckpointError::ChecksumMismatch { path: p() }), 7),
            (Box::new(TraceError::Empty("t".into())), 6),
            (Box::new(CommandError::Trace(TraceError::Empty("t".into()))), 6),
            (Box::new(CommandError::Args("--workers".into())), 2),
            (Box::new(CommandError::Plot("/nonexistent/x.svg: No such file or directory".into())), 6),
            (Box::new(CommandError::Env { variable: "LOCAL_RANK", value: "x".into(), why: "not a rank" }), 2),
            (Box::new(CommandError::SelfCheck("data came back different".into())), 1),
            (Box::new(Context(Box::new(CheckpointError::BadMagic { path: p() }))), 7),
            (Box::new(Context(Box::new(Context(Box::new(LoadError::NotFound { tried: vec![] }))))), 3),
            (
                Box::new(dropcompute::launch::LaunchError::Bootstrap(LaunchConfigError::Invalid {
                    variable: "RANK".into(),
                    value: "x".into(),
                    reason: "not a number".into(),
                })),
                2,
            ),
            ("a plain message".into(), 1),
        ];
        for (e, code) in cases {
            assert_eq!(classify(&*e).code(), code, "{e}");
        }
    }

    #[test]
    fn codes_are_distinct_and_match_the_table() {
        use ExitClass::*;
        let all = [Success, Internal, Usage, Library, Device, Collective, DataFile, Checkpoint, Interrupted];
        let codes: Vec<u8> = all.iter().map(|c| c.code()).collect();
        assert_eq!(codes, vec![0, 1, 2, 3, 4, 5, 6, 7, 130]);
    }
}
