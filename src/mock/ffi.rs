//! The mock's `extern "C"` entry points, one per `syn*` function of the table, named like the
//! table fields (`syn_initialize` for `synInitialize`, ...). The `hccl*` entries live in
//! `hccl.rs` and are re-exported here, so `ffi::<field>` exists for every table field.
//!
//! Owns: pointer checks and conversions at the C boundary, fault injection, the last error.
//! Every body runs inside `catch_unwind` (a panic becomes synFail, never an unwind across C).
//! No `#[no_mangle]` here: the `mock-synapse` cdylib exports these under the C names.
//!
//! # Safety (all functions)
//! The caller upholds the C API's pointer contract (out-pointers valid for writes, arrays valid
//! for the given lengths, strings NUL-terminated). Handles are never dereferenced: unknown,
//! destroyed or forged handles give synInvalidArgument (synInvalidEventHandle for events).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use habana_sys::{
    synDeviceId, synDeviceInfo, synDeviceInfoV2, synDeviceType, synDmaDir, synEventHandle,
    synLaunchTensorInfo, synModuleId, synRecipeAttribute, synRecipeHandle, synStatus,
    synStreamHandle,
};

pub use super::hccl::*;
use super::state::{
    MResult, fail, handle_to_raw, last_error_message_ptr, last_error_status, raw_to_handle,
    set_last_error, take_fault,
};
use super::{device, launch, ops, status};

/// Runs `f` as the body of C function `name`: injected fault first, panics caught, failures
/// recorded as this thread's last error.
fn guard(name: &'static str, f: impl FnOnce() -> MResult<()>) -> synStatus {
    if let Some(s) = take_fault(name) {
        set_last_error(s, &format!("{name}: injected fault"));
        return s;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => synStatus::SUCCESS,
        Ok(Err(e)) => {
            set_last_error(e.status, &format!("{name}: {}", e.msg));
            e.status
        }
        Err(_) => {
            set_last_error(
                synStatus::FAIL,
                &format!("{name}: internal error (panic) in the CPU mock"),
            );
            synStatus::FAIL
        }
    }
}

/// Writes `v` to the out-pointer `p`.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, v: T) -> MResult<()> {
    if p.is_null() {
        return fail(synStatus::INVALID_ARGUMENT, "null output pointer");
    }
    // SAFETY: non-null; valid for writes by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads a NUL-terminated string argument (None for null).
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("\u{fffd}"))
}

/// # Safety
/// `p` is null or points at `n` readable `T`s.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> MResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return fail(
            synStatus::INVALID_ARGUMENT,
            "null array with a nonzero length",
        );
    }
    // SAFETY: non-null, `n` elements readable by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

fn h<T>(p: *mut T) -> u64 {
    raw_to_handle(p as usize)
}

pub unsafe extern "C" fn syn_initialize() -> synStatus {
    guard("synInitialize", device::initialize)
}

pub unsafe extern "C" fn syn_destroy() -> synStatus {
    guard("synDestroy", device::destroy)
}

pub unsafe extern "C" fn syn_device_get_count(p_count: *mut u32) -> synStatus {
    // SAFETY (all `out` calls below): out-pointers follow the caller's contract (module doc).
    guard("synDeviceGetCount", || unsafe {
        out(p_count, device::count()?)
    })
}

/// Writes min(*size, count) module ids and sets *size to the number written.
pub unsafe extern "C" fn syn_device_get_module_ids(p_ids: *mut u32, size: *mut u32) -> synStatus {
    guard("synDeviceGetModuleIDs", || {
        if size.is_null() || p_ids.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pointer");
        }
        let ids = device::module_ids()?;
        // SAFETY: `size` is valid per the contract; `p_ids` holds `*size` elements.
        unsafe {
            let n = (*size as usize).min(ids.len());
            std::ptr::copy_nonoverlapping(ids.as_ptr(), p_ids, n);
            *size = n as u32;
        }
        Ok(())
    })
}

pub unsafe extern "C" fn syn_device_acquire_by_device_type(
    p: *mut synDeviceId,
    t: synDeviceType,
) -> synStatus {
    guard("synDeviceAcquireByDeviceType", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        unsafe { out(p, device::acquire_by_type(t)?) }
    })
}

pub unsafe extern "C" fn syn_device_acquire_by_module_id(
    p: *mut synDeviceId,
    m: synModuleId,
) -> synStatus {
    guard("synDeviceAcquireByModuleId", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        unsafe { out(p, device::acquire_by_module_id(m)?) }
    })
}

pub unsafe extern "C" fn syn_device_acquire(
    p: *mut synDeviceId,
    pci_bus: *const c_char,
) -> synStatus {
    guard("synDeviceAcquire", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        // SAFETY: pciBus is null or NUL-terminated.
        let bus = unsafe { c_str(pci_bus) };
        unsafe { out(p, device::acquire_by_pci_bus(bus)?) }
    })
}

pub unsafe extern "C" fn syn_device_release(d: synDeviceId) -> synStatus {
    guard("synDeviceRelease", || device::release(d))
}

pub unsafe extern "C" fn syn_device_synchronize(d: synDeviceId) -> synStatus {
    guard("synDeviceSynchronize", || device::synchronize(d))
}

pub unsafe extern "C" fn syn_device_get_info(d: synDeviceId, p: *mut synDeviceInfo) -> synStatus {
    guard("synDeviceGetInfo", || {
        let i = device::info(d)?;
        let v1 = synDeviceInfo {
            sramBaseAddress: i.sramBaseAddress,
            dramBaseAddress: i.dramBaseAddress,
            sramSize: i.sramSize,
            dramSize: i.dramSize,
            tpcEnabledMask: i.tpcEnabledMask,
            dramEnabled: i.dramEnabled,
            deviceId: i.deviceId,
            fd: i.fd,
            deviceType: i.deviceType,
        };
        unsafe { out(p, v1) }
    })
}

pub unsafe extern "C" fn syn_device_get_info_v2(
    d: synDeviceId,
    p: *mut synDeviceInfoV2,
) -> synStatus {
    guard("synDeviceGetInfoV2", || unsafe { out(p, device::info(d)?) })
}

pub unsafe extern "C" fn syn_device_get_memory_info(
    d: synDeviceId,
    free: *mut u64,
    total: *mut u64,
) -> synStatus {
    guard("synDeviceGetMemoryInfo", || {
        if free.is_null() || total.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pointer");
        }
        let (f, t) = device::memory_info(d)?;
        unsafe {
            out(free, f)?;
            out(total, t)
        }
    })
}

pub unsafe extern "C" fn syn_stream_create_generic(
    p: *mut synStreamHandle,
    d: synDeviceId,
    flags: u32,
) -> synStatus {
    guard("synStreamCreateGeneric", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pStreamHandle");
        }
        let id = ops::stream_create(d, flags)?;
        unsafe { out(p, handle_to_raw(id) as synStreamHandle) }
    })
}

pub unsafe extern "C" fn syn_stream_destroy(s: synStreamHandle) -> synStatus {
    guard("synStreamDestroy", || ops::stream_destroy(h(s)))
}

pub unsafe extern "C" fn syn_stream_wait_event(
    s: synStreamHandle,
    e: synEventHandle,
    flags: u32,
) -> synStatus {
    guard("synStreamWaitEvent", || {
        ops::stream_wait_event(h(s), h(e), flags)
    })
}

pub unsafe extern "C" fn syn_stream_synchronize(s: synStreamHandle) -> synStatus {
    guard("synStreamSynchronize", || ops::stream_synchronize(h(s)))
}

pub unsafe extern "C" fn syn_stream_query(s: synStreamHandle) -> synStatus {
    guard("synStreamQuery", || ops::stream_query(h(s)))
}

pub unsafe extern "C" fn syn_event_create(
    p: *mut synEventHandle,
    d: synDeviceId,
    flags: u32,
) -> synStatus {
    guard("synEventCreate", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pEventHandler");
        }
        let id = ops::event_create(d, flags)?;
        unsafe { out(p, handle_to_raw(id) as synEventHandle) }
    })
}

pub unsafe extern "C" fn syn_event_destroy(e: synEventHandle) -> synStatus {
    guard("synEventDestroy", || ops::event_destroy(h(e)))
}

pub unsafe extern "C" fn syn_event_record(e: synEventHandle, s: synStreamHandle) -> synStatus {
    guard("synEventRecord", || ops::event_record(h(e), h(s)))
}

pub unsafe extern "C" fn syn_event_query(e: synEventHandle) -> synStatus {
    guard("synEventQuery", || ops::event_query(h(e)))
}

pub unsafe extern "C" fn syn_event_synchronize(e: synEventHandle) -> synStatus {
    guard("synEventSynchronize", || ops::event_synchronize(h(e)))
}

pub unsafe extern "C" fn syn_event_elapsed_time(
    p_ns: *mut u64,
    start: synEventHandle,
    end: synEventHandle,
) -> synStatus {
    guard("synEventElapsedTime", || {
        let end = (!end.is_null()).then(|| h(end));
        let v = ops::elapsed(h(start), end)?;
        unsafe { out(p_ns, v) }
    })
}

pub unsafe extern "C" fn syn_host_malloc(
    d: synDeviceId,
    size: u64,
    flags: u32,
    buffer: *mut *mut c_void,
) -> synStatus {
    guard("synHostMalloc", || {
        if buffer.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null buffer pointer");
        }
        if flags != 0 {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("flags {flags:#x} must be 0"),
            );
        }
        let p = super::state::registry().host_malloc(d, size)?;
        unsafe { out(buffer, p.cast()) }
    })
}

pub unsafe extern "C" fn syn_host_free(
    d: synDeviceId,
    buffer: *const c_void,
    _flags: u32,
) -> synStatus {
    guard("synHostFree", || {
        let r = super::state::registry().host_remove(d, buffer as usize, true)?;
        super::memory::retire_host_range(&r);
        Ok(())
    })
}

pub unsafe extern "C" fn syn_host_map(
    d: synDeviceId,
    size: u64,
    buffer: *const c_void,
) -> synStatus {
    guard("synHostMap", || {
        super::state::registry().host_map(d, buffer as usize, size)
    })
}

pub unsafe extern "C" fn syn_host_unmap(d: synDeviceId, buffer: *const c_void) -> synStatus {
    guard("synHostUnmap", || {
        let r = super::state::registry().host_remove(d, buffer as usize, false)?;
        super::memory::retire_host_range(&r);
        Ok(())
    })
}

pub unsafe extern "C" fn syn_device_malloc(
    d: synDeviceId,
    size: u64,
    _req: u64,
    _flags: u32,
    buffer: *mut u64,
) -> synStatus {
    guard("synDeviceMalloc", || {
        if buffer.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null buffer pointer");
        }
        let a = super::state::registry().device_malloc(d, size)?;
        unsafe { out(buffer, a) }
    })
}

pub unsafe extern "C" fn syn_device_free(d: synDeviceId, buffer: u64, _flags: u32) -> synStatus {
    guard("synDeviceFree", || {
        let a = super::state::registry().device_free(d, buffer)?;
        super::memory::retire_device_alloc(&a);
        Ok(())
    })
}

pub unsafe extern "C" fn syn_mem_copy_async(
    s: synStreamHandle,
    src: u64,
    size: u64,
    dst: u64,
    dir: synDmaDir,
) -> synStatus {
    guard("synMemCopyAsync", || {
        ops::mem_copy(h(s), &[(src, size, dst)], dir)
    })
}

pub unsafe extern "C" fn syn_mem_copy_async_multiple(
    s: synStreamHandle,
    src: *const u64,
    size: *const u64,
    dst: *const u64,
    dir: synDmaDir,
    n: u64,
) -> synStatus {
    guard("synMemCopyAsyncMultiple", || {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        // SAFETY: the three arrays hold `n` elements by the caller's contract.
        let (a, b, c) = unsafe { (slice(src, n)?, slice(size, n)?, slice(dst, n)?) };
        let copies: Vec<_> = (0..n).map(|i| (a[i], b[i], c[i])).collect();
        ops::mem_copy(h(s), &copies, dir)
    })
}

fn path_arg(p: *const c_char) -> MResult<PathBuf> {
    // SAFETY: the file name is null or NUL-terminated.
    match unsafe { c_str(p) } {
        Some(s) if !s.is_empty() => Ok(PathBuf::from(s)),
        _ => fail(
            synStatus::INVALID_ARGUMENT,
            "null or empty recipe file name",
        ),
    }
}

pub unsafe extern "C" fn syn_recipe_serialize(
    r: synRecipeHandle,
    file: *const c_char,
) -> synStatus {
    guard("synRecipeSerialize", || {
        launch::serialize(h(r), &path_arg(file)?)
    })
}

pub unsafe extern "C" fn syn_recipe_deserialize(
    p: *mut synRecipeHandle,
    file: *const c_char,
) -> synStatus {
    guard("synRecipeDeSerialize", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pRecipeHandle");
        }
        let id = launch::deserialize(&path_arg(file)?)?;
        unsafe { out(p, handle_to_raw(id) as synRecipeHandle) }
    })
}

pub unsafe extern "C" fn syn_recipe_destroy(r: synRecipeHandle) -> synStatus {
    guard("synRecipeDestroy", || launch::destroy(h(r)))
}

pub unsafe extern "C" fn syn_recipe_get_attribute(
    ret: *mut u64,
    attrs: *const synRecipeAttribute,
    n: c_uint,
    r: synRecipeHandle,
) -> synStatus {
    guard("synRecipeGetAttribute", || {
        // SAFETY: `attrs` holds `n` entries and `ret` has room for `n` by the contract.
        let attrs = unsafe { slice(attrs, n as usize)? };
        let vals = attrs
            .iter()
            .map(|&a| launch::attribute(h(r), a))
            .collect::<MResult<Vec<_>>>()?;
        if ret.is_null() && n > 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null retVal");
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), ret, vals.len()) };
        Ok(())
    })
}

pub unsafe extern "C" fn syn_workspace_get_size(p: *mut u64, r: synRecipeHandle) -> synStatus {
    guard("synWorkspaceGetSize", || unsafe {
        out(
            p,
            launch::attribute(h(r), synRecipeAttribute::WORKSPACE_SIZE)?,
        )
    })
}

pub unsafe extern "C" fn syn_tensor_retrieve_launch_amount(
    r: synRecipeHandle,
    n: *mut u32,
) -> synStatus {
    guard("synTensorRetrieveLaunchAmount", || unsafe {
        out(n, launch::recipe(h(r))?.spec.tensors.len() as u32)
    })
}

/// `numOfTensors` must equal the launch amount.
pub unsafe extern "C" fn syn_tensor_retrieve_launch_ids(
    r: synRecipeHandle,
    ids: *mut u64,
    n: u32,
) -> synStatus {
    guard("synTensorRetrieveLaunchIds", || {
        let rec = launch::recipe(h(r))?;
        let count = rec.spec.tensors.len();
        if n as usize != count {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("numOfTensors {n}, the recipe has {count}"),
            );
        }
        if ids.is_null() && n > 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null tensorsIds");
        }
        for i in 0..count {
            // SAFETY: `ids` holds `n` = count entries.
            unsafe { ids.add(i).write(super::recipe::TENSOR_ID_BASE + i as u64) };
        }
        Ok(())
    })
}

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
        let v = launch::ids_of(&rec, &list)?;
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
    let evs: Vec<u64> = unsafe { slice(evs as *const synEventHandle, nev as usize)? }
        .iter()
        .map(|&e| h(e))
        .collect();
    // SAFETY: tensor names are NUL-terminated by the contract.
    unsafe { launch::launch(h(s), infos, ws, h(r), &evs, flags) }
}

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
    guard("synLaunchWithExternalEvents", || unsafe {
        launch_common(s, infos, n, ws, r, evs, nev, flags)
    })
}

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
    guard("synLaunchWithExternalEventsExt", || unsafe {
        launch_common(s, infos, n, ws, r, evs, nev, flags)
    })
}

/// Copies the brief description of `st` (truncated, NUL-terminated) into `buf[..len]`.
pub unsafe extern "C" fn syn_status_get_brief_description(
    st: synStatus,
    buf: *mut c_char,
    len: usize,
) -> synStatus {
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
        let v =
            std::env::var(super::ENV_VERSION).unwrap_or_else(|_| super::MOCK_VERSION.to_string());
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

pub unsafe extern "C" fn syn_get_last_error() -> synStatus {
    last_error_status()
}

pub unsafe extern "C" fn syn_get_error_string(st: synStatus) -> *const c_char {
    status::brief(st).as_ptr()
}

pub unsafe extern "C" fn syn_get_last_error_message() -> *const c_char {
    last_error_message_ptr()
}
