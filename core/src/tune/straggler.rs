//! Per-rank straggler attribution: which ranks are slow, and whether chronically or
//! transiently.
//!
//! Owns: [`attribute`]. Must not touch: the threshold search.
//!
//! Per step s, rank n's compute time T_{s,n} is compared with the step's median over ranks:
//! rank n is *slow* in s if T_{s,n} > (1 + tolerance)·median_s. Per rank: the fraction of steps
//! it was slow, the fraction it was the slowest, the mean relative excess T/median - 1 and its
//! EWMA (recent behaviour). Chronic: slow in at least `chronic_fraction` of the steps (the
//! persistent stragglers of the OSDI'25 study, digest §6, which dropping cannot fix); transient:
//! slow in some steps but fewer; otherwise normal.

use crate::trace::LatencyTrace;

/// Thresholds of the classification.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StragglerConfig {
    /// Relative excess over the step median that counts as slow (default 0.05).
    pub tolerance: f64,
    /// Slow-step fraction from which a rank is chronic (default 0.5).
    pub chronic_fraction: f64,
    /// EWMA weight of the newest step (default 0.2).
    pub ewma_alpha: f64,
    /// Fewest steps before any rank is labelled (default [`super::MIN_STEPS`]); with fewer,
    /// every rank is [`StragglerClass::Unlabelled`].
    pub min_steps: usize,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        Self { tolerance: 0.05, chronic_fraction: 0.5, ewma_alpha: 0.2, min_steps: super::MIN_STEPS }
    }
}

/// Class of a rank. JSON and display names: "chronic", "transient", "normal", "unlabelled".
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StragglerClass {
    /// Slow in at least `chronic_fraction` of the steps.
    Chronic,
    /// Slow in some steps.
    Transient,
    /// Never slow.
    Normal,
    /// Fewer than `min_steps` steps: too few to tell (the statistics are still reported).
    Unlabelled,
}

impl StragglerClass {
    /// "chronic", "transient", "normal" or "unlabelled" (the JSON name).
    pub fn name(self) -> &'static str {
        match self {
            Self::Chronic => "chronic",
            Self::Transient => "transient",
            Self::Normal => "normal",
            Self::Unlabelled => "unlabelled",
        }
    }
}

/// Attribution of one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankAttribution {
    /// Rank id.
    pub rank: u32,
    /// Fraction of steps in which the rank was slow.
    pub slow_fraction: f64,
    /// Fraction of steps in which it was the slowest rank.
    pub slowest_fraction: f64,
    /// Mean of T/median - 1.
    pub mean_excess: f64,
    /// EWMA of T/median - 1 (last step weighted `ewma_alpha`).
    pub ewma_excess: f64,
    /// Classification.
    pub class: StragglerClass,
}

/// Attribute every rank; sorted by slow fraction, then mean excess (descending), then rank id.
pub fn attribute(trace: &LatencyTrace, cfg: &StragglerConfig) -> Vec<RankAttribution> {
    let n = trace.world_size();
    let compute = trace.rank_compute_ns();
    let mut slow = vec![0usize; n];
    let mut slowest = vec![0usize; n];
    let mut excess = vec![0.0; n];
    let mut ewma = vec![0.0; n];
    for (si, row) in compute.chunks_exact(n).enumerate() {
        let median = crate::policy::rebalance::median(row.to_vec()).unwrap_or(0.0);
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let first_max = row.iter().position(|&x| x == max).unwrap_or(0);
        for (r, &t) in row.iter().enumerate() {
            let e = if median > 0.0 { t / median - 1.0 } else { 0.0 };
            if t > (1.0 + cfg.tolerance) * median {
                slow[r] += 1;
            }
            excess[r] += e;
            ewma[r] = if si == 0 { e } else { cfg.ewma_alpha * e + (1.0 - cfg.ewma_alpha) * ewma[r] };
        }
        if n > 1 {
            slowest[first_max] += 1;
        }
    }
    let s = trace.num_steps() as f64;
    let mut out: Vec<RankAttribution> = (0..n)
        .map(|r| {
            let sf = slow[r] as f64 / s;
            RankAttribution {
                rank: trace.ranks()[r],
                slow_fraction: sf,
                slowest_fraction: slowest[r] as f64 / s,
                mean_excess: excess[r] / s,
                ewma_excess: ewma[r],
                class: if trace.num_steps() < cfg.min_steps {
                    StragglerClass::Unlabelled
                } else if slow[r] == 0 {
                    StragglerClass::Normal
                } else if sf >= cfg.chronic_fraction {
                    StragglerClass::Chronic
                } else {
                    StragglerClass::Transient
                },
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.slow_fraction
            .total_cmp(&a.slow_fraction)
            .then(b.mean_excess.total_cmp(&a.mean_excess))
            .then(a.rank.cmp(&b.rank))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rebalancer's online tracker applies this module's rule with the same defaults, but
    /// acts after 1 step where the labels wait for `MIN_STEPS` (`policy::TrackerConfig`).
    #[test]
    fn rebalance_tracker_defaults_are_the_attribution_defaults() {
        let (a, b) = (StragglerConfig::default(), crate::policy::TrackerConfig::default());
        assert_eq!((a.tolerance, a.chronic_fraction, a.ewma_alpha), (b.tolerance, b.chronic_fraction, b.ewma_alpha));
        assert_eq!((a.min_steps, b.min_steps), (super::super::MIN_STEPS, 1));
    }

    #[test]
    fn chronic_transient_and_normal_ranks() {
        // 4 ranks, M = 1, 4 steps. Rank 2 is 50 % slower every step; rank 3 once.
        let mut lat = Vec::new();
        for s in 0..4 {
            lat.extend([10.0, 10.0, 15.0, if s == 1 { 20.0 } else { 10.0 }]);
        }
        let t = LatencyTrace::new("t", vec![0, 1, 2, 3], vec![0, 1, 2, 3], 1, lat, vec![0.0; 4]).expect("valid");
        let a = attribute(&t, &StragglerConfig { min_steps: 4, ..StragglerConfig::default() });
        // With the default minimum (10 steps) these 4 steps label nobody.
        let few = attribute(&t, &StragglerConfig::default());
        assert!(few.iter().all(|x| x.class == StragglerClass::Unlabelled), "{few:?}");
        assert_eq!(few[0].slow_fraction, 1.0);
        assert_eq!(a[0].rank, 2);
        assert_eq!(a[0].class, StragglerClass::Chronic);
        assert_eq!(a[0].slow_fraction, 1.0);
        assert_eq!(a[0].slowest_fraction, 0.75);
        assert_eq!(a[1].rank, 3);
        assert_eq!(a[1].class, StragglerClass::Transient);
        assert_eq!(a[1].slow_fraction, 0.25);
        assert!(a[2..].iter().all(|x| x.class == StragglerClass::Normal));
        // Medians: 10 in three steps, 12.5 in step 1: rank 2's mean excess (3·0.5 + 0.2)/4.
        assert!((a[0].mean_excess - 0.425).abs() < 1e-12);
    }
}
