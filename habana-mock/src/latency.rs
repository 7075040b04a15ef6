//! The per-device latency model of the mock: base latency × slowdown × noise, or a script.
//!
//! Owns: the seeded per-module random stream and the latency script (the noise distributions
//! themselves, the DropCompute reference multiplier included, are `latency_noise`'s). Must not touch: streams or time (callers
//! decide when a latency is drawn: at enqueue time, so a module's sequence depends only on its
//! own launch order, never on thread timing).

use std::collections::VecDeque;

use latency_noise::{Noise, NoiseSampler, StableRng, stream};

/// One module's latency generator.
#[derive(Debug)]
pub(crate) struct DeviceLatency {
    /// Stream `module` of the seed: `latency_noise::stream(seed, module)`.
    rng: StableRng,
    slowdown: f64,
    noise: NoiseSampler,
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
        let rng = stream(seed, u64::from(module));
        // The configuration was validated (`MockConfig::validate`); an invalid model cannot reach
        // here, and would mean factor 1.
        let noise = noise.sampler().unwrap_or(NoiseSampler::One);
        Self { rng, slowdown, noise, script: script.into(), script_recipe }
    }

    /// Restarts the random stream as if configured with `seed` (script and model unchanged).
    pub(crate) fn reseed(&mut self, seed: u64, module: u32) {
        self.rng = stream(seed, u64::from(module));
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
        let f = self.noise.sample(&mut self.rng);
        (base_ns as f64 * self.slowdown * f).round().clamp(0.0, super::config::MAX_SCRIPT_NS as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
