//! The habana-mock CPU mock device as a shared library: exports every SynapseAI/HCCL C symbol
//! bound by `habana_sys::for_each_function!` (forwarding to `habana_mock::ffi`) plus the
//! mock-only `dcmock_configure`, `dcmock_register_kernel` and `dcmock_inject_fault`.
//!
//! Owns: the exported names only. Must not touch: behaviour (all of it is in
//! `habana_mock`). For tests: load it with `habana_sys::SynapseApi::load_path`; never
//! install it where the real `libSynapse.so` could be shadowed.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};

use habana_mock::{self as mock, MockKernelFn, ffi};
use habana_sys::synStatus;

macro_rules! export {
    (required: [$(($field:ident, $sym:ident, ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty)),* $(,)?],
     optional: [$(($ofield:ident, $osym:ident, ($($oarg:ident: $oty:ty),* $(,)?) -> $oret:ty)),* $(,)?]) => {
        $(
            #[doc = concat!("`", stringify!($sym), "`, forwarded to the CPU mock.")]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $sym($($arg: $ty),*) -> $ret {
                // SAFETY: same prototype and contract; the caller's obligations pass through.
                unsafe { ffi::$field($($arg),*) }
            }
        )*
        $(
            #[doc = concat!("`", stringify!($osym), "`, forwarded to the CPU mock.")]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $osym($($oarg: $oty),*) -> $oret {
                // SAFETY: same prototype and contract; the caller's obligations pass through.
                unsafe { ffi::$ofield($($oarg),*) }
            }
        )*
    };
}

habana_sys::for_each_function!(export);

/// See `habana_mock::dcmock_configure`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmock_configure(json: *const c_char) -> synStatus {
    // SAFETY: forwarded contract.
    unsafe { mock::dcmock_configure(json) }
}

/// See `habana_mock::dcmock_register_kernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmock_register_kernel(
    name: *const c_char,
    f: MockKernelFn,
    user_data: *mut c_void,
) -> synStatus {
    // SAFETY: forwarded contract.
    unsafe { mock::dcmock_register_kernel(name, f, user_data) }
}

/// See `habana_mock::dcmock_inject_fault`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmock_inject_fault(json: *const c_char) -> synStatus {
    // SAFETY: forwarded contract.
    unsafe { mock::dcmock_inject_fault(json) }
}
