//! The per-device latency model of the mock: base latency × slowdown × noise, or a script.
//!
//! Owns: the seeded per-module random stream, the latency key (common random numbers) and the
//! latency script (the noise distributions themselves, the DropCompute reference multiplier
//! included, are `latency_noise`'s). Must not touch: streams or time (callers decide when a
//! latency is drawn: at enqueue time, so a module's sequence depends only on its own launch
//! order, never on thread timing).
//!
//! Two ways to draw the noise of a launch:
//! - sequential (no key set): the next draw of the module's stream `stream(seed, module)`;
//! - keyed (a [`LatencyKey`] set by the job, e.g. through `Fault::LatencyKey` before each
//!   micro-batch): a pure function of (configured seed, module, step, micro-batch, recipe name,
//!   launch count of that recipe under the key). Two runs of a job (baseline and DropCompute)
//!   then see the same latency for every micro-batch both compute, whatever either dropped
//!   before, in both time modes and across a resume: common random numbers, so a comparison
//!   measures the threshold and not the noise.

use std::collections::{HashMap, VecDeque};

use latency_noise::{Noise, NoiseSampler, StableRng, split_seed, stream};

/// The (step, micro-batch) a job is about to launch on a module, set through
/// `Fault::LatencyKey`; while set, latencies of that module are keyed draws (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LatencyKey {
    /// Training step.
    pub step: u64,
    /// Micro-batch index within the step.
    pub micro_batch: u32,
}

/// One module's latency generator.
#[derive(Debug)]
pub(crate) struct DeviceLatency {
    /// Stream `module` of the seed: `latency_noise::stream(seed, module)`.
    rng: StableRng,
    /// `split_seed(configured seed, module)`: the root of keyed draws (never reseeded).
    key_root: u64,
    /// The current key and the launches drawn under it per recipe name.
    key: Option<(LatencyKey, HashMap<String, u64>)>,
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
        let key_root = split_seed(seed, u64::from(module));
        // The configuration was validated (`MockConfig::validate`); an invalid model cannot reach
        // here, and would mean factor 1.
        let noise = noise.sampler().unwrap_or(NoiseSampler::One);
        Self { rng, key_root, key: None, slowdown, noise, script: script.into(), script_recipe }
    }

    /// Sets (or clears, `None`) the key of keyed draws; launch counts restart.
    pub(crate) fn set_key(&mut self, key: Option<LatencyKey>) {
        self.key = key.map(|k| (k, HashMap::new()));
    }

    /// Restarts the sequential random stream as if configured with `seed` (script, model and
    /// keyed draws unchanged).
    pub(crate) fn reseed(&mut self, seed: u64, module: u32) {
        self.rng = stream(seed, u64::from(module));
    }

    /// Latency in ns of the next launch of recipe `recipe` with base latency `base_ns`: the
    /// next script entry if any (and the script applies to this recipe), else
    /// round(base_ns × slowdown × noise factor), the factor a keyed draw when a key is set
    /// (module docs), else the next sequential draw.
    pub(crate) fn next_launch_ns(&mut self, base_ns: u64, recipe: &str) -> u64 {
        if self.script_recipe.as_deref().is_none_or(|r| r == recipe)
            && let Some(ns) = self.script.pop_front()
        {
            return ns;
        }
        let f = match &mut self.key {
            Some((k, counts)) => {
                let n = counts.entry(recipe.to_string()).or_insert(0);
                let index = split_seed(split_seed(k.step, u64::from(k.micro_batch)), fnv1a(recipe) ^ *n);
                *n += 1;
                self.noise.sample(&mut stream(self.key_root, index))
            }
            None => self.noise.sample(&mut self.rng),
        };
        (base_ns as f64 * self.slowdown * f).round().clamp(0.0, super::config::MAX_SCRIPT_NS as f64) as u64
    }
}

/// FNV-1a 64 of `s` (Fowler, Noll, Vo): a stable hash of a recipe name (std's hasher is not
/// guaranteed stable across releases).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_draws_depend_only_on_the_key_not_on_what_came_before() {
        let noise = Noise::Reference { delay_factor: 1.0 };
        let key = |step, micro_batch| Some(LatencyKey { step, micro_batch });
        // Run a: micro-batches 0..4 of step 0, then step 1. Run b: only micro-batch 0 and 3 of
        // step 0 (1 and 2 dropped), a reseed, then step 1.
        let mut a = DeviceLatency::new(7, 2, 1.5, noise.clone(), vec![], None);
        let mut got_a = Vec::new();
        for (s, i) in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)] {
            a.set_key(key(s, i));
            got_a.push((s, i, a.next_launch_ns(1_000_000, "fwd"), a.next_launch_ns(100, "acc")));
        }
        let mut b = DeviceLatency::new(7, 2, 1.5, noise.clone(), vec![], None);
        b.set_key(None);
        let _ = b.next_launch_ns(5, "other"); // a sequential draw in between changes nothing
        let mut got_b = Vec::new();
        for (s, i) in [(0, 0), (0, 3), (1, 0), (1, 1)] {
            if s == 1 {
                b.reseed(99, 2);
            }
            b.set_key(key(s, i));
            got_b.push((s, i, b.next_launch_ns(1_000_000, "fwd"), b.next_launch_ns(100, "acc")));
        }
        let common: Vec<_> = got_a.iter().filter(|(s, i, ..)| !(*s == 0 && (*i == 1 || *i == 2))).copied().collect();
        assert_eq!(common, got_b);
        // Distinct keys, recipes and repeated launches draw distinct factors.
        let all: std::collections::HashSet<u64> = got_a.iter().flat_map(|&(.., f, g)| [f, g]).collect();
        assert!(all.len() > 6, "{got_a:?}");
        let mut c = DeviceLatency::new(7, 2, 1.5, noise.clone(), vec![], None);
        c.set_key(key(0, 0));
        let (x, y) = (c.next_launch_ns(1_000_000, "fwd"), c.next_launch_ns(1_000_000, "fwd"));
        assert_eq!(x, got_a[0].2);
        assert_ne!(x, y);
        // Another module or seed draws differently for the same key.
        let mut d = DeviceLatency::new(7, 3, 1.5, noise.clone(), vec![], None);
        d.set_key(key(0, 0));
        let mut e = DeviceLatency::new(8, 2, 1.5, noise, vec![], None);
        e.set_key(key(0, 0));
        assert_ne!(d.next_launch_ns(1_000_000, "fwd"), x);
        assert_ne!(e.next_launch_ns(1_000_000, "fwd"), x);
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
}
