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
    /// Per rank: it left the communicator (`hcclCommAbort`, `hcclCommDestroy` or a killed rank).
    /// Kept across collectives: a rank that left never joins a later one.
    pub left: Vec<bool>,
}

impl St {
    /// The state of collective `seq` of `n` ranks before anyone arrived (nobody left).
    pub(super) fn fresh(seq: u64, n: u32) -> Self {
        Self {
            seq,
            arrived: 0,
            go: false,
            reduced: 0,
            gathered: 0,
            bufs: vec![None; n as usize],
            left: vec![false; n as usize],
        }
    }

    /// Starts collective `seq`: nobody arrived; the ranks that left stay gone.
    pub(super) fn reset(&mut self, seq: u64) {
        let left = std::mem::take(&mut self.left);
        *self = Self { left, ..Self::fresh(seq, self.bufs.len() as u32) };
    }

    /// The first rank that left the communicator, if any.
    pub(super) fn first_left(&self) -> Option<u32> {
        self.left.iter().position(|&l| l).map(|p| p as u32)
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

    /// Rank `rank` leaves the communicator (abort, destroy, killed), under the meet's lock:
    /// when the current collective has not started (`go` unset) its published buffer is
    /// withdrawn, so a late peer can never complete a collective with it; every waiting rank
    /// is woken and fails at once, as does every later arrival ([`St::first_left`]). After
    /// `go` the ranks are committed and the collective completes (pure computation). Never
    /// blocks beyond the lock.
    pub(crate) fn leave(&self, rank: u32) {
        let mut st = self.lock();
        let r = rank as usize;
        if r >= st.left.len() || st.left[r] {
            return;
        }
        st.left[r] = true;
        if !st.go && st.bufs[r].take().is_some() {
            st.arrived -= 1;
        }
        self.cv.notify_all();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Publishes `rank`'s buffer for collective `seq` the way `shm.rs` does on arrival.
    fn arrive(m: &Meet, seq: u64, rank: usize) {
        let mut st = m.lock();
        if st.seq != seq {
            st.reset(seq);
        }
        st.bufs[rank] = Some((0x1000 * (rank + 1), 64));
        st.arrived += 1;
        if st.arrived == m.n {
            st.go = true;
        }
    }

    #[test]
    fn a_rank_that_leaves_before_go_is_withdrawn_and_stays_gone_in_later_collectives() {
        let m = meet_for([7; 16], 3);
        arrive(&m, 1, 0);
        arrive(&m, 1, 2);
        m.leave(0);
        {
            let st = m.lock();
            assert_eq!((st.arrived, st.go, st.bufs[0], st.bufs[2]), (1, false, None, Some((0x3000, 64))));
            assert_eq!(st.first_left(), Some(0));
        }
        // Leaving twice changes nothing (abort then destroy).
        m.leave(0);
        assert_eq!(m.lock().arrived, 1);
        // A later collective starts empty but rank 0 is still gone.
        m.lock().reset(2);
        let st = m.lock();
        assert_eq!((st.seq, st.arrived, st.bufs.iter().filter(|b| b.is_some()).count()), (2, 0, 0));
        assert_eq!(st.left, vec![true, false, false]);
    }

    #[test]
    fn a_rank_that_leaves_after_go_stays_committed() {
        let m = meet_for([8; 16], 2);
        arrive(&m, 4, 0);
        arrive(&m, 4, 1);
        m.leave(1);
        let st = m.lock();
        assert_eq!((st.arrived, st.go, st.bufs[1]), (2, true, Some((0x2000, 64))));
        assert_eq!(st.first_left(), Some(1));
    }

    #[test]
    fn a_rank_out_of_range_is_ignored() {
        let m = meet_for([9; 16], 2);
        m.leave(5);
        assert_eq!(m.lock().first_left(), None);
    }
}
