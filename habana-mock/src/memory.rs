//! Device and host memory objects of the mock: allocations, registered host ranges, and the copy
//! pieces a stream worker executes.
//!
//! Owns: [`AlignedBuf`], [`DevAlloc`] (device bytes behind a per-allocation `Mutex`),
//! [`HostRange`] (synHostMalloc'd or synHostMap'ed host memory, guarded so unmap/free waits for
//! an in-flight copy), [`CopyPiece`]. Must not touch: the registry (its bookkeeping of these
//! objects, the bump allocator and address validation, is `alloc.rs`), streams and timing. The
//! mock only ever reads or writes host memory inside a registered range and device memory
//! inside a live allocation.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use habana_sys::synDeviceId;

/// Alignment of every mock allocation (device and synHostMalloc), in bytes.
pub const ALIGNMENT: u64 = 128;

/// A zeroed heap block aligned to [`ALIGNMENT`].
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the block is exclusively owned; access is synchronised by the Mutex that holds it.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` only exposes the pointer value.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes (at least one byte), or `None` when the allocator fails.
    pub(crate) fn zeroed(len: u64) -> Option<Self> {
        let size = usize::try_from(len.max(1)).ok()?;
        let layout = Layout::from_size_align(size, ALIGNMENT as usize).ok()?;
        // SAFETY: layout has a nonzero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(Self { ptr, layout })
    }

    /// The start of the block.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout and not freed before.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One device allocation: `[base, base + size)` on module `module`. `data` is `None` once freed
/// (a copy or kernel still holding the `Arc` then fails instead of touching freed memory).
#[derive(Debug)]
pub(crate) struct DevAlloc {
    /// First device address.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// Owning module.
    pub module: u32,
    /// The bytes (`None` once freed), locked by every copy or kernel using them.
    pub data: Mutex<Option<AlignedBuf>>,
}

impl DevAlloc {
    /// Locks the bytes (a poisoned lock is recovered).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<AlignedBuf>> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A registered host range. `alive` is false once unmapped/freed; `owned` holds the memory of a
/// synHostMalloc'd range. Copies lock `state` for their duration.
#[derive(Debug)]
pub(crate) struct HostRange {
    /// First host address.
    pub start: usize,
    /// Bytes.
    pub len: usize,
    /// The device that registered it.
    pub device: synDeviceId,
    /// Liveness and owned memory, locked by every copy using the range.
    pub state: Mutex<HostState>,
}

/// The mutable part of a [`HostRange`].
#[derive(Debug)]
pub(crate) struct HostState {
    /// False once unmapped or freed.
    pub alive: bool,
    /// The memory of a synHostMalloc'd range (None when mapped, or once freed).
    pub owned: Option<AlignedBuf>,
}

impl HostRange {
    /// Locks the state (a poisoned lock is recovered).
    pub(crate) fn lock(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks a removed host range dead, waiting for an in-flight copy; frees owned memory.
pub(crate) fn retire_host_range(h: &HostRange) {
    let mut st = h.lock();
    st.alive = false;
    st.owned = None;
}

/// Frees the bytes of a removed device allocation (waits for a copy or kernel using it).
pub(crate) fn retire_device_alloc(a: &DevAlloc) {
    *a.lock() = None;
}

/// One validated copy, executed by a stream worker. Fields: the source and destination (host
/// address inside a [`HostRange`], or an allocation and a byte offset into it) and the length.
#[derive(Debug)]
pub(crate) enum CopyPiece {
    /// Host range to device allocation.
    HostToDevice { host: Arc<HostRange>, src: usize, dst: Arc<DevAlloc>, dst_off: u64, len: u64 },
    /// Device allocation to host range.
    DeviceToHost { src: Arc<DevAlloc>, src_off: u64, host: Arc<HostRange>, dst: usize, len: u64 },
    /// Device allocation to device allocation (possibly the same one).
    DeviceToDevice { src: Arc<DevAlloc>, src_off: u64, dst: Arc<DevAlloc>, dst_off: u64, len: u64 },
    /// `len` bytes of a device allocation filled with `pattern` repeated (`synMemsetD*Async`:
    /// the pattern is the value's little-endian bytes, 1, 2 or 4 of them).
    Fill { dst: Arc<DevAlloc>, dst_off: u64, len: u64, pattern: Vec<u8> },
}

impl CopyPiece {
    /// Bytes copied.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Self::HostToDevice { len, .. }
            | Self::DeviceToHost { len, .. }
            | Self::DeviceToDevice { len, .. }
            | Self::Fill { len, .. } => *len,
        }
    }

    /// Performs the copy. Fails (without touching memory) when the host range was unregistered or
    /// the device allocation freed since enqueue.
    pub(crate) fn execute(&self) -> Result<(), String> {
        let len = self.len() as usize;
        match self {
            Self::HostToDevice { host, src, dst, dst_off, .. } => {
                let h = host.lock();
                let d = dst.lock();
                let (true, Some(d)) = (h.alive, d.as_ref()) else {
                    return Err("a buffer of a host-to-device copy was released before the copy ran".into());
                };
                // SAFETY: [src, src+len) lies in a registered, still alive host range (checked at
                // enqueue; alive now, and unregistering waits on `h`); the device range lies in
                // the allocation (checked at enqueue), whose lock we hold. They cannot overlap:
                // device bytes are mock-owned.
                unsafe { std::ptr::copy_nonoverlapping(*src as *const u8, d.as_ptr().add(*dst_off as usize), len) };
            }
            Self::DeviceToHost { src, src_off, host, dst, .. } => {
                let h = host.lock();
                let s = src.lock();
                let (true, Some(s)) = (h.alive, s.as_ref()) else {
                    return Err("a buffer of a device-to-host copy was released before the copy ran".into());
                };
                // SAFETY: as for HostToDevice, with the roles swapped.
                unsafe { std::ptr::copy_nonoverlapping(s.as_ptr().add(*src_off as usize), *dst as *mut u8, len) };
            }
            Self::Fill { dst, dst_off, pattern, .. } => {
                let g = dst.lock();
                let Some(b) = g.as_ref() else {
                    return Err("device buffer freed before the memset ran".into());
                };
                // SAFETY: [dst_off, dst_off + len) lies in the allocation (checked at enqueue);
                // we hold its lock, so no other slice of it exists.
                let out = unsafe { std::slice::from_raw_parts_mut(b.as_ptr().add(*dst_off as usize), len) };
                for (o, p) in out.iter_mut().zip(pattern.iter().cycle()) {
                    *o = *p;
                }
            }
            Self::DeviceToDevice { src, src_off, dst, dst_off, .. } => {
                if Arc::ptr_eq(src, dst) {
                    let g = src.lock();
                    let Some(b) = g.as_ref() else {
                        return Err("device buffer freed before the copy ran".into());
                    };
                    // SAFETY: both ranges lie inside this allocation (checked at enqueue); we hold
                    // its lock; `copy` allows overlap.
                    unsafe {
                        std::ptr::copy(b.as_ptr().add(*src_off as usize), b.as_ptr().add(*dst_off as usize), len)
                    };
                } else {
                    // Lock in address order so two workers never deadlock.
                    let (first, second) = if src.base < dst.base { (src, dst) } else { (dst, src) };
                    let g1 = first.lock();
                    let g2 = second.lock();
                    let (sg, dg) = if src.base < dst.base { (&g1, &g2) } else { (&g2, &g1) };
                    let (Some(s), Some(d)) = (sg.as_ref(), dg.as_ref()) else {
                        return Err("device buffer freed before the copy ran".into());
                    };
                    // SAFETY: distinct allocations (no overlap), ranges checked at enqueue, both
                    // locks held.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            s.as_ptr().add(*src_off as usize),
                            d.as_ptr().add(*dst_off as usize),
                            len,
                        )
                    };
                }
            }
        }
        Ok(())
    }
}
