//! The CPU arithmetic of the mock's graph kernels, on f32 values in the device's dimension
//! order (sizes fastest-changing dimension first, as `synTensorGeometry`).
//!
//! Owns: pure functions from input values to output values (no memory binding, no dtype
//! conversion, no validation beyond what indexing needs: `exec.rs` validated the node).
//! Must not touch: anything else of the crate (a leaf).
//!
//! Semantics follow the vendor's GUID descriptions as summarised in the project's reference
//! notes (`graph_api.md` §4); where the reference marks a detail as inferred, the doc comment
//! says so.

/// Number of elements of a tensor with FCD-first `sizes`.
pub(crate) fn numel(sizes: &[u64]) -> usize {
    sizes.iter().product::<u64>() as usize
}

/// Element strides (FCD first, dense) of `sizes`.
fn strides(sizes: &[u64]) -> Vec<usize> {
    let mut s = Vec::with_capacity(sizes.len());
    let mut acc = 1usize;
    for &d in sizes {
        s.push(acc);
        acc *= d as usize;
    }
    s
}

/// The broadcast shape of `a` and `b` (FCD first; a missing dimension counts as 1), or `None`
/// when a dimension differs and neither is 1.
pub(crate) fn broadcast_shape(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let (x, y) = (a.get(i).copied().unwrap_or(1), b.get(i).copied().unwrap_or(1));
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

/// Elementwise binary operation of the `*_fwd` GUIDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binary {
    /// a + b.
    Add,
    /// a − b.
    Sub,
    /// a · b.
    Mult,
    /// max(a, b) (NaN propagates).
    Max,
    /// min(a, b) (NaN propagates).
    Min,
    /// a / b (IEEE: x / 0 is ±inf or NaN).
    Div,
}

impl Binary {
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Self::Add => a + b,
            Self::Sub => a - b,
            Self::Mult => a * b,
            Self::Max => {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.max(b)
                }
            }
            Self::Min => {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.min(b)
                }
            }
            Self::Div => a / b,
        }
    }
}

/// `out = op(a, b)` with size-1 dimensions of either input broadcast to `out_sizes`.
pub(crate) fn binary(op: Binary, a: &[f32], sa: &[u64], b: &[f32], sb: &[u64], out_sizes: &[u64]) -> Vec<f32> {
    let n = numel(out_sizes);
    if sa == out_sizes && sb == out_sizes {
        return a.iter().zip(b).map(|(&x, &y)| op.apply(x, y)).collect();
    }
    // A scalar operand (a scale, a step size): one pass over the other.
    if b.len() == 1 && a.len() == n {
        return a.iter().map(|&x| op.apply(x, b[0])).collect();
    }
    if a.len() == 1 && b.len() == n {
        return b.iter().map(|&y| op.apply(a[0], y)).collect();
    }
    let bstride = |s: &[u64]| -> Vec<usize> {
        let st = strides(s);
        (0..out_sizes.len()).map(|i| if s.get(i).copied().unwrap_or(1) == 1 { 0 } else { st[i] }).collect()
    };
    let (ta, tb) = (bstride(sa), bstride(sb));
    // Walk the output in order; each input offset advances by its stride and rewinds on a
    // carry (no per-element index arithmetic over the rank).
    let mut idx = vec![0u64; out_sizes.len()];
    let (mut ia, mut ib) = (0usize, 0usize);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(op.apply(a[ia], b[ib]));
        for (d, i) in idx.iter_mut().enumerate() {
            *i += 1;
            ia += ta[d];
            ib += tb[d];
            if *i < out_sizes[d] {
                break;
            }
            ia -= ta[d] * out_sizes[d] as usize;
            ib -= tb[d] * out_sizes[d] as usize;
            *i = 0;
        }
    }
    out
}

/// Splits `sizes` around dimension `dim` into (outer, n, inner) counts: element (o, k, i) is at
/// `(o * n + k) * inner + i`.
pub(crate) fn split_at_dim(sizes: &[u64], dim: usize) -> (usize, usize, usize) {
    let inner = numel(&sizes[..dim]);
    let n = sizes[dim] as usize;
    let outer = numel(&sizes[dim + 1..]);
    (outer, n, inner)
}

/// Applies `f` to every 1-D line of `x` along `dim` (gathered into `buf`, written back to `out`).
fn per_line(sizes: &[u64], dim: usize, x: &[f32], mut f: impl FnMut(&mut [f32])) -> Vec<f32> {
    let (outer, n, inner) = split_at_dim(sizes, dim);
    let mut out = x.to_vec();
    if inner == 1 {
        // Along the FCD the lines are contiguous: no gather.
        out.chunks_exact_mut(n.max(1)).for_each(f);
        return out;
    }
    let mut buf = vec![0f32; n];
    for o in 0..outer {
        for i in 0..inner {
            for k in 0..n {
                buf[k] = x[(o * n + k) * inner + i];
            }
            f(&mut buf);
            for k in 0..n {
                out[(o * n + k) * inner + i] = buf[k];
            }
        }
    }
    out
}

/// `relu_fwd`: x if x > threshold else 0 (threshold 0 without params).
pub(crate) fn relu(x: &[f32], threshold: f32) -> Vec<f32> {
    x.iter().map(|&v| if v > threshold { v } else { 0.0 }).collect()
}

/// `relu_bwd` with inputs **(grad, x)**: grad where x > threshold, else 0.
pub(crate) fn relu_bwd(grad: &[f32], x: &[f32], threshold: f32) -> Vec<f32> {
    grad.iter().zip(x).map(|(&g, &v)| if v > threshold { g } else { 0.0 }).collect()
}

/// `softmax_fwd` along TPC dimension `dim` (max-subtracted, accumulated in f64).
pub(crate) fn softmax(x: &[f32], sizes: &[u64], dim: usize) -> Vec<f32> {
    per_line(sizes, dim, x, |l| {
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let s: f64 = l.iter().map(|&v| f64::from(v - m).exp()).sum();
        for v in l.iter_mut() {
            *v = (f64::from(*v - m).exp() / s) as f32;
        }
    })
}

/// `logsoftmax_fwd` along TPC dimension `dim`: x − max − log Σ exp(x − max).
pub(crate) fn log_softmax(x: &[f32], sizes: &[u64], dim: usize) -> Vec<f32> {
    per_line(sizes, dim, x, |l| {
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let lse = l.iter().map(|&v| f64::from(v - m).exp()).sum::<f64>().ln();
        for v in l.iter_mut() {
            *v = (f64::from(*v - m) - lse) as f32;
        }
    })
}

/// `softmax_bwd` with inputs **(y, dy)** (y the forward output): dx = y · (dy − Σ dy·y).
pub(crate) fn softmax_bwd(y: &[f32], dy: &[f32], sizes: &[u64], dim: usize) -> Vec<f32> {
    let (outer, n, inner) = split_at_dim(sizes, dim);
    let mut out = vec![0f32; y.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let dot: f64 = (0..n).map(|k| f64::from(y[at(k)]) * f64::from(dy[at(k)])).sum();
            for k in 0..n {
                out[at(k)] = (f64::from(y[at(k)]) * (f64::from(dy[at(k)]) - dot)) as f32;
            }
        }
    }
    out
}

/// Reduction mode of `softmax_cross_entropy_*` (`ns_SoftmaxCrossEntropy::Params::mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CeMode {
    /// SUM (0): loss = Σ_b loss_b; the gradient is not scaled.
    Sum,
    /// MEAN (1): loss = Σ_b loss_b / batch_size; the gradient is scaled by 1 / batch_size.
    Mean,
    /// NO_REDUCTION (2): loss has shape [B]; the gradient is not scaled.
    None,
}

/// The class of sample `b`, or an error naming it (labels must be integers in 0..classes).
fn label(labels: &[f32], b: usize, classes: usize) -> Result<usize, String> {
    let l = labels[b];
    if l.fract() == 0.0 && l >= 0.0 && (l as usize) < classes {
        Ok(l as usize)
    } else {
        Err(format!("label {l} of sample {b} is outside 0..{classes}"))
    }
}

/// `softmax_cross_entropy_fwd` on logits `[C, B]` (FCD first) and integer labels `[B]`:
/// (loss, log_softmax). `batch_size` divides the MEAN loss (the batch count B when <= 0; the
/// vendor's use of the field is inferred).
pub(crate) fn softmax_ce_fwd(
    logits: &[f32],
    labels: &[f32],
    classes: usize,
    batch: usize,
    mode: CeMode,
    batch_size: i32,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    let ls = log_softmax(logits, &[classes as u64, batch as u64], 0);
    let mut per = Vec::with_capacity(batch);
    for b in 0..batch {
        per.push(-f64::from(ls[b * classes + label(labels, b, classes)?]));
    }
    let div = if batch_size > 0 { f64::from(batch_size) } else { batch as f64 };
    let loss = match mode {
        CeMode::Sum => vec![per.iter().sum::<f64>() as f32],
        CeMode::Mean => vec![(per.iter().sum::<f64>() / div) as f32],
        CeMode::None => per.iter().map(|&v| v as f32).collect(),
    };
    Ok((loss, ls))
}

/// `softmax_cross_entropy_bwd` on (log_softmax `[C, B]`, labels `[B]`): dlogits =
/// (softmax − onehot), scaled by 1 / batch_size for MEAN (no dLoss input).
pub(crate) fn softmax_ce_bwd(
    log_sm: &[f32],
    labels: &[f32],
    classes: usize,
    batch: usize,
    mode: CeMode,
    batch_size: i32,
) -> Result<Vec<f32>, String> {
    let scale = match mode {
        CeMode::Mean if batch_size > 0 => 1.0 / f64::from(batch_size),
        CeMode::Mean => 1.0 / batch as f64,
        _ => 1.0,
    };
    let mut out = vec![0f32; log_sm.len()];
    for b in 0..batch {
        let y = label(labels, b, classes)?;
        for c in 0..classes {
            let p = f64::from(log_sm[b * classes + c]).exp() - if c == y { 1.0 } else { 0.0 };
            out[b * classes + c] = (p * scale) as f32;
        }
    }
    Ok(out)
}

/// Sum of `x` (FCD-first `sizes`) over every dimension whose bit is set in `mask`, keeping
/// them with size 1 (the caller drops them when keepDim is false: same element order).
pub(crate) fn reduce_sum(x: &[f32], sizes: &[u64], mask: u32) -> Vec<f32> {
    let out_sizes: Vec<u64> =
        sizes.iter().enumerate().map(|(d, &s)| if mask & (1 << d) != 0 { 1 } else { s }).collect();
    let ost = strides(&out_sizes);
    let mut acc = vec![0f64; numel(&out_sizes)];
    let mut idx = vec![0u64; sizes.len()];
    for &v in x {
        let o: usize =
            idx.iter().enumerate().map(|(d, &i)| if mask & (1 << d) != 0 { 0 } else { i as usize * ost[d] }).sum();
        acc[o] += f64::from(v);
        for (d, i) in idx.iter_mut().enumerate() {
            *i += 1;
            if *i < sizes[d] {
                break;
            }
            *i = 0;
        }
    }
    acc.into_iter().map(|v| v as f32).collect()
}

/// `isfinite_fwd`: 1 where finite, else 0.
pub(crate) fn isfinite(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| if v.is_finite() { 1.0 } else { 0.0 }).collect()
}

/// `layer_norm_fwd` over TPC dimension 0 (the FCD, PyTorch's last dimension) of `x`, `c`
/// values per row: y = (x − mean) · istd · gamma + beta with istd = 1 / sqrt(var + eps) (biased
/// variance, as `torch.nn.LayerNorm`), accumulated in f64. Returns (y, mean, istd), mean and
/// istd one value per row. `beta` and `gamma` hold `c` values each.
pub(crate) fn layer_norm(x: &[f32], c: usize, beta: &[f32], gamma: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len().checked_div(c).unwrap_or(0);
    let (mut y, mut mean, mut istd) = (Vec::with_capacity(x.len()), Vec::with_capacity(rows), Vec::with_capacity(rows));
    for row in x.chunks_exact(c.max(1)).take(rows) {
        let m = row.iter().map(|&v| f64::from(v)).sum::<f64>() / c as f64;
        let var = row.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / c as f64;
        let is = 1.0 / (var + f64::from(eps)).sqrt();
        for ((&v, &g), &b) in row.iter().zip(gamma).zip(beta) {
            y.push(((f64::from(v) - m) * is * f64::from(g) + f64::from(b)) as f32);
        }
        mean.push(m as f32);
        istd.push(is as f32);
    }
    (y, mean, istd)
}

/// `layer_norm_bwd` with inputs **(x, dy, mean, istd, gamma)** (x first, unlike `relu_bwd`'s
/// (grad, x)): returns (dx, dbeta, dgamma). With x̂ = (x − mean) · istd and g = dy · gamma per
/// row of `c` values: dx = istd · (g − mean(g) − x̂ · mean(g · x̂)), dbeta = Σ_rows dy,
/// dgamma = Σ_rows dy · x̂ (the analytic gradient of [`layer_norm`]; f64 accumulation).
pub(crate) fn layer_norm_bwd(
    x: &[f32],
    dy: &[f32],
    mean: &[f32],
    istd: &[f32],
    gamma: &[f32],
    c: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len().checked_div(c).unwrap_or(0);
    let mut dx = Vec::with_capacity(x.len());
    let (mut dbeta, mut dgamma) = (vec![0f64; c], vec![0f64; c]);
    let mut xhat = vec![0f64; c];
    let mut g = vec![0f64; c];
    for r in 0..rows {
        let (m, is) = (f64::from(mean[r]), f64::from(istd[r]));
        let (xr, dyr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        for k in 0..c {
            xhat[k] = (f64::from(xr[k]) - m) * is;
            g[k] = f64::from(dyr[k]) * f64::from(gamma[k]);
            dbeta[k] += f64::from(dyr[k]);
            dgamma[k] += f64::from(dyr[k]) * xhat[k];
        }
        let mg = g.iter().sum::<f64>() / c as f64;
        let mgx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / c as f64;
        dx.extend((0..c).map(|k| (is * (g[k] - mg - xhat[k] * mgx)) as f32));
    }
    let f = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
    (dx, f(dbeta), f(dgamma))
}

/// sqrt(2 / π), the constant of GELU's tanh approximation.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// `gelu_fwd`: x · Φ(x) with Φ the standard normal CDF (erf form, `approximation` false), or
/// 0.5 · x · (1 + tanh(sqrt(2/π) · (x + 0.044715 · x³))) (`approximation` true); PyTorch's
/// `gelu(approximate="none" | "tanh")`. erf from `libm`.
pub(crate) fn gelu(x: &[f32], tanh: bool) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let v = f64::from(v);
            let y = if tanh {
                0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + 0.044_715 * v * v * v)).tanh())
            } else {
                0.5 * v * (1.0 + libm::erf(v * std::f64::consts::FRAC_1_SQRT_2))
            };
            y as f32
        })
        .collect()
}

/// `gelu_bwd` with inputs **(grad, x)** (x the forward input): grad · d gelu(x) / dx, for the
/// form selected by `tanh` (see [`gelu`]).
pub(crate) fn gelu_bwd(grad: &[f32], x: &[f32], tanh: bool) -> Vec<f32> {
    grad.iter()
        .zip(x)
        .map(|(&g, &v)| {
            let v = f64::from(v);
            let d = if tanh {
                let u = SQRT_2_OVER_PI * (v + 0.044_715 * v * v * v);
                let t = u.tanh();
                0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044_715 * v * v)
            } else {
                let cdf = 0.5 * (1.0 + libm::erf(v * std::f64::consts::FRAC_1_SQRT_2));
                let pdf = (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
                cdf + v * pdf
            };
            (f64::from(g) * d) as f32
        })
        .collect()
}

/// The row of token `t` (`idx[t]`) in a table of `rows` rows, or an error naming the token.
fn row_of(idx: &[f32], t: usize, rows: usize) -> Result<usize, String> {
    let v = idx[t];
    if v.fract() == 0.0 && v >= 0.0 && (v as usize) < rows {
        Ok(v as usize)
    } else {
        Err(format!("index {v} of token {t} is outside 0..{rows}"))
    }
}

/// `embedding_pt_fwd` on (weight `[d, rows]` FCD first, i.e. PyTorch `[rows, d]`, integer
/// indices, one per token): out `[d, tokens]`, row `idx[t]` of the table for each token t.
/// Err: an index outside 0..rows.
pub(crate) fn embedding(weight: &[f32], d: usize, rows: usize, idx: &[f32]) -> Result<Vec<f32>, String> {
    let mut out = Vec::with_capacity(idx.len() * d);
    for t in 0..idx.len() {
        let r = row_of(idx, t, rows)?;
        out.extend_from_slice(&weight[r * d..(r + 1) * d]);
    }
    Ok(out)
}

/// `embedding_dense_pt_bwd` on (grad `[d, tokens]`, indices): dW `[d, rows]` with the
/// gradient of every token added into its row (scatter-add in f64, tokens in order), the row
/// `padding_idx` (when it is in 0..rows; PyTorch's `padding_idx`, −1 for none) left zero.
/// Err: an index outside 0..rows.
pub(crate) fn embedding_bwd(
    grad: &[f32],
    idx: &[f32],
    d: usize,
    rows: usize,
    padding_idx: i32,
) -> Result<Vec<f32>, String> {
    let mut acc = vec![0f64; d * rows];
    for t in 0..idx.len() {
        let r = row_of(idx, t, rows)?;
        if i64::from(padding_idx) == r as i64 {
            continue;
        }
        for (a, &g) in acc[r * d..(r + 1) * d].iter_mut().zip(&grad[t * d..(t + 1) * d]) {
            *a += f64::from(g);
        }
    }
    Ok(acc.into_iter().map(|v| v as f32).collect())
}

/// `transpose` of `x` (FCD-first `sizes`) by `perm`: output dimension i is input dimension
/// `perm[i]` (`synTransposeParams` semantics, checked against the vendor's worked example in
/// `graph_api.md`'s sources: sizes {96,7,8,7,512} with permutation {0,1,3,2,4} give
/// {96,7,7,8,512}). `perm` is a permutation of 0..sizes.len() (validated by the caller).
pub(crate) fn transpose_nd(x: &[f32], sizes: &[u64], perm: &[usize]) -> Vec<f32> {
    let in_strides = strides(sizes);
    let out_sizes: Vec<u64> = perm.iter().map(|&p| sizes[p]).collect();
    // Walking the output in order, the input index advances by the stride of the input
    // dimension that output dimension i reads.
    let step: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut out = Vec::with_capacity(x.len());
    let mut idx = vec![0u64; out_sizes.len()];
    let mut at = 0usize;
    for _ in 0..x.len() {
        out.push(x[at]);
        for (d, i) in idx.iter_mut().enumerate() {
            *i += 1;
            at += step[d];
            if *i < out_sizes[d] {
                break;
            }
            at -= step[d] * out_sizes[d] as usize;
            *i = 0;
        }
    }
    out
}

/// One row-major matrix operand: `rows × cols` at `data`, optionally transposed in storage
/// (then `data` holds `cols × rows` row-major).
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Stored transposed.
    pub trans: bool,
}

impl Mat<'_> {
    /// (row stride, column stride) of the logical matrix in `data`.
    fn strides(&self) -> (isize, isize) {
        if self.trans { (1, self.rows as isize) } else { (self.cols as isize, 1) }
    }
}

/// C (m × n, row-major, overwritten) = A (m × k) · B (k × n) with `matrixmultiply::sgemm`.
pub(crate) fn matmul(a: Mat<'_>, b: Mat<'_>, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    debug_assert_eq!(b.rows, k);
    debug_assert!(a.data.len() >= m * k && b.data.len() >= k * n && c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let (rsa, csa) = a.strides();
    let (rsb, csb) = b.strides();
    // SAFETY: A is m×k and B is k×n inside their slices with the strides above (a transposed
    // operand holds cols×rows row-major, the same element count); C holds m×n row-major; the
    // slices are distinct borrows (C is &mut), so they do not overlap.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            rsa,
            csa,
            b.data.as_ptr(),
            rsb,
            csb,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Transposes a row-major `rows × cols` matrix.
pub(crate) fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = x[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(got: &[f32], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((f64::from(g) - w).abs() <= tol * (1.0 + w.abs()), "element {i}: got {g}, want {w}");
        }
    }

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0).collect()
    }

    #[test]
    fn binary_broadcasts_size_one_dimensions_like_an_f64_reference() {
        // a: [3, 2] (FCD first: 3 columns, 2 rows), b: [1, 2] (one value per row), and a scalar.
        let a = vals(6, 1);
        let b = vec![10.0, -20.0];
        for op in [Binary::Add, Binary::Sub, Binary::Mult, Binary::Max, Binary::Min, Binary::Div] {
            let got = binary(op, &a, &[3, 2], &b, &[1, 2], &[3, 2]);
            let want: Vec<f64> = (0..6)
                .map(|i| {
                    let (x, y) = (f64::from(a[i]), f64::from(b[i / 3]));
                    match op {
                        Binary::Add => x + y,
                        Binary::Sub => x - y,
                        Binary::Mult => x * y,
                        Binary::Max => x.max(y),
                        Binary::Min => x.min(y),
                        Binary::Div => x / y,
                    }
                })
                .collect();
            close(&got, &want, 1e-6);
            // Broadcasting the first operand: b - a is not a - b.
            let got = binary(op, &b, &[1, 2], &a, &[3, 2], &[3, 2]);
            if op == Binary::Sub {
                close(&got, &want.iter().map(|v| -v).collect::<Vec<_>>(), 1e-6);
            }
        }
        let s = binary(Binary::Mult, &a, &[3, 2], &[0.5], &[1], &[3, 2]);
        close(&s, &a.iter().map(|&v| f64::from(v) * 0.5).collect::<Vec<_>>(), 1e-7);
        assert_eq!(broadcast_shape(&[3, 2], &[1, 2]), Some(vec![3, 2]));
        assert_eq!(broadcast_shape(&[3, 2], &[2, 2]), None);
        assert!(binary(Binary::Max, &[f32::NAN], &[1], &[1.0], &[1], &[1])[0].is_nan());
    }

    #[test]
    fn relu_backward_takes_grad_then_x() {
        let x = [-1.0, 0.5, 2.0, 0.0];
        let g = [10.0, 20.0, 30.0, 40.0];
        assert_eq!(relu(&x, 0.0), vec![0.0, 0.5, 2.0, 0.0]);
        assert_eq!(relu_bwd(&g, &x, 0.0), vec![0.0, 20.0, 30.0, 0.0]);
        // Swapping the inputs gives a different (wrong) answer: the trap is observable.
        assert_ne!(relu_bwd(&x, &g, 0.0), relu_bwd(&g, &x, 0.0));
        assert_eq!(relu(&x, 1.0), vec![0.0, 0.0, 2.0, 0.0]);
    }

    fn softmax_ref(x: &[f64]) -> Vec<f64> {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
        x.iter().map(|v| (v - m).exp() / s).collect()
    }

    #[test]
    fn softmax_family_matches_f64_along_either_dimension() {
        let x = vals(12, 7); // [4, 3] FCD first: 3 rows of 4
        let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let mut want = Vec::new();
        for r in 0..3 {
            want.extend(softmax_ref(&x64[r * 4..r * 4 + 4]));
        }
        close(&softmax(&x, &[4, 3], 0), &want, 1e-6);
        let want_log: Vec<f64> = want.iter().map(|v| v.ln()).collect();
        close(&log_softmax(&x, &[4, 3], 0), &want_log, 1e-6);
        // Along dim 1 (the slow one): columns.
        let got = softmax(&x, &[4, 3], 1);
        for c in 0..4 {
            let col: Vec<f64> = (0..3).map(|r| x64[r * 4 + c]).collect();
            let w = softmax_ref(&col);
            for r in 0..3 {
                assert!((f64::from(got[r * 4 + c]) - w[r]).abs() < 1e-6);
            }
        }
        // Backward takes (y, dy): dx = y (dy - <dy, y>).
        let y = softmax(&x, &[4, 3], 0);
        let dy = vals(12, 99);
        let mut want = Vec::new();
        for r in 0..3 {
            let ys: Vec<f64> = (0..4).map(|k| f64::from(y[r * 4 + k])).collect();
            let ds: Vec<f64> = (0..4).map(|k| f64::from(dy[r * 4 + k])).collect();
            let dot: f64 = ys.iter().zip(&ds).map(|(a, b)| a * b).sum();
            want.extend(ys.iter().zip(&ds).map(|(y, d)| y * (d - dot)));
        }
        close(&softmax_bwd(&y, &dy, &[4, 3], 0), &want, 1e-5);
        let swapped = softmax_bwd(&dy, &y, &[4, 3], 0);
        assert!(swapped.iter().zip(&want).any(|(&g, &w)| (f64::from(g) - w).abs() > 1e-3), "order matters");
    }

    #[test]
    fn cross_entropy_forward_and_backward_match_f64() {
        let (c, b) = (5usize, 3usize);
        let logits = vals(c * b, 3);
        let labels = [4.0, 0.0, 2.0];
        let mut per = Vec::new();
        let mut grad = Vec::new();
        for s in 0..b {
            let row: Vec<f64> = (0..c).map(|k| f64::from(logits[s * c + k])).collect();
            let p = softmax_ref(&row);
            per.push(-p[labels[s] as usize].ln());
            grad.extend((0..c).map(|k| (p[k] - if k == labels[s] as usize { 1.0 } else { 0.0 }) / b as f64));
        }
        let (loss, ls) = softmax_ce_fwd(&logits, &labels, c, b, CeMode::Mean, b as i32).unwrap();
        close(&loss, &[per.iter().sum::<f64>() / b as f64], 1e-6);
        let (sum, _) = softmax_ce_fwd(&logits, &labels, c, b, CeMode::Sum, 0).unwrap();
        close(&sum, &[per.iter().sum::<f64>()], 1e-6);
        let (none, _) = softmax_ce_fwd(&logits, &labels, c, b, CeMode::None, 0).unwrap();
        close(&none, &per, 1e-6);
        close(&softmax_ce_bwd(&ls, &labels, c, b, CeMode::Mean, b as i32).unwrap(), &grad, 1e-5);
        let e = softmax_ce_fwd(&logits, &[5.0, 0.0, 0.0], c, b, CeMode::Sum, 0).unwrap_err();
        assert!(e.contains("label 5 of sample 0"), "{e}");
    }

    #[test]
    fn reduce_sum_over_masks_matches_f64() {
        let x = vals(24, 5); // [4, 3, 2]
        let at = |i: usize, j: usize, k: usize| f64::from(x[(k * 3 + j) * 4 + i]);
        let d0: Vec<f64> =
            (0..2).flat_map(|k| (0..3).map(move |j| (k, j))).map(|(k, j)| (0..4).map(|i| at(i, j, k)).sum()).collect();
        close(&reduce_sum(&x, &[4, 3, 2], 1), &d0, 1e-6);
        let d1: Vec<f64> =
            (0..2).flat_map(|k| (0..4).map(move |i| (k, i))).map(|(k, i)| (0..3).map(|j| at(i, j, k)).sum()).collect();
        close(&reduce_sum(&x, &[4, 3, 2], 2), &d1, 1e-6);
        let all: f64 = x.iter().map(|&v| f64::from(v)).sum();
        close(&reduce_sum(&x, &[4, 3, 2], 0b111), &[all], 1e-6);
        assert_eq!(isfinite(&[1.0, f32::NAN, f32::INFINITY, -0.0]), vec![1.0, 0.0, 0.0, 1.0]);
    }

    proptest! {
        #[test]
        fn matmul_with_any_transposes_matches_f64(m in 1usize..6, k in 1usize..6, n in 1usize..6, ta: bool, tb: bool, seed: u32) {
            let a = vals(m * k, seed);
            let b = vals(k * n, seed ^ 0xabc);
            let ga = |i: usize, j: usize| f64::from(if ta { a[j * m + i] } else { a[i * k + j] });
            let gb = |i: usize, j: usize| f64::from(if tb { b[j * k + i] } else { b[i * n + j] });
            let mut c = vec![0f32; m * n];
            matmul(Mat { data: &a, rows: m, cols: k, trans: ta }, Mat { data: &b, rows: k, cols: n, trans: tb }, &mut c);
            for i in 0..m {
                for j in 0..n {
                    let w: f64 = (0..k).map(|p| ga(i, p) * gb(p, j)).sum();
                    prop_assert!((f64::from(c[i * n + j]) - w).abs() < 1e-4, "({i},{j}) {} vs {w}", c[i * n + j]);
                }
            }
        }
    }
}

/// The transformer kernels (issue 26) against f64 references and finite differences.
#[cfg(test)]
pub(super) mod transformer_tests {
    use super::*;
    use proptest::prelude::*;

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        scaled_vals(n, seed, 2.0)
    }

    /// `n` test values in [-amp, amp) from a xorshift stream keyed by `seed` (no two
    /// neighbours repeat a pattern); the kernel tests' and the attention block's one source.
    pub(in crate::graph) fn scaled_vals(n: usize, seed: u32, amp: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                ((s % 4000) as f32 / 1000.0 - 2.0) * (amp / 2.0)
            })
            .collect()
    }

    /// f64 layer norm of rows of `c`: (y, mean, istd).
    fn ln64(x: &[f64], c: usize, beta: &[f64], gamma: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (mut y, mut mean, mut istd) = (Vec::new(), Vec::new(), Vec::new());
        for row in x.chunks(c) {
            let m = row.iter().sum::<f64>() / c as f64;
            let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / c as f64;
            let is = 1.0 / (v + eps).sqrt();
            y.extend(row.iter().enumerate().map(|(k, a)| (a - m) * is * gamma[k] + beta[k]));
            mean.push(m);
            istd.push(is);
        }
        (y, mean, istd)
    }

    fn f64s(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&a| f64::from(a)).collect()
    }

    /// Max |got - want| over max(1, |want|), elementwise.
    fn rel_err(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(1.0)).fold(0.0, f64::max)
    }

    /// Central difference of `f` with respect to every element of `at`.
    fn numeric_grad(at: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        let h = 1e-6;
        (0..at.len())
            .map(|k| {
                let (mut p, mut m) = (at.to_vec(), at.to_vec());
                p[k] += h;
                m[k] -= h;
                (f(&p) - f(&m)) / (2.0 * h)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn layer_norm_matches_f64_and_its_backward_matches_finite_differences(
            c in 4usize..10, rows in 1usize..5, seed: u32, eps_exp in 3i32..7,
        ) {
            let eps = 10f32.powi(-eps_exp);
            let x = vals(c * rows, seed);
            let (beta, gamma) = (vals(c, seed ^ 1), vals(c, seed ^ 2));
            let dy = vals(c * rows, seed ^ 3);
            let (y, mean, istd) = layer_norm(&x, c, &beta, &gamma, eps);
            let (x64, b64, g64, dy64) = (f64s(&x), f64s(&beta), f64s(&gamma), f64s(&dy));
            let (wy, wm, wi) = ln64(&x64, c, &b64, &g64, f64::from(eps));
            prop_assert!(rel_err(&y, &wy) < 1e-5, "y {}", rel_err(&y, &wy));
            prop_assert!(rel_err(&mean, &wm) < 1e-6);
            prop_assert!(rel_err(&istd, &wi) < 1e-5);
            // The loss <y, dy>: its gradients by central differences of the f64 forward.
            let loss = |x: &[f64], b: &[f64], g: &[f64]| {
                ln64(x, c, b, g, f64::from(eps)).0.iter().zip(&dy64).map(|(a, d)| a * d).sum::<f64>()
            };
            let ndx = numeric_grad(&x64, |x| loss(x, &b64, &g64));
            let ndb = numeric_grad(&b64, |b| loss(&x64, b, &g64));
            let ndg = numeric_grad(&g64, |g| loss(&x64, &b64, g));
            let (dx, dbeta, dgamma) = layer_norm_bwd(&x, &dy, &mean, &istd, &gamma, c);
            // dx is a difference of nearly equal terms times istd (up to 1/sqrt(eps)): scale
            // the tolerance by it.
            let scale = wi.iter().cloned().fold(1.0, f64::max);
            prop_assert!(rel_err(&dx, &ndx) < 2e-5 * scale, "dx {} (istd {scale})", rel_err(&dx, &ndx));
            prop_assert!(rel_err(&dbeta, &ndb) < 1e-5, "dbeta {}", rel_err(&dbeta, &ndb));
            prop_assert!(rel_err(&dgamma, &ndg) < 1e-4, "dgamma {}", rel_err(&dgamma, &ndg));
            // The input-order trap: (dy, x, ...) instead of (x, dy, ...) is a different answer.
            let (sx, _, _) = layer_norm_bwd(&dy, &x, &mean, &istd, &gamma, c);
            prop_assert!(rel_err(&sx, &ndx) > 1e-3, "swapped inputs gave the right dx");
        }

        #[test]
        fn transpose_matches_the_index_definition(dims in proptest::collection::vec(1u64..5, 1..6), seed: u32, rot in 0usize..5) {
            let n = numel(&dims);
            let x = vals(n, seed);
            // A permutation: reverse, then rotate (covers identity-free and cyclic cases).
            let r = dims.len();
            let perm: Vec<usize> = (0..r).map(|i| (r - 1 - i + rot) % r).collect();
            let out = transpose_nd(&x, &dims, &perm);
            let out_sizes: Vec<u64> = perm.iter().map(|&p| dims[p]).collect();
            let ins = strides(&dims);
            let os = strides(&out_sizes);
            // Every output index o reads input index i with i[perm[k]] = o[k].
            for (flat, &v) in out.iter().enumerate() {
                let mut at = 0;
                for k in 0..r {
                    let ok = (flat / os[k]) % out_sizes[k] as usize;
                    at += ok * ins[perm[k]];
                }
                prop_assert_eq!(v, x[at]);
            }
            // The inverse permutation restores x.
            let mut inv = vec![0; r];
            for (k, &p) in perm.iter().enumerate() {
                inv[p] = k;
            }
            prop_assert_eq!(transpose_nd(&out, &out_sizes, &inv), x);
        }
    }

    #[test]
    fn transpose_agrees_with_the_vendor_example_and_the_2d_transpose() {
        // G3's worked example: sizes {96,7,8,7,512}, permutation {0,1,3,2,4} -> {96,7,7,8,512};
        // a smaller tensor of the same pattern keeps the test fast.
        let sizes = [3u64, 2, 4, 5, 2];
        let perm = [0usize, 1, 3, 2, 4];
        let x = vals(numel(&sizes), 9);
        let y = transpose_nd(&x, &sizes, &perm);
        let out_sizes: Vec<u64> = perm.iter().map(|&p| sizes[p]).collect();
        assert_eq!(out_sizes, vec![3, 2, 5, 4, 2]);
        let at = |s: &[u64], i: [usize; 5]| {
            i[0] + s[0] as usize * (i[1] + s[1] as usize * (i[2] + s[2] as usize * (i[3] + s[3] as usize * i[4])))
        };
        assert_eq!(y[at(&out_sizes, [2, 1, 4, 3, 1])], x[at(&sizes, [2, 1, 3, 4, 1])]);
        // [1, 0] on FCD-first [cols, rows] is the row-major matrix transpose.
        let m = vals(12, 4);
        assert_eq!(transpose_nd(&m, &[4, 3], &[1, 0]), transpose(&m, 3, 4));
    }

    #[test]
    fn gelu_matches_known_values_and_its_backward_matches_finite_differences() {
        // x·Φ(x) at points where Φ is tabulated: Φ(1) = 0.841344746068543,
        // Φ(-0.5) = 0.308537538725987, Φ(2) = 0.977249868051821.
        let y = gelu(&[1.0, -0.5, 2.0, 0.0], false);
        let want = [0.841_344_746_068_543, -0.5 * 0.308_537_538_725_987, 2.0 * 0.977_249_868_051_821, 0.0];
        assert!(rel_err(&y, &want) < 1e-7, "{y:?}");
        let t = gelu(&[1.0], true);
        let w = 0.5 * (1.0 + (0.797_884_560_802_865_4f64 * 1.044_715).tanh());
        assert!((f64::from(t[0]) - w).abs() < 1e-7);
        // The two forms differ (by up to about 1e-3): the flag is observable.
        assert_ne!(gelu(&[1.5], true), gelu(&[1.5], false));
        let x = vals(64, 5);
        let grad = vals(64, 6);
        for tanh in [false, true] {
            let f = |v: f64| {
                if tanh {
                    0.5 * v * (1.0 + (0.797_884_560_802_865_4 * (v + 0.044_715 * v * v * v)).tanh())
                } else {
                    0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))
                }
            };
            let want: Vec<f64> = x
                .iter()
                .zip(&grad)
                .map(|(&v, &g)| f64::from(g) * (f(f64::from(v) + 1e-6) - f(f64::from(v) - 1e-6)) / 2e-6)
                .collect();
            let got = gelu_bwd(&grad, &x, tanh);
            assert!(rel_err(&got, &want) < 1e-6, "tanh {tanh}: {}", rel_err(&got, &want));
            assert!(rel_err(&gelu_bwd(&x, &grad, tanh), &want) > 1e-2, "swapped (x, grad) gave the right answer");
        }
    }

    #[test]
    fn embedding_gathers_rows_and_its_backward_is_the_adjoint() {
        let (d, rows) = (3usize, 5usize);
        let w = vals(d * rows, 11);
        let idx = [4.0f32, 0.0, 4.0, 2.0, 1.0, 4.0];
        let out = embedding(&w, d, rows, &idx).unwrap();
        for (t, &r) in idx.iter().enumerate() {
            assert_eq!(&out[t * d..(t + 1) * d], &w[r as usize * d..(r as usize + 1) * d]);
        }
        let g = vals(d * idx.len(), 12);
        let dw = embedding_bwd(&g, &idx, d, rows, -1).unwrap();
        // f64 scatter-add reference; row 3 is never used and stays zero.
        let mut want = vec![0f64; d * rows];
        for (t, &r) in idx.iter().enumerate() {
            for k in 0..d {
                want[r as usize * d + k] += f64::from(g[t * d + k]);
            }
        }
        assert!(rel_err(&dw, &want) < 1e-6);
        assert!(dw[3 * d..4 * d].iter().all(|&v| v == 0.0));
        // Adjoint: <embedding(W), G> = <W, embedding_bwd(G)> for any W and G.
        let lhs: f64 = out.iter().zip(&g).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
        let rhs: f64 = w.iter().zip(&dw).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
        assert!((lhs - rhs).abs() < 1e-5 * (1.0 + lhs.abs()), "{lhs} vs {rhs}");
        // padding_idx 4: that row gets no gradient, the others are unchanged.
        let dp = embedding_bwd(&g, &idx, d, rows, 4).unwrap();
        assert!(dp[4 * d..].iter().all(|&v| v == 0.0));
        assert_eq!(&dp[..4 * d], &dw[..4 * d]);
        let e = embedding(&w, d, rows, &[1.0, 5.0]).unwrap_err();
        assert!(e.contains("index 5 of token 1"), "{e}");
        assert!(embedding_bwd(&g[..d], &[-1.0], d, rows, -1).is_err());
    }
}
