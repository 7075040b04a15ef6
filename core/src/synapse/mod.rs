//! The safe layer over the SynapseAI runtime.
//!
//! Owns the cudarc-style tiers above `habana-sys`: [`result`] (every call returns a `Result`,
//! Rust names, still `unsafe` where handles must be live) and the RAII types [`Runtime`],
//! [`Device`], [`Stream`], [`Event`], [`DeviceBuffer`], [`HostBuffer`], [`Recipe`] plus
//! `Stream::launch`. Destruction is explicit and fallible (`destroy`/`release`/`free` return a
//! [`DropResult`]); `Drop` is best effort, bounded and never panics.
//! Must not touch: collectives (`crate::hccl`), scheduling policy, or which backend fills the
//! table beyond [`backend`].
//!
//! `unsafe` in the crate is confined to this layer, the mock's C ABI and the kernels' FFI; the
//! modules above (policy, scheduler, simulator, tuner, training) forbid it.

pub mod backend;
mod error;
pub mod graph;
mod memory;
mod recipe;
pub mod result;
mod runtime;
mod stream;

pub use backend::{Backend, BackendChoice};
pub use error::{DropResult, Error, OperandMismatch, Result};
pub use memory::{DeviceBuffer, DeviceRepr, HOST_DROP_TIMEOUT, HostBuffer};
pub use recipe::{LaunchTensor, LaunchTensorInfo, Recipe};
pub use runtime::{Device, DeviceInfo, Runtime, module_id_from_env};
pub use stream::{DROP_DRAIN_TIMEOUT, Event, Stream};
