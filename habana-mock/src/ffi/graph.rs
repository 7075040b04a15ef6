//! `extern "C"` entry points of the mock's graph API: graphs, sections, the tensor handle API,
//! nodes, compile (with `synGraphCompileV2`'s error objects), device memsets (split from
//! `ffi/mod.rs`; same rules: see there). Every body runs in the FFI guard; the behaviour is in
//! `graph/`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void};

use habana_sys::{
    synDataType, synDeviceType, synErrorHandle, synGeometryType, synGraphHandle, synNodeId, synRecipeHandle,
    synSectionHandle, synStatus, synStreamHandle, synTensor, synTensorDeviceFullLayout, synTensorGeometry,
    synTensorPermutation, synTensorType,
};

use crate::cabi::{c_str, guard, h, handle_to_raw, out, read, slice};
use crate::error::{MResult, MockError, fail};
use crate::state::registry;
use crate::{graph, ops};

fn new_graph(p: *mut synGraphHandle, t: synDeviceType, eager: bool) -> MResult<()> {
    if p.is_null() {
        return fail(synStatus::INVALID_ARGUMENT, "null pGraphHandle");
    }
    let id = registry().graph_create(t, eager)?;
    // SAFETY: checked non-null; valid for a write by the caller's contract.
    unsafe { out(p, handle_to_raw(id) as synGraphHandle) }
}

/// `synGraphCreate` on the CPU mock (Gaudi, Gaudi2, Gaudi3 graphs).
pub unsafe extern "C" fn syn_graph_create(p: *mut synGraphHandle, t: synDeviceType) -> synStatus {
    guard("synGraphCreate", || new_graph(p, t, false))
}

/// `synGraphCreateEager` on the CPU mock (Gaudi2 and Gaudi3 only; compiled like any graph).
pub unsafe extern "C" fn syn_graph_create_eager(p: *mut synGraphHandle, t: synDeviceType) -> synStatus {
    guard("synGraphCreateEager", || new_graph(p, t, true))
}

/// `synGraphDestroy`: frees the graph and its tensors; recipes compiled from it stay valid.
pub unsafe extern "C" fn syn_graph_destroy(g: synGraphHandle) -> synStatus {
    guard("synGraphDestroy", || {
        if g.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null graph handle");
        }
        registry().graph_destroy(h(g))
    })
}

/// `synGraphGetDeviceType` on the CPU mock.
pub unsafe extern "C" fn syn_graph_get_device_type(g: synGraphHandle, t: *mut synDeviceType) -> synStatus {
    guard("synGraphGetDeviceType", || {
        let dt = registry().graph(h(g))?.device_type;
        // SAFETY: the out-pointer is null or valid for a write (module doc).
        unsafe { out(t, dt) }
    })
}

/// `synSectionCreate` (the descriptor argument is deprecated and ignored).
pub unsafe extern "C" fn syn_section_create(
    p: *mut synSectionHandle,
    _descriptor: u64,
    g: synGraphHandle,
) -> synStatus {
    guard("synSectionCreate", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null sectionHandle");
        }
        let id = registry().section_create(h(g))?;
        // SAFETY: checked non-null; valid for a write by the caller's contract.
        unsafe { out(p, handle_to_raw(id) as synSectionHandle) }
    })
}

/// `synSectionDestroy` (tolerated after the graph was destroyed).
pub unsafe extern "C" fn syn_section_destroy(s: synSectionHandle) -> synStatus {
    guard("synSectionDestroy", || registry().section_destroy(h(s)))
}

/// `synSectionSetPersistent` (synFail once a tensor was assigned to the section).
pub unsafe extern "C" fn syn_section_set_persistent(s: synSectionHandle, v: bool) -> synStatus {
    guard("synSectionSetPersistent", || registry().section_modify(h(s), |r| r.persistent = v))
}

/// `synSectionGetPersistent` on the CPU mock.
pub unsafe extern "C" fn syn_section_get_persistent(s: synSectionHandle, v: *mut bool) -> synStatus {
    guard("synSectionGetPersistent", || {
        let p = registry().section_persistent(h(s))?;
        // SAFETY: the out-pointer is null or valid for a write (module doc).
        unsafe { out(v, p) }
    })
}

/// `synSectionSetConst` (accepted; compiling a graph that uses a const section is synUnsupported
/// on the mock).
pub unsafe extern "C" fn syn_section_set_const(s: synSectionHandle, v: bool) -> synStatus {
    guard("synSectionSetConst", || registry().section_modify(h(s), |r| r.konst = v))
}

/// `synSectionSetGroup` (a group above 255 is synUnsupported).
pub unsafe extern "C" fn syn_section_set_group(s: synSectionHandle, group: u64) -> synStatus {
    guard("synSectionSetGroup", || {
        if group > 255 {
            return fail(synStatus::UNSUPPORTED, format!("section group {group} > 255"));
        }
        registry().section_modify(h(s), |r| r.group = group)
    })
}

/// `synSectionSetRMW` on the CPU mock.
pub unsafe extern "C" fn syn_section_set_rmw(s: synSectionHandle, v: bool) -> synStatus {
    guard("synSectionSetRMW", || registry().section_modify(h(s), |r| r.rmw = v))
}

/// `synTensorHandleCreate`: a duplicate name returns synNameIsAlreadyUsed and writes the
/// existing tensor's handle, as the real runtime.
pub unsafe extern "C" fn syn_tensor_handle_create(
    t: *mut synTensor,
    g: synGraphHandle,
    ty: synTensorType,
    name: *const c_char,
) -> synStatus {
    guard("synTensorHandleCreate", || {
        if t.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null tensor pointer");
        }
        // SAFETY: the name is null or NUL-terminated by the caller's contract.
        let name = unsafe { c_str(name) };
        let res = registry().tensor_create(h(g), ty, name);
        match res {
            // SAFETY: checked non-null; valid for a write by the caller's contract.
            Ok(id) => unsafe { out(t, handle_to_raw(id) as synTensor) },
            Err((existing, e)) => {
                if let Some(id) = existing {
                    // SAFETY: as above.
                    unsafe { out(t, handle_to_raw(id) as synTensor)? };
                }
                Err(e)
            }
        }
    })
}

/// `synTensorAssignToSection` (locks the section's flags).
pub unsafe extern "C" fn syn_tensor_assign_to_section(t: synTensor, s: synSectionHandle, offset: u64) -> synStatus {
    guard("synTensorAssignToSection", || registry().tensor_assign(h(t), h(s), offset))
}

/// `synTensorSetSectionOffset` on the CPU mock.
pub unsafe extern "C" fn syn_tensor_set_section_offset(t: synTensor, offset: u64) -> synStatus {
    guard("synTensorSetSectionOffset", || registry().tensor_set_offset(h(t), offset))
}

/// `synTensorGetSection`: the section handle and the byte offset.
pub unsafe extern "C" fn syn_tensor_get_section(t: synTensor, s: *mut synSectionHandle, offset: *mut u64) -> synStatus {
    guard("synTensorGetSection", || {
        let r = registry();
        let (g, _) = r
            .graph_items
            .get(&h(t))
            .copied()
            .ok_or_else(|| MockError::new(synStatus::INVALID_ARGUMENT, "unknown tensor handle"))?;
        let rec = r.tensor_rec(h(t))?;
        let Some((si, off)) = rec.section else {
            return fail(synStatus::INVALID_ARGUMENT, format!("tensor {} is not assigned to a section", rec.name));
        };
        let handle = r.graph(g)?.sections[si].handle;
        // SAFETY: out-pointers null or valid for writes (module doc).
        unsafe {
            out(s, handle_to_raw(handle) as synSectionHandle)?;
            out(offset, off)
        }
    })
}

/// `synTensorSetGeometry` (max sizes; min sizes are recorded, dims ignored).
pub unsafe extern "C" fn syn_tensor_set_geometry(
    t: synTensor,
    geo: *const synTensorGeometry,
    ty: synGeometryType,
) -> synStatus {
    guard("synTensorSetGeometry", || {
        // SAFETY: null or valid for a read by the caller's contract.
        let geo = unsafe { read(geo, "geometry")? };
        registry().tensor_set_geometry(h(t), &geo, ty)
    })
}

/// `synTensorGetGeometry` on the CPU mock.
pub unsafe extern "C" fn syn_tensor_get_geometry(
    t: synTensor,
    geo: *mut synTensorGeometry,
    ty: synGeometryType,
) -> synStatus {
    guard("synTensorGetGeometry", || {
        let g = registry().tensor_geometry(h(t), ty)?;
        // SAFETY: the out-pointer is null or valid for a write (module doc).
        unsafe { out(geo, g) }
    })
}

/// `synTensorSetDeviceDataType` (f32, bf16, i32, i8 on the mock).
pub unsafe extern "C" fn syn_tensor_set_device_data_type(t: synTensor, dt: synDataType) -> synStatus {
    guard("synTensorSetDeviceDataType", || registry().tensor_set_dtype(h(t), dt))
}

/// `synTensorSetDeviceFullLayout`: dense only (non-zero strides are synUnsupported, as the
/// header documents for the real runtime).
pub unsafe extern "C" fn syn_tensor_set_device_full_layout(
    t: synTensor,
    l: *const synTensorDeviceFullLayout,
) -> synStatus {
    guard("synTensorSetDeviceFullLayout", || {
        // SAFETY: null or valid for a read by the caller's contract.
        let l = unsafe { read(l, "layout")? };
        if l.strides.iter().any(|&s| s != 0) {
            return fail(synStatus::UNSUPPORTED, "non-default strides are not supported");
        }
        registry().tensor_set_dtype(h(t), l.deviceDataType)
    })
}

/// `synTensorSetPermutation`: the identity only on the mock (others are synUnsupported).
pub unsafe extern "C" fn syn_tensor_set_permutation(t: synTensor, p: *const synTensorPermutation) -> synStatus {
    guard("synTensorSetPermutation", || {
        // SAFETY: null or valid for a read by the caller's contract.
        let p = unsafe { read(p, "permutation")? };
        let mut r = registry();
        let rec = r.tensor_touch(h(t))?;
        let n = usize::from(p.dims).min(p.permutation.len());
        if p.permutation[..n].iter().enumerate().any(|(i, &d)| usize::from(d) != i) {
            return fail(
                synStatus::UNSUPPORTED,
                format!("tensor {}: a non-identity permutation is not implemented by the CPU mock", rec.name),
            );
        }
        Ok(())
    })
}

/// `synTensorSetExternal`: marks a persistent tensor for `synEventMapTensor`.
pub unsafe extern "C" fn syn_tensor_set_external(t: synTensor, v: bool) -> synStatus {
    guard("synTensorSetExternal", || {
        registry().tensor_touch(h(t))?.external = v;
        Ok(())
    })
}

/// `synTensorGetName`: the NUL-terminated name into `name[..size]` (too small: synFail).
pub unsafe extern "C" fn syn_tensor_get_name(t: synTensor, size: u64, name: *mut c_char) -> synStatus {
    guard("synTensorGetName", || {
        let r = registry();
        let n = r.tensor_rec(h(t))?.name.clone();
        if name.is_null() || (size as usize) <= n.len() {
            return fail(synStatus::FAIL, format!("buffer of {size} bytes for name {n:?}"));
        }
        // SAFETY: `name` holds `size` > len bytes by the caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(n.as_ptr().cast(), name, n.len());
            *name.add(n.len()) = 0;
        }
        Ok(())
    })
}

/// `synTensorGetType` on the CPU mock.
pub unsafe extern "C" fn syn_tensor_get_type(t: synTensor, ty: *mut synTensorType) -> synStatus {
    guard("synTensorGetType", || {
        let v = registry().tensor_rec(h(t))?.ty;
        // SAFETY: the out-pointer is null or valid for a write (module doc).
        unsafe { out(ty, v) }
    })
}

/// `synTensorDestroy`: the handle stops being valid (the graph keeps the record its nodes use).
pub unsafe extern "C" fn syn_tensor_destroy(t: synTensor) -> synStatus {
    guard("synTensorDestroy", || {
        let mut r = registry();
        r.tensor_rec(h(t))?;
        r.graph_items.remove(&h(t));
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn node_common(
    g: synGraphHandle,
    ins: *const synTensor,
    outs: *const synTensor,
    n_in: u32,
    n_out: u32,
    params: *const c_void,
    params_size: c_uint,
    guid: *const c_char,
    name: *const c_char,
) -> MResult<u64> {
    // SAFETY: arrays of `n_in` / `n_out` handles by the caller's contract.
    let (ins, outs) = unsafe { (slice(ins, n_in as usize)?, slice(outs, n_out as usize)?) };
    let ins: Vec<u64> = ins.iter().map(|&t| if t.is_null() { 0 } else { h(t) }).collect();
    let outs: Vec<u64> = outs.iter().map(|&t| if t.is_null() { 0 } else { h(t) }).collect();
    let params = if params.is_null() {
        &[][..]
    } else {
        // SAFETY: `params` holds `params_size` bytes by the caller's contract.
        unsafe { slice(params.cast::<u8>(), params_size as usize)? }
    };
    // SAFETY: guid and name are null or NUL-terminated.
    let (guid, name) = unsafe { (c_str(guid), c_str(name)) };
    registry().node_create(h(g), &ins, &outs, params, guid, name)
}

/// `synNodeCreate` on the CPU mock (layouts ignored).
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn syn_node_create(
    g: synGraphHandle,
    ins: *const synTensor,
    outs: *const synTensor,
    n_in: u32,
    n_out: u32,
    params: *const c_void,
    params_size: c_uint,
    guid: *const c_char,
    name: *const c_char,
    _in_layouts: *const *const c_char,
    _out_layouts: *const *const c_char,
) -> synStatus {
    guard("synNodeCreate", || {
        // SAFETY: the caller's contract (module doc) covers every pointer.
        unsafe { node_common(g, ins, outs, n_in, n_out, params, params_size, guid, name) }.map(|_| ())
    })
}

/// `synNodeCreateWithId`: as [`syn_node_create`], writing the node's id.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn syn_node_create_with_id(
    g: synGraphHandle,
    ins: *const synTensor,
    outs: *const synTensor,
    n_in: u32,
    n_out: u32,
    params: *const c_void,
    params_size: c_uint,
    guid: *const c_char,
    name: *const c_char,
    id: *mut synNodeId,
    _in_layouts: *const *const c_char,
    _out_layouts: *const *const c_char,
) -> synStatus {
    guard("synNodeCreateWithId", || {
        if id.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null nodeUniqueId");
        }
        // SAFETY: the caller's contract (module doc) covers every pointer.
        let v = unsafe { node_common(g, ins, outs, n_in, n_out, params, params_size, guid, name)? };
        // SAFETY: checked non-null.
        unsafe { out(id, v) }
    })
}

/// `synNodeDependencySet`: every blocked node runs after every blocking node.
pub unsafe extern "C" fn syn_node_dependency_set(
    g: synGraphHandle,
    blocking: *const synNodeId,
    blocked: *const synNodeId,
    n_blocking: u32,
    n_blocked: u32,
) -> synStatus {
    guard("synNodeDependencySet", || {
        // SAFETY: arrays of the given lengths by the caller's contract.
        let (a, b) = unsafe { (slice(blocking, n_blocking as usize)?, slice(blocked, n_blocked as usize)?) };
        registry().node_dependency(h(g), a, b)
    })
}

fn compile_name(p: *const c_char) -> MResult<String> {
    // SAFETY: null or NUL-terminated by the caller's contract.
    match unsafe { c_str(p) } {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => fail(synStatus::INVALID_ARGUMENT, "null or empty recipe name"),
    }
}

/// `synGraphCompile`: validates and schedules the graph (failures: synFail naming the node and
/// tensor, see `graph/`), the build log argument is ignored.
pub unsafe extern "C" fn syn_graph_compile(
    p: *mut synRecipeHandle,
    g: synGraphHandle,
    name: *const c_char,
    _build_log: *const c_char,
) -> synStatus {
    guard("synGraphCompile", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pRecipeHandle");
        }
        let id = graph::compile(h(g), &compile_name(name)?).map_err(|(s, m)| MockError::new(s, m))?;
        // SAFETY: checked non-null.
        unsafe { out(p, handle_to_raw(id) as synRecipeHandle) }
    })
}

/// `synGraphCompileV2` (1.20+): as [`syn_graph_compile`]; on failure `*error` receives an error
/// object (release it with `synErrorDestroy`).
pub unsafe extern "C" fn syn_graph_compile_v2(
    p: *mut synRecipeHandle,
    g: synGraphHandle,
    name: *const c_char,
    error: *mut synErrorHandle,
) -> synStatus {
    guard("synGraphCompileV2", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pRecipeHandle");
        }
        match graph::compile(h(g), &compile_name(name)?) {
            // SAFETY: checked non-null.
            Ok(id) => unsafe { out(p, handle_to_raw(id) as synRecipeHandle) },
            Err((s, m)) => {
                if !error.is_null() {
                    let mut r = registry();
                    let eh = r.new_handle();
                    r.compile_errors.insert(eh, (s, m.clone()));
                    // SAFETY: non-null; valid for a write by the caller's contract.
                    unsafe { out(error, handle_to_raw(eh) as synErrorHandle)? };
                }
                fail(s, m)
            }
        }
    })
}

fn compile_error(e: synErrorHandle) -> MResult<(synStatus, String)> {
    registry()
        .compile_errors
        .get(&h(e))
        .cloned()
        .ok_or_else(|| MockError::new(synStatus::INVALID_ARGUMENT, "unknown error handle"))
}

/// `synErrorGetStatus` (1.20+).
pub unsafe extern "C" fn syn_error_get_status(e: synErrorHandle, s: *mut synStatus) -> synStatus {
    // SAFETY: the out-pointer is null or valid for a write (module doc).
    guard("synErrorGetStatus", || unsafe { out(s, compile_error(e)?.0) })
}

/// `synErrorGetMessageLength` (1.20+): bytes of the message without its NUL.
pub unsafe extern "C" fn syn_error_get_message_length(e: synErrorHandle, n: *mut usize) -> synStatus {
    // SAFETY: the out-pointer is null or valid for a write (module doc).
    guard("synErrorGetMessageLength", || unsafe { out(n, compile_error(e)?.1.len()) })
}

/// `synErrorGetMessage` (1.20+): the message, truncated to `size - 1` bytes and NUL-terminated.
pub unsafe extern "C" fn syn_error_get_message(e: synErrorHandle, buf: *mut c_char, size: usize) -> synStatus {
    guard("synErrorGetMessage", || {
        let m = compile_error(e)?.1;
        if buf.is_null() || size == 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null or empty buffer");
        }
        let n = m.len().min(size - 1);
        // SAFETY: `buf` holds `size` bytes; we write n + 1 <= size.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr().cast(), buf, n);
            *buf.add(n) = 0;
        }
        Ok(())
    })
}

/// `synErrorDestroy` (1.20+).
pub unsafe extern "C" fn syn_error_destroy(e: synErrorHandle) -> synStatus {
    guard("synErrorDestroy", || {
        registry()
            .compile_errors
            .remove(&h(e))
            .map(|_| ())
            .ok_or_else(|| MockError::new(synStatus::INVALID_ARGUMENT, "unknown error handle"))
    })
}

/// `synMemsetD32Async`: `n` 32-bit values on the stream.
pub unsafe extern "C" fn syn_memset_d32_async(addr: u64, v: u32, n: usize, s: synStreamHandle) -> synStatus {
    guard("synMemsetD32Async", || ops::memset(h(s), addr, v.to_le_bytes().to_vec(), n))
}

/// `synMemsetD16Async`: `n` 16-bit values on the stream.
pub unsafe extern "C" fn syn_memset_d16_async(addr: u64, v: u16, n: usize, s: synStreamHandle) -> synStatus {
    guard("synMemsetD16Async", || ops::memset(h(s), addr, v.to_le_bytes().to_vec(), n))
}

/// `synMemsetD8Async`: `n` bytes on the stream.
pub unsafe extern "C" fn syn_memset_d8_async(addr: u64, v: u8, n: usize, s: synStreamHandle) -> synStatus {
    guard("synMemsetD8Async", || ops::memset(h(s), addr, vec![v], n))
}
