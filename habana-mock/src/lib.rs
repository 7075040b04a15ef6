//! habana-mock: a CPU mock of the Intel Gaudi SynapseAI runtime and HCCL, the C API implemented
//! in Rust on the CPU, filling the same function table as `libSynapse.so` ([`api`]); the
//! `mock-synapse` crate exports the same functions from a shared library that
//! `habana_sys::SynapseApi::load_path` loads like the real one.
//!
//! Owns: everything behind the table (devices, memory, streams, events, recipes, the latency
//! model, faults), the CPU kernels it runs ([`kernels`], built from `../kernels/cpu`), and the
//! mock-only control API ([`MockControl`], `dcmock_*`). Depends on `habana-sys` and
//! `latency-noise` only: it never imports the product (`dropcompute`), whose safe layer and
//! scheduler see the mock only through the table. A training job's model is a device graph of
//! the vendor's GUIDs (the graph API, `graph/`), not a kernel of its own.
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

mod alloc;
mod builtin;
mod cabi;
pub mod config;
mod control;
mod device;
mod error;
mod event;
mod faults;
pub mod ffi;
mod grad_kernels;
mod graph;
pub mod hccl;
mod kernel_abi;
mod kernel_args;
pub mod kernels;
mod last_error;
pub mod latency;
mod launch;
mod memory;
mod ops;
pub mod recipe;
mod state;
mod status;
mod stream;

use habana_sys::{SynapseApi, SynapseFns};

pub use config::{DeviceOverride, ENV_VERSION, Fault, MOCK_VERSION, MockConfig, MockDeviceType, Noise, TimeMode};
pub use control::{
    MockControl, MockControlError, dcmock_configure, dcmock_inject_fault, dcmock_register_kernel, set_latency_key,
};
pub use device::{ENV_LOCK_DIR, mock_pci_bus};
pub use grad_kernels::GRADIENT_KERNELS;
pub use kernel_abi::{MockKernelArgs, MockKernelFn, MockTensor};
pub use memory::ALIGNMENT;
pub use recipe::{MockLatency, MockRecipe, MockTensorSpec, RecipeFileError, TENSOR_ID_BASE};
pub use stream::epoch_ns;

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
    // SAFETY: every function of the table honours its C prototype, never unwinds (the guard of
    // cabi.rs catches panics) and never dereferences a handle; see the module docs of ffi/mod.rs.
    unsafe { SynapseApi::from_fns(fns(), "cpu-mock") }
}
