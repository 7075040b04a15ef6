//! The model of `dropcompute train`: a one-hidden-layer perceptron (ReLU) with a softmax
//! cross-entropy loss, its gradient, evaluation, He initialisation and SGD with momentum, all in
//! f32 on the host, single-threaded and bitwise deterministic for the same inputs on one machine.
//!
//! Owns: the flat parameter layout ([`MlpShape`]), the math ([`forward_backward`], [`predict`],
//! [`evaluate`], [`sgd_momentum`], [`init_params`]). The device graphs of the training job
//! (`crate::model_graphs`) compute the same model and are tested against these
//! functions (gradient within f32 rounding, SGD bit for bit); `evaluate` gives held-out
//! accuracy on the host. Must not touch: devices, the data loader
//! or the scheduler; the division of the summed gradient by the global sample count is the
//! scheduler's (after the all-reduce).
//!
//! # Model
//! For a micro-batch X (m x input) with labels y: `H = relu(X W1 + b1)`, `Z = H W2 + b2`,
//! `loss_i = logsumexp(Z_i) - Z_i[y_i]` (cross-entropy of softmax(Z_i)). Gradients (standard
//! backpropagation, e.g. Goodfellow et al., Deep Learning, 6.5): `dZ = softmax(Z) - onehot(y)`,
//! `dW2 = Hᵀ dZ`, `db2 = Σ_i dZ_i`, `dH = (dZ W2ᵀ) ⊙ [H > 0]`, `dW1 = Xᵀ dH`, `db1 = Σ_i dH_i`.
//! Matrix products use `matrixmultiply::sgemm` (through `super::gemm`); bias sums and the
//! softmax are plain f32 loops in row order.

#![forbid(unsafe_code)]

use std::ops::Range;

use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::data::Dataset;
use super::gemm::{Mat, gemm};
use dropcompute::sim::rng::StableRng;

/// Layer sizes of the MLP. The flat parameter vector (length [`MlpShape::param_len`]) is
/// `[W1 | b1 | W2 | b2]`:
/// - `W1`: `input x hidden`, row-major, at offset 0 (`W1[i][j]` at `i * hidden + j`);
/// - `b1`: `hidden`, at `input * hidden`;
/// - `W2`: `hidden x classes`, row-major, at `(input + 1) * hidden`;
/// - `b2`: `classes`, at `(input + 1) * hidden + hidden * classes`.
///
/// Gradients use the same layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct MlpShape {
    /// Features per sample.
    pub input: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Output classes (>= 2).
    pub classes: usize,
}

impl MlpShape {
    /// Number of f32 parameters: `(input + 1) * hidden + (hidden + 1) * classes` (saturating,
    /// so a shape too large to allocate still compares unequal to any real buffer length).
    pub fn param_len(&self) -> usize {
        let l1 = (self.input.saturating_add(1)).saturating_mul(self.hidden);
        let l2 = (self.hidden.saturating_add(1)).saturating_mul(self.classes);
        l1.saturating_add(l2)
    }

    /// Range of `W1` in the flat parameters.
    pub fn w1(&self) -> Range<usize> {
        0..self.input * self.hidden
    }

    /// Range of `b1`.
    pub fn b1(&self) -> Range<usize> {
        let s = self.input * self.hidden;
        s..s + self.hidden
    }

    /// Range of `W2`.
    pub fn w2(&self) -> Range<usize> {
        let s = self.b1().end;
        s..s + self.hidden * self.classes
    }

    /// Range of `b2`.
    pub fn b2(&self) -> Range<usize> {
        let s = self.w2().end;
        s..s + self.classes
    }

    /// Checks that every dimension is positive, `classes >= 2` and `param_len` fits in memory.
    ///
    /// # Errors
    /// [`MlpError::Shape`].
    pub fn validate(&self) -> Result<(), MlpError> {
        let ok = self.input > 0 && self.hidden > 0 && self.classes >= 2 && self.param_len() < isize::MAX as usize / 4;
        if ok { Ok(()) } else { Err(MlpError::Shape(*self)) }
    }
}

/// Why an MLP function refused its inputs (nothing is written in that case).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum MlpError {
    /// A dimension is zero, `classes < 2`, or the parameter count overflows.
    #[error("invalid MLP shape {0:?} (need input, hidden > 0, classes >= 2)")]
    Shape(MlpShape),
    /// A buffer has the wrong number of elements.
    #[error("{what} has {got} elements, expected {expected}")]
    Length {
        /// Which buffer ("params", "grad", "velocity", "x", ...).
        what: &'static str,
        /// Elements expected.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A label is neither -1 (padding) nor a class `0..classes`.
    #[error("label {label} of row {row} is not -1 (padding) or in 0..{classes}")]
    Label {
        /// Row in the micro-batch.
        row: usize,
        /// The label.
        label: i64,
        /// Classes of the model.
        classes: usize,
    },
    /// [`evaluate`] got a data set whose `dim` or `classes` do not fit the model, or no sample.
    #[error("data set (dim {dim}, {classes} classes, {len} samples) does not fit model {shape:?}")]
    Dataset {
        /// Data set features per sample.
        dim: usize,
        /// Data set classes.
        classes: usize,
        /// Data set samples.
        len: usize,
        /// The model.
        shape: MlpShape,
    },
}

/// Reusable work buffers of [`forward_backward`] / [`predict`] (grown on demand, never shrunk;
/// contents are meaningless between calls).
#[derive(Debug, Default, Clone)]
pub struct MlpScratch {
    x: Vec<f32>,
    y: Vec<usize>,
    h: Vec<f32>,
    z: Vec<f32>,
    dh: Vec<f32>,
}

/// He-normal initialisation (He et al., ICCV 2015): `W1 ~ N(0, 2 / input)`,
/// `W2 ~ N(0, 2 / hidden)`, biases 0; drawn in layout order from
/// [`StableRng`]`::seed_from_u64(seed)`.
///
/// # Errors
/// [`MlpError::Shape`] for an invalid shape.
pub fn init_params(shape: MlpShape, seed: u64) -> Result<Vec<f32>, MlpError> {
    shape.validate()?;
    let mut rng = StableRng::seed_from_u64(seed);
    let mut p = vec![0.0f32; shape.param_len()];
    for (range, fan_in) in [(shape.w1(), shape.input), (shape.w2(), shape.hidden)] {
        let normal = Normal::new(0.0f64, (2.0 / fan_in as f64).sqrt()).map_err(|_| MlpError::Shape(shape))?;
        p[range].iter_mut().for_each(|w| *w = normal.sample(&mut rng) as f32);
    }
    Ok(p)
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), MlpError> {
    if expected == got { Ok(()) } else { Err(MlpError::Length { what, expected, got }) }
}

/// Forward pass of the first `m` rows of `s.x` into `s.h` (m x hidden, after ReLU) and `s.z`
/// (m x classes logits). Sizes were validated by the caller.
fn forward(shape: MlpShape, params: &[f32], m: usize, s: &mut MlpScratch) {
    let MlpShape { input, hidden, classes } = shape;
    s.h.resize(m * hidden, 0.0);
    s.z.resize(m * classes, 0.0);
    let x = Mat::row_major(&s.x[..m * input], m, input);
    gemm(1.0, x, Mat::row_major(&params[shape.w1()], input, hidden), 0.0, &mut s.h);
    let b1 = &params[shape.b1()];
    for row in s.h.chunks_exact_mut(hidden) {
        row.iter_mut().zip(b1).for_each(|(v, b)| *v = (*v + b).max(0.0));
    }
    gemm(1.0, Mat::row_major(&s.h, m, hidden), Mat::row_major(&params[shape.w2()], hidden, classes), 0.0, &mut s.z);
    let b2 = &params[shape.b2()];
    for row in s.z.chunks_exact_mut(classes) {
        row.iter_mut().zip(b2).for_each(|(v, b)| *v += b);
    }
}

/// Cross-entropy of softmax(`z`) at class `y`, stable form `max + ln Σ exp(z - max) - z[y]`;
/// with `grad`, `z` is then overwritten with `softmax(z) - onehot(y)` (dLoss/dz).
fn softmax_xent(z: &mut [f32], y: usize, grad: bool) -> f32 {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = z.iter().map(|v| (v - max).exp()).sum();
    let loss = max + sum.ln() - z[y];
    if grad {
        for (j, v) in z.iter_mut().enumerate() {
            *v = (*v - max).exp() / sum - if j == y { 1.0 } else { 0.0 };
        }
    }
    loss
}

/// Copies the non-padding rows of `x` into `s.x` and their labels into `s.y`; returns the count.
fn gather_valid(shape: MlpShape, x: &[f32], labels: &[i32], s: &mut MlpScratch) -> Result<usize, MlpError> {
    check_len("x", labels.len().saturating_mul(shape.input), x.len())?;
    s.x.clear();
    s.y.clear();
    for (row, (&l, xr)) in labels.iter().zip(x.chunks_exact(shape.input)).enumerate() {
        match usize::try_from(l) {
            Ok(c) if c < shape.classes => {
                s.x.extend_from_slice(xr);
                s.y.push(c);
            }
            _ if l == -1 => {}
            _ => return Err(MlpError::Label { row, label: i64::from(l), classes: shape.classes }),
        }
    }
    Ok(s.y.len())
}

/// Loss and gradient of one micro-batch of `b = labels.len()` rows.
///
/// `x` is `b x input` (row-major); `labels[i]` is the class of row i, or -1 for a padding row,
/// which is ignored entirely (its features may be anything, NaN included). `grad_out`
/// (length `param_len`) is overwritten with the SUM over valid rows of the per-sample gradients
/// (not the mean: the scheduler divides by the global sample count after the all-reduce), all
/// zero when no row is valid. Returns `(loss_sum, valid_rows)`: the summed per-sample
/// cross-entropy (each row in f32, summed in f64 in row order) and the number of non-padding rows.
///
/// # Errors
/// [`MlpError::Shape`], [`MlpError::Length`] (`params`, `grad`, or `x` not `b * input`),
/// [`MlpError::Label`]; `grad_out` is untouched then.
pub fn forward_backward(
    shape: MlpShape,
    params: &[f32],
    x: &[f32],
    labels: &[i32],
    grad_out: &mut [f32],
    scratch: &mut MlpScratch,
) -> Result<(f64, usize), MlpError> {
    shape.validate()?;
    check_len("params", shape.param_len(), params.len())?;
    check_len("grad", shape.param_len(), grad_out.len())?;
    let s = scratch;
    let m = gather_valid(shape, x, labels, s)?;
    if m == 0 {
        grad_out.fill(0.0);
        return Ok((0.0, 0));
    }
    let MlpShape { input, hidden, classes } = shape;
    forward(shape, params, m, s);
    // dZ replaces the logits row by row.
    let mut loss = 0.0f64;
    for (zr, &y) in s.z.chunks_exact_mut(classes).zip(&s.y) {
        loss += f64::from(softmax_xent(zr, y, true));
    }
    let (g1, rest) = grad_out.split_at_mut(shape.b1().start);
    let (gb1, rest) = rest.split_at_mut(hidden);
    let (g2, gb2) = rest.split_at_mut(hidden * classes);
    let dz = Mat::row_major(&s.z, m, classes);
    gemm(1.0, Mat::row_major(&s.h, m, hidden).t(), dz, 0.0, g2);
    column_sums(&s.z, classes, gb2);
    s.dh.resize(m * hidden, 0.0);
    gemm(1.0, dz, Mat::row_major(&params[shape.w2()], hidden, classes).t(), 0.0, &mut s.dh);
    // ReLU'(pre-activation) = [h > 0] since h = max(pre, 0).
    s.dh.iter_mut().zip(&s.h).for_each(|(d, h)| {
        if *h <= 0.0 {
            *d = 0.0;
        }
    });
    gemm(1.0, Mat::row_major(&s.x, m, input).t(), Mat::row_major(&s.dh, m, hidden), 0.0, g1);
    column_sums(&s.dh, hidden, gb1);
    Ok((loss, m))
}

/// `out[j] = Σ_r a[r * cols + j]`, summed in row order.
fn column_sums(a: &[f32], cols: usize, out: &mut [f32]) {
    out.fill(0.0);
    for row in a.chunks_exact(cols) {
        out.iter_mut().zip(row).for_each(|(o, v)| *o += v);
    }
}

/// Predicted class (first arg-max of the logits) of each of the `x.len() / input` rows of `x`.
///
/// # Errors
/// [`MlpError::Shape`]; [`MlpError::Length`] when `params` is not `param_len` or `x` not a
/// whole number of rows.
pub fn predict(shape: MlpShape, params: &[f32], x: &[f32], scratch: &mut MlpScratch) -> Result<Vec<u32>, MlpError> {
    shape.validate()?;
    check_len("params", shape.param_len(), params.len())?;
    let m = x.len() / shape.input;
    check_len("x", m * shape.input, x.len())?;
    scratch.x.clear();
    scratch.x.extend_from_slice(x);
    forward(shape, params, m, scratch);
    Ok(scratch.z.chunks_exact(shape.classes).map(argmax).collect())
}

fn argmax(z: &[f32]) -> u32 {
    let mut best = 0;
    for (j, v) in z.iter().enumerate() {
        if *v > z[best] {
            best = j;
        }
    }
    best as u32
}

/// `(mean cross-entropy, accuracy in [0, 1])` of the model on every sample of `data`, computed
/// on the host in chunks of 256 samples.
///
/// # Errors
/// [`MlpError::Dataset`] when `data.dim != input`, `data.classes > classes` or `data` is empty;
/// [`MlpError::Shape`], [`MlpError::Length`] as [`predict`].
pub fn evaluate(shape: MlpShape, params: &[f32], data: &Dataset) -> Result<(f64, f64), MlpError> {
    shape.validate()?;
    if data.dim != shape.input || data.classes > shape.classes || data.is_empty() {
        return Err(MlpError::Dataset { dim: data.dim, classes: data.classes, len: data.len(), shape });
    }
    check_len("params", shape.param_len(), params.len())?;
    const CHUNK: usize = 256;
    let mut s = MlpScratch::default();
    let (mut loss, mut correct) = (0.0f64, 0usize);
    for (xs, ys) in data.features.chunks(CHUNK * shape.input).zip(data.labels.chunks(CHUNK)) {
        s.x.clear();
        s.x.extend_from_slice(xs);
        forward(shape, params, ys.len(), &mut s);
        for (z, &y) in s.z.chunks_exact_mut(shape.classes).zip(ys) {
            correct += usize::from(argmax(z) == y);
            loss += f64::from(softmax_xent(z, y as usize, false));
        }
    }
    let n = data.len() as f64;
    Ok((loss / n, correct as f64 / n))
}

/// One SGD step with momentum and L2 weight decay, PyTorch's `torch.optim.SGD` convention
/// (dampening 0, no Nesterov): `v = momentum * v + (g + weight_decay * p)`, `p = p - lr * v`,
/// element-wise in f32 with each operation rounded (no fused multiply-add). `grad` is the
/// already-averaged gradient.
///
/// # Errors
/// [`MlpError::Length`] when `velocity` or `grad` differ in length from `params` (nothing written).
pub fn sgd_momentum(
    params: &mut [f32],
    velocity: &mut [f32],
    grad: &[f32],
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) -> Result<(), MlpError> {
    check_len("velocity", params.len(), velocity.len())?;
    check_len("grad", params.len(), grad.len())?;
    for ((p, v), g) in params.iter_mut().zip(velocity.iter_mut()).zip(grad) {
        *v = momentum * *v + (g + weight_decay * *p);
        *p -= lr * *v;
    }
    Ok(())
}

#[cfg(test)]
#[path = "mlp_tests.rs"]
mod tests;
