//! Simulator throughput: `cargo run --release --example bench_simulator [workers] [steps]`.
//! Prints micro-batches per second on 1 thread and on all cores, and their ratio.
fn main() {
    let mut a = std::env::args().skip(1);
    let workers: u32 = a.next().and_then(|x| x.parse().ok()).unwrap_or(10_000);
    let steps: u64 = a.next().and_then(|x| x.parse().ok()).unwrap_or(1_000);
    let run = |threads| dropcompute::sim::montecarlo::bench_simulator(workers, steps, threads);
    match (run(1), run(0)) {
        (Ok(one), Ok(all)) => {
            println!("{one}");
            println!("{all}");
            println!(
                "parallel speedup: {:.2}x",
                all.micro_batches_per_second / one.micro_batches_per_second
            );
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
