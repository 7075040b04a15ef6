//! The records of graphs under construction: graphs, sections, tensors, nodes and what a
//! section or tensor handle refers to.
//!
//! Owns: [`GraphRec`], [`SectionRec`], [`TensorRec`], [`NodeRec`], [`Item`] (plain data held
//! by the registry). Must not touch: the registry or any operation on them (`builder.rs`
//! builds, `program.rs` compiles); a leaf apart from the GUID type.

use habana_sys::{synDataType, synDeviceType, synTensorType};

use super::guid::Guid;

/// A section of a graph.
#[derive(Debug, Clone)]
pub(crate) struct SectionRec {
    /// Its handle id.
    pub handle: u64,
    /// Persistent (the default): its tensors are bound at launch.
    pub persistent: bool,
    /// Const section (data baked into the recipe; not implemented by the mock's compiler).
    pub konst: bool,
    /// Read-modify-write section.
    pub rmw: bool,
    /// Section group (0..=255).
    pub group: u64,
    /// Set at the first tensor assignment: flags cannot change afterwards.
    pub locked: bool,
}

/// A tensor of a graph.
#[derive(Debug, Clone)]
pub(crate) struct TensorRec {
    /// Its handle id.
    pub handle: u64,
    /// Unique name within the graph.
    pub name: String,
    /// Tensor type (only DATA_TENSOR is supported by the mock).
    pub ty: synTensorType,
    /// (section index, byte offset), when assigned.
    pub section: Option<(usize, u64)>,
    /// Max sizes, FCD first, when set.
    pub sizes: Option<Vec<u64>>,
    /// Min sizes, FCD first, when set (dynamic shapes: the mock's compiler needs min == max).
    pub min_sizes: Option<Vec<u64>>,
    /// Element type (NA until set).
    pub dtype: synDataType,
    /// Locked once the tensor is used by a node: setters then fail.
    pub locked: bool,
    /// Marked external (`synTensorSetExternal`): may be mapped to an event.
    pub external: bool,
}

/// A node of a graph.
#[derive(Debug, Clone)]
/// Its id (`synNodeCreateWithId`) is its position + 1.
pub(crate) struct NodeRec {
    /// Node name (generated when the caller passed none).
    pub name: String,
    /// The GUID as given.
    pub guid_name: String,
    /// The parsed GUID.
    pub guid: Guid,
    /// Input tensor indices (None for a null entry, e.g. an absent GEMM bias).
    pub inputs: Vec<Option<usize>>,
    /// Output tensor indices.
    pub outputs: Vec<usize>,
    /// Parameter bytes as passed.
    pub params: Vec<u8>,
    /// Nodes that must run before this one (`synNodeDependencySet`), by id.
    pub after: Vec<u64>,
}

/// A graph under construction.
#[derive(Debug, Clone)]
pub(crate) struct GraphRec {
    /// The device type it is compiled for.
    pub device_type: synDeviceType,
    /// Sections in creation order.
    pub sections: Vec<SectionRec>,
    /// Tensors in creation order.
    pub tensors: Vec<TensorRec>,
    /// Nodes in creation order.
    pub nodes: Vec<NodeRec>,
    /// Set by a successful synGraphCompile: a graph compiles once.
    pub compiled: bool,
}

/// What a section or tensor handle refers to: (graph handle id, kind and index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    /// Section index in its graph.
    Section(usize),
    /// Tensor index in its graph.
    Tensor(usize),
}
