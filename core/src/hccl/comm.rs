//! The communicator: collectives enqueued on a stream, with fault containment.
//!
//! Owns: [`Comm`] (one rank of a communicator), [`CommOptions`], and the watchdog thread that
//! gives every collective a sequence number and a deadline, polls `hcclCommGetAsyncError`,
//! records the first failure as a typed [`HcclError`] (`Timeout { op, seq, after }` or
//! `Peer { rank, .. }`), dumps the [`FlightRecorder`] to the log and aborts the communicator from
//! a separate thread with its own hard deadline (the real `hcclCommAbort` only destroys and may
//! block; a dead peer can otherwise hang the device until the driver's lockup timeout).
//! Must not touch: bootstrap (`bootstrap`, `rendezvous`) or scheduling policy.
//!
//! Thread model: `Comm` is `Send` but not `Sync` (HCCL group semantics are per host thread);
//! the raw handle sits behind a mutex shared with the watchdog, and is taken out (set to `None`)
//! before it is aborted or destroyed, so no call can use it afterwards.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use habana_sys::{SynapseApi, hcclComm_t, hcclResult_t};

use super::error::{HcclError, Result};
use super::flight::FlightRecorder;
use super::result::{self, Call};
use super::types::{HcclType, ReduceOp, UniqueId};
use crate::synapse::{Device, DeviceBuffer, Event, Stream};

/// Watchdog and recorder settings.
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// A collective not complete this long after enqueue fails the communicator
    /// (default 300 s; jobs set it to a few times their slowest expected step).
    pub timeout: Duration,
    /// How long the abort (and `Drop`'s destroy) may take before the thread running it is
    /// abandoned (default 10 s).
    pub abort_deadline: Duration,
    /// Collectives kept by the flight recorder (default 64).
    pub flight_recorder_len: usize,
    /// Watchdog polling period (default 2 ms).
    pub poll_interval: Duration,
}

impl Default for CommOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
            abort_deadline: Duration::from_secs(10),
            flight_recorder_len: 64,
            poll_interval: Duration::from_millis(2),
        }
    }
}

/// The raw handle, movable between threads.
#[derive(Clone, Copy)]
struct RawComm(hcclComm_t);

// SAFETY: a communicator handle is an opaque token; HCCL allows `hcclCommGetAsyncError` and
// `hcclCommAbort` from another thread than the one issuing collectives (the NCCL contract HCCL
// copies). Every use goes through the `Shared::raw` mutex.
unsafe impl Send for RawComm {}

struct Shared {
    api: SynapseApi,
    raw: Mutex<Option<RawComm>>,
    recorder: FlightRecorder,
    error: Mutex<Option<HcclError>>,
    opts: CommOptions,
    rank: u32,
}

impl Shared {
    fn error(&self) -> Option<HcclError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records the first failure, dumps the flight recorder, aborts the communicator from a
    /// separate thread and waits for it at most `abort_deadline`. The failure becomes visible
    /// ([`Shared::error`] blocks meanwhile) only once `hcclCommAbort` returned (or the deadline
    /// passed): a caller that sees the error knows this rank has left every pending
    /// collective, so a peer issuing it later fails too instead of completing it with this rank.
    fn fail(self: &Arc<Self>, e: HcclError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        tracing::error!(rank = self.rank, "{e}; flight recorder (last collectives):\n{}", self.recorder.dump());
        let shared = self.clone();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        let spawned = std::thread::Builder::new().name(format!("hccl-abort-r{}", self.rank)).spawn(move || {
            let raw = shared.raw.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(RawComm(c)) = raw {
                // SAFETY: the handle was live and is taken out of the shared slot, so nothing
                // uses it after this call.
                if let Err(err) = unsafe { result::comm_abort(&shared.api, c) } {
                    tracing::warn!(rank = shared.rank, error = %err, "hcclCommAbort failed");
                }
            }
            let _ = done_tx.send(());
        });
        if spawned.is_err() || done_rx.recv_timeout(self.opts.abort_deadline).is_err() {
            tracing::error!(
                rank = self.rank,
                "communicator abort did not finish within {:?}; abandoning it",
                self.opts.abort_deadline
            );
        }
        *slot = Some(e);
    }
}

/// A collective the watchdog waits for.
struct Pending {
    seq: u64,
    op: &'static str,
    done: Event,
    enqueued: Instant,
}

enum WatchMsg {
    Track(Pending),
    Stop,
}

/// The peer a library message blames ("... peer rank N ..."), if it names one. The real library
/// gives no structured peer; the mock's messages follow this form.
fn rank_in(msg: &str) -> Option<u32> {
    let i = msg.find("peer rank ")?;
    let digits: String = msg[i + 10..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn watchdog(shared: Arc<Shared>, rx: Receiver<WatchMsg>) {
    let mut pending: std::collections::VecDeque<Pending> = std::collections::VecDeque::new();
    loop {
        match rx.recv_timeout(shared.opts.poll_interval) {
            Ok(WatchMsg::Track(p)) => pending.push_back(p),
            Ok(WatchMsg::Stop) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
        }
        while pending.front().is_some_and(|p| p.done.is_complete().unwrap_or(true)) {
            let p = pending.pop_front().expect("front exists");
            // A completed event of a stream with an asynchronous error: the collective failed.
            if p.done.is_complete().is_ok() && p.done.synchronize().is_ok() {
                shared.recorder.completed(p.seq);
            } else {
                shared.recorder.failed(p.seq);
            }
        }
        if let Some(p) = pending.front()
            && p.enqueued.elapsed() > shared.opts.timeout
        {
            shared.fail(HcclError::Timeout { op: p.op, seq: p.seq, after: shared.opts.timeout });
            return;
        }
        // Poll without blocking behind a caller inside a (possibly blocking) HCCL call.
        let async_err = match shared.raw.try_lock() {
            Ok(guard) => match *guard {
                // SAFETY: the handle is live while it is in the slot and we hold the lock.
                Some(RawComm(c)) => unsafe { result::comm_async_error(&shared.api, c) }.ok(),
                None => return,
            },
            Err(_) => None,
        };
        if let Some((code, msg)) = async_err
            && code != hcclResult_t::SUCCESS
        {
            let reason = msg.unwrap_or_else(|| result::describe(&shared.api, code));
            shared.fail(HcclError::Peer { rank: rank_in(&reason), code, reason });
            return;
        }
    }
}

/// One rank of a communicator (`hcclCommInitRank`), bound to the device it was created on.
///
/// Collectives are enqueued on a [`Stream`] of that device and run asynchronously to the host,
/// ordered with the stream's other work; results are valid after the stream (or a later event)
/// is synchronized — [`Comm::synchronize`] does that under the watchdog's deadline.
pub struct Comm {
    shared: Arc<Shared>,
    device: Device,
    world_size: u32,
    seq: AtomicU64,
    watch_tx: Sender<WatchMsg>,
    watchdog: Option<JoinHandle<()>>,
    group_depth: Cell<u32>,
    deferred: RefCell<Vec<(u64, &'static str)>>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("rank", &self.shared.rank).field("world_size", &self.world_size).finish()
    }
}

impl Comm {
    /// A new unique id (`hcclGetUniqueId`), on rank 0; send [`UniqueId::to_bytes`] to the others.
    ///
    /// # Errors
    /// [`HcclError::Hccl`] from the library.
    pub fn unique_id(rt: &crate::synapse::Runtime) -> Result<UniqueId> {
        Ok(UniqueId(result::get_unique_id(rt.api())?))
    }

    /// Joins the communicator as `rank` of `world_size` (`hcclCommInitRank`; blocks until every
    /// rank joined or the library's init timeout) and starts the watchdog.
    ///
    /// # Errors
    /// [`HcclError::InvalidArgument`] for `rank >= world_size` or `world_size == 0` (checked
    /// first); [`HcclError::Hccl`] from the library (bad id, peers that never join).
    pub fn init_rank(device: &Device, world_size: u32, id: &UniqueId, rank: u32, opts: CommOptions) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(HcclError::InvalidArgument {
                what: "rank / world size",
                value: format!("rank {rank} of world size {world_size}"),
            });
        }
        let raw = result::comm_init_rank(device.api(), world_size, id.0, rank)?;
        let shared = Arc::new(Shared {
            api: device.api().clone(),
            raw: Mutex::new(Some(RawComm(raw))),
            recorder: FlightRecorder::new(opts.flight_recorder_len),
            error: Mutex::new(None),
            opts,
            rank,
        });
        let (watch_tx, rx) = crossbeam_channel::unbounded();
        let s = shared.clone();
        let watchdog = std::thread::Builder::new()
            .name(format!("hccl-watchdog-r{rank}"))
            .spawn(move || watchdog(s, rx))
            .map_err(|e| HcclError::InvalidArgument { what: "watchdog thread", value: e.to_string() })?;
        Ok(Self {
            shared,
            device: device.clone(),
            world_size,
            seq: AtomicU64::new(0),
            watch_tx,
            watchdog: Some(watchdog),
            group_depth: Cell::new(0),
            deferred: RefCell::new(Vec::new()),
            _not_sync: PhantomData,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The failure recorded by the watchdog, if any. Once set, every call returns it.
    pub fn error(&self) -> Option<HcclError> {
        self.shared.error()
    }

    /// The flight recorder (last collectives, oldest first).
    pub fn flight_recorder(&self) -> &FlightRecorder {
        &self.shared.recorder
    }

    /// Sequence number of the last enqueued collective (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    fn check_device(&self, what: &'static str, dev: &Device) -> Result<()> {
        if dev.id() == self.device.id() {
            return Ok(());
        }
        Err(HcclError::InvalidArgument {
            what,
            value: format!("device {} but the communicator is on device {}", dev.id(), self.device.id()),
        })
    }

    fn check_len(&self, what: &'static str, expected: usize, got: usize) -> Result<()> {
        if expected == got {
            Ok(())
        } else {
            Err(HcclError::InvalidArgument { what, value: format!("{got} elements, expected {expected}") })
        }
    }

    fn check_rank(&self, what: &'static str, r: u32) -> Result<std::ffi::c_int> {
        if r < self.world_size {
            Ok(r as std::ffi::c_int)
        } else {
            Err(HcclError::InvalidArgument { what, value: format!("{r} (world size {})", self.world_size) })
        }
    }

    /// Enqueues `call`, records it, and hands a completion event to the watchdog (deferred to
    /// the end of the group inside [`Comm::group`]).
    fn issue<T: HcclType>(&self, stream: &Stream, op: &'static str, count: usize, call: Call) -> Result<u64> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        self.check_device("stream", stream.device())?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let guard = self.shared.raw.lock().unwrap_or_else(|p| p.into_inner());
            let Some(RawComm(c)) = *guard else {
                return Err(self
                    .error()
                    .unwrap_or(HcclError::InvalidArgument { what: "communicator", value: "already aborted".into() }));
            };
            // SAFETY: live comm (in the slot, lock held); live stream (borrowed); every address
            // was checked by the caller to be a buffer of this device of the right length.
            unsafe { result::enqueue(&self.shared.api, c, stream.raw().cast(), T::HCCL, call) }?;
        }
        self.shared.recorder.enqueued(seq, op, T::NAME, count);
        if self.group_depth.get() > 0 {
            self.deferred.borrow_mut().push((seq, op));
        } else {
            self.track(seq, op, stream)?;
        }
        Ok(seq)
    }

    fn track(&self, seq: u64, op: &'static str, stream: &Stream) -> Result<()> {
        let done = Event::new(&self.device, false)?;
        done.record(stream)?;
        let _ = self.watch_tx.send(WatchMsg::Track(Pending { seq, op, done, enqueued: Instant::now() }));
        Ok(())
    }

    /// `recv = op(send of every rank)`, element-wise (`hcclAllReduce`). Returns the collective's
    /// sequence number.
    ///
    /// # Errors
    /// [`HcclError::InvalidArgument`] for unequal lengths or buffers/stream of another device
    /// (before any C call); the recorded failure after a watchdog abort; [`HcclError::Hccl`].
    pub fn all_reduce<T: HcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<u64> {
        self.check_device("send buffer", send.device())?;
        self.check_device("recv buffer", recv.device())?;
        self.check_len("all_reduce recv length", send.len(), recv.len())?;
        let call = Call::AllReduce { send: send.addr(), recv: recv.addr(), count: send.len(), op: op.raw() };
        self.issue::<T>(stream, "all_reduce", send.len(), call)
    }

    /// In-place all-reduce of `buf` (`sendbuff == recvbuff`).
    ///
    /// # Errors
    /// As [`Comm::all_reduce`].
    pub fn all_reduce_in_place<T: HcclType>(
        &self,
        buf: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<u64> {
        self.check_device("buffer", buf.device())?;
        let call = Call::AllReduce { send: buf.addr(), recv: buf.addr(), count: buf.len(), op: op.raw() };
        self.issue::<T>(stream, "all_reduce", buf.len(), call)
    }

    /// In-place all-reduce of elements `range` of `buf` (`sendbuff == recvbuff` = the address of
    /// element `range.start`, `count = range.len()`): one bucket of a larger gradient, so a
    /// large model is reduced in bounded pieces without a staging copy. Returns the sequence
    /// number.
    ///
    /// # Errors
    /// [`HcclError::InvalidArgument`] when `range` is empty, reversed or past `buf.len()`
    /// (before any C call); otherwise as [`Comm::all_reduce`].
    pub fn all_reduce_range_in_place<T: HcclType>(
        &self,
        buf: &mut DeviceBuffer<T>,
        range: std::ops::Range<usize>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<u64> {
        self.check_device("buffer", buf.device())?;
        if range.start >= range.end || range.end > buf.len() {
            return Err(HcclError::InvalidArgument {
                what: "all_reduce range",
                value: format!("{range:?} of a {}-element buffer", buf.len()),
            });
        }
        let addr = buf.addr() + (range.start * size_of::<T>()) as u64;
        let call = Call::AllReduce { send: addr, recv: addr, count: range.len(), op: op.raw() };
        self.issue::<T>(stream, "all_reduce", range.len(), call)
    }

    /// Copies `root`'s `send` into every rank's `recv` (`hcclBroadcast`; `send` is read on the
    /// root only).
    ///
    /// # Errors
    /// As [`Comm::all_reduce`], plus a root out of range.
    pub fn broadcast<T: HcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        root: u32,
        stream: &Stream,
    ) -> Result<u64> {
        let root = self.check_rank("broadcast root", root)?;
        self.check_device("send buffer", send.device())?;
        self.check_device("recv buffer", recv.device())?;
        self.check_len("broadcast recv length", send.len(), recv.len())?;
        let call = Call::Broadcast { send: send.addr(), recv: recv.addr(), count: send.len(), root };
        self.issue::<T>(stream, "broadcast", send.len(), call)
    }

    /// Concatenates every rank's `send` into `recv` in rank order (`hcclAllGather`);
    /// `recv.len() == world_size * send.len()`.
    ///
    /// # Errors
    /// As [`Comm::all_reduce`].
    pub fn all_gather<T: HcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<u64> {
        self.check_device("send buffer", send.device())?;
        self.check_device("recv buffer", recv.device())?;
        self.check_len("all_gather recv length", send.len() * self.world_size as usize, recv.len())?;
        let call = Call::AllGather { send: send.addr(), recv: recv.addr(), send_count: send.len() };
        self.issue::<T>(stream, "all_gather", send.len(), call)
    }

    /// Reduces every rank's `send` and leaves block `rank` of the result in `recv`
    /// (`hcclReduceScatter`); `send.len() == world_size * recv.len()`.
    ///
    /// # Errors
    /// As [`Comm::all_reduce`].
    pub fn reduce_scatter<T: HcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<u64> {
        self.check_device("send buffer", send.device())?;
        self.check_device("recv buffer", recv.device())?;
        self.check_len("reduce_scatter send length", recv.len() * self.world_size as usize, send.len())?;
        let call = Call::ReduceScatter { send: send.addr(), recv: recv.addr(), recv_count: recv.len(), op: op.raw() };
        self.issue::<T>(stream, "reduce_scatter", recv.len(), call)
    }

    /// Reduces every rank's `send` into `root`'s `recv` (`hcclReduce`).
    ///
    /// # Errors
    /// As [`Comm::broadcast`].
    pub fn reduce<T: HcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
        root: u32,
        stream: &Stream,
    ) -> Result<u64> {
        let root = self.check_rank("reduce root", root)?;
        self.check_device("send buffer", send.device())?;
        self.check_device("recv buffer", recv.device())?;
        self.check_len("reduce recv length", send.len(), recv.len())?;
        let call = Call::Reduce { send: send.addr(), recv: recv.addr(), count: send.len(), op: op.raw(), root };
        self.issue::<T>(stream, "reduce", send.len(), call)
    }

    /// Sends `buf` to rank `peer` (`hcclSend`); pair with [`Comm::recv`] on the peer, inside
    /// [`Comm::group`] when both directions are in flight.
    ///
    /// # Errors
    /// As [`Comm::broadcast`].
    pub fn send<T: HcclType>(&self, buf: &DeviceBuffer<T>, peer: u32, stream: &Stream) -> Result<u64> {
        let peer = self.check_rank("send peer", peer)?;
        self.check_device("buffer", buf.device())?;
        self.issue::<T>(stream, "send", buf.len(), Call::Send { buf: buf.addr(), count: buf.len(), peer })
    }

    /// Receives into `buf` from rank `peer` (`hcclRecv`).
    ///
    /// # Errors
    /// As [`Comm::broadcast`].
    pub fn recv<T: HcclType>(&self, buf: &mut DeviceBuffer<T>, peer: u32, stream: &Stream) -> Result<u64> {
        let peer = self.check_rank("recv peer", peer)?;
        self.check_device("buffer", buf.device())?;
        self.issue::<T>(stream, "recv", buf.len(), Call::Recv { buf: buf.addr(), count: buf.len(), peer })
    }

    /// Runs `f` between `hcclGroupStart` and `hcclGroupEnd`: the collectives it issues (on
    /// `stream`) are launched together at the end of the group, so send/recv pairs do not
    /// deadlock. The group is closed even when `f` fails; the watchdog tracks the grouped
    /// collectives from the end of the group.
    ///
    /// # Errors
    /// `f`'s error, or the library's at group start/end.
    pub fn group<R>(&self, stream: &Stream, f: impl FnOnce(&Self) -> Result<R>) -> Result<R> {
        result::group_start(&self.shared.api)?;
        self.group_depth.set(self.group_depth.get() + 1);
        let r = f(self);
        self.group_depth.set(self.group_depth.get() - 1);
        let end = result::group_end(&self.shared.api);
        if self.group_depth.get() == 0 {
            let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
            for (seq, op) in deferred {
                self.track(seq, op, stream)?;
            }
        }
        let v = r?;
        end?;
        Ok(v)
    }

    /// Waits until `stream` is idle, returning the watchdog's typed error if the communicator
    /// failed meanwhile (the host never blocks in the runtime, so a dead peer cannot hang it;
    /// the watchdog's timeout bounds the wait). The poll backs off exponentially from 10 µs to
    /// `poll_interval`, so a collective that completes soon is noticed within microseconds
    /// while a long wait costs few wake-ups.
    ///
    /// # Errors
    /// The recorded [`HcclError`]; [`HcclError::Synapse`] for a device error not caused by the
    /// communicator.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let mut nap = Duration::from_micros(10);
        loop {
            if let Some(e) = self.error() {
                return Err(e);
            }
            match stream.is_idle() {
                Ok(true) => return self.error().map_or(Ok(()), Err),
                Ok(false) => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(self.shared.opts.poll_interval);
                }
                Err(e) => {
                    // Give the watchdog a moment to classify the failure.
                    let until = Instant::now() + self.shared.opts.poll_interval * 50;
                    while Instant::now() < until {
                        if let Some(ce) = self.error() {
                            return Err(ce);
                        }
                        std::thread::sleep(self.shared.opts.poll_interval);
                    }
                    return Err(e.into());
                }
            }
        }
    }

    fn stop_watchdog(&mut self) {
        let _ = self.watch_tx.send(WatchMsg::Stop);
        if let Some(h) = self.watchdog.take() {
            let _ = h.join();
        }
    }

    /// Stops the watchdog and destroys the communicator (`hcclCommDestroy`).
    ///
    /// # Errors
    /// Hands the communicator back when `hcclCommDestroy` fails (its handle is then kept).
    pub fn destroy(mut self) -> std::result::Result<(), Box<(HcclError, Self)>> {
        self.stop_watchdog();
        let raw = self.shared.raw.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(RawComm(c)) = raw {
            // SAFETY: live handle taken out of the slot; nothing else can use it.
            if let Err(e) = unsafe { result::comm_destroy(&self.shared.api, c) } {
                *self.shared.raw.lock().unwrap_or_else(|p| p.into_inner()) = Some(RawComm(c));
                return Err(Box::new((e, self)));
            }
        }
        Ok(())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.stop_watchdog();
        let raw = self.shared.raw.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(RawComm(c)) = raw else { return };
        // Bounded: destroy on a helper thread and abandon it after the deadline.
        let api = self.shared.api.clone();
        let rank = self.shared.rank;
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let raw = RawComm(c);
        let spawned = std::thread::Builder::new().name(format!("hccl-destroy-r{rank}")).spawn(move || {
            let owned = raw;
            let RawComm(c) = owned;
            // SAFETY: the handle was taken out of the slot; this thread is its last user.
            if let Err(e) = unsafe { result::comm_destroy(&api, c) } {
                tracing::warn!(rank, error = %e, "best-effort communicator destroy failed");
            }
            let _ = tx.send(());
        });
        if spawned.is_ok() && rx.recv_timeout(self.shared.opts.abort_deadline).is_err() {
            tracing::error!(
                rank,
                "communicator destroy did not finish within {:?}; abandoning it",
                self.shared.opts.abort_deadline
            );
        }
    }
}
