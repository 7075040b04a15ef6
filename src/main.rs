//! The `dropcompute` command line: parses (`cli::Cli`), sets up logging, dispatches to the
//! library's `dropcompute_cli::commands` and maps errors to exit codes.
//! Exit codes per failure class: see `cli::exit` (and README.md). A stdout closed by its
//! reader (`EPIPE`) is a quiet exit 0.
#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
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
            let class = cli::exit::classify(&*e);
            tracing::debug!(?class, code = class.code(), "exiting");
            class.exit_code()
        }
    }
}
