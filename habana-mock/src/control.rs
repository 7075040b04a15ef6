//! The mock-only control API: three C functions (`dcmock_configure`, `dcmock_register_kernel`,
//! `dcmock_inject_fault`, exported by name only from the `mock-synapse` cdylib) and the Rust
//! wrapper [`MockControl`] that calls them in-process or through a loaded mock library.
//!
//! Owns: configuration changes, kernel registration and fault arming (the tables themselves are
//! `faults.rs`'s). Must not touch: the Synapse function table (these are not Synapse functions);
//! faults never reach these functions (they run in the guard without fault injection).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::{Path, PathBuf};

use habana_sys::synStatus;

use crate::cabi::guard_unfaultable as guard;
use crate::config::{Fault, MockConfig};
use crate::error::{MResult, MockError, fail};
use crate::faults::{self, stalls};
use crate::kernel_abi::{Kernel, MockKernelFn, SendPtr};
use crate::state::registry;

fn json_arg<'a>(p: *const c_char) -> MResult<&'a str> {
    if p.is_null() {
        return fail(synStatus::INVALID_ARGUMENT, "null JSON string");
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    match unsafe { CStr::from_ptr(p) }.to_str() {
        Ok(s) => Ok(s),
        Err(_) => fail(synStatus::INVALID_ARGUMENT, "JSON is not UTF-8"),
    }
}

/// Replaces the mock configuration with the JSON [`MockConfig`] `json`. Rejected with synBusy
/// while any module is acquired, synInvalidArgument when the JSON is invalid. Takes effect now
/// if the mock is initialized (modules rebuilt, latency streams reseeded), else at synInitialize.
///
/// # Safety
/// `json` is null or a NUL-terminated string.
pub unsafe extern "C" fn dcmock_configure(json: *const c_char) -> synStatus {
    guard("dcmock_configure", || {
        let cfg = MockConfig::from_json(json_arg(json)?)
            .map_err(|e| MockError::new(synStatus::INVALID_ARGUMENT, e.to_string()))?;
        let mut r = registry();
        if !r.devices.is_empty() {
            return fail(synStatus::BUSY, format!("{} device(s) are acquired; release them first", r.devices.len()));
        }
        r.config = cfg;
        r.configured = true;
        if r.initialized {
            r.rebuild_modules();
        }
        Ok(())
    })
}

/// Registers (or replaces) kernel `name`. Null or empty name → synInvalidArgument.
///
/// # Safety
/// `name` is null or NUL-terminated. `f` must be sound to call from any stream worker thread
/// with a valid [`crate::MockKernelArgs`] (carrying `user_data`), touching only the given tensor
/// ranges, and must not unwind or call back into the mock.
pub unsafe extern "C" fn dcmock_register_kernel(
    name: *const c_char,
    f: MockKernelFn,
    user_data: *mut c_void,
) -> synStatus {
    guard("dcmock_register_kernel", || {
        let name = json_arg(name)?;
        if name.is_empty() {
            return fail(synStatus::INVALID_ARGUMENT, "empty kernel name");
        }
        registry().kernels.insert(name.to_string(), Kernel { f, user_data: SendPtr(user_data) });
        Ok(())
    })
}

/// Arms the JSON [`Fault`] `json`. Invalid JSON or an out-of-range module → synInvalidArgument.
///
/// # Safety
/// `json` is null or a NUL-terminated string.
pub unsafe extern "C" fn dcmock_inject_fault(json: *const c_char) -> synStatus {
    guard("dcmock_inject_fault", || {
        let fault = Fault::from_json(json_arg(json)?)
            .map_err(|e| MockError::new(synStatus::INVALID_ARGUMENT, e.to_string()))?;
        let mut r = registry();
        match fault {
            Fault::FailNextCall { function, status, times } => {
                if times == 0 {
                    return fail(synStatus::INVALID_ARGUMENT, "times must be >= 1");
                }
                faults::arm_fail_next(function, status, times);
            }
            Fault::StallStream { module_id, duration_ms } => {
                let n = if r.initialized { r.modules.len() as u32 } else { r.config.devices };
                if module_id >= n {
                    return fail(synStatus::INVALID_ARGUMENT, format!("module {module_id} does not exist"));
                }
                stalls().arm(module_id, duration_ms);
            }
            Fault::ReleaseStall { module_id } => stalls().release(module_id),
            Fault::ClearAll => {
                faults::clear_fail_next();
                stalls().clear();
                crate::hccl::disarm_kill();
            }
            Fault::HcclKillRank { rank, abort_process } => crate::hccl::arm_kill(rank, abort_process),
            Fault::HcclAsyncError { code } => {
                drop(r);
                crate::hccl::inject_async_error(code);
            }
            Fault::ReseedLatency { module_id, seed } => match r.modules.get_mut(module_id as usize) {
                Some(m) => m.latency.reseed(seed, module_id),
                None => return fail(synStatus::INVALID_ARGUMENT, format!("module {module_id} does not exist")),
            },
            Fault::LatencyKey { module_id, step, micro_batch } => set_key(&mut r, module_id, step, micro_batch)?,
        }
        Ok(())
    })
}

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MockControlError {
    /// The mock library could not be loaded or lacks a `dcmock_*` symbol.
    #[error("cannot use mock library {path}: {source}")]
    Load {
        /// The library path.
        path: PathBuf,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
    /// The mock rejected the call.
    #[error("{call} failed with {status}: {message}")]
    Rejected {
        /// "dcmock_configure", "dcmock_register_kernel" or "dcmock_inject_fault".
        call: &'static str,
        /// Status returned.
        status: synStatus,
        /// The mock's last error message for this thread.
        message: String,
    },
    /// A name or JSON contains a NUL byte.
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
}

type JsonFn = unsafe extern "C" fn(*const c_char) -> synStatus;
type RegisterFn = unsafe extern "C" fn(*const c_char, MockKernelFn, *mut c_void) -> synStatus;
type MessageFn = unsafe extern "C" fn() -> *const c_char;

/// Handle on the mock's control functions, in this process's mock or in a loaded mock library
/// (whose state is separate from the in-process mock's).
#[derive(Clone, Copy, Debug)]
pub struct MockControl {
    configure: JsonFn,
    register: RegisterFn,
    inject: JsonFn,
    message: Option<MessageFn>,
}

impl MockControl {
    /// The control functions of the in-process mock (the state behind [`crate::api`]).
    pub fn in_process() -> Self {
        Self {
            configure: dcmock_configure,
            register: dcmock_register_kernel,
            inject: dcmock_inject_fault,
            message: Some(crate::ffi::syn_get_last_error_message),
        }
    }

    /// The control functions exported by the mock library at `path` (`libmock_synapse.so`). The
    /// library is loaded once more (refcount) and intentionally never unloaded.
    ///
    /// # Errors
    /// [`MockControlError::Load`] when the library cannot be opened or lacks a `dcmock_*` symbol.
    pub fn from_library(path: &Path) -> Result<Self, MockControlError> {
        // The one rule of a named library: no `/` = relative to the current directory.
        let path = &habana_sys::library_path(path);
        let load = |source| MockControlError::Load { path: path.to_path_buf(), source };
        // SAFETY: loading the mock library runs only Rust static initialisers of the mock.
        let lib = unsafe { libloading::Library::new(path) }.map_err(load)?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: the symbol types are the prototypes defined in this module; the library is
        // leaked so the pointers stay valid.
        unsafe {
            Ok(Self {
                configure: *lib.get::<JsonFn>(b"dcmock_configure\0").map_err(load)?,
                register: *lib.get::<RegisterFn>(b"dcmock_register_kernel\0").map_err(load)?,
                inject: *lib.get::<JsonFn>(b"dcmock_inject_fault\0").map_err(load)?,
                message: lib.get::<MessageFn>(b"synGetLastErrorMessage\0").ok().map(|s| *s),
            })
        }
    }

    fn check(&self, call: &'static str, status: synStatus) -> Result<(), MockControlError> {
        if status.is_success() {
            return Ok(());
        }
        let message = match self.message {
            // SAFETY: synGetLastErrorMessage returns a NUL-terminated thread-local string valid
            // until the next failing call on this thread; copied at once.
            Some(f) => unsafe { CStr::from_ptr(f()) }.to_string_lossy().into_owned(),
            None => String::new(),
        };
        Err(MockControlError::Rejected { call, status, message })
    }

    /// Applies `cfg` (see [`dcmock_configure`]).
    ///
    /// # Errors
    /// [`MockControlError::Rejected`] with synBusy while a module is acquired, or
    /// synInvalidArgument for an invalid configuration.
    pub fn configure(&self, cfg: &MockConfig) -> Result<(), MockControlError> {
        let json = CString::new(serde_json::to_string(cfg).expect("MockConfig serialises"))
            .map_err(|_| MockControlError::Nul("config"))?;
        // SAFETY: NUL-terminated JSON.
        self.check("dcmock_configure", unsafe { (self.configure)(json.as_ptr()) })
    }

    /// Registers kernel `name` (see [`dcmock_register_kernel`]).
    ///
    /// # Safety
    /// As [`dcmock_register_kernel`]: `f` must be sound to call from any thread with the mock's
    /// arguments and this `user_data`.
    ///
    /// # Errors
    /// [`MockControlError::Nul`] or [`MockControlError::Rejected`] (empty name).
    pub unsafe fn register_kernel(
        &self,
        name: &str,
        f: MockKernelFn,
        user_data: *mut c_void,
    ) -> Result<(), MockControlError> {
        let c = CString::new(name).map_err(|_| MockControlError::Nul("kernel name"))?;
        // SAFETY: NUL-terminated name; `f`'s contract is forwarded to our caller.
        self.check("dcmock_register_kernel", unsafe { (self.register)(c.as_ptr(), f, user_data) })
    }

    /// Arms `fault` (see [`dcmock_inject_fault`]).
    ///
    /// # Errors
    /// [`MockControlError::Rejected`] for an out-of-range module or zero count.
    pub fn inject_fault(&self, fault: &Fault) -> Result<(), MockControlError> {
        let json = CString::new(serde_json::to_string(fault).expect("Fault serialises"))
            .map_err(|_| MockControlError::Nul("fault"))?;
        // SAFETY: NUL-terminated JSON.
        self.check("dcmock_inject_fault", unsafe { (self.inject)(json.as_ptr()) })
    }
}

/// Sets module `module_id`'s latency key (see `Fault::LatencyKey`) under the registry lock.
fn set_key(r: &mut crate::state::Registry, module_id: u32, step: u64, micro_batch: u32) -> MResult<()> {
    match r.modules.get_mut(module_id as usize) {
        Some(m) => {
            m.latency.set_key(Some(crate::latency::LatencyKey { step, micro_batch }));
            Ok(())
        }
        None => fail(synStatus::INVALID_ARGUMENT, format!("module {module_id} does not exist")),
    }
}

/// `Fault::LatencyKey` for the in-process mock without the JSON round trip: a job calls it
/// before every micro-batch, so it stays a lock and a store.
///
/// # Errors
/// [`MockControlError::Rejected`] naming the module when it does not exist.
pub fn set_latency_key(module_id: u32, step: u64, micro_batch: u32) -> Result<(), MockControlError> {
    set_key(&mut crate::state::registry(), module_id, step, micro_batch).map_err(|e| MockControlError::Rejected {
        call: "set_latency_key",
        status: e.status,
        message: e.msg,
    })
}
