//! The CPU mock device: the SynapseAI and HCCL C API implemented in Rust on the CPU,
//! filling the same function table as `libSynapse.so` ([`api`]), and also built as a shared
//! library by the `mock-synapse` crate (located by [`shared_library_path`]).
//!
//! Owns: everything behind the table (devices, memory, streams, events, recipes, the latency
//! model, faults) and the mock-only control API ([`MockControl`], `dcmock_*`). Must not touch:
//! the safe layer (`synapse`) or the scheduler: they see the mock only through the table.
//!
//! Faithfulness: handles are fake pointers looked up in maps (never dereferenced); device
//! addresses are u64 handles into host allocations, 128-byte aligned and never reused, so
//! double free and use-after-free are detected (synInvalidArgument); copies only touch host
//! memory inside synHostMalloc'd or synHostMap'ed ranges; each stream runs its work in order on
//! a worker thread; events carry device timestamps in ns ([`TimeMode`]). Asynchronous errors
//! (a kernel returning non-success, a failed collective) are sticky per stream: see `stream.rs`.
//! Collectives: see `hccl/mod.rs` for the C-ABI behaviour.
//!
//! The state is process-global. Tests sharing one process must use distinct module ids and
//! must not call synDestroy or [`MockControl::configure`] while other tests hold devices.

mod builtin;
pub mod config;
mod control;
mod device;
mod event;
pub mod ffi;
mod grad_kernels;
pub mod hccl;
mod kernel_args;
pub mod latency;
mod launch;
mod memory;
pub mod model_kernels;
mod ops;
pub mod recipe;
mod state;
mod status;
mod stream;

use std::ffi::{c_char, c_void};
use std::path::PathBuf;

use habana_sys::{SynapseApi, SynapseFns, synStatus};

pub use config::{DeviceOverride, Fault, MockConfig, MockDeviceType, Noise, TimeMode};
pub use control::{MockControl, MockControlError, dcmock_configure, dcmock_inject_fault, dcmock_register_kernel};
pub use device::{ENV_LOCK_DIR, mock_pci_bus};
pub use grad_kernels::GRADIENT_KERNELS;
pub use latency::ReferenceMultiplier;
pub use memory::ALIGNMENT;
pub use recipe::{MockLatency, MockRecipe, MockTensorSpec, RecipeFileError, TENSOR_ID_BASE};
pub use stream::epoch_ns;

/// Version reported by `synDriverGetVersion` unless [`ENV_VERSION`] is set.
pub const MOCK_VERSION: &str = "1.21.0-mock";
/// Environment variable overriding the reported version (e.g. "1.15.0" to emulate an old
/// runtime), read at each `synDriverGetVersion` call.
pub const ENV_VERSION: &str = "DROPCOMPUTE_MOCK_VERSION";

/// One tensor handed to a mock kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MockTensor {
    /// NUL-terminated recipe tensor name.
    pub name: *const c_char,
    /// Start of the bound device range, in host memory (aligned as the bound device address).
    pub data: *mut u8,
    /// Bytes of the tensor (from the recipe).
    pub bytes: u64,
}

/// Arguments of a mock kernel call: tensors in recipe order, the recipe's scalar params and the
/// registered user data. Pointers are valid only during the call.
#[repr(C)]
#[derive(Debug)]
pub struct MockKernelArgs {
    /// `num_tensors` tensors.
    pub tensors: *const MockTensor,
    /// Number of tensors.
    pub num_tensors: u32,
    /// `num_params` f64 parameters.
    pub params: *const f64,
    /// Number of parameters.
    pub num_params: u32,
    /// The pointer given at registration.
    pub user_data: *mut c_void,
}

/// A mock kernel. Returning non-success records an asynchronous error on the stream.
pub type MockKernelFn = unsafe extern "C" fn(args: *const MockKernelArgs) -> synStatus;

macro_rules! mock_table {
    (required: [$(($field:ident, $sym:ident, ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty)),* $(,)?],
     optional: [$(($ofield:ident, $osym:ident, ($($oarg:ident: $oty:ty),* $(,)?) -> $oret:ty)),* $(,)?]) => {
        fn fns() -> SynapseFns {
            SynapseFns { $($field: ffi::$field,)* $($ofield: Some(ffi::$ofield),)* }
        }
    };
}

habana_sys::for_each_function!(mock_table);

/// The in-process mock's function table (origin "cpu-mock"; every optional function present).
pub fn api() -> SynapseApi {
    // SAFETY: every function of the table honours its C prototype, never unwinds (catch_unwind
    // in ffi.rs) and never dereferences a handle; see the module docs of ffi.rs.
    unsafe { SynapseApi::from_fns(fns(), "cpu-mock") }
}

/// Why [`shared_library_path`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedLibraryError {
    /// The running executable's path does not look like `<target>/<profile>/deps/<exe>` or
    /// `<target>/<profile>/<exe>`.
    #[error("cannot derive the target directory from {0}")]
    NoTargetDir(PathBuf),
    /// `cargo build -p mock-synapse` failed or could not run, and no library exists.
    #[error("building mock-synapse failed ({why}); expected {path}")]
    Build {
        /// The expected library path.
        path: PathBuf,
        /// Cargo's exit status or spawn error.
        why: String,
    },
}

/// Path of the mock shared library `libmock_synapse.so` for the running test or binary:
/// `<target>/<profile>/libmock_synapse.so`, derived from `std::env::current_exe()`. The first
/// call per process runs `cargo build -p mock-synapse` (same profile) so the library is never
/// stale; when cargo fails but a library exists, that one is used.
///
/// # Errors
/// [`SharedLibraryError`] when the path cannot be derived, or the library is absent and cannot
/// be built.
pub fn shared_library_path() -> Result<PathBuf, SharedLibraryError> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let r = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut dir = exe.parent().ok_or_else(|| exe.display().to_string())?.to_path_buf();
        if dir.file_name().is_some_and(|n| n == "deps" || n == "examples") {
            dir.pop();
        }
        let profile =
            dir.file_name().and_then(|n| n.to_str()).map(str::to_owned).ok_or_else(|| exe.display().to_string())?;
        let target = dir.parent().ok_or_else(|| exe.display().to_string())?.to_path_buf();
        let lib = dir.join("libmock_synapse.so");
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "mock-synapse", "--target-dir"]).arg(&target);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            p => {
                cmd.args(["--profile", p]);
            }
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        let status = cmd.status();
        match status {
            Ok(s) if s.success() => Ok(lib),
            _ if lib.exists() => Ok(lib),
            Ok(s) => Err(format!("{}|cargo exited with {s}", lib.display())),
            Err(e) => Err(format!("{}|cannot run cargo: {e}", lib.display())),
        }
    });
    match r {
        Ok(p) => Ok(p.clone()),
        Err(e) => match e.split_once('|') {
            Some((path, why)) => Err(SharedLibraryError::Build { path: PathBuf::from(path), why: why.to_string() }),
            None => Err(SharedLibraryError::NoTargetDir(PathBuf::from(e))),
        },
    }
}
