//! The mock's graph compiler and graph runtime: the SynapseAI graph API (`synGraph*`,
//! `synSection*`, the tensor handle API, `synNode*`, `synGraphCompile(V2)`, `synError*`,
//! `synEventMapTensor`) on the CPU.
//!
//! Owns: graph records (`records.rs`) and their builder operations (`builder.rs`), the GUID table with its checks, kernels and cost model
//! (`guid.rs` over the pure arithmetic of `cpu.rs`), compiled programs and their launch rules
//! (`program.rs`), and here the registry-level operations that tie them to recipe handles,
//! streams and the latency model. Must not touch: the C ABI (that is `ffi/graph.rs`), the JSON
//! mock recipes (`recipe.rs`, `launch.rs`).
//!
//! Faithfulness: each mistake gets the status the ≈1.16 runtime returns, at the same call
//! (`graph_api.md` §8), and a last-error message naming the node and tensor. A graph recipe's
//! launch costs device time from the per-node model ([`crate::config::MockConfig`]'s
//! `graph_*` rates), or the base latency configured for its recipe name
//! (`MockConfig::graph_base_latency_ns`), times the module's latency noise, like a JSON
//! recipe's base latency.
//! Not implemented (synUnsupported or synFail with a message saying so): const sections,
//! dynamic shapes, tensor types other than DATA_TENSOR, dtypes other than f32, bf16, i32, i8,
//! and GUIDs outside `guid.rs`. Dead-node elimination is not modelled (every node runs).

#[cfg(test)]
mod attention_tests;
pub(crate) mod builder;
pub(crate) mod cpu;
pub(crate) mod guid;
pub(crate) mod program;
pub(crate) mod records;

use std::ffi::CStr;
use std::sync::Arc;

use habana_sys::{SYN_FLAGS_TENSOR_NAME, TENSOR_INVALID_ID, synLaunchTensorInfo, synStatus};

use crate::error::{MResult, MockError, fail};
use crate::state::{Registry, registry};
use crate::stream::{Exec, KernelOp, Op, Stream};
use program::{Place, Program};

/// Compiles graph `graph` into a new recipe handle, or (status, message).
pub(crate) fn compile(graph: u64, name: &str) -> Result<u64, (synStatus, String)> {
    let mut r = registry();
    let g = r.graph(graph).map_err(|e| (e.status, e.msg))?;
    let program = program::compile(g, name)?;
    let id = r.new_handle();
    if let Some(g) = r.graphs.get_mut(&graph) {
        g.compiled = true;
    }
    r.graph_recipes.insert(id, Arc::new(program));
    Ok(id)
}

/// Loads a graph recipe file's bytes into a new recipe handle.
pub(crate) fn deserialize(bytes: &[u8], path: &std::path::Path) -> MResult<u64> {
    let p = Program::from_slice(bytes)
        .map_err(|e| MockError::new(synStatus::INVALID_ARGUMENT, format!("graph recipe {}: {e}", path.display())))?;
    let mut r = registry();
    r.check_init()?;
    let id = r.new_handle();
    r.graph_recipes.insert(id, Arc::new(p));
    Ok(id)
}

/// Launches graph recipe `program` (handle `rh`) on `stream`: the bindings checked as the real
/// runtime does (`Program::section_bases`), the workspace checked when one is needed, the
/// device time drawn from the cost model and the module's noise at enqueue time. Each of
/// `events` (handle ids) is recorded when the node producing its mapped tensor ends (an event
/// mapped to this recipe by `synEventMapTensor`; the launch's time is split over the nodes in
/// proportion to their modelled cost) or, unmapped, at the launch's end; an event mapped to
/// another recipe is synInvalidArgument (inferred: the ≈1.16 source keeps the recipe in the
/// mapping but its launch-side check was not traced).
///
/// # Safety
/// With SYN_FLAGS_TENSOR_NAME, every `tensorName` must be null or a NUL-terminated string.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch(
    r: std::sync::MutexGuard<'_, Registry>,
    stream: Arc<Stream>,
    rh: u64,
    program: Arc<Program>,
    infos: &[synLaunchTensorInfo],
    workspace: u64,
    events: &[u64],
    flags: u32,
) -> MResult<()> {
    let v = synStatus::FAILED_SECTION_VALIDATION;
    let m = stream.module;
    let device_type = r.config.device_type.code();
    if device_type != program.device_type() {
        return fail(
            synStatus::INVALID_ARGUMENT,
            format!("device type {device_type} does not match the recipe device type {}", program.device_type()),
        );
    }
    let by_name = flags & SYN_FLAGS_TENSOR_NAME != 0;
    let mut bound = Vec::with_capacity(infos.len());
    for (k, info) in infos.iter().enumerate() {
        let id = if by_name {
            if info.tensorName.is_null() {
                return fail(
                    synStatus::INVALID_ARGUMENT,
                    format!("launch tensor {k}: null tensorName with SYN_FLAGS_TENSOR_NAME"),
                );
            }
            // SAFETY: non-null and NUL-terminated by the caller's contract.
            let name = unsafe { CStr::from_ptr(info.tensorName) }.to_bytes();
            program.id_of_name(name)
        } else {
            info.tensorId
        };
        if id == TENSOR_INVALID_ID {
            continue; // skipped silently, as the real runtime
        }
        let Some(pos) = program.position_of_id(id) else {
            return fail(
                v,
                format!("launch tensor {k}: tensorId {id:#x} is not a persistent tensor of recipe {}", program.name),
            );
        };
        bound.push((pos, info.pTensorAddress));
    }
    let bases = program.section_bases(&bound)?;
    let mut bindings = Vec::with_capacity(bases.len() + 1);
    for (s, (&base, &extent)) in bases.iter().zip(&program.sections).enumerate() {
        let (a, off) = r.device_range(m, base, extent.max(1)).map_err(|e| {
            let names: Vec<&str> = program
                .persistent
                .iter()
                .map(|&i| &program.tensors[i])
                .filter(|t| matches!(t.place, Place::Persistent { section, .. } if section == s))
                .map(|t| t.name.as_str())
                .collect();
            MockError::new(v, format!("section {s} (tensors {names:?}) of {extent} bytes at {base:#x}: {}", e.msg))
        })?;
        bindings.push((a, off, extent));
    }
    if program.workspace_bytes > 0 {
        let (a, off) = r.device_range(m, workspace, program.workspace_bytes).map_err(|e| {
            MockError::new(
                v,
                format!(
                    "Out of Range. scratchPadAddress {workspace:#x} for a workspace of {} bytes: {}",
                    program.workspace_bytes, e.msg
                ),
            )
        })?;
        bindings.push((a, off, program.workspace_bytes));
    }
    // Each event: mapped to a tensor of this recipe (synEventMapTensor) -> the node producing
    // it; not mapped -> the launch's end.
    let mut evs = Vec::with_capacity(events.len());
    for &eh in events {
        let e = r.event(eh)?;
        if e.module != m {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("external event of module {} on a stream of module {m}", e.module),
            );
        }
        let node = match r.event_maps.get(&eh) {
            None => None,
            Some(&(mapped, pos)) if mapped == rh => program.producer_of(program.persistent[pos]),
            Some(&(mapped, pos)) => {
                return fail(
                    synStatus::INVALID_ARGUMENT,
                    format!(
                        "event {eh:#x} is mapped to persistent tensor #{pos} of recipe handle {mapped:#x}, not of recipe {}",
                        program.name
                    ),
                );
            }
        };
        evs.push((e, node));
    }
    let cfg = &r.config;
    let (gbps, gflops, overhead) = (cfg.graph_hbm_gbps, cfg.graph_gflops, cfg.graph_node_overhead_ns);
    let base_ns = match cfg.graph_base_latency_ns.get(&program.name) {
        Some(&ns) => ns,
        None => program.cost_ns(gbps, gflops, overhead),
    };
    let noise_name = cfg.graph_noise_alias.get(&program.name).unwrap_or(&program.name).clone();
    let mut r = r;
    let latency_ns = r.modules[m as usize].latency.next_launch_ns(base_ns, &noise_name);
    drop(r);
    let (mut at_end, mut early) = (Vec::new(), Vec::new());
    for (e, node) in evs {
        let g = e.begin_record(stream.shared.clone());
        match node.map(|k| program.node_end_ns(k, latency_ns, gbps, gflops, overhead)) {
            Some(t) if t < latency_ns => early.push((e, g, t)),
            _ => at_end.push((e, g)),
        }
    }
    early.sort_by_key(|&(_, _, t)| t);
    let op = KernelOp { exec: Exec::Graph(program), bindings, events: at_end, early, latency_ns };
    if !stream.enqueue(Op::Kernel(op)) {
        return fail(synStatus::INVALID_ARGUMENT, "stream is shut down");
    }
    Ok(())
}
