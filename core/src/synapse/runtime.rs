//! The runtime handle and device acquisition.
//!
//! Owns: [`Runtime`] (an initialized function table, shared by every device of the process) and
//! [`Device`] (an acquired device, released when its last handle goes), plus the vendor's rules
//! for picking a module id from the launcher environment.
//! Must not touch: streams, memory, recipes (sibling modules) or any backend choice (`backend`).

use std::sync::Arc;

use habana_sys::{SynapseApi, synDeviceId, synDeviceType};

use super::error::{DropResult, Error, Result};
use super::result;

/// An initialized SynapseAI runtime (`synInitialize` done). Shared by all devices of the process
/// through `Arc`.
///
/// Dropping it does not call `synDestroy`: the vendor requires that no other Synapse call runs
/// concurrently with it, which a destructor cannot know; call [`Runtime::destroy`] explicitly.
#[derive(Debug)]
pub struct Runtime {
    api: SynapseApi,
}

impl Runtime {
    /// Initializes the runtime behind `api` (`synInitialize`; a second initialization of the
    /// same library is a no-op, as the vendor documents).
    ///
    /// # Errors
    /// [`Error::Synapse`] when `synInitialize` fails (e.g. no driver).
    pub fn new(api: SynapseApi) -> Result<Arc<Self>> {
        result::initialize(&api)?;
        Ok(Arc::new(Self { api }))
    }

    /// The function table.
    pub fn api(&self) -> &SynapseApi {
        &self.api
    }

    /// Number of devices visible to this process (`synDeviceGetCount`).
    ///
    /// # Errors
    /// [`Error::Synapse`] from the library.
    pub fn device_count(&self) -> Result<u32> {
        result::device_count(&self.api)
    }

    /// Module ids of the visible devices (`synDeviceGetModuleIDs`).
    ///
    /// # Errors
    /// [`Error::Synapse`] from the library.
    pub fn module_ids(&self) -> Result<Vec<u32>> {
        result::module_ids(&self.api)
    }

    /// Tears the runtime down (`synDestroy`) if this is the last handle.
    ///
    /// # Errors
    /// Hands the runtime back with [`Error::InUse`] when other handles (devices included) exist,
    /// or with [`Error::Synapse`] when `synDestroy` fails.
    pub fn destroy(self: Arc<Self>) -> DropResult<Arc<Self>> {
        let others = Arc::strong_count(&self) - 1;
        if others > 0 {
            return Err((Error::InUse { what: "runtime".into(), count: others }, self));
        }
        // SAFETY: this is the only handle, so no device, stream or call of ours can be live or
        // concurrent (every safe object holds an Arc to the runtime).
        match unsafe { result::destroy(&self.api) } {
            Ok(()) => Ok(()),
            Err(e) => Err((e, self)),
        }
    }
}

/// Static facts about an acquired device (from `synDeviceGetInfoV2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device type (`synDeviceGaudi2`, ...).
    pub device_type: synDeviceType,
    /// HBM size in bytes.
    pub dram_size: u64,
    /// SRAM size in bytes.
    pub sram_size: u32,
    /// Mask of enabled TPC engines.
    pub tpc_enabled_mask: u64,
    /// Index of the device in the server.
    pub device_index: u8,
}

#[derive(Debug)]
struct DeviceInner {
    rt: Arc<Runtime>,
    id: synDeviceId,
    module_id: Option<u32>,
    released: std::sync::atomic::AtomicBool,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        if !self.released.load(std::sync::atomic::Ordering::Acquire)
            && let Err(e) = result::device_release(&self.rt.api, self.id)
        {
            tracing::warn!(device = self.id, error = %e, "best-effort device release failed");
        }
    }
}

/// An acquired device. Cheap to clone; streams, events and buffers hold a clone, so the device
/// is released (`synDeviceRelease`) only when the last of them is gone, or by
/// [`Device::release`].
///
/// `Send + Sync`: it holds only the integer device id and the shared runtime; the device-level
/// calls made through it (info, synchronize, malloc/free) are thread-safe per `synapse_api.h`.
#[derive(Debug, Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl Device {
    /// Acquires the device with physical module id `module_id` (`synDeviceAcquireByModuleId`).
    ///
    /// # Errors
    /// [`Error::Synapse`] with `synDeviceAlreadyAcquired` when another process or handle holds
    /// it, `synInvalidArgument`/`synNoDeviceFound` for a module that does not exist.
    pub fn acquire(rt: &Arc<Runtime>, module_id: u32) -> Result<Self> {
        let id = result::device_acquire_by_module_id(&rt.api, module_id)?;
        Ok(Self::wrap(rt, id, Some(module_id)))
    }

    /// Acquires the first free device (`synDeviceAcquire(&id, NULL)`).
    ///
    /// # Errors
    /// [`Error::Synapse`] when no device is free.
    pub fn acquire_any(rt: &Arc<Runtime>) -> Result<Self> {
        let id = result::device_acquire_any(&rt.api)?;
        Ok(Self::wrap(rt, id, None))
    }

    /// Acquires the device of the process with local rank `local_rank`, as the vendor's stack
    /// does: `HLS_MODULE_ID` if set, else entry `local_rank` of `HABANA_VISIBLE_MODULES`, else the
    /// `local_rank`-th visible module id.
    ///
    /// # Errors
    /// [`Error::Config`] for a malformed or too short variable (checked before any device
    /// call), [`Error::InvalidArgument`] when `local_rank` exceeds the visible devices, and the
    /// errors of [`Device::acquire`].
    pub fn acquire_for_local_rank(rt: &Arc<Runtime>, local_rank: u32) -> Result<Self> {
        let module = match module_id_from_env(local_rank, |k| std::env::var(k).ok())? {
            Some(m) => m,
            None => {
                let ids = rt.module_ids()?;
                *ids.get(local_rank as usize).ok_or_else(|| Error::InvalidArgument {
                    what: "local rank",
                    value: format!("{local_rank} (only {} visible devices: {ids:?})", ids.len()),
                })?
            }
        };
        Self::acquire(rt, module)
    }

    fn wrap(rt: &Arc<Runtime>, id: synDeviceId, module_id: Option<u32>) -> Self {
        Self {
            inner: Arc::new(DeviceInner {
                rt: rt.clone(),
                id,
                module_id,
                released: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The runtime device id (`synDeviceId`).
    pub fn id(&self) -> synDeviceId {
        self.inner.id
    }

    /// The module id it was acquired by, when known.
    pub fn module_id(&self) -> Option<u32> {
        self.inner.module_id
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.inner.rt
    }

    /// The function table.
    pub fn api(&self) -> &SynapseApi {
        &self.inner.rt.api
    }

    /// Device facts (`synDeviceGetInfoV2`).
    ///
    /// # Errors
    /// [`Error::Synapse`] from the library.
    pub fn info(&self) -> Result<DeviceInfo> {
        let i = result::device_info(self.api(), self.id())?;
        Ok(DeviceInfo {
            device_type: i.deviceType,
            dram_size: i.dramSize,
            sram_size: i.sramSize,
            tpc_enabled_mask: i.tpcEnabledMask,
            device_index: i.deviceIndex,
        })
    }

    /// (free, total) device memory in bytes (`synDeviceGetMemoryInfo`).
    ///
    /// # Errors
    /// [`Error::Synapse`] from the library.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        result::device_memory_info(self.api(), self.id())
    }

    /// Waits for all work on all streams of the device (`synDeviceSynchronize`).
    ///
    /// # Errors
    /// [`Error::Synapse`], including an asynchronous error raised by queued work.
    pub fn synchronize(&self) -> Result<()> {
        result::device_synchronize(self.api(), self.id())
    }

    /// Releases the device now (`synDeviceRelease`).
    ///
    /// # Errors
    /// Hands the device back with [`Error::InUse`] when streams, events or buffers still hold
    /// it, or with [`Error::Synapse`] when the release fails.
    pub fn release(self) -> DropResult<Self> {
        let others = Arc::strong_count(&self.inner) - 1;
        if others > 0 {
            let what = format!("device {} (module {:?})", self.id(), self.module_id());
            return Err((Error::InUse { what, count: others }, self));
        }
        match result::device_release(self.api(), self.id()) {
            Ok(()) => {
                self.inner.released.store(true, std::sync::atomic::Ordering::Release);
                Ok(())
            }
            Err(e) => Err((e, self)),
        }
    }
}

/// The module id the vendor's stack would pick for `local_rank` from the environment, read
/// through `lookup` (so it can be tested without touching the process environment):
/// `HLS_MODULE_ID` if set, else entry `local_rank` of the comma-separated
/// `HABANA_VISIBLE_MODULES`, else `None` (caller picks the `local_rank`-th visible module).
/// Source: the Gaudi PyTorch bridge (`device.cpp`) and the PyTorch scaling guide.
///
/// # Errors
/// [`Error::Config`] naming the variable and value when it is not a non-negative integer (list),
/// or when `HABANA_VISIBLE_MODULES` has no entry for `local_rank`.
pub fn module_id_from_env(local_rank: u32, lookup: impl Fn(&str) -> Option<String>) -> Result<Option<u32>> {
    if let Some(v) = lookup("HLS_MODULE_ID").filter(|v| !v.trim().is_empty()) {
        return v.trim().parse::<u32>().map(Some).map_err(|_| Error::Config {
            variable: "HLS_MODULE_ID",
            value: v.clone(),
            reason: "not a module id (a non-negative integer)".into(),
        });
    }
    if let Some(v) = lookup("HABANA_VISIBLE_MODULES").filter(|v| !v.trim().is_empty()) {
        let ids: Vec<u32> =
            v.split(',').map(|s| s.trim().parse::<u32>()).collect::<std::result::Result<_, _>>().map_err(|_| {
                Error::Config {
                    variable: "HABANA_VISIBLE_MODULES",
                    value: v.clone(),
                    reason: "not a comma-separated list of module ids".into(),
                }
            })?;
        return ids.get(local_rank as usize).copied().map(Some).ok_or_else(|| Error::Config {
            variable: "HABANA_VISIBLE_MODULES",
            value: v.clone(),
            reason: format!("has {} entries but local rank is {local_rank}", ids.len()),
        });
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Vars<'a> = &'a [(&'a str, &'a str)];

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn module_id_table() {
        // (env, local rank, expected module id or the variable named in the error)
        let ok: &[(Vars, u32, Option<u32>)] = &[
            (&[], 3, None),
            (&[("HLS_MODULE_ID", "5")], 0, Some(5)),
            (&[("HLS_MODULE_ID", "5"), ("HABANA_VISIBLE_MODULES", "0,1")], 1, Some(5)),
            (&[("HABANA_VISIBLE_MODULES", "4,6,7")], 1, Some(6)),
            (&[("HABANA_VISIBLE_MODULES", " 4, 6 ")], 1, Some(6)),
            (&[("HABANA_VISIBLE_MODULES", "")], 2, None),
        ];
        for (vars, rank, want) in ok {
            assert_eq!(module_id_from_env(*rank, env(vars)).unwrap(), *want, "{vars:?} rank {rank}");
        }
        let bad: &[(Vars, u32, &str)] = &[
            (&[("HLS_MODULE_ID", "x")], 0, "HLS_MODULE_ID"),
            (&[("HLS_MODULE_ID", "-1")], 0, "HLS_MODULE_ID"),
            (&[("HABANA_VISIBLE_MODULES", "0,a")], 0, "HABANA_VISIBLE_MODULES"),
            (&[("HABANA_VISIBLE_MODULES", "0,1")], 2, "HABANA_VISIBLE_MODULES"),
        ];
        for (vars, rank, var) in bad {
            match module_id_from_env(*rank, env(vars)) {
                Err(Error::Config { variable, value, .. }) => {
                    assert_eq!(variable, *var);
                    assert_eq!(Some(value), vars.iter().find(|(n, _)| n == var).map(|(_, v)| v.to_string()));
                }
                other => panic!("{vars:?} rank {rank}: expected Config error, got {other:?}"),
            }
        }
    }
}
