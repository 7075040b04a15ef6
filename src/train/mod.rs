//! `dropcompute train`: the example workload (an MLP classifier on the UCI handwritten digits
//! over N ranks) that runs the synchronous baseline and DropCompute with the same seed through
//! the step scheduler and compares them.
//!
//! Owns: the data set ([`data`]), the model math ([`mlp`], host-side and deterministic; the
//! mock recipe kernels that run it are thin shims in [`model_kernels`], which the job registers
//! with the mock), the
//! workload that binds it to the scheduler ([`workload`]), the run driver ([`run`]: ranks as
//! threads, processes or one launcher rank), and the command-line surface and outputs
//! ([`args`], [`output`], [`report`], [`timeline`], [`figure`], [`progress`]).
//! Must not touch: the deadline rule (`policy`), the step loop (`schedule`), or raw FFI; the only
//! `unsafe` here is the bounds-checked gemm call in the private `gemm` module.

pub mod args;
pub mod ckpt;
pub mod data;
pub mod figure;
mod gemm;
pub mod mlp;
pub mod model_kernels;
pub mod output;
pub mod progress;
pub mod report;
pub mod run;
pub mod summary;
pub mod timeline;
pub mod workload;
