//! Tuning statistics laid out for one element-wise SUM all-reduce.
//!
//! Owns: [`LocalStats`] (one rank's contribution) and [`from_reduced`]. Must not touch
//! collectives themselves (the scheduler runs the all-reduce).
//!
//! Layout of the f64 vector (length N·K·M + N·K): first the N x K x M latency tensor (ns,
//! index (n·K + k)·M + m), then the N x K measured step times (ns, index n·K + k). Rank n writes
//! only its own rows and leaves zeros elsewhere, like the reference's [N, 44, M] tensor
//! (digest §3.3 item 2). Because every element has exactly one non-zero contributor, the sum is
//! exact (x + 0 = x in IEEE arithmetic) whatever the reduction order or algorithm (ring, tree),
//! so every rank receives bit-identical statistics and — the tuner being a pure function —
//! computes the identical threshold, with no broadcast.

use crate::trace::{LatencyTrace, TraceError};

/// One rank's statistics over a window of K steps.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalStats {
    rank: usize,
    world_size: usize,
    steps: usize,
    micro_batches: usize,
    vec: Vec<f64>,
}

impl LocalStats {
    /// Zeroed statistics of rank index `rank` (0..world_size) for a window of `steps` steps of
    /// `micro_batches` micro-batches. Errors: [`TraceError::Shape`] if any size is 0 or `rank`
    /// is out of range.
    pub fn new(rank: usize, world_size: usize, steps: usize, micro_batches: usize) -> Result<Self, TraceError> {
        if world_size == 0 || steps == 0 || micro_batches == 0 || rank >= world_size {
            return Err(TraceError::Shape(format!(
                "stats: rank {rank} of {world_size}, {steps} steps, {micro_batches} micro-batches"
            )));
        }
        Ok(Self { rank, world_size, steps, micro_batches, vec: vec![0.0; world_size * steps * (micro_batches + 1)] })
    }

    /// Record window step `k` (0..steps): this rank's M latencies (ns) and the measured step
    /// time (ns). Errors: [`TraceError::Shape`] if `k` is out of range or the slice is not M long.
    pub fn record(&mut self, k: usize, latencies_ns: &[f64], step_time_ns: f64) -> Result<(), TraceError> {
        let m = self.micro_batches;
        if k >= self.steps || latencies_ns.len() != m {
            return Err(TraceError::Shape(format!(
                "stats: step {k} of {}, {} latencies for M = {m}",
                self.steps,
                latencies_ns.len()
            )));
        }
        let base = (self.rank * self.steps + k) * m;
        self.vec[base..base + m].copy_from_slice(latencies_ns);
        let tail = self.world_size * self.steps * m;
        self.vec[tail + self.rank * self.steps + k] = step_time_ns;
        Ok(())
    }

    /// The vector to SUM all-reduce (length N·K·(M + 1)).
    pub fn to_reduce_vec(&self) -> &[f64] {
        &self.vec
    }
}

/// Rebuild the full trace from the reduced vector: latencies as laid out; per-step overhead =
/// mean over ranks of the measured step time - max over ranks of compute time, clamped at 0.
/// Rank ids 0..N, step ids 0..K. Errors: [`TraceError::Shape`] if the length is not
/// N·K·(M + 1); any [`LatencyTrace::new`] validation error (negative or non-finite values).
pub fn from_reduced(
    world_size: usize,
    steps: usize,
    micro_batches: usize,
    reduced: &[f64],
) -> Result<LatencyTrace, TraceError> {
    let (n, k, m) = (world_size, steps, micro_batches);
    if reduced.len() != n * k * (m + 1) {
        return Err(TraceError::Shape(format!("reduced stats: {} values for N={n}, K={k}, M={m}", reduced.len())));
    }
    let tail = &reduced[n * k * m..];
    let mut lat = vec![0.0; n * k * m];
    let mut overhead = Vec::with_capacity(k);
    for s in 0..k {
        let mut max_c = 0.0f64;
        for r in 0..n {
            let src = &reduced[(r * k + s) * m..(r * k + s + 1) * m];
            lat[(s * n + r) * m..(s * n + r + 1) * m].copy_from_slice(src);
            max_c = max_c.max(src.iter().sum());
        }
        let mean_step = (0..n).map(|r| tail[r * k + s]).sum::<f64>() / n as f64;
        overhead.push((mean_step - max_c).max(0.0));
    }
    LatencyTrace::new("all-reduced statistics", (0..n as u32).collect(), (0..k as u64).collect(), m, lat, overhead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    use crate::sim::rng;
    use crate::tune::{TuneConfig, tune};

    /// Simulated ranks each fill their own statistics, the vectors are summed in several
    /// orders (linear, reversed, pairwise tree), and every rank tunes on its copy: all copies
    /// and all thresholds are bit-identical.
    #[test]
    fn every_rank_reaches_the_same_threshold() {
        let (n, k, m) = (7usize, 5usize, 6usize);
        let mut rng = rng::stream(9, 0);
        let locals: Vec<LocalStats> = (0..n)
            .map(|r| {
                let mut st = LocalStats::new(r, n, k, m).expect("valid");
                for s in 0..k {
                    let lat: Vec<f64> = (0..m).map(|_| 1e6 * (1.0 + 3.0 * rng.random::<f64>().powi(3))).collect();
                    let step = lat.iter().sum::<f64>() * 1.5 + 1e6;
                    st.record(s, &lat, step).expect("in range");
                }
                st
            })
            .collect();
        let add = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<f64>>();
        let zero = vec![0.0; n * k * (m + 1)];
        let linear = locals.iter().fold(zero.clone(), |acc, l| add(&acc, l.to_reduce_vec()));
        let reversed = locals.iter().rev().fold(zero, |acc, l| add(&acc, l.to_reduce_vec()));
        let mut level: Vec<Vec<f64>> = locals.iter().map(|l| l.to_reduce_vec().to_vec()).collect();
        while level.len() > 1 {
            level = level.chunks(2).map(|c| if c.len() == 2 { add(&c[0], &c[1]) } else { c[0].clone() }).collect();
        }
        let tree = level.pop().expect("one vector");
        assert_eq!(linear, reversed);
        assert_eq!(linear, tree);
        let thresholds: Vec<_> = [linear, reversed, tree]
            .iter()
            .cycle()
            .take(n)
            .map(|v| {
                let t = from_reduced(n, k, m, v).expect("valid");
                tune(&t, &TuneConfig::default()).best.threshold_ns
            })
            .collect();
        assert!(thresholds.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()), "{thresholds:?}");
        // The rebuilt trace holds each rank's own data.
        let t = from_reduced(n, k, m, locals[0].to_reduce_vec()).expect("valid");
        assert!(t.step_matrix(0)[..m].iter().all(|&x| x > 0.0));
        assert!(t.step_matrix(0)[m..].iter().all(|&x| x == 0.0));
        assert!(from_reduced(n, k, m, &[0.0; 3]).is_err());
    }
}
