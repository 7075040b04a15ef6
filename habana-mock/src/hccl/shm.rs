//! Direct shared-memory all-reduce for communicators whose ranks all live in this mock instance
//! (same process): no frames, no chunk copies through channels.
//!
//! Owns: the direct algorithm, run on the communicator's [`Meet`] (`meet.rs`). Must not touch: the lockstep header exchange or the ring (`algo.rs`),
//! transports, device memory locking (the caller holds the buffer's allocation lock until this
//! returns).
//!
//! Algorithm (all ranks, after the header exchange agreed every rank takes this path):
//! 1. entry: publish the buffer address and wait (cancellable: abort, peer failure, peer gone,
//!    timeout) until every rank has published; the last arriver sets `go`. Before `go` a rank
//!    may withdraw; after `go` every rank is committed. A rank that leaves the communicator
//!    (`hcclCommAbort`, destroy, killed) is withdrawn at once under the meet's lock
//!    ([`Meet::leave`]), so a late peer can never complete a collective with an aborted rank:
//!    waiting and later arrivals fail with the peer gone.
//! 2. reduce: rank r combines segment r of every rank's buffer, in rank order 0, 1, …, n-1
//!    (`acc = op(acc, buf_p)`, p ascending) and writes it into its own segment r. Each element is
//!    therefore reduced exactly once, by one rank, in a fixed order: results are bitwise
//!    identical on all ranks.
//! 3. barrier (not cancellable), 4. gather: rank r copies segment p from rank p for every p ≠ r,
//!    5. barrier (not cancellable), then return.
//!
//! Soundness: during steps 2–4 rank r writes only segment r of its own buffer (step 2) or
//! segments p ≠ r of its own buffer (step 4); in step 2 segment r of any buffer is touched only
//! by rank r, in step 4 segment p of buffer p is only read (by everyone) and segment p of buffer
//! r ≠ p is only written (by rank r). The barriers separate the steps, so no byte is written
//! while another thread reads or writes it. Each buffer stays valid until its owner returns,
//! which is after the final barrier, i.e. after every peer stopped reading it. The post-`go`
//! barriers wait only on ranks doing pure computation, so they terminate.

use std::time::{Duration, Instant};

use habana_sys::hcclResult_t;

use super::comm::{Comm, OpCtx};
use super::meet::Meet;
use super::reduce::{Dtype, RedOp, reduce_into, seg};
use super::transport::Rx;
use crate::error::HErr;

/// The error of a rank meeting collective `seq` after rank `p` left the communicator: this
/// rank's own abort (as [`Comm::check`] reports it) or a peer gone (hcclSocketError naming it).
fn left_error(comm: &Comm, rx: &Rx, ctx: &OpCtx<'_>, p: u32) -> HErr {
    if let Err(e) = comm.check(rx, ctx) {
        return e;
    }
    let pid = comm.peers.get(p as usize).map_or(0, |q| q.pid);
    let msg = format!("peer rank {p} (pid {pid}) is gone (it left the communicator: aborted, destroyed or killed)");
    comm.fail(ctx, hcclResult_t::SOCKET_ERROR, msg)
}

/// Bytes combined per step of the reduction (a cache-resident accumulator).
const TILE_BYTES: usize = 32 << 10;

/// All-reduce of `buf` (`count` elements of `dtype`, whose accumulation type is its device
/// type) with `op` across the ranks of `comm`, which must all run this function for collective
/// `seq`. Errors (before the ranks committed): the comm or stream is aborted, an async error or
/// a peer failure (codes as in [`Comm::recv`]), a peer gone (hcclSocketError), no progress for
/// the comm timeout (hcclInternalError).
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    meet: &Meet,
    comm: &Comm,
    rx: &mut Rx,
    ctx: &OpCtx<'_>,
    seq: u64,
    dtype: Dtype,
    op: RedOp,
    buf: &mut [u8],
) -> Result<(), HErr> {
    let (n, r) = (meet.n as usize, comm.rank as usize);
    let esz = dtype.size();
    let count = buf.len() / esz;
    let me = (buf.as_mut_ptr() as usize, buf.len());
    // From here on `buf` is only accessed through the published raw address (peers too).
    let bufs = {
        let mut st = meet.lock();
        if st.seq != seq {
            st.reset(seq);
        }
        if let Some(p) = st.first_left() {
            // A rank that left (this one or a peer) never joins: fail before publishing.
            return Err(left_error(comm, rx, ctx, p));
        }
        st.bufs[r] = Some(me);
        st.arrived += 1;
        if st.arrived == meet.n {
            st.go = true;
            meet.cv.notify_all();
        }
        let deadline = Instant::now() + comm.timeout;
        while !st.go {
            st = meet.cv.wait_timeout(st, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()).0;
            if st.go {
                break;
            }
            rx.drain();
            let err = if let Some(p) = st.first_left() {
                Some(left_error(comm, rx, ctx, p))
            } else {
                match comm.check(rx, ctx) {
                    Err(e) => Some(e),
                    Ok(()) => {
                        if let Some((p, why)) = rx.gone.iter().enumerate().find_map(|(p, g)| g.clone().map(|g| (p, g)))
                        {
                            let pid = comm.peers.get(p).map_or(0, |q| q.pid);
                            let msg = format!("peer rank {p} (pid {pid}) is gone ({why})");
                            Some(comm.fail(ctx, hcclResult_t::SOCKET_ERROR, msg))
                        } else if Instant::now() >= deadline {
                            let p = st.bufs.iter().position(Option::is_none).unwrap_or(r);
                            let msg = format!("timed out after {} ms waiting for rank {p}", comm.timeout.as_millis());
                            Some(comm.fail(ctx, hcclResult_t::INTERNAL_ERROR, msg))
                        } else {
                            None
                        }
                    }
                }
            };
            if let Some(e) = err {
                // Withdraw (unless `Meet::leave` already did): `go` is not set, so no peer has
                // read our address.
                if st.bufs[r].take().is_some() {
                    st.arrived -= 1;
                }
                return Err(e);
            }
        }
        st.bufs.iter().map(|b| b.unwrap_or((0, usize::MAX))).collect::<Vec<_>>()
    };
    if bufs.iter().any(|&(_, len)| len != buf.len()) {
        // Unreachable after the header check (same count and dtype); never touch peers then.
        meet.barrier(|s| &mut s.reduced);
        meet.barrier(|s| &mut s.gathered);
        let msg = format!("lockstep mismatch: buffer lengths {:?}", bufs.iter().map(|b| b.1).collect::<Vec<_>>());
        return Err(comm.fail(ctx, hcclResult_t::INVALID_USAGE, msg));
    }
    let own = seg(count, n, r);
    let per = (TILE_BYTES / esz).max(1);
    let mut acc = vec![0u8; per.min(own.len()) * esz];
    let mut a = own.start;
    while a < own.end {
        let b = (a + per).min(own.end);
        let (lo, len) = (a * esz, (b - a) * esz);
        let acc = &mut acc[..len];
        for (p, &(base, _)) in bufs.iter().enumerate() {
            // SAFETY: `base` is a live buffer of `buf.len()` bytes (its owner waits in the final
            // barrier before releasing it); [lo, lo+len) lies in segment r, which during this
            // step only this rank accesses (module doc), so a shared view is not aliased by a
            // write.
            let src = unsafe { std::slice::from_raw_parts((base as *const u8).add(lo), len) };
            if p == 0 {
                acc.copy_from_slice(src);
            } else {
                reduce_into(dtype, op, acc, src);
            }
        }
        // SAFETY: our own buffer, segment r; no other view of these bytes exists now (the shared
        // view above has ended, peers do not touch segment r of our buffer in this step).
        let dst = unsafe { std::slice::from_raw_parts_mut((me.0 as *mut u8).add(lo), len) };
        dst.copy_from_slice(acc);
        a = b;
    }
    meet.barrier(|s| &mut s.reduced);
    for (p, &(base, _)) in bufs.iter().enumerate().filter(|&(p, _)| p != r) {
        let s = seg(count, n, p);
        let (lo, len) = (s.start * esz, s.len() * esz);
        // SAFETY: segment p of rank p's live buffer is only read during this step (module doc).
        let src = unsafe { std::slice::from_raw_parts((base as *const u8).add(lo), len) };
        // SAFETY: segment p ≠ r of our own buffer: only this rank writes it and nobody reads it
        // during this step; distinct from `src` (another rank's buffer).
        let dst = unsafe { std::slice::from_raw_parts_mut((me.0 as *mut u8).add(lo), len) };
        dst.copy_from_slice(src);
    }
    meet.barrier(|s| &mut s.gathered);
    Ok(())
}
