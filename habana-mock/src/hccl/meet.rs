//! The rendezvous of the in-process ranks of one communicator, used by the direct shared-memory
//! all-reduce (`shm.rs`).
//!
//! Owns: [`Meet`] (where ranks publish their buffers for one collective), its state and the
//! process-global registry of meets (keyed by communicator token). Must not touch: the
//! algorithm (`shm.rs`), communicators or transports (a leaf of `hccl/`).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

/// Rendezvous of the ranks of one in-process communicator.
#[derive(Debug)]
pub(crate) struct Meet {
    /// World size.
    pub(super) n: u32,
    /// The state of the current collective.
    pub(super) st: Mutex<St>,
    /// Notified at every state change.
    pub(super) cv: Condvar,
}

/// The rendezvous state of one collective (read and written by `shm.rs`'s algorithm).
#[derive(Debug)]
pub(super) struct St {
    /// Collective sequence number this state belongs to.
    pub seq: u64,
    /// Ranks that published their buffer.
    pub arrived: u32,
    /// Set by the last arriver: every rank is committed.
    pub go: bool,
    /// Ranks past the reduce step.
    pub reduced: u32,
    /// Ranks past the gather step.
    pub gathered: u32,
    /// Per rank: published buffer address and length in bytes (None: not joined).
    pub bufs: Vec<Option<(usize, usize)>>,
}

impl St {
    /// The state of collective `seq` of `n` ranks before anyone arrived.
    pub(super) fn fresh(seq: u64, n: u32) -> Self {
        Self { seq, arrived: 0, go: false, reduced: 0, gathered: 0, bufs: vec![None; n as usize] }
    }
}

fn meets() -> MutexGuard<'static, HashMap<[u8; 16], Weak<Meet>>> {
    static M: OnceLock<Mutex<HashMap<[u8; 16], Weak<Meet>>>> = OnceLock::new();
    M.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The meet shared by the in-process ranks of communicator `token` (`n` ranks), created by
/// the first rank that asks; freed when the last communicator holding it is dropped.
pub(crate) fn meet_for(token: [u8; 16], n: u32) -> Arc<Meet> {
    let mut m = meets();
    m.retain(|_, w| w.strong_count() > 0);
    if let Some(a) = m.get(&token).and_then(Weak::upgrade)
        && a.n == n
    {
        return a;
    }
    let a = Arc::new(Meet { n, st: Mutex::new(St::fresh(0, n)), cv: Condvar::new() });
    m.insert(token, Arc::downgrade(&a));
    a
}

impl Meet {
    /// Locks the state (a poisoned lock is recovered).
    pub(super) fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Non-cancellable barrier on counter `f` (only used after `go`).
    pub(super) fn barrier(&self, f: fn(&mut St) -> &mut u32) {
        let mut st = self.lock();
        *f(&mut st) += 1;
        self.cv.notify_all();
        while *f(&mut st) < self.n {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}
