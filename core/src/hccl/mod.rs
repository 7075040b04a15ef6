//! The safe HCCL layer (modelled on cudarc's NCCL module; HCCL is a near copy of NCCL's API).
//!
//! Owns: [`Comm`] and its collectives with the watchdog and flight recorder (`comm`, `flight`),
//! the element types and ops (`types`), the thin result tier (`result`), the launcher bootstrap
//! ([`bootstrap`]: rank, world size, local rank and rendezvous from torchrun, Open MPI, Slurm
//! or explicit values) and the authenticated unique-id rendezvous ([`rendezvous`]).
//! Must not touch: device memory management (borrowed from `crate::synapse`) or scheduling.

pub mod bootstrap;
mod comm;
mod error;
mod flight;
mod join;
pub mod local;
pub mod rendezvous;
pub mod result;
mod types;

pub use comm::{Comm, CommOptions};
pub use error::{HcclError, Result};
pub use flight::{FlightEntry, FlightRecorder};
pub use join::join;
pub use types::{HcclType, ReduceOp, UniqueId, UniqueIdParseError};
