//! Seeding and the one version-stable random number generator, shared with the mock device:
//! re-exported from `latency_noise::rng` (see there for the algorithm, sources and why not
//! `rand::rngs::StdRng`).

pub use latency_noise::rng::{StableRng, split_seed, splitmix64, stream};
