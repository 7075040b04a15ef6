//! `extern "C"` entry points of the mock for recipes, launches, status strings, the driver
//! version and the last error (split from `ffi/mod.rs`; same rules: see there). Must not touch:
//! the last-error slots except through `last_error.rs`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::path::PathBuf;

use habana_sys::{
    synDataType, synEventHandle, synLaunchTensorInfo, synRecipeAttribute, synRecipeHandle,
    synRetrievedLaunchTensorInfo, synStatus, synStreamHandle,
};

use crate::cabi::{c_str, guard, h, handle_to_raw, out, slice};

use crate::error::{MResult, fail};
use crate::graph::program::Place;
use crate::state::AnyRecipe;
use crate::{last_error, launch, status};

fn path_arg(p: *const c_char) -> MResult<PathBuf> {
    // SAFETY: the file name is null or NUL-terminated.
    match unsafe { c_str(p) } {
        Some(s) if !s.is_empty() => Ok(PathBuf::from(s)),
        _ => fail(synStatus::INVALID_ARGUMENT, "null or empty recipe file name"),
    }
}

/// `synRecipeSerialize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_recipe_serialize(r: synRecipeHandle, file: *const c_char) -> synStatus {
    guard("synRecipeSerialize", || launch::serialize(h(r), &path_arg(file)?))
}

/// `synRecipeDeSerialize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_recipe_deserialize(p: *mut synRecipeHandle, file: *const c_char) -> synStatus {
    guard("synRecipeDeSerialize", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pRecipeHandle");
        }
        let id = launch::deserialize(&path_arg(file)?)?;
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
        unsafe { out(p, handle_to_raw(id) as synRecipeHandle) }
    })
}

/// `synRecipeDestroy` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_recipe_destroy(r: synRecipeHandle) -> synStatus {
    guard("synRecipeDestroy", || launch::destroy(h(r)))
}

/// `synRecipeGetAttribute` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_recipe_get_attribute(
    ret: *mut u64,
    attrs: *const synRecipeAttribute,
    n: c_uint,
    r: synRecipeHandle,
) -> synStatus {
    guard("synRecipeGetAttribute", || {
        // SAFETY: `attrs` holds `n` entries and `ret` has room for `n` by the contract.
        let attrs = unsafe { slice(attrs, n as usize)? };
        let vals = attrs.iter().map(|&a| launch::attribute(h(r), a)).collect::<MResult<Vec<_>>>()?;
        if ret.is_null() && n > 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null retVal");
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), ret, vals.len()) };
        Ok(())
    })
}

/// `synWorkspaceGetSize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_workspace_get_size(p: *mut u64, r: synRecipeHandle) -> synStatus {
    // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
    guard("synWorkspaceGetSize", || unsafe { out(p, launch::attribute(h(r), synRecipeAttribute::WORKSPACE_SIZE)?) })
}

/// `synTensorRetrieveLaunchAmount` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_tensor_retrieve_launch_amount(r: synRecipeHandle, n: *mut u32) -> synStatus {
    // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
    guard("synTensorRetrieveLaunchAmount", || unsafe { out(n, launch::launch_amount(h(r))? as u32) })
}

/// `synTensorRetrieveLaunchIds`: ids are `TENSOR_ID_BASE + index`; `numOfTensors` must equal
/// the launch amount.
pub unsafe extern "C" fn syn_tensor_retrieve_launch_ids(r: synRecipeHandle, ids: *mut u64, n: u32) -> synStatus {
    guard("synTensorRetrieveLaunchIds", || {
        let count = launch::launch_amount(h(r))?;
        if n as usize != count {
            return fail(synStatus::FAIL, format!("numOfTensors {n}, the recipe has {count}"));
        }
        if ids.is_null() && n > 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null tensorsIds");
        }
        for i in 0..count {
            // SAFETY: `ids` holds `n` = count entries.
            unsafe { ids.add(i).write(crate::recipe::TENSOR_ID_BASE + i as u64) };
        }
        Ok(())
    })
}

/// `synTensorRetrieveIds` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_tensor_retrieve_ids(
    r: synRecipeHandle,
    names: *const *const c_char,
    ids: *mut u64,
    n: u32,
) -> synStatus {
    guard("synTensorRetrieveIds", || {
        let rec = launch::recipe(h(r))?;
        // SAFETY: `names` holds `n` NUL-terminated strings, `ids` room for `n`.
        let ptrs = unsafe { slice(names, n as usize)? };
        let mut list = Vec::with_capacity(ptrs.len());
        for &p in ptrs {
            if p.is_null() {
                return fail(synStatus::INVALID_ARGUMENT, "null tensor name");
            }
            // SAFETY: non-null, NUL-terminated.
            list.push(unsafe { CStr::from_ptr(p) }.to_bytes());
        }
        let v = launch::ids_of(&rec, &list);
        if ids.is_null() && n > 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null tensorIds");
        }
        // SAFETY: room for `n` ids.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), ids, v.len()) };
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn launch_common(
    s: synStreamHandle,
    infos: *const synLaunchTensorInfo,
    n: u32,
    ws: u64,
    r: synRecipeHandle,
    evs: *mut synEventHandle,
    nev: u32,
    flags: u32,
) -> MResult<()> {
    // SAFETY: arrays of `n` infos and `nev` events by the caller's contract.
    let infos = unsafe { slice(infos, n as usize)? };
    // SAFETY: as above, for the `nev` events.
    let evs: Vec<u64> = unsafe { slice(evs as *const synEventHandle, nev as usize)? }.iter().map(|&e| h(e)).collect();
    // SAFETY: tensor names are NUL-terminated by the contract.
    unsafe { launch::launch(h(s), infos, ws, h(r), &evs, flags) }
}

/// `synLaunchWithExternalEvents` on the CPU mock: binds every recipe tensor once (by id, or by
/// name with SYN_FLAGS_TENSOR_NAME) and enqueues the kernel; the events are recorded at completion.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn syn_launch_with_external_events(
    s: synStreamHandle,
    infos: *const synLaunchTensorInfo,
    n: u32,
    ws: u64,
    r: synRecipeHandle,
    evs: *mut synEventHandle,
    nev: u32,
    flags: u32,
) -> synStatus {
    // SAFETY: the arrays hold `n` infos (names NUL-terminated) and `nev` events by the caller's
    // contract.
    guard("synLaunchWithExternalEvents", || unsafe { launch_common(s, infos, n, ws, r, evs, nev, flags) })
}

/// `synLaunchWithExternalEventsExt`: same as [`syn_launch_with_external_events`].
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn syn_launch_with_external_events_ext(
    s: synStreamHandle,
    infos: *const synLaunchTensorInfo,
    n: u32,
    ws: u64,
    r: synRecipeHandle,
    evs: *mut synEventHandle,
    nev: u32,
    flags: u32,
) -> synStatus {
    // SAFETY: the arrays hold `n` infos (names NUL-terminated) and `nev` events by the caller's
    // contract.
    guard("synLaunchWithExternalEventsExt", || unsafe { launch_common(s, infos, n, ws, r, evs, nev, flags) })
}

/// Copies the brief description of `st` (truncated, NUL-terminated) into `buf[..len]`.
pub unsafe extern "C" fn syn_status_get_brief_description(st: synStatus, buf: *mut c_char, len: usize) -> synStatus {
    guard("synStatusGetBriefDescription", || {
        if buf.is_null() || len == 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null or empty buffer");
        }
        let d = status::brief(st).to_bytes();
        let n = d.len().min(len - 1);
        // SAFETY: `buf` holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(d.as_ptr().cast(), buf, n);
            *buf.add(n) = 0;
        }
        Ok(())
    })
}

/// Version "1.21.0-mock", or `$DROPCOMPUTE_MOCK_VERSION`. Works before synInitialize.
pub unsafe extern "C" fn syn_driver_get_version(buf: *mut c_char, len: c_int) -> synStatus {
    guard("synDriverGetVersion", || {
        if buf.is_null() || len <= 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null or empty buffer");
        }
        let v = crate::config::reported_version();
        let b = v.as_bytes();
        let n = b.len().min(len as usize - 1);
        // SAFETY: `buf` holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr().cast(), buf, n);
            *buf.add(n) = 0;
        }
        Ok(())
    })
}

/// `synGetLastError` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_get_last_error() -> synStatus {
    last_error::status().unwrap_or(synStatus::SUCCESS)
}

/// `synGetErrorString` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_get_error_string(st: synStatus) -> *const c_char {
    status::brief(st).as_ptr()
}

/// `synGetLastErrorMessage` on the CPU mock (contract: see the module documentation).
/// "" before the first failing call on this thread.
pub unsafe extern "C" fn syn_get_last_error_message() -> *const c_char {
    last_error::message_ptr::<synStatus>().unwrap_or(c"".as_ptr())
}

/// `synTensorRetrievePersistentAmount`: the persistent tensors of the recipe (its launch amount
/// on the mock, which has no shape tensors).
pub unsafe extern "C" fn syn_tensor_retrieve_persistent_amount(r: synRecipeHandle, n: *mut u32) -> synStatus {
    // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
    guard("synTensorRetrievePersistentAmount", || unsafe { out(n, launch::launch_amount(h(r))? as u32) })
}

/// Fills `infos[..n]` for the `tensorId` each one holds (an unknown id: synInvalidArgument).
unsafe fn launch_info(r: synRecipeHandle, n: u32, infos: *mut synRetrievedLaunchTensorInfo) -> MResult<()> {
    if infos.is_null() && n > 0 {
        return fail(synStatus::INVALID_ARGUMENT, "null tensorsLaunchInfo");
    }
    let rec = launch::recipe(h(r))?;
    for k in 0..n as usize {
        // SAFETY: `infos` holds `n` entries by the caller's contract.
        let info = unsafe { &mut *infos.add(k) };
        let id = info.tensorId;
        let mut filled = synRetrievedLaunchTensorInfo { tensorId: id, ..Default::default() };
        let (name, dtype, sizes, section, offset, is_input): (String, synDataType, Vec<u64>, u32, u64, bool) =
            match &rec {
                AnyRecipe::Json(j) => {
                    let Some(i) = j.index_of_id(id) else {
                        return fail(
                            synStatus::INVALID_ARGUMENT,
                            format!("tensorId {id:#x} is not an id of this recipe"),
                        );
                    };
                    let t = &j.spec.tensors[i];
                    (t.name.clone(), synDataType::UINT8, vec![t.bytes], i as u32, 0, true)
                }
                AnyRecipe::Graph(p) => {
                    let Some(pos) = p.position_of_id(id) else {
                        return fail(
                            synStatus::INVALID_ARGUMENT,
                            format!("tensorId {id:#x} is not a persistent tensor of recipe {}", p.name),
                        );
                    };
                    let t = &p.tensors[p.persistent[pos]];
                    let (s, o) = match t.place {
                        Place::Persistent { section, offset } => (section as u32, offset),
                        Place::Workspace { .. } => (habana_sys::INVALID_SECTION_ID, 0),
                    };
                    (t.name.clone(), t.dtype(), t.sizes.clone(), s, o, t.is_input)
                }
            };
        let b = name.as_bytes();
        let len = b.len().min(filled.tensorName.len() - 1);
        for (d, &c) in filled.tensorName.iter_mut().zip(&b[..len]) {
            *d = c as c_char;
        }
        filled.tensorDataType = dtype;
        filled.tensorDims = sizes.len() as u32;
        filled.tensorMaxSize[..sizes.len()].copy_from_slice(&sizes);
        filled.tensorMinSize[..sizes.len()].copy_from_slice(&sizes);
        for (d, p) in filled.tensorPermutation.iter_mut().enumerate() {
            *p = d as u8;
        }
        filled.tensorSectionId = section;
        filled.tensorOffsetInSection = offset;
        filled.isInput = u8::from(is_input);
        *info = filled;
    }
    Ok(())
}

/// `synTensorRetrieveLaunchInfoById`: name, dtype, sizes, section and offset of each id.
pub unsafe extern "C" fn syn_tensor_retrieve_launch_info_by_id(
    r: synRecipeHandle,
    n: u32,
    infos: *mut synRetrievedLaunchTensorInfo,
) -> synStatus {
    // SAFETY: `infos` holds `n` entries by the caller's contract.
    guard("synTensorRetrieveLaunchInfoById", || unsafe { launch_info(r, n, infos) })
}

/// `synTensorRetrieveLaunchInfoByIdExt`: same as [`syn_tensor_retrieve_launch_info_by_id`].
pub unsafe extern "C" fn syn_tensor_retrieve_launch_info_by_id_ext(
    r: synRecipeHandle,
    n: u32,
    infos: *mut synRetrievedLaunchTensorInfo,
) -> synStatus {
    // SAFETY: `infos` holds `n` entries by the caller's contract.
    guard("synTensorRetrieveLaunchInfoByIdExt", || unsafe { launch_info(r, n, infos) })
}

/// `synEventMapTensor`: maps event i to the tensor of `infos[i].tensorId` (a persistent tensor
/// of graph recipe `r` marked external and written by a node), replacing the event's earlier
/// mapping; a later launch of `r` given the event records it when the node producing that
/// tensor ends. A tensor that is not such a tensor is synFail, as the ≈1.16 runtime
/// (`synSingleton::eventMapTensorBaseExt`: "Unable to find tensor").
pub unsafe extern "C" fn syn_event_map_tensor(
    events: *mut synEventHandle,
    n: usize,
    infos: *const synLaunchTensorInfo,
    r: synRecipeHandle,
) -> synStatus {
    guard("synEventMapTensor", || {
        // SAFETY: both arrays hold `n` entries by the caller's contract.
        let (evs, infos) = unsafe { (slice(events as *const synEventHandle, n)?, slice(infos, n)?) };
        let AnyRecipe::Graph(p) = launch::recipe(h(r))? else {
            return fail(synStatus::FAIL, "synEventMapTensor needs a recipe compiled from a graph");
        };
        let mut reg = crate::state::registry();
        let mut mapped = Vec::with_capacity(n);
        for (e, info) in evs.iter().zip(infos) {
            reg.event(h(*e))?;
            let unable = |why: String| {
                fail(synStatus::FAIL, format!("Unable to find tensor with tensor id {:#x}: {why}", info.tensorId))
            };
            let Some(pos) = p.position_of_id(info.tensorId) else {
                return unable(format!("not a persistent tensor of recipe {}", p.name));
            };
            let i = p.persistent[pos];
            let t = &p.tensors[i];
            if !t.external {
                return unable(format!("tensor {} is not external (synTensorSetExternal)", t.name));
            }
            if p.producer_of(i).is_none() {
                return unable(format!("tensor {} is written by no node", t.name));
            }
            mapped.push((h(*e), pos));
        }
        for (e, pos) in mapped {
            reg.event_maps.insert(e, (h(r), pos));
        }
        Ok(())
    })
}
