//! The text job's model on the host side: a small pre-LN transformer decoder for byte-level
//! language modelling on [`crate::text`]'s corpus, its sizes ([`TransformerConfig`]), the
//! flat parameter layout ([`ParamBlock`]), the initialization, the staging of a gathered
//! micro-batch into what the device graphs take ([`LmInputs`]) and the AdamW hyper-parameters
//! with their per-step scalars ([`AdamW`]). The graphs themselves are
//! [`crate::transformer_graphs`]; one rank's training loop is [`crate::transformer_train`].
//!
//! Owns: the model definition below (the device graphs implement it, the f64 reference of
//! `train/tests/transformer.rs` writes it out independently), the parameter layout, the LM
//! targets and loss mask. Must not touch: devices, graphs, the corpus or its buckets
//! ([`crate::text`]), the scheduler or the dealer.
//!
//! # Model (row-major shapes; b rows of L tokens, n = b·L, D = `d_model`, H heads of Dh = D/H)
//! `x = tok_emb[tokens] + pos_emb[positions]` (`[n, D]`, positions 0..L of each row); per layer
//! (pre-LN, GPT-2's order): `h = LN1(x)`, `q|k|v = h·Wq|Wk|Wv` (no bias) split into heads
//! `[b, H, L, Dh]`, `p = softmax(q·kᵀ/sqrt(Dh) + causal)` (causal: 0 where key ≤ query,
//! −1e9 above), `x += concat_heads(p·v)·Wo`; `x += gelu(LN2(x)·W1 + b1)·W2 + b2` (erf GELU);
//! then `z = LNf(x)·W_head + b_head` (`[n, V]`, untied head). Layer norms: eps 1e-5, biased
//! variance, as `torch.nn.LayerNorm`.
//!
//! # Task and loss
//! Next-byte prediction: position i of a row predicts token i+1 of its row; the position of a
//! document's last real token predicts [`PAD`] (end of the seen text: end of the document, or
//! of its truncation to the largest bucket). Every real token (CLS included) is thus one loss
//! term and padding positions none: the loss and the gradient are **sums over real tokens**,
//! and their count is exactly [`crate::text::BatchShape::tokens`] (the divisor of issue 26
//! item 4 counts tokens). Padding is only at a row's tail, so the causal mask alone keeps every
//! real query from seeing a padding key; padding positions' outputs get a zero loss weight,
//! hence a zero gradient, and contribute nothing (the token embedding's `padding_idx` is PAD
//! as in PyTorch, which changes nothing for the same reason).
#![forbid(unsafe_code)]

use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use dropcompute::sim::rng::StableRng;

use super::text::{PAD, TextBatch, VOCAB};

/// Why a configuration is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A size out of its range, or heads not dividing the width.
    #[error("transformer config: {field} = {value}: {why}")]
    Size {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The rule broken.
        why: &'static str,
    },
}

/// The most layers, heads, width or feed-forward width accepted (bounds the memory and time a
/// configuration can ask for).
pub const MAX_LAYERS: u32 = 64;
/// See [`MAX_LAYERS`].
pub const MAX_WIDTH: u32 = 4096;

/// The model's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransformerConfig {
    /// Width D (features per token).
    pub d_model: u32,
    /// Attention heads H (divides D).
    pub heads: u32,
    /// Transformer layers.
    pub layers: u32,
    /// Feed-forward width F.
    pub d_ff: u32,
    /// Rows of the position table: the largest bucket length, tokens.
    pub max_len: u32,
}

impl TransformerConfig {
    /// The size the tests use: D 8, 2 heads, 1 layer, F 16, up to 16 tokens.
    pub const TINY: Self = Self { d_model: 8, heads: 2, layers: 1, d_ff: 16, max_len: 16 };

    /// The text job's default size: D 32, 2 heads, 1 layer, F 64, buckets up to 512 tokens
    /// (`text::DEFAULT_BUCKETS`), 41 634 parameters. Chosen from the interpreter's measured
    /// host cost per micro-batch (see [`crate::transformer_train`]'s module docs for the
    /// numbers and the arithmetic).
    pub const DEFAULT: Self = Self { d_model: 32, heads: 2, layers: 1, d_ff: 64, max_len: 512 };

    /// Checks every size: D, F in 1..=[`MAX_WIDTH`], H ≥ 1 dividing D, layers in
    /// 1..=[`MAX_LAYERS`], max_len in 2..=[`crate::text::MAX_BUCKET_LEN`].
    ///
    /// # Errors
    /// [`ConfigError::Size`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, value: u32, why| Err(ConfigError::Size { field, value: u64::from(value), why });
        if !(1..=MAX_WIDTH).contains(&self.d_model) {
            return bad("d_model", self.d_model, "must be in 1..=4096");
        }
        if self.heads == 0 || !self.d_model.is_multiple_of(self.heads) {
            return bad("heads", self.heads, "must be >= 1 and divide d_model");
        }
        if !(1..=MAX_LAYERS).contains(&self.layers) {
            return bad("layers", self.layers, "must be in 1..=64");
        }
        if !(1..=MAX_WIDTH).contains(&self.d_ff) {
            return bad("d_ff", self.d_ff, "must be in 1..=4096");
        }
        if !(2..=super::text::MAX_BUCKET_LEN).contains(&self.max_len) {
            return bad("max_len", self.max_len, "must be in 2..=8192 tokens");
        }
        Ok(())
    }

    /// Features per head, D / H.
    pub fn head_dim(&self) -> u32 {
        self.d_model / self.heads.max(1)
    }

    /// The parameter blocks in layout order ([`ParamBlock`]); their lengths sum to
    /// [`TransformerConfig::param_len`].
    pub fn blocks(&self) -> Vec<ParamBlock> {
        let (d, f, v, l) = (u64::from(self.d_model), u64::from(self.d_ff), VOCAB as u64, u64::from(self.max_len));
        let mut out = Vec::new();
        let mut offset = 0usize;
        let mut push = |name: String, shape: Vec<u64>, init: Init| {
            let len = shape.iter().product::<u64>() as usize;
            out.push(ParamBlock { name, shape, init, offset });
            offset += len;
        };
        push("tok_emb".into(), vec![v, d], Init::Normal);
        push("pos_emb".into(), vec![l, d], Init::Normal);
        for k in 0..self.layers {
            push(format!("l{k}_ln1_beta"), vec![d], Init::Zero);
            push(format!("l{k}_ln1_gamma"), vec![d], Init::One);
            for w in ["wq", "wk", "wv", "wo"] {
                push(format!("l{k}_{w}"), vec![d, d], Init::Normal);
            }
            push(format!("l{k}_ln2_beta"), vec![d], Init::Zero);
            push(format!("l{k}_ln2_gamma"), vec![d], Init::One);
            push(format!("l{k}_w1"), vec![d, f], Init::Normal);
            push(format!("l{k}_b1"), vec![f], Init::Zero);
            push(format!("l{k}_w2"), vec![f, d], Init::Normal);
            push(format!("l{k}_b2"), vec![d], Init::Zero);
        }
        push("lnf_beta".into(), vec![d], Init::Zero);
        push("lnf_gamma".into(), vec![d], Init::One);
        push("head_w".into(), vec![d, v], Init::Normal);
        push("head_b".into(), vec![v], Init::Zero);
        out
    }

    /// Parameters in all, f32 values.
    pub fn param_len(&self) -> usize {
        self.blocks().last().map_or(0, |b| b.offset + b.len())
    }

    /// A short tag of the sizes for recipe names: `d{D}h{H}n{layers}f{F}p{max_len}`.
    pub fn tag(&self) -> String {
        format!("d{}h{}n{}f{}p{}", self.d_model, self.heads, self.layers, self.d_ff, self.max_len)
    }
}

/// How a block starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Normal(0, [`INIT_STD`]) (GPT-2's initialization).
    Normal,
    /// Zeros (biases, layer-norm betas).
    Zero,
    /// Ones (layer-norm gammas).
    One,
}

/// The standard deviation of the weights' initialization (GPT-2, Radford et al. 2019).
pub const INIT_STD: f64 = 0.02;

/// One named tensor of the flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamBlock {
    /// Name (`tok_emb`, `l0_wq`, ...), also the graph tensors' names (`p_`/`g_` prefixed).
    pub name: String,
    /// Row-major shape (a weight used as `x·W` is `[in, out]`).
    pub shape: Vec<u64>,
    /// Initialization.
    pub init: Init,
    /// Offset in the flat vector, elements.
    pub offset: usize,
}

impl ParamBlock {
    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product::<u64>() as usize
    }

    /// True for a block of no element (never, for a valid config).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its range in the flat vector.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// The initial parameters of `cfg` ([`Init`] per block), deterministic in `seed`
/// ([`StableRng`]).
pub fn init_params(cfg: &TransformerConfig, seed: u64) -> Vec<f32> {
    let mut rng = StableRng::seed_from_u64(seed);
    let normal = Normal::new(0.0, INIT_STD).expect("a positive standard deviation");
    let mut p = vec![0f32; cfg.param_len()];
    for b in cfg.blocks() {
        for v in &mut p[b.range()] {
            *v = match b.init {
                Init::Normal => normal.sample(&mut rng) as f32,
                Init::Zero => 0.0,
                Init::One => 1.0,
            };
        }
    }
    p
}

/// One micro-batch as the forward/backward graph takes it (row-major `[rows, len]` each).
#[derive(Clone, Debug, PartialEq)]
pub struct LmInputs {
    /// Rows.
    pub rows: u32,
    /// Tokens per row (the bucket's length).
    pub len: u32,
    /// Input tokens (the batch's).
    pub tokens: Vec<i32>,
    /// Target of each position: the next token of its row, [`PAD`] after the last.
    pub labels: Vec<i32>,
    /// 1 for a real token (a loss term), 0 for padding.
    pub mask: Vec<f32>,
}

impl LmInputs {
    /// Real tokens: the loss terms (Σ mask).
    pub fn tokens_counted(&self) -> u64 {
        self.mask.iter().filter(|&&m| m != 0.0).count() as u64
    }
}

/// The LM inputs of a gathered micro-batch (module doc: targets and loss mask). The count of
/// loss terms equals `batch.shape.tokens`.
pub fn stage_lm(batch: &TextBatch) -> LmInputs {
    let (rows, len) = (batch.shape.rows, batch.shape.len);
    let l = len as usize;
    let mut labels = vec![PAD; batch.tokens.len()];
    for (row, out) in batch.tokens.chunks_exact(l.max(1)).zip(labels.chunks_exact_mut(l.max(1))) {
        let k = l.saturating_sub(1);
        out[..k].copy_from_slice(&row[1..=k]);
    }
    let mask = batch.tokens.iter().map(|&t| if t == PAD { 0.0 } else { 1.0 }).collect();
    LmInputs { rows, len, tokens: batch.tokens.clone(), labels, mask }
}

/// AdamW (Loshchilov & Hutter 2019, as `torch.optim.AdamW`): with g the step's mean gradient,
/// `m = β1·m + (1−β1)·g`, `v = β2·v + (1−β2)·g²`, `p = p·(1 − lr·wd) − lr/(1−β1^t) ·
/// m / (sqrt(v)/sqrt(1−β2^t) + eps)` (t = 1 for the first step), decay on every parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// β1.
    pub beta1: f32,
    /// β2.
    pub beta2: f32,
    /// eps.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for AdamW {
    /// lr 3e-3, β (0.9, 0.99), eps 1e-8, weight decay 0.01 (a small character-level model's
    /// usual choice, e.g. nanoGPT's Shakespeare-char config uses lr 1e-3, β2 0.99).
    fn default() -> Self {
        Self { lr: 3e-3, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.01 }
    }
}

impl AdamW {
    /// The four per-step scalars the AdamW graph takes, in order: `grad_scale` (multiplies the
    /// gradient given: 1 for a mean gradient, 1/tokens for a summed one), the decay factor
    /// `1 − lr·wd`, the step size `lr/(1−β1^t)` and `1/sqrt(1−β2^t)`, for 1-based step `t`
    /// (computed in f64, rounded once).
    pub fn step_scalars(&self, t: u64, grad_scale: f64) -> [f32; 4] {
        let t = i32::try_from(t.max(1)).unwrap_or(i32::MAX);
        let (lr, b1, b2) = (f64::from(self.lr), f64::from(self.beta1), f64::from(self.beta2));
        [
            grad_scale as f32,
            (1.0 - lr * f64::from(self.weight_decay)) as f32,
            (lr / (1.0 - b1.powi(t))) as f32,
            (1.0 / (1.0 - b2.powi(t)).sqrt()) as f32,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{BatchShape, CLS};

    #[test]
    fn blocks_tile_the_flat_vector_and_count_the_parameters() {
        let c = TransformerConfig::TINY;
        let blocks = c.blocks();
        let mut at = 0;
        for b in &blocks {
            assert_eq!(b.offset, at, "{}", b.name);
            at += b.len();
        }
        // V·D + L·D + layers·(4D + 4D² + 2DF + F + D) + 2D + D·V + V, written out.
        let (d, f, v, l) = (8, 16, 258, 16);
        assert_eq!(c.param_len(), v * d + l * d + (4 * d + 4 * d * d + 2 * d * f + f + d) + 2 * d + d * v + v);
        assert_eq!(at, c.param_len());
        let p = init_params(&c, 3);
        let gamma = &blocks.iter().find(|b| b.name == "l0_ln1_gamma").unwrap();
        assert!(p[gamma.range()].iter().all(|&x| x == 1.0));
        let w = &blocks.iter().find(|b| b.name == "l0_wq").unwrap();
        let std = (p[w.range()].iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
        assert!((0.01..0.03).contains(&std), "{std}");
        assert_eq!(p, init_params(&c, 3));
        assert_ne!(p, init_params(&c, 4));
    }

    #[test]
    fn configs_out_of_range_are_refused_by_field() {
        let ok = TransformerConfig::TINY;
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(TransformerConfig::DEFAULT.validate(), Ok(()));
        for (c, field) in [
            (TransformerConfig { heads: 3, ..ok }, "heads"),
            (TransformerConfig { heads: 0, ..ok }, "heads"),
            (TransformerConfig { d_model: 0, ..ok }, "d_model"),
            (TransformerConfig { layers: 0, ..ok }, "layers"),
            (TransformerConfig { d_ff: 0, ..ok }, "d_ff"),
            (TransformerConfig { max_len: 1, ..ok }, "max_len"),
        ] {
            assert!(matches!(c.validate(), Err(ConfigError::Size { field: f, .. }) if f == field), "{c:?}");
        }
    }

    #[test]
    fn every_real_token_is_one_loss_term_predicting_the_next() {
        // Row 0: CLS 'a' 'b' PAD; row 1: CLS 'x' 'y' 'z' (fills the row: last target PAD);
        // row 2: a padding row.
        let (a, b, x, y, z) = (97, 98, 120, 121, 122);
        let tokens = vec![CLS, a, b, PAD, CLS, x, y, z, PAD, PAD, PAD, PAD];
        let batch = TextBatch {
            shape: BatchShape { bucket: 0, len: 4, rows: 3, samples: 2, tokens: 7 },
            tokens,
            labels: vec![0, 0, -1],
        };
        let s = stage_lm(&batch);
        assert_eq!(s.labels, vec![a, b, PAD, PAD, x, y, z, PAD, PAD, PAD, PAD, PAD]);
        assert_eq!(s.mask, vec![1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(s.tokens_counted(), batch.shape.tokens);
    }

    proptest::proptest! {
        /// For any rows of any lengths: one loss term per real token, each predicting the next
        /// token of its row (PAD after the last), nothing for padding.
        #[test]
        fn staging_counts_real_tokens_and_shifts_targets(
            len in 2u32..40,
            rows in proptest::collection::vec(0u32..40, 1..6),
        ) {
            let l = len as usize;
            let n: Vec<usize> = rows.iter().map(|&r| (r as usize).min(l)).collect();
            let mut tokens = vec![PAD; n.len() * l];
            for (r, &k) in n.iter().enumerate() {
                for i in 0..k {
                    tokens[r * l + i] = if i == 0 { CLS } else { (r * 31 + i * 7) as i32 % 256 };
                }
            }
            let real: u64 = n.iter().map(|&k| k as u64).sum();
            let shape = BatchShape { bucket: 0, len, rows: n.len() as u32, samples: 0, tokens: real };
            let s = stage_lm(&TextBatch { shape, tokens: tokens.clone(), labels: vec![0; n.len()] });
            proptest::prop_assert_eq!(s.tokens_counted(), real);
            for (r, &k) in n.iter().enumerate() {
                for i in 0..l {
                    let want = if i + 1 < k { tokens[r * l + i + 1] } else { PAD };
                    proptest::prop_assert_eq!(s.labels[r * l + i], want);
                    proptest::prop_assert_eq!(s.mask[r * l + i], if i < k { 1.0 } else { 0.0 });
                }
            }
        }
    }

    #[test]
    fn adamw_scalars_follow_the_bias_corrections() {
        let o = AdamW { lr: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.5 };
        let [gs, decay, step, ibc2] = o.step_scalars(1, 0.25);
        assert_eq!(gs, 0.25);
        assert!((f64::from(decay) - 0.95).abs() < 1e-7);
        assert!((f64::from(step) - 1.0).abs() < 1e-6); // 0.1 / (1 - 0.9)
        assert!((f64::from(ibc2) - 10.0).abs() < 1e-5); // 1 / sqrt(0.01)
        let [_, _, step2, ibc22] = o.step_scalars(2, 1.0);
        assert!((f64::from(step2) - 0.1 / 0.19).abs() < 1e-6);
        assert!((f64::from(ibc22) - 1.0 / 0.0199f64.sqrt()).abs() < 1e-5);
    }
}
