//! Latency noise models shared by the CPU mock device (`habana-mock`) and the simulator
//! (`dropcompute::sim`): the DropCompute reference's injected straggler multiplier and the
//! standard distributions, as a multiplier of a base micro-batch latency.
//!
//! Owns: the one definition of the reference distribution ([`reference_multiplier_pmf`]), its
//! inverse-CDF sampler ([`ReferenceMultiplier`]), the [`Noise`] type and the seed mixer
//! [`splitmix64`]. Must not touch: devices, clocks, policies. A leaf crate: it depends on no
//! other crate of this workspace, so the mock and the product can both use it.

use std::sync::OnceLock;

use rand::Rng;
use rand_distr::{Distribution, Exp, LogNormal, Normal};
use serde::{Deserialize, Serialize};

/// The reference's "sentence length" distribution and the multiplier derived from it.
///
/// Source: DropCompute REPO `create_dist_lognormal` (`deepspeed-bert/run_pretraining.py`),
/// digest `../shared/reference/dropcompute.md` §4: lengths k = 1..999 with
/// pmf(k) ∝ (1/k)·exp(-(ln k - 4)²/2) (log-normal μ = 4, σ = 1, discretized), multiplier
/// k / E[k] with E[k] ≈ 87.634. Multiplier statistics: mean 1, standard deviation 1.162,
/// median 0.616.
#[derive(Clone, Debug)]
pub struct ReferencePmf {
    /// Lengths 1..=999.
    pub lengths: Vec<u32>,
    /// Probability of each length (sums to 1).
    pub probs: Vec<f64>,
    /// E[length] under `probs` (≈ 87.634).
    pub mean_length: f64,
}

impl ReferencePmf {
    /// Multiplier of the i-th length: `lengths[i] / mean_length` (mean 1 under `probs`).
    pub fn multiplier(&self, i: usize) -> f64 {
        f64::from(self.lengths[i]) / self.mean_length
    }
}

/// Build the reference multiplier pmf (see [`ReferencePmf`]).
pub fn reference_multiplier_pmf() -> ReferencePmf {
    let lengths: Vec<u32> = (1..1000).collect();
    let w: Vec<f64> = lengths
        .iter()
        .map(|&k| {
            let k = f64::from(k);
            (1.0 / k) * (-(k.ln() - 4.0).powi(2) / 2.0).exp()
        })
        .collect();
    let total: f64 = w.iter().sum();
    let probs: Vec<f64> = w.iter().map(|x| x / total).collect();
    let mean_length = lengths.iter().zip(&probs).map(|(&k, p)| f64::from(k) * p).sum();
    ReferencePmf { lengths, probs, mean_length }
}

/// Support of the reference multiplier: the integers 1..=999.
pub const REFERENCE_SUPPORT: usize = 999;
/// μ of the reference log-normal (reference/dropcompute.md, `create_dist_lognormal`).
pub const REFERENCE_MU: f64 = 4.0;
/// σ of the reference log-normal.
pub const REFERENCE_SIGMA: f64 = 1.0;

/// The DropCompute reference multiplier: k ∈ 1..=999 with weights ∝ the log-normal(μ=4, σ=1)
/// pdf at k, divided by the mean of k under that pmf (≈ 87.63), so the multiplier has mean 1.
/// Source: reference/dropcompute.md, "Noise injected in experiments".
#[derive(Debug, Clone)]
pub struct ReferenceMultiplier {
    /// Probability of k = i + 1.
    pub pmf: Vec<f64>,
    /// Cumulative probabilities, last entry forced to 1.
    cdf: Vec<f64>,
    /// Mean of k under the pmf (≈ 87.63).
    pub mean_k: f64,
}

impl ReferenceMultiplier {
    /// Builds the pmf from [`reference_multiplier_pmf`], the one place the
    /// reference distribution is defined (shared with the simulator).
    pub fn new() -> Self {
        let r = reference_multiplier_pmf();
        debug_assert_eq!(r.lengths.len(), REFERENCE_SUPPORT);
        let pmf = r.probs;
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = pmf
            .iter()
            .map(|p| {
                acc += p;
                acc
            })
            .collect();
        *cdf.last_mut().expect("non-empty support") = 1.0;
        Self { pmf, cdf, mean_k: r.mean_length }
    }

    /// The shared instance.
    pub fn get() -> &'static Self {
        static R: OnceLock<ReferenceMultiplier> = OnceLock::new();
        R.get_or_init(Self::new)
    }

    /// The multiplier value for k = `i + 1`.
    pub fn value(&self, i: usize) -> f64 {
        (i + 1) as f64 / self.mean_k
    }

    /// Draws one multiplier by inverse CDF of a uniform in [0, 1).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        let u: f64 = rng.random();
        let i = self.cdf.partition_point(|&c| c <= u).min(REFERENCE_SUPPORT - 1);
        self.value(i)
    }
}

impl Default for ReferenceMultiplier {
    fn default() -> Self {
        Self::new()
    }
}

/// Noise multiplier applied to a recipe's base latency, drawn per micro-batch launch (the mock
/// device) or per simulated micro-batch (the simulator).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Noise {
    /// Factor 1.
    #[default]
    None,
    /// DropCompute reference injected delay: factor = 1 + 0.5 · `delay_factor` · mult, mult
    /// drawn from a log-normal(μ=4, σ=1) discretised on 1..=999 and divided by its mean
    /// (≈ 87.63). Source: reference/dropcompute.md, "Noise injected in experiments".
    Reference {
        /// The reference scripts use 1.0.
        delay_factor: f64,
    },
    /// Factor = exp(N(mu, sigma)).
    LogNormal {
        /// Mean of the underlying normal.
        mu: f64,
        /// Standard deviation of the underlying normal (>= 0).
        sigma: f64,
    },
    /// Factor = N(1, cv), clipped below at 1e-3 so latencies stay positive.
    Normal {
        /// Coefficient of variation (standard deviation of the factor), >= 0.
        cv: f64,
    },
    /// Factor = 1 + X with X exponential of mean `mean` (an added delay, as a fraction of base).
    Exponential {
        /// Mean added fraction (> 0).
        mean: f64,
    },
}

impl Noise {
    /// True when every parameter is finite and in range (delay factor, sigma and cv >= 0,
    /// exponential mean > 0).
    pub fn is_valid(&self) -> bool {
        let ok = |v: f64, min: f64| v.is_finite() && v >= min;
        match *self {
            Noise::None => true,
            Noise::Reference { delay_factor } => ok(delay_factor, 0.0),
            Noise::LogNormal { mu, sigma } => mu.is_finite() && ok(sigma, 0.0),
            Noise::Normal { cv } => ok(cv, 0.0),
            Noise::Exponential { mean } => mean.is_finite() && mean > 0.0,
        }
    }

    /// Draws one noise factor (> 0) from `rng`; an invalid parameter gives factor 1 (callers
    /// validate with [`Noise::is_valid`] first).
    pub fn factor<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match *self {
            Noise::None => 1.0,
            Noise::Reference { delay_factor } => 1.0 + 0.5 * delay_factor * ReferenceMultiplier::get().sample(rng),
            Noise::LogNormal { mu, sigma } => match LogNormal::new(mu, sigma) {
                Ok(d) => d.sample(rng),
                Err(_) => 1.0,
            },
            Noise::Normal { cv } => match Normal::new(1.0, cv) {
                Ok(d) => d.sample(rng).max(1e-3),
                Err(_) => 1.0,
            },
            Noise::Exponential { mean } => match Exp::new(1.0 / mean) {
                Ok(d) => 1.0 + d.sample(rng),
                Err(_) => 1.0,
            },
        }
    }
}

/// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
/// 2014; the finaliser of Java's SplittableRandom): a bijective mix of a 64-bit value, used to
/// derive independent seeds from (seed, index) pairs.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn stats() -> (f64, f64, f64) {
        let r = ReferenceMultiplier::get();
        let mean: f64 = r.pmf.iter().enumerate().map(|(i, p)| p * r.value(i)).sum();
        let var: f64 = r.pmf.iter().enumerate().map(|(i, p)| p * (r.value(i) - mean).powi(2)).sum();
        let mut acc = 0.0;
        let mut median = f64::NAN;
        for (i, p) in r.pmf.iter().enumerate() {
            acc += p;
            if acc >= 0.5 {
                median = r.value(i);
                break;
            }
        }
        (mean, var.sqrt(), median)
    }

    #[test]
    fn reference_multiplier_matches_notes() {
        let r = ReferenceMultiplier::get();
        let (mean, std, median) = stats();
        assert!((mean - 1.0).abs() < 1e-12, "mean {mean}");
        assert!((r.mean_k - 87.63).abs() < 0.01, "mean k {}", r.mean_k);
        assert!((std - 1.16).abs() < 0.01, "std {std}");
        assert!((median - 0.62).abs() < 0.01, "median {median}");
        assert!((r.value(998) - 11.4).abs() < 0.05, "max {}", r.value(998));
        assert!((r.pmf.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn reference_sampling_mean_is_close_to_one() {
        let mut rng = StdRng::seed_from_u64(1);
        let r = ReferenceMultiplier::get();
        let n = 200_000;
        let m: f64 = (0..n).map(|_| r.sample(&mut rng)).sum::<f64>() / n as f64;
        // std 1.16 / sqrt(2e5) = 0.0026: 5 sigma.
        assert!((m - 1.0).abs() < 0.013, "sample mean {m}");
    }

    #[test]
    fn noise_factors_are_positive() {
        let mut rng = StdRng::seed_from_u64(9);
        for n in [Noise::LogNormal { mu: 0.0, sigma: 1.0 }, Noise::Normal { cv: 5.0 }, Noise::Exponential { mean: 0.5 }]
        {
            for _ in 0..1000 {
                let f = n.factor(&mut rng);
                assert!(f > 0.0 && f.is_finite(), "{n:?} gave {f}");
            }
        }
    }

    #[test]
    fn splitmix_matches_published_vector() {
        // First outputs of the reference SplitMix64 seeded with 0 (state advanced by φ each call).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }
}
