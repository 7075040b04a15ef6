//! Kernels written in safe Rust, registered with the mock by the job that ships them (as a
//! Gaudi user ships TPC kernels): [`register_rust_kernel`] and the checked view of one call,
//! [`KernelCall`].
//!
//! Owns: the trampoline from the C kernel ABI ([`crate::MockKernelFn`]) to a Rust function and
//! the borrow rules of a call's tensors (an output is handed out only when it shares no byte
//! with any other tensor of the call, and at most once). Must not touch: the registry beyond
//! inserting the kernel, or kernel math.

use std::cell::Cell;
use std::ffi::c_void;

use habana_sys::synStatus;

use crate::control::MockControlError;
use crate::kernel_abi::{Kernel, MockKernelArgs, SendPtr};
use crate::kernel_args::Tensors;
use crate::state::registry;

/// A kernel in safe Rust. Returning `None` (a tensor of the wrong size, type or alignment, bad
/// params) makes the launch fail with `synInvalidArgument`, recorded as the stream's sticky
/// asynchronous error, as a C kernel's non-success status is.
pub type RustKernel = fn(&KernelCall<'_>) -> Option<()>;

/// Element types a kernel may view a tensor as: plain data, every bit pattern valid.
pub trait KernelElement: Copy + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelElement for $t {}
    )*};
}
element!(f32, f64, i32, u32, u16, u8, half::bf16);

/// The tensors (in recipe order) and scalar params of one kernel call. Views live for the call.
pub struct KernelCall<'a> {
    tensors: Tensors<'a>,
    count: usize,
    /// Bit i set: tensor i is viewed (shared or mutable).
    viewed: Cell<u64>,
    /// Bit i set: tensor i is viewed mutably.
    written: Cell<u64>,
}

impl<'a> KernelCall<'a> {
    /// Number of tensors of the call.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True for a call without tensors.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The recipe's scalar parameters.
    pub fn params(&self) -> &'a [f64] {
        self.tensors.params()
    }

    /// Tensor `i` read-only, as `T` elements. `None` when `i` is out of range (or >= 64), the
    /// size is not a whole number of `T`, the data is not aligned for `T`, or tensor `i` is
    /// already viewed mutably.
    pub fn input<T: KernelElement>(&self, i: usize) -> Option<&'a [T]> {
        if i >= self.count || i >= 64 || self.written.get() & (1 << i) != 0 {
            return None;
        }
        // SAFETY: no mutable view of tensor i exists (bit unset); a mutable view of another
        // tensor is only handed out when it is disjoint from every tensor, i included.
        let s = unsafe { self.tensors.slice::<T>(i)? };
        self.viewed.set(self.viewed.get() | 1 << i);
        Some(s)
    }

    /// Tensor `i` writable, as `T` elements. `None` as [`KernelCall::input`], or when tensor `i`
    /// shares a byte with any other tensor of the call, or is already viewed.
    #[allow(clippy::mut_from_ref)] // the bit sets make each mutable view unique for the call
    pub fn output<T: KernelElement>(&self, i: usize) -> Option<&'a mut [T]> {
        if i >= self.count || i >= 64 || self.viewed.get() & (1 << i) != 0 {
            return None;
        }
        (0..self.count).all(|j| j == i || self.tensors.disjoint(i, j)).then_some(())?;
        // SAFETY: tensor i overlaps no other tensor and was never viewed before (bit unset, set
        // now), so this is the only view of its bytes for the rest of the call.
        let s = unsafe { self.tensors.slice_mut::<T>(i)? };
        self.viewed.set(self.viewed.get() | 1 << i);
        self.written.set(self.written.get() | 1 << i);
        Some(s)
    }
}

/// The C-ABI entry of every Rust kernel: `user_data` is the [`RustKernel`] to run.
unsafe extern "C" fn trampoline(args: *const MockKernelArgs) -> synStatus {
    // SAFETY: the mock passes a valid argument block for the call; `user_data` was set by
    // `register_rust_kernel` to a `RustKernel` function pointer cast to a data pointer.
    let (n, f) = unsafe {
        let a = &*args;
        (a.num_tensors, std::mem::transmute::<*mut c_void, RustKernel>(a.user_data))
    };
    // SAFETY: as above; `Tensors::new` checks the count against the block.
    let Some(tensors) = (unsafe { Tensors::new(args, n) }) else {
        return synStatus::INVALID_ARGUMENT;
    };
    let call = KernelCall { tensors, count: n as usize, viewed: Cell::new(0), written: Cell::new(0) };
    if f(&call).is_some() { synStatus::SUCCESS } else { synStatus::INVALID_ARGUMENT }
}

/// Registers `f` as kernel `name` with the in-process mock (replacing a kernel of that name),
/// so mock recipes naming it run `f` on the stream worker. Kernels registered here are not
/// visible to a separately loaded `libmock_synapse.so` (use `dcmock_register_kernel` there).
///
/// # Errors
/// [`crate::MockControlError::Rejected`] for an empty name.
pub fn register_rust_kernel(name: &str, f: RustKernel) -> Result<(), MockControlError> {
    if name.is_empty() {
        return Err(MockControlError::Rejected {
            call: "register_rust_kernel",
            status: synStatus::INVALID_ARGUMENT,
            message: "empty kernel name".into(),
        });
    }
    let user_data = SendPtr(f as *const () as *mut c_void);
    registry().kernels.insert(name.to_string(), Kernel { f: trampoline, user_data });
    Ok(())
}
