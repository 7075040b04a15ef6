//! Device and host memory of the mock: the bump allocator of device addresses, registered host
//! ranges, and the copy pieces a stream worker executes.
//!
//! Owns: [`DevAlloc`] (device bytes behind a per-allocation `Mutex`), [`HostRange`]
//! (synHostMalloc'd or synHostMap'ed host memory, guarded so unmap/free waits for an in-flight
//! copy), address validation. Must not touch: streams and timing. The mock only ever reads or
//! writes host memory inside a registered range and device memory inside a live allocation.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use habana_sys::{synDeviceId, synStatus};

use crate::error::{MResult, MockError, fail};
use crate::state::Registry;

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
    pub base: u64,
    pub size: u64,
    pub module: u32,
    pub data: Mutex<Option<AlignedBuf>>,
}

impl DevAlloc {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<AlignedBuf>> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A registered host range. `alive` is false once unmapped/freed; `owned` holds the memory of a
/// synHostMalloc'd range. Copies lock `state` for their duration.
#[derive(Debug)]
pub(crate) struct HostRange {
    pub start: usize,
    pub len: usize,
    pub device: synDeviceId,
    pub state: Mutex<HostState>,
}

#[derive(Debug)]
pub(crate) struct HostState {
    pub alive: bool,
    pub owned: Option<AlignedBuf>,
}

impl HostRange {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGNMENT) * ALIGNMENT
}

impl Registry {
    /// Bytes allocated on `module`.
    pub(crate) fn used_bytes(&self, module: u32) -> u64 {
        self.modules.get(module as usize).map_or(0, |m| m.used)
    }

    /// synDeviceMalloc: a fresh, 128-byte aligned, never reused address. `req_addr` (a hint on
    /// Gaudi) is ignored. size 0 → synInvalidArgument; beyond free HBM → synOutOfDeviceMemory.
    pub(crate) fn device_malloc(&mut self, device: synDeviceId, size: u64) -> MResult<u64> {
        let module = self.module_of(device)?;
        if size == 0 {
            return fail(synStatus::INVALID_ARGUMENT, "size 0");
        }
        let used = self.used_bytes(module);
        if size > self.config.hbm_bytes.saturating_sub(used) {
            return fail(
                synStatus::OUT_OF_DEVICE_MEMORY,
                format!("{size} bytes requested, {} free on module {module}", self.config.hbm_bytes - used),
            );
        }
        let Some(buf) = AlignedBuf::zeroed(size) else {
            return fail(
                synStatus::OUT_OF_DEVICE_MEMORY,
                format!("host allocation of {size} bytes backing the device buffer failed"),
            );
        };
        let base = self.next_addr;
        // Leave a gap after each allocation so an overrun never lands in the next one.
        self.next_addr = align_up(base + size) + ALIGNMENT;
        let a = Arc::new(DevAlloc { base, size, module, data: Mutex::new(Some(buf)) });
        self.allocs.insert(base, a);
        self.modules[module as usize].used += size;
        Ok(base)
    }

    /// synDeviceFree: `addr` must be the base of a live allocation of `device`. Returns the
    /// allocation (the caller drops its bytes outside the registry lock).
    pub(crate) fn device_free(&mut self, device: synDeviceId, addr: u64) -> MResult<Arc<DevAlloc>> {
        let module = self.module_of(device)?;
        match self.allocs.get(&addr) {
            Some(a) if a.module == module => {
                let a = self.allocs.remove(&addr).expect("present");
                self.freed.insert(a.base, a.size);
                self.modules[module as usize].used -= a.size;
                Ok(a)
            }
            Some(a) => fail(
                synStatus::INVALID_ARGUMENT,
                format!("address {addr:#x} belongs to module {}, not {module}", a.module),
            ),
            None if self.freed.contains_key(&addr) => {
                fail(synStatus::INVALID_ARGUMENT, format!("address {addr:#x} already freed"))
            }
            None => {
                fail(synStatus::INVALID_ARGUMENT, format!("address {addr:#x} is not the start of a device allocation"))
            }
        }
    }

    /// The live allocation of `module` containing `[addr, addr + len)` and the offset of `addr`.
    pub(crate) fn device_range(&self, module: u32, addr: u64, len: u64) -> MResult<(Arc<DevAlloc>, u64)> {
        let end = addr.checked_add(len);
        if let Some((_, a)) = self.allocs.range(..=addr).next_back()
            && addr < a.base + a.size
        {
            if a.module != module {
                return fail(
                    synStatus::INVALID_ARGUMENT,
                    format!("device address {addr:#x} belongs to module {}, not {module}", a.module),
                );
            }
            return match end {
                Some(e) if e <= a.base + a.size => Ok((a.clone(), addr - a.base)),
                _ => fail(
                    synStatus::INVALID_ARGUMENT,
                    format!("device range {addr:#x}+{len} exceeds the allocation {:#x}+{}", a.base, a.size),
                ),
            };
        }
        if let Some((&b, &s)) = self.freed.range(..=addr).next_back()
            && addr < b + s
        {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("device address {addr:#x} used after free (allocation {b:#x}+{s})"),
            );
        }
        fail(synStatus::INVALID_ARGUMENT, format!("device address {addr:#x} is not inside any allocation"))
    }

    /// The registered host range containing `[ptr, ptr + len)`.
    pub(crate) fn host_range(&self, ptr: usize, len: u64) -> MResult<Arc<HostRange>> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if let Some((_, h)) = self.host.range(..=ptr).next_back()
            && ptr < h.start + h.len
        {
            return match ptr.checked_add(len) {
                Some(e) if e <= h.start + h.len => Ok(h.clone()),
                _ => fail(
                    synStatus::INVALID_ARGUMENT,
                    format!("host range {ptr:#x}+{len} exceeds the registered range {:#x}+{}", h.start, h.len),
                ),
            };
        }
        fail(synStatus::INVALID_ARGUMENT, format!("host address {ptr:#x} is neither synHostMalloc'd nor synHostMap'ed"))
    }

    fn check_host_overlap(&self, start: usize, len: usize) -> MResult<()> {
        let end = start
            .checked_add(len)
            .ok_or_else(|| MockError::new(synStatus::INVALID_ARGUMENT, "host range overflows"))?;
        if let Some((_, h)) = self.host.range(..end).next_back()
            && h.start + h.len > start
        {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("host range {start:#x}+{len} overlaps registered range {:#x}+{}", h.start, h.len),
            );
        }
        Ok(())
    }

    /// synHostMalloc: a real, zeroed, 128-byte aligned host allocation, registered for copies.
    pub(crate) fn host_malloc(&mut self, device: synDeviceId, size: u64) -> MResult<*mut u8> {
        self.module_of(device)?;
        if size == 0 {
            return fail(synStatus::INVALID_ARGUMENT, "size 0");
        }
        let Some(buf) = AlignedBuf::zeroed(size) else {
            return fail(synStatus::OUT_OF_HOST_MEMORY, format!("cannot allocate {size} host bytes"));
        };
        let p = buf.as_ptr();
        let h = HostRange {
            start: p as usize,
            len: size as usize,
            device,
            state: Mutex::new(HostState { alive: true, owned: Some(buf) }),
        };
        self.host.insert(p as usize, Arc::new(h));
        Ok(p)
    }

    /// synHostMap: registers the caller's range `[ptr, ptr + size)`.
    pub(crate) fn host_map(&mut self, device: synDeviceId, ptr: usize, size: u64) -> MResult<()> {
        self.module_of(device)?;
        if ptr == 0 || size == 0 {
            return fail(synStatus::INVALID_ARGUMENT, "null buffer or size 0");
        }
        let len = usize::try_from(size).map_err(|_| MockError::new(synStatus::INVALID_ARGUMENT, "size too large"))?;
        self.check_host_overlap(ptr, len)?;
        let h = HostRange { start: ptr, len, device, state: Mutex::new(HostState { alive: true, owned: None }) };
        self.host.insert(ptr, Arc::new(h));
        Ok(())
    }

    /// Removes the range starting at `ptr` that was registered by `device`; `owned` selects
    /// synHostFree (must be synHostMalloc'd) or synHostUnmap (must be mapped).
    pub(crate) fn host_remove(&mut self, device: synDeviceId, ptr: usize, owned: bool) -> MResult<Arc<HostRange>> {
        self.module_of(device)?;
        let Some(h) = self.host.get(&ptr) else {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("host address {ptr:#x} is not registered (double free or never allocated)"),
            );
        };
        let is_owned = h.lock().owned.is_some();
        if is_owned != owned {
            let what = if is_owned { "synHostMalloc'd (use synHostFree)" } else { "synHostMap'ed (use synHostUnmap)" };
            return fail(synStatus::INVALID_ARGUMENT, format!("host address {ptr:#x} is {what}"));
        }
        if h.device != device {
            return fail(
                synStatus::INVALID_ARGUMENT,
                format!("host address {ptr:#x} was registered by device {}", h.device),
            );
        }
        Ok(self.host.remove(&ptr).expect("present"))
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

/// One validated copy, executed by a stream worker.
#[derive(Debug)]
pub(crate) enum CopyPiece {
    HostToDevice { host: Arc<HostRange>, src: usize, dst: Arc<DevAlloc>, dst_off: u64, len: u64 },
    DeviceToHost { src: Arc<DevAlloc>, src_off: u64, host: Arc<HostRange>, dst: usize, len: u64 },
    DeviceToDevice { src: Arc<DevAlloc>, src_off: u64, dst: Arc<DevAlloc>, dst_off: u64, len: u64 },
}

impl CopyPiece {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Self::HostToDevice { len, .. } | Self::DeviceToHost { len, .. } | Self::DeviceToDevice { len, .. } => *len,
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
