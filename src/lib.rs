//! dropcompute: DropCompute (Giladi et al., NeurIPS 2023) for Intel Gaudi.
//!
//! Layers, bottom to top (see ARCHITECTURE.md): `habana_sys` (raw FFI, separate crate) ->
//! [`mock`] (CPU device behind the same table) and [`synapse`] (safe layer) -> [`kernels`]
//! (CPU kernels the mock runs) -> [`policy`] (the deadline decision shared by execution and
//! simulation) -> [`trace`], [`tune`], [`sim`] (pure: traces, threshold tuning, what-if
//! models) -> [`commands`] (one module per subcommand: its flags and `run`) and [`bench`]
//! (the benchmarks `bench` runs); [`plot`] draws the SVG charts of `simulate`, `tune` and
//! `train`. [`hccl`] sits beside
//! [`synapse`]: the safe collectives (communicator, watchdog, flight recorder), the launcher
//! bootstrap and the rendezvous that hands rank 0's unique id to the other ranks. [`launch`]
//! starts N ranks (threads, child processes given the parent's configuration as JSON, or one
//! launcher rank) for `train`, `bench allreduce` and the tests.

#[cfg(feature = "cli")]
pub mod bench;
pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod commands;
pub mod csv_lines;
pub mod environment;
pub mod hccl;
pub mod launch;
#[cfg(feature = "mock")]
pub mod mock_recipes;
#[cfg(feature = "cli")]
pub mod plot;
pub mod policy;
pub mod schedule;
pub mod serde_nan;
pub mod signals;
pub mod sim;
pub mod synapse;
pub mod trace;
#[cfg(all(feature = "mock", feature = "cli"))]
pub mod train;
pub mod tune;

/// The CPU mock device (crate `habana-mock`), present with the default cargo feature `mock`:
/// the automatic backend's fallback when libSynapse is absent, and the device the training job
/// runs on. The product reaches it only through this re-export.
#[cfg(feature = "mock")]
pub use habana_mock as mock;
