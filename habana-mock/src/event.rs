//! Mock events: record generations, completion and device timestamps.
//!
//! Owns: [`Event`] (a counter of records enqueued, the latest completed record and its
//! timestamp in ns on the mock device timeline) and [`AsyncErrorSource`]. Must not touch: the
//! registry (callers look events up) or streams beyond the error of the stream it was last
//! recorded on (seen through [`AsyncErrorSource`]; this module imports no stream type).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use habana_sys::{EVENT_COLLECT_TIME, synStatus};

use crate::error::{MResult, fail};

/// What an event needs of the stream it was recorded on: its sticky asynchronous error
/// (implemented by `stream::StreamShared`; a trait so that events do not import streams).
pub(crate) trait AsyncErrorSource: Send + Sync + std::fmt::Debug {
    /// The sticky asynchronous error, if any.
    fn async_error(&self) -> Option<(synStatus, String)>;
}

/// A mock event.
#[derive(Debug)]
pub(crate) struct Event {
    pub id: u64,
    pub module: u32,
    pub flags: u32,
    state: Mutex<EventState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct EventState {
    /// Records enqueued so far (0 = never recorded).
    recorded: u64,
    /// Highest record generation completed.
    completed: u64,
    /// Timestamp (ns) of the completed record `completed`.
    ts: Option<u64>,
    /// Stream of the latest record, for its asynchronous error.
    stream: Option<Arc<dyn AsyncErrorSource>>,
    /// Set by synDestroy/synDeviceRelease: every waiter returns.
    poisoned: bool,
}

impl Event {
    pub(crate) fn new(id: u64, module: u32, flags: u32) -> Self {
        Self { id, module, flags, state: Mutex::new(EventState::default()), cv: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a new record on `stream`; returns its generation (to pass to [`Event::complete`]).
    pub(crate) fn begin_record(&self, stream: Arc<dyn AsyncErrorSource>) -> u64 {
        let mut s = self.lock();
        s.recorded += 1;
        s.stream = Some(stream);
        s.recorded
    }

    /// Marks record `generation` reached at device time `ts_ns`. A later record overwrites an
    /// earlier one; a stale completion (older generation) is ignored.
    pub(crate) fn complete(&self, generation: u64, ts_ns: u64) {
        let mut s = self.lock();
        if generation >= s.completed {
            s.completed = generation;
            s.ts = Some(ts_ns);
        }
        self.cv.notify_all();
    }

    /// Wakes every waiter for good (device released or synDestroy).
    pub(crate) fn poison(&self) {
        self.lock().poisoned = true;
        self.cv.notify_all();
    }

    /// True when the latest record has completed (or the event was never recorded).
    pub(crate) fn is_complete(&self) -> bool {
        let s = self.lock();
        s.completed >= s.recorded || s.poisoned
    }

    /// The generation of the latest record (0 = never recorded).
    pub(crate) fn generation(&self) -> u64 {
        self.lock().recorded
    }

    /// Blocks until record `generation` completed; returns its timestamp (None if poisoned
    /// before completing or never recorded).
    pub(crate) fn wait_for(&self, generation: u64) -> Option<u64> {
        let mut s = self.lock();
        while s.completed < generation && !s.poisoned {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.completed >= generation { s.ts } else { None }
    }

    /// synEventSynchronize: waits for the latest record, then reports the recording stream's
    /// asynchronous error if any.
    pub(crate) fn synchronize(&self) -> MResult<()> {
        let generation = self.generation();
        self.wait_for(generation);
        let stream = self.lock().stream.clone();
        match stream.and_then(|s| s.async_error()) {
            Some((status, msg)) => fail(status, format!("event {:#x}: stream error: {msg}", self.id)),
            None => Ok(()),
        }
    }

    /// The timestamp of the completed latest record, with the synEventElapsedTime errors:
    /// no EVENT_COLLECT_TIME → synInvalidArgument; never recorded → synObjectNotInitialized;
    /// not yet complete → synBusy.
    pub(crate) fn timestamp(&self) -> MResult<u64> {
        if self.flags & EVENT_COLLECT_TIME == 0 {
            return fail(synStatus::INVALID_ARGUMENT, "event was created without EVENT_COLLECT_TIME");
        }
        let s = self.lock();
        if s.recorded == 0 {
            return fail(synStatus::OBJECT_NOT_INITIALIZED, "event was never recorded");
        }
        if s.completed < s.recorded {
            return fail(synStatus::BUSY, "event has not completed yet");
        }
        match s.ts {
            Some(t) => Ok(t),
            None => fail(synStatus::OBJECT_NOT_INITIALIZED, "event has no timestamp (device released)"),
        }
    }
}
