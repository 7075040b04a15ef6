//! Element-wise f32 / bf16 kernels of the CPU mock device (scale, accumulate, scale-accumulate,
//! conversions), implemented in portable C (`kernels/cpu/`) and wrapped here as safe slice
//! functions.
//!
//! Owns: the `extern "C"` declarations of `kernels/cpu/dc_kernels.h` and their safe wrappers.
//! Must not: hold state beyond the lazily chosen kernel table, or know anything about devices,
//! streams or recipes (the mock device in `src/mock` calls these functions).
//!
//! # Numerics
//! All arithmetic is IEEE f32, round to nearest even, with no FMA contraction (the C files are
//! built with `-O3 -std=c11 -ffp-contract=off`), so `acc + a * x` is rounded twice, exactly as
//! the same expression written in Rust. bf16 values are widened exactly to f32
//! (as [`bf16::to_f32`]), computed in f32, and rounded once per element back to bf16 with the
//! rule of [`bf16::from_f32`] (half 2.7, `src/bfloat/convert.rs`): round to nearest, ties to
//! even, overflow to ±inf, and NaN → `(bits >> 16) | 0x0040`. Conversions agree with `half`
//! bit for bit for every input, NaN included; arithmetic on NaN inputs yields a NaN whose
//! payload is chosen by the CPU.
//!
//! # Dispatch
//! The C loops are compiled once per instruction set ([`Isa`]): baseline, AVX2 and AVX-512
//! (F+BW+DQ+VL), through GCC/clang `target` attributes, never `-march=native`. [`Kernels::best`]
//! picks the widest set the running CPU reports (`__builtin_cpu_supports`); every variant gives
//! bit-identical results because the source is the same and no contraction is allowed, except
//! for the payload of a NaN produced from two NaN operands (IEEE leaves it open and vector and
//! scalar code may order operands differently).
//!
//! # Errors
//! Two-buffer kernels return [`KernelError::LengthMismatch`] when the slices differ in length;
//! nothing is written in that case. No kernel panics.

use std::ffi::c_int;
use std::sync::OnceLock;

use half::bf16;
use half::slice::HalfFloatSliceExt;

/// Raw C ABI of `kernels/cpu/dc_kernels.h`. Field order of [`KernelTable`] must match
/// `struct dc_kernel_table` exactly.
mod ffi {
    use std::ffi::c_int;

    /// `struct dc_kernel_table`: one set of kernels compiled for one instruction set. Counts are
    /// elements; bf16 buffers are raw `u16` bits. See the header for each formula.
    #[repr(C)]
    pub(super) struct KernelTable {
        pub scale_f32: unsafe extern "C" fn(x: *mut f32, n: usize, a: f32),
        pub accumulate_f32: unsafe extern "C" fn(acc: *mut f32, x: *const f32, n: usize),
        pub scale_accumulate_f32: unsafe extern "C" fn(acc: *mut f32, x: *const f32, n: usize, a: f32),
        pub scale_bf16: unsafe extern "C" fn(x: *mut u16, n: usize, a: f32),
        pub accumulate_bf16: unsafe extern "C" fn(acc: *mut u16, x: *const u16, n: usize),
        pub scale_accumulate_bf16: unsafe extern "C" fn(acc: *mut u16, x: *const u16, n: usize, a: f32),
        pub accumulate_bf16_to_f32: unsafe extern "C" fn(acc: *mut f32, x: *const u16, n: usize),
        pub scale_accumulate_bf16_to_f32: unsafe extern "C" fn(acc: *mut f32, x: *const u16, n: usize, a: f32),
        pub f32_to_bf16: unsafe extern "C" fn(dst: *mut u16, src: *const f32, n: usize),
        pub bf16_to_f32: unsafe extern "C" fn(dst: *mut f32, src: *const u16, n: usize),
    }

    unsafe extern "C" {
        /// Best `DC_ISA_*` code supported by the running CPU.
        pub(super) fn dc_kernels_best_isa() -> c_int;
        /// Static table for an ISA code, or NULL when unavailable on this CPU or target.
        pub(super) fn dc_kernels_table(isa: c_int) -> *const KernelTable;
    }
}

/// Instruction-set variant of the compiled kernels (`DC_ISA_*` in `dc_kernels.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Baseline of the compilation target (SSE2 on x86-64); always available.
    Generic,
    /// x86-64 AVX2.
    Avx2,
    /// x86-64 AVX-512 F+BW+DQ+VL.
    Avx512,
}

impl Isa {
    /// Every variant, in increasing order of preference.
    pub const ALL: [Isa; 3] = [Isa::Generic, Isa::Avx2, Isa::Avx512];

    /// The `DC_ISA_*` code of this variant.
    fn code(self) -> c_int {
        match self {
            Isa::Generic => 0,
            Isa::Avx2 => 1,
            Isa::Avx512 => 2,
        }
    }

    /// Short lower-case name, e.g. `"avx512"`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of a kernel call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The output (accumulator / destination) and input slices have different lengths.
    #[error(
        "kernel {kernel}: output has {output_len} elements but input has {input_len}; \
         lengths must be equal"
    )]
    LengthMismatch {
        /// Kernel name, e.g. `"scale_accumulate_f32"`.
        kernel: &'static str,
        /// Length of the accumulator or destination slice, in elements.
        output_len: usize,
        /// Length of the input slice, in elements.
        input_len: usize,
    },
}

/// Returns `Ok(n)` when both lengths equal `n`, else the typed mismatch error.
fn same_len(kernel: &'static str, output_len: usize, input_len: usize) -> Result<usize, KernelError> {
    if output_len == input_len {
        Ok(output_len)
    } else {
        Err(KernelError::LengthMismatch { kernel, output_len, input_len })
    }
}

/// Handle on one compiled kernel set. Cheap to copy; the table is static.
#[derive(Clone, Copy)]
pub struct Kernels {
    isa: Isa,
    table: &'static ffi::KernelTable,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").field("isa", &self.isa).finish()
    }
}

impl Kernels {
    /// Kernels compiled for `isa`, or `None` when the running CPU (or the compilation target)
    /// does not support it. [`Isa::Generic`] is always `Some`.
    pub fn for_isa(isa: Isa) -> Option<Kernels> {
        // SAFETY: dc_kernels_table accepts any int and returns NULL or a pointer to a static,
        // immutable, fully initialised table that lives for the whole program.
        let ptr = unsafe { ffi::dc_kernels_table(isa.code()) };
        // SAFETY: non-null pointers from dc_kernels_table point to static tables (see above),
        // so a shared 'static reference is valid; the layout is #[repr(C)] and matches the header.
        let table = unsafe { ptr.as_ref() }?;
        Some(Kernels { isa, table })
    }

    /// The widest variant the running CPU supports, chosen once per process.
    pub fn best() -> Kernels {
        static BEST: OnceLock<Kernels> = OnceLock::new();
        *BEST.get_or_init(|| {
            // SAFETY: dc_kernels_best_isa takes no arguments and only queries CPU features.
            let code = unsafe { ffi::dc_kernels_best_isa() };
            let preferred = Isa::ALL.into_iter().find(|i| i.code() == code);
            preferred
                .and_then(Kernels::for_isa)
                .or_else(|| Kernels::for_isa(Isa::Generic))
                .expect("dispatch.c always provides the generic table")
        })
    }

    /// Which instruction set these kernels were compiled for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `x[i] *= a` in place, in f32.
    pub fn scale_f32(&self, x: &mut [f32], a: f32) {
        // SAFETY: x is a valid, exclusively borrowed buffer of x.len() f32 elements.
        unsafe { (self.table.scale_f32)(x.as_mut_ptr(), x.len(), a) }
    }

    /// `acc[i] += x[i]` in f32. Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn accumulate_f32(&self, acc: &mut [f32], x: &[f32]) -> Result<(), KernelError> {
        let n = same_len("accumulate_f32", acc.len(), x.len())?;
        // SAFETY: both buffers hold n elements; &mut and & borrows cannot overlap (restrict).
        unsafe { (self.table.accumulate_f32)(acc.as_mut_ptr(), x.as_ptr(), n) };
        Ok(())
    }

    /// `acc[i] += a * x[i]` in f32 (product and sum each rounded to f32).
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn scale_accumulate_f32(&self, acc: &mut [f32], x: &[f32], a: f32) -> Result<(), KernelError> {
        let n = same_len("scale_accumulate_f32", acc.len(), x.len())?;
        // SAFETY: both buffers hold n elements; &mut and & borrows cannot overlap (restrict).
        unsafe { (self.table.scale_accumulate_f32)(acc.as_mut_ptr(), x.as_ptr(), n, a) };
        Ok(())
    }

    /// `x[i] = bf16(f32(x[i]) * a)` in place.
    pub fn scale_bf16(&self, x: &mut [bf16], a: f32) {
        let bits = x.reinterpret_cast_mut();
        // SAFETY: bits is a valid, exclusively borrowed buffer of bits.len() u16 elements.
        unsafe { (self.table.scale_bf16)(bits.as_mut_ptr(), bits.len(), a) }
    }

    /// `acc[i] = bf16(f32(acc[i]) + f32(x[i]))`.
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn accumulate_bf16(&self, acc: &mut [bf16], x: &[bf16]) -> Result<(), KernelError> {
        let n = same_len("accumulate_bf16", acc.len(), x.len())?;
        let (acc, x) = (acc.reinterpret_cast_mut(), x.reinterpret_cast());
        // SAFETY: both buffers hold n u16 elements; &mut and & borrows cannot overlap.
        unsafe { (self.table.accumulate_bf16)(acc.as_mut_ptr(), x.as_ptr(), n) };
        Ok(())
    }

    /// `acc[i] = bf16(f32(acc[i]) + a * f32(x[i]))`: f32 product and sum, one bf16 rounding.
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn scale_accumulate_bf16(&self, acc: &mut [bf16], x: &[bf16], a: f32) -> Result<(), KernelError> {
        let n = same_len("scale_accumulate_bf16", acc.len(), x.len())?;
        let (acc, x) = (acc.reinterpret_cast_mut(), x.reinterpret_cast());
        // SAFETY: both buffers hold n u16 elements; &mut and & borrows cannot overlap.
        unsafe { (self.table.scale_accumulate_bf16)(acc.as_mut_ptr(), x.as_ptr(), n, a) };
        Ok(())
    }

    /// `acc[i] += f32(x[i])`: a bf16 gradient into an f32 accumulator.
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn accumulate_bf16_to_f32(&self, acc: &mut [f32], x: &[bf16]) -> Result<(), KernelError> {
        let n = same_len("accumulate_bf16_to_f32", acc.len(), x.len())?;
        let x = x.reinterpret_cast();
        // SAFETY: acc holds n f32, x holds n u16; &mut and & borrows cannot overlap.
        unsafe { (self.table.accumulate_bf16_to_f32)(acc.as_mut_ptr(), x.as_ptr(), n) };
        Ok(())
    }

    /// `acc[i] += a * f32(x[i])` in f32: a scaled bf16 gradient into an f32 accumulator.
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn scale_accumulate_bf16_to_f32(&self, acc: &mut [f32], x: &[bf16], a: f32) -> Result<(), KernelError> {
        let n = same_len("scale_accumulate_bf16_to_f32", acc.len(), x.len())?;
        let x = x.reinterpret_cast();
        // SAFETY: acc holds n f32, x holds n u16; &mut and & borrows cannot overlap.
        unsafe { (self.table.scale_accumulate_bf16_to_f32)(acc.as_mut_ptr(), x.as_ptr(), n, a) };
        Ok(())
    }

    /// `dst[i] = bf16::from_f32(src[i])`, bit for bit.
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn f32_to_bf16(&self, dst: &mut [bf16], src: &[f32]) -> Result<(), KernelError> {
        let n = same_len("f32_to_bf16", dst.len(), src.len())?;
        let dst = dst.reinterpret_cast_mut();
        // SAFETY: dst holds n u16, src holds n f32; &mut and & borrows cannot overlap.
        unsafe { (self.table.f32_to_bf16)(dst.as_mut_ptr(), src.as_ptr(), n) };
        Ok(())
    }

    /// `dst[i] = src[i].to_f32()`, bit for bit.
    /// Errors: [`KernelError::LengthMismatch`] if lengths differ.
    pub fn bf16_to_f32(&self, dst: &mut [f32], src: &[bf16]) -> Result<(), KernelError> {
        let n = same_len("bf16_to_f32", dst.len(), src.len())?;
        let src = src.reinterpret_cast();
        // SAFETY: dst holds n f32, src holds n u16; &mut and & borrows cannot overlap.
        unsafe { (self.table.bf16_to_f32)(dst.as_mut_ptr(), src.as_ptr(), n) };
        Ok(())
    }
}

/// Every [`Isa`] the running CPU supports, in increasing order of preference.
pub fn supported_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|&i| Kernels::for_isa(i).is_some()).collect()
}

/// [`Kernels::scale_f32`] with [`Kernels::best`].
pub fn scale_f32(x: &mut [f32], a: f32) {
    Kernels::best().scale_f32(x, a)
}

/// [`Kernels::accumulate_f32`] with [`Kernels::best`].
pub fn accumulate_f32(acc: &mut [f32], x: &[f32]) -> Result<(), KernelError> {
    Kernels::best().accumulate_f32(acc, x)
}

/// [`Kernels::scale_accumulate_f32`] with [`Kernels::best`].
pub fn scale_accumulate_f32(acc: &mut [f32], x: &[f32], a: f32) -> Result<(), KernelError> {
    Kernels::best().scale_accumulate_f32(acc, x, a)
}

/// [`Kernels::scale_bf16`] with [`Kernels::best`].
pub fn scale_bf16(x: &mut [bf16], a: f32) {
    Kernels::best().scale_bf16(x, a)
}

/// [`Kernels::accumulate_bf16`] with [`Kernels::best`].
pub fn accumulate_bf16(acc: &mut [bf16], x: &[bf16]) -> Result<(), KernelError> {
    Kernels::best().accumulate_bf16(acc, x)
}

/// [`Kernels::scale_accumulate_bf16`] with [`Kernels::best`].
pub fn scale_accumulate_bf16(acc: &mut [bf16], x: &[bf16], a: f32) -> Result<(), KernelError> {
    Kernels::best().scale_accumulate_bf16(acc, x, a)
}

/// [`Kernels::accumulate_bf16_to_f32`] with [`Kernels::best`].
pub fn accumulate_bf16_to_f32(acc: &mut [f32], x: &[bf16]) -> Result<(), KernelError> {
    Kernels::best().accumulate_bf16_to_f32(acc, x)
}

/// [`Kernels::scale_accumulate_bf16_to_f32`] with [`Kernels::best`].
pub fn scale_accumulate_bf16_to_f32(acc: &mut [f32], x: &[bf16], a: f32) -> Result<(), KernelError> {
    Kernels::best().scale_accumulate_bf16_to_f32(acc, x, a)
}

/// [`Kernels::f32_to_bf16`] with [`Kernels::best`].
pub fn f32_to_bf16(dst: &mut [bf16], src: &[f32]) -> Result<(), KernelError> {
    Kernels::best().f32_to_bf16(dst, src)
}

/// [`Kernels::bf16_to_f32`] with [`Kernels::best`].
pub fn bf16_to_f32(dst: &mut [f32], src: &[bf16]) -> Result<(), KernelError> {
    Kernels::best().bf16_to_f32(dst, src)
}
