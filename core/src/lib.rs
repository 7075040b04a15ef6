//! dropcompute, the core library: DropCompute (Giladi et al., NeurIPS 2023) for Intel Gaudi.
//!
//! Layers, bottom to top (see ARCHITECTURE.md): `habana_sys` (raw FFI, separate crate) ->
//! [`mock`] (CPU device behind the same table, crate `habana-mock`) and [`synapse`] (safe layer)
//! -> [`policy`] (the deadline decision, the one per-rank step walker and the assignment step,
//! shared by execution, simulation and both faces) -> [`trace`], [`tune`], [`sim`] (pure:
//! traces, threshold tuning, what-if models) and [`schedule`] (the step scheduler). [`hccl`] sits
//! beside [`synapse`]: the safe collectives (communicator, watchdog, flight recorder), the
//! launcher bootstrap and the rendezvous that hands rank 0's unique id to the other ranks.
//! [`launch`] starts N ranks (threads, child processes given the parent's configuration as JSON,
//! or one launcher rank) for `train`, `bench allreduce` and the tests.
//!
//! Above this crate: `dropcompute-train` (the example training job and its outputs) and
//! `dropcompute-cli` (the `dropcompute` binary); beside it, the C API and the Python module,
//! which depend on this crate alone. Must not touch: flag parsing, charts, progress bars (no
//! clap unless the `clap` feature derives flag values; never plotters or indicatif).

pub mod checkpoint;
pub mod console;
pub mod csv_lines;
pub mod deal;
pub mod environment;
pub mod hccl;
pub mod input;
pub mod launch;
#[cfg(feature = "mock")]
pub mod mock_recipes;
pub mod policy;
pub mod schedule;
pub mod serde_nan;
pub mod signals;
pub mod sim;
pub mod synapse;
pub mod trace;
pub mod tune;

/// The CPU mock device (crate `habana-mock`), present with the default cargo feature `mock`:
/// the automatic backend's fallback when libSynapse is absent, and the device the training job
/// runs on. The product reaches it only through this re-export.
#[cfg(feature = "mock")]
pub use habana_mock as mock;
