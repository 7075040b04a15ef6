//! Stand-in for `dropcompute simulate` until the binary dispatches to it:
//! `cargo run --release --example simulate -- --noise reference --workers 16,64,200,1000,10000`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: dropcompute::commands::simulate::SimulateArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = dropcompute::commands::simulate::run(&cli.args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
