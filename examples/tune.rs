//! Stand-in for `dropcompute tune` until the binary dispatches to it:
//! `cargo run --example tune -- --trace data/traces/trace-SE.csv.gz --svg-dir target/plots`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: dropcompute::commands::tune::TuneArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = dropcompute::commands::tune::run(&cli.args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
