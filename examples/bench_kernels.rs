//! Runs the kernel benchmark with default options and prints its table:
//! `cargo run --release --example bench_kernels`. The CLI's `dropcompute bench kernels` calls
//! the same function.

use dropcompute::bench::kernels::{KernelBenchOptions, run_kernel_bench};

fn main() {
    let report = run_kernel_bench(&KernelBenchOptions::default());
    println!("{report}");
    if !report.meets_target() {
        std::process::exit(1);
    }
}
