//! The `dropcompute` command line as a library: one module per subcommand ([`commands`]: its
//! clap `Args` and `run`) and the benchmarks `bench` runs ([`bench`]). The binary
//! (`src/main.rs`, its private `cli` module) only parses, sets up logging, dispatches here and
//! maps errors to exit codes.
//!
//! Crates, bottom to top (see ARCHITECTURE.md): `habana-sys` (raw FFI) and `habana-mock` (the CPU
//! device behind the same table) -> `dropcompute` (the core: policy and the one step walker,
//! schedule, sim, tune, trace, synapse, hccl, launch, checkpoint; no clap, plotters or
//! indicatif unless its `clap` feature is on) -> `dropcompute-train` (the example training job:
//! the digits MLP as device graphs, its job driver and outputs, and the SVG charts) -> this
//! crate. Owns: flags, what the commands print, and the benchmarks. Must not touch: the
//! algorithms (core), the training job's model or driver (`dropcompute-train`), raw FFI.
#![forbid(unsafe_code)]

pub mod bench;
pub mod commands;
