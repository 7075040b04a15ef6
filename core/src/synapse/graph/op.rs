//! Typed graph operations: each [`Op`] knows its vendor GUID, its parameter struct (as bytes of
//! the exact size of one known version) and the dtypes and row-major shapes of its operands, so
//! a mistake is caught before the C call with an error naming the node, the tensor, what was
//! expected and what was given.
//!
//! Owns: [`Op`], [`CastRounding`], [`Reduction`], the GUID names and parameter layouts of
//! `graph_api.md` §4 (`perf_lib_layer_params.h` ≈1.16 as summarised there), and
//! [`Op::check`]. Must not touch: handles or C calls; axis conversion is `layout.rs`'s.

use habana_sys::synGEMMParams;

use super::super::error::{Error, OperandMismatch, Result};
use super::layout::{DType, device_axis, device_axis_mask};

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
            Op::Add | Op::Sub | Op::Mul | Op::Max | Op::Min => {
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
}
