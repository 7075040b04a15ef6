//! The project's CPU kernels (`crate::kernels`, built from `kernels/cpu/*.c`) registered as mock
//! recipe kernels, so recipes can rescale and accumulate gradients on the mock device as the
//! TPC twins (`kernels/tpc/`) do on Gaudi.
//!
//! Tensor conventions (recipe order): the output/accumulator first, then the input, then, for
//! the scaling kernels, `scale`: a one-element f32 device tensor (on a device the factor, e.g.
//! 1 / global sample count, is produced at run time by a collective, so it cannot be a
//! compile-time recipe parameter).
//! - `scale_f32` [x, scale], `scale_bf16` [x, scale]: x *= scale (in place).
//! - `accumulate_f32` [acc, x], `accumulate_bf16` [acc, x], `accumulate_bf16_to_f32` [acc: f32, x: bf16].
//! - `scale_accumulate_f32` / `_bf16` / `_bf16_to_f32` [acc, x, scale]: acc += scale * x.
//! - `nonfinite_flag_f32` [flag (4 bytes, u32), x: f32]: flag = any non-finite element of x.
//!
//! Element counts come from the tensors' byte sizes and must agree; misaligned or overlapping
//! input/output tensors are rejected with synInvalidArgument (never undefined behaviour).
//! Must not touch: anything but the tensors given.

use std::collections::HashMap;

use habana_sys::synStatus;
use half::bf16;

use crate::kernel_abi::{Kernel, MockKernelArgs, MockKernelFn, SendPtr};
use crate::kernel_args::{Tensors, status};

macro_rules! scale_kernel {
    ($name:ident, $t:ty, $f:path) => {
        unsafe extern "C" fn $name(args: *const MockKernelArgs) -> synStatus {
            // SAFETY: the mock passes a valid argument block; the two tensors are checked
            // disjoint before one is viewed mutably.
            status(unsafe {
                (|| {
                    let t = Tensors::new(args, 2)?;
                    let s = t.scale(1)?;
                    t.disjoint(0, 1).then_some(())?;
                    $f(t.slice_mut::<$t>(0)?, s);
                    Some(())
                })()
            })
        }
    };
}

macro_rules! acc_kernel {
    ($name:ident, $acc:ty, $x:ty, $f:path) => {
        unsafe extern "C" fn $name(args: *const MockKernelArgs) -> synStatus {
            // SAFETY: as for the scale kernels; acc and x are checked disjoint.
            status(unsafe {
                (|| {
                    let t = Tensors::new(args, 2)?;
                    t.disjoint(0, 1).then_some(())?;
                    $f(t.slice_mut::<$acc>(0)?, t.slice::<$x>(1)?).ok()
                })()
            })
        }
    };
}

macro_rules! scale_acc_kernel {
    ($name:ident, $acc:ty, $x:ty, $f:path) => {
        unsafe extern "C" fn $name(args: *const MockKernelArgs) -> synStatus {
            // SAFETY: as above; the scale tensor is only read, before the mutable view.
            status(unsafe {
                (|| {
                    let t = Tensors::new(args, 3)?;
                    let s = t.scale(2)?;
                    (t.disjoint(0, 1) && t.disjoint(0, 2)).then_some(())?;
                    $f(t.slice_mut::<$acc>(0)?, t.slice::<$x>(1)?, s).ok()
                })()
            })
        }
    };
}

/// `nonfinite_flag_f32` [flag: 4 bytes, x: f32]: flag = 1 (as u32) if any element of x is NaN or
/// infinite, else 0 (overwritten). Feeds the non-finite flag of the scheduler's count vector.
unsafe extern "C" fn nonfinite_flag_f32(args: *const MockKernelArgs) -> synStatus {
    // SAFETY: as for the scale kernels; flag and x are checked disjoint.
    status(unsafe {
        (|| {
            let t = Tensors::new(args, 2)?;
            t.disjoint(0, 1).then_some(())?;
            let any = t.slice::<f32>(1)?.iter().any(|v| !v.is_finite());
            t.slice_mut::<u32>(0)?.first_mut()?.clone_from(&u32::from(any));
            Some(())
        })()
    })
}

scale_kernel!(scale_f32, f32, crate::kernels::scale_f32);
scale_kernel!(scale_bf16, bf16, crate::kernels::scale_bf16);
acc_kernel!(accumulate_f32, f32, f32, crate::kernels::accumulate_f32);
acc_kernel!(accumulate_bf16, bf16, bf16, crate::kernels::accumulate_bf16);
acc_kernel!(accumulate_bf16_to_f32, f32, bf16, crate::kernels::accumulate_bf16_to_f32);
scale_acc_kernel!(scale_accumulate_f32, f32, f32, crate::kernels::scale_accumulate_f32);
scale_acc_kernel!(scale_accumulate_bf16, bf16, bf16, crate::kernels::scale_accumulate_bf16);
scale_acc_kernel!(scale_accumulate_bf16_to_f32, f32, bf16, crate::kernels::scale_accumulate_bf16_to_f32);

/// Names of the gradient kernels registered with every mock.
pub const GRADIENT_KERNELS: [&str; 9] = [
    "scale_f32",
    "scale_bf16",
    "accumulate_f32",
    "accumulate_bf16",
    "accumulate_bf16_to_f32",
    "scale_accumulate_f32",
    "scale_accumulate_bf16",
    "scale_accumulate_bf16_to_f32",
    "nonfinite_flag_f32",
];

pub(crate) fn register(table: &mut HashMap<String, Kernel>) {
    let null = SendPtr(std::ptr::null_mut());
    let fns: [MockKernelFn; 9] = [
        scale_f32,
        scale_bf16,
        accumulate_f32,
        accumulate_bf16,
        accumulate_bf16_to_f32,
        scale_accumulate_f32,
        scale_accumulate_bf16,
        scale_accumulate_bf16_to_f32,
        nonfinite_flag_f32,
    ];
    for (name, f) in GRADIENT_KERNELS.iter().zip(fns) {
        table.insert((*name).to_string(), Kernel { f, user_data: null });
    }
}
