//! Graphs under construction: the builder operations behind `synGraph*`, `synSection*`,
//! `synTensor*` and `synNode*` handles (methods of the registry, like `alloc.rs`), and the rules
//! the real runtime enforces while a graph is built (name uniqueness, locking of section flags
//! and tensor properties, operand checks at node creation), each with the status the ≈1.16
//! runtime returns (`graph_api.md` §8).
//!
//! Owns: the builder operations on the registry's `graphs` / `graph_items`. Must not touch:
//! compilation (that is `program.rs`), memory, streams; the record types are `records.rs`.

use habana_sys::{
    HABANA_DIM_MAX, synDataType, synDeviceType, synGeometryType, synStatus, synTensorGeometry, synTensorType,
};

use super::guid::{self, Guid, Operand};
use super::records::{GraphRec, Item, NodeRec, SectionRec, TensorRec};
use crate::cabi::handle_to_raw;
use crate::error::{MResult, MockError, fail};
use crate::state::Registry;

/// The most elements a mock tensor may have (2^40: far beyond any mock device's memory, small
/// enough that byte counts and workspace offsets never overflow).
pub(crate) const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

fn unknown(what: &str, h: u64) -> MockError {
    MockError::new(synStatus::INVALID_ARGUMENT, format!("unknown {what} handle {:#x}", handle_to_raw(h)))
}

impl Registry {
    fn graph_mut(&mut self, h: u64) -> MResult<&mut GraphRec> {
        self.check_init()?;
        self.graphs.get_mut(&h).ok_or_else(|| unknown("graph", h))
    }

    /// The graph record `h`.
    pub(crate) fn graph(&self, h: u64) -> MResult<&GraphRec> {
        self.check_init()?;
        self.graphs.get(&h).ok_or_else(|| unknown("graph", h))
    }

    fn item(&self, h: u64, section: bool) -> MResult<(u64, usize)> {
        self.check_init()?;
        match self.graph_items.get(&h) {
            Some(&(g, Item::Section(i))) if section => Ok((g, i)),
            Some(&(g, Item::Tensor(i))) if !section => Ok((g, i)),
            _ => Err(unknown(if section { "section" } else { "tensor" }, h)),
        }
    }

    fn tensor_mut(&mut self, h: u64) -> MResult<&mut TensorRec> {
        let (g, i) = self.item(h, false)?;
        Ok(&mut self.graph_mut(g)?.tensors[i])
    }

    /// The tensor record of handle `h`.
    pub(crate) fn tensor_rec(&self, h: u64) -> MResult<&TensorRec> {
        let (g, i) = self.item(h, false)?;
        Ok(&self.graph(g)?.tensors[i])
    }

    /// A tensor setter: fails with synObjectAlreadyInitialized once a node uses the tensor.
    fn unlocked_tensor(&mut self, h: u64) -> MResult<&mut TensorRec> {
        let t = self.tensor_mut(h)?;
        if t.locked {
            return fail(
                synStatus::OBJECT_ALREADY_INITIALIZED,
                format!("tensor {} already added to the graph and cannot be changed", t.name),
            );
        }
        Ok(t)
    }

    /// `synGraphCreate` / `synGraphCreateEager` (eager only for Gaudi2 and Gaudi3).
    pub(crate) fn graph_create(&mut self, device_type: synDeviceType, eager: bool) -> MResult<u64> {
        self.check_init()?;
        let ok = match device_type {
            synDeviceType::GAUDI => !eager,
            synDeviceType::GAUDI2 | synDeviceType::GAUDI3 => true,
            _ => false,
        };
        if !ok {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("device type {device_type} is not supported for {} graphs", if eager { "eager" } else { "" }),
            );
        }
        let h = self.new_handle();
        self.graphs.insert(
            h,
            GraphRec { device_type, sections: Vec::new(), tensors: Vec::new(), nodes: Vec::new(), compiled: false },
        );
        Ok(h)
    }

    /// `synGraphDestroy`: frees the graph and its tensors; its sections' handles stay valid for a
    /// later (tolerated) `synSectionDestroy`.
    pub(crate) fn graph_destroy(&mut self, h: u64) -> MResult<()> {
        self.check_init()?;
        if self.graphs.remove(&h).is_none() {
            return fail(
                synStatus::FAIL,
                format!("Graph Handle {:#x} is incorrect. No graph to destroy", handle_to_raw(h)),
            );
        }
        self.graph_items.retain(|_, (g, item)| *g != h || matches!(item, Item::Section(_)));
        Ok(())
    }

    /// `synSectionCreate` (persistent by default).
    pub(crate) fn section_create(&mut self, graph: u64) -> MResult<u64> {
        self.graph_mut(graph)?;
        let h = self.new_handle();
        let g = self.graph_mut(graph)?;
        g.sections.push(SectionRec { handle: h, persistent: true, konst: false, rmw: false, group: 0, locked: false });
        let i = g.sections.len() - 1;
        self.graph_items.insert(h, (graph, Item::Section(i)));
        Ok(h)
    }

    /// `synSectionDestroy` (success after its graph was destroyed, as the real runtime).
    pub(crate) fn section_destroy(&mut self, h: u64) -> MResult<()> {
        let (g, _) = self.item(h, true)?;
        if !self.graphs.contains_key(&g) {
            self.graph_items.remove(&h);
        }
        // A live graph keeps its section record (its tensors still refer to it); the handle
        // stays usable until the graph goes, as the runtime frees sections with the graph.
        Ok(())
    }

    /// A section flag setter (fails once a tensor was assigned to the section).
    pub(crate) fn section_modify(&mut self, h: u64, f: impl FnOnce(&mut SectionRec)) -> MResult<()> {
        let (g, i) = self.item(h, true)?;
        let s = &mut self.graph_mut(g)?.sections[i];
        if s.locked {
            return fail(synStatus::FAIL, "Section Handle was already used to create a tensor and can not be modified");
        }
        f(s);
        Ok(())
    }

    /// `synSectionGetPersistent`.
    pub(crate) fn section_persistent(&self, h: u64) -> MResult<bool> {
        let (g, i) = self.item(h, true)?;
        Ok(self.graph(g)?.sections[i].persistent)
    }

    /// `synTensorHandleCreate`. A duplicate name fails with synNameIsAlreadyUsed and hands back
    /// the existing tensor's handle, as the real runtime.
    pub(crate) fn tensor_create(
        &mut self,
        graph: u64,
        ty: synTensorType,
        name: Option<&str>,
    ) -> Result<u64, (Option<u64>, MockError)> {
        let g = self.graph_mut(graph).map_err(|e| (None, e))?;
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Err((None, MockError::new(synStatus::INVALID_ARGUMENT, "the CPU mock needs a tensor name")));
        };
        if ty != synTensorType::DATA_TENSOR {
            return Err((
                None,
                MockError::new(synStatus::UNSUPPORTED, format!("tensor type {ty} is not implemented by the CPU mock")),
            ));
        }
        if let Some(t) = g.tensors.iter().find(|t| t.name == name) {
            return Err((
                Some(t.handle),
                MockError::new(synStatus::NAME_IS_ALREADY_USED, format!("Tensor {name} was already mapped")),
            ));
        }
        let h = self.new_handle();
        let g = self.graph_mut(graph).map_err(|e| (None, e))?;
        g.tensors.push(TensorRec {
            handle: h,
            name: name.to_string(),
            ty,
            section: None,
            sizes: None,
            min_sizes: None,
            dtype: synDataType::NA,
            locked: false,
            external: false,
        });
        let i = g.tensors.len() - 1;
        self.graph_items.insert(h, (graph, Item::Tensor(i)));
        Ok(h)
    }

    /// `synTensorAssignToSection` (locks the section's flags).
    pub(crate) fn tensor_assign(&mut self, t: u64, section: u64, offset: u64) -> MResult<()> {
        let (tg, ti) = self.item(t, false)?;
        let (sg, si) = self.item(section, true)?;
        if tg != sg {
            return fail(synStatus::INVALID_ARGUMENT, "the section belongs to another graph");
        }
        self.unlocked_tensor(t)?;
        let g = self.graph_mut(tg)?;
        g.sections[si].locked = true;
        g.tensors[ti].section = Some((si, offset));
        Ok(())
    }

    /// `synTensorSetSectionOffset`.
    pub(crate) fn tensor_set_offset(&mut self, t: u64, offset: u64) -> MResult<()> {
        let r = self.unlocked_tensor(t)?;
        match &mut r.section {
            Some((_, o)) => {
                *o = offset;
                Ok(())
            }
            None => fail(synStatus::INVALID_ARGUMENT, format!("tensor {} is not assigned to a section", r.name)),
        }
    }

    /// `synTensorSetGeometry`.
    pub(crate) fn tensor_set_geometry(&mut self, t: u64, geo: &synTensorGeometry, ty: synGeometryType) -> MResult<()> {
        let r = self.unlocked_tensor(t)?;
        let dims = geo.dims as usize;
        if dims == 0 || dims > HABANA_DIM_MAX {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("tensor {}: dims {dims} (must be 1..={HABANA_DIM_MAX})", r.name),
            );
        }
        let sizes = geo.sizes[..dims].to_vec();
        // Every size >= 1 and the byte count of the largest element type representable: the
        // compiler and the executor then never overflow.
        let elems = sizes.iter().try_fold(1u64, |a, &d| a.checked_mul(d).filter(|_| d > 0));
        if elems.is_none_or(|n| n > MAX_TENSOR_ELEMENTS) {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("tensor {}: sizes {sizes:?} (each >= 1, at most {MAX_TENSOR_ELEMENTS} elements)", r.name),
            );
        }
        match ty {
            synGeometryType::MAX_SIZES => r.sizes = Some(sizes),
            synGeometryType::MIN_SIZES => r.min_sizes = Some(sizes),
            synGeometryType::DIMS => {}
            other => return fail(synStatus::INVALID_ARGUMENT, format!("geometry type {other}")),
        }
        Ok(())
    }

    /// `synTensorGetGeometry`.
    pub(crate) fn tensor_geometry(&self, t: u64, ty: synGeometryType) -> MResult<synTensorGeometry> {
        let r = self.tensor_rec(t)?;
        let sizes = match ty {
            synGeometryType::MIN_SIZES => r.min_sizes.as_ref().or(r.sizes.as_ref()),
            _ => r.sizes.as_ref(),
        };
        let Some(sizes) = sizes else {
            return fail(synStatus::OBJECT_NOT_INITIALIZED, format!("tensor {} has no geometry", r.name));
        };
        let mut g = synTensorGeometry::default();
        g.sizes[..sizes.len()].copy_from_slice(sizes);
        g.dims = sizes.len() as u32;
        Ok(g)
    }

    /// `synTensorSetDeviceDataType` / the dtype of `synTensorSetDeviceFullLayout`.
    pub(crate) fn tensor_set_dtype(&mut self, t: u64, dtype: synDataType) -> MResult<()> {
        let r = self.unlocked_tensor(t)?;
        if guid::elem_size(dtype).is_none() {
            return fail(
                synStatus::UNSUPPORTED,
                format!("tensor {}: dtype {dtype} is not implemented by the CPU mock", r.name),
            );
        }
        r.dtype = dtype;
        Ok(())
    }

    /// A setter with no effect on the mock beyond the lock rule (permutation, layout strides
    /// checked by the caller).
    pub(crate) fn tensor_touch(&mut self, t: u64) -> MResult<&mut TensorRec> {
        self.unlocked_tensor(t)
    }

    /// Builds the operand view of tensor index `i` of `g` (geometry and dtype required, as the
    /// real runtime's props check at node creation).
    fn operand<'a>(g: &'a GraphRec, i: usize, node: &str) -> MResult<Operand<'a>> {
        let t = &g.tensors[i];
        let Some(sizes) = t.sizes.as_deref() else {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!(
                    "tensor {} does not have geometry; Failed creating node {node}. tensor {} props not valid",
                    t.name, t.name
                ),
            );
        };
        if t.dtype == synDataType::NA {
            return fail(
                synStatus::FAIL,
                format!("node {node}: validateNode unsupported input data type invalid (tensor {})", t.name),
            );
        }
        Ok(Operand { name: &t.name, dtype: t.dtype, sizes })
    }

    /// `synNodeCreate(WithId)`: returns the new node's id.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn node_create(
        &mut self,
        graph: u64,
        inputs: &[u64],
        outputs: &[u64],
        params: &[u8],
        guid_name: Option<&str>,
        name: Option<&str>,
    ) -> MResult<u64> {
        self.graph(graph)?;
        let Some(guid_name) = guid_name.filter(|g| !g.is_empty()) else {
            return fail(synStatus::INVALID_ARGUMENT, "Invalid guid");
        };
        let resolve = |r: &Registry, h: u64| -> MResult<Option<usize>> {
            if h == 0 {
                return Ok(None);
            }
            let (g, i) = r.item(h, false)?;
            if g != graph {
                return fail(synStatus::INVALID_ARGUMENT, "a tensor of another graph");
            }
            Ok(Some(i))
        };
        let ins = inputs.iter().map(|&h| resolve(self, h)).collect::<MResult<Vec<_>>>()?;
        let outs = outputs.iter().map(|&h| resolve(self, h)).collect::<MResult<Vec<_>>>()?;
        let Some(outs) = outs.into_iter().collect::<Option<Vec<usize>>>() else {
            return fail(synStatus::INVALID_ARGUMENT, "null output tensor");
        };
        let g = self.graph(graph)?;
        let node_name =
            name.filter(|n| !n.is_empty()).map_or_else(|| format!("{guid_name}_{}", g.nodes.len()), str::to_string);
        let Some(guid) = Guid::parse(guid_name) else {
            return fail(
                synStatus::FAIL,
                format!(
                    "{node_name}: TPC kernel with guid {guid_name} doesn't exist (not implemented by the CPU mock); Can not add {guid_name} generic node to graph"
                ),
            );
        };
        let in_ops =
            ins.iter().map(|i| i.map(|i| Self::operand(g, i, &node_name)).transpose()).collect::<MResult<Vec<_>>>()?;
        let out_ops = outs.iter().map(|&i| Self::operand(g, i, &node_name)).collect::<MResult<Vec<_>>>()?;
        if let Err((invalid, msg)) = guid::check_create(&node_name, guid, params, &in_ops, &out_ops) {
            let status = if invalid { synStatus::INVALID_ARGUMENT } else { synStatus::FAIL };
            return fail(status, msg);
        }
        for &o in &outs {
            if let Some(p) = g.nodes.iter().find(|n| n.outputs.contains(&o)) {
                return fail(
                    synStatus::FAIL,
                    format!(
                        "node {node_name}: tensor {} already has producer {} (producer is already registered)",
                        g.tensors[o].name, p.name
                    ),
                );
            }
        }
        let id = g.nodes.len() as u64 + 1;
        let g = self.graph_mut(graph)?;
        for i in ins.iter().flatten().chain(&outs) {
            g.tensors[*i].locked = true;
        }
        g.nodes.push(NodeRec {
            name: node_name,
            guid_name: guid_name.to_string(),
            guid,
            inputs: ins,
            outputs: outs,
            params: params.to_vec(),
            after: Vec::new(),
        });
        Ok(id)
    }

    /// `synNodeDependencySet`: every `blocked` node runs after every `blocking` one.
    pub(crate) fn node_dependency(&mut self, graph: u64, blocking: &[u64], blocked: &[u64]) -> MResult<()> {
        let g = self.graph_mut(graph)?;
        let n = g.nodes.len() as u64;
        if let Some(bad) = blocking.iter().chain(blocked).find(|&&id| id == 0 || id > n) {
            return fail(synStatus::INVALID_ARGUMENT, format!("unknown node id {bad}"));
        }
        for &b in blocked {
            g.nodes[b as usize - 1].after.extend_from_slice(blocking);
        }
        Ok(())
    }
}
