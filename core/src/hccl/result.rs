//! The thin result tier over the `hccl*` functions of the table: Rust names, every call returns
//! a [`Result`], `unsafe` where the C contract needs live handles.
//!
//! Owns: status checking and out-parameters. Must not touch: lifetimes or policy (`comm.rs`).

use std::ffi::{CStr, c_int, c_void};

use habana_sys::{SynapseApi, hcclComm_t, hcclDataType_t, hcclRedOp_t, hcclResult_t, hcclUniqueId};

use super::error::{HcclError, Result};

/// `hcclGetErrorString`, copied.
pub fn describe(api: &SynapseApi, code: hcclResult_t) -> String {
    // SAFETY: returns a static NUL-terminated string or null for any code.
    let p = unsafe { (api.hccl_get_error_string)(code) };
    if p.is_null() {
        return code.name().unwrap_or("unknown result").to_string();
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn c_message(p: *const std::ffi::c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the library returns a NUL-terminated string valid until its next call on this
    // thread (or on this communicator); we copy it at once.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}

/// Turns a result code into a `Result`, with the description and the last error message.
pub fn check(api: &SynapseApi, call: &'static str, code: hcclResult_t) -> Result<()> {
    if code.is_success() {
        return Ok(());
    }
    // SAFETY: the optional function takes no arguments and returns a thread-local string.
    let message = api.hccl_get_last_error_message.and_then(|f| c_message(unsafe { f() }));
    Err(HcclError::Hccl { call, code, description: describe(api, code), message })
}

/// `hcclGetUniqueId`.
pub fn get_unique_id(api: &SynapseApi) -> Result<hcclUniqueId> {
    let mut id = hcclUniqueId::default();
    // SAFETY: valid out-pointer to the documented 1032-byte struct.
    check(api, "hcclGetUniqueId", unsafe { (api.hccl_get_unique_id)(&mut id) })?;
    Ok(id)
}

/// `hcclCommInitRank` (blocks until every rank joined).
pub fn comm_init_rank(api: &SynapseApi, world_size: u32, id: hcclUniqueId, rank: u32) -> Result<hcclComm_t> {
    let mut comm: hcclComm_t = std::ptr::null_mut();
    let n = c_int::try_from(world_size)
        .map_err(|_| HcclError::InvalidArgument { what: "world size", value: world_size.to_string() })?;
    let r = c_int::try_from(rank).map_err(|_| HcclError::InvalidArgument { what: "rank", value: rank.to_string() })?;
    // SAFETY: valid out-pointer; the id is passed by value as the prototype requires.
    check(api, "hcclCommInitRank", unsafe { (api.hccl_comm_init_rank)(&mut comm, n, id, r) })?;
    Ok(comm)
}

/// `hcclCommDestroy`.
///
/// # Safety
/// `comm` must be live and not used afterwards.
pub unsafe fn comm_destroy(api: &SynapseApi, comm: hcclComm_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "hcclCommDestroy", unsafe { (api.hccl_comm_destroy)(comm) })
}

/// `hcclCommAbort` (the vendor's implementation just destroys).
///
/// # Safety
/// `comm` must be live and not used afterwards.
pub unsafe fn comm_abort(api: &SynapseApi, comm: hcclComm_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check(api, "hcclCommAbort", unsafe { (api.hccl_comm_abort)(comm) })
}

/// `hcclCommGetAsyncError`: the communicator's asynchronous error code (success when none),
/// with `hcclCommGetAsyncErrorMessage` when exported.
///
/// # Safety
/// `comm` must be live.
pub unsafe fn comm_async_error(api: &SynapseApi, comm: hcclComm_t) -> Result<(hcclResult_t, Option<String>)> {
    let mut err = hcclResult_t::SUCCESS;
    // SAFETY: guaranteed by the caller; valid out-pointer.
    check(api, "hcclCommGetAsyncError", unsafe { (api.hccl_comm_get_async_error)(comm, &mut err) })?;
    if err.is_success() {
        return Ok((err, None));
    }
    // SAFETY: live comm; the message is copied at once.
    let msg = api.hccl_comm_get_async_error_message.and_then(|f| c_message(unsafe { f(comm) }));
    Ok((err, msg))
}

/// `hcclGroupStart`.
pub fn group_start(api: &SynapseApi) -> Result<()> {
    // SAFETY: no arguments.
    check(api, "hcclGroupStart", unsafe { (api.hccl_group_start)() })
}

/// `hcclGroupEnd`.
pub fn group_end(api: &SynapseApi) -> Result<()> {
    // SAFETY: no arguments.
    check(api, "hcclGroupEnd", unsafe { (api.hccl_group_end)() })
}

/// One collective call, described for [`enqueue`].
///
/// Addresses (`send`, `recv`, `buf`) are device addresses from `synDeviceMalloc` on the
/// communicator's device; `send == recv` is the in-place form. Counts are in elements of the
/// `hcclDataType_t` given to [`enqueue`], never bytes, as in `hccl.h` (NCCL semantics). Ranks
/// (`root`, `peer`) are positions in the communicator, `0..world_size`.
#[derive(Debug, Clone, Copy)]
pub enum Call {
    /// `hcclAllReduce(send, recv, count, ..)`.
    AllReduce {
        /// Device address of the `count` input elements.
        send: u64,
        /// Device address of the `count` output elements (may equal `send`).
        recv: u64,
        /// Elements per rank, the same on every rank.
        count: usize,
        /// Reduction; the HCCL documentation says `hcclProd` and `hcclAvg` are not supported.
        op: hcclRedOp_t,
    },
    /// `hcclReduceScatter(send, recv, recvcount, ..)`.
    ReduceScatter {
        /// Device address of the `recv_count * world_size` input elements.
        send: u64,
        /// Device address of this rank's `recv_count` reduced elements.
        recv: u64,
        /// Elements each rank receives (`recvcount`).
        recv_count: usize,
        /// Reduction; the HCCL documentation says `hcclProd` and `hcclAvg` are not supported.
        op: hcclRedOp_t,
    },
    /// `hcclAllGather(send, recv, sendcount, ..)`.
    AllGather {
        /// Device address of this rank's `send_count` elements.
        send: u64,
        /// Device address of the `send_count * world_size` gathered elements, in rank order.
        recv: u64,
        /// Elements each rank contributes (`sendcount`).
        send_count: usize,
    },
    /// `hcclBroadcast(send, recv, count, root, ..)`.
    Broadcast {
        /// Device address of the `count` elements sent; read on `root` only.
        send: u64,
        /// Device address of the `count` elements received on every rank (may equal `send`).
        recv: u64,
        /// Elements broadcast.
        count: usize,
        /// Rank whose `send` buffer is broadcast.
        root: c_int,
    },
    /// `hcclReduce(send, recv, count, op, root, ..)`.
    Reduce {
        /// Device address of the `count` input elements.
        send: u64,
        /// Device address of the `count` reduced elements; written on `root` only.
        recv: u64,
        /// Elements per rank, the same on every rank.
        count: usize,
        /// Reduction; the HCCL documentation says `hcclProd` and `hcclAvg` are not supported.
        op: hcclRedOp_t,
        /// Rank that receives the result.
        root: c_int,
    },
    /// `hcclSend(buf, count, peer, ..)`: point-to-point; `peer` must enqueue the matching
    /// [`Call::Recv`].
    Send {
        /// Device address of the `count` elements sent.
        buf: u64,
        /// Elements sent.
        count: usize,
        /// Receiving rank.
        peer: c_int,
    },
    /// `hcclRecv(buf, count, peer, ..)`: point-to-point; `peer` must enqueue the matching
    /// [`Call::Send`].
    Recv {
        /// Device address of the `count` elements received.
        buf: u64,
        /// Elements received.
        count: usize,
        /// Sending rank.
        peer: c_int,
    },
}

impl Call {
    /// The C function's name.
    pub fn c_name(&self) -> &'static str {
        match self {
            Call::AllReduce { .. } => "hcclAllReduce",
            Call::ReduceScatter { .. } => "hcclReduceScatter",
            Call::AllGather { .. } => "hcclAllGather",
            Call::Broadcast { .. } => "hcclBroadcast",
            Call::Reduce { .. } => "hcclReduce",
            Call::Send { .. } => "hcclSend",
            Call::Recv { .. } => "hcclRecv",
        }
    }
}

/// Enqueues one collective on `stream` (device addresses are passed as `void*`, as HCCL takes
/// them).
///
/// # Safety
/// `comm` and `stream` live; every address a live device allocation of the right size on the
/// communicator's device.
pub unsafe fn enqueue(
    api: &SynapseApi,
    comm: hcclComm_t,
    stream: *mut c_void,
    dtype: hcclDataType_t,
    call: Call,
) -> Result<()> {
    let p = |a: u64| a as *mut c_void;
    // SAFETY: guaranteed by the caller; the arguments follow each prototype of hccl.h 1.21.
    let code = unsafe {
        match call {
            Call::AllReduce { send, recv, count, op } => {
                (api.hccl_all_reduce)(p(send), p(recv), count, dtype, op, comm, stream)
            }
            Call::ReduceScatter { send, recv, recv_count, op } => {
                (api.hccl_reduce_scatter)(p(send), p(recv), recv_count, dtype, op, comm, stream)
            }
            Call::AllGather { send, recv, send_count } => {
                (api.hccl_all_gather)(p(send), p(recv), send_count, dtype, comm, stream)
            }
            Call::Broadcast { send, recv, count, root } => {
                (api.hccl_broadcast)(p(send), p(recv), count, dtype, root, comm, stream)
            }
            Call::Reduce { send, recv, count, op, root } => {
                (api.hccl_reduce)(p(send), p(recv), count, dtype, op, root, comm, stream)
            }
            Call::Send { buf, count, peer } => (api.hccl_send)(p(buf), count, dtype, peer, comm, stream),
            Call::Recv { buf, count, peer } => (api.hccl_recv)(p(buf), count, dtype, peer, comm, stream),
        }
    };
    check(api, call.c_name(), code)
}
