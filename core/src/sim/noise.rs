//! The simulator's micro-batch latency model: a base latency in ns times a factor drawn from
//! the shared [`Noise`] type (crate `latency-noise`, the same definitions the mock device
//! samples).
//!
//! Owns: [`LatencyModel`] (base × noise: mean, standard deviation, sampler) and
//! [`LatencySampler`]. Must not touch: the policy, stepping or aggregation; the noise
//! distributions themselves (`latency_noise`).

use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

pub use latency_noise::{DiscreteSampler, Noise, NoiseSampler, ReferencePmf, reference_multiplier_pmf};

use crate::sim::SimError;

/// Distribution of one micro-batch latency (ns) on a healthy worker: `base_ns × factor`, the
/// factor drawn from `noise` (mean [`Noise::mean`], e.g. 1 + 0.5·delay_factor for the
/// reference noise, 1 for normal, mean-one log-normal and sequence length).
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyModel {
    /// Base latency of one micro-batch, ns (> 0).
    pub base_ns: f64,
    /// The factor's distribution.
    pub noise: Noise,
}

/// A ready-to-sample [`LatencyModel`].
#[derive(Clone, Debug)]
pub struct LatencySampler {
    base_ns: f64,
    noise: NoiseSampler,
}

impl LatencyModel {
    /// The model `base_ns × noise`.
    pub fn new(base_ns: f64, noise: Noise) -> Self {
        Self { base_ns, noise }
    }

    /// Mean micro-batch latency (ns), exact.
    pub fn mean_ns(&self) -> f64 {
        self.base_ns * self.noise.mean()
    }

    /// Standard deviation of one micro-batch latency (ns), exact (normal: before clipping).
    pub fn std_ns(&self) -> f64 {
        self.base_ns * self.noise.std()
    }

    /// Build the sampler.
    ///
    /// # Errors
    /// [`SimError::InvalidParameter`] naming `base_ns` when it is not positive and finite, or
    /// `noise` when a noise parameter is out of range.
    pub fn sampler(&self) -> Result<LatencySampler, SimError> {
        if !(self.base_ns.is_finite() && self.base_ns > 0.0) {
            return Err(SimError::InvalidParameter { what: "base_ns", value: self.base_ns.to_string() });
        }
        let noise =
            self.noise.sampler().map_err(|e| SimError::InvalidParameter { what: "noise", value: e.to_string() })?;
        Ok(LatencySampler { base_ns: self.base_ns, noise })
    }
}

impl LatencySampler {
    /// One micro-batch latency (ns, > 0).
    #[inline]
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        self.base_ns * self.noise.sample(rng)
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
    fn latency_is_base_times_the_noise_factor() {
        for noise in [Noise::Normal { cv: 0.2 }, Noise::Reference { delay_factor: 1.0 }, Noise::SeqLen { samples: 4 }] {
            let m = LatencyModel::new(250.0, noise.clone());
            assert_eq!(m.mean_ns(), 250.0 * noise.mean());
            assert_eq!(m.std_ns(), 250.0 * noise.std());
            let (s, f) = (m.sampler().unwrap(), noise.sampler().unwrap());
            let (mut a, mut b) = (rng::stream(11, 0), rng::stream(11, 0));
            for _ in 0..100 {
                assert_eq!(s.sample(&mut a), 250.0 * f.sample(&mut b));
            }
        }
    }

    #[test]
    fn bad_models_name_the_parameter() {
        let e = LatencyModel::new(-1.0, Noise::None).sampler().unwrap_err();
        assert!(matches!(e, SimError::InvalidParameter { what: "base_ns", .. }), "{e:?}");
        let e = LatencyModel::new(1.0, Noise::Exponential { mean: f64::NAN }).sampler().unwrap_err();
        assert!(matches!(e, SimError::InvalidParameter { what: "noise", .. }), "{e:?}");
    }
}
