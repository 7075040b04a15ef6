//! The mock's `extern "C"` entry points, one per `syn*` function of the table, named like the
//! table fields (`syn_initialize` for `synInitialize`, ...). The `hccl*` entries live in
//! `hccl/` and are re-exported here, so `ffi::<field>` exists for every table field.
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

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use habana_sys::{
    synDeviceId, synDeviceInfo, synDeviceInfoV2, synDeviceType, synDmaDir, synEventHandle, synModuleId, synStatus,
    synStreamHandle,
};

pub use super::hccl::*;
pub use recipe::*;

mod recipe;
use super::state::{MResult, fail, handle_to_raw, raw_to_handle, set_last_error, take_fault};
use super::{device, ops};

/// Runs `f` as the body of C function `name`: injected fault first, panics caught, failures
/// recorded as this thread's last error.
pub(super) fn guard(name: &'static str, f: impl FnOnce() -> MResult<()>) -> synStatus {
    if let Some(s) = take_fault(name) {
        set_last_error(s, &format!("{name}: injected fault"));
        return s;
    }
    catch_and_report(name, f)
}

/// Runs `f` with panics caught and failures recorded as this thread's last error (no fault
/// injection: also used by the mock-only control ABI, which faults must not reach).
pub(super) fn catch_and_report(name: &str, f: impl FnOnce() -> MResult<()>) -> synStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => synStatus::SUCCESS,
        Ok(Err(e)) => {
            set_last_error(e.status, &format!("{name}: {}", e.msg));
            e.status
        }
        Err(_) => {
            set_last_error(synStatus::FAIL, &format!("{name}: internal error (panic) in the CPU mock"));
            synStatus::FAIL
        }
    }
}

/// Writes `v` to the out-pointer `p`.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
pub(super) unsafe fn out<T>(p: *mut T, v: T) -> MResult<()> {
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
pub(super) unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("\u{fffd}"))
}

/// # Safety
/// `p` is null or points at `n` readable `T`s.
pub(super) unsafe fn slice<'a, T>(p: *const T, n: usize) -> MResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return fail(synStatus::INVALID_ARGUMENT, "null array with a nonzero length");
    }
    // SAFETY: non-null, `n` elements readable by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

pub(super) fn h<T>(p: *mut T) -> u64 {
    raw_to_handle(p as usize)
}

/// `synInitialize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_initialize() -> synStatus {
    guard("synInitialize", device::initialize)
}

/// `synDestroy` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_destroy() -> synStatus {
    guard("synDestroy", device::destroy)
}

/// `synDeviceGetCount` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_get_count(p_count: *mut u32) -> synStatus {
    // SAFETY (all `out` calls below): out-pointers follow the caller's contract (module doc).
    guard("synDeviceGetCount", || unsafe { out(p_count, device::count()?) })
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

/// `synDeviceAcquireByDeviceType` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_acquire_by_device_type(p: *mut synDeviceId, t: synDeviceType) -> synStatus {
    guard("synDeviceAcquireByDeviceType", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        unsafe { out(p, device::acquire_by_type(t)?) }
    })
}

/// `synDeviceAcquireByModuleId` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_acquire_by_module_id(p: *mut synDeviceId, m: synModuleId) -> synStatus {
    guard("synDeviceAcquireByModuleId", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        unsafe { out(p, device::acquire_by_module_id(m)?) }
    })
}

/// `synDeviceAcquire` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_acquire(p: *mut synDeviceId, pci_bus: *const c_char) -> synStatus {
    guard("synDeviceAcquire", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        // SAFETY: pciBus is null or NUL-terminated.
        let bus = unsafe { c_str(pci_bus) };
        unsafe { out(p, device::acquire_by_pci_bus(bus)?) }
    })
}

/// `synDeviceRelease` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_release(d: synDeviceId) -> synStatus {
    guard("synDeviceRelease", || device::release(d))
}

/// `synDeviceSynchronize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_synchronize(d: synDeviceId) -> synStatus {
    guard("synDeviceSynchronize", || device::synchronize(d))
}

/// `synDeviceGetInfo` on the CPU mock (contract: see the module documentation).
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

/// `synDeviceGetInfoV2` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_get_info_v2(d: synDeviceId, p: *mut synDeviceInfoV2) -> synStatus {
    guard("synDeviceGetInfoV2", || unsafe { out(p, device::info(d)?) })
}

/// `synDeviceGetMemoryInfo` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_get_memory_info(d: synDeviceId, free: *mut u64, total: *mut u64) -> synStatus {
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

/// `synStreamCreateGeneric` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_stream_create_generic(p: *mut synStreamHandle, d: synDeviceId, flags: u32) -> synStatus {
    guard("synStreamCreateGeneric", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pStreamHandle");
        }
        let id = ops::stream_create(d, flags)?;
        unsafe { out(p, handle_to_raw(id) as synStreamHandle) }
    })
}

/// `synStreamDestroy` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_stream_destroy(s: synStreamHandle) -> synStatus {
    guard("synStreamDestroy", || ops::stream_destroy(h(s)))
}

/// `synStreamWaitEvent` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_stream_wait_event(s: synStreamHandle, e: synEventHandle, flags: u32) -> synStatus {
    guard("synStreamWaitEvent", || ops::stream_wait_event(h(s), h(e), flags))
}

/// `synStreamSynchronize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_stream_synchronize(s: synStreamHandle) -> synStatus {
    guard("synStreamSynchronize", || ops::stream_synchronize(h(s)))
}

/// `synStreamQuery` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_stream_query(s: synStreamHandle) -> synStatus {
    guard("synStreamQuery", || ops::stream_query(h(s)))
}

/// `synEventCreate` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_event_create(p: *mut synEventHandle, d: synDeviceId, flags: u32) -> synStatus {
    guard("synEventCreate", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pEventHandler");
        }
        let id = ops::event_create(d, flags)?;
        unsafe { out(p, handle_to_raw(id) as synEventHandle) }
    })
}

/// `synEventDestroy` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_event_destroy(e: synEventHandle) -> synStatus {
    guard("synEventDestroy", || ops::event_destroy(h(e)))
}

/// `synEventRecord` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_event_record(e: synEventHandle, s: synStreamHandle) -> synStatus {
    guard("synEventRecord", || ops::event_record(h(e), h(s)))
}

/// `synEventQuery` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_event_query(e: synEventHandle) -> synStatus {
    guard("synEventQuery", || ops::event_query(h(e)))
}

/// `synEventSynchronize` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_event_synchronize(e: synEventHandle) -> synStatus {
    guard("synEventSynchronize", || ops::event_synchronize(h(e)))
}

/// `synEventElapsedTime` on the CPU mock (contract: see the module documentation).
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

/// `synHostMalloc` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_malloc(d: synDeviceId, size: u64, flags: u32, buffer: *mut *mut c_void) -> synStatus {
    guard("synHostMalloc", || {
        if buffer.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null buffer pointer");
        }
        if flags != 0 {
            return fail(synStatus::INVALID_ARGUMENT, format!("flags {flags:#x} must be 0"));
        }
        let p = super::state::registry().host_malloc(d, size)?;
        unsafe { out(buffer, p.cast()) }
    })
}

/// `synHostFree` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_free(d: synDeviceId, buffer: *const c_void, _flags: u32) -> synStatus {
    guard("synHostFree", || {
        let r = super::state::registry().host_remove(d, buffer as usize, true)?;
        super::memory::retire_host_range(&r);
        Ok(())
    })
}

/// `synHostMap` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_map(d: synDeviceId, size: u64, buffer: *const c_void) -> synStatus {
    guard("synHostMap", || super::state::registry().host_map(d, buffer as usize, size))
}

/// `synHostUnmap` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_unmap(d: synDeviceId, buffer: *const c_void) -> synStatus {
    guard("synHostUnmap", || {
        let r = super::state::registry().host_remove(d, buffer as usize, false)?;
        super::memory::retire_host_range(&r);
        Ok(())
    })
}

/// `synDeviceMalloc` on the CPU mock (contract: see the module documentation).
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

/// `synDeviceFree` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_free(d: synDeviceId, buffer: u64, _flags: u32) -> synStatus {
    guard("synDeviceFree", || {
        let a = super::state::registry().device_free(d, buffer)?;
        super::memory::retire_device_alloc(&a);
        Ok(())
    })
}

/// `synMemCopyAsync` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_mem_copy_async(
    s: synStreamHandle,
    src: u64,
    size: u64,
    dst: u64,
    dir: synDmaDir,
) -> synStatus {
    guard("synMemCopyAsync", || ops::mem_copy(h(s), &[(src, size, dst)], dir))
}

/// `synMemCopyAsyncMultiple` on the CPU mock (contract: see the module documentation).
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
