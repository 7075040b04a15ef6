//! The thin result layer: every Synapse call used by the safe types, with Rust names, returning
//! [`Result`]. Still `unsafe` where the C contract needs live handles or valid pointers (the
//! cudarc `result` tier).
//!
//! Owns: status checking and the translation of out-parameters into return values.
//! Must not touch: ownership or lifetimes (that is the RAII types' job).

use std::ffi::{CStr, CString, c_char, c_void};

use habana_sys::{
    SynapseApi, synDeviceId, synDeviceInfoV2, synDmaDir, synEventHandle, synLaunchTensorInfo, synLaunchTensorInfoExt,
    synRecipeAttribute, synRecipeHandle, synRetrievedLaunchTensorInfo, synStatus, synStreamHandle,
};

use super::error::{Error, Result};

/// Turns a status into a `Result`, fetching the library's description and last message.
pub fn check(api: &SynapseApi, call: &'static str, status: synStatus) -> Result<()> {
    if status.is_success() {
        return Ok(());
    }
    Err(Error::Synapse { call, status, description: describe(api, status), message: last_message(api) })
}

/// The library's brief description of `status` (`synStatusGetBriefDescription`), falling back to
/// the C name when the call fails.
pub fn describe(api: &SynapseApi, status: synStatus) -> String {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is valid for `len` bytes; we NUL-terminate before reading.
    let st = unsafe { (api.syn_status_get_brief_description)(status, buf.as_mut_ptr(), buf.len()) };
    if st.is_success() {
        buf[buf.len() - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (set above).
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        if !s.is_empty() {
            return s;
        }
    }
    status.name().unwrap_or("unknown status").to_string()
}

/// The calling thread's last error message (`synGetLastErrorMessage`, SynapseAI 1.21+).
pub fn last_message(api: &SynapseApi) -> Option<String> {
    let f = api.syn_get_last_error_message?;
    // SAFETY: documented to return a thread-local NUL-terminated string or NULL; we copy it
    // before any other Synapse call can invalidate it.
    let p = unsafe { f() };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated per the contract above.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}

/// `synInitialize`.
pub fn initialize(api: &SynapseApi) -> Result<()> {
    // SAFETY: no arguments; may be called more than once (a second call returns synSuccess).
    check(api, "synInitialize", unsafe { (api.syn_initialize)() })
}

/// `synDestroy`.
///
/// # Safety
/// No other Synapse call may run concurrently, and no handle may be used afterwards.
pub unsafe fn destroy(api: &SynapseApi) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synDestroy", unsafe { (api.syn_destroy)() })
}

/// `synDeviceGetCount`: number of devices visible to this process.
pub fn device_count(api: &SynapseApi) -> Result<u32> {
    let mut n = 0u32;
    // SAFETY: `n` is a valid out-pointer.
    check(api, "synDeviceGetCount", unsafe { (api.syn_device_get_count)(&mut n) })?;
    Ok(n)
}

/// `synDeviceGetModuleIDs`: module ids of the visible devices (buffer sized by
/// `synDeviceGetCount`; the count the call returns is honoured).
pub fn module_ids(api: &SynapseApi) -> Result<Vec<u32>> {
    let n = device_count(api)?;
    let mut ids = vec![0u32; n as usize];
    let mut size = n;
    // SAFETY: `ids` holds `size` elements; `size` is an in/out count.
    check(api, "synDeviceGetModuleIDs", unsafe { (api.syn_device_get_module_ids)(ids.as_mut_ptr(), &mut size) })?;
    ids.truncate(size.min(n) as usize);
    Ok(ids)
}

/// `synDeviceAcquireByModuleId`.
pub fn device_acquire_by_module_id(api: &SynapseApi, module_id: u32) -> Result<synDeviceId> {
    let mut id = habana_sys::SYN_INVALID_DEVICE_ID;
    // SAFETY: `id` is a valid out-pointer.
    check(api, "synDeviceAcquireByModuleId", unsafe { (api.syn_device_acquire_by_module_id)(&mut id, module_id) })?;
    Ok(id)
}

/// `synDeviceAcquire(&id, NULL)`: the first free device.
pub fn device_acquire_any(api: &SynapseApi) -> Result<synDeviceId> {
    let mut id = habana_sys::SYN_INVALID_DEVICE_ID;
    // SAFETY: `id` is a valid out-pointer; a NULL PCI bus selects the first device.
    check(api, "synDeviceAcquire", unsafe { (api.syn_device_acquire)(&mut id, std::ptr::null()) })?;
    Ok(id)
}

/// `synDeviceRelease`.
pub fn device_release(api: &SynapseApi, device: synDeviceId) -> Result<()> {
    // SAFETY: plain value argument; an unknown id yields an error status.
    check(api, "synDeviceRelease", unsafe { (api.syn_device_release)(device) })
}

/// `synDeviceSynchronize`: waits for all streams of the device.
pub fn device_synchronize(api: &SynapseApi, device: synDeviceId) -> Result<()> {
    // SAFETY: plain value argument.
    check(api, "synDeviceSynchronize", unsafe { (api.syn_device_synchronize)(device) })
}

/// `synDeviceGetInfoV2`.
pub fn device_info(api: &SynapseApi, device: synDeviceId) -> Result<synDeviceInfoV2> {
    let mut info = synDeviceInfoV2::default();
    // SAFETY: `info` is a valid out-pointer of the documented struct.
    check(api, "synDeviceGetInfoV2", unsafe { (api.syn_device_get_info_v2)(device, &mut info) })?;
    Ok(info)
}

/// `synDeviceGetMemoryInfo`: (free, total) device memory in bytes.
pub fn device_memory_info(api: &SynapseApi, device: synDeviceId) -> Result<(u64, u64)> {
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: valid out-pointers.
    check(api, "synDeviceGetMemoryInfo", unsafe { (api.syn_device_get_memory_info)(device, &mut free, &mut total) })?;
    Ok((free, total))
}

/// `synStreamCreateGeneric(.., flags = 0)`.
pub fn stream_create(api: &SynapseApi, device: synDeviceId) -> Result<synStreamHandle> {
    let mut h: synStreamHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags 0 as every vendor sample passes.
    check(api, "synStreamCreateGeneric", unsafe { (api.syn_stream_create_generic)(&mut h, device, 0) })?;
    Ok(h)
}

/// `synStreamDestroy` (synBusy while work is pending).
///
/// # Safety
/// `stream` must be a live stream not used afterwards.
pub unsafe fn stream_destroy(api: &SynapseApi, stream: synStreamHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synStreamDestroy", unsafe { (api.syn_stream_destroy)(stream) })
}

/// `synStreamSynchronize`.
///
/// # Safety
/// `stream` must be a live stream.
pub unsafe fn stream_synchronize(api: &SynapseApi, stream: synStreamHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synStreamSynchronize", unsafe { (api.syn_stream_synchronize)(stream) })
}

/// `synStreamQuery`: `Ok(true)` when all work is done, `Ok(false)` on synBusy.
///
/// # Safety
/// `stream` must be a live stream.
pub unsafe fn stream_query(api: &SynapseApi, stream: synStreamHandle) -> Result<bool> {
    // SAFETY: guaranteed by the caller.
    let st = unsafe { (api.syn_stream_query)(stream) };
    if st == synStatus::BUSY {
        return Ok(false);
    }
    check(api, "synStreamQuery", st).map(|_| true)
}

/// `synStreamWaitEvent(.., flags = 0)`.
///
/// # Safety
/// Both handles must be live and belong to the same device.
pub unsafe fn stream_wait_event(api: &SynapseApi, stream: synStreamHandle, event: synEventHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller; flags must be 0.
    check(api, "synStreamWaitEvent", unsafe { (api.syn_stream_wait_event)(stream, event, 0) })
}

/// `synEventCreate`.
pub fn event_create(api: &SynapseApi, device: synDeviceId, flags: u32) -> Result<synEventHandle> {
    let mut h: synEventHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(api, "synEventCreate", unsafe { (api.syn_event_create)(&mut h, device, flags) })?;
    Ok(h)
}

/// `synEventDestroy`.
///
/// # Safety
/// `event` must be live and not used afterwards.
pub unsafe fn event_destroy(api: &SynapseApi, event: synEventHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synEventDestroy", unsafe { (api.syn_event_destroy)(event) })
}

/// `synEventRecord`.
///
/// # Safety
/// Both handles must be live.
pub unsafe fn event_record(api: &SynapseApi, event: synEventHandle, stream: synStreamHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synEventRecord", unsafe { (api.syn_event_record)(event, stream) })
}

/// `synEventQuery`: `Ok(true)` when complete (or never recorded), `Ok(false)` on synBusy.
///
/// # Safety
/// `event` must be live.
pub unsafe fn event_query(api: &SynapseApi, event: synEventHandle) -> Result<bool> {
    // SAFETY: guaranteed by the caller.
    let st = unsafe { (api.syn_event_query)(event) };
    if st == synStatus::BUSY {
        return Ok(false);
    }
    check(api, "synEventQuery", st).map(|_| true)
}

/// `synEventSynchronize`.
///
/// # Safety
/// `event` must be live.
pub unsafe fn event_synchronize(api: &SynapseApi, event: synEventHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synEventSynchronize", unsafe { (api.syn_event_synchronize)(event) })
}

/// `synEventElapsedTime` in ns; with `end` null, the start event's timestamp.
///
/// # Safety
/// `start` must be live; `end` live or null.
pub unsafe fn event_elapsed_ns(api: &SynapseApi, start: synEventHandle, end: synEventHandle) -> Result<u64> {
    let mut ns = 0u64;
    // SAFETY: guaranteed by the caller; `ns` is a valid out-pointer.
    check(api, "synEventElapsedTime", unsafe { (api.syn_event_elapsed_time)(&mut ns, start, end) })?;
    Ok(ns)
}

/// `synHostMalloc(.., flags = 0)`: pinned host memory of `bytes` bytes.
pub fn host_malloc(api: &SynapseApi, device: synDeviceId, bytes: u64) -> Result<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(api, "synHostMalloc", unsafe { (api.syn_host_malloc)(device, bytes, 0, &mut p) })?;
    Ok(p)
}

/// `synHostFree`.
///
/// # Safety
/// `p` must come from `synHostMalloc` on `device`, with no copy using it in flight.
pub unsafe fn host_free(api: &SynapseApi, device: synDeviceId, p: *const c_void) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synHostFree", unsafe { (api.syn_host_free)(device, p, 0) })
}

/// `synDeviceMalloc(.., reqAddr = 0, flags = 0)`: a device address.
pub fn device_malloc(api: &SynapseApi, device: synDeviceId, bytes: u64) -> Result<u64> {
    let mut addr = 0u64;
    // SAFETY: valid out-pointer; reqAddr 0 lets the runtime choose (128-byte aligned).
    check(api, "synDeviceMalloc", unsafe { (api.syn_device_malloc)(device, bytes, 0, 0, &mut addr) })?;
    Ok(addr)
}

/// `synDeviceFree`.
pub fn device_free(api: &SynapseApi, device: synDeviceId, addr: u64) -> Result<()> {
    // SAFETY: plain values; device addresses are integers, an unknown one yields an error.
    check(api, "synDeviceFree", unsafe { (api.syn_device_free)(device, addr, 0) })
}

/// `synMemCopyAsync`.
///
/// # Safety
/// `stream` live; host addresses must point to pinned (mapped or `synHostMalloc`) memory valid
/// for `bytes` until the copy completes.
pub unsafe fn mem_copy_async(
    api: &SynapseApi,
    stream: synStreamHandle,
    src: u64,
    bytes: u64,
    dst: u64,
    dir: synDmaDir,
) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synMemCopyAsync", unsafe { (api.syn_mem_copy_async)(stream, src, bytes, dst, dir) })
}

/// `synRecipeDeSerialize`.
pub fn recipe_deserialize(api: &SynapseApi, path: &CStr) -> Result<synRecipeHandle> {
    let mut h: synRecipeHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer and NUL-terminated path.
    check(api, "synRecipeDeSerialize", unsafe { (api.syn_recipe_deserialize)(&mut h, path.as_ptr()) })?;
    Ok(h)
}

/// `synRecipeSerialize`.
///
/// # Safety
/// `recipe` must be live.
pub unsafe fn recipe_serialize(api: &SynapseApi, recipe: synRecipeHandle, path: &CStr) -> Result<()> {
    // SAFETY: guaranteed by the caller; NUL-terminated path.
    check(api, "synRecipeSerialize", unsafe { (api.syn_recipe_serialize)(recipe, path.as_ptr()) })
}

/// `synRecipeDestroy`.
///
/// # Safety
/// `recipe` must be live, not used afterwards, and not referenced by queued launches.
pub unsafe fn recipe_destroy(api: &SynapseApi, recipe: synRecipeHandle) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "synRecipeDestroy", unsafe { (api.syn_recipe_destroy)(recipe) })
}

/// `synRecipeGetAttribute` for one attribute.
///
/// # Safety
/// `recipe` must be live.
pub unsafe fn recipe_attribute(api: &SynapseApi, recipe: synRecipeHandle, attr: synRecipeAttribute) -> Result<u64> {
    let mut v = 0u64;
    // SAFETY: one attribute in, one value out; recipe guaranteed live by the caller.
    check(api, "synRecipeGetAttribute", unsafe { (api.syn_recipe_get_attribute)(&mut v, &attr, 1, recipe) })?;
    Ok(v)
}

/// `synWorkspaceGetSize` in bytes.
///
/// # Safety
/// `recipe` must be live.
pub unsafe fn workspace_size(api: &SynapseApi, recipe: synRecipeHandle) -> Result<u64> {
    let mut v = 0u64;
    // SAFETY: valid out-pointer; recipe guaranteed live by the caller.
    check(api, "synWorkspaceGetSize", unsafe { (api.syn_workspace_get_size)(&mut v, recipe) })?;
    Ok(v)
}

/// `synTensorRetrieveLaunchAmount` + `synTensorRetrieveLaunchIds`: the ids of every tensor that
/// must be bound at launch.
///
/// # Safety
/// `recipe` must be live.
pub unsafe fn tensor_launch_ids(api: &SynapseApi, recipe: synRecipeHandle) -> Result<Vec<u64>> {
    let mut n = 0u32;
    // SAFETY: valid out-pointer; recipe guaranteed live by the caller.
    check(api, "synTensorRetrieveLaunchAmount", unsafe { (api.syn_tensor_retrieve_launch_amount)(recipe, &mut n) })?;
    let mut ids = vec![0u64; n as usize];
    // SAFETY: `ids` holds exactly `n` elements.
    check(api, "synTensorRetrieveLaunchIds", unsafe {
        (api.syn_tensor_retrieve_launch_ids)(recipe, ids.as_mut_ptr(), n)
    })?;
    Ok(ids)
}

/// `synTensorRetrieveLaunchInfoById`: name, element type, sizes, section and offset of each of
/// `ids` (launch ids of `recipe`), in the same order.
///
/// # Safety
/// `recipe` must be live.
pub unsafe fn launch_info_by_id(
    api: &SynapseApi,
    recipe: synRecipeHandle,
    ids: &[u64],
) -> Result<Vec<synRetrievedLaunchTensorInfo>> {
    let n = u32::try_from(ids.len())
        .map_err(|_| Error::InvalidArgument { what: "launch tensor count", value: ids.len().to_string() })?;
    let mut infos: Vec<synRetrievedLaunchTensorInfo> =
        ids.iter().map(|&id| synRetrievedLaunchTensorInfo { tensorId: id, ..Default::default() }).collect();
    // SAFETY: `infos` holds exactly `n` entries, each with its `tensorId` set; recipe live.
    check(api, "synTensorRetrieveLaunchInfoById", unsafe {
        (api.syn_tensor_retrieve_launch_info_by_id)(recipe, n, infos.as_mut_ptr())
    })?;
    Ok(infos)
}

/// `synEventMapTensor`: event i is recorded, at a later launch of `recipe` given it, when the
/// tensor of `tensors[i]` (by `tensorId`) is ready. Both slices have the same length.
///
/// # Safety
/// `recipe` and every event must be live; each `tensorName` is null or NUL-terminated.
pub unsafe fn event_map_tensor(
    api: &SynapseApi,
    events: &mut [synEventHandle],
    tensors: &[synLaunchTensorInfo],
    recipe: synRecipeHandle,
) -> Result<()> {
    if events.len() != tensors.len() {
        return Err(Error::SizeMismatch {
            what: "synEventMapTensor events and tensors",
            expected: events.len(),
            got: tensors.len(),
        });
    }
    // SAFETY: both arrays hold `events.len()` entries; handles live by the caller's contract.
    check(api, "synEventMapTensor", unsafe {
        (api.syn_event_map_tensor)(events.as_mut_ptr(), events.len(), tensors.as_ptr(), recipe)
    })
}

/// The value of a device memset and its element width: `synMemsetD8Async`, `D16` or `D32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemsetValue {
    /// One byte per element (`synMemsetD8Async`).
    D8(u8),
    /// Two bytes per element (`synMemsetD16Async`).
    D16(u16),
    /// Four bytes per element (`synMemsetD32Async`).
    D32(u32),
}

/// Enqueues a fill of `count` elements of `value`'s width at device address `addr` on `stream`.
///
/// # Safety
/// `stream` must be live and `[addr, addr + count * width)` inside a live device allocation
/// until the fill runs.
pub unsafe fn memset_async(
    api: &SynapseApi,
    stream: synStreamHandle,
    addr: u64,
    value: MemsetValue,
    count: usize,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        match value {
            MemsetValue::D8(v) => check(api, "synMemsetD8Async", (api.syn_memset_d8_async)(addr, v, count, stream)),
            MemsetValue::D16(v) => check(api, "synMemsetD16Async", (api.syn_memset_d16_async)(addr, v, count, stream)),
            MemsetValue::D32(v) => check(api, "synMemsetD32Async", (api.syn_memset_d32_async)(addr, v, count, stream)),
        }
    }
}

/// `synTensorRetrieveIds`: the ids of the named tensors, in the same order.
///
/// # Safety
/// `recipe` must be live.
pub unsafe fn tensor_ids(api: &SynapseApi, recipe: synRecipeHandle, names: &[CString]) -> Result<Vec<u64>> {
    let ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let n = u32::try_from(names.len())
        .map_err(|_| Error::InvalidArgument { what: "tensor name count", value: names.len().to_string() })?;
    let mut ids = vec![0u64; names.len()];
    // SAFETY: `ptrs` and `ids` both hold `n` elements; the names outlive the call.
    check(api, "synTensorRetrieveIds", unsafe {
        (api.syn_tensor_retrieve_ids)(recipe, ptrs.as_ptr(), ids.as_mut_ptr(), n)
    })?;
    Ok(ids)
}

/// `synLaunchWithExternalEventsExt`.
///
/// # Safety
/// Stream, recipe and events live; every tensor address a live device allocation large enough
/// for its tensor; tensor names (when binding by name) NUL-terminated and alive for the call.
pub unsafe fn launch_ext(
    api: &SynapseApi,
    stream: synStreamHandle,
    tensors: &[synLaunchTensorInfoExt],
    workspace: u64,
    recipe: synRecipeHandle,
    events: &mut [synEventHandle],
    flags: u32,
) -> Result<()> {
    let n = u32::try_from(tensors.len())
        .map_err(|_| Error::InvalidArgument { what: "launch tensor count", value: tensors.len().to_string() })?;
    let ne = u32::try_from(events.len())
        .map_err(|_| Error::InvalidArgument { what: "launch event count", value: events.len().to_string() })?;
    let ev = if events.is_empty() { std::ptr::null_mut() } else { events.as_mut_ptr() };
    // SAFETY: guaranteed by the caller; slice lengths match the counts passed.
    check(api, "synLaunchWithExternalEventsExt", unsafe {
        (api.syn_launch_with_external_events_ext)(stream, tensors.as_ptr(), n, workspace, recipe, ev, ne, flags)
    })
}
