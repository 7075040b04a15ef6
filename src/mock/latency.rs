//! The per-device latency model of the mock: base latency × slowdown × noise, or a script.
//!
//! Owns: the DropCompute reference multiplier distribution ([`ReferenceMultiplier`]), the seeded
//! per-module random stream and the latency script. Must not touch: streams or time (callers
//! decide when a latency is drawn: at enqueue time, so a module's sequence depends only on its
//! own launch order, never on thread timing).

use std::collections::VecDeque;
use std::sync::OnceLock;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal, Normal};

use super::config::Noise;

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
    /// Builds the pmf from [`crate::sim::noise::reference_multiplier_pmf`], the one place the
    /// reference distribution is defined (shared with the simulator).
    pub fn new() -> Self {
        let r = crate::sim::noise::reference_multiplier_pmf();
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

/// splitmix64 of `seed` mixed with `module`: the seed of module `module`'s random stream.
pub fn module_seed(seed: u64, module: u32) -> u64 {
    let mut z = seed ^ (u64::from(module).wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Noise {
    /// Draws one noise factor (> 0) from `rng`.
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

/// One module's latency generator.
#[derive(Debug)]
pub(crate) struct DeviceLatency {
    rng: StdRng,
    slowdown: f64,
    noise: Noise,
    script: VecDeque<u64>,
    script_recipe: Option<String>,
}

impl DeviceLatency {
    pub(crate) fn new(
        seed: u64,
        module: u32,
        slowdown: f64,
        noise: Noise,
        script: Vec<u64>,
        script_recipe: Option<String>,
    ) -> Self {
        let rng = StdRng::seed_from_u64(module_seed(seed, module));
        Self { rng, slowdown, noise, script: script.into(), script_recipe }
    }

    /// Restarts the random stream as if configured with `seed` (script and model unchanged).
    pub(crate) fn reseed(&mut self, seed: u64, module: u32) {
        self.rng = StdRng::seed_from_u64(module_seed(seed, module));
    }

    /// Latency in ns of the next launch of recipe `recipe` with base latency `base_ns`: the
    /// next script entry if any (and the script applies to this recipe), else
    /// round(base_ns × slowdown × noise factor).
    pub(crate) fn next_launch_ns(&mut self, base_ns: u64, recipe: &str) -> u64 {
        if self.script_recipe.as_deref().is_none_or(|r| r == recipe)
            && let Some(ns) = self.script.pop_front()
        {
            return ns;
        }
        let f = self.noise.factor(&mut self.rng);
        (base_ns as f64 * self.slowdown * f).round().clamp(0.0, super::config::MAX_SCRIPT_NS as f64) as u64
    }
}

#[cfg(test)]
mod tests {
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
    fn device_latency_is_reproducible_and_module_specific() {
        let noise = Noise::Reference { delay_factor: 1.0 };
        let draw = |module| {
            let mut d = DeviceLatency::new(42, module, 2.0, noise.clone(), vec![], None);
            (0..50).map(|_| d.next_launch_ns(1000, "r")).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        // factor >= 1 with reference noise, times slowdown 2.
        assert!(draw(3).iter().all(|&ns| ns >= 2000));
    }

    #[test]
    fn script_overrides_then_model_resumes() {
        let mut d = DeviceLatency::new(0, 0, 3.0, Noise::None, vec![5, 7], None);
        assert_eq!([d.next_launch_ns(100, "a"), d.next_launch_ns(100, "b"), d.next_launch_ns(100, "a")], [5, 7, 300]);
        let mut d = DeviceLatency::new(0, 0, 3.0, Noise::None, vec![5, 7], Some("fwd".into()));
        let got = [d.next_launch_ns(100, "acc"), d.next_launch_ns(100, "fwd"), d.next_launch_ns(10, "acc")];
        assert_eq!(got, [300, 5, 30]);
        assert_eq!([d.next_launch_ns(100, "fwd"), d.next_launch_ns(100, "fwd")], [7, 300]);
    }

    #[test]
    fn reseeding_replays_the_stream() {
        let noise = Noise::Reference { delay_factor: 1.0 };
        let mut a = DeviceLatency::new(1, 3, 1.0, noise.clone(), vec![], None);
        let _ = a.next_launch_ns(1000, "x");
        a.reseed(9, 3);
        let first: Vec<u64> = (0..20).map(|_| a.next_launch_ns(1000, "x")).collect();
        let mut b = DeviceLatency::new(9, 3, 1.0, noise, vec![], None);
        let second: Vec<u64> = (0..20).map(|_| b.next_launch_ns(1000, "x")).collect();
        assert_eq!(first, second);
        assert!(first.iter().any(|&x| x != first[0]));
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
}
