//! Issuing mock collectives: argument validation at call time, group collection
//! (`hcclGroupStart/End`), enqueueing on the mock stream, and the work the stream worker runs.
//!
//! Owns: [`Item`] (one validated collective or point-to-point operation with its device
//! ranges), the thread-local group state, and the execution of a unit of items on a stream
//! worker (copy in, algorithm, copy out, virtual-time end). Must not touch: transports directly
//! (through `Comm`) or stream internals beyond [`Op::Host`].

use std::cell::RefCell;
use std::sync::Arc;

use habana_sys::{hcclDataType_t, hcclRedOp_t, hcclResult_t, synStatus};

use super::algo::{ALPHA_NS, Bufs, Coll, CollKind, cost_ns, run};
use super::comm::{Comm, OpCtx, lookup};
use super::reduce::{Dtype, RedOp};
use super::transport::Kind;
use crate::cabi::raw_to_handle;
use crate::error::HErr;
use crate::memory::DevAlloc;
use crate::state::registry;
use crate::stream::{HostCtx, HostOp, Op, Stream};

/// A validated device range (`len` bytes at `off` in `alloc`).
#[derive(Debug, Clone)]
pub(crate) struct DevRange {
    alloc: Arc<DevAlloc>,
    off: u64,
    len: u64,
}

impl DevRange {
    fn read_into(&self, out: &mut Vec<u8>) -> Result<(), String> {
        let g = self.alloc.lock();
        let Some(b) = g.as_ref() else { return Err("a device buffer was freed before the collective ran".into()) };
        // SAFETY: off + len <= allocation size (checked at enqueue); we hold the allocation lock.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(b.as_ptr().add(self.off as usize), self.len as usize)
        });
        Ok(())
    }

    fn write(&self, data: &[u8]) -> Result<(), String> {
        let g = self.alloc.lock();
        let Some(b) = g.as_ref() else { return Err("a device buffer was freed before the collective ran".into()) };
        let n = data.len().min(self.len as usize);
        // SAFETY: as in `read`; `data` is a host Vec, never overlapping device memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.as_ptr().add(self.off as usize), n) };
        Ok(())
    }
}

/// One operation of a unit.
#[derive(Debug)]
pub(crate) enum Item {
    Coll { coll: Coll, send: Option<DevRange>, recv: Option<DevRange> },
    Send { peer: u32, dtype_code: i32, count: u64, seq: u64, buf: Option<DevRange> },
    Recv { peer: u32, dtype_code: i32, count: u64, seq: u64, buf: Option<DevRange> },
}

/// Resolves the communicator and the stream of a call and binds the comm to the stream's
/// device on first use.
fn resolve(comm: *mut std::ffi::c_void, stream: *mut std::ffi::c_void) -> Result<(Arc<Comm>, Arc<Stream>), HErr> {
    let c = lookup(raw_to_handle(comm as usize))?;
    let r = registry();
    let s = r.stream(raw_to_handle(stream as usize)).map_err(|e| HErr::new(hcclResult_t::INVALID_ARGUMENT, e.msg))?;
    let dev = r.devices.iter().find(|(_, m)| **m == s.module).map_or(-1, |(d, _)| *d as i32);
    drop(r);
    let mut bound = c.device.lock().unwrap_or_else(|e| e.into_inner());
    if *bound == -1 {
        *bound = dev;
    } else if *bound != dev {
        return Err(HErr::new(
            hcclResult_t::INVALID_USAGE,
            format!("communicator is bound to device {}, the stream belongs to device {dev}", *bound),
        ));
    }
    drop(bound);
    Ok((c, s))
}

fn range(module: u32, p: *const std::ffi::c_void, len: u64, what: &str) -> Result<Option<DevRange>, HErr> {
    if len == 0 {
        return Ok(None);
    }
    if p.is_null() {
        return Err(HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("null {what} with {len} bytes")));
    }
    let (alloc, off) = registry()
        .device_range(module, p as u64, len)
        .map_err(|e| HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("{what}: {}", e.msg)))?;
    Ok(Some(DevRange { alloc, off, len }))
}

/// Arguments of a collective call as received from C.
pub(crate) struct CollArgs {
    pub kind: CollKind,
    pub send: *const std::ffi::c_void,
    pub recv: *mut std::ffi::c_void,
    pub count: usize,
    pub dtype: hcclDataType_t,
    pub op: Option<hcclRedOp_t>,
    pub root: i32,
    pub comm: *mut std::ffi::c_void,
    pub stream: *mut std::ffi::c_void,
}

/// Validates a collective and enqueues it (or adds it to the open group).
pub(crate) fn collective(a: CollArgs) -> Result<(), HErr> {
    let (comm, stream) = resolve(a.comm, a.stream)?;
    let e = |(c, m): (hcclResult_t, String)| HErr::new(c, m);
    let dtype = if a.kind == CollKind::Barrier { Dtype::U8 } else { Dtype::from_c(a.dtype).map_err(e)? };
    let op = match a.op {
        Some(o) => RedOp::from_c(o).map_err(e)?,
        None => RedOp::Sum,
    };
    let n = comm.n as u64;
    let needs_root = matches!(a.kind, CollKind::Broadcast | CollKind::Reduce);
    if needs_root && (a.root < 0 || a.root as u64 >= n) {
        return Err(HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("root {} outside 0..{n}", a.root)));
    }
    let count = a.count as u64;
    if a.kind == CollKind::AllToAll && !count.is_multiple_of(n) {
        return Err(HErr::new(
            hcclResult_t::INVALID_ARGUMENT,
            format!("hcclAlltoAll count {count} is not a multiple of the world size {n}"),
        ));
    }
    let (ie, oe) = a.kind.sizes(count, n);
    let sz = dtype.size() as u64;
    let (ib, ob) = (ie.checked_mul(sz), oe.checked_mul(sz));
    let (Some(ib), Some(ob)) = (ib, ob) else {
        return Err(HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("count {count} overflows")));
    };
    let is_root = a.root as u64 == comm.rank as u64;
    let reads = a.kind != CollKind::Broadcast || is_root;
    let writes = a.kind != CollKind::Reduce || is_root;
    let send = if reads { range(stream.module, a.send, ib, "sendbuff")? } else { None };
    let recv = if writes { range(stream.module, a.recv, ob, "recvbuff")? } else { None };
    let seq = comm.coll_seq.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
    let coll = Coll {
        kind: a.kind,
        dtype,
        dtype_code: a.dtype.0,
        op,
        op_code: a.op.map_or(-1, |o| o.0),
        count,
        root: if needs_root { a.root as u32 } else { 0 },
        seq,
    };
    submit(stream, comm, Item::Coll { coll, send, recv })
}

/// Validates a send (`is_send`) or receive and enqueues it (or adds it to the open group).
pub(crate) fn p2p(
    is_send: bool,
    buf: *const std::ffi::c_void,
    count: usize,
    dt: hcclDataType_t,
    peer: i32,
    comm: *mut std::ffi::c_void,
    stream: *mut std::ffi::c_void,
) -> Result<(), HErr> {
    let (comm, stream) = resolve(comm, stream)?;
    let dtype = Dtype::from_c(dt).map_err(|(c, m)| HErr::new(c, m))?;
    if peer < 0 || peer as u32 >= comm.n || peer as u32 == comm.rank {
        return Err(HErr::new(
            hcclResult_t::INVALID_ARGUMENT,
            format!("peer {peer} (rank {} of {})", comm.rank, comm.n),
        ));
    }
    let len = (count as u64).saturating_mul(dtype.size() as u64);
    let buf = range(stream.module, buf, len, if is_send { "sendbuff" } else { "recvbuff" })?;
    let peer = peer as u32;
    let seq = {
        let mut p = comm.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let v = if is_send { &mut p.0 } else { &mut p.1 };
        v[peer as usize] += 1;
        v[peer as usize]
    };
    let (dtype_code, count) = (dt.0, count as u64);
    let item = if is_send {
        Item::Send { peer, dtype_code, count, seq, buf }
    } else {
        Item::Recv { peer, dtype_code, count, seq, buf }
    };
    submit(stream, comm, item)
}

type Pending = Vec<(Arc<Stream>, Arc<Comm>, Item)>;

thread_local! {
    static GROUP: RefCell<(u32, Pending)> = const { RefCell::new((0, Vec::new())) };
}

fn submit(stream: Arc<Stream>, comm: Arc<Comm>, item: Item) -> Result<(), HErr> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push((stream.clone(), comm.clone(), item));
            None
        } else {
            Some(item)
        }
    });
    match queued {
        Some(item) => enqueue(stream, comm, vec![item]),
        None => Ok(()),
    }
}

/// `hcclGroupStart`.
pub(crate) fn group_start() {
    GROUP.with(|g| g.borrow_mut().0 += 1);
}

/// `hcclGroupEnd`: at depth 0, enqueues the collected operations, one unit per (stream, comm)
/// in first-use order. hcclInvalidUsage without a matching start.
pub(crate) fn group_end() -> Result<(), HErr> {
    let items = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(HErr::new(hcclResult_t::INVALID_USAGE, "hcclGroupEnd without hcclGroupStart"));
        }
        g.0 -= 1;
        Ok(if g.0 == 0 { std::mem::take(&mut g.1) } else { Vec::new() })
    })?;
    let mut units: Vec<(Arc<Stream>, Arc<Comm>, Vec<Item>)> = Vec::new();
    for (s, c, it) in items {
        match units.iter_mut().find(|u| u.0.id == s.id && u.1.handle == c.handle) {
            Some(u) => u.2.push(it),
            None => units.push((s, c, vec![it])),
        }
    }
    let mut first_err = None;
    for (s, c, its) in units {
        if let Err(e) = enqueue(s, c, its) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn enqueue(stream: Arc<Stream>, comm: Arc<Comm>, items: Vec<Item>) -> Result<(), HErr> {
    let n = items.len();
    for _ in 0..n {
        comm.op_enqueued();
    }
    let c2 = comm.clone();
    let op = Op::Host(HostOp(Box::new(move |ctx: &HostCtx<'_>| execute(&c2, items, ctx))));
    if !stream.enqueue(op) {
        for _ in 0..n {
            comm.op_finished();
        }
        return Err(HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("stream {:#x} is shut down", stream.id << 6)));
    }
    Ok(())
}

/// Runs a unit on the stream worker: sends first (so grouped send/recv pairs never wait on each
/// other), then the rest in issue order. Returns the modelled duration (virtual time; 0 in real
/// time) or the failure for the stream's sticky error (synFailHccl).
fn execute(comm: &Comm, mut items: Vec<Item>, hc: &HostCtx<'_>) -> Result<u64, (synStatus, String)> {
    let total = items.len();
    items.sort_by_key(|i| !matches!(i, Item::Send { .. }));
    let _x = comm.exec.lock().unwrap_or_else(|e| e.into_inner());
    let mut rx = comm.rx.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = hc.start_ns;
    let mut result = Ok(());
    for it in &items {
        let r = run_item(comm, &mut rx, it, hc, t);
        match r {
            Ok(end) => t = end,
            Err(e) => {
                result = Err((synStatus::FAIL_HCCL, format!("{} ({})", e.msg, e.status)));
                break;
            }
        }
    }
    drop(rx);
    for _ in 0..total {
        comm.op_finished();
    }
    result.map(|()| if hc.virtual_time { t - hc.start_ns } else { 0 })
}

fn run_item(comm: &Comm, rx: &mut super::transport::Rx, it: &Item, hc: &HostCtx<'_>, t: u64) -> Result<u64, HErr> {
    let io = |r: Result<(), String>| r.map_err(|m| HErr::new(hcclResult_t::INVALID_ARGUMENT, m));
    match it {
        Item::Coll { coll, send, recv } => {
            let ctx = OpCtx { seq: Some(coll.seq), name: coll.kind.name(), stream_abort: hc.abort };
            let direct = coll.kind == CollKind::AllReduce && coll.dtype.size() == coll.dtype.acc_size();
            if direct && let (Some(s), Some(r)) = (send, recv) {
                let max_start = direct_all_reduce(comm, rx, &ctx, coll, t, s, r)?;
                return Ok(max_start + cost_ns(coll, comm.n, comm.bandwidth_gbps));
            }
            let mut scratch = comm.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (input, output) = &mut *scratch;
            input.clear();
            if let Some(s) = send {
                s.read_into(input).map_err(|m| comm.fail(&ctx, hcclResult_t::INVALID_ARGUMENT, m))?;
            }
            let max_start = run(comm, rx, &ctx, coll, t, Bufs::Scratch { input, output })?;
            if let Some(r) = recv {
                io(r.write(output))?;
            }
            Ok(max_start + cost_ns(coll, comm.n, comm.bandwidth_gbps))
        }
        Item::Send { peer, dtype_code, count, seq, buf } => {
            let ctx = OpCtx { seq: None, name: "hcclSend", stream_abort: hc.abort };
            comm.check(rx, &ctx)?;
            let mut p = Vec::new();
            for v in [*seq, *dtype_code as i64 as u64, *count, t] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            if let Some(b) = buf {
                b.read_into(&mut p).map_err(|m| comm.fail(&ctx, hcclResult_t::INVALID_ARGUMENT, m))?;
            }
            let bytes = p.len() - 32;
            comm.send(rx, &ctx, *peer, Kind::P2p, *seq, p)?;
            Ok(t + p2p_cost(bytes, comm.bandwidth_gbps))
        }
        Item::Recv { peer, dtype_code, count, seq, buf } => {
            let ctx = OpCtx { seq: None, name: "hcclRecv", stream_abort: hc.abort };
            let p = comm.recv(rx, &ctx, *peer, Kind::P2p, *seq)?;
            let f =
                |i: usize| p.get(i * 8..i * 8 + 8).map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().expect("8")));
            if f(1) != *dtype_code as i64 as u64 || f(2) != *count {
                let msg = format!(
                    "lockstep mismatch: rank {peer} sent datatype={} count={}, this rank receives datatype={dtype_code} count={count}",
                    f(1) as i64,
                    f(2)
                );
                return Err(comm.fail(&ctx, hcclResult_t::INVALID_USAGE, msg));
            }
            if let Some(b) = buf {
                io(b.write(&p[32..]))?;
            }
            Ok(t.max(f(3)) + p2p_cost(p.len() - 32, comm.bandwidth_gbps))
        }
    }
}

/// All-reduce directly in the receive allocation: the send range is copied into it first
/// (under both allocation locks, taken in address order like device-to-device copies), then
/// only the receive allocation stays locked while the ring runs (a copy or free touching it
/// waits for the collective, as for a kernel).
fn direct_all_reduce(
    comm: &Comm,
    rx: &mut super::transport::Rx,
    ctx: &OpCtx<'_>,
    coll: &Coll,
    t: u64,
    s: &DevRange,
    r: &DevRange,
) -> Result<u64, HErr> {
    let freed =
        || comm.fail(ctx, hcclResult_t::INVALID_ARGUMENT, "a device buffer was freed before the collective ran".into());
    let len = r.len as usize;
    let rg = if Arc::ptr_eq(&s.alloc, &r.alloc) {
        let g = r.alloc.lock();
        let Some(b) = g.as_ref() else { return Err(freed()) };
        if s.off != r.off {
            // SAFETY: both ranges lie in this allocation (checked at enqueue); lock held;
            // `copy` allows overlap.
            unsafe { std::ptr::copy(b.as_ptr().add(s.off as usize), b.as_ptr().add(r.off as usize), len) };
        }
        g
    } else {
        let (sg, rg) = if s.alloc.base < r.alloc.base {
            let a = s.alloc.lock();
            (a, r.alloc.lock())
        } else {
            let b = r.alloc.lock();
            (s.alloc.lock(), b)
        };
        let (Some(sb), Some(rb)) = (sg.as_ref(), rg.as_ref()) else { return Err(freed()) };
        // SAFETY: distinct allocations, ranges checked at enqueue, both locks held.
        unsafe { std::ptr::copy_nonoverlapping(sb.as_ptr().add(s.off as usize), rb.as_ptr().add(r.off as usize), len) };
        drop(sg);
        rg
    };
    let Some(rb) = rg.as_ref() else { return Err(freed()) };
    // SAFETY: [off, off + len) lies in the allocation (checked at enqueue); its lock `rg` is
    // held until this function returns, so nothing else touches these bytes meanwhile.
    let buf = unsafe { std::slice::from_raw_parts_mut(rb.as_ptr().add(r.off as usize), len) };
    run(comm, rx, ctx, coll, t, Bufs::InPlace(buf))
}

fn p2p_cost(bytes: usize, bw: f64) -> u64 {
    (ALPHA_NS + bytes as f64 / bw).round() as u64
}
