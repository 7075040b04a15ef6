//! Injected faults that every entry point or stream worker consults: the "fail next call" table
//! (with its armed counter, so an unfaulted call never takes a lock) and the stall table.
//!
//! Owns: both tables, each behind its own lock (neither needs the registry: arming a fault
//! changes no other mock state atomically with it). Must not touch: anything else of the crate
//! (a leaf: it imports only std). Parsing a fault and the checks against the configuration are
//! `control.rs`'s; the HCCL faults (kill a rank, asynchronous error) live in `hccl/`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// Number of armed "fail next call" faults: lets every call skip the table when zero.
static ARMED: AtomicUsize = AtomicUsize::new(0);

/// Pending "fail next call" faults: C name -> (raw status, remaining count).
fn table() -> MutexGuard<'static, HashMap<String, (i32, u32)>> {
    static T: OnceLock<Mutex<HashMap<String, (i32, u32)>>> = OnceLock::new();
    T.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Arms `times` failures of the C function `function` with the raw status `status`, replacing
/// any pending ones for that function.
pub(crate) fn arm_fail_next(function: String, status: i32, times: u32) {
    let mut t = table();
    let prev = t.insert(function, (status, times)).map_or(0, |p| p.1);
    ARMED.fetch_add(times as usize, Ordering::AcqRel);
    ARMED.fetch_sub(prev as usize, Ordering::AcqRel);
}

/// Disarms every pending "fail next call" fault.
pub(crate) fn clear_fail_next() {
    let mut t = table();
    let n: u32 = t.values().map(|f| f.1).sum();
    t.clear();
    ARMED.fetch_sub(n as usize, Ordering::AcqRel);
}

/// Consumes one armed fault for the C function `name`, returning its raw status.
pub(crate) fn take(name: &str) -> Option<i32> {
    if ARMED.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut t = table();
    let (status, left) = t.get_mut(name)?;
    let status = *status;
    *left -= 1;
    if *left == 0 {
        t.remove(name);
    }
    ARMED.fetch_sub(1, Ordering::AcqRel);
    Some(status)
}

/// Stall table: `pending` stalls are consumed by the next operation of a module's streams
/// (`None` = until released, `Some(ms)` = for ms); `blocked` holds modules whose worker waits
/// for a release.
#[derive(Default)]
pub(crate) struct StallTable {
    /// Module -> stall to apply to its next stream operation.
    pub pending: HashMap<u32, Option<u64>>,
    /// Modules whose worker waits for a release.
    pub blocked: HashSet<u32>,
}

/// The stall table and the condition variable its waiting workers sleep on.
pub(crate) struct Stalls {
    /// The table.
    pub table: Mutex<StallTable>,
    /// Notified at every release.
    pub cv: Condvar,
}

impl Stalls {
    /// Locks the table (a poisoned lock is recovered: every mutation is a single insert/remove).
    pub(crate) fn lock(&self) -> MutexGuard<'_, StallTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms a stall of the next operation of `module`'s streams.
    pub(crate) fn arm(&self, module: u32, duration_ms: Option<u64>) {
        self.lock().pending.insert(module, duration_ms);
    }

    /// Removes any pending stall of `module` and unblocks its waiting worker.
    pub(crate) fn release(&self, module: u32) {
        let mut t = self.lock();
        t.pending.remove(&module);
        t.blocked.remove(&module);
        self.cv.notify_all();
    }

    /// Removes every stall and unblocks every worker.
    pub(crate) fn clear(&self) {
        let mut t = self.lock();
        t.pending.clear();
        t.blocked.clear();
        self.cv.notify_all();
    }
}

/// The process-global stall table.
pub(crate) fn stalls() -> &'static Stalls {
    static S: OnceLock<Stalls> = OnceLock::new();
    S.get_or_init(|| Stalls { table: Mutex::new(StallTable::default()), cv: Condvar::new() })
}
