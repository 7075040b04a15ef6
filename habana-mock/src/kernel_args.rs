//! Checked views of a mock kernel call's arguments, used by the project's mock kernels
//! (`grad_kernels.rs`).
//!
//! Owns: [`Tensors`] (tensor count, alignment, overlap and length checks before a slice is
//! formed) and [`status`]. Must not touch: kernel math, the registry or the tensors' owners.

use habana_sys::synStatus;

use crate::kernel_abi::{MockKernelArgs, MockTensor};

/// Views of a kernel call's tensors (checked for count, alignment and overlap).
pub(crate) struct Tensors<'a>(&'a [MockTensor]);

impl<'a> Tensors<'a> {
    /// The tensors of `args`, or `None` unless there are exactly `want` tensors.
    ///
    /// # Safety
    /// `args` must be the mock's valid argument block for the duration of the call.
    pub(crate) unsafe fn new(args: *const MockKernelArgs, want: u32) -> Option<Self> {
        // SAFETY: guaranteed by the caller; `tensors` holds `num_tensors` entries.
        let a = unsafe { &*args };
        if a.num_tensors != want || a.tensors.is_null() {
            return None;
        }
        // SAFETY: as above.
        Some(Self(unsafe { std::slice::from_raw_parts(a.tensors, want as usize) }))
    }

    /// Elements of type `T` in tensor `i`, or `None` when its size is not a whole number of
    /// `T` or its data is not aligned for `T`.
    pub(crate) fn len_of<T>(&self, i: usize) -> Option<usize> {
        let t = &self.0[i];
        let size = size_of::<T>() as u64;
        (t.bytes.is_multiple_of(size) && (t.data as usize).is_multiple_of(align_of::<T>()))
            .then_some((t.bytes / size) as usize)
    }

    /// True when tensors `i` and `j` share no byte.
    pub(crate) fn disjoint(&self, i: usize, j: usize) -> bool {
        let (a, b) = (&self.0[i], &self.0[j]);
        let (a0, b0) = (a.data as u64, b.data as u64);
        a0 + a.bytes <= b0 || b0 + b.bytes <= a0
    }

    /// Tensor `i` as `&mut [T]` (`None` as [`Tensors::len_of`]).
    ///
    /// # Safety
    /// Tensor `i` must not be viewed elsewhere during the borrow (checked by callers through
    /// `disjoint`); the mock keeps its allocation locked and alive for the call.
    pub(crate) unsafe fn slice_mut<T>(&self, i: usize) -> Option<&'a mut [T]> {
        let n = self.len_of::<T>(i)?;
        // SAFETY: aligned, in-bounds (the mock validated the bound range), exclusive per caller.
        Some(unsafe { std::slice::from_raw_parts_mut(self.0[i].data.cast::<T>(), n) })
    }

    /// Tensor `i` as `&[T]` (`None` as [`Tensors::len_of`]).
    ///
    /// # Safety
    /// No mutable view of tensor `i` may exist during the borrow.
    pub(crate) unsafe fn slice<T>(&self, i: usize) -> Option<&'a [T]> {
        let n = self.len_of::<T>(i)?;
        // SAFETY: as for `slice_mut`, shared.
        Some(unsafe { std::slice::from_raw_parts(self.0[i].data.cast::<T>(), n) })
    }

    /// The scale factor from one-element f32 tensor `i`.
    pub(crate) fn scale(&self, i: usize) -> Option<f32> {
        let t = &self.0[i];
        // SAFETY: the tensor holds at least 4 bytes (checked); read unaligned-tolerant.
        (t.bytes >= 4).then(|| unsafe { t.data.cast::<f32>().read_unaligned() })
    }
}

/// `SUCCESS` when the kernel body ran to the end (`Some`), else `INVALID_ARGUMENT`.
pub(crate) fn status(ok: Option<()>) -> synStatus {
    if ok.is_some() { synStatus::SUCCESS } else { synStatus::INVALID_ARGUMENT }
}
