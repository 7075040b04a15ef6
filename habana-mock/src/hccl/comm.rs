//! Communicators of the mock collectives: creation (`hcclCommInitRank`), the handle map, the
//! sticky asynchronous error, failure propagation, abort and destroy.
//!
//! Owns: [`Comm`] and the process-global map from handle ids to communicators, the receive
//! policy ([`Comm::recv`]: progress timeout, peer failures, aborts). Must not touch: the
//! Synapse registry (only for a fresh handle id) or stream internals.

use std::collections::HashMap;
use std::ffi::CString;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use habana_sys::hcclResult_t;

use super::id::{ENV_COMM_ID, MockId, PeerInfo, connect_mesh, rendezvous, start_coordinator};
use super::transport::{
    Frame, Kind, Link, Rx, instance_nonce, lookup_local, register_local, tcp_link, unregister_local,
};
use crate::error::HErr;

/// A communicator (one rank's view).
#[derive(Debug)]
pub(crate) struct Comm {
    pub handle: u64,
    pub rank: u32,
    pub n: u32,
    pub token: [u8; 16],
    pub peers: Vec<PeerInfo>,
    /// Progress timeout: the longest wait for any expected frame.
    pub timeout: Duration,
    /// Modelled link bandwidth for virtual time, GB/s.
    pub bandwidth_gbps: f64,
    links: Vec<Option<Link>>,
    pub rx: Mutex<Rx>,
    /// Held by the stream worker while it runs one of this communicator's operations.
    pub exec: Mutex<()>,
    pub aborted: AtomicBool,
    error: Mutex<Option<(hcclResult_t, CString)>>,
    has_error: AtomicBool,
    /// Sequence number of the last collective issued (assigned at enqueue; first is 1).
    pub coll_seq: AtomicU64,
    /// Per peer: point-to-point messages issued to it / from it.
    pub p2p: Mutex<(Vec<u64>, Vec<u64>)>,
    /// Operations enqueued and not finished (for destroy).
    pending: Mutex<u64>,
    pending_cv: Condvar,
    /// The synDeviceId bound to this communicator (first stream used), -1 until then.
    pub device: Mutex<i32>,
    /// Reusable host buffers of the running collective (input, output): no page faults per op.
    pub scratch: Mutex<(Vec<u8>, Vec<u8>)>,
    /// Shared-memory rendezvous when every rank lives in this mock instance (n > 1), else None.
    pub meet: Option<Arc<super::meet::Meet>>,
    /// The shared-memory region of a communicator of processes on this host
    /// (`shm_procs.rs`), mapped at its first shared-memory all-reduce.
    pub shm: Mutex<Option<super::shm_region::Region>>,
}

/// Context of one running operation, for messages and the failure rules.
pub(crate) struct OpCtx<'a> {
    /// Collective sequence number, or None for point-to-point.
    pub seq: Option<u64>,
    pub name: &'static str,
    /// The executing stream's teardown flag.
    pub stream_abort: &'a AtomicBool,
}

impl OpCtx<'_> {
    pub(crate) fn what(&self) -> String {
        match self.seq {
            Some(s) => format!("{} seq {s}", self.name),
            None => self.name.to_string(),
        }
    }
}

fn comms() -> MutexGuard<'static, HashMap<u64, Arc<Comm>>> {
    static M: OnceLock<Mutex<HashMap<u64, Arc<Comm>>>> = OnceLock::new();
    M.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The communicator behind handle id `h`; hcclInvalidArgument for unknown or destroyed ones.
pub(crate) fn lookup(h: u64) -> Result<Arc<Comm>, HErr> {
    comms().get(&h).cloned().ok_or_else(|| {
        HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("unknown or destroyed communicator {:#x}", h << 6))
    })
}

/// Removes handle `h` from the map (hcclInvalidArgument when unknown).
fn take(h: u64) -> Result<Arc<Comm>, HErr> {
    let c = comms().remove(&h);
    c.ok_or_else(|| {
        HErr::new(hcclResult_t::INVALID_ARGUMENT, format!("unknown or destroyed communicator {:#x}", h << 6))
    })
}

/// Every live communicator of this process (fault injection).
pub(crate) fn all() -> Vec<Arc<Comm>> {
    comms().values().cloned().collect()
}

/// Timeout and bandwidth from the environment and the mock configuration.
pub(crate) fn settings() -> (Duration, f64) {
    let r = crate::state::registry();
    let mut ms = r.config.hccl_timeout_ms;
    let bw = r.config.hccl_bandwidth_gbps;
    drop(r);
    if let Ok(v) = std::env::var(crate::config::ENV_TIMEOUT_MS)
        && let Ok(v) = crate::config::parse_timeout_ms(&v)
    {
        ms = v;
    }
    (Duration::from_millis(ms), bw)
}

/// `hcclCommInitRank`: validates, joins the rendezvous, connects the links, registers the comm.
pub(crate) fn init_rank(n: i32, id: &hcclUniqueId, rank: i32) -> Result<u64, HErr> {
    let inval = |m: String| HErr::new(hcclResult_t::INVALID_ARGUMENT, m);
    if n < 1 {
        return Err(inval(format!("nranks {n} < 1")));
    }
    if rank < 0 || rank >= n {
        return Err(inval(format!("rank {rank} outside 0..{n}")));
    }
    let (n, rank) = (n as u32, rank as u32);
    let (timeout, bw) = settings();
    let deadline = Instant::now() + timeout;
    let decoded = MockId::decode(id)?;
    let me_nonce = instance_nonce();
    let pid = std::process::id();
    let (inbox_tx, inbox_rx) = crossbeam_channel::unbounded::<Frame>();
    if n == 1 {
        let token = decoded.map_or([0; 16], |d| d.token);
        let peers = vec![PeerInfo { pid, nonce: me_nonce, addr: String::new() }];
        return Ok(register(Comm::new(rank, n, token, peers, vec![None], Rx::new(inbox_rx, 1), timeout, bw)));
    }
    let id = match decoded {
        Some(d) => d,
        None => {
            let value = std::env::var(ENV_COMM_ID)
                .map_err(|_| inval(format!("empty unique id (length 0) and {ENV_COMM_ID} is not set")))?;
            // Parsed as the vendor library parses it (the product's bootstrap uses the same code).
            let addr = habana_sys::comm_id::parse_comm_id(&value).map_err(|e| inval(e.to_string()))?.to_string();
            if rank == 0 { start_coordinator(&addr, [0; 16], timeout)? } else { MockId { token: [0; 16], addr } }
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| HErr::new(hcclResult_t::SOCKET_ERROR, format!("cannot bind the data-plane listener: {e}")))?;
    let my_addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    // A duplicate rank in this process still joins the rendezvous, so the coordinator poisons
    // it and every rank fails at once (instead of the first one waiting for the timeout).
    let local_dup = register_local(id.token, rank, inbox_tx.clone()).err();
    let built = (|| {
        let me = PeerInfo { pid, nonce: me_nonce, addr: my_addr };
        let peers = rendezvous(&id, rank, n, &me, deadline)?;
        if let Some(m) = &local_dup {
            return Err(HErr::new(hcclResult_t::INVALID_USAGE, m.clone()));
        }
        let remote: Vec<(u32, String)> = (0..n)
            .filter(|&p| p != rank && peers[p as usize].nonce != me_nonce)
            .map(|p| (p, peers[p as usize].addr.clone()))
            .collect();
        let streams = connect_mesh(id.token, rank, &remote, &listener, deadline)?;
        let mut links: Vec<Option<Link>> = (0..n).map(|_| None).collect();
        for (p, s) in streams {
            let l = tcp_link(s, p, inbox_tx.clone())
                .map_err(|e| HErr::new(hcclResult_t::SOCKET_ERROR, format!("link to rank {p}: {e}")))?;
            links[p as usize] = Some(l);
        }
        for p in (0..n).filter(|&p| p != rank && peers[p as usize].nonce == me_nonce) {
            // A peer that already destroyed its comm (it joined, so init succeeds) is gone.
            let tx = lookup_local(id.token, p).unwrap_or_else(|| {
                let why = format!("rank {p} left before rank {rank} finished init");
                let _ = inbox_tx.send(Frame { from: p, kind: Kind::Gone, seq: 0, code: 0, payload: why.into_bytes() });
                crossbeam_channel::unbounded().0
            });
            links[p as usize] = Some(Link::Local(tx));
        }
        Ok::<_, HErr>((peers, links))
    })();
    match built {
        Ok((peers, links)) => {
            let all_local = peers.iter().all(|p| p.nonce == me_nonce);
            let mut c = Comm::new(rank, n, id.token, peers, links, Rx::new(inbox_rx, n as usize), timeout, bw);
            c.meet = all_local.then(|| super::meet::meet_for(id.token, n));
            Ok(register(c))
        }
        Err(e) => {
            if local_dup.is_none() {
                unregister_local(id.token, rank);
            }
            Err(e)
        }
    }
}

use habana_sys::hcclUniqueId;

/// Registers `c` under a fresh handle. Its device is bound now when exactly one device is
/// acquired in this process (the vendor's one-device-per-process rule), else at first use.
fn register(mut c: Comm) -> u64 {
    let mut r = crate::state::registry();
    if r.devices.len() == 1 {
        c.device = Mutex::new(r.devices.keys().next().map_or(-1, |&d| d as i32));
    }
    let h = r.new_handle();
    drop(r);
    c.handle = h;
    comms().insert(h, Arc::new(c));
    h
}

impl Comm {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: u32,
        n: u32,
        token: [u8; 16],
        peers: Vec<PeerInfo>,
        links: Vec<Option<Link>>,
        rx: Rx,
        timeout: Duration,
        bandwidth_gbps: f64,
    ) -> Self {
        Self {
            handle: 0,
            rank,
            n,
            token,
            peers,
            timeout,
            bandwidth_gbps,
            links,
            rx: Mutex::new(rx),
            exec: Mutex::new(()),
            aborted: AtomicBool::new(false),
            error: Mutex::new(None),
            has_error: AtomicBool::new(false),
            coll_seq: AtomicU64::new(0),
            p2p: Mutex::new((vec![0; n as usize], vec![0; n as usize])),
            pending: Mutex::new(0),
            pending_cv: Condvar::new(),
            device: Mutex::new(-1),
            scratch: Mutex::new((Vec::new(), Vec::new())),
            meet: None,
            shm: Mutex::new(None),
        }
    }

    /// Whether every peer's data-plane address is a loopback address (so it runs on this host:
    /// loopback reaches no other machine).
    pub(crate) fn all_peers_local_host(&self) -> bool {
        self.peers
            .iter()
            .enumerate()
            .filter(|&(p, _)| p as u32 != self.rank)
            .all(|(_, q)| q.addr.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback()))
    }

    /// The sticky asynchronous error (hcclSuccess when none).
    pub(crate) fn async_error(&self) -> Option<(hcclResult_t, String)> {
        let e = self.error.lock().unwrap_or_else(|e| e.into_inner());
        e.as_ref().map(|(c, m)| (*c, m.to_string_lossy().into_owned()))
    }

    /// Pointer to the async error message ("" when none); stable while the comm lives (the
    /// first error is sticky and never replaced).
    pub(crate) fn async_error_ptr(&self) -> *const std::ffi::c_char {
        match &*self.error.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((_, m)) => m.as_ptr(),
            None => c"".as_ptr(),
        }
    }

    /// Records the first asynchronous error.
    pub(crate) fn set_error(&self, code: hcclResult_t, msg: &str) {
        let mut e = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if e.is_none() {
            *e = Some((code, CString::new(msg.replace('\0', " ")).unwrap_or_default()));
            self.has_error.store(true, Ordering::Release);
        }
    }

    /// Pulls failure notices that arrived while idle into the async error (hcclCommGetAsyncError).
    pub(crate) fn poll_idle(&self) {
        if let Ok(mut rx) = self.rx.try_lock() {
            rx.drain();
            if let Some(f) = rx.fails.first() {
                self.set_error(hcclResult_t(f.code), &peer_fail_msg(f));
            }
        }
    }

    /// A locally detected failure of the running operation: recorded as the async error and
    /// announced to every peer (so they fail quickly instead of timing out).
    pub(crate) fn fail(&self, ctx: &OpCtx<'_>, code: hcclResult_t, msg: String) -> HErr {
        let msg = format!("rank {}: {} failed: {msg}", self.rank, ctx.what());
        self.set_error(code, &msg);
        self.announce(ctx, code, &msg);
        HErr::new(code, msg)
    }

    /// Tells every peer that this rank failed the running operation with `code`.
    fn announce(&self, ctx: &OpCtx<'_>, code: hcclResult_t, msg: &str) {
        for l in self.links.iter().flatten() {
            let _ = l.send(Frame {
                from: self.rank,
                kind: Kind::Fail,
                seq: ctx.seq.unwrap_or(0),
                code: code.0,
                payload: msg.as_bytes().to_vec(),
            });
        }
    }

    /// Sends a frame to `to`. When the peer is gone, a failure it announced before leaving
    /// (waited for briefly) is reported instead, so the root cause propagates.
    pub(crate) fn send(
        &self,
        rx: &mut Rx,
        ctx: &OpCtx<'_>,
        to: u32,
        kind: Kind,
        seq: u64,
        payload: Vec<u8>,
    ) -> Result<(), HErr> {
        let Some(l) = self.links.get(to as usize).and_then(Option::as_ref) else {
            return Err(self.fail(ctx, hcclResult_t::INTERNAL_ERROR, format!("no link to rank {to}")));
        };
        let Err(e) = l.send(Frame { from: self.rank, kind, seq, code: 0, payload }) else { return Ok(()) };
        let until = Instant::now() + Duration::from_millis(200);
        while rx.gone.get(to as usize).is_some_and(Option::is_none) && Instant::now() < until {
            rx.pump(Duration::from_millis(10));
        }
        rx.drain();
        self.check(rx, ctx)?;
        let pid = self.peers.get(to as usize).map_or(0, |p| p.pid);
        Err(self.fail(
            ctx,
            hcclResult_t::SOCKET_ERROR,
            format!("peer rank {to} (pid {pid}) is gone (send failed: {e})"),
        ))
    }

    /// Receives the next frame from `from`, which must be of `kind` with sequence `seq`.
    /// Fails (and announces) when: this comm or its stream is aborted, the comm has an async
    /// error, a peer reported a failure of this or an earlier collective, `from` is gone
    /// (hcclSocketError), nothing arrives for [`Comm::timeout`] (hcclInternalError), or the
    /// frame is of another kind or sequence (hcclInvalidUsage: peers out of lockstep).
    pub(crate) fn recv(&self, rx: &mut Rx, ctx: &OpCtx<'_>, from: u32, kind: Kind, seq: u64) -> Result<Vec<u8>, HErr> {
        let mut deadline = Instant::now() + self.timeout;
        loop {
            self.check(rx, ctx)?;
            if let Some(f) = rx.take(from) {
                if f.kind != kind || f.seq != seq {
                    let msg = format!(
                        "lockstep mismatch: expected {kind:?} seq {seq} from rank {from}, got {:?} seq {}",
                        f.kind, f.seq
                    );
                    return Err(self.fail(ctx, hcclResult_t::INVALID_USAGE, msg));
                }
                return Ok(f.payload);
            }
            if let Some(why) = rx.gone.get(from as usize).cloned().flatten() {
                let pid = self.peers.get(from as usize).map_or(0, |p| p.pid);
                let msg = format!("peer rank {from} (pid {pid}) is gone ({why})");
                return Err(self.fail(ctx, hcclResult_t::SOCKET_ERROR, msg));
            }
            let now = Instant::now();
            if now >= deadline {
                let msg = format!("timed out after {} ms waiting for rank {from}", self.timeout.as_millis());
                return Err(self.fail(ctx, hcclResult_t::INTERNAL_ERROR, msg));
            }
            if rx.pump((deadline - now).min(Duration::from_millis(20))) {
                deadline = Instant::now() + self.timeout;
            }
        }
    }

    /// Fails if the operation must stop (see [`Comm::recv`]).
    pub(crate) fn check(&self, rx: &Rx, ctx: &OpCtx<'_>) -> Result<(), HErr> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(HErr::new(
                hcclResult_t::INVALID_USAGE,
                format!("rank {}: {}: the communicator was aborted or destroyed", self.rank, ctx.what()),
            ));
        }
        if ctx.stream_abort.load(Ordering::Acquire) {
            return Err(self.fail(ctx, hcclResult_t::INTERNAL_ERROR, "the stream was torn down".into()));
        }
        if self.has_error.load(Ordering::Acquire)
            && let Some((code, m)) = self.async_error()
        {
            // Announced, so peers in other processes fail now rather than at their timeout.
            self.announce(ctx, code, &m);
            return Err(HErr::new(code, format!("communicator has an asynchronous error: {m}")));
        }
        let relevant = rx.fails.iter().find(|f| match ctx.seq {
            Some(s) => f.seq == 0 || f.seq <= s,
            None => true,
        });
        if let Some(f) = relevant {
            let msg = peer_fail_msg(f);
            self.set_error(hcclResult_t(f.code), &msg);
            return Err(HErr::new(hcclResult_t(f.code), msg));
        }
        Ok(())
    }

    /// Counts an enqueued operation (for destroy).
    pub(crate) fn op_enqueued(&self) {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    /// Counts a finished operation.
    pub(crate) fn op_finished(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *p = p.saturating_sub(1);
        self.pending_cv.notify_all();
    }

    /// Marks the comm aborted, withdraws this rank from its pending shared-memory collective
    /// (`Meet::leave`) and closes every link (peers see this rank gone). Never blocks beyond
    /// the meet's lock.
    pub(crate) fn close(&self, reason: &str) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(m) = &self.meet {
            // Withdrawn from a pending shared-memory collective under the meet's lock, so no
            // peer arriving later completes it with this rank (`shm.rs`).
            m.leave(self.rank);
        }
        let reason = format!("rank {} {reason}", self.rank);
        for l in self.links.iter().flatten() {
            l.close(self.rank, &reason);
        }
        unregister_local(self.token, self.rank);
    }
}

fn peer_fail_msg(f: &Frame) -> String {
    String::from_utf8_lossy(&f.payload).into_owned()
}

/// `hcclCommAbort`: closes the links at once and forgets the handle (never blocks).
pub(crate) fn abort(h: u64) -> Result<(), HErr> {
    let c = take(h)?;
    c.close("aborted its communicator");
    Ok(())
}

/// `hcclCommDestroy`: waits up to the comm timeout for its queued operations, then closes it.
/// Operations still queued then fail on their stream; the call returns hcclInternalError.
pub(crate) fn destroy(h: u64) -> Result<(), HErr> {
    let c = take(h)?;
    let deadline = Instant::now() + c.timeout;
    let mut p = c.pending.lock().unwrap_or_else(|e| e.into_inner());
    while *p > 0 && Instant::now() < deadline {
        p = c.pending_cv.wait_timeout(p, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()).0;
    }
    let left = *p;
    drop(p);
    c.close("destroyed its communicator");
    if left > 0 {
        return Err(HErr::new(
            hcclResult_t::INTERNAL_ERROR,
            format!("{left} operation(s) still queued after {} ms; communicator aborted", c.timeout.as_millis()),
        ));
    }
    Ok(())
}

/// `HcclAsyncError` fault: sets `code` as the async error of every comm of this process.
pub(crate) fn inject_async_error(code: i32) {
    for c in all() {
        c.set_error(
            hcclResult_t(code),
            &format!("rank {}: injected asynchronous error {}", c.rank, hcclResult_t(code)),
        );
    }
}
