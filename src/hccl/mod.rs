//! The safe HCCL layer (modelled on cudarc's NCCL module; HCCL is a near copy of NCCL's API).
//!
//! Owns: [`Comm`] and its collectives with the watchdog and flight recorder (`comm`, `flight`),
//! the element types and ops (`types`), the thin result tier (`result`), and the launcher
//! bootstrap and unique-id rendezvous (`bootstrap`, `rendezvous`).
//! Must not touch: device memory management (borrowed from `crate::synapse`) or scheduling.

mod comm;
mod error;
mod flight;
pub mod result;
mod types;

pub use comm::{Comm, CommOptions};
pub use error::{HcclError, Result};
pub use flight::{FlightEntry, FlightRecorder};
pub use types::{HcclType, ReduceOp, UniqueId};
