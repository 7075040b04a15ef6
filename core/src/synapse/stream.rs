//! Streams and events.
//!
//! Owns: [`Stream`] (an in-order queue of device work) and [`Event`] (a marker recorded on a
//! stream, optionally carrying a device timestamp). Work is enqueued by the sibling modules
//! (`memory` copies, `recipe` launches); this module only creates, orders and waits.
//! Must not touch: buffers or recipes.

use std::time::{Duration, Instant};

use habana_sys::{EVENT_COLLECT_TIME, synEventHandle, synStreamHandle};

use super::error::{DropResult, Error, Result};
use super::result;
use super::runtime::Device;

/// How long `Drop` of a stream waits for queued work before leaking the handle instead of
/// blocking forever.
pub const DROP_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A device stream (`synStreamCreateGeneric`). Work on one stream runs in order, asynchronously
/// to the host.
///
/// `Send` but not `Sync`: the handle may move between threads, but `synapse_api.h` marks
/// `synStreamSynchronize` and `synStreamDestroy` as not thread-safe on the same stream.
#[derive(Debug)]
pub struct Stream {
    dev: Device,
    handle: synStreamHandle,
}

// SAFETY: the handle is an opaque token the runtime accepts from any thread; `Stream` is not
// `Sync`, so no two threads use it at once.
unsafe impl Send for Stream {}

impl Stream {
    /// Creates a stream on `dev`.
    ///
    /// # Errors
    /// [`Error::Synapse`] when the runtime refuses (e.g. out of resources).
    pub fn new(dev: &Device) -> Result<Self> {
        let handle = result::stream_create(dev.api(), dev.id())?;
        Ok(Self { dev: dev.clone(), handle })
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The raw handle, for layers that pass it to C (HCCL takes it as `void*`).
    pub fn raw(&self) -> synStreamHandle {
        self.handle
    }

    /// Blocks until all queued work is done.
    ///
    /// # Errors
    /// [`Error::Synapse`], including an asynchronous error raised by queued work.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.handle` is live for the life of `self`.
        unsafe { result::stream_synchronize(self.dev.api(), self.handle) }
    }

    /// `true` when all queued work is done (`synStreamQuery`).
    ///
    /// # Errors
    /// [`Error::Synapse`] for statuses other than success and synBusy.
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: `self.handle` is live.
        unsafe { result::stream_query(self.dev.api(), self.handle) }
    }

    /// Makes later work on this stream wait until `event` completes (`synStreamWaitEvent`); the
    /// host does not block.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the event belongs to another device; [`Error::Synapse`].
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if event.dev.id() != self.dev.id() {
            return Err(Error::InvalidArgument {
                what: "event device",
                value: format!("event on device {} waited on a stream of device {}", event.dev.id(), self.dev.id()),
            });
        }
        // SAFETY: both handles are live and on the same device (checked above).
        unsafe { result::stream_wait_event(self.dev.api(), self.handle, event.handle) }
    }

    /// Destroys the stream after waiting for its work.
    ///
    /// # Errors
    /// Hands the stream back when synchronization or `synStreamDestroy` fails.
    pub fn destroy(self) -> DropResult<Self> {
        if let Err(e) = self.synchronize() {
            return Err((e, self));
        }
        // SAFETY: live handle, drained above; nulled below so `Drop` does not destroy it again.
        match unsafe { result::stream_destroy(self.dev.api(), self.handle) } {
            Ok(()) => {
                let mut this = self;
                this.handle = std::ptr::null_mut();
                Ok(())
            }
            Err(e) => Err((e, self)),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.handle.is_null() {
            return; // destroyed explicitly
        }
        // Best effort, bounded: poll until idle, then destroy; leak the handle rather than block
        // forever on a stalled stream.
        let start = Instant::now();
        loop {
            match self.is_idle() {
                Ok(true) | Err(_) => break,
                Ok(false) if start.elapsed() > DROP_DRAIN_TIMEOUT => {
                    tracing::warn!(
                        device = self.dev.id(),
                        "stream still busy after {DROP_DRAIN_TIMEOUT:?}; leaking it"
                    );
                    return;
                }
                Ok(false) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        // SAFETY: live handle, never used again.
        if let Err(e) = unsafe { result::stream_destroy(self.dev.api(), self.handle) } {
            tracing::warn!(device = self.dev.id(), error = %e, "best-effort stream destroy failed");
        }
    }
}

/// A device event (`synEventCreate`). Recording it on a stream marks a point in that stream's
/// work; with timing enabled it carries a device timestamp in ns.
///
/// `Send` but not `Sync`: recording the same event from two threads is not thread-safe
/// (`synapse_api.h`).
#[derive(Debug)]
pub struct Event {
    dev: Device,
    handle: synEventHandle,
    timed: bool,
}

// SAFETY: the handle is an opaque token usable from any thread; not `Sync`, so one user at a time.
unsafe impl Send for Event {}

impl Event {
    /// Creates an event. `timed` sets `EVENT_COLLECT_TIME`, which [`Event::elapsed_since`] and
    /// [`Event::timestamp_ns`] require.
    ///
    /// # Errors
    /// [`Error::Synapse`] from the runtime.
    pub fn new(dev: &Device, timed: bool) -> Result<Self> {
        let flags = if timed { EVENT_COLLECT_TIME } else { 0 };
        let handle = result::event_create(dev.api(), dev.id(), flags)?;
        Ok(Self { dev: dev.clone(), handle, timed })
    }

    /// Whether the event collects device timestamps.
    pub fn is_timed(&self) -> bool {
        self.timed
    }

    /// The raw handle, for launches that signal external events.
    pub fn raw(&self) -> synEventHandle {
        self.handle
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Records the event at the current end of `stream` (re-recording overwrites).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the stream is on another device; [`Error::Synapse`].
    pub fn record(&self, stream: &Stream) -> Result<()> {
        if stream.dev.id() != self.dev.id() {
            return Err(Error::InvalidArgument {
                what: "stream device",
                value: format!("event of device {} recorded on device {}", self.dev.id(), stream.dev.id()),
            });
        }
        // SAFETY: both handles live, same device.
        unsafe { result::event_record(self.dev.api(), self.handle, stream.raw()) }
    }

    /// `true` once the recorded work is done (also for a never-recorded event, as the vendor
    /// documents).
    ///
    /// # Errors
    /// [`Error::Synapse`] for statuses other than success and synBusy.
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: live handle.
        unsafe { result::event_query(self.dev.api(), self.handle) }
    }

    /// Blocks the host until the event completes.
    ///
    /// # Errors
    /// [`Error::Synapse`], including an asynchronous error of the work before it.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: live handle.
        unsafe { result::event_synchronize(self.dev.api(), self.handle) }
    }

    /// Device time between `start` and `self` (both recorded and complete, both timed).
    ///
    /// # Errors
    /// [`Error::Synapse`] with `synInvalidArgument` when an event is not timed,
    /// `synObjectNotInitialized` when one was never recorded, `synBusy` when not complete.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        // SAFETY: both handles live.
        let ns = unsafe { result::event_elapsed_ns(self.dev.api(), start.handle, self.handle) }?;
        Ok(Duration::from_nanos(ns))
    }

    /// The device timestamp of the event in ns (`synEventElapsedTime` with a null end event).
    /// Only differences between timestamps of one device are meaningful.
    ///
    /// # Errors
    /// As [`Event::elapsed_since`].
    pub fn timestamp_ns(&self) -> Result<u64> {
        // SAFETY: live handle; a null end handle asks for the start timestamp.
        unsafe { result::event_elapsed_ns(self.dev.api(), self.handle, std::ptr::null_mut()) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: live handle, never used again.
        if let Err(e) = unsafe { result::event_destroy(self.dev.api(), self.handle) } {
            tracing::warn!(device = self.dev.id(), error = %e, "best-effort event destroy failed");
        }
    }
}
