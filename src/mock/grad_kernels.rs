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

use super::state::{Kernel, SendPtr};
use super::{MockKernelArgs, MockTensor};

/// Views of the kernel's tensors, checked for count, alignment and overlap.
struct Tensors<'a>(&'a [MockTensor]);

impl<'a> Tensors<'a> {
    /// # Safety
    /// `args` must be the mock's valid argument block for the duration of the call.
    unsafe fn new(args: *const MockKernelArgs, want: u32) -> Option<Self> {
        // SAFETY: guaranteed by the caller; `tensors` holds `num_tensors` entries.
        let a = unsafe { &*args };
        if a.num_tensors != want || a.tensors.is_null() {
            return None;
        }
        // SAFETY: as above.
        Some(Self(unsafe { std::slice::from_raw_parts(a.tensors, want as usize) }))
    }

    fn len_of<T>(&self, i: usize) -> Option<usize> {
        let t = &self.0[i];
        let size = size_of::<T>() as u64;
        (t.bytes.is_multiple_of(size) && (t.data as usize).is_multiple_of(align_of::<T>()))
            .then_some((t.bytes / size) as usize)
    }

    fn disjoint(&self, i: usize, j: usize) -> bool {
        let (a, b) = (&self.0[i], &self.0[j]);
        let (a0, b0) = (a.data as u64, b.data as u64);
        a0 + a.bytes <= b0 || b0 + b.bytes <= a0
    }

    /// # Safety
    /// Tensor `i` must not be viewed elsewhere during the borrow (checked by callers through
    /// `disjoint`); the mock keeps its allocation locked and alive for the call.
    unsafe fn slice_mut<T>(&self, i: usize) -> Option<&'a mut [T]> {
        let n = self.len_of::<T>(i)?;
        // SAFETY: aligned, in-bounds (the mock validated the bound range), exclusive per caller.
        Some(unsafe { std::slice::from_raw_parts_mut(self.0[i].data.cast::<T>(), n) })
    }

    /// # Safety
    /// No mutable view of tensor `i` may exist during the borrow.
    unsafe fn slice<T>(&self, i: usize) -> Option<&'a [T]> {
        let n = self.len_of::<T>(i)?;
        // SAFETY: as for `slice_mut`, shared.
        Some(unsafe { std::slice::from_raw_parts(self.0[i].data.cast::<T>(), n) })
    }

    /// The scale factor from one-element f32 tensor `i`.
    fn scale(&self, i: usize) -> Option<f32> {
        let t = &self.0[i];
        // SAFETY: the tensor holds at least 4 bytes (checked); read unaligned-tolerant.
        (t.bytes >= 4).then(|| unsafe { t.data.cast::<f32>().read_unaligned() })
    }
}

fn status(ok: Option<()>) -> synStatus {
    if ok.is_some() { synStatus::SUCCESS } else { synStatus::INVALID_ARGUMENT }
}

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
    let fns: [super::MockKernelFn; 9] = [
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
