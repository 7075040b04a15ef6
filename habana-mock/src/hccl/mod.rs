//! HCCL entries of the mock table: communicators and collectives of the CPU mock device, across
//! threads of one process and across processes on one host.
//!
//! Owns: the `hccl*` `extern "C"` functions (pointer checks; fault injection, caught panics and
//! the thread-local HCCL last error come from the shared guard of `cabi.rs`) and the submodules: `id` (unique id, coordinator, rendezvous), `transport`
//! (frames, in-process channels, TCP), `comm` (communicators, async errors, abort/destroy),
//! `algo` (lockstep header, ring algorithms, virtual-time cost), `shm` (direct shared-memory
//! all-reduce when every rank is in this process) on a `meet` (rendezvous of those ranks), `reduce` (dtypes, ops),
//! `enqueue` (validation, groups, stream work). Must not touch: the Synapse state beyond
//! looking up streams and device ranges, and adding [`crate::stream`] host operations.
//!
//! # C-ABI behaviour (what a safe wrapper can rely on)
//! - Unique id: see `id.rs` (magic "DCMOCKID", version, 128-bit token, coordinator `IP:PORT`;
//!   `length` = bytes used). `hcclGetUniqueId` starts the coordinator (bound to `HCCL_COMM_ID`
//!   if set, else 127.0.0.1 with an ephemeral port) in the calling process; keep that process
//!   alive until every rank finished `hcclCommInitRank`. An id of length 0 with `HCCL_COMM_ID`
//!   set: rank 0 hosts the coordinator there, others connect.
//! - Timeout: [`ENV_TIMEOUT_MS`] if set, else `MockConfig::hccl_timeout_ms` (default 30 s), read
//!   at `hcclCommInitRank`; it bounds init and, per collective, the wait for each expected
//!   message (a progress timeout, so large transfers are not cut short).
//! - Synchronous errors (return value + `hcclGetLastErrorMessage`, thread-local, NULL until
//!   the first failure on the thread): hcclInvalidArgument (null/unknown comm or stream, bad
//!   ranges, unknown dtype/op, root/peer out of range, nranks < 1, rank out of range, bad id),
//!   hcclUnsupported (hcclProd, hcclAvg), hcclInvalidUsage (nranks disagreement, duplicate rank,
//!   wrong token, group end without start, hcclCommInitAll "not implemented"), hcclSocketError
//!   (init timeout: "init timed out: K of N ranks joined (joined [..], missing [..])").
//! - Collectives return after enqueue; results are valid after stream/event synchronization.
//!   On failure the stream gets the sticky error synFailHccl (40) and the communicator the
//!   asynchronous error (`hcclCommGetAsyncError` returns hcclSuccess and fills it;
//!   `hcclCommGetAsyncErrorMessage` gives "rank R: <op> seq S failed: <why>"):
//!   - peers disagree on (seq, op, datatype, count, root, reduceOp), or a peer is in another
//!     operation: hcclInvalidUsage on every rank, "lockstep mismatch: rank 0 has count=7,
//!     rank 2 has count=8";
//!   - a peer died (process killed, comm destroyed or aborted, connection closed):
//!     hcclSocketError "peer rank P is gone (...)" on the ranks waiting for it, and its
//!     failure is relayed to every other rank (same code and message);
//!   - nothing arrived within the timeout: hcclInternalError "timed out after T ms waiting
//!     for rank P", relayed likewise;
//!   - after any of these the communicator is broken: later operations fail at once with the
//!     same code ("communicator has an asynchronous error: ..."). Abort it.
//! - `hcclCommAbort` never blocks: it closes the links (blocked peers wake with
//!   hcclSocketError) and forgets the handle; queued operations fail. `hcclCommDestroy` waits up
//!   to the timeout for the comm's queued operations, then does the same (hcclInternalError
//!   if some were still queued).
//! - Data types: f32, bf16, f16, i32, u32 (Habana's list) and also i8, u8, i64, u64, f64; ops
//!   Sum, Min (2), Max (3). bf16/f16 sums accumulate in f32 (see `reduce.rs`). Results are
//!   bitwise identical on all ranks. `hcclAlltoAll`'s count is the total per buffer (a
//!   multiple of the world size; block i goes to rank i; vendor semantics unverified).
//! - While an all-reduce of f32/int types runs, its receive allocation is locked (it is
//!   reduced in place there): a copy touching it or synDeviceFree of it waits for the
//!   collective (bounded by the timeout), as for a kernel. Other collectives stage host copies.
//!   When every rank lives in this process (and no fault is armed) such an all-reduce (and the
//!   scratch-staged f32/int one) runs directly on the ranks' buffers (`shm.rs`): each rank
//!   reduces its 1/n segment in rank order, then copies the others' segments; across processes
//!   it runs the TCP ring. Either way each element is rounded once, by one rank.
//! - The coordinator thread of `hcclGetUniqueId` ends when its rendezvous completes, or
//!   timeout + 5 s after the first join, or after 1 h.
//! - Send/recv match by peer and issue order; outside a group they are still only enqueued
//!   (the mock never blocks the caller), inside a group sends run first.
#![allow(clippy::missing_safety_doc)]

mod algo;
mod comm;
mod enqueue;
mod id;
mod meet;
mod reduce;
mod shm;
mod shm_procs;
mod shm_region;
mod transport;

use std::ffi::{CStr, c_char, c_int, c_void};

use habana_sys::{HCCL_VERSION_CODE, hcclComm_t, hcclDataType_t, hcclRedOp_t, hcclResult_t, hcclUniqueId};

use crate::cabi::{catch_or, guard, h, handle_to_raw, out};
pub use crate::config::ENV_TIMEOUT_MS;
use crate::error::HErr;
use crate::last_error;
use algo::CollKind;
use enqueue::CollArgs;
pub use id::{ENV_COMM_ID, ID_MAGIC, ID_VERSION};

fn comm_of(c: hcclComm_t) -> Result<std::sync::Arc<comm::Comm>, HErr> {
    comm::lookup(h(c))
}

/// Arms the `HcclKillRank` fault.
pub(crate) fn arm_kill(rank: u32, abort_process: bool) {
    *algo::KILL.lock().unwrap_or_else(|e| e.into_inner()) = Some((rank, abort_process));
}

/// Disarms the `HcclKillRank` fault.
pub(crate) fn disarm_kill() {
    *algo::KILL.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Applies the `HcclAsyncError` fault.
pub(crate) fn inject_async_error(code: i32) {
    comm::inject_async_error(code);
}

/// Writes HCCL_VERSION_CODE; null → hcclInvalidArgument.
pub unsafe extern "C" fn hccl_get_version(version: *mut c_int) -> hcclResult_t {
    // SAFETY: out-pointer per the caller's contract.
    guard("hcclGetVersion", || unsafe { out(version, HCCL_VERSION_CODE) })
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

/// This thread's last HCCL error message ("<function>: <why>"), NULL if no HCCL call failed on
/// this thread yet. Valid until the next failing HCCL call on this thread.
pub unsafe extern "C" fn hccl_get_last_error_message() -> *const c_char {
    last_error::message_ptr::<hcclResult_t>().unwrap_or(std::ptr::null())
}

/// The communicator's asynchronous error message ("" when none, "unknown communicator" for an
/// invalid handle). Valid while the communicator lives.
/// A panic in the mock (never expected) gives "internal error (panic) in the CPU mock".
pub unsafe extern "C" fn hccl_comm_get_async_error_message(c: hcclComm_t) -> *const c_char {
    catch_or(c"internal error (panic) in the CPU mock".as_ptr(), || match comm_of(c) {
        Ok(c) => {
            c.poll_idle();
            c.async_error_ptr()
        }
        Err(_) => c"unknown communicator".as_ptr(),
    })
}

/// Creates a unique id and starts its coordinator in this process.
pub unsafe extern "C" fn hccl_get_unique_id(id: *mut hcclUniqueId) -> hcclResult_t {
    guard("hcclGetUniqueId", || {
        if id.is_null() {
            return Err(HErr::new(hcclResult_t::INVALID_ARGUMENT, "null uniqueId"));
        }
        // HCCL_COMM_ID parsed as the vendor library parses it (habana_sys::comm_id).
        let bind = match std::env::var(ENV_COMM_ID) {
            Ok(v) => habana_sys::comm_id::parse_comm_id(&v)
                .map_err(|e| HErr::new(hcclResult_t::INVALID_ARGUMENT, e.to_string()))?
                .to_string(),
            Err(_) => "127.0.0.1:0".into(),
        };
        let (timeout, _) = comm::settings();
        let m = id::start_coordinator(&bind, rand::random(), timeout)?;
        // SAFETY: non-null, valid for a write by the caller's contract.
        unsafe { out(id, m.encode()) }
    })
}

/// Joins communicator `id` as `rank` of `nranks`; blocks until all joined or the timeout.
pub unsafe extern "C" fn hccl_comm_init_rank(
    comm: *mut hcclComm_t,
    nranks: c_int,
    id: hcclUniqueId,
    rank: c_int,
) -> hcclResult_t {
    guard("hcclCommInitRank", || {
        if comm.is_null() {
            return Err(HErr::new(hcclResult_t::INVALID_ARGUMENT, "null comm pointer"));
        }
        let h = comm::init_rank(nranks, &id, rank)?;
        // SAFETY: non-null, valid for a write by the caller's contract.
        unsafe { out(comm, handle_to_raw(h) as hcclComm_t) }
    })
}

/// hcclInvalidUsage "not implemented", as the vendor library.
pub unsafe extern "C" fn hccl_comm_init_all(_c: *mut hcclComm_t, _n: c_int, _d: *const c_int) -> hcclResult_t {
    guard("hcclCommInitAll", || Err(HErr::new(hcclResult_t::INVALID_USAGE, "not implemented (as in Habana's HCCL)")))
}

/// Validates the handle; nothing else to do.
pub unsafe extern "C" fn hccl_comm_finalize(c: hcclComm_t) -> hcclResult_t {
    guard("hcclCommFinalize", || comm_of(c).map(|_| ()))
}

/// Waits (bounded) for queued operations, then frees the communicator.
pub unsafe extern "C" fn hccl_comm_destroy(c: hcclComm_t) -> hcclResult_t {
    guard("hcclCommDestroy", || comm::destroy(h(c)))
}

/// Frees the communicator at once, waking blocked peers and workers with errors.
pub unsafe extern "C" fn hccl_comm_abort(c: hcclComm_t) -> hcclResult_t {
    guard("hcclCommAbort", || comm::abort(h(c)))
}

/// Fills the asynchronous error (hcclSuccess when none) and returns hcclSuccess.
pub unsafe extern "C" fn hccl_comm_get_async_error(c: hcclComm_t, e: *mut hcclResult_t) -> hcclResult_t {
    guard("hcclCommGetAsyncError", || {
        let c = comm_of(c)?;
        c.poll_idle();
        let code = c.async_error().map_or(hcclResult_t::SUCCESS, |(code, _)| code);
        // SAFETY: out-pointer per the caller's contract.
        unsafe { out(e, code) }
    })
}

/// The world size.
pub unsafe extern "C" fn hccl_comm_count(c: hcclComm_t, count: *mut c_int) -> hcclResult_t {
    // SAFETY: out-pointer per the caller's contract.
    guard("hcclCommCount", || unsafe { out(count, comm_of(c)?.n as c_int) })
}

/// The synDeviceId of the communicator's device: the only acquired device of the process at
/// init, else the device of the first stream used with it (-1 before that).
pub unsafe extern "C" fn hccl_comm_syn_device(c: hcclComm_t, d: *mut c_int) -> hcclResult_t {
    guard("hcclCommSynDevice", || {
        let dev = *comm_of(c)?.device.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: out-pointer per the caller's contract.
        unsafe { out(d, dev) }
    })
}

/// This rank.
pub unsafe extern "C" fn hccl_comm_user_rank(c: hcclComm_t, r: *mut c_int) -> hcclResult_t {
    // SAFETY: out-pointer per the caller's contract.
    guard("hcclCommUserRank", || unsafe { out(r, comm_of(c)?.rank as c_int) })
}

#[allow(clippy::too_many_arguments)]
fn coll(
    name: &'static str,
    kind: CollKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: hcclDataType_t,
    op: Option<hcclRedOp_t>,
    root: c_int,
    comm: hcclComm_t,
    stream: *mut c_void,
) -> hcclResult_t {
    guard(name, || enqueue::collective(CollArgs { kind, send, recv, count, dtype, op, root, comm, stream }))
}

/// Enqueues an all-reduce of `n` elements on the mock stream `st`.
pub unsafe extern "C" fn hccl_all_reduce(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    op: hcclRedOp_t,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    coll("hcclAllReduce", CollKind::AllReduce, s, r, n, t, Some(op), 0, comm, st)
}

/// Enqueues a reduce-scatter (`n` = elements received per rank).
pub unsafe extern "C" fn hccl_reduce_scatter(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    op: hcclRedOp_t,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    coll("hcclReduceScatter", CollKind::ReduceScatter, s, r, n, t, Some(op), 0, comm, st)
}

/// Enqueues an all-gather (`n` = elements sent per rank).
pub unsafe extern "C" fn hccl_all_gather(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    coll("hcclAllGather", CollKind::AllGather, s, r, n, t, None, 0, comm, st)
}

/// Enqueues a broadcast from `root` (sendbuff read on the root only).
pub unsafe extern "C" fn hccl_broadcast(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    root: c_int,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    coll("hcclBroadcast", CollKind::Broadcast, s, r, n, t, None, root, comm, st)
}

/// Enqueues a reduce to `root` (recvbuff written on the root only).
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hccl_reduce(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    op: hcclRedOp_t,
    root: c_int,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    coll("hcclReduce", CollKind::Reduce, s, r, n, t, Some(op), root, comm, st)
}

/// Enqueues an all-to-all (`n` = total elements per buffer, a multiple of the world size).
pub unsafe extern "C" fn hccl_all_to_all(
    s: *const c_void,
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    coll("hcclAlltoAll", CollKind::AllToAll, s, r, n, t, None, 0, comm, st)
}

/// Enqueues a barrier (complete on the stream once every rank reached it).
pub unsafe extern "C" fn hccl_barrier(comm: hcclComm_t, st: *mut c_void) -> hcclResult_t {
    let none = std::ptr::null_mut();
    coll("hcclBarrier", CollKind::Barrier, none, none, 0, hcclDataType_t(0), None, 0, comm, st)
}

/// Enqueues a send of `n` elements to `peer`.
pub unsafe extern "C" fn hccl_send(
    s: *const c_void,
    n: usize,
    t: hcclDataType_t,
    peer: c_int,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    guard("hcclSend", || enqueue::p2p(true, s, n, t, peer, comm, st))
}

/// Enqueues a receive of `n` elements from `peer`.
pub unsafe extern "C" fn hccl_recv(
    r: *mut c_void,
    n: usize,
    t: hcclDataType_t,
    peer: c_int,
    comm: hcclComm_t,
    st: *mut c_void,
) -> hcclResult_t {
    guard("hcclRecv", || enqueue::p2p(false, r, n, t, peer, comm, st))
}

/// Opens a group (thread-local depth).
pub unsafe extern "C" fn hccl_group_start() -> hcclResult_t {
    guard("hcclGroupStart", || {
        enqueue::group_start();
        Ok(())
    })
}

/// Closes a group; at depth 0 enqueues its operations.
pub unsafe extern "C" fn hccl_group_end() -> hcclResult_t {
    guard("hcclGroupEnd", enqueue::group_end)
}

/// No-op success (the mock needs no per-device HCCL initialisation).
pub unsafe extern "C" fn hccl_device_init(_device: *mut c_void, _context: *mut c_void) -> hcclResult_t {
    guard("hcclDeviceInit", || Ok(()))
}
