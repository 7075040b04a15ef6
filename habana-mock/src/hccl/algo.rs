//! Collective algorithms of the mock over host copies of the buffers: the lockstep header
//! exchange, rank-ordered direct reduce-scatter and ring all-gather (chunked, pipelined
//! across ranks), ring
//! pipeline broadcast, reduce (reduce-scatter + gather to root), all-to-all and barrier, and
//! the virtual-time cost model.
//!
//! Owns: the order in which elements are combined. Every element is reduced by the one rank
//! that owns its segment, in rank order 0, 1, …, n-1 (`Ring::reduce_scatter`, the order of the
//! shared-memory all-reduce too), rounded once by that rank, then copied to every other rank
//! (ring all-gather), so results are bitwise identical on all ranks and in every launch mode. The
//! header also says whether this rank can run the shared-memory all-reduce (`shm.rs`); it is
//! used only when every rank says so. Must not touch:
//! device memory (the caller copies in and out) or communicator lifetime.

use std::sync::Mutex;

use habana_sys::hcclResult_t;

use super::comm::{Comm, OpCtx};
use super::reduce::{Dtype, RedOp, reduce_into, seg};
use super::shm;
use super::transport::{Kind, Rx};
use crate::error::HErr;

/// Bytes per pipelined chunk on the ring.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;
/// Fixed cost per collective in the virtual-time model, ns (order of a Gaudi2 HCCL launch).
pub(crate) const ALPHA_NS: f64 = 5_000.0;

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum CollKind {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Broadcast = 4,
    Reduce = 5,
    AllToAll = 6,
    Barrier = 7,
}

impl CollKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "hcclAllReduce",
            Self::ReduceScatter => "hcclReduceScatter",
            Self::AllGather => "hcclAllGather",
            Self::Broadcast => "hcclBroadcast",
            Self::Reduce => "hcclReduce",
            Self::AllToAll => "hcclAlltoAll",
            Self::Barrier => "hcclBarrier",
        }
    }

    /// (input elements, output elements) for `count` on `n` ranks.
    pub(crate) fn sizes(self, count: u64, n: u64) -> (u64, u64) {
        match self {
            Self::ReduceScatter => (count.saturating_mul(n), count),
            Self::AllGather => (count, count.saturating_mul(n)),
            Self::Barrier => (0, 0),
            _ => (count, count),
        }
    }
}

/// One collective as issued (validated at enqueue).
#[derive(Clone, Debug)]
pub(crate) struct Coll {
    pub kind: CollKind,
    pub dtype: Dtype,
    pub dtype_code: i32,
    pub op: RedOp,
    pub op_code: i32,
    pub count: u64,
    pub root: u32,
    pub seq: u64,
}

fn header_bytes(c: &Coll, start_ns: u64, direct: bool, shm: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&c.seq.to_le_bytes());
    b.extend_from_slice(&(c.kind as u8 as u64).to_le_bytes());
    b.extend_from_slice(&(c.dtype_code as i64).to_le_bytes());
    b.extend_from_slice(&c.count.to_le_bytes());
    b.extend_from_slice(&(c.root as i64).to_le_bytes());
    b.extend_from_slice(&(c.op_code as i64).to_le_bytes());
    b.extend_from_slice(&start_ns.to_le_bytes());
    b.extend_from_slice(&u64::from(direct).to_le_bytes());
    b.extend_from_slice(&u64::from(shm).to_le_bytes());
    b
}

/// Header field index: this rank can run the shared-memory all-reduce (`shm.rs`).
const DIRECT_FIELD: usize = 7;
/// Header field index: this rank can run the cross-process shared-memory all-reduce
/// (`shm_procs.rs`).
const SHM_FIELD: usize = 8;

const FIELDS: [&str; 6] = ["seq", "op", "datatype", "count", "root", "reduceOp"];

fn field(h: &[u8], i: usize) -> u64 {
    h.get(i * 8..i * 8 + 8).map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().expect("8")))
}

fn show(i: usize, v: u64) -> String {
    match i {
        1 => [
            "?",
            "hcclAllReduce",
            "hcclReduceScatter",
            "hcclAllGather",
            "hcclBroadcast",
            "hcclReduce",
            "hcclAlltoAll",
            "hcclBarrier",
        ]
        .get(v as usize)
        .map_or(v.to_string(), |s| s.to_string()),
        2 | 4 | 5 => (v as i64).to_string(),
        _ => v.to_string(),
    }
}

/// Rank `kill` armed by the `HcclKillRank` fault: (rank, abort the process).
pub(crate) static KILL: Mutex<Option<(u32, bool)>> = Mutex::new(None);

/// Runs collective `c` on this rank: header exchange, then data in `bufs`. Returns the latest start
/// time over all ranks (virtual time) from the headers.
pub(crate) fn run(
    comm: &Comm,
    rx: &mut Rx,
    ctx: &OpCtx<'_>,
    c: &Coll,
    start_ns: u64,
    bufs: Bufs<'_>,
) -> Result<u64, HErr> {
    let (n, r) = (comm.n, comm.rank);
    let kill = {
        let mut k = KILL.lock().unwrap_or_else(|e| e.into_inner());
        match *k {
            Some((rank, abort)) if rank == r => {
                *k = None;
                Some(abort)
            }
            _ => None,
        }
    };
    comm.check(rx, ctx)?;
    let len_ok = match &bufs {
        Bufs::InPlace(b) => b.len(),
        Bufs::Scratch { input, .. } => input.len(),
    } as u64
        == c.count.saturating_mul(c.dtype.size() as u64);
    let can_direct = comm.meet.is_some()
        && kill.is_none()
        && c.kind == CollKind::AllReduce
        && c.dtype.size() == c.dtype.acc_size()
        && len_ok;
    // Processes of this host: every peer is reached over loopback (the data-plane listeners
    // bind 127.0.0.1), none in this process (those use the direct path).
    let can_shm = comm.meet.is_none()
        && n > 1
        && kill.is_none()
        && c.kind == CollKind::AllReduce
        && c.dtype.size() == c.dtype.acc_size()
        && len_ok
        && comm.all_peers_local_host()
        && super::shm_procs::available();
    let mine = header_bytes(c, start_ns, can_direct, can_shm);
    let mut direct = false;
    let mut shm = false;
    let mut max_start = start_ns;
    if n > 1 {
        for p in (0..n).filter(|&p| p != r) {
            comm.send(rx, ctx, p, Kind::Header, c.seq, mine.clone())?;
        }
        let mut all: Vec<Vec<u8>> = Vec::with_capacity(n as usize);
        for p in 0..n {
            all.push(if p == r { mine.clone() } else { comm.recv(rx, ctx, p, Kind::Header, c.seq)? });
        }
        for (i, name) in FIELDS.iter().enumerate() {
            if let Some(b) = (1..n as usize).find(|&b| field(&all[b], i) != field(&all[0], i)) {
                let msg = format!(
                    "lockstep mismatch: rank 0 has {name}={}, rank {b} has {name}={}",
                    show(i, field(&all[0], i)),
                    show(i, field(&all[b], i))
                );
                return Err(comm.fail(ctx, hcclResult_t::INVALID_USAGE, msg));
            }
        }
        max_start = all.iter().map(|h| field(h, 6)).max().unwrap_or(start_ns);
        direct = all.iter().all(|h| field(h, DIRECT_FIELD) == 1);
        shm = all.iter().all(|h| field(h, SHM_FIELD) == 1);
    }
    if direct && let Some(meet) = &comm.meet {
        // Every rank agreed in its header: all in this process, no fault armed.
        match bufs {
            Bufs::InPlace(buf) => shm::all_reduce(meet, comm, rx, ctx, c.seq, c.dtype, c.op, buf)?,
            Bufs::Scratch { input, output } => {
                shm::all_reduce(meet, comm, rx, ctx, c.seq, c.dtype, c.op, input)?;
                std::mem::swap(input, output);
            }
        }
        return Ok(max_start);
    }
    if shm {
        // Every rank agreed in its header: processes of this host, no fault armed.
        match bufs {
            Bufs::InPlace(buf) => super::shm_procs::all_reduce(comm, rx, ctx, c.seq, c.dtype, c.op, buf)?,
            Bufs::Scratch { input, output } => {
                super::shm_procs::all_reduce(comm, rx, ctx, c.seq, c.dtype, c.op, input)?;
                std::mem::swap(input, output);
            }
        }
        return Ok(max_start);
    }
    let ring = Ring { comm, ctx, seq: c.seq, kill };
    match bufs {
        Bufs::Scratch { input, output } => ring.data(rx, c, input, output)?,
        Bufs::InPlace(buf) => {
            let (count, sz) = (c.count as usize, c.dtype.size());
            ring.reduce_scatter(rx, buf, count, sz, c, 0)?;
            ring.all_gather(rx, buf, count, sz, 1)?;
        }
    }
    Ok(max_start)
}

/// Where a collective's data lives while it runs.
pub(crate) enum Bufs<'x> {
    /// Host copies: `input` holds the send buffer (device dtype bytes; empty when unused; may
    /// be consumed), `output` receives the result (sized by the operation).
    Scratch { input: &'x mut Vec<u8>, output: &'x mut Vec<u8> },
    /// An all-reduce whose accumulation type is its device type, run directly in the receive
    /// buffer (already holding this rank's input).
    InPlace(&'x mut [u8]),
}

struct Ring<'a, 'b> {
    comm: &'a Comm,
    ctx: &'a OpCtx<'b>,
    seq: u64,
    kill: Option<bool>,
}

fn modn(v: i64, n: u32) -> usize {
    v.rem_euclid(n as i64) as usize
}

impl Ring<'_, '_> {
    fn next(&self) -> u32 {
        (self.comm.rank + 1) % self.comm.n
    }
    fn prev(&self) -> u32 {
        (self.comm.rank + self.comm.n - 1) % self.comm.n
    }

    fn send(&self, rx: &mut Rx, to: u32, bytes: Vec<u8>) -> Result<(), HErr> {
        self.comm.send(rx, self.ctx, to, Kind::Data, self.seq, bytes)?;
        if let Some(abort) = self.kill {
            if abort {
                std::process::abort();
            }
            self.comm.close("was killed by fault injection (HcclKillRank)");
            let msg = format!("rank {}: {}: killed by fault injection", self.comm.rank, self.ctx.what());
            self.comm.set_error(hcclResult_t::INTERNAL_ERROR, &msg);
            return Err(HErr::new(hcclResult_t::INTERNAL_ERROR, msg));
        }
        Ok(())
    }

    fn recv(&self, rx: &mut Rx, from: u32, len: usize) -> Result<Vec<u8>, HErr> {
        let b = self.comm.recv(rx, self.ctx, from, Kind::Data, self.seq)?;
        if b.len() != len {
            let msg = format!("lockstep mismatch: {} bytes from rank {from}, expected {len}", b.len());
            return Err(self.comm.fail(self.ctx, hcclResult_t::INVALID_USAGE, msg));
        }
        Ok(b)
    }

    fn data(&self, rx: &mut Rx, c: &Coll, input: &mut Vec<u8>, output: &mut Vec<u8>) -> Result<(), HErr> {
        let (n, r) = (self.comm.n as usize, self.comm.rank as usize);
        let (dsz, asz) = (c.dtype.size(), c.dtype.acc_size());
        let count = c.count as usize;
        let (_, oe) = c.kind.sizes(c.count, n as u64);
        if !(c.kind == CollKind::AllReduce && dsz == asz) {
            output.clear();
            output.resize(oe as usize * dsz, 0);
        }
        match c.kind {
            CollKind::Barrier => Ok(()),
            CollKind::AllReduce if dsz == asz => {
                // Accumulation type = device type: reduce and gather in place, no extra copy.
                self.reduce_scatter(rx, input, count, asz, c, 0)?;
                self.all_gather(rx, input, count, dsz, 1)?;
                std::mem::swap(input, output);
                Ok(())
            }
            CollKind::AllReduce => {
                let (own, fin) = self.reduce_own_segment(rx, input, count, c)?;
                output[own.start * dsz..own.end * dsz].copy_from_slice(&fin);
                self.all_gather(rx, output, count, dsz, 1)
            }
            CollKind::ReduceScatter => {
                let mut work = c.dtype.to_acc(input);
                self.reduce_scatter(rx, &mut work, count * n, asz, c, -1)?;
                let own = seg(count * n, n, r);
                output.clear();
                c.dtype.round_acc(&work[own.start * asz..own.end * asz], output);
                Ok(())
            }
            CollKind::AllGather => {
                output[r * count * dsz..(r + 1) * count * dsz].copy_from_slice(input);
                self.all_gather(rx, output, count * n, dsz, 0)
            }
            CollKind::Broadcast => self.broadcast(rx, c.root, input, output),
            CollKind::Reduce => {
                let (own, fin) = self.reduce_own_segment(rx, input, count, c)?;
                if r as u32 == c.root {
                    output[own.start * dsz..own.end * dsz].copy_from_slice(&fin);
                    for p in (0..n).filter(|&p| p != r) {
                        let s = seg(count, n, (p + 1) % n);
                        let b = self.recv(rx, p as u32, s.len() * dsz)?;
                        output[s.start * dsz..s.end * dsz].copy_from_slice(&b);
                    }
                } else {
                    self.send(rx, c.root, fin)?;
                }
                Ok(())
            }
            CollKind::AllToAll => {
                let b = count / n * dsz;
                for p in (0..n).filter(|&p| p != r) {
                    self.send(rx, p as u32, input[p * b..(p + 1) * b].to_vec())?;
                }
                output[r * b..(r + 1) * b].copy_from_slice(&input[r * b..(r + 1) * b]);
                for p in (0..n).filter(|&p| p != r) {
                    let d = self.recv(rx, p as u32, b)?;
                    output[p * b..(p + 1) * b].copy_from_slice(&d);
                }
                Ok(())
            }
        }
    }

    /// Ring reduce-scatter of `input` (`count` device elements) in the accumulation type with
    /// offset 0, then this rank's fully reduced segment (r+1) rounded once to the device type:
    /// (its element range, its bytes). The first half of all-reduce and of reduce.
    fn reduce_own_segment(
        &self,
        rx: &mut Rx,
        input: &[u8],
        count: usize,
        c: &Coll,
    ) -> Result<(std::ops::Range<usize>, Vec<u8>), HErr> {
        let (dsz, asz) = (c.dtype.size(), c.dtype.acc_size());
        let mut work = c.dtype.to_acc(input);
        self.reduce_scatter(rx, &mut work, count, asz, c, 0)?;
        let own = seg(count, self.comm.n as usize, modn(self.comm.rank as i64 + 1, self.comm.n));
        let mut fin = Vec::with_capacity(own.len() * dsz);
        c.dtype.round_acc(&work[own.start * asz..own.end * asz], &mut fin);
        Ok((own, fin))
    }

    /// Reduce-scatter of `work` (`count` accumulation elements of `asz` bytes) in the
    /// documented rank order: afterwards rank r holds segment r+o+1 fully reduced (written
    /// back into `work`), every element of it combined as
    /// `op(…op(op(x_0, x_1), x_2)…, x_{n-1})` over ranks 0, 1, …, n-1 — the same order as the
    /// shared-memory all-reduce (`shm.rs`), so thread ranks and process ranks give bitwise
    /// identical results for any n (a ring chain would start each segment at a different
    /// rank, and f32 addition is not associative). Every rank sends each chunk of the segment
    /// owned by rank p straight to p (chunk by chunk, to p = r+1, r+2, … so the ranks do not
    /// all send to the same owner at once), then combines the chunks of its own segment it
    /// received, in rank order; the bytes each rank sends, (n-1)/n of the buffer, are the
    /// ring's.
    fn reduce_scatter(
        &self,
        rx: &mut Rx,
        work: &mut [u8],
        count: usize,
        asz: usize,
        c: &Coll,
        o: i64,
    ) -> Result<(), HErr> {
        let (n, r) = (self.comm.n, self.comm.rank);
        if n == 1 {
            return Ok(());
        }
        let per = (CHUNK_BYTES / asz).max(1);
        let seg_of = |rank: u32| seg(count, n as usize, modn(rank as i64 + o + 1, n));
        let own = seg_of(r);
        let chunks = |s: &std::ops::Range<usize>| s.len().div_ceil(per);
        let most = (0..n).map(|p| chunks(&seg_of(p))).max().unwrap_or(0);
        let mut acc = Vec::with_capacity(per.min(own.len()) * asz);
        for i in 0..most {
            for k in 1..n {
                let to = (r + k) % n;
                let s = seg_of(to);
                if i < chunks(&s) {
                    let a = s.start + i * per;
                    let b = (a + per).min(s.end);
                    self.send(rx, to, work[a * asz..b * asz].to_vec())?;
                }
            }
            if i < chunks(&own) {
                let a = own.start + i * per;
                let b = (a + per).min(own.end);
                let len = (b - a) * asz;
                acc.clear();
                for p in 0..n {
                    let from_p = if p == r { None } else { Some(self.recv(rx, p, len)?) };
                    let x = from_p.as_deref().unwrap_or(&work[a * asz..b * asz]);
                    if p == 0 {
                        acc.extend_from_slice(x);
                    } else {
                        reduce_into(c.dtype, c.op, &mut acc, x);
                    }
                }
                work[a * asz..b * asz].copy_from_slice(&acc);
            }
        }
        Ok(())
    }

    /// Ring all-gather of `out` (`count` elements of `esz` bytes) where rank r initially holds
    /// segment r+o: at step k it sends segment r+o-k and stores segment r+o-k-1; received
    /// chunks are forwarded as is at the next step.
    fn all_gather(&self, rx: &mut Rx, out: &mut [u8], count: usize, esz: usize, o: i64) -> Result<(), HErr> {
        self.ring_pass(rx, out, count, esz, o, |inc, local, last| {
            local.copy_from_slice(&inc);
            (!last).then_some(inc)
        })
    }

    /// The chunked ring pass of [`Self::all_gather`] over
    /// `buf` (`count` elements of `esz` bytes): at step k (0..n-1) rank r sends segment r+o-k
    /// and receives segment r+o-k-1 from its predecessor, in chunks of [`CHUNK_BYTES`]
    /// interleaved send/receive so the ring pipelines. A chunk to send is the one `take`
    /// returned for it at the previous step, else read from `buf`. `take(received, local,
    /// last)` gets each received chunk with the same elements of `buf` and whether this is the
    /// last step, and returns the chunk to forward at the next step (ignored at the last step).
    fn ring_pass(
        &self,
        rx: &mut Rx,
        buf: &mut [u8],
        count: usize,
        esz: usize,
        o: i64,
        mut take: impl FnMut(Vec<u8>, &mut [u8], bool) -> Option<Vec<u8>>,
    ) -> Result<(), HErr> {
        let (n, r) = (self.comm.n, self.comm.rank as i64);
        let per = (CHUNK_BYTES / esz).max(1);
        let mut carry: Vec<Option<Vec<u8>>> = Vec::new();
        for k in 0..n as i64 - 1 {
            let s = seg(count, n as usize, modn(r + o - k, n));
            let d = seg(count, n as usize, modn(r + o - k - 1, n));
            let (cs, cd) = (s.len().div_ceil(per), d.len().div_ceil(per));
            let last = k == n as i64 - 2;
            let mut next = Vec::with_capacity(cd);
            for i in 0..cs.max(cd) {
                if i < cs {
                    let a = s.start + i * per;
                    let b = (a + per).min(s.end);
                    let chunk = match carry.get_mut(i).and_then(Option::take) {
                        Some(v) => v,
                        None => buf[a * esz..b * esz].to_vec(),
                    };
                    self.send(rx, self.next(), chunk)?;
                }
                if i < cd {
                    let a = d.start + i * per;
                    let b = (a + per).min(d.end);
                    let inc = self.recv(rx, self.prev(), (b - a) * esz)?;
                    let fwd = take(inc, &mut buf[a * esz..b * esz], last);
                    if !last {
                        next.push(fwd);
                    }
                }
            }
            carry = next;
        }
        Ok(())
    }

    /// Pipeline along the ring starting at `root`: each rank forwards chunks to its successor
    /// as they arrive (the last rank before the root does not forward).
    fn broadcast(&self, rx: &mut Rx, root: u32, input: &[u8], out: &mut [u8]) -> Result<(), HErr> {
        let n = self.comm.n;
        let pos = (self.comm.rank + n - root) % n;
        if pos == 0 {
            out.copy_from_slice(input);
        }
        if n == 1 {
            return Ok(());
        }
        for a in (0..out.len()).step_by(CHUNK_BYTES) {
            let b = (a + CHUNK_BYTES).min(out.len());
            if pos != 0 {
                let inc = self.recv(rx, self.prev(), b - a)?;
                out[a..b].copy_from_slice(&inc);
            }
            if pos != n - 1 {
                self.send(rx, self.next(), out[a..b].to_vec())?;
            }
        }
        Ok(())
    }
}

/// Modelled duration of `c` on `n` ranks in virtual time, ns: [`ALPHA_NS`] + bytes · factor /
/// bandwidth, factor 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and
/// all-to-all (bytes = the larger buffer), 1 for broadcast and reduce, 0 for barrier
/// (bus-bandwidth conventions of nccl-tests).
pub(crate) fn cost_ns(c: &Coll, n: u32, bandwidth_gbps: f64) -> u64 {
    let (i, o) = c.kind.sizes(c.count, n as u64);
    let bytes = (i.max(o) as f64) * c.dtype.size() as f64;
    let nf = n as f64;
    let factor = match c.kind {
        CollKind::AllReduce => 2.0 * (nf - 1.0) / nf,
        CollKind::ReduceScatter | CollKind::AllGather | CollKind::AllToAll => (nf - 1.0) / nf,
        CollKind::Broadcast | CollKind::Reduce => 1.0,
        CollKind::Barrier => 0.0,
    };
    (ALPHA_NS + bytes * factor / bandwidth_gbps).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_partition_the_range() {
        for count in [0usize, 1, 7, 8, 1000] {
            for n in 1..9 {
                let mut next = 0;
                for s in 0..n {
                    let r = seg(count, n, s);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= count / n + 1);
                    next = r.end;
                }
                assert_eq!(next, count);
            }
        }
    }
}
