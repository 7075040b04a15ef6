//! The rescale rule: what the all-reduced (summed) gradient of a step is divided by, and when
//! the update is skipped instead.
//!
//! Owns: [`divisor`]. Must not touch: devices, collectives, the wire layout of the counts
//! (`count_row.rs`).

use super::config::{Normalization, SchedulerConfig, Weighting};
use super::count_row::CountRow;
use super::report::SkipReason;

/// The divisor of the summed gradient of one step, from every rank's gathered counts `rows`
/// (indexed by rank, N = `rows.len()`), or why every rank skips the update.
///
/// - [`Normalization::Realized`]: the global weight actually computed this step, the sum in
///   rank order of every rank's `samples` (or `tokens` under [`Weighting::Tokens`]), so the
///   update is the exact mean gradient of the samples computed: dropped micro-batches neither
///   contribute gradient nor count in the mean.
/// - [`Normalization::Nominal`]: N·M·b (`cfg.micro_batches`, `cfg.micro_batch_size`), as
///   the DropCompute reference code does (a dropped micro-batch counts as a zero gradient,
///   which scales plain SGD's learning rate by 1 − drop rate).
///
/// Source: `../shared/reference/dropcompute.md` §2, "Gradient normalization". The reference
/// code (Giladi et al., NeurIPS 2023) divides by the fixed N·M and all-reduces the computed
/// count only for statistics; whether the paper itself divides by the realized count is not
/// known (§7, open item 1). Realized normalization is this crate's default, as §2 recommends
/// ("a Rust library should offer both modes"), with the count riding the gradient's
/// collective group.
///
/// The sum is exact (128-bit) and converted to f64 once (round to nearest), so every rank,
/// holding the same rows, derives the same divisor bit for bit.
///
/// # Errors
/// [`SkipReason::NonFinite`] listing, in rank order, every rank whose gradient had a NaN or
/// infinity (checked first); otherwise [`SkipReason::ZeroCount`] when the global weight
/// (samples or tokens, whatever the normalization) is zero, including when `rows` is empty.
pub fn divisor(rows: &[CountRow], cfg: &SchedulerConfig) -> Result<f64, SkipReason> {
    let bad: Vec<u32> = rows.iter().enumerate().filter(|(_, r)| r.nonfinite).map(|(i, _)| i as u32).collect();
    if !bad.is_empty() {
        return Err(SkipReason::NonFinite { ranks: bad });
    }
    let weight: u128 = rows
        .iter()
        .map(|r| match cfg.weighting {
            Weighting::Samples => u128::from(r.samples),
            Weighting::Tokens => u128::from(r.tokens),
        })
        .sum();
    if weight == 0 {
        return Err(SkipReason::ZeroCount);
    }
    Ok(match cfg.normalization {
        Normalization::Realized => weight as f64,
        Normalization::Nominal => rows.len() as f64 * f64::from(cfg.micro_batches) * f64::from(cfg.micro_batch_size),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(samples: u64, tokens: u64) -> CountRow {
        CountRow { samples, tokens, ..Default::default() }
    }

    fn cfg(normalization: Normalization, weighting: Weighting, m: u32, b: u32) -> SchedulerConfig {
        SchedulerConfig { normalization, weighting, micro_batches: m, micro_batch_size: b, ..Default::default() }
    }

    #[test]
    fn realized_divides_by_the_global_computed_weight() {
        let rows = [row(12, 300), row(0, 0), row(5, 41)];
        let c = cfg(Normalization::Realized, Weighting::Samples, 4, 3);
        assert_eq!(divisor(&rows, &c), Ok(17.0));
        let c = cfg(Normalization::Realized, Weighting::Tokens, 4, 3);
        assert_eq!(divisor(&rows, &c), Ok(341.0));
    }

    #[test]
    fn nominal_divides_by_n_m_b_whatever_was_computed() {
        let rows = [row(12, 300), row(0, 0), row(5, 41)];
        // N = 3, M = 4, b = 3: 36, not the 17 samples computed.
        assert_eq!(divisor(&rows, &cfg(Normalization::Nominal, Weighting::Samples, 4, 3)), Ok(36.0));
        assert_eq!(divisor(&rows, &cfg(Normalization::Nominal, Weighting::Tokens, 4, 3)), Ok(36.0));
        let max = cfg(Normalization::Nominal, Weighting::Samples, u32::MAX, u32::MAX);
        assert_eq!(divisor(&rows, &max), Ok(3.0 * f64::from(u32::MAX) * f64::from(u32::MAX)));
    }

    #[test]
    fn sums_beyond_u64_do_not_wrap() {
        let rows = [row(u64::MAX, 0), row(u64::MAX, 0)];
        let d = divisor(&rows, &cfg(Normalization::Realized, Weighting::Samples, 1, 1)).unwrap();
        assert_eq!(d, 2.0 * 18_446_744_073_709_551_616.0);
    }

    #[test]
    fn zero_global_count_skips_under_both_normalizations() {
        let rows = [row(0, 9), row(0, 0)];
        for n in [Normalization::Realized, Normalization::Nominal] {
            assert_eq!(divisor(&rows, &cfg(n, Weighting::Samples, 2, 2)), Err(SkipReason::ZeroCount));
            assert_eq!(divisor(&[], &cfg(n, Weighting::Samples, 2, 2)), Err(SkipReason::ZeroCount));
        }
        // Samples but no tokens under token weighting.
        let rows = [row(4, 0)];
        assert_eq!(divisor(&rows, &cfg(Normalization::Realized, Weighting::Tokens, 2, 2)), Err(SkipReason::ZeroCount));
    }

    #[test]
    fn nonfinite_ranks_are_listed_in_rank_order_and_win_over_zero_count() {
        let mut rows = vec![row(3, 0), row(0, 0), row(0, 0), row(1, 0)];
        rows[1].nonfinite = true;
        rows[3].nonfinite = true;
        for n in [Normalization::Realized, Normalization::Nominal] {
            let c = cfg(n, Weighting::Samples, 2, 2);
            assert_eq!(divisor(&rows, &c), Err(SkipReason::NonFinite { ranks: vec![1, 3] }));
        }
        let all_zero = [CountRow { nonfinite: true, ..Default::default() }];
        let c = cfg(Normalization::Realized, Weighting::Samples, 2, 2);
        assert_eq!(divisor(&all_zero, &c), Err(SkipReason::NonFinite { ranks: vec![0] }));
    }

    proptest! {
        #[test]
        fn realized_matches_an_f64_sum_in_rank_order(
            weights in proptest::collection::vec((0u64..1 << 40, 0u64..1 << 40), 1..64),
            tokens in any::<bool>(),
        ) {
            let rows: Vec<CountRow> = weights.iter().map(|&(s, t)| row(s, t)).collect();
            let w = if tokens { Weighting::Tokens } else { Weighting::Samples };
            // Sums below 2^46: every partial sum is exact in f64.
            let mut reference = 0.0f64;
            for &(s, t) in &weights {
                reference += if tokens { t as f64 } else { s as f64 };
            }
            let got = divisor(&rows, &cfg(Normalization::Realized, w, 8, 1));
            if reference == 0.0 {
                prop_assert_eq!(got, Err(SkipReason::ZeroCount));
            } else {
                prop_assert_eq!(got, Ok(reference));
            }
        }

        #[test]
        fn nominal_matches_n_m_b(n in 1usize..300, m in 1u32..1000, b in 1u32..1000, s in 1u64..1000) {
            let rows = vec![row(s, 0); n];
            let got = divisor(&rows, &cfg(Normalization::Nominal, Weighting::Samples, m, b)).unwrap();
            prop_assert_eq!(got, (n as u64 * u64::from(m) * u64::from(b)) as f64);
        }
    }
}
