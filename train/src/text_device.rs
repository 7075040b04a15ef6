//! The text job's device model: the compute rate of the mock's graph cost model
//! (`MockConfig::graph_gflops`) that makes the small default transformer spend, per token, the
//! device time a BERT-base-sized model spends at a measured Gaudi2 training rate. At the mock's
//! default 100 TFLOP/s this small model's recipes are dominated by the 2 µs per-node overhead
//! (about 0.16-0.21 ms per bucket), so the data's length tail barely shows in the step times;
//! at the rate here a micro-batch's time grows with its bucket as a real model's does.
//!
//! The rate: `graph_gflops = R / k`, with R = [`GAUDI2_BERT_TRAINING_TFLOPS`] (a public report,
//! not reproduced in this repository: unverified) and k = [`bert_base_ratio`], BERT-base's
//! training flops per 128-token sequence over this model's ([`training_flops_per_sequence`]).
//! The memory rate (`graph_hbm_gbps`) and the per-node overhead are the mock's defaults.
//!
//! Owns: [`FlopShape`], [`training_flops_per_sequence`], [`bert_base_ratio`],
//! [`text_graph_gflops`]. Must not touch: the mock's cost model itself (`habana_mock`'s graph
//! `cost_ns`), the mock configuration of a job (`job::Job::mock_config` applies the rate, unless
//! `$DROPCOMPUTE_MOCK_CONFIG` sets `graph_gflops`: the user's rate wins).
#![forbid(unsafe_code)]

use super::text::VOCAB;
use super::transformer::TransformerConfig;

/// A measured Gaudi2 training rate for BERT-style models, TFLOP/s (R of the module doc). Its
/// source is a public report, not in this repository, and unverified here; change it when a
/// measurement on this project's hardware exists.
pub const GAUDI2_BERT_TRAINING_TFLOPS: f64 = 260.0;

/// Sequence length (tokens) at which the ratio k of [`bert_base_ratio`] is taken: BERT-base's
/// phase-1 pre-training length.
pub const RATIO_TOKENS: u64 = 128;

/// The sizes of a transformer that its training flops depend on (no biases, layer norms or
/// embedding look-ups: they cost no matrix products).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlopShape {
    /// Layers L.
    pub layers: u64,
    /// Width D (features per token).
    pub d_model: u64,
    /// Feed-forward width F.
    pub d_ff: u64,
    /// Outputs of the head applied at every position (the vocabulary V).
    pub head_out: u64,
}

impl FlopShape {
    /// BERT-base (Devlin et al. 2019): L 12, D 768, F 3072, WordPiece vocabulary 30 522; its
    /// masked-LM decoder counted at every position (an upper bound: pre-training applies it at
    /// the masked 15 %).
    pub const BERT_BASE: Self = Self { layers: 12, d_model: 768, d_ff: 3072, head_out: 30_522 };

    /// The shape of one of this crate's transformers (its LM head has `text::VOCAB` outputs).
    pub fn of(model: &TransformerConfig) -> Self {
        Self {
            layers: u64::from(model.layers),
            d_model: u64::from(model.d_model),
            d_ff: u64::from(model.d_ff),
            head_out: VOCAB as u64,
        }
    }

    /// Weights every token is multiplied by, N: per layer 4·D² (Q, K, V, output projections)
    /// + 2·D·F (the feed-forward pair), plus the head's D·V.
    pub fn matmul_params(&self) -> f64 {
        let (l, d, f, v) = (self.layers as f64, self.d_model as f64, self.d_ff as f64, self.head_out as f64);
        l * (4.0 * d * d + 2.0 * d * f) + d * v
    }
}

/// Training flops (forward and backward) of one sequence of `tokens` tokens:
/// 6·N·T + 6·L·T²·D, with N = [`FlopShape::matmul_params`] (Kaplan et al. 2020, "Scaling Laws
/// for Neural Language Models", table 1: a forward pass costs 2·N + 2·L·T·D flops per token,
/// the second term the attention scores and their weighted sum; the backward pass twice the
/// forward).
pub fn training_flops_per_sequence(shape: &FlopShape, tokens: u64) -> f64 {
    let t = tokens as f64;
    6.0 * shape.matmul_params() * t + 6.0 * shape.layers as f64 * t * t * shape.d_model as f64
}

/// k of the module doc: BERT-base's training flops per [`RATIO_TOKENS`]-token sequence over
/// `model`'s (the same formula for both, [`training_flops_per_sequence`]).
pub fn bert_base_ratio(model: &TransformerConfig) -> f64 {
    training_flops_per_sequence(&FlopShape::BERT_BASE, RATIO_TOKENS)
        / training_flops_per_sequence(&FlopShape::of(model), RATIO_TOKENS)
}

/// The graph compute rate of the text job's device model, GFLOP/s (= flop/ns, the unit of
/// `MockConfig::graph_gflops`): [`GAUDI2_BERT_TRAINING_TFLOPS`] · 1000 / [`bert_base_ratio`].
pub fn text_graph_gflops(model: &TransformerConfig) -> f64 {
    GAUDI2_BERT_TRAINING_TFLOPS * 1000.0 / bert_base_ratio(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_flops_follow_the_stated_formula_for_both_models() {
        // This job's default model at 128 tokens, by hand: N = 1·(4·32² + 2·32·64) + 32·258
        // = 8192 + 8256 = 16 448; 6·N·128 = 12 632 064; 6·1·128²·32 = 3 145 728.
        let small = FlopShape::of(&TransformerConfig::DEFAULT);
        assert_eq!(small.matmul_params(), 16_448.0);
        assert_eq!(training_flops_per_sequence(&small, 128), 15_777_792.0);
        // BERT-base: N = 12·(4·768² + 2·768·3072) + 768·30 522 = 84 934 656 + 23 440 896;
        // 6·N·128 = 83 232 423 936; 6·12·128²·768 = 905 969 664.
        let bert = FlopShape::BERT_BASE;
        assert_eq!(bert.matmul_params(), 108_375_552.0);
        assert_eq!(training_flops_per_sequence(&bert, 128), 84_138_393_600.0);
        // The attention term is quadratic in the length: doubling T more than doubles.
        assert!(training_flops_per_sequence(&small, 256) > 2.0 * training_flops_per_sequence(&small, 128));
    }

    #[test]
    fn the_rate_is_the_measured_rate_over_the_flop_ratio() {
        let k = bert_base_ratio(&TransformerConfig::DEFAULT);
        assert!((k - 84_138_393_600.0 / 15_777_792.0).abs() < 1e-9, "{k}");
        let r = text_graph_gflops(&TransformerConfig::DEFAULT);
        assert!((r - 260_000.0 / k).abs() < 1e-9, "{r}");
        // About 48.8 GFLOP/s: three orders below the mock's default 100 000.
        assert!((48.0..50.0).contains(&r), "{r}");
    }

    #[test]
    fn the_users_rate_and_the_tiny_model_keep_the_configured_rate() {
        use crate::config::TextModelSize;
        use crate::job::text_graph_gflops as job_rate;
        let m = TransformerConfig::DEFAULT;
        let none = std::collections::BTreeSet::new();
        assert_eq!(job_rate(TextModelSize::Default, &m, &none), Some(text_graph_gflops(&m)));
        let user = dropcompute::mock::MockConfig::fields_named(r#"{"graph_gflops": 500, "devices": 4}"#);
        assert_eq!(job_rate(TextModelSize::Default, &m, &user), None);
        // Another field set by the user leaves the job's rate in force.
        let other = dropcompute::mock::MockConfig::fields_named(r#"{"graph_hbm_gbps": 1000}"#);
        assert_eq!(job_rate(TextModelSize::Default, &m, &other), Some(text_graph_gflops(&m)));
        assert_eq!(job_rate(TextModelSize::Tiny, &TransformerConfig::TINY, &none), None);
    }
}
