//! Element types and reduction operators of the mock collectives.
//!
//! Owns: [`Dtype`] (supported `hcclDataType_t` values, element sizes, the accumulation
//! encoding), [`RedOp`], the element-wise reduction of byte buffers and [`seg`], the one
//! segment split of every reduce-scatter (ring, same-process and shared-memory paths). Must not touch:
//! transports, communicators or device memory.
//!
//! Accumulation rule (documented ABI behaviour of the mock): f16 and bf16 inputs are widened to
//! f32 before the first reduction, partial results travel between ranks as f32, and the fully
//! reduced value is rounded once to f16/bf16 (round to nearest even, `half::*::from_f32`) by the
//! rank that owns it, then distributed bit for bit. Every other type accumulates in itself;
//! integer sums wrap (two's complement), as on the device.

use habana_sys::{hcclDataType_t, hcclRedOp_t, hcclResult_t};

/// A supported element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dtype {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
}

/// A supported reduction (hcclSum=0, hcclMin=2, hcclMax=3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedOp {
    Sum,
    Min,
    Max,
}

impl Dtype {
    /// The mock's type for `t`; hcclInvalidArgument for unknown codes.
    pub(crate) fn from_c(t: hcclDataType_t) -> Result<Self, (hcclResult_t, String)> {
        Ok(match t {
            hcclDataType_t::INT8 => Self::I8,
            hcclDataType_t::UINT8 => Self::U8,
            hcclDataType_t::INT32 => Self::I32,
            hcclDataType_t::UINT32 => Self::U32,
            hcclDataType_t::INT64 => Self::I64,
            hcclDataType_t::UINT64 => Self::U64,
            hcclDataType_t::FLOAT16 => Self::F16,
            hcclDataType_t::FLOAT32 => Self::F32,
            hcclDataType_t::FLOAT64 => Self::F64,
            hcclDataType_t::BFLOAT16 => Self::Bf16,
            other => return Err((hcclResult_t::INVALID_ARGUMENT, format!("unknown datatype {other}"))),
        })
    }

    /// Bytes of one element in device memory.
    pub(crate) fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::F16 | Self::Bf16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// Bytes of one element while it is being reduced (f32 for f16/bf16).
    pub(crate) fn acc_size(self) -> usize {
        match self {
            Self::F16 | Self::Bf16 => 4,
            other => other.size(),
        }
    }

    /// Device bytes → accumulation bytes (a copy; f16/bf16 widened exactly to f32).
    pub(crate) fn to_acc(self, dev: &[u8]) -> Vec<u8> {
        let widen = |f: fn([u8; 2]) -> f32| {
            let mut out = Vec::with_capacity(dev.len() * 2);
            for c in dev.chunks_exact(2) {
                out.extend_from_slice(&f([c[0], c[1]]).to_ne_bytes());
            }
            out
        };
        match self {
            Self::F16 => widen(|b| half::f16::from_ne_bytes(b).to_f32()),
            Self::Bf16 => widen(|b| half::bf16::from_ne_bytes(b).to_f32()),
            _ => dev.to_vec(),
        }
    }

    /// Accumulation bytes → device bytes (f32 rounded once to f16/bf16), appended to `out`.
    pub(crate) fn round_acc(self, acc: &[u8], out: &mut Vec<u8>) {
        let narrow = |out: &mut Vec<u8>, f: fn(f32) -> [u8; 2]| {
            for c in acc.chunks_exact(4) {
                out.extend_from_slice(&f(f32::from_ne_bytes([c[0], c[1], c[2], c[3]])));
            }
        };
        match self {
            Self::F16 => narrow(out, |v| half::f16::from_f32(v).to_ne_bytes()),
            Self::Bf16 => narrow(out, |v| half::bf16::from_f32(v).to_ne_bytes()),
            _ => out.extend_from_slice(acc),
        }
    }
}

impl RedOp {
    /// The mock's operator for `op`: hcclProd and hcclAvg → hcclUnsupported (not supported by
    /// Habana's HCCL either), unknown codes → hcclInvalidArgument.
    pub(crate) fn from_c(op: hcclRedOp_t) -> Result<Self, (hcclResult_t, String)> {
        match op {
            hcclRedOp_t::SUM => Ok(Self::Sum),
            hcclRedOp_t::MIN => Ok(Self::Min),
            hcclRedOp_t::MAX => Ok(Self::Max),
            hcclRedOp_t::PROD | hcclRedOp_t::AVG => {
                Err((hcclResult_t::UNSUPPORTED, format!("{op} is not supported by HCCL (Sum, Min, Max only)")))
            }
            other => Err((hcclResult_t::INVALID_ARGUMENT, format!("unknown reduction {other}"))),
        }
    }
}

fn apply<const N: usize, T: Copy>(
    dst: &mut [u8],
    src: &[u8],
    from: fn([u8; N]) -> T,
    to: fn(T) -> [u8; N],
    f: impl Fn(T, T) -> T,
) {
    for (d, s) in dst.chunks_exact_mut(N).zip(src.chunks_exact(N)) {
        let a = from(d.try_into().expect("chunk of N"));
        let b = from(s.try_into().expect("chunk of N"));
        d.copy_from_slice(&to(f(a, b)));
    }
}

/// Element types that may be viewed from any bytes (every bit pattern is a valid value).
trait Plain: Copy {}
impl Plain for i8 {}
impl Plain for u8 {}
impl Plain for i32 {}
impl Plain for u32 {}
impl Plain for i64 {}
impl Plain for u64 {}
impl Plain for f32 {}
impl Plain for f64 {}

/// `dst[i] = f(dst[i], src[i])` over `T` elements: typed slices when both buffers are aligned
/// for `T` (vectorisable), byte chunks otherwise.
fn combine<T: Plain, const N: usize>(
    dst: &mut [u8],
    src: &[u8],
    from: fn([u8; N]) -> T,
    to: fn(T) -> [u8; N],
    f: impl Fn(T, T) -> T,
) {
    // SAFETY: `T: Plain` is a primitive number for which every bit pattern is valid; align_to
    // only yields correctly aligned, in-bounds middle parts.
    let (dp, dm, ds) = unsafe { dst.align_to_mut::<T>() };
    // SAFETY: as above.
    let (sp, sm, ss) = unsafe { src.align_to::<T>() };
    if dp.is_empty() && sp.is_empty() && ds.is_empty() && ss.is_empty() && dm.len() == sm.len() {
        for (d, s) in dm.iter_mut().zip(sm) {
            *d = f(*d, *s);
        }
        return;
    }
    apply(dst, src, from, to, f);
}

macro_rules! int_reduce {
    ($dst:expr, $src:expr, $op:expr, $t:ty) => {
        match $op {
            RedOp::Sum => combine($dst, $src, <$t>::from_ne_bytes, <$t>::to_ne_bytes, |a: $t, b| a.wrapping_add(b)),
            RedOp::Min => combine($dst, $src, <$t>::from_ne_bytes, <$t>::to_ne_bytes, |a: $t, b| a.min(b)),
            RedOp::Max => combine($dst, $src, <$t>::from_ne_bytes, <$t>::to_ne_bytes, |a: $t, b| a.max(b)),
        }
    };
}

macro_rules! float_reduce {
    ($dst:expr, $src:expr, $op:expr, $t:ty) => {
        match $op {
            RedOp::Sum => combine($dst, $src, <$t>::from_ne_bytes, <$t>::to_ne_bytes, |a: $t, b| a + b),
            RedOp::Min => {
                combine($dst, $src, <$t>::from_ne_bytes, <$t>::to_ne_bytes, |a: $t, b| if b < a { b } else { a })
            }
            RedOp::Max => {
                combine($dst, $src, <$t>::from_ne_bytes, <$t>::to_ne_bytes, |a: $t, b| if b > a { b } else { a })
            }
        }
    };
}

/// `dst[i] = op(dst[i], src[i])` over accumulation-encoded elements of `dt` (equal lengths).
pub(crate) fn reduce_into(dt: Dtype, op: RedOp, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    match dt {
        Dtype::I8 => int_reduce!(dst, src, op, i8),
        Dtype::U8 => int_reduce!(dst, src, op, u8),
        Dtype::I32 => int_reduce!(dst, src, op, i32),
        Dtype::U32 => int_reduce!(dst, src, op, u32),
        Dtype::I64 => int_reduce!(dst, src, op, i64),
        Dtype::U64 => int_reduce!(dst, src, op, u64),
        Dtype::F32 | Dtype::F16 | Dtype::Bf16 => float_reduce!(dst, src, op, f32),
        Dtype::F64 => float_reduce!(dst, src, op, f64),
    }
}

/// Element range of segment `s` of `count` elements split into `n` nearly equal parts
/// (`count·s/n .. count·(s+1)/n`, in u128 so no product overflows). Every reduction path uses
/// this split, so a segment's owner is the same rank whichever path runs.
pub(crate) fn seg(count: usize, n: usize, s: usize) -> std::ops::Range<usize> {
    let at = |i: usize| ((count as u128 * i as u128) / n as u128) as usize;
    at(s)..at(s + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_widens_and_rounds_once() {
        let xs = [half::bf16::from_f32(1.0), half::bf16::from_f32(0.00390625)];
        let dev: Vec<u8> = xs.iter().flat_map(|x| x.to_ne_bytes()).collect();
        let mut acc = Dtype::Bf16.to_acc(&dev);
        let other = Dtype::Bf16.to_acc(&dev);
        reduce_into(Dtype::Bf16, RedOp::Sum, &mut acc, &other);
        let mut out = Vec::new();
        Dtype::Bf16.round_acc(&acc, &mut out);
        let got: Vec<f32> = out.chunks_exact(2).map(|c| half::bf16::from_ne_bytes([c[0], c[1]]).to_f32()).collect();
        assert_eq!(got, vec![2.0, 0.0078125]);
    }

    #[test]
    fn min_max_codes_follow_hccl_not_nccl() {
        assert_eq!(RedOp::from_c(hcclRedOp_t(2)).unwrap(), RedOp::Min);
        assert_eq!(RedOp::from_c(hcclRedOp_t(3)).unwrap(), RedOp::Max);
        assert_eq!(RedOp::from_c(hcclRedOp_t::PROD).unwrap_err().0, hcclResult_t::UNSUPPORTED);
        assert_eq!(RedOp::from_c(hcclRedOp_t::AVG).unwrap_err().0, hcclResult_t::UNSUPPORTED);
        let mut a: Vec<u8> = [5i32, -3].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let b: Vec<u8> = [2i32, 7].iter().flat_map(|v| v.to_ne_bytes()).collect();
        reduce_into(Dtype::I32, RedOp::Min, &mut a, &b);
        assert_eq!(a, [2i32, -3].iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>());
    }
}
