//! Element types and the one conversion between this crate's row-major shapes and the device's
//! fastest-changing-dimension-first order.
//!
//! Owns: [`DType`], [`device_sizes`] (row-major shape -> `synTensorGeometry`),
//! [`row_major_shape`] (device sizes reported by the runtime -> row-major shape) and
//! [`device_axis`] / [`device_axis_mask`] (a row-major axis -> the TPC order of axis
//! parameters). Every other module of the graph layer speaks row-major only. Must not touch:
//! handles or C calls.
//!
//! Source of the convention: `graph_api.md` §1.3 "Dimension order" — `sizes[0]` is the
//! fastest-changing dimension, so a row-major M×K matrix has sizes `[K, M]`; an axis parameter
//! is `rank - 1 - d` for the row-major axis d (the PyTorch bridge's `get_dim_in_tpc_order`);
//! a 0-d tensor is `[1]`.

use habana_sys::{HABANA_DIM_MAX, synDataType, synTensorGeometry};

use super::super::error::{Error, Result};

/// An element type of a graph tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE f32 (`syn_type_single`, GUID suffix `f32`).
    F32,
    /// bfloat16 (`syn_type_bf16`, GUID suffix `bf16`).
    Bf16,
    /// i32 (`syn_type_int32`): class labels.
    I32,
    /// i8 (`syn_type_int8`): the output of `isfinite`.
    I8,
}

impl DType {
    /// The C element type.
    pub fn syn(self) -> synDataType {
        match self {
            DType::F32 => synDataType::SINGLE,
            DType::Bf16 => synDataType::BF16,
            DType::I32 => synDataType::INT32,
            DType::I8 => synDataType::INT8,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::Bf16 => 2,
            DType::I8 => 1,
        }
    }

    /// The GUID suffix (`f32`, `bf16`, `i32`, `i8`).
    pub fn suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::I32 => "i32",
            DType::I8 => "i8",
        }
    }

    /// The element type of a C type tag, `None` for a type graphs here do not use.
    pub fn from_syn(t: synDataType) -> Option<Self> {
        [DType::F32, DType::Bf16, DType::I32, DType::I8].into_iter().find(|d| d.syn() == t)
    }

    /// True for f32 and bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::Bf16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

/// The device geometry of a row-major `shape`: sizes reversed (fastest-changing first), a 0-d
/// shape as `[1]`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `tensor` when the rank exceeds `HABANA_DIM_MAX` (25) or a
/// dimension is 0.
pub fn device_sizes(tensor: &str, shape: &[u64]) -> Result<synTensorGeometry> {
    if shape.len() > HABANA_DIM_MAX || shape.contains(&0) {
        return Err(Error::InvalidArgument {
            what: "tensor shape",
            value: format!("tensor {tensor}: {shape:?} (rank <= {HABANA_DIM_MAX}, every dimension >= 1)"),
        });
    }
    let mut g = synTensorGeometry::default();
    if shape.is_empty() {
        g.sizes[0] = 1;
        g.dims = 1;
        return Ok(g);
    }
    for (i, &d) in shape.iter().rev().enumerate() {
        g.sizes[i] = d;
    }
    g.dims = shape.len() as u32;
    Ok(g)
}

/// The row-major shape of the first `dims` device sizes (fastest-changing first), as the
/// runtime reports them (`synTensorRetrieveLaunchInfoById`): the inverse of [`device_sizes`]
/// except that a 0-d tensor comes back as `[1]`. `dims` is clamped to `sizes.len()`.
pub fn row_major_shape(sizes: &[u64], dims: u32) -> Vec<u64> {
    let n = (dims as usize).min(sizes.len());
    sizes[..n].iter().rev().copied().collect()
}

/// The TPC-order index of row-major axis `axis` of a rank-`rank` tensor (`rank - 1 - axis`).
pub fn device_axis(rank: usize, axis: usize) -> u32 {
    (rank.max(1) - 1 - axis) as u32
}

/// The TPC-order bit mask of row-major `axes` of a rank-`rank` tensor.
pub fn device_axis_mask(rank: usize, axes: &[usize]) -> u32 {
    axes.iter().fold(0, |m, &a| m | 1 << device_axis(rank, a))
}

/// The TPC-order permutation of a row-major one (`perm[i]`: the input axis that output axis
/// i reads, as `torch.permute`): device output axis k reads device input axis
/// `device_axis(r, perm[r - 1 - k])` (`synTransposeParams::permutation` semantics: output
/// dimension k is input dimension permutation[k]). `perm` is a permutation of `0..r`.
pub fn device_permutation(perm: &[usize]) -> Vec<u32> {
    let r = perm.len();
    (0..r).map(|k| device_axis(r, perm[r - 1 - k])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_shapes_reverse_into_device_order() {
        let g = device_sizes("a", &[2, 3, 5]).unwrap();
        assert_eq!((&g.sizes[..4], g.dims), (&[5, 3, 2, 0][..], 3));
        let s = device_sizes("s", &[]).unwrap();
        assert_eq!((s.sizes[0], s.dims), (1, 1));
        assert!(device_sizes("z", &[2, 0]).unwrap_err().to_string().contains("tensor z"));
        assert!(device_sizes("big", &[1; 26]).is_err());
        assert_eq!(row_major_shape(&g.sizes, g.dims), vec![2, 3, 5]);
        assert_eq!(row_major_shape(&s.sizes, s.dims), vec![1]);
        assert_eq!(row_major_shape(&[4, 9], 7), vec![9, 4], "dims clamped");
        for d in [DType::F32, DType::Bf16, DType::I32, DType::I8] {
            assert_eq!(DType::from_syn(d.syn()), Some(d));
        }
        assert_eq!(DType::from_syn(synDataType::UINT8), None);
        // The last row-major axis is the fastest-changing one: TPC dimension 0.
        assert_eq!(device_axis(3, 2), 0);
        assert_eq!(device_axis(3, 0), 2);
        assert_eq!(device_axis_mask(3, &[0, 2]), 0b101);
        assert_eq!(device_axis_mask(2, &[0]), 0b10);
        // A matrix transpose is its own device permutation; swapping the middle axes of a
        // rank-4 tensor too; a rotation [a, b, c] -> [c, a, b] is device {1, 2, 0}.
        assert_eq!(device_permutation(&[1, 0]), vec![1, 0]);
        assert_eq!(device_permutation(&[0, 2, 1, 3]), vec![0, 2, 1, 3]);
        assert_eq!(device_permutation(&[2, 0, 1]), vec![1, 2, 0]);
        assert_eq!(device_permutation(&[0, 1, 2]), vec![0, 1, 2]);
    }
}
