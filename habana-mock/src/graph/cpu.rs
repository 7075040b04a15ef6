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
        }
    }
}

/// `out = op(a, b)` with size-1 dimensions of either input broadcast to `out_sizes`.
pub(crate) fn binary(op: Binary, a: &[f32], sa: &[u64], b: &[f32], sb: &[u64], out_sizes: &[u64]) -> Vec<f32> {
    let n = numel(out_sizes);
    if sa == out_sizes && sb == out_sizes {
        return a.iter().zip(b).map(|(&x, &y)| op.apply(x, y)).collect();
    }
    let bstride = |s: &[u64]| -> Vec<usize> {
        let st = strides(s);
        (0..out_sizes.len()).map(|i| if s.get(i).copied().unwrap_or(1) == 1 { 0 } else { st[i] }).collect()
    };
    let (ta, tb) = (bstride(sa), bstride(sb));
    let mut idx = vec![0u64; out_sizes.len()];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let ia: usize = idx.iter().zip(&ta).map(|(&i, &s)| i as usize * s).sum();
        let ib: usize = idx.iter().zip(&tb).map(|(&i, &s)| i as usize * s).sum();
        out.push(op.apply(a[ia], b[ib]));
        for (d, i) in idx.iter_mut().enumerate() {
            *i += 1;
            if *i < out_sizes[d] {
                break;
            }
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
        for op in [Binary::Add, Binary::Sub, Binary::Mult, Binary::Max, Binary::Min] {
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
