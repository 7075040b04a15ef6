//! The example workload of `dropcompute train`: an MLP classifier on the UCI handwritten digits.
//!
//! Owns: the data set ([`data`]: loading, scaling, splitting, gathering micro-batches by sample
//! id) and the model math ([`mlp`]: parameter layout, forward/backward, evaluation, SGD with
//! momentum), all host-side and deterministic. The mock recipe kernels that run this math on a
//! mock device are thin shims in `crate::mock` (`model_kernels`). Must not touch: devices,
//! streams, the scheduler or the deadline policy (the driver above this module owns those).

pub mod data;
mod gemm;
pub mod mlp;
