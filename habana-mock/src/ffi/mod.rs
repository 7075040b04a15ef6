//! The mock's `extern "C"` entry points, one per `syn*` function of the table, named like the
//! table fields (`syn_initialize` for `synInitialize`, ...). The `hccl*` entries live in
//! `hccl/` and are re-exported here, so `ffi::<field>` exists for every table field.
//!
//! Owns: the argument checks and conversions of each `syn*` function. Every body runs inside
//! the shared FFI guard of `cabi.rs` (fault injection, a panic becomes synFail, never an unwind
//! across C; failures recorded as the thread's Synapse last error). Must not touch: mock state
//! directly (bodies call `device.rs`, `ops.rs`, `launch.rs` and the registry's methods).
//! No `#[no_mangle]` here: the `mock-synapse` cdylib exports these under the C names.
//!
//! # Safety (all functions)
//! The caller upholds the C API's pointer contract (out-pointers valid for writes, arrays valid
//! for the given lengths, strings NUL-terminated). Handles are never dereferenced: unknown,
//! destroyed or forged handles give synInvalidArgument (synInvalidEventHandle for events).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};

use habana_sys::{
    synDeviceId, synDeviceInfo, synDeviceInfoV2, synDeviceType, synDmaDir, synEventHandle, synModuleId, synStatus,
    synStreamHandle,
};

pub use crate::hccl::*;
pub use graph::*;
pub use recipe::*;

mod graph;
mod recipe;
use crate::cabi::{c_str, guard, h, handle_to_raw, out, slice};
use crate::error::fail;
use crate::memory::{retire_device_alloc, retire_host_range};
use crate::state::registry;
use crate::{device, ops};

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
    // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
        unsafe { out(p, device::acquire_by_type(t)?) }
    })
}

/// `synDeviceAcquireByModuleId` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_acquire_by_module_id(p: *mut synDeviceId, m: synModuleId) -> synStatus {
    guard("synDeviceAcquireByModuleId", || {
        if p.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pDeviceId");
        }
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
        unsafe { out(p, v1) }
    })
}

/// `synDeviceGetInfoV2` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_get_info_v2(d: synDeviceId, p: *mut synDeviceInfoV2) -> synStatus {
    // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
    guard("synDeviceGetInfoV2", || unsafe { out(p, device::info(d)?) })
}

/// `synDeviceGetMemoryInfo` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_get_memory_info(d: synDeviceId, free: *mut u64, total: *mut u64) -> synStatus {
    guard("synDeviceGetMemoryInfo", || {
        if free.is_null() || total.is_null() {
            return fail(synStatus::INVALID_ARGUMENT, "null pointer");
        }
        let (f, t) = device::memory_info(d)?;
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
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
        let p = registry().host_malloc(d, size)?;
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
        unsafe { out(buffer, p.cast()) }
    })
}

/// `synHostFree` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_free(d: synDeviceId, buffer: *const c_void, _flags: u32) -> synStatus {
    guard("synHostFree", || {
        let r = registry().host_remove(d, buffer as usize, true)?;
        retire_host_range(&r);
        Ok(())
    })
}

/// `synHostMap` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_map(d: synDeviceId, size: u64, buffer: *const c_void) -> synStatus {
    guard("synHostMap", || registry().host_map(d, buffer as usize, size))
}

/// `synHostUnmap` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_host_unmap(d: synDeviceId, buffer: *const c_void) -> synStatus {
    guard("synHostUnmap", || {
        let r = registry().host_remove(d, buffer as usize, false)?;
        retire_host_range(&r);
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
        let a = registry().device_malloc(d, size)?;
        // SAFETY: the out-pointer is null or valid for a write by the caller's contract (module doc).
        unsafe { out(buffer, a) }
    })
}

/// `synDeviceFree` on the CPU mock (contract: see the module documentation).
pub unsafe extern "C" fn syn_device_free(d: synDeviceId, buffer: u64, _flags: u32) -> synStatus {
    guard("synDeviceFree", || {
        let a = registry().device_free(d, buffer)?;
        retire_device_alloc(&a);
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
