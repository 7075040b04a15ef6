//! The text job's transformer ([`crate::transformer`]) as device graphs built with
//! [`dropcompute::synapse::graph`]: one forward/backward recipe per length bucket (the loss
//! summed over real tokens and the summed gradient), AdamW composed of elementwise nodes, and a
//! gradient accumulation. Each recipe is compiled once per process (through a
//! [`RecipeCache`] when one is given: later processes load it).
//!
//! Owns: [`TransformerGraphs`] (the recipes, their tensors, the per-bucket constant inputs
//! (positions, causal mask), one workspace, and the launches) and
//! [`forward_backward_recipe_name`]. Must not touch: the model's definition and staging
//! ([`crate::transformer`]), the scheduler, the corpus, the mock (no mock-only call).
//!
//! # Forward/backward graph of bucket L (b rows, n = b·L; module docs of `transformer`)
//! Persistent: every parameter block as a tensor of one section at its flat offset (`p_*`),
//! the gradient likewise (`g_*`, OVERWRITTEN: every element written, the position table's rows
//! beyond L with zeros, so the recipe honours `schedule::Workload`'s contract), `tokens`,
//! `positions`, `labels` (i32 `[n]`), `mask` `[n, 1]` and `mask_rows` `[n]` (one buffer),
//! `causal` `[1, 1, L, L]`, and the loss accumulator `[loss sum, tokens]` (ACCUMULATED in
//! place, as the MLP's). Nodes: embeddings by `embedding_pt_fwd` (tokens and positions),
//! attention by `batch_gemm` on `[b, H, L, Dh]` heads (`reshape` + `transpose` from `[n, D]`),
//! `mult_fwd` by 1/sqrt(Dh), `add_fwd` of the causal mask, `softmax_fwd`; `gelu_fwd`,
//! `layer_norm_fwd`; `softmax_cross_entropy_fwd` without reduction times the mask. Backward:
//! `softmax_cross_entropy_bwd` · mask, `gemm_dedw` / `gemm_dedx`, row sums for biases,
//! `batch_gemm` with transposes for the attention products, `softmax_bwd`, `gelu_bwd`,
//! `layer_norm_bwd` (writing dbeta/dgamma straight into the gradient), the residual sums by
//! `add_fwd`, and `embedding_dense_pt_bwd` into both tables. Checked against an f64 finite
//! difference reference in `train/tests/transformer.rs`.
//!
//! # AdamW graph ([`crate::transformer::AdamW`])
//! `g = grad·s0`, `m' = β1·m + (1−β1)·g`, `v' = β2·v + (1−β2)·g·g`, `p' = p·s1 − s2·m' /
//! (sqrt(v')·s3 + eps)` with the four per-step scalars `s` ([`crate::transformer::AdamW::step_scalars`])
//! a persistent `[4]` input and β1, β2, eps `constant_f32` nodes; params, m and v updated in
//! place through shared sections.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use dropcompute::synapse::graph::{DType, GraphArg, GraphBuilder, GraphRecipe, Op, RecipeCache, Reduction, TensorId};
use dropcompute::synapse::{Device, DeviceBuffer, Error, HostBuffer, Result, Stream};

use super::text::{PAD, VOCAB};
use super::transformer::{AdamW, LmInputs, TransformerConfig};

/// The additive mask value above the diagonal (a large finite negative: exp underflows to 0
/// and no NaN arises from −inf − −inf in a fully masked row).
pub const MASKED: f32 = -1e9;

/// The variance epsilon of every layer norm (PyTorch's default).
pub const LN_EPS: f32 = 1e-5;

/// The name of the forward/backward recipe of `cfg` for bucket length `len` and `rows` rows:
/// `lm_fwd_bwd_{cfg.tag()}_L{len}_b{rows}` (the mock keys its per-recipe base latency and its
/// latency draws by recipe name).
pub fn forward_backward_recipe_name(cfg: &TransformerConfig, len: u32, rows: u32) -> String {
    format!("lm_fwd_bwd_{}_L{len}_b{rows}", cfg.tag())
}

/// Tensors of one bucket's forward/backward graph bound at each launch.
struct FwdTensors {
    params: Vec<TensorId>,
    grads: Vec<TensorId>,
    tokens: TensorId,
    positions: TensorId,
    labels: TensorId,
    mask: TensorId,
    mask_rows: TensorId,
    causal: TensorId,
    /// loss_sum, count, loss_sum_out, count_out.
    loss: [TensorId; 4],
}

/// One bucket: its recipe, tensors and constant inputs on the device.
struct Bucket {
    len: u32,
    recipe: GraphRecipe,
    t: FwdTensors,
    positions: DeviceBuffer<i32>,
    causal: DeviceBuffer<f32>,
}

/// Tensors of the AdamW graph: p, p_out, m, m_out, v, v_out, grad; the four `[1]` step
/// scalars (one section, at offsets 0, 4, 8, 12).
struct AdamTensors([TensorId; 7], [TensorId; 4]);

/// Tensors of the accumulation graph: acc, acc_out, grad.
struct AccTensors([TensorId; 3]);

/// The transformer's compiled graphs for one device: a forward/backward recipe per bucket, AdamW,
/// and `acc += grad`, with one workspace (all run in order on one stream).
pub struct TransformerGraphs {
    cfg: TransformerConfig,
    rows: u32,
    buckets: Vec<Bucket>,
    adam: GraphRecipe,
    adam_t: AdamTensors,
    acc: GraphRecipe,
    acc_t: AccTensors,
    workspace: Option<DeviceBuffer<u8>>,
}

/// A graph under construction with a helper for "one workspace tensor produced by one node".
struct G {
    g: GraphBuilder,
}

impl G {
    fn op(&mut self, name: &str, op: &Op, ins: &[TensorId], shape: &[u64]) -> Result<TensorId> {
        let t = self.g.workspace(name, DType::F32, shape)?;
        self.g.node(name, op, ins, &[t])?;
        Ok(t)
    }

    /// A `[1; rank]` constant.
    fn scalar(&mut self, name: &str, value: f32, rank: usize) -> Result<TensorId> {
        let t = self.g.workspace(name, DType::F32, &vec![1; rank])?;
        self.g.node(name, &Op::Constant { value }, &[], &[t])?;
        Ok(t)
    }

    /// `layer_norm_fwd` of x `[n, D]`: (y, mean, istd).
    fn layer_norm(
        &mut self,
        name: &str,
        x: TensorId,
        beta: TensorId,
        gamma: TensorId,
        n: u64,
        d: u64,
    ) -> Result<[TensorId; 3]> {
        let y = self.g.workspace(name, DType::F32, &[n, d])?;
        let mean = self.g.workspace(&format!("{name}_mean"), DType::F32, &[n, 1])?;
        let istd = self.g.workspace(&format!("{name}_istd"), DType::F32, &[n, 1])?;
        self.g.node(name, &Op::LayerNorm { eps: LN_EPS }, &[x, beta, gamma], &[y, mean, istd])?;
        Ok([y, mean, istd])
    }

    /// `gemm` of x `[n, in]` by W `[in, out]` (+ bias).
    fn linear(
        &mut self,
        name: &str,
        x: TensorId,
        w: TensorId,
        bias: Option<TensorId>,
        shape: &[u64],
    ) -> Result<TensorId> {
        let mut ins = vec![x, w];
        ins.extend(bias);
        self.op(name, &Op::Gemm { transpose_a: false, transpose_b: false }, &ins, shape)
    }

    /// The backward of `y = x·W (+ b)`: dW (and db) into the gradient tensors, returns dx.
    #[allow(clippy::too_many_arguments)]
    fn linear_backward(
        &mut self,
        name: &str,
        dy: TensorId,
        x: TensorId,
        w: TensorId,
        gw: TensorId,
        gb: Option<TensorId>,
        dx_shape: &[u64],
    ) -> Result<TensorId> {
        let nt = (false, false);
        self.g.node(&format!("{name}_dw"), &Op::GemmDw { transpose_a: nt.0, transpose_b: nt.1 }, &[dy, x], &[gw])?;
        if let Some(gb) = gb {
            self.g.node(&format!("{name}_db"), &Op::ReduceSumAxes { axes: vec![0], keep_dims: false }, &[dy], &[gb])?;
        }
        self.op(&format!("{name}_dx"), &Op::GemmDx { transpose_a: nt.0, transpose_b: nt.1 }, &[dy, w], dx_shape)
    }

    /// `[n, D]` -> heads `[b, H, L, Dh]`.
    fn split_heads(&mut self, name: &str, x: TensorId, s: [u64; 4]) -> Result<TensorId> {
        let [b, h, l, dh] = s;
        let x4 = self.op(&format!("{name}_4d"), &Op::Reshape, &[x], &[b, l, h, dh])?;
        self.op(name, &Op::Transpose { perm: vec![0, 2, 1, 3] }, &[x4], &[b, h, l, dh])
    }

    /// Heads `[b, H, L, Dh]` -> `[n, D]`.
    fn merge_heads(&mut self, name: &str, x: TensorId, s: [u64; 4]) -> Result<TensorId> {
        let [b, h, l, dh] = s;
        let t = self.op(&format!("{name}_t"), &Op::Transpose { perm: vec![0, 2, 1, 3] }, &[x], &[b, l, h, dh])?;
        self.op(name, &Op::Reshape, &[t], &[b * l, h * dh])
    }
}

/// What the backward of one layer reads from its forward.
struct LayerSaved {
    x_in: TensorId,
    ln1: [TensorId; 3],
    heads: [TensorId; 3],
    probs: TensorId,
    ctx: TensorId,
    x1: TensorId,
    ln2: [TensorId; 3],
    pre: TensorId,
    act: TensorId,
}

fn build_forward_backward(
    dev: &Device,
    cfg: &TransformerConfig,
    len: u32,
    rows: u32,
    cache: Option<&RecipeCache>,
) -> Result<(GraphRecipe, FwdTensors)> {
    let f = DType::F32;
    let (b, l) = (u64::from(rows), u64::from(len));
    let (d, h, dh, ff, v) =
        (u64::from(cfg.d_model), u64::from(cfg.heads), u64::from(cfg.head_dim()), u64::from(cfg.d_ff), VOCAB as u64);
    let n = b * l;
    let hs = [b, h, l, dh];
    let mut g = G { g: GraphBuilder::new(dev.runtime(), dev.info()?.device_type)? };
    let blocks = cfg.blocks();
    let (psec, gsec) = (g.g.section()?, g.g.section()?);
    let mut params = Vec::with_capacity(blocks.len());
    let mut grads = Vec::with_capacity(blocks.len());
    let mut idx = HashMap::new();
    for (i, blk) in blocks.iter().enumerate() {
        let off = 4 * blk.offset as u64;
        params.push(g.g.persistent_in(psec, off, &format!("p_{}", blk.name), f, &blk.shape)?);
        grads.push(g.g.persistent_in(gsec, off, &format!("g_{}", blk.name), f, &blk.shape)?);
        idx.insert(blk.name.clone(), i);
    }
    let p = |name: &str| params[idx[name]];
    let gr = |name: &str| grads[idx[name]];
    let tokens = g.g.persistent("tokens", DType::I32, &[n])?;
    let positions = g.g.persistent("positions", DType::I32, &[n])?;
    let labels = g.g.persistent("labels", DType::I32, &[n])?;
    let msec = g.g.section()?;
    let mask = g.g.persistent_in(msec, 0, "mask", f, &[n, 1])?;
    let mask_rows = g.g.persistent_in(msec, 0, "mask_rows", f, &[n])?;
    let causal = g.g.persistent("causal", f, &[1, 1, l, l])?;
    let lsec = g.g.section()?;
    let loss_sum = g.g.persistent_in(lsec, 0, "loss_sum", f, &[1])?;
    let count = g.g.persistent_in(lsec, 4, "count", f, &[1])?;
    let loss_sum_out = g.g.persistent_in(lsec, 0, "loss_sum_out", f, &[1])?;
    let count_out = g.g.persistent_in(lsec, 4, "count_out", f, &[1])?;

    // Forward.
    let e_tok = g.op("emb_tok", &Op::Embedding, &[p("tok_emb"), tokens], &[n, d])?;
    let e_pos = g.op("emb_pos", &Op::Embedding, &[p("pos_emb"), positions], &[n, d])?;
    let mut x = g.op("x0", &Op::Add, &[e_tok, e_pos], &[n, d])?;
    let scale = g.scalar("attn_scale", 1.0 / (dh as f32).sqrt(), 4)?;
    let bmm = |ta, tb| Op::BatchGemm { transpose_a: ta, transpose_b: tb };
    let mut saved = Vec::with_capacity(cfg.layers as usize);
    for k in 0..cfg.layers {
        let nm = |s: &str| format!("l{k}_{s}");
        let x_in = x;
        let ln1 = g.layer_norm(&nm("ln1"), x, p(&nm("ln1_beta")), p(&nm("ln1_gamma")), n, d)?;
        let mut heads = [x; 3];
        for (j, w) in ["q", "k", "v"].iter().enumerate() {
            let y = g.linear(&nm(w), ln1[0], p(&nm(&format!("w{w}"))), None, &[n, d])?;
            heads[j] = g.split_heads(&nm(&format!("{w}_heads")), y, hs)?;
        }
        let s = g.op(&nm("scores"), &bmm(false, true), &[heads[0], heads[1]], &[b, h, l, l])?;
        let s2 = g.op(&nm("scores_scaled"), &Op::Mul, &[s, scale], &[b, h, l, l])?;
        let s3 = g.op(&nm("scores_masked"), &Op::Add, &[s2, causal], &[b, h, l, l])?;
        let probs = g.op(&nm("probs"), &Op::Softmax { axis: 3 }, &[s3], &[b, h, l, l])?;
        let ctx_h = g.op(&nm("ctx_heads"), &bmm(false, false), &[probs, heads[2]], &hs)?;
        let ctx = g.merge_heads(&nm("ctx"), ctx_h, hs)?;
        let o = g.linear(&nm("attn_out"), ctx, p(&nm("wo")), None, &[n, d])?;
        let x1 = g.op(&nm("x1"), &Op::Add, &[x, o], &[n, d])?;
        let ln2 = g.layer_norm(&nm("ln2"), x1, p(&nm("ln2_beta")), p(&nm("ln2_gamma")), n, d)?;
        let pre = g.linear(&nm("ff1"), ln2[0], p(&nm("w1")), Some(p(&nm("b1"))), &[n, ff])?;
        let act = g.op(&nm("gelu"), &Op::Gelu { tanh: false }, &[pre], &[n, ff])?;
        let m = g.linear(&nm("ff2"), act, p(&nm("w2")), Some(p(&nm("b2"))), &[n, d])?;
        x = g.op(&nm("x2"), &Op::Add, &[x1, m], &[n, d])?;
        saved.push(LayerSaved { x_in, ln1, heads, probs, ctx, x1, ln2, pre, act });
    }
    let lnf = g.layer_norm("lnf", x, p("lnf_beta"), p("lnf_gamma"), n, d)?;
    let z = g.linear("head", lnf[0], p("head_w"), Some(p("head_b")), &[n, v])?;
    let loss_t = g.g.workspace("loss_tokens", f, &[n])?;
    let log_sm = g.g.workspace("log_softmax", f, &[n, v])?;
    g.g.node(
        "cross_entropy",
        &Op::SoftmaxCrossEntropy { reduction: Reduction::None },
        &[z, labels],
        &[loss_t, log_sm],
    )?;
    let all = Op::ReduceSumAxes { axes: vec![], keep_dims: false };
    let loss_m = g.op("loss_masked", &Op::Mul, &[loss_t, mask_rows], &[n])?;
    let loss_mb = g.op("loss_micro_batch", &all, &[loss_m], &[1])?;
    g.g.node("loss_accumulate", &Op::Add, &[loss_sum, loss_mb], &[loss_sum_out])?;
    let count_mb = g.op("count_micro_batch", &all, &[mask_rows], &[1])?;
    g.g.node("count_accumulate", &Op::Add, &[count, count_mb], &[count_out])?;

    // Backward.
    let dz_raw = g.op(
        "cross_entropy_bwd",
        &Op::SoftmaxCrossEntropyBackward { reduction: Reduction::None },
        &[log_sm, labels],
        &[n, v],
    )?;
    let dz = g.op("dz", &Op::Mul, &[dz_raw, mask], &[n, v])?;
    let dlnf = g.linear_backward("head", dz, lnf[0], p("head_w"), gr("head_w"), Some(gr("head_b")), &[n, d])?;
    let mut dx = g.g.workspace("lnf_dx", f, &[n, d])?;
    g.g.node(
        "lnf_bwd",
        &Op::LayerNormBackward { eps: LN_EPS },
        &[x, dlnf, lnf[1], lnf[2], p("lnf_gamma")],
        &[dx, gr("lnf_beta"), gr("lnf_gamma")],
    )?;
    for k in (0..cfg.layers).rev() {
        let nm = |s: &str| format!("l{k}_{s}");
        let sv = &saved[k as usize];
        // Feed-forward branch: dx is the gradient of x2 = x1 + ff2(...).
        let dact =
            g.linear_backward(&nm("ff2"), dx, sv.act, p(&nm("w2")), gr(&nm("w2")), Some(gr(&nm("b2"))), &[n, ff])?;
        let dpre = g.op(&nm("gelu_bwd"), &Op::GeluBackward { tanh: false }, &[dact, sv.pre], &[n, ff])?;
        let dln2 =
            g.linear_backward(&nm("ff1"), dpre, sv.ln2[0], p(&nm("w1")), gr(&nm("w1")), Some(gr(&nm("b1"))), &[n, d])?;
        let dx1_ln = g.g.workspace(&nm("ln2_dx"), f, &[n, d])?;
        g.g.node(
            &nm("ln2_bwd"),
            &Op::LayerNormBackward { eps: LN_EPS },
            &[sv.x1, dln2, sv.ln2[1], sv.ln2[2], p(&nm("ln2_gamma"))],
            &[dx1_ln, gr(&nm("ln2_beta")), gr(&nm("ln2_gamma"))],
        )?;
        let dx1 = g.op(&nm("dx1"), &Op::Add, &[dx, dx1_ln], &[n, d])?;
        // Attention branch: x1 = x + attn_out(ctx).
        let dctx = g.linear_backward(&nm("attn_out"), dx1, sv.ctx, p(&nm("wo")), gr(&nm("wo")), None, &[n, d])?;
        let dctx_h = g.split_heads(&nm("dctx_heads"), dctx, hs)?;
        let [q, kk, vv] = sv.heads;
        let dprobs = g.op(&nm("dprobs"), &bmm(false, true), &[dctx_h, vv], &[b, h, l, l])?;
        let dv = g.op(&nm("dv_heads"), &bmm(true, false), &[sv.probs, dctx_h], &hs)?;
        let ds3 = g.op(&nm("softmax_bwd"), &Op::SoftmaxBackward { axis: 3 }, &[sv.probs, dprobs], &[b, h, l, l])?;
        let ds = g.op(&nm("dscores"), &Op::Mul, &[ds3, scale], &[b, h, l, l])?;
        let dq = g.op(&nm("dq_heads"), &bmm(false, false), &[ds, kk], &hs)?;
        let dk = g.op(&nm("dk_heads"), &bmm(true, false), &[ds, q], &hs)?;
        let mut dln1 = Vec::with_capacity(3);
        for (w, dhd) in ["q", "k", "v"].iter().zip([dq, dk, dv]) {
            let d2 = g.merge_heads(&nm(&format!("d{w}")), dhd, hs)?;
            let wn = nm(&format!("w{w}"));
            dln1.push(g.linear_backward(&wn, d2, sv.ln1[0], p(&wn), gr(&wn), None, &[n, d])?);
        }
        let dqk = g.op(&nm("dln1_qk"), &Op::Add, &[dln1[0], dln1[1]], &[n, d])?;
        let dln1 = g.op(&nm("dln1"), &Op::Add, &[dqk, dln1[2]], &[n, d])?;
        let dx_ln = g.g.workspace(&nm("ln1_dx"), f, &[n, d])?;
        g.g.node(
            &nm("ln1_bwd"),
            &Op::LayerNormBackward { eps: LN_EPS },
            &[sv.x_in, dln1, sv.ln1[1], sv.ln1[2], p(&nm("ln1_gamma"))],
            &[dx_ln, gr(&nm("ln1_beta")), gr(&nm("ln1_gamma"))],
        )?;
        dx = g.op(&nm("dx0"), &Op::Add, &[dx1, dx_ln], &[n, d])?;
    }
    let pad = u32::try_from(PAD).expect("PAD is a small non-negative id");
    g.g.node(
        "emb_tok_bwd",
        &Op::EmbeddingBackward { num_weights: VOCAB as u32, padding_idx: Some(pad) },
        &[dx, tokens],
        &[gr("tok_emb")],
    )?;
    g.g.node(
        "emb_pos_bwd",
        &Op::EmbeddingBackward { num_weights: cfg.max_len, padding_idx: None },
        &[dx, positions],
        &[gr("pos_emb")],
    )?;
    let name = forward_backward_recipe_name(cfg, len, rows);
    let recipe = match cache {
        Some(c) => g.g.compile_cached(&name, c)?,
        None => g.g.compile(&name)?,
    };
    let t = FwdTensors {
        params,
        grads,
        tokens,
        positions,
        labels,
        mask,
        mask_rows,
        causal,
        loss: [loss_sum, count, loss_sum_out, count_out],
    };
    Ok((recipe, t))
}

fn build_adamw(dev: &Device, len: usize, o: &AdamW, cache: Option<&RecipeCache>) -> Result<(GraphRecipe, AdamTensors)> {
    let f = DType::F32;
    let sh = [len as u64];
    let mut g = G { g: GraphBuilder::new(dev.runtime(), dev.info()?.device_type)? };
    let (ps, ms, vs) = (g.g.section()?, g.g.section()?, g.g.section()?);
    let p = g.g.persistent_in(ps, 0, "params", f, &sh)?;
    let p_out = g.g.persistent_in(ps, 0, "params_out", f, &sh)?;
    let m = g.g.persistent_in(ms, 0, "adam_m", f, &sh)?;
    let m_out = g.g.persistent_in(ms, 0, "adam_m_out", f, &sh)?;
    let v = g.g.persistent_in(vs, 0, "adam_v", f, &sh)?;
    let v_out = g.g.persistent_in(vs, 0, "adam_v_out", f, &sh)?;
    let grad = g.g.persistent("grad", f, &sh)?;
    let ssec = g.g.section()?;
    let s: Vec<TensorId> = (0..4u64)
        .map(|i| g.g.persistent_in(ssec, 4 * i, &format!("step_scalar{i}"), f, &[1]))
        .collect::<Result<_>>()?;
    let b1 = g.scalar("beta1", o.beta1, 1)?;
    let b1c = g.scalar("one_minus_beta1", 1.0 - o.beta1, 1)?;
    let b2 = g.scalar("beta2", o.beta2, 1)?;
    let b2c = g.scalar("one_minus_beta2", 1.0 - o.beta2, 1)?;
    let eps = g.scalar("eps", o.eps, 1)?;
    let gs = g.op("grad_scaled", &Op::Mul, &[grad, s[0]], &sh)?;
    let m1 = g.op("m_decay", &Op::Mul, &[m, b1], &sh)?;
    let m2 = g.op("m_grad", &Op::Mul, &[gs, b1c], &sh)?;
    g.g.node("m_update", &Op::Add, &[m1, m2], &[m_out])?;
    let g2 = g.op("grad_sq", &Op::Mul, &[gs, gs], &sh)?;
    let v1 = g.op("v_decay", &Op::Mul, &[v, b2], &sh)?;
    let v2 = g.op("v_grad", &Op::Mul, &[g2, b2c], &sh)?;
    g.g.node("v_update", &Op::Add, &[v1, v2], &[v_out])?;
    let sq = g.op("v_sqrt", &Op::Sqrt, &[v_out], &sh)?;
    let sqc = g.op("v_sqrt_corrected", &Op::Mul, &[sq, s[3]], &sh)?;
    let den = g.op("denominator", &Op::Add, &[sqc, eps], &sh)?;
    let ratio = g.op("m_over_den", &Op::Div, &[m_out, den], &sh)?;
    let step = g.op("step", &Op::Mul, &[ratio, s[2]], &sh)?;
    let pd = g.op("params_decayed", &Op::Mul, &[p, s[1]], &sh)?;
    g.g.node("params_update", &Op::Sub, &[pd, step], &[p_out])?;
    let name = format!("adamw_{len}");
    let recipe = match cache {
        Some(c) => g.g.compile_cached(&name, c)?,
        None => g.g.compile(&name)?,
    };
    Ok((recipe, AdamTensors([p, p_out, m, m_out, v, v_out, grad], [s[0], s[1], s[2], s[3]])))
}

fn build_accumulate(dev: &Device, len: usize, cache: Option<&RecipeCache>) -> Result<(GraphRecipe, AccTensors)> {
    let f = DType::F32;
    let sh = [len as u64];
    let mut g = GraphBuilder::new(dev.runtime(), dev.info()?.device_type)?;
    let sec = g.section()?;
    let acc = g.persistent_in(sec, 0, "acc", f, &sh)?;
    let acc_out = g.persistent_in(sec, 0, "acc_out", f, &sh)?;
    let grad = g.persistent("grad", f, &sh)?;
    g.node("accumulate", &Op::Add, &[acc, grad], &[acc_out])?;
    let name = format!("accumulate_{len}");
    let recipe = match cache {
        Some(c) => g.compile_cached(&name, c)?,
        None => g.compile(&name)?,
    };
    Ok((recipe, AccTensors([acc, acc_out, grad])))
}

/// The causal mask of length `len`, row-major `[len, len]`: 0 where key ≤ query, [`MASKED`]
/// above the diagonal.
pub fn causal_mask(len: u32) -> Vec<f32> {
    let l = len as usize;
    (0..l * l).map(|i| if i % l <= i / l { 0.0 } else { MASKED }).collect()
}

fn upload<T: dropcompute::synapse::DeviceRepr>(s: &Stream, data: &[T]) -> Result<DeviceBuffer<T>> {
    let dev = s.device();
    let mut d = DeviceBuffer::alloc(dev, data.len())?;
    s.copy_h2d(&HostBuffer::from_slice(dev, data)?, &mut d)?;
    s.synchronize()?;
    Ok(d)
}

impl TransformerGraphs {
    /// Builds and compiles, for `stream`'s device: the forward/backward recipe of every bucket
    /// length in `lens` for micro-batches of `rows` rows ([`forward_backward_recipe_name`]),
    /// AdamW with `adamw`'s β1, β2 and eps (recipe `adamw_{param_len}`) and the accumulation
    /// (`accumulate_{param_len}`); uploads each bucket's positions and causal mask; allocates
    /// the workspace. With `cache`, each recipe is loaded from it when present (and stored
    /// when compiled).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an invalid `cfg`, no bucket, `rows` 0, or a bucket longer
    /// than `cfg.max_len`; [`dropcompute::synapse::Error`] from building, compiling or
    /// allocating.
    pub fn build(
        stream: &Stream,
        cfg: &TransformerConfig,
        lens: &[u32],
        rows: u32,
        adamw: &AdamW,
        cache: Option<&RecipeCache>,
    ) -> Result<Self> {
        let invalid = |value: String| Error::InvalidArgument { what: "transformer graphs", value };
        cfg.validate().map_err(|e| invalid(e.to_string()))?;
        if lens.is_empty() || rows == 0 || lens.iter().any(|&l| l < 2 || l > cfg.max_len) {
            return Err(invalid(format!("buckets {lens:?} (each in 2..={}) and rows {rows} (>= 1)", cfg.max_len)));
        }
        let dev = stream.device();
        let mut buckets = Vec::with_capacity(lens.len());
        for &len in lens {
            let (recipe, t) = build_forward_backward(dev, cfg, len, rows, cache)?;
            let pos: Vec<i32> = (0..rows).flat_map(|_| 0..len as i32).collect();
            buckets.push(Bucket {
                len,
                recipe,
                t,
                positions: upload(stream, &pos)?,
                causal: upload(stream, &causal_mask(len))?,
            });
        }
        let plen = cfg.param_len();
        let (adam, adam_t) = build_adamw(dev, plen, adamw, cache)?;
        let (acc, acc_t) = build_accumulate(dev, plen, cache)?;
        let ws = buckets
            .iter()
            .map(|b| b.recipe.workspace_size())
            .chain([adam.workspace_size(), acc.workspace_size()])
            .max()
            .unwrap_or(0);
        let workspace = if ws > 0 { Some(DeviceBuffer::alloc(dev, ws as usize)?) } else { None };
        Ok(Self { cfg: *cfg, rows, buckets, adam, adam_t, acc, acc_t, workspace })
    }

    /// The model's sizes.
    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    /// Rows per micro-batch.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// The bucket lengths, in the order given to [`TransformerGraphs::build`].
    pub fn lens(&self) -> Vec<u32> {
        self.buckets.iter().map(|b| b.len).collect()
    }

    /// The forward/backward recipe of bucket `bucket` (index into the lengths given).
    pub fn forward_backward_recipe(&self, bucket: usize) -> Option<&GraphRecipe> {
        self.buckets.get(bucket).map(|b| &b.recipe)
    }

    /// The AdamW recipe.
    pub fn adamw_recipe(&self) -> &GraphRecipe {
        &self.adam
    }

    /// Enqueues one micro-batch on `s`: `grad` (param_len f32) ← the gradient of the loss summed
    /// over the real tokens of `inputs` (OVERWRITTEN), `loss` (2 f32) ← `[loss_sum + Σ loss,
    /// tokens + real tokens]`. `inputs` is [`crate::transformer::stage_lm`]'s, its rows and
    /// length a bucket's; its device copies are `tokens`, `labels` (i32) and `mask` (f32),
    /// rows·len each (the caller uploads them: it owns the staging buffers and their lifetime).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no bucket has `inputs`' length or the rows differ;
    /// [`dropcompute::synapse::Error`] from the launch (a buffer too small: `SizeMismatch`).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_forward_backward(
        &self,
        s: &Stream,
        inputs: &LmInputs,
        params: &DeviceBuffer<f32>,
        tokens: &DeviceBuffer<i32>,
        labels: &DeviceBuffer<i32>,
        mask: &DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
        loss: &DeviceBuffer<f32>,
    ) -> Result<()> {
        let Some(bk) = self.buckets.iter().find(|b| b.len == inputs.len).filter(|_| inputs.rows == self.rows) else {
            return Err(Error::InvalidArgument {
                what: "transformer micro-batch",
                value: format!(
                    "{} rows of {} tokens; the graphs take {} rows of {:?}",
                    inputs.rows,
                    inputs.len,
                    self.rows,
                    self.lens()
                ),
            });
        };
        let t = &bk.t;
        let blocks = self.cfg.blocks();
        let mut args = Vec::with_capacity(2 * blocks.len() + 10);
        for ((&pt, &gt), blk) in t.params.iter().zip(&t.grads).zip(&blocks) {
            args.push(GraphArg::at(pt, params, 4 * blk.offset as u64));
            args.push(GraphArg::at(gt, grad, 4 * blk.offset as u64));
        }
        args.extend([
            GraphArg::new(t.tokens, tokens),
            GraphArg::new(t.positions, &bk.positions),
            GraphArg::new(t.labels, labels),
            GraphArg::new(t.mask, mask),
            GraphArg::new(t.mask_rows, mask),
            GraphArg::new(t.causal, &bk.causal),
            GraphArg::at(t.loss[0], loss, 0),
            GraphArg::at(t.loss[1], loss, 4),
            GraphArg::at(t.loss[2], loss, 0),
            GraphArg::at(t.loss[3], loss, 4),
        ]);
        bk.recipe.launch(s, &args, self.workspace.as_ref(), &[])
    }

    /// Enqueues one AdamW step on `s`: `params`, `m` and `v` (param_len f32 each) updated in
    /// place from `grad` times `scalars[0]`; `scalars` holds
    /// [`crate::transformer::AdamW::step_scalars`] (4 f32) on the device.
    ///
    /// # Errors
    /// As [`TransformerGraphs::launch_forward_backward`].
    pub fn launch_adamw(
        &self,
        s: &Stream,
        params: &DeviceBuffer<f32>,
        m: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
        scalars: &DeviceBuffer<f32>,
    ) -> Result<()> {
        let [p, p_out, mt, m_out, vt, v_out, g] = self.adam_t.0;
        let mut args = vec![
            GraphArg::new(p, params),
            GraphArg::new(p_out, params),
            GraphArg::new(mt, m),
            GraphArg::new(m_out, m),
            GraphArg::new(vt, v),
            GraphArg::new(v_out, v),
            GraphArg::new(g, grad),
        ];
        args.extend(self.adam_t.1.iter().enumerate().map(|(i, &t)| GraphArg::at(t, scalars, 4 * i as u64)));
        self.adam.launch(s, &args, self.workspace.as_ref(), &[])
    }

    /// Enqueues `acc += grad` (param_len f32 each) on `s`.
    ///
    /// # Errors
    /// As [`TransformerGraphs::launch_forward_backward`].
    pub fn launch_accumulate(&self, s: &Stream, acc: &DeviceBuffer<f32>, grad: &DeviceBuffer<f32>) -> Result<()> {
        let [a, a_out, g] = self.acc_t.0;
        let args = [GraphArg::new(a, acc), GraphArg::new(a_out, acc), GraphArg::new(g, grad)];
        self.acc.launch(s, &args, self.workspace.as_ref(), &[])
    }
}
