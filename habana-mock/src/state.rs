//! Process-global state of the CPU mock: the registry of modules, handles and allocations, the
//! fault table, and the thread-local last error.
//!
//! Owns: [`Registry`] (one `Mutex`, never held while a stream worker runs a copy or kernel),
//! handle encoding (fake pointers: ids cast to pointers, never dereferenced), the error type
//! used by every mock entry point, and the kernel table. Must not touch: device memory contents
//! (each allocation has its own lock, see `memory.rs`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use habana_sys::{synDeviceId, synStatus};

use super::MockKernelFn;
use super::config::MockConfig;
use super::event::Event;
use super::latency::DeviceLatency;
use super::memory::{DevAlloc, HostRange};
use super::recipe::Recipe;
use super::stream::Stream;

/// A failed mock call: the status to return and the message for `synGetLastErrorMessage`.
#[derive(Debug, Clone)]
pub(crate) struct MockError {
    pub status: synStatus,
    pub msg: String,
}

pub(crate) type MResult<T> = Result<T, MockError>;

/// Shorthand for an `Err(MockError)`.
pub(crate) fn fail<T>(status: synStatus, msg: impl Into<String>) -> MResult<T> {
    Err(MockError { status, msg: msg.into() })
}

/// `user_data` of a registered kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendPtr(pub *mut c_void);
// SAFETY: the pointer is only stored and handed back to the kernel that was registered with it;
// `register_kernel`'s contract makes the kernel responsible for thread-safe use of it.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the mock never dereferences it.
unsafe impl Sync for SendPtr {}

/// A kernel registered under a name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernel {
    pub f: MockKernelFn,
    pub user_data: SendPtr,
}

/// One mock module.
#[derive(Debug)]
pub(crate) struct Module {
    /// The device id of the current holder, if acquired.
    pub acquired: Option<synDeviceId>,
    /// Bytes of live device allocations.
    pub used: u64,
    pub latency: DeviceLatency,
}

/// Everything behind the global lock.
pub(crate) struct Registry {
    pub initialized: bool,
    /// True once `dcmock_configure` set `config` (then the environment is not consulted).
    pub configured: bool,
    pub config: MockConfig,
    pub modules: Vec<Module>,
    /// Acquired device id -> module id.
    pub devices: HashMap<synDeviceId, u32>,
    pub next_device_id: synDeviceId,
    pub streams: HashMap<u64, Arc<Stream>>,
    pub events: HashMap<u64, Arc<Event>>,
    pub recipes: HashMap<u64, Arc<Recipe>>,
    /// Live device allocations by base address.
    pub allocs: BTreeMap<u64, Arc<DevAlloc>>,
    /// Freed device allocations, base -> size (addresses are never reused).
    pub freed: BTreeMap<u64, u64>,
    pub next_addr: u64,
    /// Registered host ranges (synHostMalloc'd or synHostMap'ed) by start address.
    pub host: BTreeMap<usize, Arc<HostRange>>,
    pub next_handle: u64,
    pub kernels: HashMap<String, Kernel>,
    /// Pending "fail next call" faults: C name -> (status, remaining count).
    pub faults: HashMap<String, (synStatus, u32)>,
}

/// First device address handed out (a recognisable, non-null value).
pub(crate) const DEVICE_ADDRESS_BASE: u64 = 0x1000_0000_0000;

impl Registry {
    fn new() -> Self {
        let mut r = Self {
            initialized: false,
            configured: false,
            config: MockConfig::default(),
            modules: Vec::new(),
            devices: HashMap::new(),
            next_device_id: 0,
            streams: HashMap::new(),
            events: HashMap::new(),
            recipes: HashMap::new(),
            allocs: BTreeMap::new(),
            freed: BTreeMap::new(),
            next_addr: DEVICE_ADDRESS_BASE,
            host: BTreeMap::new(),
            next_handle: 1,
            kernels: HashMap::new(),
            faults: HashMap::new(),
        };
        super::builtin::register_builtins(&mut r.kernels);
        super::grad_kernels::register(&mut r.kernels);
        r
    }

    /// Rebuilds the module table from `self.config` (every module released, fresh random streams).
    pub(crate) fn rebuild_modules(&mut self) {
        let cfg = &self.config;
        self.modules = (0..cfg.devices)
            .map(|m| {
                let o = cfg.per_device.iter().find(|o| o.module_id == m);
                let noise = o.and_then(|o| o.noise.clone()).unwrap_or_else(|| cfg.noise.clone());
                let slowdown = o.map_or(1.0, |o| o.slowdown);
                let script = o.map(|o| o.script_ns.clone()).unwrap_or_default();
                let only = o.and_then(|o| o.script_recipe.clone());
                let latency = DeviceLatency::new(cfg.seed, m, slowdown, noise, script, only);
                Module { acquired: None, used: 0, latency }
            })
            .collect();
    }

    /// Fails with synObjectNotInitialized before `synInitialize`.
    pub(crate) fn check_init(&self) -> MResult<()> {
        if self.initialized { Ok(()) } else { fail(synStatus::OBJECT_NOT_INITIALIZED, "synInitialize was not called") }
    }

    /// The module of an acquired device id (checks initialisation too).
    pub(crate) fn module_of(&self, device: synDeviceId) -> MResult<u32> {
        self.check_init()?;
        match self.devices.get(&device) {
            Some(&m) => Ok(m),
            None => fail(synStatus::INVALID_ARGUMENT, format!("device id {device} is not acquired")),
        }
    }

    /// A fresh handle id (nonzero, never reused).
    pub(crate) fn new_handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    pub(crate) fn stream(&self, handle: u64) -> MResult<Arc<Stream>> {
        self.check_init()?;
        match self.streams.get(&handle) {
            Some(s) => Ok(s.clone()),
            None => fail(synStatus::INVALID_ARGUMENT, format!("unknown stream handle {:#x}", handle_to_raw(handle))),
        }
    }

    pub(crate) fn event(&self, handle: u64) -> MResult<Arc<Event>> {
        self.check_init()?;
        match self.events.get(&handle) {
            Some(e) => Ok(e.clone()),
            None => fail(synStatus::INVALID_EVENT_HANDLE, format!("unknown event handle {:#x}", handle_to_raw(handle))),
        }
    }

    pub(crate) fn recipe(&self, handle: u64) -> MResult<Arc<Recipe>> {
        self.check_init()?;
        match self.recipes.get(&handle) {
            Some(r) => Ok(r.clone()),
            None => fail(synStatus::INVALID_ARGUMENT, format!("unknown recipe handle {:#x}", handle_to_raw(handle))),
        }
    }
}

/// Fake pointer value of handle id `id` (ids are spaced by 64 so a handle looks like an aligned
/// pointer). The mock never dereferences it.
pub(crate) fn handle_to_raw(id: u64) -> usize {
    (id as usize) << 6
}

/// The handle id of a fake pointer, or 0 (never a valid id) for anything not produced by
/// [`handle_to_raw`].
pub(crate) fn raw_to_handle(raw: usize) -> u64 {
    if raw & 63 != 0 { 0 } else { (raw >> 6) as u64 }
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

/// Locks the registry. A poisoned lock is recovered: every mutation is completed before any
/// operation that could panic.
pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.get_or_init(|| Mutex::new(Registry::new())).lock().unwrap_or_else(|e| e.into_inner())
}

/// Number of armed "fail next call" faults: lets every call skip the registry when zero.
pub(crate) static ARMED_FAULTS: AtomicUsize = AtomicUsize::new(0);

/// Consumes one armed fault for the C function `name`, returning its status.
pub(crate) fn take_fault(name: &str) -> Option<synStatus> {
    if ARMED_FAULTS.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut r = registry();
    let (status, left) = r.faults.get_mut(name)?;
    let status = *status;
    *left -= 1;
    if *left == 0 {
        r.faults.remove(name);
    }
    ARMED_FAULTS.fetch_sub(1, Ordering::AcqRel);
    Some(status)
}

/// Stall table: `pending` stalls are consumed by the next operation of a module's streams
/// (`None` = until released, `Some(ms)` = for ms); `blocked` holds modules whose worker waits
/// for a release.
#[derive(Default)]
pub(crate) struct StallTable {
    pub pending: HashMap<u32, Option<u64>>,
    pub blocked: std::collections::HashSet<u32>,
}

pub(crate) struct Stalls {
    pub table: Mutex<StallTable>,
    pub cv: Condvar,
}

impl Stalls {
    /// Removes any pending stall of `module` and unblocks its waiting worker.
    pub(crate) fn release(&self, module: u32) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.pending.remove(&module);
        t.blocked.remove(&module);
        self.cv.notify_all();
    }

    /// Removes every stall and unblocks every worker.
    pub(crate) fn clear(&self) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.pending.clear();
        t.blocked.clear();
        self.cv.notify_all();
    }
}

pub(crate) fn stalls() -> &'static Stalls {
    static S: OnceLock<Stalls> = OnceLock::new();
    S.get_or_init(|| Stalls { table: Mutex::new(StallTable::default()), cv: Condvar::new() })
}

thread_local! {
    static LAST_ERROR: RefCell<(synStatus, CString)> = RefCell::new((synStatus::SUCCESS, CString::default()));
}

/// Records the last error of this thread ("<C function>: <message>").
pub(crate) fn set_last_error(status: synStatus, msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = (status, c));
}

/// This thread's last error status.
pub(crate) fn last_error_status() -> synStatus {
    LAST_ERROR.with(|e| e.borrow().0)
}

/// Pointer to this thread's last error message; valid until the next failing mock call on this
/// thread (the thread-local string is replaced, not mutated in place).
pub(crate) fn last_error_message_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|e| e.borrow().1.as_ptr())
}
