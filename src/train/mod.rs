//! `dropcompute train`: the example workload (an MLP on digits over N ranks) that runs the
//! synchronous baseline and DropCompute with the same seed and compares them.
//!
//! This part owns the command-line surface and the outputs, all pure library code the training
//! driver calls: [`args`] (flags and validation), [`output`] (staged, committed output
//! directory), [`report`] (report.json and the comparison table), [`timeline`] (Chrome trace),
//! [`figure`] (SVG of step time and loss) and [`progress`] (terminal progress bar). None of it
//! touches a device, a collective or the scheduler.
#![forbid(unsafe_code)]

pub mod args;
pub mod figure;
pub mod output;
pub mod progress;
pub mod report;
pub mod timeline;
