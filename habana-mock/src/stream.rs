//! Mock streams: one worker thread per stream executing its operations in order, asynchronously
//! to the host, on the mock device timeline.
//!
//! Owns: [`Stream`] (the queue and worker thread), [`StreamShared`] (counters, sticky
//! asynchronous error, timeline clock), the timeline rules of both time modes and stalls.
//! Must not touch: the registry (a worker never takes the global lock, so a long kernel never
//! blocks other API calls); validation happens at enqueue time in `ops.rs`.
//!
//! Asynchronous errors: when a copy or kernel fails on the worker (kernel returned non-success,
//! buffer released before the operation ran), the stream records the status. It is sticky:
//! every later synStreamSynchronize on the stream, and synEventSynchronize of an event recorded
//! on it, returns it; later copies and kernels on that stream are skipped (events still
//! complete, so waiters never hang). Host operations (the mock's collectives) still run, so the
//! peers of a collective are not left waiting; a failed collective sets the error synFailHccl.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use habana_sys::synStatus;

use crate::config::TimeMode;
use crate::event::{AsyncErrorSource, Event};
use crate::faults::stalls;
use crate::graph::program::Program;
use crate::kernel_abi::{Kernel, MockKernelArgs, MockTensor};
use crate::memory::{CopyPiece, DevAlloc};

/// ns elapsed since the process-wide mock epoch (first use), from a monotonic clock.
pub fn epoch_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn sleep_until_ns(t: u64) {
    let now = epoch_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

/// What a launch runs.
#[derive(Debug)]
pub(crate) enum Exec {
    /// A registered C kernel (JSON mock recipe) with its tensor names and scalar params.
    C { kernel: Kernel, names: Arc<Vec<CString>>, params: Arc<Vec<f64>> },
    /// A compiled graph; bindings are its persistent sections, then the workspace if any.
    Graph(Arc<Program>),
}

/// A kernel launch, validated at enqueue time.
#[derive(Debug)]
pub(crate) struct KernelOp {
    pub exec: Exec,
    /// Per recipe tensor (or graph section): allocation, offset, bytes.
    pub bindings: Vec<(Arc<DevAlloc>, u64, u64)>,
    /// External events recorded at completion, with their generation.
    pub events: Vec<(Arc<Event>, u64)>,
    /// Events recorded during the launch (mapped to a tensor that a node before the last one
    /// produces): event, generation, and device time after the launch's start (ns, below
    /// `latency_ns`), in ascending order of that time.
    pub early: Vec<(Arc<Event>, u64, u64)>,
    pub latency_ns: u64,
}

/// One queued stream operation.
#[derive(Debug)]
pub(crate) enum Op {
    Copy {
        pieces: Vec<CopyPiece>,
        latency_ns: u64,
    },
    Kernel(KernelOp),
    Record {
        event: Arc<Event>,
        generation: u64,
    },
    Wait {
        event: Arc<Event>,
        generation: u64,
    },
    /// Host-side work ordered with the stream (the mock's collectives).
    Host(HostOp),
}

/// What a [`HostOp`] sees when the worker runs it.
pub(crate) struct HostCtx<'a> {
    /// Start of the operation on this stream's timeline (ns).
    pub start_ns: u64,
    /// True in virtual time mode (the returned duration is added to the clock).
    pub virtual_time: bool,
    /// Set when the stream is torn down: blocking work must give up.
    pub abort: &'a AtomicBool,
}

/// Host work run by the stream worker in order with the other operations. Returns its
/// modelled duration in ns (virtual time; ignored in real time, where wall time counts) or an
/// asynchronous error for the stream. It runs even when the stream already has a sticky error
/// (so peers of a collective are not left waiting) and must itself honour `abort`.
pub(crate) type HostFn = Box<dyn FnOnce(&HostCtx<'_>) -> Result<u64, (synStatus, String)> + Send>;

/// A boxed [`HostFn`].
pub(crate) struct HostOp(pub HostFn);

impl std::fmt::Debug for HostOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostOp")
    }
}

#[derive(Debug, Default)]
struct StreamState {
    enqueued: u64,
    completed: u64,
    error: Option<(synStatus, String)>,
    /// End of the last operation on the timeline (ns).
    clock_ns: u64,
}

/// State shared between a stream's handle and its worker.
#[derive(Debug, Default)]
pub(crate) struct StreamShared {
    state: Mutex<StreamState>,
    cv: Condvar,
    /// Set when the stream is torn down: blocking waits give up.
    pub abort: AtomicBool,
}

impl StreamShared {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sticky asynchronous error, if any.
    pub(crate) fn error(&self) -> Option<(synStatus, String)> {
        self.lock().error.clone()
    }

    /// True while enqueued work has not completed.
    pub(crate) fn busy(&self) -> bool {
        let s = self.lock();
        s.completed < s.enqueued
    }

    /// Waits for every operation enqueued so far.
    pub(crate) fn wait_idle(&self) {
        let mut s = self.lock();
        let target = s.enqueued;
        while s.completed < target && !self.abort.load(Ordering::Acquire) {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl AsyncErrorSource for StreamShared {
    fn async_error(&self) -> Option<(synStatus, String)> {
        self.error()
    }
}

/// A stream of module `module`.
#[derive(Debug)]
pub(crate) struct Stream {
    pub id: u64,
    pub module: u32,
    pub shared: Arc<StreamShared>,
    tx: Mutex<Option<Sender<Op>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Stream {
    /// Starts the worker thread. Fails when the OS refuses a thread.
    pub(crate) fn spawn(id: u64, module: u32, mode: TimeMode) -> std::io::Result<Self> {
        let shared = Arc::new(StreamShared::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        let w = Worker { module, mode, shared: shared.clone() };
        let handle = std::thread::Builder::new()
            .name(format!("mock-stream-{module}-{id}"))
            .stack_size(1 << 20)
            .spawn(move || w.run(rx))?;
        Ok(Self { id, module, shared, tx: Mutex::new(Some(tx)), worker: Mutex::new(Some(handle)) })
    }

    /// Enqueues `op`; false when the stream is shut down.
    pub(crate) fn enqueue(&self, op: Op) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else { return false };
        self.shared.lock().enqueued += 1;
        if tx.send(op).is_err() {
            self.shared.lock().enqueued -= 1;
            return false;
        }
        true
    }

    /// Closes the queue and joins the worker. With `abort`, blocking waits (event waits, stalls)
    /// are abandoned and the remaining operations skipped.
    pub(crate) fn shutdown(&self, abort: bool) {
        if abort {
            self.shared.abort.store(true, Ordering::Release);
            self.shared.cv.notify_all();
        }
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(h) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

struct Worker {
    module: u32,
    mode: TimeMode,
    shared: Arc<StreamShared>,
}

impl Worker {
    fn run(self, rx: Receiver<Op>) {
        while let Ok(op) = rx.recv() {
            // A panic in an operation must not kill the worker silently: record it.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.execute(op)));
            let mut s = self.shared.lock();
            if r.is_err() && s.error.is_none() {
                s.error = Some((synStatus::FAIL, "mock stream worker panicked".into()));
            }
            // The operation counts as completed and its events fire under the stream's lock, so
            // no observer sees one without the other: a host woken by the stream's last event
            // finds the stream idle, and one woken by a stream synchronize finds its events
            // complete (as on the device). Lock order stream -> event; event methods never take
            // a stream lock while holding their own.
            s.completed += 1;
            for (e, g, ts) in r.unwrap_or_default() {
                e.complete(g, ts);
            }
            drop(s);
            self.shared.cv.notify_all();
        }
    }

    fn aborted(&self) -> bool {
        self.shared.abort.load(Ordering::Acquire)
    }

    /// Applies a pending stall of this module; returns virtual ns to add to the clock.
    fn stall(&self) -> u64 {
        let st = stalls();
        let mut t = st.table.lock().unwrap_or_else(|e| e.into_inner());
        match t.pending.remove(&self.module) {
            None => 0,
            Some(Some(ms)) => {
                drop(t);
                if self.mode == TimeMode::Real {
                    std::thread::sleep(Duration::from_millis(ms));
                    0
                } else {
                    ms * 1_000_000
                }
            }
            Some(None) => {
                t.blocked.insert(self.module);
                while t.blocked.contains(&self.module) && !self.aborted() {
                    t = st.cv.wait_timeout(t, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
                }
                0
            }
        }
    }

    /// Start of the next operation given the earliest allowed time `not_before`.
    fn start(&self, not_before: u64) -> u64 {
        let clock = self.shared.lock().clock_ns;
        match self.mode {
            TimeMode::Real => epoch_ns().max(clock),
            TimeMode::Virtual => clock.max(not_before),
        }
    }

    /// The timeline reaching `t` within a running operation: waits for it in real time (the
    /// later of `t` and now), returns it in virtual time. The clock moves at the operation's end.
    fn at(&self, t: u64) -> u64 {
        match self.mode {
            TimeMode::Real => {
                if !self.aborted() {
                    sleep_until_ns(t);
                }
                t.max(epoch_ns())
            }
            TimeMode::Virtual => t,
        }
    }

    /// Ends an operation that started at `start` and costs `latency_ns`; returns its end.
    fn finish(&self, start: u64, latency_ns: u64) -> u64 {
        let end = self.at(start.saturating_add(latency_ns));
        self.shared.lock().clock_ns = end;
        end
    }

    fn set_error(&self, status: synStatus, msg: String) {
        let mut s = self.shared.lock();
        if s.error.is_none() {
            s.error = Some((status, msg));
        }
    }

    fn skip(&self) -> bool {
        self.aborted() || self.shared.lock().error.is_some()
    }

    /// Runs `op`; returns the events it completes (event, generation, timestamp ns), fired by
    /// the caller after the operation is counted as completed.
    fn execute(&self, op: Op) -> Vec<(Arc<Event>, u64, u64)> {
        let stall_ns = self.stall();
        if stall_ns > 0 {
            let mut s = self.shared.lock();
            s.clock_ns = s.clock_ns.saturating_add(stall_ns);
        }
        match op {
            Op::Copy { pieces, latency_ns } => {
                let start = self.start(0);
                if !self.skip() {
                    for p in &pieces {
                        if let Err(msg) = p.execute() {
                            self.set_error(synStatus::INVALID_ARGUMENT, msg);
                            break;
                        }
                    }
                }
                self.finish(start, latency_ns);
            }
            Op::Kernel(k) => {
                let start = self.start(0);
                if !self.skip()
                    && let Err((status, msg)) = run_kernel(&k)
                {
                    self.set_error(status, msg);
                }
                // A tensor produced before the last node is ready before the launch ends: its
                // event fires at its node's end (not under the stream's lock: the launch is
                // still running, so a host woken by it rightly finds the stream busy).
                for (e, g, offset) in &k.early {
                    e.complete(*g, self.at(start.saturating_add(*offset)));
                }
                let end = self.finish(start, k.latency_ns);
                return k.events.iter().map(|(e, g)| (e.clone(), *g, end)).collect();
            }
            Op::Record { event, generation } => {
                let t = self.start(0);
                self.shared.lock().clock_ns = t;
                return vec![(event, generation, t)];
            }
            Op::Wait { event, generation } => {
                let ts = if self.aborted() { None } else { event.wait_for(generation) };
                let t = self.start(ts.unwrap_or(0));
                self.shared.lock().clock_ns = t;
            }
            Op::Host(h) => {
                let start = self.start(0);
                let ctx = HostCtx {
                    start_ns: start,
                    virtual_time: self.mode == TimeMode::Virtual,
                    abort: &self.shared.abort,
                };
                let latency = match (h.0)(&ctx) {
                    Ok(ns) => ns,
                    Err((status, msg)) => {
                        self.set_error(status, msg);
                        0
                    }
                };
                self.finish(start, latency);
            }
        }
        Vec::new()
    }
}

/// Locks every allocation of a launch (distinct ones in address order, a buffer bound twice
/// locked once), builds the tensor table and calls the kernel.
fn run_kernel(k: &KernelOp) -> Result<(), (synStatus, String)> {
    let mut allocs: Vec<&Arc<DevAlloc>> = k.bindings.iter().map(|b| &b.0).collect();
    allocs.sort_by_key(|a| a.base);
    allocs.dedup_by_key(|a| a.base);
    let guards: Vec<_> = allocs.iter().map(|a| (a.base, a.lock())).collect();
    let mut regions = Vec::with_capacity(k.bindings.len());
    for (i, (a, off, _)) in k.bindings.iter().enumerate() {
        let g = &guards.iter().find(|(b, _)| *b == a.base).expect("locked above").1;
        let Some(buf) = g.as_ref() else {
            return Err((synStatus::INVALID_ARGUMENT, format!("tensor {i} was freed before the launch ran")));
        };
        // SAFETY: offset + bytes <= allocation size (checked at enqueue).
        regions.push(unsafe { buf.as_ptr().add(*off as usize) });
    }
    let result = match &k.exec {
        Exec::C { kernel, names, params } => {
            let tensors: Vec<MockTensor> = regions
                .iter()
                .zip(&k.bindings)
                .enumerate()
                .map(|(i, (&data, b))| MockTensor { name: names[i].as_ptr(), data, bytes: b.2 })
                .collect();
            let args = MockKernelArgs {
                tensors: tensors.as_ptr(),
                num_tensors: tensors.len() as u32,
                params: params.as_ptr(),
                num_params: params.len() as u32,
                user_data: kernel.user_data.0,
            };
            // SAFETY: `args` points at live tensor descriptors whose data pointers are inside
            // allocations locked by this thread for the duration of the call; the kernel's
            // contract (register_kernel) is to touch only those ranges.
            let status = unsafe { (kernel.f)(&args) };
            if status.is_success() { Ok(()) } else { Err((status, format!("kernel returned {status}"))) }
        }
        // SAFETY: each region is valid for its binding's bytes (checked at enqueue: a section's
        // extent, the workspace size) and its allocation is locked by this thread for the call;
        // distinct sections do not overlap (checked at launch).
        Exec::Graph(p) => unsafe { p.execute(&regions) }.map_err(|m| (synStatus::FAIL, m)),
    };
    drop(guards);
    result
}
