//! Latency noise shared by the CPU mock device (`habana-mock`), the simulator
//! (`dropcompute::sim`) and the command line: a micro-batch takes `base × factor`, the factor
//! drawn from a [`Noise`] model (the DropCompute reference's injected straggler delay, or a
//! standard distribution).
//!
//! Owns: the one definition of the reference distribution ([`reference_multiplier_pmf`]), the
//! [`Noise`] type with its command-line syntax, moments and prepared sampler ([`NoiseSampler`]),
//! the alias-table sampler ([`DiscreteSampler`]) and seeding with the one version-stable
//! generator ([`rng`]: [`StableRng`], [`stream`], [`splitmix64`]). Must not
//! touch: devices, clocks or policies. A leaf crate: it depends on no other crate of this
//! workspace, so the mock and the product both use it.

pub mod rng;

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, Exp, LogNormal, Normal};
use serde::{Deserialize, Serialize};

pub use rng::{StableRng, split_seed, splitmix64, stream};

/// A bad noise specification or parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("noise {spec:?}: {why}")]
pub struct NoiseError {
    /// The text or the model as given.
    pub spec: String,
    /// The rule it breaks (expected syntax or range).
    pub why: String,
}

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

    /// E[length^k] under `probs`.
    pub fn moment(&self, k: i32) -> f64 {
        self.lengths.iter().zip(&self.probs).map(|(&l, p)| f64::from(l).powi(k) * p).sum()
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
    ///
    /// # Errors
    /// [`NoiseError`] if `weights` is empty, longer than u32::MAX, has a negative or non-finite
    /// entry, or sums to zero.
    pub fn new(weights: &[f64]) -> Result<Self, NoiseError> {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        if n == 0
            || u32::try_from(n).is_err()
            || weights.iter().any(|w| !w.is_finite() || *w < 0.0)
            || !(total > 0.0 && total.is_finite())
        {
            return Err(NoiseError {
                spec: format!("{n} discrete weights summing to {total}"),
                why: "need at least one finite, non-negative weight and a positive sum".into(),
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

    /// Draw an index in 0..len (one uniform draw from `rng`).
    #[inline]
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let u: f64 = rng.random::<f64>() * self.prob.len() as f64;
        let i = (u as usize).min(self.prob.len() - 1);
        if u - (i as f64) < self.prob[i] { i } else { self.alias[i] as usize }
    }
}

/// Multiplicative noise on a micro-batch's base latency: latency = base × factor, the factor
/// drawn per micro-batch. One type for the mock device (its `MockConfig`), the simulator and
/// the `--noise` flags (syntax: [`Noise::from_str`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Noise {
    /// Factor 1.
    #[default]
    None,
    /// DropCompute reference injected delay: factor = 1 + 0.5 · `delay_factor` · mult, mult
    /// drawn from [`reference_multiplier_pmf`] (mean 1). Mean factor 1 + 0.5·delay_factor.
    /// Source: reference/dropcompute.md §4, "Noise injected in experiments".
    Reference {
        /// The reference scripts use 1.0 (>= 0).
        delay_factor: f64,
    },
    /// Factor = exp(N(mu, sigma²)).
    LogNormal {
        /// Mean of the underlying normal.
        mu: f64,
        /// Standard deviation of the underlying normal (>= 0).
        sigma: f64,
    },
    /// Factor = N(1, cv²), clipped below at 1e-3 so latencies stay positive.
    Normal {
        /// Coefficient of variation (standard deviation of the factor), >= 0.
        cv: f64,
    },
    /// Factor = 1 + X with X exponential of mean `mean`: the shifted exponential of the
    /// straggler literature (Lee et al., "Speeding Up Distributed Machine Learning Using
    /// Codes", 2017), an added delay as a fraction of the base.
    Exponential {
        /// Mean added fraction (> 0).
        mean: f64,
    },
    /// Sequence-length-driven cost (What-if study, OSDI'25: cost ∝ Σ s_i²): factor =
    /// Σ_{i=1..samples} s_i² / E[Σ s_i²], lengths s_i from the reference length distribution.
    SeqLen {
        /// Samples per micro-batch (>= 1).
        samples: u32,
    },
}

/// Largest accepted `delay_factor`, `sigma`, `cv` and exponential `mean` from the command line:
/// one emulated micro-batch stays within minutes (the mock sleeps it in real time).
const MAX_DELAY_FACTOR: f64 = 100.0;
const MAX_SIGMA: f64 = 4.0;
const MAX_CV: f64 = 10.0;
const MAX_EXP_MEAN: f64 = 100.0;
const MAX_SAMPLES: u32 = 4096;

impl Noise {
    /// The log-normal factor of mean 1 and log-space standard deviation `sigma`:
    /// exp(N(-σ²/2, σ²)).
    pub fn lognormal_mean_one(sigma: f64) -> Self {
        Noise::LogNormal { mu: -sigma * sigma / 2.0, sigma }
    }

    /// Every parameter finite and in range (delay factor, sigma and cv >= 0, exponential mean
    /// > 0, samples >= 1).
    pub fn is_valid(&self) -> bool {
        let ok = |v: f64, min: f64| v.is_finite() && v >= min;
        match *self {
            Noise::None => true,
            Noise::Reference { delay_factor } => ok(delay_factor, 0.0),
            Noise::LogNormal { mu, sigma } => mu.is_finite() && ok(sigma, 0.0),
            Noise::Normal { cv } => ok(cv, 0.0),
            Noise::Exponential { mean } => mean.is_finite() && mean > 0.0,
            Noise::SeqLen { samples } => samples >= 1,
        }
    }

    /// E[factor], exact (normal: before clipping, negligible for cv <= 0.3).
    pub fn mean(&self) -> f64 {
        match *self {
            Noise::None | Noise::Normal { .. } | Noise::SeqLen { .. } => 1.0,
            Noise::Reference { delay_factor } => 1.0 + 0.5 * delay_factor,
            Noise::LogNormal { mu, sigma } => (mu + sigma * sigma / 2.0).exp(),
            Noise::Exponential { mean } => 1.0 + mean,
        }
    }

    /// Standard deviation of the factor, exact (normal: before clipping).
    pub fn std(&self) -> f64 {
        match *self {
            Noise::None => 0.0,
            Noise::Reference { delay_factor } => {
                let p = reference_multiplier_pmf();
                0.5 * delay_factor * (p.moment(2) / p.mean_length.powi(2) - 1.0).max(0.0).sqrt()
            }
            Noise::LogNormal { mu, sigma } => {
                let s2 = sigma * sigma;
                (((s2).exp() - 1.0) * (2.0 * mu + s2).exp()).sqrt()
            }
            Noise::Normal { cv } => cv,
            Noise::Exponential { mean } => mean,
            Noise::SeqLen { samples } => {
                let p = reference_multiplier_pmf();
                let n = f64::from(samples);
                (n * (p.moment(4) - p.moment(2).powi(2))).sqrt() / (n * p.moment(2))
            }
        }
    }

    /// Skewness E[(X - μ)³]/σ³ of the factor X, exact (normal: 0, before clipping; 0 when the
    /// factor is constant). Reference: the skewness of the length pmf (the factor is affine in
    /// the length); log-normal: (e^{σ²} + 2)·√(e^{σ²} - 1); exponential: 2; sequence length:
    /// skew(s²)/√samples (a sum of i.i.d. squared lengths).
    pub fn skewness(&self) -> f64 {
        // Skewness from the raw moments E[Y], E[Y²], E[Y³].
        let from_raw = |m1: f64, m2: f64, m3: f64| {
            let var = m2 - m1 * m1;
            if var <= 0.0 { 0.0 } else { (m3 - 3.0 * m1 * m2 + 2.0 * m1.powi(3)) / var.powf(1.5) }
        };
        match *self {
            Noise::None | Noise::Normal { .. } => 0.0,
            Noise::Reference { delay_factor } => {
                let p = reference_multiplier_pmf();
                if delay_factor == 0.0 { 0.0 } else { from_raw(p.moment(1), p.moment(2), p.moment(3)) }
            }
            Noise::LogNormal { sigma, .. } => {
                let e = (sigma * sigma).exp();
                (e + 2.0) * (e - 1.0).max(0.0).sqrt()
            }
            Noise::Exponential { .. } => 2.0,
            Noise::SeqLen { samples } => {
                let p = reference_multiplier_pmf();
                from_raw(p.moment(2), p.moment(4), p.moment(6)) / f64::from(samples).sqrt()
            }
        }
    }

    /// The prepared sampler (distribution objects and alias tables built once).
    ///
    /// # Errors
    /// [`NoiseError`] naming the parameter when it is out of range ([`Noise::is_valid`]).
    pub fn sampler(&self) -> Result<NoiseSampler, NoiseError> {
        let bad = |why: &str| NoiseError { spec: format!("{self:?}"), why: why.into() };
        if !self.is_valid() {
            return Err(bad(
                "parameters out of range (delay_factor, sigma, cv >= 0 and finite; mean > 0; samples >= 1)",
            ));
        }
        Ok(match *self {
            Noise::None => NoiseSampler::One,
            Noise::Reference { delay_factor } => {
                let p = reference_multiplier_pmf();
                NoiseSampler::Reference {
                    table: DiscreteSampler::new(&p.probs)?,
                    per_length: 0.5 * delay_factor / p.mean_length,
                }
            }
            Noise::LogNormal { mu, sigma } => {
                NoiseSampler::LogNormal(LogNormal::new(mu, sigma).map_err(|_| bad("sigma must be >= 0"))?)
            }
            Noise::Normal { cv } => NoiseSampler::Normal(Normal::new(1.0, cv).map_err(|_| bad("cv must be >= 0"))?),
            Noise::Exponential { mean } => {
                NoiseSampler::Exponential(Exp::new(1.0 / mean).map_err(|_| bad("mean must be > 0"))?)
            }
            Noise::SeqLen { samples } => {
                let p = reference_multiplier_pmf();
                NoiseSampler::SeqLen {
                    table: DiscreteSampler::new(&p.probs)?,
                    samples,
                    inv_mean: 1.0 / (f64::from(samples) * p.moment(2)),
                }
            }
        })
    }
}

/// Command-line syntax: `none`, `reference` (delay factor 1) or `reference:DELAY_FACTOR`
/// (0..=100), `lognormal:SIGMA` (mean-one log-normal, 0 < SIGMA <= 4), `normal:CV` (0..=10),
/// `exponential:MEAN` (0 < MEAN <= 100), `seqlen:SAMPLES` (1..=4096). Case-insensitive.
impl FromStr for Noise {
    type Err = NoiseError;

    fn from_str(s: &str) -> Result<Self, NoiseError> {
        let bad = || NoiseError {
            spec: s.to_string(),
            why: "expected none, reference[:DELAY_FACTOR] (0..=100), lognormal:SIGMA (0 < SIGMA <= 4), \
                  normal:CV (0..=10), exponential:MEAN (0 < MEAN <= 100) or seqlen:SAMPLES (1..=4096)"
                .into(),
        };
        let t = s.trim().to_ascii_lowercase();
        let num = |p: &str, lo: f64, lo_open: bool, hi: f64| match p.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && (x > lo || (!lo_open && x == lo)) && x <= hi => Ok(x),
            _ => Err(bad()),
        };
        match t.split_once(':') {
            None => match t.as_str() {
                "none" => Ok(Noise::None),
                "reference" => Ok(Noise::Reference { delay_factor: 1.0 }),
                _ => Err(bad()),
            },
            Some(("reference", p)) => Ok(Noise::Reference { delay_factor: num(p, 0.0, false, MAX_DELAY_FACTOR)? }),
            Some(("lognormal", p)) => Ok(Noise::lognormal_mean_one(num(p, 0.0, true, MAX_SIGMA)?)),
            Some(("normal", p)) => Ok(Noise::Normal { cv: num(p, 0.0, false, MAX_CV)? }),
            Some(("exponential", p)) => Ok(Noise::Exponential { mean: num(p, 0.0, true, MAX_EXP_MEAN)? }),
            Some(("seqlen", p)) => match p.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_SAMPLES).contains(&n) => Ok(Noise::SeqLen { samples: n }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// The command-line form (parses back to an equal value for every value [`Noise::from_str`]
/// produces; a log-normal not of mean one prints as `lognormal(mu=..,sigma=..)`).
impl fmt::Display for Noise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Noise::None => write!(f, "none"),
            Noise::Reference { delay_factor } => write!(f, "reference:{delay_factor}"),
            Noise::LogNormal { mu, sigma } if mu == -sigma * sigma / 2.0 => write!(f, "lognormal:{sigma}"),
            Noise::LogNormal { mu, sigma } => write!(f, "lognormal(mu={mu},sigma={sigma})"),
            Noise::Normal { cv } => write!(f, "normal:{cv}"),
            Noise::Exponential { mean } => write!(f, "exponential:{mean}"),
            Noise::SeqLen { samples } => write!(f, "seqlen:{samples}"),
        }
    }
}

/// A ready-to-sample [`Noise`] (see [`Noise::sampler`]).
#[derive(Clone, Debug)]
pub enum NoiseSampler {
    /// Factor 1 (no draw).
    One,
    /// See [`Noise::Reference`]: 1 + `per_length` · length.
    Reference {
        /// Alias table over the 999 lengths.
        table: DiscreteSampler,
        /// 0.5 · delay_factor / E[length].
        per_length: f64,
    },
    /// See [`Noise::LogNormal`].
    LogNormal(LogNormal<f64>),
    /// See [`Noise::Normal`].
    Normal(Normal<f64>),
    /// See [`Noise::Exponential`]: 1 + Exp.
    Exponential(Exp<f64>),
    /// See [`Noise::SeqLen`].
    SeqLen {
        /// Alias table over the 999 lengths.
        table: DiscreteSampler,
        /// Lengths drawn per factor.
        samples: u32,
        /// 1 / E[Σ s²].
        inv_mean: f64,
    },
}

impl NoiseSampler {
    /// One factor (> 0, finite).
    #[inline(always)]
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            NoiseSampler::One => 1.0,
            NoiseSampler::Reference { table, per_length } => 1.0 + per_length * (table.sample(rng) + 1) as f64,
            NoiseSampler::LogNormal(d) => d.sample(rng),
            NoiseSampler::Normal(d) => d.sample(rng).max(1e-3),
            NoiseSampler::Exponential(d) => 1.0 + d.sample(rng),
            NoiseSampler::SeqLen { table, samples, inv_mean } => {
                let mut sq = 0.0;
                for _ in 0..*samples {
                    let s = (table.sample(rng) + 1) as f64;
                    sq += s * s;
                }
                sq * inv_mean
            }
        }
    }
}

#[cfg(test)]
mod tests;
