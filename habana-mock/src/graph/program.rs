//! Compiled graphs: what `synGraphCompile` makes of a [`GraphRec`] (a [`Program`]: persistent
//! tensors with launch ids, sections, a workspace layout, nodes in a valid order, a modelled
//! cost), how a launch binds it to device memory, and how the stream worker runs it.
//!
//! Owns: [`compile`], [`Program`] (its serialized form is the mock's graph recipe file, JSON
//! with `"format": "dropcompute-mock-graph-recipe"`), [`Program::bind`] (the launch rules of
//! `graph_api.md` §5: every persistent tensor given, one base per section, no overlapping
//! sections, a workspace when one is needed; failures are synFailedSectionValidation as on the
//! real runtime) and [`Program::execute`]. Must not touch: the registry (callers pass what it
//! holds), streams.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use habana_sys::{TENSOR_INVALID_ID, synDataType, synDeviceType, synStatus};
use serde::{Deserialize, Serialize};

use super::cpu;
use super::guid::{self, Guid, Operand};
use super::records::GraphRec;
use crate::error::{MResult, fail};
use crate::recipe::TENSOR_ID_BASE;

/// The `format` field of a mock graph recipe file.
pub(crate) const GRAPH_RECIPE_FORMAT: &str = "dropcompute-mock-graph-recipe";
/// Alignment of workspace tensors, bytes (the Gaudi2 address alignment).
const WS_ALIGN: u64 = 128;

/// Where a compiled tensor lives.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// In persistent section `section` at `offset` bytes; bound at launch.
    Persistent {
        /// Index into [`Program::sections`].
        section: usize,
        /// Byte offset in the section.
        offset: u64,
    },
    /// In the workspace at `offset` bytes.
    Workspace {
        /// Byte offset in the workspace.
        offset: u64,
    },
}

/// One tensor of a compiled graph.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct PTensor {
    /// Name.
    pub name: String,
    /// Element type (raw `synDataType`).
    pub dtype: i32,
    /// Sizes, FCD first.
    pub sizes: Vec<u64>,
    /// Placement.
    pub place: Place,
    /// Read by some node.
    pub is_input: bool,
    /// Marked external (may be mapped to an event).
    pub external: bool,
}

impl PTensor {
    /// Element type.
    pub(crate) fn dtype(&self) -> synDataType {
        synDataType(self.dtype)
    }

    /// Bytes.
    pub(crate) fn bytes(&self) -> u64 {
        cpu::numel(&self.sizes) as u64 * guid::elem_size(self.dtype()).unwrap_or(4)
    }
}

/// One node of a compiled graph (in execution order).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct PNode {
    /// Node name.
    pub name: String,
    /// GUID.
    pub guid: String,
    /// Parameter bytes.
    pub params: Vec<u8>,
    /// Input tensor indices (None: absent optional operand).
    pub inputs: Vec<Option<usize>>,
    /// Output tensor indices.
    pub outputs: Vec<usize>,
}

/// A compiled graph (what a mock recipe handle holds for a graph recipe).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct Program {
    /// Always [`GRAPH_RECIPE_FORMAT`].
    pub format: String,
    /// Recipe name given to synGraphCompile.
    pub name: String,
    /// The graph's device type (raw `synDeviceType`).
    pub device_type: i32,
    /// Every tensor.
    pub tensors: Vec<PTensor>,
    /// Indices of the persistent tensors, in launch-id order (id = TENSOR_ID_BASE + position).
    pub persistent: Vec<usize>,
    /// Extent in bytes of each persistent section (max offset + bytes of its tensors).
    pub sections: Vec<u64>,
    /// Nodes in execution order.
    pub nodes: Vec<PNode>,
    /// Workspace bytes.
    pub workspace_bytes: u64,
    /// (bytes moved, flops) of the whole graph, for the cost model.
    pub work: (u64, u64),
    /// The parsed GUIDs of `nodes` (filled by [`Program::resolve`]).
    #[serde(skip)]
    pub guids: Vec<Guid>,
    /// (bytes moved, flops) of each node, in execution order (filled by [`Program::resolve`]).
    #[serde(skip)]
    pub node_work: Vec<(u64, u64)>,
}

/// A failed compile: status and message (naming the node or tensor).
pub(crate) type CompileError = (synStatus, String);

/// Compiles `g` as `synGraphCompile` would (every failure is synFail on the ≈1.16 runtime,
/// except const sections and dynamic shapes, which the mock does not implement: synUnsupported).
pub(crate) fn compile(g: &GraphRec, name: &str) -> Result<Program, CompileError> {
    let fail26 = |m: String| Err((synStatus::FAIL, m));
    if g.compiled {
        return fail26(format!("Graph with recipe {name} was already compiled"));
    }
    let operand = |i: usize| {
        let t = &g.tensors[i];
        Operand { name: &t.name, dtype: t.dtype, sizes: t.sizes.as_deref().unwrap_or(&[]) }
    };
    for n in &g.nodes {
        let ins: Vec<_> = n.inputs.iter().map(|i| i.map(operand)).collect();
        let outs: Vec<_> = n.outputs.iter().map(|&i| operand(i)).collect();
        guid::check_compile(&n.name, &n.guid_name, n.guid, &n.params, &ins, &outs).map_err(|m| (synStatus::FAIL, m))?;
    }
    let used: Vec<bool> = (0..g.tensors.len())
        .map(|i| g.nodes.iter().any(|n| n.inputs.contains(&Some(i)) || n.outputs.contains(&i)))
        .collect();
    for (i, t) in g.tensors.iter().enumerate().filter(|(i, _)| used[*i]) {
        if t.min_sizes.as_ref().is_some_and(|m| Some(m) != t.sizes.as_ref()) {
            return Err((
                synStatus::UNSUPPORTED,
                format!("tensor {}: dynamic shapes are not implemented by the CPU mock", t.name),
            ));
        }
        if let Some((s, _)) = t.section
            && g.sections[s].konst
        {
            return Err((
                synStatus::UNSUPPORTED,
                format!("tensor {} (#{i}): const sections are not implemented by the CPU mock", t.name),
            ));
        }
    }
    let persistent_t = |i: usize| g.tensors[i].section.is_some_and(|(s, _)| g.sections[s].persistent);
    // Graph inputs must be persistent.
    for n in &g.nodes {
        for &i in n.inputs.iter().flatten() {
            if !persistent_t(i) && !g.nodes.iter().any(|p| p.outputs.contains(&i)) {
                return fail26(format!(
                    "node {}: All Inputs should be declared as persistent: tensor {} is read, never written, and not in a persistent section",
                    n.name, g.tensors[i].name
                ));
            }
        }
    }
    let order = schedule(g)?;
    // Persistent tensors get launch ids in creation order; their sections an index.
    let mut section_index: HashMap<usize, usize> = HashMap::new();
    let mut sections: Vec<u64> = Vec::new();
    let mut ws = 0u64;
    let mut tensors = Vec::with_capacity(g.tensors.len());
    let mut persistent = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        let sizes = t.sizes.clone().unwrap_or_default();
        let bytes = cpu::numel(&sizes) as u64 * guid::elem_size(t.dtype).unwrap_or(4);
        let place = match t.section {
            Some((s, offset)) if g.sections[s].persistent => {
                let k = *section_index.entry(s).or_insert_with(|| {
                    sections.push(0);
                    sections.len() - 1
                });
                sections[k] = sections[k].max(offset.saturating_add(bytes));
                if used[i] {
                    persistent.push(i);
                }
                Place::Persistent { section: k, offset }
            }
            _ => {
                let offset = ws;
                if used[i] {
                    ws += bytes.div_ceil(WS_ALIGN) * WS_ALIGN;
                }
                Place::Workspace { offset }
            }
        };
        let is_input = g.nodes.iter().any(|n| n.inputs.contains(&Some(i)));
        tensors.push(PTensor { name: t.name.clone(), dtype: t.dtype.0, sizes, place, is_input, external: t.external });
    }
    let nodes: Vec<PNode> = order
        .iter()
        .map(|&k| {
            let n = &g.nodes[k];
            PNode {
                name: n.name.clone(),
                guid: n.guid_name.clone(),
                params: n.params.clone(),
                inputs: n.inputs.clone(),
                outputs: n.outputs.clone(),
            }
        })
        .collect();
    let mut p = Program {
        format: GRAPH_RECIPE_FORMAT.into(),
        name: name.to_string(),
        device_type: g.device_type.0,
        tensors,
        persistent,
        sections,
        nodes,
        workspace_bytes: ws,
        work: (0, 0),
        guids: Vec::new(),
        node_work: Vec::new(),
    };
    p.resolve().map_err(|m| (synStatus::FAIL, m))?;
    Ok(p)
}

/// A valid execution order of `g`'s nodes: producers before consumers, explicit dependencies,
/// and every reader of section memory before a writer of an overlapping range of the same
/// section (in-place updates). A cycle is synFail ("Invalid graph - a cycle was found").
fn schedule(g: &GraphRec) -> Result<Vec<usize>, CompileError> {
    let n = g.nodes.len();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    let range = |i: usize| {
        let t = &g.tensors[i];
        let bytes = cpu::numel(t.sizes.as_deref().unwrap_or(&[])) as u64 * guid::elem_size(t.dtype).unwrap_or(4);
        t.section.map(|(s, off)| (s, off, off.saturating_add(bytes)))
    };
    let overlap = |a: usize, b: usize| match (range(a), range(b)) {
        (Some((s, a0, a1)), Some((t, b0, b1))) => s == t && a0 < b1 && b0 < a1,
        _ => false,
    };
    for (w, wn) in g.nodes.iter().enumerate() {
        for (r, rn) in g.nodes.iter().enumerate() {
            if w == r {
                continue;
            }
            let reads = |x: usize| rn.inputs.contains(&Some(x));
            // Producer before consumer.
            if wn.outputs.iter().any(|&o| reads(o)) {
                edges[w].push(r);
            } else if wn.outputs.iter().any(|&o| rn.inputs.iter().flatten().any(|&i| i != o && overlap(i, o))) {
                // `rn` reads memory that `wn` overwrites in place: read first.
                edges[r].push(w);
            }
        }
        for &b in &wn.after {
            edges[b as usize - 1].push(w);
        }
    }
    let mut indeg = vec![0usize; n];
    for e in edges.iter().flatten() {
        indeg[*e] += 1;
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(k) = ready.pop_first() {
        order.push(k);
        for &e in &edges[k] {
            indeg[e] -= 1;
            if indeg[e] == 0 {
                ready.insert(e);
            }
        }
    }
    if order.len() != n {
        let stuck: Vec<&str> = (0..n).filter(|k| !order.contains(k)).map(|k| g.nodes[k].name.as_str()).collect();
        return Err((synStatus::FAIL, format!("Invalid graph - a cycle was found among nodes {stuck:?}")));
    }
    Ok(order)
}

/// One persistent tensor bound at launch: recipe tensor index and device address.
pub(crate) type Bound = (usize, u64);

impl Program {
    /// Parses the GUIDs and computes the work totals (after compile or deserialize).
    pub(crate) fn resolve(&mut self) -> Result<(), String> {
        self.guids = Vec::with_capacity(self.nodes.len());
        self.node_work = Vec::with_capacity(self.nodes.len());
        let mut work = (0u64, 0u64);
        for n in &self.nodes {
            let g = Guid::parse(&n.guid).ok_or_else(|| format!("node {}: unknown GUID {}", n.name, n.guid))?;
            let t = |i: usize| -> Result<Operand<'_>, String> {
                let t = self.tensors.get(i).ok_or_else(|| format!("node {}: tensor index {i} out of range", n.name))?;
                Ok(Operand { name: &t.name, dtype: t.dtype(), sizes: &t.sizes })
            };
            let ins = n.inputs.iter().map(|i| i.map(t).transpose()).collect::<Result<Vec<_>, _>>()?;
            let outs = n.outputs.iter().map(|&i| t(i)).collect::<Result<Vec<_>, _>>()?;
            guid::check_compile(&n.name, &n.guid, g, &n.params, &ins, &outs)?;
            let (b, f) = guid::cost(g, &n.params, &ins, &outs);
            work = (work.0 + b, work.1 + f);
            self.node_work.push((b, f));
            self.guids.push(g);
        }
        self.work = work;
        Ok(())
    }

    /// The launch id of persistent tensor number `k`.
    pub(crate) fn id_of(k: usize) -> u64 {
        TENSOR_ID_BASE + k as u64
    }

    /// Position in [`Program::persistent`] of launch id `id`.
    pub(crate) fn position_of_id(&self, id: u64) -> Option<usize> {
        let k = usize::try_from(id.checked_sub(TENSOR_ID_BASE)?).ok()?;
        (k < self.persistent.len()).then_some(k)
    }

    /// Launch id of the persistent tensor named `name`, or TENSOR_INVALID_ID.
    pub(crate) fn id_of_name(&self, name: &[u8]) -> u64 {
        self.persistent
            .iter()
            .position(|&i| self.tensors[i].name.as_bytes() == name)
            .map_or(TENSOR_INVALID_ID, Self::id_of)
    }

    /// Modelled device time of one launch before noise, ns: bytes at `gbps` GB/s, flops at
    /// `gflops` GFLOP/s, plus `overhead_ns` per node.
    pub(crate) fn cost_ns(&self, gbps: f64, gflops: f64, overhead_ns: u64) -> u64 {
        let t = self.work.0 as f64 / gbps + self.work.1 as f64 / gflops;
        t.round() as u64 + overhead_ns * self.nodes.len() as u64
    }

    /// The node (position in execution order) that last writes tensor `i`, if any: the node
    /// after which the tensor is ready.
    pub(crate) fn producer_of(&self, i: usize) -> Option<usize> {
        self.nodes.iter().rposition(|n| n.outputs.contains(&i))
    }

    /// Device time from the start of a launch lasting `latency_ns` to the end of node `k`
    /// (execution order), ns: the launch's time split over its nodes in proportion to their
    /// modelled cost (same rates as [`Program::cost_ns`]). The last node ends at `latency_ns`.
    pub(crate) fn node_end_ns(&self, k: usize, latency_ns: u64, gbps: f64, gflops: f64, overhead_ns: u64) -> u64 {
        let node = |&(b, f): &(u64, u64)| b as f64 / gbps + f as f64 / gflops + overhead_ns as f64;
        let total: f64 = self.node_work.iter().map(node).sum();
        if k + 1 >= self.node_work.len() || total <= 0.0 {
            return latency_ns;
        }
        let done: f64 = self.node_work[..=k].iter().map(node).sum();
        ((latency_ns as f64 * done / total).round() as u64).min(latency_ns)
    }

    /// The device type.
    pub(crate) fn device_type(&self) -> synDeviceType {
        synDeviceType(self.device_type)
    }

    /// Checks a launch's bindings (every persistent tensor bound once, one base per section,
    /// sections disjoint) and returns the base address of each section. Every failure is
    /// synFailedSectionValidation naming the tensor or section.
    pub(crate) fn section_bases(&self, bound: &[Bound]) -> MResult<Vec<u64>> {
        let v = synStatus::FAILED_SECTION_VALIDATION;
        let mut addr: Vec<Option<u64>> = vec![None; self.persistent.len()];
        for &(k, a) in bound {
            if addr[k].replace(a).is_some_and(|old| old != a) {
                return fail(
                    v,
                    format!("tensor {} bound twice with different addresses", self.tensors[self.persistent[k]].name),
                );
            }
        }
        let mut bases: Vec<Option<u64>> = vec![None; self.sections.len()];
        for (k, &i) in self.persistent.iter().enumerate() {
            let t = &self.tensors[i];
            let Some(a) = addr[k] else {
                return fail(v, format!("some sections were not set: tensor {} missing", t.name));
            };
            let Place::Persistent { section, offset } = t.place else { unreachable!("persistent list") };
            let Some(base) = a.checked_sub(offset) else {
                return fail(v, format!("tensor {}: address {a:#x} below its offset {offset} in the section", t.name));
            };
            match bases[section] {
                Some(b) if b != base => {
                    return fail(
                        v,
                        format!(
                            "Patching-info-ID was already set for section {section}: tensor {} implies base {base:#x}, another tensor {b:#x}",
                            t.name
                        ),
                    );
                }
                _ => bases[section] = Some(base),
            }
        }
        let bases: Vec<u64> = bases.into_iter().map(|b| b.unwrap_or(0)).collect();
        for i in 0..bases.len() {
            for j in i + 1..bases.len() {
                let (a0, a1) = (bases[i], bases[i].saturating_add(self.sections[i]));
                let (b0, b1) = (bases[j], bases[j].saturating_add(self.sections[j]));
                if a0 < b1 && b0 < a1 && self.sections[i] > 0 && self.sections[j] > 0 {
                    return fail(
                        v,
                        format!(
                            "overlap; trying to set 2 sections with overlap: section {i} [{a0:#x}, {a1:#x}) and section {j} [{b0:#x}, {b1:#x})"
                        ),
                    );
                }
            }
        }
        Ok(bases)
    }

    /// Runs every node on memory: `regions[s]` is the start of persistent section s (valid for
    /// `self.sections[s]` bytes), `regions[sections.len()]` the workspace when it is nonzero.
    /// An f32 input at a 4-byte-aligned address is read in place (no copy per node); other
    /// dtypes are widened into a buffer; each node's outputs are computed into buffers and then
    /// stored (f32 by one copy), so an in-place node reads its inputs before they change.
    ///
    /// # Safety
    /// Each region pointer is valid for reads and writes of its extent for the duration of the
    /// call and no other thread touches that memory (the caller holds the allocations' locks).
    /// Regions may lie in one allocation but do not overlap (checked at launch).
    pub(crate) unsafe fn execute(&self, regions: &[*mut u8]) -> Result<(), String> {
        let ptr_of = |i: usize| -> *mut u8 {
            let t = &self.tensors[i];
            match t.place {
                // SAFETY: offset + bytes <= the section's extent (the extent is their max).
                Place::Persistent { section, offset } => unsafe { regions[section].add(offset as usize) },
                // SAFETY: offset + bytes <= the workspace size (assigned at compile).
                Place::Workspace { offset } => unsafe { regions[self.sections.len()].add(offset as usize) },
            }
        };
        for (n, g) in self.nodes.iter().zip(&self.guids) {
            // Inputs are bound in place (no copy) when they are f32 and 4-byte aligned, which
            // every tensor of a section or workspace at a multiple-of-4 offset is (allocations
            // are 128-byte aligned); other dtypes are widened into a buffer.
            let values = {
                let loaded: Vec<Option<Cow<'_, [f32]>>> = n
                    .inputs
                    .iter()
                    .map(|i| {
                        i.map(|i| {
                            let t = &self.tensors[i];
                            // SAFETY: the tensor's bytes lie inside its region (see `ptr_of`);
                            // nothing writes that memory while `loaded` lives (outputs are
                            // stored after this block).
                            unsafe { bind(ptr_of(i), t.dtype(), cpu::numel(&t.sizes)) }
                        })
                    })
                    .collect();
                let ins: Vec<Option<(&[f32], &[u64])>> = n
                    .inputs
                    .iter()
                    .zip(&loaded)
                    .map(|(i, v)| i.zip(v.as_deref()).map(|(i, v)| (v, self.tensors[i].sizes.as_slice())))
                    .collect();
                let outs: Vec<&[u64]> = n.outputs.iter().map(|&o| self.tensors[o].sizes.as_slice()).collect();
                guid::run(*g, &n.params, &ins, &outs).map_err(|e| format!("node {} ({}): {e}", n.name, n.guid))?
            };
            for (&o, v) in n.outputs.iter().zip(values) {
                // SAFETY: as above, for the output tensor; no input borrow is alive.
                unsafe { store(ptr_of(o), self.tensors[o].dtype(), &v) };
            }
        }
        Ok(())
    }

    /// Writes the program as JSON.
    pub(crate) fn write(&self, path: &Path) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses a graph recipe file's JSON and re-validates every node.
    pub(crate) fn from_slice(bytes: &[u8]) -> Result<Self, String> {
        habana_sys::require_json_object(bytes)?;
        let mut p: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if p.format != GRAPH_RECIPE_FORMAT {
            return Err(format!("format {:?}, expected {GRAPH_RECIPE_FORMAT:?}", p.format));
        }
        for (k, &i) in p.persistent.iter().enumerate() {
            match p.tensors.get(i).map(|t| &t.place) {
                Some(Place::Persistent { section, .. }) if *section < p.sections.len() => {}
                _ => return Err(format!("persistent tensor {k} is not in a section")),
            }
        }
        p.resolve()?;
        Ok(p)
    }
}

/// The `n` elements of `dtype` at `p` as f32: borrowed in place for an aligned f32 tensor,
/// otherwise read into a buffer (bf16 widened, integers converted).
///
/// # Safety
/// `p` is valid for reads of `n` elements of `dtype` (any alignment) for the lifetime `'a`,
/// and nothing writes that memory during `'a`.
unsafe fn bind<'a>(p: *const u8, dtype: synDataType, n: usize) -> Cow<'a, [f32]> {
    if dtype == synDataType::SINGLE && (p as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        // SAFETY: aligned, valid for n f32 reads and unaliased by writers during 'a (contract);
        // every bit pattern is a valid f32.
        return Cow::Borrowed(unsafe { std::slice::from_raw_parts(p.cast::<f32>(), n) });
    }
    // SAFETY: same contract.
    Cow::Owned(unsafe { load(p, dtype, n) })
}

/// Reads `n` elements of `dtype` at `p` as f32 (bf16 widened, integers converted).
///
/// # Safety
/// `p` is valid for reads of `n` elements of `dtype` (any alignment).
unsafe fn load(p: *const u8, dtype: synDataType, n: usize) -> Vec<f32> {
    let size = guid::elem_size(dtype).unwrap_or(4) as usize;
    // SAFETY: valid for n * size bytes by the contract; read before any write of this node.
    let bytes = unsafe { std::slice::from_raw_parts(p, n * size) };
    match dtype {
        synDataType::BF16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        synDataType::INT32 => {
            bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32).collect()
        }
        synDataType::INT8 => bytes.iter().map(|&b| f32::from(b as i8)).collect(),
        _ => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
    }
}

/// Writes `v` at `p` as `dtype` (bf16 rounded to nearest even, integers rounded; f32 copied
/// directly, without a staging buffer).
///
/// # Safety
/// `p` is valid for writes of `v.len()` elements of `dtype` (any alignment).
unsafe fn store(p: *mut u8, dtype: synDataType, v: &[f32]) {
    if dtype == synDataType::SINGLE {
        // SAFETY: valid for v.len() * 4 bytes by the contract; `v` is our own buffer, so the
        // ranges do not overlap; a byte copy needs no alignment. (The host is little-endian,
        // as the device's layout: x86-64 and aarch64 are.)
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), p, std::mem::size_of_val(v)) };
        return;
    }
    let size = guid::elem_size(dtype).unwrap_or(4) as usize;
    let mut bytes = Vec::with_capacity(v.len() * size);
    match dtype {
        synDataType::BF16 => v.iter().for_each(|&x| bytes.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes())),
        synDataType::INT32 => v.iter().for_each(|&x| bytes.extend_from_slice(&(x.round() as i32).to_le_bytes())),
        synDataType::INT8 => bytes.extend(v.iter().map(|&x| x.round() as i8 as u8)),
        _ => v.iter().for_each(|&x| bytes.extend_from_slice(&x.to_le_bytes())),
    }
    // SAFETY: valid for bytes.len() bytes by the contract; `bytes` is our own buffer.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_f32_inputs_are_bound_in_place_and_other_dtypes_are_widened() {
        let v = [1.5f32, -2.0, 3.25];
        // SAFETY: `v` is live, aligned and unwritten while the bindings live.
        let b = unsafe { bind(v.as_ptr().cast::<u8>(), synDataType::SINGLE, 3) };
        assert!(matches!(b, Cow::Borrowed(s) if s.as_ptr() == v.as_ptr()), "no copy of an f32 input");
        // An unaligned f32 tensor (offset 1 in its section) is read into a buffer.
        let mut bytes = [0u8; 13];
        bytes[1..].copy_from_slice(&[v[0].to_le_bytes(), v[1].to_le_bytes(), v[2].to_le_bytes()].concat());
        // SAFETY: 12 readable bytes from offset 1.
        let p = unsafe { bytes.as_ptr().add(1) };
        if !(p as usize).is_multiple_of(4) {
            // SAFETY: as above.
            let u = unsafe { bind(p, synDataType::SINGLE, 3) };
            assert!(matches!(u, Cow::Owned(_)));
            assert_eq!(&*u, &v);
        }
        let h: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
        // SAFETY: 6 readable bytes.
        let w = unsafe { bind(h.as_ptr(), synDataType::BF16, 3) };
        assert!(matches!(w, Cow::Owned(_)));
        assert_eq!(&*w, &v);
        // f32 stores are direct and exact.
        let mut out = [0f32; 3];
        // SAFETY: 12 writable bytes.
        unsafe { store(out.as_mut_ptr().cast::<u8>(), synDataType::SINGLE, &v) };
        assert_eq!(out, v);
    }
}
