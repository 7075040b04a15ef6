//! Stream, event and copy calls of the mock: validation at enqueue time, then queueing on the
//! stream worker.
//!
//! Owns: the argument checks of synStream*, synEvent* and synMemCopyAsync*. Must not touch:
//! memory contents (the worker does, through `CopyPiece`).

use std::sync::Arc;

use habana_sys::{synDeviceId, synDmaDir, synStatus};

use crate::error::{MResult, fail};
use crate::event::Event;
use crate::memory::CopyPiece;
use crate::state::registry;
use crate::stream::{Op, Stream};

fn shut(stream: &Stream) -> MResult<()> {
    fail(synStatus::INVALID_ARGUMENT, format!("stream {:#x} is shut down", stream.id))
}

pub(crate) fn stream_create(device: synDeviceId, flags: u32) -> MResult<u64> {
    let mut r = registry();
    let m = r.module_of(device)?;
    if flags != 0 {
        return fail(synStatus::INVALID_ARGUMENT, format!("flags {flags:#x} (the mock supports 0)"));
    }
    let id = r.new_handle();
    let s = match Stream::spawn(id, m, r.config.time_mode) {
        Ok(s) => s,
        Err(e) => {
            return fail(synStatus::OUT_OF_RESOURCES, format!("cannot start a stream thread: {e}"));
        }
    };
    r.streams.insert(id, Arc::new(s));
    Ok(id)
}

/// Pending work → synBusy (the stream stays alive).
pub(crate) fn stream_destroy(h: u64) -> MResult<()> {
    let s = {
        let mut r = registry();
        let s = r.stream(h)?;
        if s.shared.busy() {
            return fail(synStatus::BUSY, "stream has pending work");
        }
        r.streams.remove(&h);
        s
    };
    s.shutdown(false);
    Ok(())
}

/// The event must belong to the stream's module; flags must be 0.
pub(crate) fn stream_wait_event(sh: u64, eh: u64, flags: u32) -> MResult<()> {
    let (s, e) = {
        let r = registry();
        (r.stream(sh)?, r.event(eh)?)
    };
    if flags != 0 {
        return fail(synStatus::INVALID_ARGUMENT, format!("flags {flags:#x} must be 0"));
    }
    if e.module != s.module {
        return fail(
            synStatus::INVALID_ARGUMENT,
            format!("event of module {} waited on a stream of module {}", e.module, s.module),
        );
    }
    let generation = e.generation();
    if generation == 0 {
        return Ok(()); // never recorded: complete
    }
    if !s.enqueue(Op::Wait { event: e, generation }) {
        return shut(&s);
    }
    Ok(())
}

pub(crate) fn stream_synchronize(sh: u64) -> MResult<()> {
    let s = registry().stream(sh)?;
    s.shared.wait_idle();
    match s.shared.error() {
        Some((status, msg)) => fail(status, format!("asynchronous stream error: {msg}")),
        None => Ok(()),
    }
}

/// synBusy while work is pending; the sticky error once idle.
pub(crate) fn stream_query(sh: u64) -> MResult<()> {
    let s = registry().stream(sh)?;
    if s.shared.busy() {
        return fail(synStatus::BUSY, "stream has pending work");
    }
    match s.shared.error() {
        Some((status, msg)) => fail(status, format!("asynchronous stream error: {msg}")),
        None => Ok(()),
    }
}

pub(crate) fn event_create(device: synDeviceId, flags: u32) -> MResult<u64> {
    let mut r = registry();
    let m = r.module_of(device)?;
    let id = r.new_handle();
    r.events.insert(id, Arc::new(Event::new(id, m, flags)));
    Ok(id)
}

pub(crate) fn event_destroy(eh: u64) -> MResult<()> {
    let mut r = registry();
    let e = r.event(eh)?;
    r.events.remove(&eh);
    r.event_maps.remove(&eh);
    e.poison();
    Ok(())
}

pub(crate) fn event_record(eh: u64, sh: u64) -> MResult<()> {
    let (e, s) = {
        let r = registry();
        (r.event(eh)?, r.stream(sh)?)
    };
    if e.module != s.module {
        return fail(
            synStatus::INVALID_ARGUMENT,
            format!("event of module {} recorded on a stream of module {}", e.module, s.module),
        );
    }
    let generation = e.begin_record(s.shared.clone());
    if !s.enqueue(Op::Record { event: e.clone(), generation }) {
        e.complete(generation, 0);
        return shut(&s);
    }
    Ok(())
}

pub(crate) fn event_query(eh: u64) -> MResult<()> {
    let e = registry().event(eh)?;
    if e.is_complete() { Ok(()) } else { fail(synStatus::BUSY, "event not reached yet") }
}

pub(crate) fn event_synchronize(eh: u64) -> MResult<()> {
    let e = registry().event(eh)?;
    e.synchronize()
}

/// ns between the two events (saturating at 0), or the start timestamp when `end` is None.
pub(crate) fn elapsed(start: u64, end: Option<u64>) -> MResult<u64> {
    let (s, e) = {
        let r = registry();
        let s = r.event(start)?;
        let e = match end {
            Some(h) => Some(r.event(h)?),
            None => None,
        };
        (s, e)
    };
    let t0 = s.timestamp()?;
    match e {
        None => Ok(t0),
        Some(e) => Ok(e.timestamp()?.saturating_sub(t0)),
    }
}

/// Validates and enqueues copies `(src, size, dst)` in direction `dir` on stream `sh`. Host
/// addresses must lie in a registered host range, device ranges in live allocations of the
/// stream's module. The whole batch is validated before anything is queued.
pub(crate) fn mem_copy(sh: u64, copies: &[(u64, u64, u64)], dir: synDmaDir) -> MResult<()> {
    let r = registry();
    let s = r.stream(sh)?;
    let m = s.module;
    let mut pieces = Vec::with_capacity(copies.len());
    let mut bytes = 0u64;
    for &(src, len, dst) in copies {
        if len == 0 {
            continue;
        }
        bytes = bytes.saturating_add(len);
        let piece = match dir {
            synDmaDir::HOST_TO_DRAM => {
                let host = r.host_range(src as usize, len)?;
                let (d, dst_off) = r.device_range(m, dst, len)?;
                CopyPiece::HostToDevice { host, src: src as usize, dst: d, dst_off, len }
            }
            synDmaDir::DRAM_TO_HOST => {
                let (sa, src_off) = r.device_range(m, src, len)?;
                let host = r.host_range(dst as usize, len)?;
                CopyPiece::DeviceToHost { src: sa, src_off, host, dst: dst as usize, len }
            }
            synDmaDir::DRAM_TO_DRAM => {
                let (sa, src_off) = r.device_range(m, src, len)?;
                let (d, dst_off) = r.device_range(m, dst, len)?;
                CopyPiece::DeviceToDevice { src: sa, src_off, dst: d, dst_off, len }
            }
            other => return fail(synStatus::INVALID_ARGUMENT, format!("direction {other}")),
        };
        pieces.push(piece);
    }
    let latency_ns = (bytes as f64 / r.config.copy_bandwidth_gbps).round() as u64;
    drop(r);
    if !s.enqueue(Op::Copy { pieces, latency_ns }) {
        return shut(&s);
    }
    Ok(())
}

/// `synMemsetD{8,16,32}Async`: fills `count` elements of `pattern.len()` bytes at device address
/// `addr` (a live allocation of the stream's module) on stream `sh`, costed as a device write at
/// the graph cost model's memory bandwidth.
pub(crate) fn memset(sh: u64, addr: u64, pattern: Vec<u8>, count: usize) -> MResult<()> {
    let r = registry();
    let s = r.stream(sh)?;
    let len = (count as u64).checked_mul(pattern.len() as u64).ok_or_else(|| {
        crate::error::MockError::new(synStatus::INVALID_ARGUMENT, format!("{count} elements overflow"))
    })?;
    if len == 0 {
        return Ok(()); // nothing to fill (as cuMemsetD32Async with N = 0)
    }
    let (dst, dst_off) = r.device_range(s.module, addr, len)?;
    let latency_ns = (len as f64 / r.config.graph_hbm_gbps).round() as u64;
    drop(r);
    if !s.enqueue(Op::Copy { pieces: vec![CopyPiece::Fill { dst, dst_off, len, pattern }], latency_ns }) {
        return shut(&s);
    }
    Ok(())
}
