//! Recipe and launch calls of the mock: synRecipe*, synWorkspaceGetSize, synTensorRetrieve*,
//! synLaunchWithExternalEvents(Ext).
//!
//! Owns: the binding rules of a launch (every recipe tensor bound exactly once, by id or by
//! name with SYN_FLAGS_TENSOR_NAME, to a device range inside a live allocation of the stream's
//! module) and drawing the launch latency from the module's model at enqueue time.
//! Must not touch: memory contents (the stream worker runs the kernel).

use std::ffi::CStr;
use std::path::Path;
use std::sync::Arc;

use habana_sys::{SYN_FLAGS_TENSOR_NAME, TENSOR_INVALID_ID, synLaunchTensorInfo, synRecipeAttribute, synStatus};

use crate::error::{MResult, MockError, fail};
use crate::graph::program::GRAPH_RECIPE_FORMAT;
use crate::recipe::{MockRecipe, Recipe, TENSOR_ID_BASE};
use crate::state::AnyRecipe;
use crate::state::registry;
use crate::stream::{Exec, KernelOp, Op};

/// Loads a recipe file: a graph recipe (`"format": "dropcompute-mock-graph-recipe"`, written by
/// synRecipeSerialize of a compiled graph) or a JSON mock recipe naming a registered kernel.
pub(crate) fn deserialize(path: &Path) -> MResult<u64> {
    let bytes = std::fs::read(path)
        .map_err(|e| MockError::new(synStatus::INVALID_ARGUMENT, format!("recipe file {}: {e}", path.display())))?;
    let is_graph = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .is_some_and(|v| v.get("format").and_then(|f| f.as_str()) == Some(GRAPH_RECIPE_FORMAT));
    if is_graph {
        return crate::graph::deserialize(&bytes, path);
    }
    let spec = match MockRecipe::from_slice(&bytes, path) {
        Ok(s) => s,
        Err(e) => return fail(synStatus::INVALID_ARGUMENT, e.to_string()),
    };
    let mut r = registry();
    r.check_init()?;
    if !r.kernels.contains_key(&spec.kernel) {
        return fail(
            synStatus::INVALID_ARGUMENT,
            format!("mock recipe {}: kernel {:?} is not registered with the mock", path.display(), spec.kernel),
        );
    }
    let id = r.new_handle();
    r.recipes.insert(id, Arc::new(Recipe::new(spec)));
    Ok(id)
}

pub(crate) fn serialize(h: u64, path: &Path) -> MResult<()> {
    match registry().any_recipe(h)? {
        AnyRecipe::Json(recipe) => recipe.spec.write(path).map_err(|e| MockError::new(synStatus::FAIL, e.to_string())),
        AnyRecipe::Graph(p) => p.write(path).map_err(|e| MockError::new(synStatus::FAIL, e)),
    }
}

pub(crate) fn destroy(h: u64) -> MResult<()> {
    let mut r = registry();
    r.any_recipe(h)?;
    r.recipes.remove(&h);
    r.graph_recipes.remove(&h);
    r.event_maps.retain(|_, (recipe, _)| *recipe != h);
    Ok(())
}

/// WORKSPACE_SIZE, NUM_PERSISTENT_TENSORS (= tensor count), PERSISTENT_TENSORS_SIZE (sum of
/// tensor bytes); every other attribute reads 0.
pub(crate) fn attribute(h: u64, attr: synRecipeAttribute) -> MResult<u64> {
    let (ws, n, bytes) = match registry().any_recipe(h)? {
        AnyRecipe::Json(recipe) => {
            let spec = &recipe.spec;
            (spec.workspace_bytes, spec.tensors.len() as u64, spec.tensors.iter().map(|t| t.bytes).sum())
        }
        AnyRecipe::Graph(p) => {
            (p.workspace_bytes, p.persistent.len() as u64, p.persistent.iter().map(|&i| p.tensors[i].bytes()).sum())
        }
    };
    Ok(match attr {
        synRecipeAttribute::WORKSPACE_SIZE => ws,
        synRecipeAttribute::NUM_PERSISTENT_TENSORS => n,
        synRecipeAttribute::PERSISTENT_TENSORS_SIZE => bytes,
        _ => 0,
    })
}

pub(crate) fn recipe(h: u64) -> MResult<AnyRecipe> {
    registry().any_recipe(h)
}

/// Number of tensors a launch of recipe `h` binds.
pub(crate) fn launch_amount(h: u64) -> MResult<usize> {
    Ok(match recipe(h)? {
        AnyRecipe::Json(r) => r.spec.tensors.len(),
        AnyRecipe::Graph(p) => p.persistent.len(),
    })
}

/// Ids of the tensors named `names`: an unknown name gets `TENSOR_INVALID_ID` and the call
/// still succeeds, as the real runtime (`graph_api.md` §8 case 10).
pub(crate) fn ids_of(recipe: &AnyRecipe, names: &[&[u8]]) -> Vec<u64> {
    names
        .iter()
        .map(|n| match recipe {
            AnyRecipe::Json(r) => r.index_of_name(n).map_or(TENSOR_INVALID_ID, |i| TENSOR_ID_BASE + i as u64),
            AnyRecipe::Graph(p) => p.id_of_name(n),
        })
        .collect()
}

/// A launch: `infos` validated against the recipe, `events` recorded at completion.
///
/// # Safety
/// With SYN_FLAGS_TENSOR_NAME, every `tensorName` must be null or a NUL-terminated string.
pub(crate) unsafe fn launch(
    sh: u64,
    infos: &[synLaunchTensorInfo],
    workspace: u64,
    rh: u64,
    events: &[u64],
    flags: u32,
) -> MResult<()> {
    let mut r = registry();
    let stream = r.stream(sh)?;
    let recipe = match r.any_recipe(rh)? {
        AnyRecipe::Json(recipe) => recipe,
        AnyRecipe::Graph(p) => {
            // SAFETY: names are null or NUL-terminated by this function's contract.
            return unsafe { crate::graph::launch(r, stream, rh, p, infos, workspace, events, flags) };
        }
    };
    let evs = events.iter().map(|&h| r.event(h)).collect::<MResult<Vec<_>>>()?;
    let m = stream.module;
    let spec = &recipe.spec;
    let by_name = flags & SYN_FLAGS_TENSOR_NAME != 0;
    let mut slot: Vec<Option<u64>> = vec![None; spec.tensors.len()];
    for (k, info) in infos.iter().enumerate() {
        let i = if by_name {
            if info.tensorName.is_null() {
                return fail(
                    synStatus::INVALID_ARGUMENT,
                    format!("launch tensor {k}: null tensorName with SYN_FLAGS_TENSOR_NAME"),
                );
            }
            // SAFETY: non-null and NUL-terminated by the caller's contract.
            let name = unsafe { CStr::from_ptr(info.tensorName) }.to_bytes();
            recipe.index_of_name(name).ok_or_else(|| MockError {
                status: synStatus::INVALID_ARGUMENT,
                msg: format!("launch tensor {k}: no recipe tensor named {:?}", String::from_utf8_lossy(name)),
            })?
        } else {
            recipe.index_of_id(info.tensorId).ok_or_else(|| MockError {
                status: synStatus::INVALID_ARGUMENT,
                msg: format!(
                    "launch tensor {k}: tensorId {:#x} is not an id of this recipe (ids start at {TENSOR_ID_BASE:#x})",
                    info.tensorId
                ),
            })?
        };
        if slot[i].replace(info.pTensorAddress).is_some() {
            return fail(synStatus::INVALID_ARGUMENT, format!("recipe tensor {:?} bound twice", spec.tensors[i].name));
        }
    }
    let mut bindings = Vec::with_capacity(slot.len());
    for (i, addr) in slot.iter().enumerate() {
        let t = &spec.tensors[i];
        let Some(addr) = *addr else {
            return fail(synStatus::INVALID_ARGUMENT, format!("recipe tensor {:?} is not bound", t.name));
        };
        let (a, off) = r.device_range(m, addr, t.bytes).map_err(|mut e| {
            e.msg = format!("tensor {:?}: {}", t.name, e.msg);
            e
        })?;
        bindings.push((a, off, t.bytes));
    }
    if spec.workspace_bytes > 0 {
        r.device_range(m, workspace, spec.workspace_bytes).map_err(|mut e| {
            e.msg = format!("workspace of {} bytes: {}", spec.workspace_bytes, e.msg);
            e
        })?;
    }
    for e in &evs {
        if e.module != m {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("external event of module {} on a stream of module {m}", e.module),
            );
        }
    }
    let Some(kernel) = r.kernels.get(&spec.kernel).copied() else {
        return fail(synStatus::INVALID_ARGUMENT, format!("kernel {:?} is no longer registered", spec.kernel));
    };
    let latency_ns = r.modules[m as usize].latency.next_launch_ns(spec.latency.base_ns, &spec.name);
    drop(r);
    let events = evs.into_iter().map(|e| {
        let g = e.begin_record(stream.shared.clone());
        (e, g)
    });
    let op = KernelOp {
        exec: Exec::C { kernel, names: recipe.names.clone(), params: recipe.params.clone() },
        bindings,
        events: events.collect(),
        early: Vec::new(),
        latency_ns,
    };
    if !stream.enqueue(Op::Kernel(op)) {
        return fail(synStatus::INVALID_ARGUMENT, "stream is shut down");
    }
    Ok(())
}
