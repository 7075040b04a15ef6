//! Built-in mock kernels, registered at first use of the mock: "noop", "fill_f32", "copy".
//!
//! Owns: these three kernels only. Must not touch: anything but the tensors they are given
//! (the numeric kernels of the project live in `kernels/cpu` and are registered separately).

use std::collections::HashMap;

use habana_sys::synStatus;

use crate::kernel_abi::{Kernel, MockKernelArgs, MockKernelFn, SendPtr};

/// Does nothing (used by the scheduler-overhead benchmark).
unsafe extern "C" fn noop(_args: *const MockKernelArgs) -> synStatus {
    synStatus::SUCCESS
}

/// Writes `params[0]` as f32 into every whole f32 of tensor 0. Needs >= 1 tensor and >= 1 param
/// (else synInvalidArgument).
unsafe extern "C" fn fill_f32(args: *const MockKernelArgs) -> synStatus {
    // SAFETY: the mock passes a valid MockKernelArgs whose tensor and param arrays have the
    // stated lengths; tensor data is 128-byte aligned (allocation base) plus the bound offset.
    unsafe {
        let a = &*args;
        if a.num_tensors < 1 || a.num_params < 1 {
            return synStatus::INVALID_ARGUMENT;
        }
        let t = &*a.tensors;
        let v = *a.params as f32;
        let n = (t.bytes / 4) as usize;
        for i in 0..n {
            // Unaligned write: the bound device offset may not be a multiple of 4.
            (t.data as *mut f32).add(i).write_unaligned(v);
        }
    }
    synStatus::SUCCESS
}

/// Copies min(bytes) of tensor 0 into tensor 1 (memmove semantics). Needs >= 2 tensors.
unsafe extern "C" fn copy(args: *const MockKernelArgs) -> synStatus {
    // SAFETY: as for fill_f32; both tensors are live and locked by the worker for this call;
    // `copy` tolerates overlap (the same buffer may be bound twice).
    unsafe {
        let a = &*args;
        if a.num_tensors < 2 {
            return synStatus::INVALID_ARGUMENT;
        }
        let s = &*a.tensors;
        let d = &*a.tensors.add(1);
        std::ptr::copy(s.data, d.data, s.bytes.min(d.bytes) as usize);
    }
    synStatus::SUCCESS
}

pub(crate) fn register_builtins(table: &mut HashMap<String, Kernel>) {
    let null = SendPtr(std::ptr::null_mut());
    for (name, f) in
        [("noop", noop as MockKernelFn), ("fill_f32", fill_f32 as MockKernelFn), ("copy", copy as MockKernelFn)]
    {
        table.insert(name.to_string(), Kernel { f, user_data: null });
    }
}
