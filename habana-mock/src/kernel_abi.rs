//! The C ABI of mock kernels: what a kernel receives ([`MockTensor`], [`MockKernelArgs`]), its
//! signature ([`MockKernelFn`]) and a registered kernel ([`Kernel`] with its [`SendPtr`] user
//! data).
//!
//! Owns: these types (re-exported from the crate root as `habana_mock::{MockTensor,
//! MockKernelArgs, MockKernelFn}`). Must not touch: anything else of the crate (a leaf: it
//! imports only `habana-sys`); the kernel table lives in the registry (`state.rs`), calls are
//! made by the stream worker (`stream.rs`).

use std::ffi::{c_char, c_void};

use habana_sys::synStatus;

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
    /// The kernel function.
    pub f: MockKernelFn,
    /// The pointer given at registration, passed back as `MockKernelArgs::user_data`.
    pub user_data: SendPtr,
}
