//! A bounds-checked safe wrapper over `matrixmultiply::sgemm` (the crate's only raw-pointer
//! API), so that [`super::mlp`] can `forbid(unsafe_code)`.
//!
//! Owns: [`Mat`] (a strided read-only matrix view) and [`gemm`]. Must not touch: anything
//! model-specific. Determinism: matrixmultiply is built without its `threading` feature, so a
//! product is computed by one thread in a fixed order; its kernel is chosen once per process from
//! the CPU's features (FMA or not), so results are bitwise reproducible on one machine.

/// A read-only `rows x cols` matrix whose element (r, c) is `data[r * rs + c * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major `rows x cols` view of `data` (which must hold at least `rows * cols`).
    pub(crate) fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self { data, rows, cols, rs: cols, cs: 1 }
    }

    /// The transpose (no copy).
    pub(crate) fn t(self) -> Self {
        Self { data: self.data, rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }

    /// True when every element index is inside `data`.
    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1)
                .checked_mul(self.rs)
                .and_then(|r| (self.cols - 1).checked_mul(self.cs).and_then(|c| r.checked_add(c)))
                .is_some_and(|last| last < self.data.len())
    }
}

/// `c = alpha * a * b + beta * c` with `c` row-major `a.rows x b.cols` (when `beta == 0`, `c`'s
/// old contents, NaN included, are ignored).
///
/// # Panics
/// When the shapes disagree or a view is out of bounds: callers validate sizes first, so a panic
/// here is a bug in the caller, never a reaction to user input.
pub(crate) fn gemm(alpha: f32, a: Mat<'_>, b: Mat<'_>, beta: f32, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        b.rows == k && c.len() == m * n && a.in_bounds() && b.in_bounds(),
        "gemm shape mismatch: a {m}x{k}, b {}x{n}, c {}",
        b.rows,
        c.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.iter_mut().for_each(|v| *v = if beta == 0.0 { 0.0 } else { beta * *v });
        return;
    }
    // Strides are < len <= isize::MAX (a slice never exceeds isize::MAX bytes).
    let s = |x: usize| x as isize;
    // SAFETY: every element a[r*rs + c*cs] for r < m, c < k is inside `a.data` (in_bounds), the
    // same for `b`; `c` is an exclusive row-major m x n slice (stride n, 1: no aliasing between
    // elements) and does not alias `a` or `b` (shared borrows vs. an exclusive borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            s(a.rs),
            s(a.cs),
            b.data.as_ptr(),
            s(b.rs),
            s(b.cs),
            beta,
            c.as_mut_ptr(),
            s(n),
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 reference product of row-major a (m x k, maybe transposed view) and b.
    fn reference(a: &Mat<'_>, b: &Mat<'_>) -> Vec<f64> {
        let get = |x: &Mat<'_>, r: usize, c: usize| f64::from(x.data[r * x.rs + c * x.cs]);
        let mut out = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                out[i * b.cols + j] = (0..a.cols).map(|p| get(a, i, p) * get(b, p, j)).sum();
            }
        }
        out
    }

    #[test]
    fn transposed_products_match_f64_reference() {
        let x: Vec<f32> = (0..15).map(|i| (i as f32 * 0.7).sin()).collect(); // 3x5 or 5x3
        let y: Vec<f32> = (0..20).map(|i| (i as f32 * 0.3).cos()).collect(); // 5x4 or 4x5
        let cases = [
            (Mat::row_major(&x, 3, 5), Mat::row_major(&y, 5, 4)),
            (Mat::row_major(&x, 5, 3).t(), Mat::row_major(&y, 4, 5).t()),
        ];
        for (a, b) in cases {
            let mut c = vec![f32::NAN; a.rows * b.cols];
            gemm(1.0, a, b, 0.0, &mut c);
            let want = reference(&a, &b);
            for (got, want) in c.iter().zip(&want) {
                assert!((f64::from(*got) - want).abs() < 1e-5 * (1.0 + want.abs()), "{got} vs {want}");
            }
            // beta = 1 accumulates.
            let before = c.clone();
            gemm(2.0, a, b, 1.0, &mut c);
            for ((got, b0), want) in c.iter().zip(&before).zip(&want) {
                assert!((f64::from(*got) - (f64::from(*b0) + 2.0 * want)).abs() < 1e-5 * (1.0 + want.abs()));
            }
        }
    }

    #[test]
    #[should_panic(expected = "gemm shape mismatch")]
    fn out_of_bounds_view_is_refused() {
        let x = [1.0f32; 5];
        let mut c = [0.0f32; 4];
        gemm(1.0, Mat::row_major(&x, 2, 3), Mat::row_major(&x, 3, 2), 0.0, &mut c);
    }
}
