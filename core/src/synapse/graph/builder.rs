//! Building a device graph and compiling it into a [`GraphRecipe`].
//!
//! Owns: [`GraphBuilder`] (one `synGraphHandle` with its sections and tensors, created in the
//! order the runtime requires: section flags, tensor, assignment, geometry, dtype, then nodes),
//! [`TensorId`], [`SectionId`], and `compile` (synGraphCompile, then the ids of every
//! persistent tensor checked, since `synTensorRetrieveIds` succeeds with an all-ones id for an
//! unknown name). Must not touch: launching (`compiled.rs`), shape rules (`op.rs`), the
//! dimension order (`layout.rs`).

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use habana_sys::{
    TENSOR_INVALID_ID, synDeviceType, synGeometryType, synGraphHandle, synNodeId, synRecipeHandle, synSectionHandle,
    synTensor, synTensorType,
};

use super::super::error::{Error, Result};
use super::super::recipe::Recipe;
use super::super::result::{self, check};
use super::super::runtime::Runtime;
use super::cache::RecipeCache;
use super::compiled::{CompiledTensor, GraphRecipe, RecipeOrigin, TensorId};
use super::layout::{DType, device_sizes};
use super::op::{Op, Operand};

/// A node of a [`GraphBuilder`] (its `synNodeCreateWithId` id is kept inside), for
/// [`GraphBuilder::depend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(usize);

/// A persistent section of a [`GraphBuilder`]: tensors placed in one section share its memory
/// (in-place updates: an input and an output at the same offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SectionId(usize);

#[derive(Debug)]
struct TensorEntry {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    handle: synTensor,
    section: Option<(SectionId, u64)>,
    /// Used by a node (the recipe only has tensors its nodes use).
    used: bool,
    /// Marked external (`synTensorSetExternal`): an event can be mapped to it.
    external: bool,
}

/// A graph under construction (`synGraphCreate`). Dropping it destroys the graph (best
/// effort); [`GraphBuilder::compile`] consumes it.
///
/// Tensors are either persistent (in a section; bound to a device buffer at every launch) or
/// workspace (placed by the compiler in the launch's workspace). Shapes are row-major.
#[derive(Debug)]
pub struct GraphBuilder {
    rt: Arc<Runtime>,
    handle: synGraphHandle,
    device_type: synDeviceType,
    sections: Vec<synSectionHandle>,
    tensors: Vec<TensorEntry>,
    /// Node names and runtime ids, in creation order.
    nodes: Vec<(String, synNodeId)>,
    /// SHA-256 of every tensor and node as added (name, dtype, shape, placement; GUID, params,
    /// operands): the graph part of a recipe cache key.
    hasher: Sha256,
}

// SAFETY: the handles are opaque tokens of the runtime, usable from any thread; the builder is
// not `Sync` (the graph API is not documented as thread-safe for one graph).
unsafe impl Send for GraphBuilder {}

fn c_string(what: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument { what, value: s.to_string() })
}

impl GraphBuilder {
    /// Creates an empty graph for `device_type` (it must match the device the recipe will run
    /// on: `Device::info().device_type`).
    ///
    /// # Errors
    /// [`Error::Synapse`] from `synGraphCreate` (e.g. an unsupported device type).
    pub fn new(rt: &Arc<Runtime>, device_type: synDeviceType) -> Result<Self> {
        Self::create(rt, device_type, false)
    }

    /// Creates an empty eager graph (`synGraphCreateEager`): the runtime's fast compile path for
    /// small helper graphs, built, compiled and launched exactly like [`GraphBuilder::new`]'s.
    /// The runtime falls back to normal compilation, silently, for more than 16 nodes or a node
    /// the eager path does not support (`graph_api.md` §6 "Eager graphs"); use it for tiny
    /// graphs (a cast, a fill), not the training step.
    ///
    /// # Errors
    /// [`Error::Synapse`] from `synGraphCreateEager`: synInvalidArgument for a device type other
    /// than Gaudi2 and Gaudi3 (the runtime accepts eager graphs only for those).
    pub fn new_eager(rt: &Arc<Runtime>, device_type: synDeviceType) -> Result<Self> {
        Self::create(rt, device_type, true)
    }

    fn create(rt: &Arc<Runtime>, device_type: synDeviceType, eager: bool) -> Result<Self> {
        let api = rt.api();
        let mut handle: synGraphHandle = std::ptr::null_mut();
        let (call, f) = if eager {
            ("synGraphCreateEager", api.syn_graph_create_eager)
        } else {
            ("synGraphCreate", api.syn_graph_create)
        };
        // SAFETY: valid out-pointer.
        check(api, call, unsafe { f(&mut handle, device_type) })?;
        let mut hasher = Sha256::new();
        hasher.update(if eager { "eager graph\n" } else { "graph\n" }.as_bytes());
        Ok(Self {
            rt: rt.clone(),
            handle,
            device_type,
            sections: Vec::new(),
            tensors: Vec::new(),
            nodes: Vec::new(),
            hasher,
        })
    }

    /// A new persistent section (persistent is the runtime's default).
    ///
    /// # Errors
    /// [`Error::Synapse`] from `synSectionCreate`.
    pub fn section(&mut self) -> Result<SectionId> {
        let api = self.rt.api();
        let mut s: synSectionHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; live graph; descriptor 0 as the header asks.
        check(api, "synSectionCreate", unsafe { (api.syn_section_create)(&mut s, 0, self.handle) })?;
        self.sections.push(s);
        Ok(SectionId(self.sections.len() - 1))
    }

    /// A persistent tensor in a section of its own.
    ///
    /// # Errors
    /// As [`GraphBuilder::persistent_in`].
    pub fn persistent(&mut self, name: &str, dtype: DType, shape: &[u64]) -> Result<TensorId> {
        let s = self.section()?;
        self.persistent_in(s, 0, name, dtype, shape)
    }

    /// A persistent tensor at `offset` bytes in `section`: give an input and an output of an
    /// in-place update the same section and offset (two sections may never alias).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name that is empty, has a NUL, or is already used in
    /// this graph, a shape with a 0 dimension or rank > 25, or a section of another builder;
    /// [`Error::Synapse`] from the tensor calls.
    pub fn persistent_in(
        &mut self,
        section: SectionId,
        offset: u64,
        name: &str,
        dtype: DType,
        shape: &[u64],
    ) -> Result<TensorId> {
        if section.0 >= self.sections.len() {
            return Err(Error::InvalidArgument { what: "section", value: format!("{section:?} of another graph") });
        }
        self.tensor(name, dtype, shape, Some((section, offset)))
    }

    /// A workspace tensor (an intermediate the compiler places in the launch's workspace).
    ///
    /// # Errors
    /// As [`GraphBuilder::persistent_in`].
    pub fn workspace(&mut self, name: &str, dtype: DType, shape: &[u64]) -> Result<TensorId> {
        self.tensor(name, dtype, shape, None)
    }

    fn tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        section: Option<(SectionId, u64)>,
    ) -> Result<TensorId> {
        if name.is_empty() || self.tensors.iter().any(|t| t.name == name) {
            return Err(Error::InvalidArgument {
                what: "tensor name",
                value: format!("{name:?} is empty or already used in this graph"),
            });
        }
        let geo = device_sizes(name, shape)?;
        let c = c_string("tensor name", name)?;
        let api = self.rt.api();
        let mut t: synTensor = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live graph, NUL-terminated name alive for the call.
        check(api, "synTensorHandleCreate", unsafe {
            (api.syn_tensor_handle_create)(&mut t, self.handle, synTensorType::DATA_TENSOR, c.as_ptr())
        })?;
        if let Some((s, offset)) = section {
            // SAFETY: live tensor and section of this graph.
            check(api, "synTensorAssignToSection", unsafe {
                (api.syn_tensor_assign_to_section)(t, self.sections[s.0], offset)
            })?;
        }
        // SAFETY: live tensor; the geometry is a valid struct read during the call.
        check(api, "synTensorSetGeometry", unsafe { (api.syn_tensor_set_geometry)(t, &geo, synGeometryType::SIZES) })?;
        // SAFETY: live tensor.
        check(api, "synTensorSetDeviceDataType", unsafe { (api.syn_tensor_set_device_data_type)(t, dtype.syn()) })?;
        let place = section.map(|(s, o)| format!("section {} offset {o}", s.0)).unwrap_or_else(|| "workspace".into());
        self.hasher.update(format!("tensor {name:?} {dtype} {shape:?} {place}\n").as_bytes());
        self.tensors.push(TensorEntry {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            handle: t,
            section,
            used: false,
            external: false,
        });
        Ok(TensorId(self.tensors.len() - 1))
    }

    fn entry(&self, t: TensorId) -> Result<&TensorEntry> {
        self.tensors
            .get(t.0)
            .ok_or_else(|| Error::InvalidArgument { what: "tensor", value: format!("{t:?} of another graph") })
    }

    /// Marks persistent tensor `t` external (`synTensorSetExternal`), so that
    /// [`super::GraphRecipe::map_event`] can map an event to it: a launch then records that
    /// event as soon as the node producing `t` ends, before the rest of the graph (to start,
    /// e.g., a bucket's all-reduce early). Call it before adding a node that uses `t` (the
    /// runtime locks a tensor's properties at its first node).
    ///
    /// # Errors
    /// Before the C call: [`Error::InvalidArgument`] naming the tensor when it is a workspace
    /// tensor (only persistent tensors can be external), already used by a node, or of another
    /// builder. [`Error::Synapse`] from `synTensorSetExternal`.
    pub fn set_external(&mut self, t: TensorId) -> Result<()> {
        let e = self.entry(t)?;
        let why = if e.section.is_none() {
            "is a workspace tensor (only persistent tensors can be external)"
        } else if e.used {
            "is already used by a node (mark it external before adding its nodes)"
        } else {
            ""
        };
        if !why.is_empty() {
            return Err(Error::InvalidArgument { what: "external tensor", value: format!("tensor {} {why}", e.name) });
        }
        let api = self.rt.api();
        // SAFETY: live tensor of this graph, not yet used by a node.
        check(api, "synTensorSetExternal", unsafe { (api.syn_tensor_set_external)(e.handle, true) })?;
        let name = e.name.clone();
        self.tensors[t.0].external = true;
        self.hasher.update(format!("external {name:?}\n").as_bytes());
        Ok(())
    }

    /// Adds node `name` computing `op` from `inputs` into `outputs` (`synNodeCreateWithId`).
    /// Operand counts, dtypes and shapes are checked first (see [`Op`]). Returns the node, for
    /// [`GraphBuilder::depend`].
    ///
    /// # Errors
    /// [`Error::Graph`] naming the node, tensor, expected and given value;
    /// [`Error::InvalidArgument`] for a tensor of another builder or a name with NUL;
    /// [`Error::Synapse`] when the runtime rejects the node.
    pub fn node(&mut self, name: &str, op: &Op, inputs: &[TensorId], outputs: &[TensorId]) -> Result<NodeId> {
        let operand = |t: &TensorId| -> Result<Operand<'_>> {
            let e = self.entry(*t)?;
            Ok(Operand { name: &e.name, dtype: e.dtype, shape: &e.shape })
        };
        let ins = inputs.iter().map(operand).collect::<Result<Vec<_>>>()?;
        let outs = outputs.iter().map(operand).collect::<Result<Vec<_>>>()?;
        let (guid, params) = op.check(name, &ins, &outs)?;
        let c_guid = c_string("GUID", &guid)?;
        let c_name = c_string("node name", name)?;
        let ih: Vec<synTensor> = inputs.iter().map(|t| self.tensors[t.0].handle).collect();
        let oh: Vec<synTensor> = outputs.iter().map(|t| self.tensors[t.0].handle).collect();
        let (pp, ps) = match &params {
            Some(p) => (p.as_ptr().cast::<c_void>(), p.len() as u32),
            None => (std::ptr::null(), 0),
        };
        let api = self.rt.api();
        let mut id: synNodeId = 0;
        // SAFETY: live graph and tensors; the arrays hold the counts passed; params (when
        // non-null) hold `ps` bytes; GUID and name are NUL-terminated; all alive for the call
        // (the runtime copies the params); valid out-pointer for the id.
        check(api, "synNodeCreateWithId", unsafe {
            (api.syn_node_create_with_id)(
                self.handle,
                ih.as_ptr(),
                oh.as_ptr(),
                ih.len() as u32,
                oh.len() as u32,
                pp,
                ps,
                c_guid.as_ptr(),
                c_name.as_ptr(),
                &mut id,
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        for t in inputs.iter().chain(outputs) {
            self.tensors[t.0].used = true;
        }
        let ids = |v: &[TensorId]| v.iter().map(|t| t.0.to_string()).collect::<Vec<_>>().join(",");
        let hex: String = params.iter().flatten().map(|b| format!("{b:02x}")).collect();
        self.hasher
            .update(format!("node {name:?} {guid} [{hex}] in {} out {}\n", ids(inputs), ids(outputs)).as_bytes());
        self.nodes.push((name.to_string(), id));
        Ok(NodeId(self.nodes.len() - 1))
    }

    /// Orders nodes that share no tensor (`synNodeDependencySet`): every node of `blocked` runs
    /// after every node of `blocking`. Data dependencies (a node reading another's output) need
    /// no call; this is for ordering the graph cannot see, e.g. to produce one external tensor
    /// before an unrelated long node.
    ///
    /// # Errors
    /// Before the C call: [`Error::InvalidArgument`] for an empty list, a node of another
    /// builder, or a node in both lists (naming it: it would wait for itself).
    /// [`Error::Synapse`] from `synNodeDependencySet`.
    pub fn depend(&mut self, blocking: &[NodeId], blocked: &[NodeId]) -> Result<()> {
        let ids = |v: &[NodeId]| -> Result<Vec<synNodeId>> {
            if v.is_empty() {
                return Err(Error::InvalidArgument { what: "node dependency", value: "an empty node list".into() });
            }
            v.iter()
                .map(|n| {
                    self.nodes.get(n.0).map(|(_, id)| *id).ok_or_else(|| Error::InvalidArgument {
                        what: "node dependency",
                        value: format!("{n:?} of another graph"),
                    })
                })
                .collect()
        };
        let (a, b) = (ids(blocking)?, ids(blocked)?);
        if let Some(n) = blocking.iter().find(|n| blocked.contains(n)) {
            return Err(Error::InvalidArgument {
                what: "node dependency",
                value: format!("node {} both blocks and is blocked (it would wait for itself)", self.nodes[n.0].0),
            });
        }
        let api = self.rt.api();
        // SAFETY: live graph; the arrays hold the counts passed, alive for the call.
        check(api, "synNodeDependencySet", unsafe {
            (api.syn_node_dependency_set)(self.handle, a.as_ptr(), b.as_ptr(), a.len() as u32, b.len() as u32)
        })?;
        let names = |v: &[NodeId]| v.iter().map(|n| self.nodes[n.0].0.as_str()).collect::<Vec<_>>().join(",");
        let line = format!("depend [{}] before [{}]\n", names(blocking), names(blocked));
        self.hasher.update(line.as_bytes());
        Ok(())
    }

    /// The row-major shape and dtype of `t`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a tensor of another builder.
    pub fn tensor_info(&self, t: TensorId) -> Result<(DType, &[u64])> {
        let e = self.entry(t)?;
        Ok((e.dtype, &e.shape))
    }

    /// Compiles the graph (`synGraphCompile`) into a recipe named `name`, retrieves and checks
    /// the launch id of every persistent tensor used by a node and the workspace size, then
    /// destroys the graph (the recipe does not depend on it).
    ///
    /// # Errors
    /// [`Error::Synapse`] from the compiler (unknown GUID, inconsistent graph, ...);
    /// [`Error::UnknownTensor`] when the recipe has no id for a persistent tensor.
    pub fn compile(mut self, name: &str) -> Result<GraphRecipe> {
        let (recipe, t) = self.compile_raw(name)?;
        self.finish(recipe, name, RecipeOrigin::Compiled(t))
    }

    /// As [`GraphBuilder::compile`], through `cache`: a recipe of the same graph, library
    /// version and device type serialized earlier (by this or another process) is loaded
    /// instead of compiled; otherwise the graph is compiled and its recipe stored. A cached
    /// file that does not load is replaced (warned), never trusted.
    ///
    /// # Errors
    /// As [`GraphBuilder::compile`]; [`Error::InvalidArgument`] when the cache directory cannot be
    /// created or written.
    pub fn compile_cached(mut self, name: &str, cache: &RecipeCache) -> Result<GraphRecipe> {
        let version = self.rt.api().version().unwrap_or("unknown-version").to_string();
        let path = cache.path(name, &version, self.device_type, &self.hasher.clone().finalize());
        if path.exists() {
            let t0 = Instant::now();
            match Recipe::load(&self.rt, &path) {
                Ok(recipe) => match self.finish(recipe, name, RecipeOrigin::Cache(t0.elapsed())) {
                    Ok(r) => return Ok(r),
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "cached recipe unusable; recompiling"),
                },
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cached recipe does not load; recompiling")
                }
            }
        }
        let (recipe, t) = self.compile_raw(name)?;
        cache.store(&recipe, &path)?;
        self.finish(recipe, name, RecipeOrigin::Compiled(t))
    }

    fn compile_raw(&mut self, name: &str) -> Result<(Recipe, Duration)> {
        let api = self.rt.api().clone();
        let c = c_string("recipe name", name)?;
        let mut h: synRecipeHandle = std::ptr::null_mut();
        let t0 = Instant::now();
        // SAFETY: valid out-pointer, live graph, NUL-terminated name; null build log.
        check(&api, "synGraphCompile", unsafe {
            (api.syn_graph_compile)(&mut h, self.handle, c.as_ptr(), std::ptr::null())
        })?;
        Ok((Recipe::from_raw(&self.rt, h), t0.elapsed()))
    }

    /// The launch ids (checked) and workspace size of `recipe` compiled from this graph.
    fn finish(&mut self, recipe: Recipe, name: &str, origin: RecipeOrigin) -> Result<GraphRecipe> {
        // Persistent tensors no node uses are not part of the recipe (no id, not bound).
        let persistent: Vec<usize> =
            (0..self.tensors.len()).filter(|&i| self.tensors[i].section.is_some() && self.tensors[i].used).collect();
        let names: Vec<CString> =
            persistent.iter().map(|&i| c_string("tensor name", &self.tensors[i].name)).collect::<Result<_>>()?;
        // SAFETY: the recipe is live (owned by `recipe`).
        let ids = unsafe { result::tensor_ids(self.rt.api(), recipe.raw(), &names) }?;
        let mut tensors: Vec<CompiledTensor> = self
            .tensors
            .iter()
            .map(|t| CompiledTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                id: None,
                section: t.section.map(|(s, o)| (s.0, o)),
                external: t.external,
            })
            .collect();
        for (&i, &id) in persistent.iter().zip(&ids) {
            if id == TENSOR_INVALID_ID {
                return Err(Error::UnknownTensor { recipe: name.to_string(), tensor: self.tensors[i].name.clone() });
            }
            tensors[i].id = Some(id);
        }
        let workspace = recipe.workspace_size()?;
        self.destroy_graph();
        Ok(GraphRecipe::new(recipe, name.to_string(), tensors, workspace, origin))
    }

    fn destroy_graph(&mut self) {
        if self.handle.is_null() {
            return;
        }
        let api = self.rt.api();
        // SAFETY: live graph, destroyed once (the handle is nulled below); its tensors go with it.
        if let Err(e) = check(api, "synGraphDestroy", unsafe { (api.syn_graph_destroy)(self.handle) }) {
            tracing::warn!(error = %e, "best-effort graph destroy failed");
        }
        for &s in &self.sections {
            // SAFETY: a section of the destroyed graph; the runtime tolerates this call.
            let _ = unsafe { (api.syn_section_destroy)(s) };
        }
        self.handle = std::ptr::null_mut();
    }

    /// The device type the graph is built for.
    pub fn device_type(&self) -> synDeviceType {
        self.device_type
    }

    /// The names of the nodes added so far, in order.
    pub fn nodes(&self) -> Vec<&str> {
        self.nodes.iter().map(|(n, _)| n.as_str()).collect()
    }
}

impl Drop for GraphBuilder {
    fn drop(&mut self) {
        self.destroy_graph();
    }
}
