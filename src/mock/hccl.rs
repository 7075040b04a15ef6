//! HCCL entries of the mock table. Collectives are not implemented yet (a later issue): every
//! `hccl*` function returns hcclUnsupported, except hcclGetVersion, hcclGetErrorString and
//! hcclGetLastErrorMessage.
//!
//! Owns: these placeholders only; the collectives implementation replaces this file. Must not
//! touch: the Synapse state.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_void};

use habana_sys::{HCCL_VERSION_CODE, hcclComm_t, hcclDataType_t, hcclRedOp_t, hcclResult_t, hcclUniqueId};

/// What hcclGetLastErrorMessage reports.
pub const UNSUPPORTED_MESSAGE: &CStr = c"CPU mock collectives are not implemented yet";

/// Writes HCCL_VERSION_CODE; null → hcclInvalidArgument.
pub unsafe extern "C" fn hccl_get_version(version: *mut c_int) -> hcclResult_t {
    if version.is_null() {
        return hcclResult_t::INVALID_ARGUMENT;
    }
    // SAFETY: non-null; valid for a write by the caller's contract.
    unsafe { version.write(HCCL_VERSION_CODE) };
    hcclResult_t::SUCCESS
}

/// A static string per result code.
pub unsafe extern "C" fn hccl_get_error_string(result: hcclResult_t) -> *const c_char {
    let s: &CStr = match result {
        hcclResult_t::UNINITIALIZED => c"uninitialized",
        hcclResult_t::SUCCESS => c"no error",
        hcclResult_t::NO_DEVICE_FOUND => c"no device found",
        hcclResult_t::UNSUPPORTED => c"unsupported operation",
        hcclResult_t::OUT_OF_MEMORY => c"out of memory",
        hcclResult_t::UNHANDLED_SYNAPSE_ERROR => c"unhandled synapse error",
        hcclResult_t::SYSTEM_ERROR => c"unhandled system error",
        hcclResult_t::INTERNAL_ERROR => c"internal error",
        hcclResult_t::INVALID_ARGUMENT => c"invalid argument",
        hcclResult_t::INVALID_USAGE => c"invalid usage",
        hcclResult_t::SOCKET_ERROR => c"socket error",
        hcclResult_t::LIBFABRIC_ERROR => c"libfabric error",
        hcclResult_t::TRY_AGAIN_ERROR => c"try again",
        hcclResult_t::BUSY => c"busy",
        hcclResult_t::STREAM_ERROR => c"stream error",
        hcclResult_t::SYNAPSE_TERMINATED => c"synapse terminated",
        hcclResult_t::PORT_DOWN => c"port down",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// Always [`UNSUPPORTED_MESSAGE`].
pub unsafe extern "C" fn hccl_get_last_error_message() -> *const c_char {
    UNSUPPORTED_MESSAGE.as_ptr()
}

/// Always [`UNSUPPORTED_MESSAGE`].
pub unsafe extern "C" fn hccl_comm_get_async_error_message(_comm: hcclComm_t) -> *const c_char {
    UNSUPPORTED_MESSAGE.as_ptr()
}

macro_rules! unsupported {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        /// Not implemented by the CPU mock yet: hcclUnsupported.
        pub unsafe extern "C" fn $name($(_: $ty),*) -> hcclResult_t {
            hcclResult_t::UNSUPPORTED
        }
    )*};
}

unsupported! {
    hccl_get_unique_id(id: *mut hcclUniqueId);
    hccl_comm_init_rank(comm: *mut hcclComm_t, n: c_int, id: hcclUniqueId, rank: c_int);
    hccl_comm_init_all(comm: *mut hcclComm_t, n: c_int, devs: *const c_int);
    hccl_comm_finalize(comm: hcclComm_t);
    hccl_comm_destroy(comm: hcclComm_t);
    hccl_comm_abort(comm: hcclComm_t);
    hccl_comm_get_async_error(comm: hcclComm_t, e: *mut hcclResult_t);
    hccl_comm_count(comm: hcclComm_t, c: *mut c_int);
    hccl_comm_syn_device(comm: hcclComm_t, d: *mut c_int);
    hccl_comm_user_rank(comm: hcclComm_t, r: *mut c_int);
    hccl_all_reduce(s: *const c_void, r: *mut c_void, n: usize, t: hcclDataType_t, op: hcclRedOp_t, comm: hcclComm_t, st: *mut c_void);
    hccl_reduce_scatter(s: *const c_void, r: *mut c_void, n: usize, t: hcclDataType_t, op: hcclRedOp_t, comm: hcclComm_t, st: *mut c_void);
    hccl_all_gather(s: *const c_void, r: *mut c_void, n: usize, t: hcclDataType_t, comm: hcclComm_t, st: *mut c_void);
    hccl_broadcast(s: *const c_void, r: *mut c_void, n: usize, t: hcclDataType_t, root: c_int, comm: hcclComm_t, st: *mut c_void);
    hccl_reduce(s: *const c_void, r: *mut c_void, n: usize, t: hcclDataType_t, op: hcclRedOp_t, root: c_int, comm: hcclComm_t, st: *mut c_void);
    hccl_all_to_all(s: *const c_void, r: *mut c_void, n: usize, t: hcclDataType_t, comm: hcclComm_t, st: *mut c_void);
    hccl_barrier(comm: hcclComm_t, st: *mut c_void);
    hccl_send(s: *const c_void, n: usize, t: hcclDataType_t, peer: c_int, comm: hcclComm_t, st: *mut c_void);
    hccl_recv(r: *mut c_void, n: usize, t: hcclDataType_t, peer: c_int, comm: hcclComm_t, st: *mut c_void);
    hccl_group_start();
    hccl_group_end();
    hccl_device_init(device: *mut c_void, context: *mut c_void);
}
