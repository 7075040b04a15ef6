//! Length buckets: what the length-aware policies know before a micro-batch is launched. A job
//! that pads its sequences to a few length buckets (one compiled graph per bucket) knows each
//! micro-batch's bucket before launching it, so its device time can be predicted from the
//! measured times of earlier micro-batches of the same bucket instead of from a rank-wide
//! average.
//!
//! Owns: [`WalkEstimator`] (what the one walker asks of an estimator), [`BucketEstimator`] (the
//! per-bucket latency estimate, learned online, with the blind [`LatencyEstimator`] as its
//! fallback), [`BucketTokens`] (the padded length prior of the buckets not measured yet),
//! [`bucket_cost`], [`cost_balance`] and [`cost_balance_parts`] (the one cost-balanced deal of a
//! step's micro-batches, or of their parts, to ranks). Must not touch: clocks, devices, I/O, the
//! data source (a driver deals
//! the micro-batches [`cost_balance`] names), the deadline decision ([`super::decide`]).
//!
//! Sources: the issue-26 design (the predictive check of DropCompute,
//! `../shared/reference/dropcompute.md` §2, fed with the next micro-batch's bucket); the deal is
//! Graham's longest-processing-time-first list scheduling (R. L. Graham, "Bounds on
//! multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2), 1969): with the micro-batches
//! taken in descending predicted cost, each goes to the rank with the least predicted load, so
//! the most loaded rank ends within one micro-batch's cost of the mean load.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};

use super::LatencyEstimator;

/// What the one step walker ([`super::walk::RankWalk`]) asks of a latency estimator: an
/// estimate of the next launch's latency given its bucket (when the driver told the walker the
/// buckets), and the measured latency of a whole micro-batch of a bucket. The blind
/// [`LatencyEstimator`] ignores the bucket (today's behaviour, bit for bit); the
/// [`BucketEstimator`] uses it.
pub trait WalkEstimator {
    /// Estimated latency (ns) of the next whole micro-batch, of bucket `bucket` when known;
    /// `None` when nothing was measured yet (the check then falls back to the before check).
    fn estimate_for(&mut self, bucket: Option<u32>) -> Option<u64>;
    /// Records the measured latency (ns) of a completed whole micro-batch of bucket `bucket`
    /// (`None`: not known).
    fn observe_for(&mut self, bucket: Option<u32>, latency_ns: u64);
}

impl WalkEstimator for LatencyEstimator {
    /// The rank-wide estimate ([`LatencyEstimator::estimate`]); the bucket is ignored.
    fn estimate_for(&mut self, _bucket: Option<u32>) -> Option<u64> {
        self.estimate()
    }

    /// [`LatencyEstimator::observe`]; the bucket is ignored.
    fn observe_for(&mut self, _bucket: Option<u32>, latency_ns: u64) {
        self.observe(latency_ns);
    }
}

/// Per-bucket online latency estimate of one rank (or, fed with every rank's gathered
/// latencies, of the job): for each bucket seen, a [`LatencyEstimator`] window of that bucket's
/// whole micro-batch latencies (the same nearest-rank quantile rule); for a bucket not measured
/// yet (or an unknown bucket) the blind estimator over every micro-batch, which is fed every
/// observation (so with no bucket ever given this is the blind estimator exactly).
///
/// Why per bucket: a padded micro-batch's device time is its bucket's graph's (static shape), so
/// within a bucket the latencies differ only by noise, while across buckets they differ by the
/// attention's quadratic term; a rank-wide quantile is the cost of a long bucket and stops short
/// micro-batches that would fit (or the cost of a short one and overshoots with a long one).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BucketEstimator {
    blind: LatencyEstimator,
    buckets: BTreeMap<u32, LatencyEstimator>,
    window: usize,
    quantile: f64,
    /// The prior of [`bucket_cost`] for the buckets not measured yet (empty: none; absent in
    /// checkpoints written before it).
    #[serde(default, skip_serializing_if = "BucketTokens::is_empty")]
    prior: BucketTokens,
}

/// Padded tokens of one whole micro-batch of each length bucket (bucket b: the bucket's length
/// times the micro-batch's rows, tokens), the prior [`bucket_cost`] gives a bucket not measured
/// yet: a padded micro-batch's cost taken as proportional to its padded tokens (an assumption:
/// the attention's quadratic term makes a long bucket cost more per token; the measured
/// windows replace the prior bucket by bucket). Copy (it rides in
/// [`super::StepPolicy::bucket_tokens`], the one value the scheduler and the replay share), so
/// at most [`BucketTokens::MAX`] buckets. Empty: no prior (today's rule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BucketTokens {
    len: u8,
    tokens: [u64; BucketTokens::MAX],
}

impl BucketTokens {
    /// Most buckets with a prior (a text job has at most 16 length buckets).
    pub const MAX: usize = 16;

    /// The prior of buckets 0..len (`tokens[b]`: bucket b's padded tokens per micro-batch).
    /// `None` when there are more than [`BucketTokens::MAX`] buckets or a bucket has 0 tokens
    /// (no prior then).
    pub fn new(tokens: &[u64]) -> Option<Self> {
        if tokens.len() > Self::MAX || tokens.contains(&0) {
            return None;
        }
        let mut t = [0u64; Self::MAX];
        t[..tokens.len()].copy_from_slice(tokens);
        Some(Self { len: tokens.len() as u8, tokens: t })
    }

    /// Bucket `bucket`'s padded tokens per micro-batch; `None` beyond the buckets given.
    pub fn get(&self, bucket: u32) -> Option<u64> {
        self.as_slice().get(bucket as usize).copied()
    }

    /// Every bucket's padded tokens, bucket order.
    pub fn as_slice(&self) -> &[u64] {
        &self.tokens[..usize::from(self.len).min(Self::MAX)]
    }

    /// True without a prior.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

impl BucketEstimator {
    /// Most buckets tracked: observations of further buckets feed only the blind estimator (a
    /// job has a handful of length buckets; the bound keeps hostile input from growing the map).
    pub const MAX_BUCKETS: usize = 1024;

    /// Windows of `window` latencies (clamped to >= 1) answering their `quantile` (clamped to
    /// [0, 1], NaN as 1), per bucket and blind, as [`LatencyEstimator::new`].
    pub fn new(window: usize, quantile: f64) -> Self {
        let blind = LatencyEstimator::new(window, quantile);
        Self { blind, buckets: BTreeMap::new(), window, quantile, prior: BucketTokens::default() }
    }

    /// This estimator with the padded length prior `prior` for the buckets not measured yet
    /// ([`bucket_cost`]); the estimates of [`WalkEstimator`] are unchanged.
    pub fn with_prior(mut self, prior: BucketTokens) -> Self {
        self.prior = prior;
        self
    }

    /// The padded length prior ([`BucketEstimator::with_prior`]; empty: none).
    pub fn prior(&self) -> &BucketTokens {
        &self.prior
    }

    /// The blind (every micro-batch) estimator, the fallback.
    pub fn blind(&self) -> &LatencyEstimator {
        &self.blind
    }

    /// The estimate (ns) of bucket `bucket` from its own window only; `None` when the bucket
    /// has no measurement.
    pub fn bucket_estimate(&mut self, bucket: u32) -> Option<u64> {
        self.buckets.get_mut(&bucket).and_then(LatencyEstimator::estimate)
    }

    /// Buckets with at least one measurement, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = u32> + '_ {
        self.buckets.keys().copied()
    }

    /// True when some bucket has a measurement (false: this is the blind estimator alone).
    pub fn has_buckets(&self) -> bool {
        !self.buckets.is_empty()
    }

    /// This estimator with its blind window replaced by `blind` and no bucket measured: what a
    /// checkpoint written with the blind window alone (before the per-bucket state, or by a
    /// run that never saw a bucket) restores.
    pub fn with_blind(mut self, blind: LatencyEstimator) -> Self {
        self.blind = blind;
        self.buckets.clear();
        self
    }
}

impl Default for BucketEstimator {
    /// Window [`LatencyEstimator::DEFAULT_WINDOW`], quantile
    /// [`LatencyEstimator::DEFAULT_QUANTILE`].
    fn default() -> Self {
        Self::new(LatencyEstimator::DEFAULT_WINDOW, LatencyEstimator::DEFAULT_QUANTILE)
    }
}

impl WalkEstimator for BucketEstimator {
    /// The bucket's own estimate when it has a measurement, else the blind one.
    fn estimate_for(&mut self, bucket: Option<u32>) -> Option<u64> {
        bucket.and_then(|b| self.bucket_estimate(b)).or_else(|| self.blind.estimate())
    }

    /// Feeds the blind window and, for a known bucket, the bucket's window (at most
    /// [`BucketEstimator::MAX_BUCKETS`] buckets).
    fn observe_for(&mut self, bucket: Option<u32>, latency_ns: u64) {
        self.blind.observe(latency_ns);
        if let Some(b) = bucket {
            let full = self.buckets.len() >= Self::MAX_BUCKETS;
            let (window, quantile) = (self.window, self.quantile);
            match self.buckets.get_mut(&b) {
                Some(e) => e.observe(latency_ns),
                None if !full => {
                    let mut e = LatencyEstimator::new(window, quantile);
                    e.observe(latency_ns);
                    self.buckets.insert(b, e);
                }
                None => {}
            }
        }
    }
}

/// A rank's predicted load in [`cost_balance`]'s heap, ordered by `f64::total_cmp`.
#[derive(Clone, Copy, Debug)]
struct Load(f64);
impl PartialEq for Load {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Load {}
impl PartialOrd for Load {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Load {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The predicted cost (ns, f64) of one micro-batch of each bucket in `buckets`, for dealing:
/// the bucket's estimate in `est` ([`BucketEstimator::bucket_estimate`]), or, for a bucket not
/// measured yet, the blind estimate; 1.0 for every micro-batch when nothing was measured (equal
/// costs: [`cost_balance`] then deals equal counts).
///
/// With a padded length prior ([`BucketEstimator::with_prior`]) covering every bucket in
/// `buckets`, a bucket not measured yet costs its padded tokens times the measured ns per
/// padded token (sum of the measured buckets' estimates over the sum of their padded tokens),
/// or its padded tokens alone (tokens, the same unit for every micro-batch) while no bucket is
/// measured: step 0 is dealt by length, not blind.
pub fn bucket_cost(est: &mut BucketEstimator, buckets: &[u32]) -> Vec<f64> {
    let prior = est.prior;
    if !prior.is_empty() && buckets.iter().all(|&b| prior.get(b).is_some()) {
        let measured: Vec<u32> = est.buckets().filter(|&b| prior.get(b).is_some()).collect();
        let (mut ns, mut tokens) = (0.0f64, 0.0f64);
        for b in measured {
            if let (Some(e), Some(t)) = (est.bucket_estimate(b), prior.get(b)) {
                ns += e as f64;
                tokens += t as f64;
            }
        }
        let rate = if tokens > 0.0 { ns / tokens } else { 1.0 };
        return buckets
            .iter()
            .map(|&b| match est.bucket_estimate(b) {
                Some(e) => e as f64,
                None => rate * prior.get(b).unwrap_or(0) as f64,
            })
            .collect();
    }
    let blind = est.blind.estimate();
    buckets
        .iter()
        .map(|&b| match est.bucket_estimate(b).or(blind) {
            Some(ns) => ns as f64,
            None => 1.0,
        })
        .collect()
}

/// The cost-balanced deal of one step: which of the step's micro-batches (indices into `costs`,
/// their predicted costs, ns or any unit; a NaN or negative cost counts as 0) each of
/// `ranks` ranks computes, at most `cap` each (the rank's slots, in micro-batches; raised to
/// ceil(len / ranks) when lower, so that everything is dealt). Longest processing time first
/// (module doc): micro-batches in descending cost (ties: lower index first), each to the rank of
/// least predicted load among those below the cap (ties: fewer micro-batches, then the lower
/// rank). Micro-batches of equal cost are interchangeable, so within each group of equal cost
/// they are then handed out in stream order, lower ranks first, keeping each rank's count of
/// that group: the loads are Graham's, and with all costs equal (nothing measured yet, one
/// bucket) the deal is the blind one, rank r the r-th contiguous slice. Each rank's list is in
/// ascending index order (the order of the global stream).
///
/// Guarantees (property-tested): every micro-batch is dealt exactly once; no rank gets more than
/// the cap; with the cap not binding, the most loaded rank's predicted cost is at most the mean
/// load plus the largest single cost (Graham's bound). `ranks` = 0 deals nothing (an empty
/// result). Deterministic; never panics.
pub fn cost_balance(costs: &[f64], ranks: usize, cap: usize) -> Vec<Vec<usize>> {
    if ranks == 0 {
        return Vec::new();
    }
    let cap = cap.max(costs.len().div_ceil(ranks)).max(1);
    let c = |i: usize| if costs[i] > 0.0 { costs[i] } else { 0.0 };
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| c(b).total_cmp(&c(a)).then(a.cmp(&b)));
    let mut count = vec![0usize; ranks];
    let mut rank_of = vec![0usize; costs.len()];
    // Min-heap of (load, count, rank) over the ranks below the cap: a rank's entry changes only
    // when it is chosen, so popping the least and pushing it back updated keeps it exact.
    let mut heap: BinaryHeap<Reverse<(Load, usize, usize)>> = (0..ranks).map(|r| Reverse((Load(0.0), 0, r))).collect();
    for &i in &order {
        let Some(Reverse((Load(l), k, r))) = heap.pop() else { break };
        count[r] = k + 1;
        rank_of[i] = r;
        if k + 1 < cap {
            heap.push(Reverse((Load(l + c(i)), k + 1, r)));
        }
    }
    // Within each run of equal cost in `order` (its indices ascending), the ranks it went to,
    // ascending, in stream order.
    let mut start = 0;
    while start < order.len() {
        let end = start + order[start..].iter().take_while(|&&i| c(i).to_bits() == c(order[start]).to_bits()).count();
        let mut rs: Vec<usize> = order[start..end].iter().map(|&i| rank_of[i]).collect();
        rs.sort_unstable();
        for (&i, r) in order[start..end].iter().zip(rs) {
            rank_of[i] = r;
        }
        start = end;
    }
    let mut dealt: Vec<Vec<usize>> = count.iter().map(|&k| Vec::with_capacity(k)).collect();
    for (i, &r) in rank_of.iter().enumerate() {
        dealt[r].push(i);
    }
    dealt
}

/// [`cost_balance`] of a step's whole micro-batches (`costs`, one per S = `split` consecutive
/// parts of the step's window) expanded to the parts: each rank's indices into the window of
/// `costs.len()·split` parts, ascending (micro-batch k is parts k·S..(k+1)·S). The one deal of
/// parts of the scheduler's `cost-balance` step (`schedule::step`, `deal_by_cost`) and of its
/// replay (`sim::policies`, a data model that deals by cost); `split` 0 reads as 1.
pub fn cost_balance_parts(costs: &[f64], ranks: usize, cap: usize, split: usize) -> Vec<Vec<usize>> {
    let split = split.max(1);
    cost_balance(costs, ranks, cap)
        .into_iter()
        .map(|mbs| mbs.into_iter().flat_map(|k| k * split..(k + 1) * split).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The parts' deal is the micro-batches' deal, each micro-batch k as its S parts.
    #[test]
    fn the_parts_deal_expands_each_micro_batch_to_its_parts() {
        let costs = [8.0, 1.0, 1.0, 7.0];
        let mbs = cost_balance(&costs, 2, 4);
        let parts = cost_balance_parts(&costs, 2, 4, 2);
        for (m, p) in mbs.iter().zip(&parts) {
            let want: Vec<usize> = m.iter().flat_map(|&k| [2 * k, 2 * k + 1]).collect();
            assert_eq!(p, &want);
        }
        assert_eq!(cost_balance_parts(&costs, 2, 4, 1), mbs);
        assert_eq!(cost_balance_parts(&costs, 2, 4, 0), mbs, "split 0 reads as 1");
    }

    #[test]
    fn a_bucket_is_estimated_from_its_own_window_and_falls_back_to_the_blind_one() {
        let mut e = BucketEstimator::new(8, 0.9);
        assert_eq!(e.estimate_for(Some(3)), None, "nothing measured");
        e.observe_for(Some(0), 10);
        e.observe_for(Some(0), 12);
        e.observe_for(Some(2), 100);
        assert_eq!(e.estimate_for(Some(0)), Some(12));
        assert_eq!(e.estimate_for(Some(2)), Some(100));
        // Bucket 1 has no measurement: the blind estimate over 10, 12, 100 (q 0.9: 100).
        assert_eq!(e.estimate_for(Some(1)), Some(100));
        assert_eq!(e.estimate_for(None), Some(100));
        assert_eq!(e.buckets().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(bucket_cost(&mut e, &[0, 1, 2]), vec![12.0, 100.0, 100.0]);
        assert_eq!(bucket_cost(&mut BucketEstimator::default(), &[0, 1]), vec![1.0, 1.0]);
    }

    /// The padded length prior: before any measurement the unmeasured buckets cost their
    /// padded tokens (ordered by length); once some are measured, the measured ns per padded
    /// token times theirs; measured buckets keep their own estimate; a bucket outside the prior
    /// falls back to today's rule for every bucket.
    #[test]
    fn unmeasured_buckets_cost_their_padded_tokens_at_the_measured_rate() {
        let prior = BucketTokens::new(&[64, 128, 256, 512]).unwrap();
        let mut e = BucketEstimator::new(8, 1.0).with_prior(prior);
        assert_eq!(bucket_cost(&mut e, &[3, 0, 1, 2]), vec![512.0, 64.0, 128.0, 256.0]);
        // Bucket 1 measured at 1000 ns (128 tokens) and bucket 3 at 6000 ns (512 tokens): the
        // rate is 7000 / 640 ns per token.
        e.observe_for(Some(1), 1000);
        e.observe_for(Some(3), 6000);
        let rate = 7000.0 / 640.0;
        let c = bucket_cost(&mut e, &[0, 1, 2, 3]);
        let want = [64.0 * rate, 1000.0, 256.0 * rate, 6000.0];
        for (got, want) in c.iter().zip(want) {
            assert!((got - want).abs() <= 1e-9 * want, "{c:?} vs {want}");
        }
        // Bucket 4 has no prior: today's rule (the blind estimate, q 1.0: 6000) for the unmeasured.
        assert_eq!(bucket_cost(&mut e, &[0, 4, 1]), vec![6000.0, 6000.0, 1000.0]);
        assert_eq!(BucketTokens::new(&[1; 17]), None);
        assert_eq!(BucketTokens::new(&[8, 0]), None);
        assert!(BucketTokens::default().is_empty());
    }

    /// Without buckets the bucket estimator is the blind estimator, estimate for estimate.
    #[test]
    fn without_buckets_it_is_the_blind_estimator() {
        let mut b = BucketEstimator::new(4, 0.75);
        let mut l = LatencyEstimator::new(4, 0.75);
        for v in [5u64, 9, 1, 7, 3, 8, 2] {
            b.observe_for(None, v);
            l.observe(v);
            assert_eq!(b.estimate_for(None), l.estimate());
        }
        assert_eq!(b.blind(), &l);
    }

    #[test]
    fn longest_first_deals_the_long_micro_batches_apart() {
        // Two ranks, costs 8, 1, 1, 7, 1, 1, 1, 1 (M = 4): 8 -> r0, 7 -> r1, then the ones to
        // the lighter rank: r1 reaches 8 after one, then they alternate: three ones each,
        // handed out in stream order (r0 first).
        let d = cost_balance(&[8.0, 1.0, 1.0, 7.0, 1.0, 1.0, 1.0, 1.0], 2, 8);
        assert_eq!(d, vec![vec![0, 1, 2, 4], vec![3, 5, 6, 7]]);
        // A blind deal of four each in stream order: loads 17 and 4 (this one: 11 and 10).
        // The cap binds: at most 3 each of 6.
        let d = cost_balance(&[9.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2, 3);
        assert_eq!(d, vec![vec![0, 1, 2], vec![3, 4, 5]]);
        // Equal costs: the blind deal, contiguous slices in rank order.
        let d = cost_balance(&[1.0; 6], 3, 4);
        assert_eq!(d, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert!(cost_balance(&[1.0], 0, 4).is_empty());
        // A cap below the mean count is raised so that every micro-batch is dealt.
        assert_eq!(cost_balance(&[1.0; 5], 2, 1).iter().map(Vec::len).sum::<usize>(), 5);
    }

    proptest! {
        /// Every micro-batch dealt exactly once, the cap held, and the most loaded rank within
        /// one micro-batch's cost of the mean (cap 2·M over N·M micro-batches, as the
        /// simulator deals a step).
        #[test]
        fn cost_balance_deals_every_micro_batch_once_within_one_cost_of_the_mean(
            n in 1usize..40, m in 1usize..12, seed in any::<u64>(), tail in 0.0f64..3.0) {
            use rand::Rng;
            let mut g = crate::sim::rng::stream(seed, 0);
            // Long-tailed costs: a·L + b·L² over Pareto-like lengths.
            let costs: Vec<f64> = (0..n * m)
                .map(|_| {
                    let u: f64 = g.random_range(0.0..1.0);
                    let l = 32.0 * (1.0 - u).powf(-1.0 / (1.0 + tail));
                    l + l * l / 512.0
                })
                .collect();
            let d = cost_balance(&costs, n, 2 * m);
            prop_assert_eq!(d.len(), n);
            let mut all: Vec<usize> = d.iter().flatten().copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..n * m).collect::<Vec<_>>());
            prop_assert!(d.iter().all(|r| r.len() <= 2 * m));
            let loads: Vec<f64> = d.iter().map(|r| r.iter().map(|&i| costs[i]).sum()).collect();
            let mean = loads.iter().sum::<f64>() / n as f64;
            let max_cost = costs.iter().copied().fold(0.0, f64::max);
            let max_load = loads.iter().copied().fold(0.0, f64::max);
            prop_assert!(max_load <= mean + max_cost + 1e-9 * mean, "max {max_load} mean {mean} cost {max_cost}");
        }
    }
}
