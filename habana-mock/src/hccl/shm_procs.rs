//! Shared-memory all-reduce for ranks in different processes of one host (the path of NCCL's
//! SHM transport and Open MPI's shared-memory collectives): one file mapping in `/dev/shm` per
//! communicator, the data copied through it, the small synchronisation frames still on the
//! TCP links, so a dead rank is detected (end of stream) and relayed as before.
//!
//! Owns: the algorithm over a [`Region`] (`shm_region.rs`: the mapping, 2 parities × n slots ×
//! [`SLOT_BYTES`]).
//! Must not touch: the lockstep header (`algo.rs` decides, from every rank's header, that all
//! ranks take this path), the in-process direct path (`shm.rs`), device memory.
//!
//! Algorithm, per chunk of at most [`SLOT_BYTES`] (slots of parity k mod 2 for round k):
//! 1. rank r copies its chunk into its slot r; barrier (a frame to and from every peer);
//! 2. rank r combines segment r of the chunk over slots 0, 1, …, n-1 in rank order
//!    (`acc = op(acc, slot_p)`, the order of the reduce-scatter in `algo.rs` and of `shm.rs`,
//!    so every launch mode gives bitwise-identical results) and writes it into segment r of its
//!    own slot; barrier;
//! 3. rank r copies segment p of slot p into its buffer, for every p.
//!
//! Soundness (no byte written while another process reads it): in step 2, segment r of every
//! slot is touched only by rank r; in step 3 slots are only read. A rank writes its slot of
//! parity k mod 2 again in round k+2 only after the first barrier of round k+1, which every
//! peer reaches after finishing step 3 of round k. Other processes' writes are seen through
//! raw pointers into the mapping (never a long-lived Rust reference to shared bytes).

use std::fs::OpenOptions;

use habana_sys::hcclResult_t;

use super::comm::{Comm, OpCtx};
use super::reduce::{Dtype, RedOp, reduce_into, seg};
use super::shm_region::{Region, SLOT_BYTES};
use super::transport::{Kind, Rx};
use crate::error::HErr;

/// Where the mappings are created (a RAM file system on Linux).
const SHM_DIR: &str = "/dev/shm";

/// Whether this host offers the shared-memory path (the directory of the mappings exists).
pub(crate) fn available() -> bool {
    std::path::Path::new(SHM_DIR).is_dir()
}

/// Sends an empty frame to every peer, then waits for one from every peer: no rank leaves
/// before every rank arrived. Errors: those of [`Comm::recv`] (a dead peer: hcclSocketError;
/// no progress for the timeout: hcclInternalError).
fn barrier(comm: &Comm, rx: &mut Rx, ctx: &OpCtx<'_>, seq: u64) -> Result<(), HErr> {
    for p in (0..comm.n).filter(|&p| p != comm.rank) {
        comm.send(rx, ctx, p, Kind::Data, seq, Vec::new())?;
    }
    for p in (0..comm.n).filter(|&p| p != comm.rank) {
        let b = comm.recv(rx, ctx, p, Kind::Data, seq)?;
        if !b.is_empty() {
            let msg = format!("lockstep mismatch: {} bytes from rank {p} in a shared-memory barrier", b.len());
            return Err(comm.fail(ctx, hcclResult_t::INVALID_USAGE, msg));
        }
    }
    Ok(())
}

/// Creates or opens the communicator's mapping (every rank, in the same collective), waits
/// until every rank mapped it, then rank 0 unlinks the file (the mapping lives on until the
/// last rank drops it; nothing is left in `/dev/shm`, even after a SIGKILL, once set up).
fn setup(comm: &Comm, rx: &mut Rx, ctx: &OpCtx<'_>, seq: u64) -> Result<Region, HErr> {
    let n = comm.n as usize;
    let hex: String = comm.token.iter().map(|b| format!("{b:02x}")).collect();
    let first = &comm.peers[0];
    let path = std::path::Path::new(SHM_DIR).join(format!("dropcompute-mock-{hex}-{}-{:x}", first.pid, first.nonce));
    let len = 2 * n * SLOT_BYTES;
    let mapped = (|| -> std::io::Result<memmap2::MmapMut> {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        f.set_len(len as u64)?;
        // SAFETY: the file is private to this communicator (its name holds the token and rank
        // 0's pid and nonce) and keeps its length; other processes write into it only as the
        // module doc's protocol allows, and we access it only through raw pointers.
        unsafe { memmap2::MmapMut::map_mut(&f) }
    })();
    let map = match mapped {
        Ok(m) => m,
        Err(e) => {
            let msg = format!("cannot map the shared-memory region {}: {e}", path.display());
            return Err(comm.fail(ctx, hcclResult_t::SYSTEM_ERROR, msg));
        }
    };
    barrier(comm, rx, ctx, seq)?;
    if comm.rank == 0 {
        let _ = std::fs::remove_file(&path);
    }
    Ok(Region { map, n, rounds: 0 })
}

/// All-reduce of `buf` (elements of `dtype`, whose accumulation type is its device type) with
/// `op` over the processes of `comm`, which must all run it for collective `seq` (see the
/// module doc). Errors: a dead peer, a timeout or an abort (as [`Comm::recv`]), a mapping that
/// cannot be created (hcclSystemError).
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    comm: &Comm,
    rx: &mut Rx,
    ctx: &OpCtx<'_>,
    seq: u64,
    dtype: Dtype,
    op: RedOp,
    buf: &mut [u8],
) -> Result<(), HErr> {
    let mut guard = comm.shm.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(setup(comm, rx, ctx, seq)?);
    }
    let region = guard.as_mut().expect("set up above");
    let (n, r) = (comm.n as usize, comm.rank as usize);
    let esz = dtype.size();
    let per = SLOT_BYTES / esz;
    let count = buf.len() / esz;
    let mut acc = Vec::new();
    let mut a = 0;
    while a < count {
        let b = (a + per).min(count);
        let parity = region.rounds % 2;
        region.rounds += 1;
        let chunk = &mut buf[a * esz..b * esz];
        let mine = region.slot(parity, r);
        // SAFETY: our slot of this parity holds SLOT_BYTES >= chunk.len(); no peer reads or
        // writes it in this step (module doc), and `chunk` is our own memory.
        unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), mine, chunk.len()) };
        barrier(comm, rx, ctx, seq)?;
        let own = seg(b - a, n, r);
        let (lo, len) = (own.start * esz, own.len() * esz);
        acc.clear();
        acc.resize(len, 0);
        let mut part = vec![0u8; len];
        for p in 0..n {
            let src = region.slot(parity, p);
            // SAFETY: segment r of slot p lies inside the slot; only this rank touches it in
            // this step, so copying it out races with no write.
            unsafe { std::ptr::copy_nonoverlapping(src.add(lo), part.as_mut_ptr(), len) };
            if p == 0 {
                acc.copy_from_slice(&part);
            } else {
                reduce_into(dtype, op, &mut acc, &part);
            }
        }
        // SAFETY: segment r of our own slot, touched by no other rank in this step.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), mine.add(lo), len) };
        barrier(comm, rx, ctx, seq)?;
        for p in 0..n {
            let s = seg(b - a, n, p);
            let src = region.slot(parity, p);
            // SAFETY: segment p of slot p is only read in this step; `chunk` is our memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(s.start * esz),
                    chunk[s.start * esz..].as_mut_ptr(),
                    s.len() * esz,
                )
            };
        }
        a = b;
    }
    Ok(())
}
