//! Lifecycle and device calls of the mock: synInitialize/synDestroy, module enumeration,
//! acquire/release, info, memory info, device synchronize.
//!
//! Owns: the rules of acquiring modules (device ids are a fresh counter per acquisition, never
//! the module id, so stale device ids are detected), the opt-in cross-process module locks
//! ([`ENV_LOCK_DIR`]) and tearing down a device's objects.
//! Must not touch: memory contents or kernels.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use habana_sys::{synDeviceId, synDeviceInfoV2, synDeviceType, synStatus};

use crate::cabi::handle_to_raw;
use crate::config::MockConfig;
use crate::error::{MResult, fail};
use crate::faults::stalls;
use crate::memory::{retire_device_alloc, retire_host_range};
use crate::state::{DEVICE_ADDRESS_BASE, Registry, registry};
use crate::stream::Stream;

/// Environment variable naming a directory for cross-process module locks. When set (and not
/// empty), acquiring module `m` also takes an exclusive advisory lock (`flock`) on
/// `<dir>/module-<m>.lock`; a module locked by another process fails to acquire with
/// `synDeviceAlreadyAcquired` (the real runtime's status for a device opened by another
/// process), and `synDeviceAcquire` without a bus skips it. The lock is dropped by
/// `synDeviceRelease`, `synDestroy` or the process's exit. Unset (the default): modules are
/// per-process, as before.
pub const ENV_LOCK_DIR: &str = "DROPCOMPUTE_MOCK_LOCK_DIR";

/// Module id -> its lock file, held while the module is acquired.
fn locks() -> MutexGuard<'static, BTreeMap<u32, File>> {
    static L: Mutex<BTreeMap<u32, File>> = Mutex::new(BTreeMap::new());
    L.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes the cross-process lock of module `m` when [`ENV_LOCK_DIR`] is set.
fn lock_module(m: u32) -> MResult<()> {
    let Some(dir) = std::env::var_os(ENV_LOCK_DIR).filter(|d| !d.is_empty()) else {
        return Ok(());
    };
    let path = Path::new(&dir).join(format!("module-{m}.lock"));
    let file = match OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path) {
        Ok(f) => f,
        Err(e) => return fail(synStatus::FAIL, format!("cannot open the module lock {}: {e}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => {
            locks().insert(m, file);
            Ok(())
        }
        Err(TryLockError::WouldBlock) => fail(
            synStatus::DEVICE_ALREADY_ACQUIRED,
            format!("module {m} is held by another process (lock {})", path.display()),
        ),
        Err(TryLockError::Error(e)) => fail(synStatus::FAIL, format!("locking {}: {e}", path.display())),
    }
}

/// The PCI bus string of mock module `module` accepted by `synDeviceAcquire`.
pub fn mock_pci_bus(module: u32) -> String {
    format!("0000:{:02x}:{:02x}.0", 0x10 + module / 32, module % 32)
}

/// SRAM bytes reported per module (Gaudi2: 48 MiB).
pub const SRAM_BYTES: u32 = 48 << 20;

pub(crate) fn initialize() -> MResult<()> {
    let mut r = registry();
    if r.initialized {
        return Ok(());
    }
    if !r.configured {
        match MockConfig::from_env() {
            Ok(c) => r.config = c,
            Err(e) => return fail(synStatus::INVALID_ARGUMENT, e.to_string()),
        }
    }
    r.rebuild_modules();
    r.initialized = true;
    Ok(())
}

/// Tears down every object of `module` (or of all modules): poisons events, aborts streams,
/// frees device memory and host ranges registered by the released device ids.
fn teardown(r: &mut Registry, module: Option<u32>, devices: &[synDeviceId]) {
    let hit = |m: u32| module.is_none_or(|x| x == m);
    let events: Vec<u64> = r.events.iter().filter(|(_, e)| hit(e.module)).map(|(k, _)| *k).collect();
    for k in events {
        if let Some(e) = r.events.remove(&k) {
            e.poison();
        }
    }
    let streams: Vec<u64> = r.streams.iter().filter(|(_, s)| hit(s.module)).map(|(k, _)| *k).collect();
    let streams: Vec<_> = streams.into_iter().filter_map(|k| r.streams.remove(&k)).collect();
    match module {
        Some(m) => stalls().release(m),
        None => stalls().clear(),
    }
    for s in &streams {
        s.shutdown(true);
    }
    let allocs: Vec<u64> = r.allocs.iter().filter(|(_, a)| hit(a.module)).map(|(k, _)| *k).collect();
    for k in allocs {
        if let Some(a) = r.allocs.remove(&k) {
            r.freed.insert(a.base, a.size);
            if let Some(m) = r.modules.get_mut(a.module as usize) {
                m.used = m.used.saturating_sub(a.size);
            }
            retire_device_alloc(&a);
        }
    }
    let hosts: Vec<usize> =
        r.host.iter().filter(|(_, h)| module.is_none() || devices.contains(&h.device)).map(|(k, _)| *k).collect();
    for k in hosts {
        if let Some(h) = r.host.remove(&k) {
            retire_host_range(&h);
        }
    }
}

pub(crate) fn destroy() -> MResult<()> {
    let mut r = registry();
    r.check_init()?;
    teardown(&mut r, None, &[]);
    r.recipes.clear();
    r.devices.clear();
    for m in &mut r.modules {
        m.acquired = None;
    }
    locks().clear();
    r.initialized = false;
    Ok(())
}

pub(crate) fn count() -> MResult<u32> {
    let r = registry();
    r.check_init()?;
    Ok(r.modules.len() as u32)
}

fn acquire_module(r: &mut Registry, m: u32) -> MResult<synDeviceId> {
    let Some(module) = r.modules.get(m as usize) else {
        return fail(
            synStatus::INVALID_ARGUMENT,
            format!("module id {m} does not exist ({} modules)", r.modules.len()),
        );
    };
    if let Some(d) = module.acquired {
        return fail(synStatus::DEVICE_ALREADY_ACQUIRED, format!("module {m} is already acquired as device {d}"));
    }
    lock_module(m)?;
    let id = r.next_device_id;
    r.next_device_id = r.next_device_id.wrapping_add(1);
    r.modules[m as usize].acquired = Some(id);
    r.devices.insert(id, m);
    Ok(id)
}

/// Acquires the first module that is free in this process and not locked by another one.
fn acquire_first_free(r: &mut Registry) -> MResult<synDeviceId> {
    for m in 0..r.modules.len() as u32 {
        if r.modules[m as usize].acquired.is_none() {
            match acquire_module(r, m) {
                Err(e) if e.status == synStatus::DEVICE_ALREADY_ACQUIRED => continue, // held elsewhere
                other => return other,
            }
        }
    }
    fail(synStatus::DEVICE_ALREADY_ACQUIRED, format!("all {} modules are acquired", r.modules.len()))
}

pub(crate) fn acquire_by_module_id(m: u32) -> MResult<synDeviceId> {
    let mut r = registry();
    r.check_init()?;
    acquire_module(&mut r, m)
}

/// `pci_bus` None or empty = first free module; otherwise the module whose [`mock_pci_bus`]
/// matches (unknown → synNoDeviceFound).
pub(crate) fn acquire_by_pci_bus(pci_bus: Option<&str>) -> MResult<synDeviceId> {
    let mut r = registry();
    r.check_init()?;
    let m = match pci_bus {
        None | Some("") => return acquire_first_free(&mut r),
        Some(bus) => match (0..r.modules.len() as u32).find(|&m| mock_pci_bus(m) == bus) {
            Some(m) => m,
            None => {
                return fail(synStatus::NO_DEVICE_FOUND, format!("no mock module at PCI bus {bus:?}"));
            }
        },
    };
    acquire_module(&mut r, m)
}

/// A type other than the configured one → synNoDeviceFound.
pub(crate) fn acquire_by_type(t: synDeviceType) -> MResult<synDeviceId> {
    let mut r = registry();
    r.check_init()?;
    if t != r.config.device_type.code() {
        return fail(
            synStatus::NO_DEVICE_FOUND,
            format!("no {t} module (the mock has {})", r.config.device_type.code()),
        );
    }
    acquire_first_free(&mut r)
}

/// Releases a device: its pending stream work is abandoned, its streams, events, device memory
/// and host ranges are destroyed; handles to them become invalid.
pub(crate) fn release(device: synDeviceId) -> MResult<()> {
    let mut r = registry();
    let m = r.module_of(device)?;
    teardown(&mut r, Some(m), &[device]);
    r.devices.remove(&device);
    r.modules[m as usize].acquired = None;
    locks().remove(&m);
    Ok(())
}

/// Waits for every stream of the device; returns the first sticky stream error.
pub(crate) fn synchronize(device: synDeviceId) -> MResult<()> {
    let streams: Vec<Arc<Stream>> = {
        let r = registry();
        let m = r.module_of(device)?;
        r.streams.values().filter(|s| s.module == m).cloned().collect()
    };
    for s in &streams {
        s.shared.wait_idle();
    }
    for s in &streams {
        if let Some((status, msg)) = s.shared.error() {
            return fail(status, format!("stream {:#x}: {msg}", handle_to_raw(s.id)));
        }
    }
    Ok(())
}

pub(crate) fn info(device: synDeviceId) -> MResult<synDeviceInfoV2> {
    let r = registry();
    let m = r.module_of(device)?;
    Ok(synDeviceInfoV2 {
        sramBaseAddress: 0,
        dramBaseAddress: DEVICE_ADDRESS_BASE,
        sramSize: SRAM_BYTES,
        dramSize: r.config.hbm_bytes,
        tpcEnabledMask: 0x00FF_FFFF,
        dramEnabled: 1,
        deviceId: device,
        fd: 1000 + m,
        deviceType: r.config.device_type.code(),
        deviceIndex: (m & 0xFF) as u8,
        globalHbmBaseAddress: 0,
    })
}

/// (free, total) HBM bytes of the device.
pub(crate) fn memory_info(device: synDeviceId) -> MResult<(u64, u64)> {
    let r = registry();
    let m = r.module_of(device)?;
    let total = r.config.hbm_bytes;
    Ok((total.saturating_sub(r.used_bytes(m)), total))
}

/// Module ids 0..n.
pub(crate) fn module_ids() -> MResult<Vec<u32>> {
    Ok((0..count()?).collect())
}
