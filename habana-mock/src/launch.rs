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

use habana_sys::{SYN_FLAGS_TENSOR_NAME, synLaunchTensorInfo, synRecipeAttribute, synStatus};

use crate::error::{MResult, MockError, fail};
use crate::recipe::{MockRecipe, Recipe, TENSOR_ID_BASE};
use crate::state::registry;
use crate::stream::{KernelOp, Op};

pub(crate) fn deserialize(path: &Path) -> MResult<u64> {
    let spec = match MockRecipe::read(path) {
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
    let recipe = registry().recipe(h)?;
    recipe.spec.write(path).map_err(|e| MockError::new(synStatus::FAIL, e.to_string()))
}

pub(crate) fn destroy(h: u64) -> MResult<()> {
    let mut r = registry();
    r.recipe(h)?;
    r.recipes.remove(&h);
    Ok(())
}

/// WORKSPACE_SIZE, NUM_PERSISTENT_TENSORS (= tensor count), PERSISTENT_TENSORS_SIZE (sum of
/// tensor bytes); every other attribute reads 0.
pub(crate) fn attribute(h: u64, attr: synRecipeAttribute) -> MResult<u64> {
    let recipe = registry().recipe(h)?;
    let spec = &recipe.spec;
    Ok(match attr {
        synRecipeAttribute::WORKSPACE_SIZE => spec.workspace_bytes,
        synRecipeAttribute::NUM_PERSISTENT_TENSORS => spec.tensors.len() as u64,
        synRecipeAttribute::PERSISTENT_TENSORS_SIZE => spec.tensors.iter().map(|t| t.bytes).sum(),
        _ => 0,
    })
}

pub(crate) fn recipe(h: u64) -> MResult<Arc<Recipe>> {
    registry().recipe(h)
}

/// Ids of the tensors named `names` (unknown name → synInvalidArgument).
pub(crate) fn ids_of(recipe: &Recipe, names: &[&[u8]]) -> MResult<Vec<u64>> {
    names
        .iter()
        .map(|n| match recipe.index_of_name(n) {
            Some(i) => Ok(TENSOR_ID_BASE + i as u64),
            None => fail(
                synStatus::INVALID_ARGUMENT,
                format!("no tensor named {:?} in the recipe", String::from_utf8_lossy(n)),
            ),
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
    let recipe = r.recipe(rh)?;
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
        kernel,
        names: recipe.names.clone(),
        params: recipe.params.clone(),
        bindings,
        events: events.collect(),
        latency_ns,
    };
    if !stream.enqueue(Op::Kernel(op)) {
        return fail(synStatus::INVALID_ARGUMENT, "stream is shut down");
    }
    Ok(())
}
