//! Device graphs through the SynapseAI graph API: build, compile once, launch per micro-batch.
//!
//! Owns: [`GraphBuilder`] (typed tensors with row-major shapes, persistent tensors in sections,
//! workspace tensors, external tensors, nodes by GUID with typed parameters: [`Op`], node
//! dependencies, eager graphs), [`GraphRecipe`] (the
//! compiled recipe with the checked launch id of every persistent tensor and its workspace
//! size; events mapped to external tensors) and [`GraphArg`] launches; [`RecipeCache`] (compile once per library version, device
//! type and graph; later processes load the serialized recipe). Shape and dtype mistakes are caught before the C call
//! ([`crate::synapse::Error::Graph`] names the node, the tensor, what was expected and what
//! was given). The row-major ↔ device (fastest-dimension-first) conversion happens in one
//! place, `layout.rs`.
//! Must not touch: training policy, gradient semantics (callers compose graphs), backends.
//!
//! Works on any backend: the real libSynapse, or the CPU mock (which implements the same
//! GUIDs on the CPU, see `habana_mock`'s graph module).

mod builder;
mod cache;
mod compiled;
pub mod fuzzing;
pub(in crate::synapse) mod layout;
mod op;

pub use builder::{GraphBuilder, NodeId, SectionId};
pub use cache::RecipeCache;
pub use compiled::{CompiledTensor, GraphArg, GraphRecipe, RecipeOrigin, TensorId};
pub use layout::{DType, device_axis, device_axis_mask, device_permutation, device_sizes};
pub use op::{CastRounding, Op, Operand, Reduction};
