//! Noise models for micro-batch latencies, including the reference's injected multiplier.
//!
//! Owns: [`reference_multiplier_pmf`] (the one place the reference distribution is built; the
//! mock device reuses it), the alias-table sampler [`DiscreteSampler`], and [`NoiseModel`] (one
//! micro-batch latency draw, in ns). Must not touch: the policy, stepping or aggregation.

use rand::Rng;
use rand_distr::{Distribution, Exp, LogNormal, Normal, StandardNormal};

use crate::sim::SimError;

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

/// O(1) sampler of a finite discrete distribution (Walker/Vose alias method).
#[derive(Clone, Debug)]
pub struct DiscreteSampler {
    prob: Vec<f64>,
    alias: Vec<u32>,
}

impl DiscreteSampler {
    /// Build from non-negative weights (normalized internally).
    /// Errors: [`SimError::InvalidParameter`] if `weights` is empty, longer than u32::MAX, has a
    /// negative or non-finite entry, or sums to zero.
    pub fn new(weights: &[f64]) -> Result<Self, SimError> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        if n == 0
            || u32::try_from(n).is_err()
            || weights.iter().any(|w| !w.is_finite() || *w < 0.0)
            || !(total > 0.0 && total.is_finite())
        {
            return Err(SimError::InvalidParameter {
                what: "discrete weights",
                value: format!("{n} weights summing to {total}"),
            });
        }
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut prob = vec![1.0; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| scaled[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            prob[s] = scaled[s];
            alias[s] = l as u32;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        Ok(Self { prob, alias })
    }

    /// Draw an index in 0..len.
    #[inline]
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let u: f64 = rng.random::<f64>() * self.prob.len() as f64;
        let i = (u as usize).min(self.prob.len() - 1);
        if u - (i as f64) < self.prob[i] { i } else { self.alias[i] as usize }
    }
}

/// Distribution of one micro-batch latency (ns) on a healthy worker.
#[derive(Clone, Debug, PartialEq)]
pub enum NoiseModel {
    /// i.i.d. normal N(mean, std²), clamped at 0 (negligible for std/mean <= 0.3).
    Normal { mean_ns: f64, std_ns: f64 },
    /// i.i.d. log-normal with the given mean and coefficient of variation (std/mean).
    LogNormal { mean_ns: f64, cv: f64 },
    /// i.i.d. exponential with the given mean.
    Exponential { mean_ns: f64 },
    /// The reference's injected noise: base·(1 + 0.5·delay_factor·mult), mult from
    /// [`reference_multiplier_pmf`] (reference §4; mean latency base·(1 + 0.5·delay_factor)).
    Reference { base_ns: f64, delay_factor: f64 },
    /// Sequence-length-driven cost (OSDI'25 what-if study, cost ∝ Σ s_i²):
    /// fixed_ns + ns_per_token2 · Σ_{i=1..samples} s_i², lengths s_i drawn from the reference
    /// length distribution (1..999).
    SeqLen { samples: u32, ns_per_token2: f64, fixed_ns: f64 },
}

/// A ready-to-sample [`NoiseModel`] (distribution objects built once).
#[derive(Clone, Debug)]
pub enum LatencySampler {
    /// See [`NoiseModel::Normal`].
    Normal(Normal<f64>),
    /// See [`NoiseModel::LogNormal`].
    LogNormal(LogNormal<f64>),
    /// See [`NoiseModel::Exponential`] (Exp of rate 1/mean).
    Exponential(Exp<f64>),
    /// See [`NoiseModel::Reference`]: base, 0.5·delay_factor·base/mean_length per length unit.
    Reference {
        /// Alias table over the 999 lengths.
        table: DiscreteSampler,
        /// base_ns.
        base_ns: f64,
        /// ns added per unit of length.
        ns_per_length: f64,
    },
    /// See [`NoiseModel::SeqLen`].
    SeqLen {
        /// Alias table over the 999 lengths.
        table: DiscreteSampler,
        /// Samples per micro-batch.
        samples: u32,
        /// ns per squared token.
        ns_per_token2: f64,
        /// Fixed cost.
        fixed_ns: f64,
    },
}

impl NoiseModel {
    /// Mean micro-batch latency (ns), exact for every model.
    pub fn mean_ns(&self) -> f64 {
        match *self {
            NoiseModel::Normal { mean_ns, .. } => mean_ns,
            NoiseModel::LogNormal { mean_ns, .. } => mean_ns,
            NoiseModel::Exponential { mean_ns } => mean_ns,
            NoiseModel::Reference { base_ns, delay_factor } => base_ns * (1.0 + 0.5 * delay_factor),
            NoiseModel::SeqLen { samples, ns_per_token2, fixed_ns } => {
                let p = reference_multiplier_pmf();
                let m2: f64 = p.lengths.iter().zip(&p.probs).map(|(&k, q)| f64::from(k).powi(2) * q).sum();
                fixed_ns + f64::from(samples) * ns_per_token2 * m2
            }
        }
    }

    /// Standard deviation of one micro-batch latency (ns), exact for every model (normal:
    /// before clamping at 0).
    pub fn std_ns(&self) -> f64 {
        match *self {
            NoiseModel::Normal { std_ns, .. } => std_ns,
            NoiseModel::LogNormal { mean_ns, cv } => mean_ns * cv,
            NoiseModel::Exponential { mean_ns } => mean_ns,
            NoiseModel::Reference { base_ns, delay_factor } => {
                let p = reference_multiplier_pmf();
                let var: f64 = (0..p.lengths.len()).map(|i| p.probs[i] * (p.multiplier(i) - 1.0).powi(2)).sum();
                0.5 * delay_factor * base_ns * var.sqrt()
            }
            NoiseModel::SeqLen { samples, ns_per_token2, .. } => {
                let p = reference_multiplier_pmf();
                let m =
                    |k: i32| -> f64 { p.lengths.iter().zip(&p.probs).map(|(&l, q)| f64::from(l).powi(k) * q).sum() };
                let var_sq = m(4) - m(2).powi(2);
                ns_per_token2 * (f64::from(samples) * var_sq).sqrt()
            }
        }
    }

    /// Build the sampler. Errors: [`SimError::InvalidParameter`] naming the parameter when a
    /// mean, std, cv or factor is negative or not finite (or a mean is zero where required).
    pub fn sampler(&self) -> Result<LatencySampler, SimError> {
        let bad = |what: &'static str, v: f64| SimError::InvalidParameter { what, value: v.to_string() };
        let pos = |what: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 { Ok(v) } else { Err(bad(what, v)) }
        };
        let nonneg = |what: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 { Ok(v) } else { Err(bad(what, v)) }
        };
        Ok(match *self {
            NoiseModel::Normal { mean_ns, std_ns } => {
                let m = pos("normal mean_ns", mean_ns)?;
                let s = nonneg("normal std_ns", std_ns)?;
                LatencySampler::Normal(Normal::new(m, s).map_err(|_| bad("normal std_ns", s))?)
            }
            NoiseModel::LogNormal { mean_ns, cv } => {
                let m = pos("lognormal mean_ns", mean_ns)?;
                let cv = nonneg("lognormal cv", cv)?;
                let sigma2 = (1.0 + cv * cv).ln();
                let mu = m.ln() - sigma2 / 2.0;
                LatencySampler::LogNormal(LogNormal::new(mu, sigma2.sqrt()).map_err(|_| bad("lognormal cv", cv))?)
            }
            NoiseModel::Exponential { mean_ns } => {
                let m = pos("exponential mean_ns", mean_ns)?;
                LatencySampler::Exponential(Exp::new(1.0 / m).map_err(|_| bad("exponential mean_ns", m))?)
            }
            NoiseModel::Reference { base_ns, delay_factor } => {
                let p = reference_multiplier_pmf();
                LatencySampler::Reference {
                    table: DiscreteSampler::new(&p.probs)?,
                    base_ns: pos("reference base_ns", base_ns)?,
                    ns_per_length: 0.5 * nonneg("reference delay_factor", delay_factor)? * base_ns / p.mean_length,
                }
            }
            NoiseModel::SeqLen { samples, ns_per_token2, fixed_ns } => {
                let p = reference_multiplier_pmf();
                LatencySampler::SeqLen {
                    table: DiscreteSampler::new(&p.probs)?,
                    samples: samples.max(1),
                    ns_per_token2: pos("seqlen ns_per_token2", ns_per_token2)?,
                    fixed_ns: nonneg("seqlen fixed_ns", fixed_ns)?,
                }
            }
        })
    }
}

impl LatencySampler {
    /// One micro-batch latency (ns, >= 0).
    #[inline]
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            LatencySampler::Normal(d) => d.sample(rng).max(0.0),
            LatencySampler::LogNormal(d) => d.sample(rng),
            LatencySampler::Exponential(d) => d.sample(rng),
            LatencySampler::Reference { table, base_ns, ns_per_length } => {
                base_ns + ns_per_length * (table.sample(rng) + 1) as f64
            }
            LatencySampler::SeqLen { table, samples, ns_per_token2, fixed_ns } => {
                let mut sq = 0.0;
                for _ in 0..*samples {
                    let s = (table.sample(rng) + 1) as f64;
                    sq += s * s;
                }
                fixed_ns + ns_per_token2 * sq
            }
        }
    }
}

/// A standard normal draw (exposed for the analytic/MC cross-checks).
pub fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    StandardNormal.sample(rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rng;

    #[test]
    fn reference_pmf_matches_published_statistics() {
        let p = reference_multiplier_pmf();
        assert_eq!(p.lengths.len(), 999);
        assert!((p.probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Digest §4: mean length 87.63; multiplier std 1.16, median 0.62.
        assert!((p.mean_length - 87.63).abs() < 0.01, "{}", p.mean_length);
        let var: f64 = (0..999).map(|i| p.probs[i] * (p.multiplier(i) - 1.0).powi(2)).sum();
        assert!((var.sqrt() - 1.16).abs() < 0.005, "{}", var.sqrt());
        let mut c = 0.0;
        let median = (0..999)
            .find(|&i| {
                c += p.probs[i];
                c >= 0.5
            })
            .map(|i| p.multiplier(i))
            .unwrap_or(f64::NAN);
        assert!((median - 0.62).abs() < 0.01, "{median}");
    }

    #[test]
    fn alias_sampler_reproduces_weights() {
        let w = [1.0, 0.0, 3.0, 6.0];
        let s = DiscreteSampler::new(&w).expect("valid weights");
        let mut r = rng::stream(3, 0);
        let mut counts = [0u32; 4];
        let n = 100_000;
        for _ in 0..n {
            counts[s.sample(&mut r)] += 1;
        }
        for (c, w) in counts.iter().zip(w) {
            let p = f64::from(*c) / f64::from(n);
            // binomial se <= 0.0016
            assert!((p - w / 10.0).abs() < 0.008, "{counts:?}");
        }
        assert!(DiscreteSampler::new(&[]).is_err());
        assert!(DiscreteSampler::new(&[0.0, 0.0]).is_err());
        assert!(DiscreteSampler::new(&[1.0, -1.0]).is_err());
    }

    #[test]
    fn sample_means_match_model_means() {
        let models = [
            NoiseModel::Normal { mean_ns: 100.0, std_ns: 20.0 },
            NoiseModel::LogNormal { mean_ns: 100.0, cv: 0.5 },
            NoiseModel::Exponential { mean_ns: 100.0 },
            NoiseModel::Reference { base_ns: 100.0, delay_factor: 1.0 },
            NoiseModel::SeqLen { samples: 4, ns_per_token2: 0.01, fixed_ns: 10.0 },
        ];
        for m in models {
            let s = m.sampler().expect("valid model");
            let mut r = rng::stream(11, 0);
            let n = 200_000;
            let mean = (0..n).map(|_| s.sample(&mut r)).sum::<f64>() / f64::from(n);
            // All models here have cv <= ~2.5 per draw: se of the mean <= 0.6 %.
            assert!((mean / m.mean_ns() - 1.0).abs() < 0.03, "{m:?}: {mean} vs {}", m.mean_ns());
        }
        assert!(NoiseModel::Normal { mean_ns: -1.0, std_ns: 1.0 }.sampler().is_err());
        assert!(NoiseModel::Exponential { mean_ns: f64::NAN }.sampler().is_err());
    }
}
