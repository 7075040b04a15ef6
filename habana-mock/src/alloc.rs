//! The registry's memory bookkeeping: the bump allocator of device addresses, device frees,
//! registered host ranges and address validation (an `impl` block of [`Registry`], split from
//! `state.rs`).
//!
//! Owns: the allocator methods of [`Registry`] (`device_malloc`, `device_free`, `device_range`,
//! `host_malloc`, `host_map`, `host_remove`, `host_range`, `used_bytes`). Must not touch: the
//! bytes of an allocation or host range (the caller retires them outside the registry lock, see
//! `memory.rs`).

use std::sync::{Arc, Mutex};

use habana_sys::{synDeviceId, synStatus};

use crate::error::{MResult, MockError, fail};
use crate::memory::{ALIGNMENT, AlignedBuf, DevAlloc, HostRange, HostState};
use crate::state::Registry;

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
