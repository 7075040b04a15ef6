//! Process-global state of the CPU mock: the registry of modules, handles, allocations and
//! kernels.
//!
//! Owns: [`Registry`] (one `Mutex`, never held while a stream worker runs a copy or kernel) and
//! its lookups; its allocator methods live in `alloc.rs`. Must not touch: device memory
//! contents (each allocation has its own lock, see `memory.rs`), the fault tables
//! (`faults.rs`), the last error (`last_error.rs`), the handle encoding (`cabi.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use habana_sys::{synDeviceId, synStatus};

use crate::cabi::handle_to_raw;
use crate::config::MockConfig;
use crate::error::{MResult, fail};
use crate::event::Event;
use crate::graph::program::Program;
use crate::graph::records::{GraphRec, Item};
use crate::kernel_abi::Kernel;
use crate::latency::DeviceLatency;
use crate::memory::{DevAlloc, HostRange};
use crate::recipe::Recipe;
use crate::stream::Stream;

/// One mock module.
#[derive(Debug)]
pub(crate) struct Module {
    /// The device id of the current holder, if acquired.
    pub acquired: Option<synDeviceId>,
    /// Bytes of live device allocations.
    pub used: u64,
    /// The module's latency model (noise stream, slowdown, script).
    pub latency: DeviceLatency,
}

/// Everything behind the global lock.
pub(crate) struct Registry {
    /// True between synInitialize and synDestroy.
    pub initialized: bool,
    /// True once `dcmock_configure` set `config` (then the environment is not consulted).
    pub configured: bool,
    /// The configuration in force.
    pub config: MockConfig,
    /// The modules, by module id (built from `config` at synInitialize or reconfiguration).
    pub modules: Vec<Module>,
    /// Acquired device id -> module id.
    pub devices: HashMap<synDeviceId, u32>,
    /// The next device id handed out by an acquire.
    pub next_device_id: synDeviceId,
    /// Live streams by handle id.
    pub streams: HashMap<u64, Arc<Stream>>,
    /// Live events by handle id.
    pub events: HashMap<u64, Arc<Event>>,
    /// Live recipes by handle id.
    pub recipes: HashMap<u64, Arc<Recipe>>,
    /// Live device allocations by base address.
    pub allocs: BTreeMap<u64, Arc<DevAlloc>>,
    /// Freed device allocations, base -> size (addresses are never reused).
    pub freed: BTreeMap<u64, u64>,
    /// The next device address handed out (bump allocator, never reused).
    pub next_addr: u64,
    /// Registered host ranges (synHostMalloc'd or synHostMap'ed) by start address.
    pub host: BTreeMap<usize, Arc<HostRange>>,
    /// The next handle id (see [`Registry::new_handle`]).
    pub next_handle: u64,
    /// Registered kernels by name (built-ins, the gradient kernels, then `dcmock_register_kernel`).
    pub kernels: HashMap<String, Kernel>,
    /// Graphs under construction by handle id.
    pub graphs: HashMap<u64, GraphRec>,
    /// Section and tensor handles: (graph handle id, what).
    pub graph_items: HashMap<u64, (u64, Item)>,
    /// Compiled graph recipes by recipe handle id (JSON recipes are in `recipes`).
    pub graph_recipes: HashMap<u64, Arc<Program>>,
    /// Events mapped to a tensor (`synEventMapTensor`), by event handle id: (recipe handle id,
    /// position of the tensor among the recipe's persistent tensors). A later map of the same
    /// event replaces its mapping. A launch of that recipe given the event records it when the
    /// node producing the tensor ends.
    pub event_maps: HashMap<u64, (u64, usize)>,
    /// Compile errors handed out by `synGraphCompileV2` (`synErrorHandle` ids).
    pub compile_errors: HashMap<u64, (synStatus, String)>,
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
            graphs: HashMap::new(),
            graph_items: HashMap::new(),
            graph_recipes: HashMap::new(),
            event_maps: HashMap::new(),
            compile_errors: HashMap::new(),
        };
        crate::builtin::register_builtins(&mut r.kernels);
        crate::grad_kernels::register(&mut r.kernels);
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

    /// The live stream `handle` (unknown: synInvalidArgument).
    pub(crate) fn stream(&self, handle: u64) -> MResult<Arc<Stream>> {
        self.check_init()?;
        match self.streams.get(&handle) {
            Some(s) => Ok(s.clone()),
            None => fail(synStatus::INVALID_ARGUMENT, format!("unknown stream handle {:#x}", handle_to_raw(handle))),
        }
    }

    /// The live event `handle` (unknown: synInvalidEventHandle).
    pub(crate) fn event(&self, handle: u64) -> MResult<Arc<Event>> {
        self.check_init()?;
        match self.events.get(&handle) {
            Some(e) => Ok(e.clone()),
            None => fail(synStatus::INVALID_EVENT_HANDLE, format!("unknown event handle {:#x}", handle_to_raw(handle))),
        }
    }

    /// The live recipe `handle` (unknown: synInvalidArgument).
    pub(crate) fn recipe(&self, handle: u64) -> MResult<Arc<Recipe>> {
        self.check_init()?;
        match self.recipes.get(&handle) {
            Some(r) => Ok(r.clone()),
            None => fail(synStatus::INVALID_ARGUMENT, format!("unknown recipe handle {:#x}", handle_to_raw(handle))),
        }
    }

    /// The live recipe `handle` of either kind (unknown: synInvalidArgument).
    pub(crate) fn any_recipe(&self, handle: u64) -> MResult<AnyRecipe> {
        self.check_init()?;
        if let Some(p) = self.graph_recipes.get(&handle) {
            return Ok(AnyRecipe::Graph(p.clone()));
        }
        self.recipe(handle).map(AnyRecipe::Json)
    }
}

/// A recipe handle's content: a JSON mock recipe naming a registered kernel, or a compiled graph.
#[derive(Debug, Clone)]
pub(crate) enum AnyRecipe {
    /// From a mock recipe file (`recipe.rs`).
    Json(Arc<Recipe>),
    /// From synGraphCompile or a graph recipe file (`graph/program.rs`).
    Graph(Arc<Program>),
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

/// Locks the registry. A poisoned lock is recovered: every mutation is completed before any
/// operation that could panic.
pub(crate) fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.get_or_init(|| Mutex::new(Registry::new())).lock().unwrap_or_else(|e| e.into_inner())
}
