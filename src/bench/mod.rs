//! Benchmarks behind `dropcompute bench ...`: each submodule measures one thing and returns a
//! report that implements `Display` as a table.
//!
//! Owns: measurement loops and their reports. Must not: parse command lines or print (the CLI
//! does both), or assert on timings (machines are noisy; reports state ratios and targets).
#![forbid(unsafe_code)]

pub mod allreduce;
#[cfg(feature = "mock")]
pub mod kernels;
#[cfg(feature = "mock")]
pub mod scheduler;
#[cfg(feature = "mock")]
pub mod text_table;
