//! The `dropcompute` command line: parses (`cli::Cli`), sets up logging, dispatches to the
//! library's `dropcompute_cli::commands` and maps errors to exit codes.
//! Exit codes per failure class: see `cli::exit` (and README.md). A stdout closed by its
//! reader (`EPIPE`) is a quiet exit 0.
#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        // `--help` and `--version` go through the one stdout writer (a full stdout is exit 6
        // naming it, a closed one a quiet exit 0); a usage error through stderr, exit 2.
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            return match dropcompute::console::out(&e.render().to_string()) {
                Ok(()) => cli::exit::ExitClass::Success.exit_code(),
                Err(s) if s.is_closed() => cli::exit::ExitClass::Success.exit_code(),
                Err(s) => {
                    dropcompute::console::err(&format!("error: {s}\n"));
                    cli::exit::ExitClass::DataFile.exit_code()
                }
            };
        }
        Err(e) => {
            dropcompute::console::err(&e.render().to_string());
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    cli::init_logging(args.verbose);
    match cli::run(args) {
        Ok(()) => cli::exit::ExitClass::Success.exit_code(),
        // The reader of stdout went away (`| head`): stop quietly, as ripgrep and fd do.
        Err(e) if dropcompute::console::StreamError::find(&*e).is_some_and(|s| s.is_closed()) => {
            tracing::debug!("stdout closed by its reader; exiting quietly");
            cli::exit::ExitClass::Success.exit_code()
        }
        Err(e) => {
            dropcompute::console::err(&cli::error_report(&*e));
            // A failure after a stop signal (a collective broken by a stopped peer, a rank
            // killed by its launcher's stop) is the stop's consequence: 130 on every rank alike.
            let class = cli::exit::classify(&*e);
            let class = match dropcompute::signals::received() {
                Some(s) if class != cli::exit::ExitClass::Interrupted => {
                    dropcompute::console::err(&format!(
                        "dropcompute: interrupted by {}: the failure above followed the stop",
                        s.name()
                    ));
                    cli::exit::ExitClass::Interrupted
                }
                _ => class,
            };
            tracing::debug!(?class, code = class.code(), "exiting");
            class.exit_code()
        }
    }
}
