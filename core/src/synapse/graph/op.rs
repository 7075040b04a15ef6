//! Typed graph operations: each [`Op`] knows its vendor GUID, its parameter struct (as bytes of
//! the exact size of one known version) and the dtypes and row-major shapes of its operands, so
//! a mistake is caught before the C call with an error naming the node, the tensor, what was
//! expected and what was given.
//!
//! Owns: [`Op`], [`CastRounding`], [`Reduction`], the GUID names and parameter layouts of
//! `graph_api.md` §4 (`perf_lib_layer_params.h` ≈1.16 as summarised there) and, for the
//! transformer kernels of issue 26, the names, operand orders and parameter structs the mock's
//! GUID table cites (`habana_mock` `graph/guid.rs` module docs: PyTorch bridge 1.19 and the
//! Gaudi3 software sources; `gelu_bwd`, `div_fwd`, `sqrt_fwd` UNVERIFIED there), and
//! [`Op::check`]. Must not touch: handles or C calls; axis conversion is `layout.rs`'s.

use habana_sys::synGEMMParams;

use super::super::error::{Error, OperandMismatch, Result};
use super::layout::{DType, device_axis, device_axis_mask, device_permutation};

/// Rounding of a float-to-bf16 cast (`ns_CastKernel::Params::round_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CastRounding {
    /// Round half to nearest even (CAST_ROUND_HALF_NE, 0).
    #[default]
    NearestEven,
    /// Round toward zero (CAST_ROUND_ZERO, 4).
    TowardZero,
}

/// Reduction of `softmax_cross_entropy` (`ns_SoftmaxCrossEntropy::Params::mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Sum over the batch (SUM, 0).
    Sum,
    /// Mean over the batch (MEAN, 1); the backward gradient then includes 1 / batch.
    Mean,
    /// One loss per sample (NO_REDUCTION, 2).
    None,
}

impl Reduction {
    fn code(self) -> u32 {
        match self {
            Reduction::Sum => 0,
            Reduction::Mean => 1,
            Reduction::None => 2,
        }
    }
}

/// One graph operation with its typed parameters. Shapes are row-major; axes are row-major
/// (PyTorch) axes, converted to the device's order by `layout.rs`. The two operands of an
/// elementwise op have the same rank (size-1 dimensions broadcast; ranks are not padded, since
/// the reference notes advise the same rank for device broadcasting).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// (a, b) -> a + b, size-1 dimensions broadcast (`add_fwd_<dt>`).
    Add,
    /// (a, b) -> a − b (`sub_fwd_<dt>`).
    Sub,
    /// (a, b) -> a · b (`mult_fwd_<dt>`); with b of a's rank and every dimension 1 (`[1]` for
    /// a vector) a scale by a device scalar.
    Mul,
    /// (a, b) -> max(a, b) (`max_fwd_<dt>`).
    Max,
    /// (a, b) -> min(a, b) (`min_fwd_<dt>`).
    Min,
    /// (x) -> x converted to the output's dtype (`cast_<a>_to_<b>`, params V1, 4 bytes).
    Cast {
        /// Rounding toward bf16.
        rounding: CastRounding,
    },
    /// () -> every element `value` (`constant_<dt>`, 4 bytes).
    Constant {
        /// The fill value.
        value: f32,
    },
    /// () -> zeros (`memset`).
    Zero,
    /// (x) -> max(x, 0) (`relu_fwd_<dt>`).
    Relu,
    /// **(grad, x)** -> grad where x > 0 (`relu_bwd_<dt>`).
    ReluBackward,
    /// (x) -> softmax along `axis` (`softmax_fwd_<dt>`, 4 bytes).
    Softmax {
        /// Row-major axis.
        axis: usize,
    },
    /// **(y, dy)** -> dx, y the forward output (`softmax_bwd_<dt>`, 4 bytes).
    SoftmaxBackward {
        /// Row-major axis.
        axis: usize,
    },
    /// (x) -> log-softmax along `axis` (`logsoftmax_fwd_<dt>`, 4 bytes).
    LogSoftmax {
        /// Row-major axis.
        axis: usize,
    },
    /// (logits [B, C], labels i32 [B]) -> (loss, log_softmax [B, C])
    /// (`softmax_cross_entropy_fwd_<dt>`, 8 bytes); loss is `[1]`, or `[B]` without reduction.
    SoftmaxCrossEntropy {
        /// Batch reduction.
        reduction: Reduction,
    },
    /// (log_softmax [B, C], labels i32 [B]) -> dlogits [B, C]
    /// (`softmax_cross_entropy_bwd_<dt>`, 8 bytes).
    SoftmaxCrossEntropyBackward {
        /// Batch reduction (of the forward).
        reduction: Reduction,
    },
    /// (x) -> sum over `axis`, kept with size 1 (`reduce_sum_fwd_<dt>`, 4 bytes).
    ReduceSum {
        /// Row-major axis.
        axis: usize,
    },
    /// (x) -> sum over `axes` (every axis when empty) (`reduce_sum_multi_dim_fwd_<dt>`,
    /// ParamsV2, 8 bytes); without `keep_dims` the reduced axes are removed (`[1]` when none
    /// remain).
    ReduceSumAxes {
        /// Row-major axes; empty = all.
        axes: Vec<usize>,
        /// Keep reduced axes with size 1.
        keep_dims: bool,
    },
    /// (x) -> i8 mask, 1 where finite (`isfinite_fwd_<dt>`).
    IsFinite,
    /// (A, B[, bias [N]]) -> C = A·B (+bias) (`gemm`, synGEMMParams). Row-major: A `[M, K]`
    /// (`[K, M]` transposed), B `[K, N]` (`[N, K]` transposed: a `Linear` weight), C `[M, N]`.
    Gemm {
        /// A given transposed.
        transpose_a: bool,
        /// B given transposed.
        transpose_b: bool,
    },
    /// (dC [M, N], B) -> dA in A's layout (`gemm_dedx`; transposes those of the forward).
    GemmDx {
        /// A given transposed in the forward.
        transpose_a: bool,
        /// B given transposed in the forward.
        transpose_b: bool,
    },
    /// (dC [M, N], A) -> dB in B's layout (`gemm_dedw`; transposes those of the forward).
    GemmDw {
        /// A given transposed in the forward.
        transpose_a: bool,
        /// B given transposed in the forward.
        transpose_b: bool,
    },
    /// (A [.., M, K], B [.., K, N]) -> C [.., M, N] (`batch_gemm`); batch axes of size 1
    /// broadcast; both operands have the same rank (>= 3).
    BatchGemm {
        /// A's matrices given transposed.
        transpose_a: bool,
        /// B's matrices given transposed.
        transpose_b: bool,
    },
    /// (a, b) -> a / b, size-1 dimensions broadcast as [`Op::Add`] (`div_fwd_<dt>`, no params).
    Div,
    /// (x) -> sqrt(x) (`sqrt_fwd_<dt>`, no params).
    Sqrt,
    /// **(x [.., C], beta [C], gamma [C])** -> (y [.., C], mean [.., 1], istd [.., 1]): layer
    /// norm over the last row-major axis (the FCD), y = (x − mean) · istd · gamma + beta with
    /// istd = 1 / sqrt(biased variance + eps) (`layer_norm_fwd_<dt>`,
    /// `ns_LayerNormKernel::Params{epsValid bool @0, eps f32 @4}` = 8 bytes, epsValid set);
    /// beta, gamma, mean and istd are f32. Bias before weight: the vendor's input order.
    LayerNorm {
        /// The variance epsilon.
        eps: f32,
    },
    /// **(x, dy, mean, istd, gamma)** -> **(dx, dbeta, dgamma)** (`layer_norm_bwd_<dt>`, the
    /// forward's 8-byte params); x, dy and dx of one shape `[.., C]`, mean/istd as the forward's
    /// outputs, gamma, dbeta and dgamma `[C]` f32.
    LayerNormBackward {
        /// The forward's variance epsilon.
        eps: f32,
    },
    /// (x) -> gelu(x) (`gelu_fwd_<dt>`, `ns_GeluKernel::Params{approximation bool}` = 1 byte):
    /// x · Φ(x), or its tanh approximation. One output (the vendor's optional second output is
    /// not used).
    Gelu {
        /// The tanh approximation (PyTorch `approximate="tanh"`) instead of the erf form.
        tanh: bool,
    },
    /// **(grad, x)** -> dx, x the forward input (`gelu_bwd_<dt>`, the forward's 1-byte params).
    GeluBackward {
        /// As the forward.
        tanh: bool,
    },
    /// **(weight [V, D], indices i32 [T..])** -> rows [T.., D] (`embedding_pt_fwd_<dt>`, no
    /// params): row `indices[t]` of the table for each index.
    Embedding,
    /// **(grad [T.., D], indices i32 [T..])** -> dW [num_weights, D]: each index's gradient
    /// added into its row, the row `padding_idx` left zero (`embedding_dense_pt_bwd_<dt>`,
    /// `ns_EmbeddingDensePtBwdKernel::Params{num_weights i32 @0, padding_idx i32 @4,
    /// scaleGradByFreq bool @8}` = 12 bytes, scaleGradByFreq false).
    EmbeddingBackward {
        /// Rows of the table (V).
        num_weights: u32,
        /// PyTorch's `padding_idx`: the row that gets no gradient; `None` for none (−1).
        padding_idx: Option<u32>,
    },
    /// (x) -> x with its axes permuted: row-major output axis i is input axis `perm[i]`
    /// (`transpose`, `synTransposeParams{permutation [u32; 5] @0, tensorDim u32 @20}` = 24
    /// bytes, the permutation converted to the device's order by `layout.rs`); rank 1 to 5.
    Transpose {
        /// A permutation of `0..rank`, row-major axes.
        perm: Vec<usize>,
    },
    /// (x) -> the same elements under another shape (`reshape`, no params): same dtype and
    /// element count (row-major order is kept; FCD-first on the device, the same bytes).
    Reshape,
}

/// One operand as the checks see it.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Row-major shape.
    pub shape: &'a [u64],
}

fn mismatch(node: &str, tensor: &str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Graph(Box::new(OperandMismatch {
        node: node.to_string(),
        tensor: tensor.to_string(),
        expected: expected.to_string(),
        got: got.to_string(),
    }))
}

fn expect_shape(node: &str, t: &Operand<'_>, want: &[u64]) -> Result<()> {
    if t.shape == want {
        Ok(())
    } else {
        Err(mismatch(node, t.name, format!("shape {want:?}"), format!("shape {:?}", t.shape)))
    }
}

fn expect_dtype(node: &str, t: &Operand<'_>, want: DType) -> Result<()> {
    if t.dtype == want {
        Ok(())
    } else {
        Err(mismatch(node, t.name, format!("dtype {want}"), format!("dtype {}", t.dtype)))
    }
}

fn expect_axis(node: &str, t: &Operand<'_>, axis: usize) -> Result<()> {
    if axis < t.shape.len().max(1) {
        Ok(())
    } else {
        Err(mismatch(node, t.name, format!("an axis below rank {}", t.shape.len()), format!("axis {axis}")))
    }
}

/// Row-major broadcast of two shapes (trailing axes aligned, size 1 broadcasts).
fn broadcast(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let n = a.len().max(b.len());
    let at = |s: &[u64], i: usize| if i < n - s.len() { 1 } else { s[i - (n - s.len())] };
    (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            if x == y || y == 1 {
                Some(x)
            } else if x == 1 {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

fn gemm_bytes(ta: bool, tb: bool) -> Vec<u8> {
    let p = synGEMMParams { transpose_a: ta, transpose_b: tb };
    vec![u8::from(p.transpose_a), u8::from(p.transpose_b)]
}

/// (M, K) of a row-major A (`[M, K]`, or `[K, M]` transposed), (K, N) of B.
fn mk(a: &[u64], t: bool) -> (u64, u64) {
    if t { (a[1], a[0]) } else { (a[0], a[1]) }
}
fn kn(b: &[u64], t: bool) -> (u64, u64) {
    if t { (b[1], b[0]) } else { (b[0], b[1]) }
}

impl Op {
    /// The number of (inputs, outputs); GEMM's optional bias counts in `inputs.1`.
    fn arity(&self) -> ((usize, usize), usize) {
        match self {
            Op::Add | Op::Sub | Op::Mul | Op::Max | Op::Min | Op::ReluBackward | Op::SoftmaxBackward { .. } => {
                ((2, 2), 1)
            }
            Op::SoftmaxCrossEntropyBackward { .. } | Op::GemmDx { .. } | Op::GemmDw { .. } | Op::BatchGemm { .. } => {
                ((2, 2), 1)
            }
            Op::Div | Op::GeluBackward { .. } | Op::Embedding | Op::EmbeddingBackward { .. } => ((2, 2), 1),
            Op::Sqrt | Op::Gelu { .. } | Op::Transpose { .. } | Op::Reshape => ((1, 1), 1),
            Op::LayerNorm { .. } => ((3, 3), 3),
            Op::LayerNormBackward { .. } => ((5, 5), 3),
            Op::Cast { .. } | Op::Relu | Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::IsFinite => ((1, 1), 1),
            Op::ReduceSum { .. } | Op::ReduceSumAxes { .. } => ((1, 1), 1),
            Op::Constant { .. } | Op::Zero => ((0, 0), 1),
            Op::SoftmaxCrossEntropy { .. } => ((2, 2), 2),
            Op::Gemm { .. } => ((2, 3), 1),
        }
    }

    /// Checks operand counts, dtypes and row-major shapes, then returns the GUID and the
    /// parameter bytes (`None`: a null parameter pointer).
    ///
    /// # Errors
    /// [`Error::Graph`] naming `node`, the offending tensor (or "inputs"/"outputs" for a count),
    /// the expectation and what was given.
    pub fn check(&self, node: &str, ins: &[Operand<'_>], outs: &[Operand<'_>]) -> Result<(String, Option<Vec<u8>>)> {
        let ((lo, hi), n_out) = self.arity();
        if ins.len() < lo || ins.len() > hi {
            let want = if lo == hi { format!("{lo} inputs") } else { format!("{lo} to {hi} inputs") };
            return Err(mismatch(node, "inputs", want, format!("{} inputs", ins.len())));
        }
        if outs.len() != n_out {
            return Err(mismatch(node, "outputs", format!("{n_out} outputs"), format!("{} outputs", outs.len())));
        }
        let o = &outs[0];
        // The dtype of a TPC kernel: its first input's, or its output's when it has no input.
        let dt = ins.first().map_or(o.dtype, |i| i.dtype);
        let float = |t: &Operand<'_>| {
            if t.dtype.is_float() {
                Ok(())
            } else {
                Err(mismatch(node, t.name, "dtype f32 or bf16", format!("dtype {}", t.dtype)))
            }
        };
        let tpc = |stem: &str| format!("{stem}_{}", dt.suffix());
        let axis4 = |x: &Operand<'_>, axis: usize| device_axis(x.shape.len(), axis).to_le_bytes().to_vec();
        Ok(match self {
            Op::Add | Op::Sub | Op::Mul | Op::Max | Op::Min | Op::Div => {
                float(&ins[0])?;
                expect_dtype(node, &ins[1], dt)?;
                expect_dtype(node, o, dt)?;
                let Some(shape) = broadcast(ins[0].shape, ins[1].shape) else {
                    return Err(mismatch(
                        node,
                        ins[1].name,
                        format!("a shape broadcastable with {} {:?}", ins[0].name, ins[0].shape),
                        format!("shape {:?}", ins[1].shape),
                    ));
                };
                if ins[0].shape.len() != ins[1].shape.len() {
                    // Same rank on the device (size-1 padding is not implied there).
                    return Err(mismatch(
                        node,
                        ins[1].name,
                        format!("rank {}", ins[0].shape.len()),
                        format!("rank {}", ins[1].shape.len()),
                    ));
                }
                expect_shape(node, o, &shape)?;
                let stem = match self {
                    Op::Add => "add_fwd",
                    Op::Sub => "sub_fwd",
                    Op::Mul => "mult_fwd",
                    Op::Max => "max_fwd",
                    Op::Div => "div_fwd",
                    _ => "min_fwd",
                };
                (tpc(stem), None)
            }
            Op::Cast { rounding } => {
                float(&ins[0])?;
                float(o)?;
                if o.dtype == ins[0].dtype {
                    return Err(mismatch(
                        node,
                        o.name,
                        format!("a dtype other than {}", ins[0].dtype),
                        format!("dtype {}", o.dtype),
                    ));
                }
                expect_shape(node, o, ins[0].shape)?;
                let mode: u32 = match rounding {
                    CastRounding::NearestEven => 0,
                    CastRounding::TowardZero => 4,
                };
                (format!("cast_{}_to_{}", ins[0].dtype, o.dtype), Some(mode.to_le_bytes().to_vec()))
            }
            Op::Constant { value } => {
                float(o)?;
                (tpc("constant"), Some(value.to_bits().to_le_bytes().to_vec()))
            }
            Op::Zero => ("memset".to_string(), None),
            Op::Sqrt => {
                float(&ins[0])?;
                expect_dtype(node, o, dt)?;
                expect_shape(node, o, ins[0].shape)?;
                (tpc("sqrt_fwd"), None)
            }
            Op::LayerNorm { eps } | Op::LayerNormBackward { eps } => {
                let x = &ins[0];
                float(x)?;
                let Some(&c) = x.shape.last() else {
                    return Err(mismatch(node, x.name, "rank >= 1", "rank 0"));
                };
                let mut stat = x.shape.to_vec();
                stat[x.shape.len() - 1] = 1;
                let f32_of = |t: &Operand<'_>, shape: &[u64]| -> Result<()> {
                    expect_dtype(node, t, DType::F32)?;
                    expect_shape(node, t, shape)
                };
                let backward = matches!(self, Op::LayerNormBackward { .. });
                if backward {
                    expect_dtype(node, &ins[1], dt)?;
                    expect_shape(node, &ins[1], x.shape)?;
                    f32_of(&ins[2], &stat)?;
                    f32_of(&ins[3], &stat)?;
                    f32_of(&ins[4], &[c])?;
                    expect_dtype(node, &outs[0], dt)?;
                    expect_shape(node, &outs[0], x.shape)?;
                    f32_of(&outs[1], &[c])?;
                    f32_of(&outs[2], &[c])?;
                } else {
                    f32_of(&ins[1], &[c])?;
                    f32_of(&ins[2], &[c])?;
                    expect_dtype(node, &outs[0], dt)?;
                    expect_shape(node, &outs[0], x.shape)?;
                    f32_of(&outs[1], &stat)?;
                    f32_of(&outs[2], &stat)?;
                }
                let mut p = vec![1u8, 0, 0, 0];
                p.extend(eps.to_le_bytes());
                (tpc(if backward { "layer_norm_bwd" } else { "layer_norm_fwd" }), Some(p))
            }
            Op::Gelu { tanh } | Op::GeluBackward { tanh } => {
                for t in ins {
                    float(t)?;
                    expect_dtype(node, t, dt)?;
                    expect_shape(node, t, ins[0].shape)?;
                }
                expect_dtype(node, o, dt)?;
                expect_shape(node, o, ins[0].shape)?;
                let stem = if matches!(self, Op::Gelu { .. }) { "gelu_fwd" } else { "gelu_bwd" };
                (tpc(stem), Some(vec![u8::from(*tanh)]))
            }
            Op::Embedding => {
                let (w, idx) = (&ins[0], &ins[1]);
                float(w)?;
                if w.shape.len() != 2 {
                    return Err(mismatch(node, w.name, "shape [rows, dim]", format!("shape {:?}", w.shape)));
                }
                expect_dtype(node, idx, DType::I32)?;
                expect_dtype(node, o, dt)?;
                let mut want = idx.shape.to_vec();
                want.push(w.shape[1]);
                expect_shape(node, o, &want)?;
                (tpc("embedding_pt_fwd"), None)
            }
            Op::EmbeddingBackward { num_weights, padding_idx } => {
                let (g, idx) = (&ins[0], &ins[1]);
                float(g)?;
                expect_dtype(node, idx, DType::I32)?;
                if g.shape.len() != idx.shape.len() + 1 || g.shape[..idx.shape.len()] != *idx.shape {
                    return Err(mismatch(
                        node,
                        g.name,
                        format!("shape {:?} + [dim] (from {})", idx.shape, idx.name),
                        format!("shape {:?}", g.shape),
                    ));
                }
                let rows = i32::try_from(*num_weights).ok().filter(|&r| r > 0);
                let pad = padding_idx.map_or(Some(-1), |p| i32::try_from(p).ok().filter(|&p| p < rows.unwrap_or(0)));
                let (Some(rows), Some(pad)) = (rows, pad) else {
                    return Err(mismatch(
                        node,
                        o.name,
                        "num_weights in 1..=i32::MAX and padding_idx below it",
                        format!("num_weights {num_weights}, padding_idx {padding_idx:?}"),
                    ));
                };
                expect_dtype(node, o, dt)?;
                expect_shape(node, o, &[u64::from(*num_weights), g.shape[g.shape.len() - 1]])?;
                let mut p = rows.to_le_bytes().to_vec();
                p.extend(pad.to_le_bytes());
                p.extend([0u8, 0, 0, 0]);
                (tpc("embedding_dense_pt_bwd"), Some(p))
            }
            Op::Transpose { perm } => {
                let x = &ins[0];
                let r = x.shape.len();
                let mut seen = [false; 5];
                let valid = (1..=5).contains(&r)
                    && perm.len() == r
                    && perm.iter().all(|&p| p < r && !std::mem::replace(&mut seen[p], true));
                if !valid {
                    return Err(mismatch(
                        node,
                        x.name,
                        format!("a permutation of the {r} axes (rank 1 to 5)"),
                        format!("permutation {perm:?}"),
                    ));
                }
                expect_dtype(node, o, x.dtype)?;
                let want: Vec<u64> = perm.iter().map(|&p| x.shape[p]).collect();
                expect_shape(node, o, &want)?;
                // The unused entries of the 5-slot struct hold their own index.
                let mut dev: Vec<u32> = device_permutation(perm);
                dev.extend(r as u32..5);
                let mut p: Vec<u8> = dev.iter().flat_map(|v| v.to_le_bytes()).collect();
                p.extend((r as u32).to_le_bytes());
                ("transpose".to_string(), Some(p))
            }
            Op::Reshape => {
                let x = &ins[0];
                expect_dtype(node, o, x.dtype)?;
                if x.shape.iter().product::<u64>() != o.shape.iter().product::<u64>() {
                    return Err(mismatch(
                        node,
                        o.name,
                        format!("{} elements (from {} {:?})", x.shape.iter().product::<u64>(), x.name, x.shape),
                        format!("shape {:?}", o.shape),
                    ));
                }
                ("reshape".to_string(), None)
            }
            Op::Relu | Op::IsFinite => {
                float(&ins[0])?;
                expect_dtype(node, o, if *self == Op::IsFinite { DType::I8 } else { dt })?;
                expect_shape(node, o, ins[0].shape)?;
                (tpc(if *self == Op::Relu { "relu_fwd" } else { "isfinite_fwd" }), None)
            }
            Op::ReluBackward => {
                float(&ins[0])?;
                expect_dtype(node, &ins[1], dt)?;
                expect_shape(node, &ins[1], ins[0].shape)?;
                expect_dtype(node, o, dt)?;
                expect_shape(node, o, ins[0].shape)?;
                (tpc("relu_bwd"), None)
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                float(&ins[0])?;
                expect_axis(node, &ins[0], *axis)?;
                expect_dtype(node, o, dt)?;
                expect_shape(node, o, ins[0].shape)?;
                (
                    tpc(if matches!(self, Op::Softmax { .. }) { "softmax_fwd" } else { "logsoftmax_fwd" }),
                    Some(axis4(&ins[0], *axis)),
                )
            }
            Op::SoftmaxBackward { axis } => {
                float(&ins[0])?;
                expect_axis(node, &ins[0], *axis)?;
                expect_dtype(node, &ins[1], dt)?;
                expect_shape(node, &ins[1], ins[0].shape)?;
                expect_dtype(node, o, dt)?;
                expect_shape(node, o, ins[0].shape)?;
                (tpc("softmax_bwd"), Some(axis4(&ins[0], *axis)))
            }
            Op::SoftmaxCrossEntropy { reduction } | Op::SoftmaxCrossEntropyBackward { reduction } => {
                let (x, labels) = (&ins[0], &ins[1]);
                float(x)?;
                if x.shape.len() != 2 {
                    return Err(mismatch(node, x.name, "shape [batch, classes]", format!("shape {:?}", x.shape)));
                }
                expect_dtype(node, labels, DType::I32)?;
                expect_shape(node, labels, &x.shape[..1])?;
                for t in outs {
                    expect_dtype(node, t, dt)?;
                }
                let mut p = reduction.code().to_le_bytes().to_vec();
                p.extend((x.shape[0] as i32).to_le_bytes());
                if matches!(self, Op::SoftmaxCrossEntropy { .. }) {
                    let loss = if *reduction == Reduction::None { vec![x.shape[0]] } else { vec![1] };
                    expect_shape(node, &outs[0], &loss)?;
                    expect_shape(node, &outs[1], x.shape)?;
                    (tpc("softmax_cross_entropy_fwd"), Some(p))
                } else {
                    expect_shape(node, o, x.shape)?;
                    (tpc("softmax_cross_entropy_bwd"), Some(p))
                }
            }
            Op::ReduceSum { axis } => {
                float(&ins[0])?;
                expect_axis(node, &ins[0], *axis)?;
                expect_dtype(node, o, dt)?;
                let mut want = ins[0].shape.to_vec();
                if let Some(d) = want.get_mut(*axis) {
                    *d = 1;
                }
                expect_shape(node, o, &want)?;
                (tpc("reduce_sum_fwd"), Some(axis4(&ins[0], *axis)))
            }
            Op::ReduceSumAxes { axes, keep_dims } => {
                let x = &ins[0];
                float(x)?;
                for &a in axes {
                    expect_axis(node, x, a)?;
                }
                expect_dtype(node, o, dt)?;
                let all = axes.is_empty();
                let mut want: Vec<u64> = x
                    .shape
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &d)| if all || axes.contains(&i) { keep_dims.then_some(1) } else { Some(d) })
                    .collect();
                if want.is_empty() {
                    want.push(1);
                }
                expect_shape(node, o, &want)?;
                let mut p = device_axis_mask(x.shape.len(), axes).to_le_bytes().to_vec();
                p.extend([u8::from(*keep_dims), 0, 0, 0]);
                (tpc("reduce_sum_multi_dim_fwd"), Some(p))
            }
            Op::Gemm { transpose_a: ta, transpose_b: tb } | Op::BatchGemm { transpose_a: ta, transpose_b: tb } => {
                let (a, b) = (&ins[0], &ins[1]);
                float(a)?;
                expect_dtype(node, b, a.dtype)?;
                float(o)?;
                let batch = matches!(self, Op::BatchGemm { .. });
                let rank_ok = |t: &Operand<'_>| if batch { t.shape.len() >= 3 } else { t.shape.len() == 2 };
                for t in [a, b, o] {
                    if !rank_ok(t) {
                        let want = if batch { "rank >= 3" } else { "rank 2" };
                        return Err(mismatch(node, t.name, want, format!("shape {:?}", t.shape)));
                    }
                }
                let r = a.shape.len();
                if b.shape.len() != r {
                    return Err(mismatch(node, b.name, format!("rank {r}"), format!("rank {}", b.shape.len())));
                }
                let ((m, k), (k2, n)) = (mk(&a.shape[r - 2..], *ta), kn(&b.shape[r - 2..], *tb));
                if k != k2 {
                    return Err(mismatch(
                        node,
                        b.name,
                        format!("inner dimension K = {k} (from {})", a.name),
                        format!("K = {k2}"),
                    ));
                }
                let mut want = Vec::new();
                if batch {
                    let Some(bs) = broadcast(&a.shape[..r - 2], &b.shape[..r - 2]) else {
                        return Err(mismatch(
                            node,
                            b.name,
                            format!("batch axes broadcastable with {:?}", &a.shape[..r - 2]),
                            format!("{:?}", &b.shape[..r - 2]),
                        ));
                    };
                    want = bs;
                }
                want.extend([m, n]);
                if let Some(bias) = ins.get(2) {
                    expect_dtype(node, bias, o.dtype)?;
                    expect_shape(node, bias, &[n])?;
                }
                expect_shape(node, o, &want)?;
                ((if batch { "batch_gemm" } else { "gemm" }).to_string(), Some(gemm_bytes(*ta, *tb)))
            }
            Op::GemmDx { transpose_a: ta, transpose_b: tb } | Op::GemmDw { transpose_a: ta, transpose_b: tb } => {
                let (dc, w) = (&ins[0], &ins[1]);
                float(dc)?;
                expect_dtype(node, w, dc.dtype)?;
                float(o)?;
                for t in [dc, w] {
                    if t.shape.len() != 2 {
                        return Err(mismatch(node, t.name, "rank 2", format!("shape {:?}", t.shape)));
                    }
                }
                let (m, n) = (dc.shape[0], dc.shape[1]);
                if matches!(self, Op::GemmDx { .. }) {
                    let (k, n2) = kn(w.shape, *tb);
                    if n != n2 {
                        return Err(mismatch(node, w.name, format!("N = {n} (from {})", dc.name), format!("N = {n2}")));
                    }
                    expect_shape(node, o, &if *ta { [k, m] } else { [m, k] })?;
                    ("gemm_dedx".to_string(), Some(gemm_bytes(*ta, *tb)))
                } else {
                    let (m2, k) = mk(w.shape, *ta);
                    if m != m2 {
                        return Err(mismatch(node, w.name, format!("M = {m} (from {})", dc.name), format!("M = {m2}")));
                    }
                    expect_shape(node, o, &if *tb { [n, k] } else { [k, n] })?;
                    ("gemm_dedw".to_string(), Some(gemm_bytes(*ta, *tb)))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(name: &'a str, dtype: DType, shape: &'a [u64]) -> Operand<'a> {
        Operand { name, dtype, shape }
    }

    #[test]
    fn guids_and_params_follow_the_vendor_names() {
        let f = DType::F32;
        let (g, p) = Op::Add.check("n", &[t("a", f, &[2, 3]), t("b", f, &[1, 3])], &[t("c", f, &[2, 3])]).unwrap();
        assert_eq!((g.as_str(), p), ("add_fwd_f32", None));
        let (g, p) = Op::Softmax { axis: 1 }
            .check("n", &[t("x", DType::Bf16, &[4, 10])], &[t("y", DType::Bf16, &[4, 10])])
            .unwrap();
        assert_eq!((g.as_str(), p), ("softmax_fwd_bf16", Some(0u32.to_le_bytes().to_vec())));
        let (g, p) = Op::Cast { rounding: CastRounding::NearestEven }
            .check("n", &[t("x", DType::Bf16, &[3])], &[t("y", f, &[3])])
            .unwrap();
        assert_eq!((g.as_str(), p.map(|p| p.len())), ("cast_bf16_to_f32", Some(4)));
        let (g, p) = Op::Gemm { transpose_a: false, transpose_b: true }
            .check("n", &[t("x", f, &[8, 4]), t("w", f, &[16, 4])], &[t("y", f, &[8, 16])])
            .unwrap();
        assert_eq!((g.as_str(), p), ("gemm", Some(vec![0, 1])));
        let (_, p) = Op::ReduceSumAxes { axes: vec![0], keep_dims: false }
            .check("n", &[t("x", f, &[5, 7])], &[t("s", f, &[7])])
            .unwrap();
        assert_eq!(p.unwrap(), vec![0b10, 0, 0, 0, 0, 0, 0, 0]);
        let (g, p) = Op::SoftmaxCrossEntropy { reduction: Reduction::Mean }
            .check("n", &[t("z", f, &[4, 10]), t("y", DType::I32, &[4])], &[t("l", f, &[1]), t("ls", f, &[4, 10])])
            .unwrap();
        assert_eq!(g, "softmax_cross_entropy_fwd_f32");
        assert_eq!(p.unwrap(), [1u32.to_le_bytes(), 4i32.to_le_bytes()].concat());
    }

    #[test]
    fn mistakes_name_node_tensor_expected_and_got() {
        let f = DType::F32;
        let e = Op::Gemm { transpose_a: false, transpose_b: false }
            .check("fc1", &[t("x", f, &[8, 4]), t("w", f, &[5, 16])], &[t("y", f, &[8, 16])])
            .unwrap_err();
        let Error::Graph(m) = &e else { panic!("{e:?}") };
        assert_eq!((m.node.as_str(), m.tensor.as_str()), ("fc1", "w"));
        assert!(m.expected.contains("K = 4") && m.got.contains("K = 5"), "{e}");
        let e = Op::Add
            .check("add", &[t("a", f, &[2, 3]), t("b", DType::Bf16, &[2, 3])], &[t("c", f, &[2, 3])])
            .unwrap_err();
        assert!(e.to_string().contains("node add: tensor b: expected dtype f32, got dtype bf16"), "{e}");
        let e = Op::Relu.check("r", &[t("a", f, &[2, 3])], &[t("c", f, &[3, 2])]).unwrap_err();
        assert!(e.to_string().contains("tensor c: expected shape [2, 3], got shape [3, 2]"), "{e}");
        let e = Op::Add.check("a2", &[t("a", f, &[2, 3])], &[t("c", f, &[2, 3])]).unwrap_err();
        assert!(e.to_string().contains("expected 2 inputs, got 1 inputs"), "{e}");
        let e = Op::Softmax { axis: 2 }.check("s", &[t("a", f, &[2, 3])], &[t("c", f, &[2, 3])]).unwrap_err();
        assert!(e.to_string().contains("axis 2"), "{e}");
    }

    /// The transformer kernels (issue 26): GUID and parameter bytes of each, table-driven.
    #[test]
    fn transformer_ops_follow_the_vendor_names_and_param_layouts() {
        let (f, i) = (DType::F32, DType::I32);
        let ln = |eps: f32| [vec![1u8, 0, 0, 0], eps.to_le_bytes().to_vec()].concat();
        let le = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        type Case<'a> = (Op, Vec<Operand<'a>>, Vec<Operand<'a>>, &'a str, Option<Vec<u8>>);
        let cases: Vec<Case<'_>> = vec![
            (Op::Div, vec![t("a", f, &[2, 3]), t("b", f, &[2, 1])], vec![t("c", f, &[2, 3])], "div_fwd_f32", None),
            (Op::Sqrt, vec![t("a", DType::Bf16, &[4])], vec![t("c", DType::Bf16, &[4])], "sqrt_fwd_bf16", None),
            (
                Op::LayerNorm { eps: 1e-5 },
                vec![t("x", f, &[3, 4, 8]), t("beta", f, &[8]), t("gamma", f, &[8])],
                vec![t("y", f, &[3, 4, 8]), t("mean", f, &[3, 4, 1]), t("istd", f, &[3, 4, 1])],
                "layer_norm_fwd_f32",
                Some(ln(1e-5)),
            ),
            (
                Op::LayerNormBackward { eps: 1e-6 },
                vec![
                    t("x", f, &[5, 8]),
                    t("dy", f, &[5, 8]),
                    t("mean", f, &[5, 1]),
                    t("istd", f, &[5, 1]),
                    t("gamma", f, &[8]),
                ],
                vec![t("dx", f, &[5, 8]), t("dbeta", f, &[8]), t("dgamma", f, &[8])],
                "layer_norm_bwd_f32",
                Some(ln(1e-6)),
            ),
            (
                Op::Gelu { tanh: false },
                vec![t("x", f, &[2, 3])],
                vec![t("y", f, &[2, 3])],
                "gelu_fwd_f32",
                Some(vec![0]),
            ),
            (
                Op::GeluBackward { tanh: true },
                vec![t("g", f, &[6]), t("x", f, &[6])],
                vec![t("dx", f, &[6])],
                "gelu_bwd_f32",
                Some(vec![1]),
            ),
            (
                Op::Embedding,
                vec![t("w", f, &[258, 16]), t("idx", i, &[2, 5])],
                vec![t("rows", f, &[2, 5, 16])],
                "embedding_pt_fwd_f32",
                None,
            ),
            (
                Op::EmbeddingBackward { num_weights: 258, padding_idx: Some(256) },
                vec![t("g", f, &[10, 16]), t("idx", i, &[10])],
                vec![t("dw", f, &[258, 16])],
                "embedding_dense_pt_bwd_f32",
                Some([258i32.to_le_bytes(), 256i32.to_le_bytes(), [0; 4]].concat()),
            ),
            (
                Op::EmbeddingBackward { num_weights: 64, padding_idx: None },
                vec![t("g", f, &[10, 16]), t("idx", i, &[10])],
                vec![t("dw", f, &[64, 16])],
                "embedding_dense_pt_bwd_f32",
                Some([64i32.to_le_bytes(), (-1i32).to_le_bytes(), [0; 4]].concat()),
            ),
            // Row-major [b, L, H, Dh] -> [b, H, L, Dh]: device sizes [Dh, H, L, b] -> [Dh, L, H, b],
            // device permutation {0, 2, 1, 3} (the vendor's worked example swaps the same way).
            (
                Op::Transpose { perm: vec![0, 2, 1, 3] },
                vec![t("x", f, &[2, 7, 4, 3])],
                vec![t("y", f, &[2, 4, 7, 3])],
                "transpose",
                Some(le(&[0, 2, 1, 3, 4, 4])),
            ),
            // A row-major matrix transpose is the device's {1, 0} too.
            (
                Op::Transpose { perm: vec![1, 0] },
                vec![t("x", f, &[2, 3])],
                vec![t("y", f, &[3, 2])],
                "transpose",
                Some(le(&[1, 0, 2, 3, 4, 2])),
            ),
            // Row-major rotation [a, b, c] -> [c, a, b]: output device axis 0 (row-major 2 =
            // input row-major 1 = device 1), 1 (rm 1 = in rm 0 = dev 2), 2 (rm 0 = in rm 2 = dev 0).
            (
                Op::Transpose { perm: vec![2, 0, 1] },
                vec![t("x", f, &[2, 3, 4])],
                vec![t("y", f, &[4, 2, 3])],
                "transpose",
                Some(le(&[1, 2, 0, 3, 4, 3])),
            ),
            (Op::Reshape, vec![t("x", i, &[4, 6])], vec![t("y", i, &[2, 12])], "reshape", None),
        ];
        for (op, ins, outs, guid, params) in cases {
            let (g, p) = op.check("n", &ins, &outs).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!((g.as_str(), p), (guid, params), "{op:?}");
        }
    }

    #[test]
    fn transformer_op_mistakes_name_the_tensor() {
        let (f, i) = (DType::F32, DType::I32);
        let err = |op: Op, ins: &[Operand<'_>], outs: &[Operand<'_>]| op.check("n", ins, outs).unwrap_err().to_string();
        // Layer norm statistics keep the normalized axis with size 1.
        let e = err(
            Op::LayerNorm { eps: 1e-5 },
            &[t("x", f, &[3, 8]), t("beta", f, &[8]), t("gamma", f, &[8])],
            &[t("y", f, &[3, 8]), t("mean", f, &[3]), t("istd", f, &[3, 1])],
        );
        assert!(e.contains("tensor mean: expected shape [3, 1], got shape [3]"), "{e}");
        // gamma in beta's place with another length.
        let e = err(
            Op::LayerNorm { eps: 1e-5 },
            &[t("x", f, &[3, 8]), t("beta", f, &[8]), t("gamma", f, &[4])],
            &[t("y", f, &[3, 8]), t("mean", f, &[3, 1]), t("istd", f, &[3, 1])],
        );
        assert!(e.contains("tensor gamma: expected shape [8]"), "{e}");
        // Indices must be i32.
        let e = err(Op::Embedding, &[t("w", f, &[10, 4]), t("idx", f, &[3])], &[t("o", f, &[3, 4])]);
        assert!(e.contains("tensor idx: expected dtype i32"), "{e}");
        // The gradient's leading axes are the indices'.
        let e = err(
            Op::EmbeddingBackward { num_weights: 10, padding_idx: None },
            &[t("g", f, &[4, 5]), t("idx", i, &[3])],
            &[t("dw", f, &[10, 5])],
        );
        assert!(e.contains("tensor g: expected shape [3] + [dim]"), "{e}");
        let e = err(
            Op::EmbeddingBackward { num_weights: 10, padding_idx: Some(10) },
            &[t("g", f, &[3, 5]), t("idx", i, &[3])],
            &[t("dw", f, &[10, 5])],
        );
        assert!(e.contains("padding_idx Some(10)"), "{e}");
        let e = err(Op::Transpose { perm: vec![0, 0] }, &[t("x", f, &[2, 3])], &[t("y", f, &[2, 3])]);
        assert!(e.contains("permutation [0, 0]"), "{e}");
        let e = err(Op::Transpose { perm: vec![1, 0] }, &[t("x", f, &[2, 3])], &[t("y", f, &[2, 3])]);
        assert!(e.contains("tensor y: expected shape [3, 2]"), "{e}");
        let e = err(Op::Reshape, &[t("x", f, &[2, 3])], &[t("y", f, &[7])]);
        assert!(e.contains("tensor y: expected 6 elements"), "{e}");
        let e = err(Op::GeluBackward { tanh: false }, &[t("g", f, &[3]), t("x", f, &[4])], &[t("dx", f, &[3])]);
        assert!(e.contains("tensor x: expected shape [3]"), "{e}");
        let e = err(Op::Div, &[t("a", f, &[2, 3])], &[t("c", f, &[2, 3])]);
        assert!(e.contains("expected 2 inputs"), "{e}");
    }
}
