//! The `dropcompute train` model as device graphs built with [`dropcompute::synapse::graph`]: one
//! micro-batch's forward, loss and backward of the MLP of [`crate::mlp`], and one SGD
//! step with momentum. Compiled once per job for the device's type; they run wherever the
//! graph API runs (the CPU mock here; libSynapse with the vendor's kernels, not verified here).
//!
//! Owns: [`MlpGraphs`] (both graphs, their tensors, one workspace, and their launches),
//! [`forward_backward_recipe_name`] (the recipe name the mock's per-recipe base latency and the
//! common random numbers are keyed by) and [`stage_labels`] (padding rows as a mask).
//! Must not touch: the host math of [`crate::mlp`] (the reference these graphs are
//! tested against), the scheduler, or the mock (no mock-only call: the emulated latency of a
//! launch is the mock's configuration, `crate::job::Job::mock_config`).
//!
//! # Forward/backward graph (row-major shapes; b rows, layout of [`MlpShape`])
//! Persistent: the parameters as four tensors of one section at their flat offsets (`W1`
//! `[input, hidden]`, `b1 [hidden]`, `W2 [hidden, classes]`, `b2 [classes]`); `x [b, input]`;
//! `labels i32 [b]` and `mask [b, 1]` (1 for a sample, 0 for a padding row, whose label is
//! staged as 0 and whose features must be finite: `Dataset::rows_padded` gives zeros); the
//! gradient as four tensors of one section at the same flat offsets (OVERWRITTEN); the loss
//! accumulator `[loss sum, rows]` as two `[1]` tensors of one section, updated in place
//! (ACCUMULATED, so one buffer collects a whole step and is all-reduced with the gradient).
//! Nodes: `pre = gemm(x, W1) + b1`, `h = relu(pre)`, `z = gemm(h, W2) + b2`,
//! `(loss_b, log_softmax) = softmax_cross_entropy_fwd(z, labels)` without reduction,
//! `dz = softmax_cross_entropy_bwd(log_softmax, labels) · mask` (= (softmax − onehot) per valid
//! row, 0 for padding: the summed, not averaged, gradient; the scheduler divides by the global
//! sample count), `gW2 = gemm_dedw(dz, h)`, `gb2 = Σ_rows dz`, `dh = gemm_dedx(dz, W2)`,
//! `dpre = relu_bwd(dh, pre)` (input order (grad, x)), `gW1 = gemm_dedw(dpre, x)`,
//! `gb1 = Σ_rows dpre`, `loss_sum += Σ loss_b · mask`, `rows += Σ mask`. The gradient equals
//! [`crate::mlp::forward_backward`]'s within f32 rounding (tests/model_graphs.rs).
//!
//! # SGD graph
//! PyTorch's `torch.optim.SGD` (dampening 0, no Nesterov), as [`crate::mlp::sgd_momentum`]:
//! `v' = momentum · v + (g + weight_decay · p)`, `p' = p − lr · v'`, each operation one
//! elementwise node rounded in f32 (the weight-decay nodes only when it is non-zero), with
//! params and velocity updated in place through shared sections and the hyper-parameters
//! `constant_f32` nodes of shape [1] (fixed for a job). Bitwise equal to the host update.

#![forbid(unsafe_code)]

use dropcompute::synapse::graph::{DType, GraphArg, GraphBuilder, GraphRecipe, Op, Reduction, TensorId};
use dropcompute::synapse::{Device, DeviceBuffer, Result, Stream};

use super::mlp::MlpShape;

/// The name of the forward/backward recipe of `shape` with `micro_batch_size` rows:
/// `mlp_fwd_bwd_{input}x{hidden}x{classes}_b{b}`. The mock keys its per-recipe base latency
/// (`MockConfig::graph_base_latency_ns`) and its keyed latency draws (common random numbers)
/// by this name.
pub fn forward_backward_recipe_name(shape: MlpShape, micro_batch_size: usize) -> String {
    let MlpShape { input, hidden, classes } = shape;
    format!("mlp_fwd_bwd_{input}x{hidden}x{classes}_b{micro_batch_size}")
}

/// The labels of a padded micro-batch as the graph takes them: `(labels, mask)`, a padding
/// row (label −1) staged as class 0 with mask 0, every other row unchanged with mask 1.
pub fn stage_labels(labels: &[i32]) -> (Vec<i32>, Vec<f32>) {
    labels.iter().map(|&l| if l < 0 { (0, 0.0) } else { (l, 1.0) }).unzip()
}

/// The four parameter-shaped tensors of a graph, in layout order (`W1`, `b1`, `W2`, `b2`).
type Layers = [TensorId; 4];

/// Tensors of the forward/backward graph bound at each launch.
struct FwdTensors {
    params: Layers,
    x: TensorId,
    labels: TensorId,
    mask: TensorId,
    mask_rows: TensorId,
    grad: Layers,
    /// loss_sum, rows, loss_sum_out, rows_out.
    loss: [TensorId; 4],
}

/// Tensors of the SGD graph: params, params_out, velocity, velocity_out, grad.
struct SgdTensors {
    p: TensorId,
    p_out: TensorId,
    v: TensorId,
    v_out: TensorId,
    g: TensorId,
}

/// The MLP's two compiled graphs and one workspace (both are launched on one stream, in order,
/// so one workspace serves both).
pub struct MlpGraphs {
    shape: MlpShape,
    micro_batch_size: usize,
    fwd: GraphRecipe,
    fwd_t: FwdTensors,
    sgd: GraphRecipe,
    sgd_t: SgdTensors,
    workspace: Option<DeviceBuffer<u8>>,
}

/// Byte offsets of `W1`, `b1`, `W2`, `b2` in the flat f32 vector.
fn layer_offsets(shape: MlpShape) -> [u64; 4] {
    [shape.w1().start, shape.b1().start, shape.w2().start, shape.b2().start].map(|e| 4 * e as u64)
}

/// Row-major shapes of `W1`, `b1`, `W2`, `b2`.
fn layer_shapes(shape: MlpShape) -> [Vec<u64>; 4] {
    let MlpShape { input, hidden, classes } = shape;
    let (i, h, c) = (input as u64, hidden as u64, classes as u64);
    [vec![i, h], vec![h], vec![h, c], vec![c]]
}

/// Four persistent tensors named `{prefix}_{w1,b1,w2,b2}` in one new section at the flat
/// offsets.
fn layers(g: &mut GraphBuilder, prefix: &str, shape: MlpShape) -> Result<Layers> {
    let sec = g.section()?;
    let mut out = Vec::with_capacity(4);
    for ((name, off), dims) in ["w1", "b1", "w2", "b2"].iter().zip(layer_offsets(shape)).zip(layer_shapes(shape)) {
        out.push(g.persistent_in(sec, off, &format!("{prefix}_{name}"), DType::F32, &dims)?);
    }
    Ok([out[0], out[1], out[2], out[3]])
}

fn build_forward_backward(dev: &Device, shape: MlpShape, b: usize) -> Result<(GraphRecipe, FwdTensors)> {
    let f = DType::F32;
    let MlpShape { input, hidden, classes } = shape;
    let (bb, i, h, c) = (b as u64, input as u64, hidden as u64, classes as u64);
    let mut g = GraphBuilder::new(dev.runtime(), dev.info()?.device_type)?;
    let params = layers(&mut g, "params", shape)?;
    let [w1, b1, w2, b2] = params;
    let x = g.persistent("x", f, &[bb, i])?;
    let labels = g.persistent("labels", DType::I32, &[bb])?;
    let msec = g.section()?;
    let mask = g.persistent_in(msec, 0, "mask", f, &[bb, 1])?;
    let mask_rows = g.persistent_in(msec, 0, "mask_rows", f, &[bb])?;
    let grad = layers(&mut g, "grad", shape)?;
    let [gw1, gb1, gw2, gb2] = grad;
    let lsec = g.section()?;
    let loss_sum = g.persistent_in(lsec, 0, "loss_sum", f, &[1])?;
    let rows = g.persistent_in(lsec, 4, "rows", f, &[1])?;
    let loss_sum_out = g.persistent_in(lsec, 0, "loss_sum_out", f, &[1])?;
    let rows_out = g.persistent_in(lsec, 4, "rows_out", f, &[1])?;

    let pre = g.workspace("pre", f, &[bb, h])?;
    let hid = g.workspace("h", f, &[bb, h])?;
    let z = g.workspace("z", f, &[bb, c])?;
    let loss_b = g.workspace("loss_b", f, &[bb])?;
    let log_sm = g.workspace("log_softmax", f, &[bb, c])?;
    let dz_raw = g.workspace("dz_unmasked", f, &[bb, c])?;
    let dz = g.workspace("dz", f, &[bb, c])?;
    let dh = g.workspace("dh", f, &[bb, h])?;
    let dpre = g.workspace("dpre", f, &[bb, h])?;
    let loss_m = g.workspace("loss_masked", f, &[bb])?;
    let loss_mb = g.workspace("loss_micro_batch", f, &[1])?;
    let rows_mb = g.workspace("rows_micro_batch", f, &[1])?;
    let gemm = Op::Gemm { transpose_a: false, transpose_b: false };
    let (dx, dw) =
        (Op::GemmDx { transpose_a: false, transpose_b: false }, Op::GemmDw { transpose_a: false, transpose_b: false });
    let rows_sum = Op::ReduceSumAxes { axes: vec![0], keep_dims: false };
    let all = Op::ReduceSumAxes { axes: vec![], keep_dims: false };
    let none = Reduction::None;
    g.node("fc1", &gemm, &[x, w1, b1], &[pre])?;
    g.node("relu", &Op::Relu, &[pre], &[hid])?;
    g.node("fc2", &gemm, &[hid, w2, b2], &[z])?;
    g.node("cross_entropy", &Op::SoftmaxCrossEntropy { reduction: none }, &[z, labels], &[loss_b, log_sm])?;
    g.node("cross_entropy_bwd", &Op::SoftmaxCrossEntropyBackward { reduction: none }, &[log_sm, labels], &[dz_raw])?;
    g.node("mask_padding", &Op::Mul, &[dz_raw, mask], &[dz])?;
    g.node("fc2_dw", &dw, &[dz, hid], &[gw2])?;
    g.node("fc2_db", &rows_sum, &[dz], &[gb2])?;
    g.node("fc2_dx", &dx, &[dz, w2], &[dh])?;
    g.node("relu_bwd", &Op::ReluBackward, &[dh, pre], &[dpre])?;
    g.node("fc1_dw", &dw, &[dpre, x], &[gw1])?;
    g.node("fc1_db", &rows_sum, &[dpre], &[gb1])?;
    g.node("loss_mask", &Op::Mul, &[loss_b, mask_rows], &[loss_m])?;
    g.node("loss_sum", &all, &[loss_m], &[loss_mb])?;
    g.node("loss_accumulate", &Op::Add, &[loss_sum, loss_mb], &[loss_sum_out])?;
    g.node("rows_sum", &all, &[mask_rows], &[rows_mb])?;
    g.node("rows_accumulate", &Op::Add, &[rows, rows_mb], &[rows_out])?;
    let recipe = g.compile(&forward_backward_recipe_name(shape, b))?;
    let t = FwdTensors { params, x, labels, mask, mask_rows, grad, loss: [loss_sum, rows, loss_sum_out, rows_out] };
    Ok((recipe, t))
}

fn build_sgd(dev: &Device, len: usize, lr: f32, momentum: f32, weight_decay: f32) -> Result<(GraphRecipe, SgdTensors)> {
    let f = DType::F32;
    let n = [len as u64];
    let mut g = GraphBuilder::new(dev.runtime(), dev.info()?.device_type)?;
    let (ps, vs) = (g.section()?, g.section()?);
    let p = g.persistent_in(ps, 0, "params", f, &n)?;
    let p_out = g.persistent_in(ps, 0, "params_out", f, &n)?;
    let v = g.persistent_in(vs, 0, "velocity", f, &n)?;
    let v_out = g.persistent_in(vs, 0, "velocity_out", f, &n)?;
    let grad = g.persistent("grad", f, &n)?;
    fn scalar(g: &mut GraphBuilder, name: &str, value: f32) -> Result<TensorId> {
        let t = g.workspace(name, DType::F32, &[1])?;
        g.node(name, &Op::Constant { value }, &[], &[t])?;
        Ok(t)
    }
    let c_mom = scalar(&mut g, "momentum", momentum)?;
    let c_lr = scalar(&mut g, "lr", lr)?;
    let mv = g.workspace("momentum_v", f, &n)?;
    g.node("momentum_v", &Op::Mul, &[v, c_mom], &[mv])?;
    let step_grad = if weight_decay != 0.0 {
        let c_wd = scalar(&mut g, "weight_decay", weight_decay)?;
        let (wp, gw) = (g.workspace("decay", f, &n)?, g.workspace("grad_decayed", f, &n)?);
        g.node("decay", &Op::Mul, &[p, c_wd], &[wp])?;
        g.node("grad_decayed", &Op::Add, &[grad, wp], &[gw])?;
        gw
    } else {
        grad
    };
    g.node("velocity_update", &Op::Add, &[mv, step_grad], &[v_out])?;
    let step = g.workspace("lr_v", f, &n)?;
    g.node("lr_v", &Op::Mul, &[v_out, c_lr], &[step])?;
    g.node("params_update", &Op::Sub, &[p, step], &[p_out])?;
    let recipe = g.compile(&format!("sgd_momentum_{len}"))?;
    Ok((recipe, SgdTensors { p, p_out, v, v_out, g: grad }))
}

impl MlpGraphs {
    /// Builds and compiles both graphs for `dev`'s device type and allocates their workspace
    /// on `dev`: the forward/backward of `micro_batch_size` rows of `shape`
    /// ([`forward_backward_recipe_name`]) and SGD with `lr`, `momentum` and `weight_decay`
    /// (recipe `sgd_momentum_{param_len}`).
    ///
    /// # Errors
    /// [`dropcompute::synapse::Error`] from building (a zero dimension), compiling (a runtime without
    /// these GUIDs) or the workspace allocation.
    pub fn build(
        dev: &Device,
        shape: MlpShape,
        micro_batch_size: usize,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    ) -> Result<Self> {
        let (fwd, fwd_t) = build_forward_backward(dev, shape, micro_batch_size)?;
        let (sgd, sgd_t) = build_sgd(dev, shape.param_len(), lr, momentum, weight_decay)?;
        let ws = fwd.workspace_size().max(sgd.workspace_size());
        let workspace = if ws > 0 { Some(DeviceBuffer::alloc(dev, ws as usize)?) } else { None };
        Ok(Self { shape, micro_batch_size, fwd, fwd_t, sgd, sgd_t, workspace })
    }

    /// The compiled forward/backward recipe.
    pub fn forward_backward_recipe(&self) -> &GraphRecipe {
        &self.fwd
    }

    /// The compiled SGD recipe.
    pub fn sgd_recipe(&self) -> &GraphRecipe {
        &self.sgd
    }

    fn bind_layers<'a>(&self, t: &Layers, buf: &'a DeviceBuffer<f32>, out: &mut Vec<GraphArg<'a>>) {
        for (&id, off) in t.iter().zip(layer_offsets(self.shape)) {
            out.push(GraphArg::at(id, buf, off));
        }
    }

    /// Enqueues one micro-batch on `s`: `grad` (param_len f32) ← the summed gradient of the
    /// valid rows, `loss` (2 f32) ← `[loss_sum + Σ loss, rows + valid rows]`. `x` is
    /// `b × input` f32, `labels` and `mask` are [`stage_labels`]'s (b each).
    ///
    /// # Errors
    /// [`dropcompute::synapse::Error`] from the launch: a buffer too small (`SizeMismatch`) or on
    /// another device, before the C call; the runtime's rejection.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_forward_backward(
        &self,
        s: &Stream,
        params: &DeviceBuffer<f32>,
        x: &DeviceBuffer<f32>,
        labels: &DeviceBuffer<i32>,
        mask: &DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
        loss: &DeviceBuffer<f32>,
    ) -> Result<()> {
        let t = &self.fwd_t;
        let mut args = Vec::with_capacity(16);
        self.bind_layers(&t.params, params, &mut args);
        self.bind_layers(&t.grad, grad, &mut args);
        args.extend([
            GraphArg::new(t.x, x),
            GraphArg::new(t.labels, labels),
            GraphArg::new(t.mask, mask),
            GraphArg::new(t.mask_rows, mask),
            GraphArg::at(t.loss[0], loss, 0),
            GraphArg::at(t.loss[1], loss, 4),
            GraphArg::at(t.loss[2], loss, 0),
            GraphArg::at(t.loss[3], loss, 4),
        ]);
        self.fwd.launch(s, &args, self.workspace.as_ref(), &[])
    }

    /// Enqueues one SGD step on `s`: `params` and `velocity` updated in place from `grad`
    /// (the already-averaged gradient), each param_len f32.
    ///
    /// # Errors
    /// As [`MlpGraphs::launch_forward_backward`].
    pub fn launch_sgd(
        &self,
        s: &Stream,
        params: &DeviceBuffer<f32>,
        velocity: &DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
    ) -> Result<()> {
        let t = &self.sgd_t;
        let args = [
            GraphArg::new(t.p, params),
            GraphArg::new(t.p_out, params),
            GraphArg::new(t.v, velocity),
            GraphArg::new(t.v_out, velocity),
            GraphArg::new(t.g, grad),
        ];
        self.sgd.launch(s, &args, self.workspace.as_ref(), &[])
    }

    /// Rows per micro-batch the forward/backward graph was built for.
    pub fn micro_batch_size(&self) -> usize {
        self.micro_batch_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_rows_become_class_zero_with_mask_zero() {
        assert_eq!(stage_labels(&[3, -1, 0, 9, -1]), (vec![3, 0, 0, 9, 0], vec![1.0, 0.0, 1.0, 1.0, 0.0]));
    }

    #[test]
    fn layers_sit_at_the_flat_offsets_of_the_host_layout() {
        let s = MlpShape { input: 64, hidden: 32, classes: 10 };
        assert_eq!(layer_offsets(s), [0, 4 * 64 * 32, 4 * 65 * 32, 4 * (65 * 32 + 32 * 10)]);
        let bytes: u64 = layer_shapes(s).iter().map(|d| 4 * d.iter().product::<u64>()).sum();
        assert_eq!(bytes, 4 * s.param_len() as u64);
        assert_eq!(forward_backward_recipe_name(s, 16), "mlp_fwd_bwd_64x32x10_b16");
    }
}
