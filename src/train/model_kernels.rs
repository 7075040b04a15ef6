//! The `dropcompute train` model as mock recipe kernels: one micro-batch forward+backward of the
//! MLP and one SGD-with-momentum step, so a rank's device work runs on the mock device exactly
//! as the host functions of [`crate::train::mlp`] compute it (bit for bit: the kernels are
//! shims over those functions).
//!
//! Kernels (tensor order = recipe order; params are the recipe's f64 scalars):
//! - `mlp_fwd_bwd_f32`: tensors [`MLP_TENSORS`] = `[params f32 (P), x f32 (b * input),
//!   labels i32 (b, -1 = padding), grad f32 (P), loss f32 (2)]`, params `[input, hidden,
//!   classes]`. `b` is derived from the size of `x`. `grad` is OVERWRITTEN with the summed
//!   gradient of the micro-batch; `loss` is ACCUMULATED: `loss[0] += loss_sum`,
//!   `loss[1] += valid_rows` (both f32; the row count is exact below 2^24), so one loss tensor
//!   collects a whole step and is all-reduced with the gradient.
//! - `sgd_momentum_f32`: tensors [`SGD_TENSORS`] = `[params (P), velocity (P), grad (P)]`,
//!   params `[lr, momentum, weight_decay]`, in place on params and velocity
//!   ([`crate::train::mlp::sgd_momentum`]).
//!
//! Any inconsistency (tensor count, sizes not matching the shape, misalignment, an output
//! overlapping another tensor, a label outside -1..classes, non-integral or non-positive shape
//! params) returns synInvalidArgument, which the mock records as the stream's sticky
//! asynchronous error; no tensor is written then.
//!
//! Layering: the training job ships these kernels and registers them with the mock from the top
//! ([`register`], through `habana_mock::register_rust_kernel`, safe Rust over checked tensor
//! views), as a Gaudi user ships TPC kernels; the mock knows nothing of the model.
//! Must not touch: anything but the tensors given.

use std::cell::RefCell;

use crate::mock::{KernelCall, MockControlError, MockRecipe, register_rust_kernel};
use crate::train::mlp::{self, MlpScratch, MlpShape};

/// Names of the model kernels registered with every mock.
pub const MODEL_KERNELS: [&str; 2] = ["mlp_fwd_bwd_f32", "sgd_momentum_f32"];
/// Tensor names of [`mlp_recipe`], in kernel order.
pub const MLP_TENSORS: [&str; 5] = ["params", "x", "labels", "grad", "loss"];
/// Tensor names of [`sgd_recipe`], in kernel order.
pub const SGD_TENSORS: [&str; 3] = ["params", "velocity", "grad"];
/// Largest accepted shape parameter (a recipe asking for more is rejected, not allocated).
const MAX_DIM: f64 = (1u64 << 24) as f64;

thread_local! {
    /// Work buffers of the stream worker running the kernel (each stream has its own thread).
    static SCRATCH: RefCell<MlpScratch> = RefCell::new(MlpScratch::default());
}

/// The shape from recipe params `[input, hidden, classes]`: exactly three positive integers.
fn shape_of(params: &[f64]) -> Option<MlpShape> {
    let dim = |v: f64| (v.fract() == 0.0 && (1.0..=MAX_DIM).contains(&v)).then_some(v as usize);
    match params {
        [i, h, c] => Some(MlpShape { input: dim(*i)?, hidden: dim(*h)?, classes: dim(*c)? }),
        _ => None,
    }
}

/// `mlp_fwd_bwd_f32`: see the module docs. Inputs may alias each other; `grad` and `loss` are
/// handed out only when they overlap no other tensor.
fn mlp_fwd_bwd_f32(t: &KernelCall<'_>) -> Option<()> {
    (t.len() == 5).then_some(())?;
    let shape = shape_of(t.params())?;
    let (params, x, labels) = (t.input::<f32>(0)?, t.input::<f32>(1)?, t.input::<i32>(2)?);
    let (grad, loss) = (t.output::<f32>(3)?, t.output::<f32>(4)?);
    (loss.len() == 2).then_some(())?;
    let (sum, rows) = SCRATCH.with_borrow_mut(|s| mlp::forward_backward(shape, params, x, labels, grad, s)).ok()?;
    loss[0] += sum as f32;
    loss[1] += rows as f32;
    Some(())
}

/// `sgd_momentum_f32`: see the module docs; params and velocity are updated in place.
fn sgd_momentum_f32(t: &KernelCall<'_>) -> Option<()> {
    (t.len() == 3).then_some(())?;
    let [lr, momentum, wd] = *t.params() else { return None };
    let (p, v, g) = (t.output::<f32>(0)?, t.output::<f32>(1)?, t.input::<f32>(2)?);
    mlp::sgd_momentum(p, v, g, lr as f32, momentum as f32, wd as f32).ok()
}

/// The forward+backward recipe of one micro-batch of `micro_batch_size` rows (tensor sizes in
/// bytes: params and grad `4 * param_len`, x `4 * b * input`, labels `4 * b`, loss 8), named
/// `mlp_fwd_bwd_{input}x{hidden}x{classes}_b{b}`, with the mock's base latency
/// `base_latency_ns` (ns per launch, before noise and slowdown). Bind by [`MLP_TENSORS`] names.
pub fn mlp_recipe(shape: MlpShape, micro_batch_size: usize, base_latency_ns: u64) -> MockRecipe {
    let MlpShape { input, hidden, classes } = shape;
    let p = shape.param_len() as u64 * 4;
    let b = micro_batch_size as u64;
    let [tp, tx, ty, tg, tl] = MLP_TENSORS;
    MockRecipe::new(format!("mlp_fwd_bwd_{input}x{hidden}x{classes}_b{b}"), MODEL_KERNELS[0])
        .tensor(tp, p)
        .tensor(tx, 4 * b * input as u64)
        .tensor(ty, 4 * b)
        .tensor(tg, p)
        .tensor(tl, 8)
        .params([input as f64, hidden as f64, classes as f64])
        .base_latency_ns(base_latency_ns)
}

/// The optimizer-step recipe over `param_len` f32 parameters: `lr`, `momentum` and
/// `weight_decay` are stored as recipe params (f32 values are exact in f64, so the kernel uses
/// exactly these). Latency 0 (the step is not part of the timed compute). Bind by
/// [`SGD_TENSORS`] names.
pub fn sgd_recipe(param_len: usize, lr: f32, momentum: f32, weight_decay: f32) -> MockRecipe {
    let bytes = param_len as u64 * 4;
    let [tp, tv, tg] = SGD_TENSORS;
    MockRecipe::new(format!("sgd_momentum_{param_len}"), MODEL_KERNELS[1])
        .tensor(tp, bytes)
        .tensor(tv, bytes)
        .tensor(tg, bytes)
        .params([f64::from(lr), f64::from(momentum), f64::from(weight_decay)])
}

/// Registers [`MODEL_KERNELS`] with the in-process mock (idempotent). Call before loading a
/// recipe of [`mlp_recipe`] or [`sgd_recipe`].
///
/// # Errors
/// [`MockControlError`] if the mock rejects a registration (never for these fixed names).
pub fn register() -> Result<(), MockControlError> {
    register_rust_kernel(MODEL_KERNELS[0], mlp_fwd_bwd_f32)?;
    register_rust_kernel(MODEL_KERNELS[1], sgd_momentum_f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_params_must_be_three_positive_integers() {
        assert_eq!(shape_of(&[64.0, 32.0, 10.0]), Some(MlpShape { input: 64, hidden: 32, classes: 10 }));
        for bad in [
            &[64.0, 32.0][..],
            &[64.0, 32.0, 10.0, 1.0],
            &[64.5, 32.0, 10.0],
            &[0.0, 1.0, 2.0],
            &[-1.0, 1.0, 2.0],
            &[1e300, 1.0, 2.0],
            &[f64::NAN, 1.0, 2.0],
        ] {
            assert_eq!(shape_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn recipes_have_the_documented_sizes() {
        let shape = MlpShape { input: 64, hidden: 32, classes: 10 };
        let r = mlp_recipe(shape, 16, 5000);
        let sizes: Vec<u64> = r.tensors.iter().map(|t| t.bytes).collect();
        let p = 4 * (65 * 32 + 33 * 10);
        assert_eq!(sizes, vec![p, 4 * 16 * 64, 64, p, 8]);
        assert_eq!((r.params.as_slice(), r.latency.base_ns), (&[64.0, 32.0, 10.0][..], 5000));
        let s = sgd_recipe(100, 0.1, 0.9, 1e-4);
        assert_eq!(s.params, vec![f64::from(0.1f32), f64::from(0.9f32), f64::from(1e-4f32)]);
        assert!(s.tensors.iter().all(|t| t.bytes == 400));
        r.validate(std::path::Path::new("")).unwrap();
        s.validate(std::path::Path::new("")).unwrap();
    }
}
