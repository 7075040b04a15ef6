//! Rebalancing: the per-rank micro-batch assignment of one step for the `rebalance` and
//! `rebalance-drop` policies. A rank the straggler tracker calls chronic gets fewer
//! micro-batches and the other ranks more, the global batch (N·M micro-batches) constant, so the
//! gradient (divided by the global computed sample count) keeps its expectation.
//!
//! Owns: [`RebalanceConfig`], [`Rebalancer`], [`RankLatencyTracker`] (its inputs). Must not touch: clocks, I/O, devices, the data
//! source (the scheduler hands each rank [`Rebalancer::assignment`]`[rank]` micro-batches). Pure
//! and deterministic: every rank that feeds the same (all-reduced) latencies and flags holds the
//! same assignment.
//!
//! Rule of [`Rebalancer::update`] (ours; the idea is Cannikin's per-node batch sizes and the
//! What-if study's data-parallel rebalancing, `../shared/reference/dropcompute.md` §6):
//! 1. The *rebalanced* ranks are those flagged chronic now, plus those rebalanced before whose
//!    per-micro-batch latency is still above (1 + hysteresis)·L0, L0 being the median latency of
//!    the other ranks (a rank leaves the set once it has recovered; it is not flagged chronic by
//!    its balanced compute time any more, so the flag alone would make work oscillate).
//! 2. Every other rank is modelled at L0 (a transient blip of a non-chronic rank moves nothing);
//!    a rebalanced rank at max(own latency, L0) (a chronic flag never earns a rank extra work).
//! 3. The candidate assignment minimizes the predicted step compute time max_r a_r·L_r subject
//!    to Σ a_r = N·M, a_r >= min_micro_batches and a_r <= M for a rebalanced rank (a chronic
//!    rank only sheds work): each of the micro-batches above the minimum goes, one at a time, to
//!    the rank that would finish it earliest (ties: a rebalanced rank first, so that less work
//!    moves, then the lowest rank), which is optimal for
//!    identical work units on ranks of different speeds.
//! 4. It replaces the current assignment only if it lowers the predicted step compute time by
//!    more than `hysteresis` (relative): max_new < (1 - hysteresis)·max_current.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Hysteresis and limits of rebalancing.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RebalanceConfig {
    /// Relative gain (dimensionless, fraction of the predicted step compute time) a new
    /// assignment must bring before it is applied, and the relative latency excess over the
    /// other ranks' median above which a rebalanced rank stays rebalanced. Default 0.05
    /// (the straggler tracker's 5 % tolerance). Negative or NaN counts as 0.
    pub hysteresis: f64,
    /// Micro-batches every rank keeps per step (>= this many; clamped to M). Default 1.
    pub min_micro_batches: u32,
}

impl Default for RebalanceConfig {
    /// Hysteresis 0.05, at least 1 micro-batch per rank.
    fn default() -> Self {
        Self { hysteresis: 0.05, min_micro_batches: 1 }
    }
}

/// Per-rank micro-batch assignment for a global batch of world_size · micro_batches
/// micro-batches (module doc for the rule).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rebalancer {
    micro_batches: u32,
    cfg: RebalanceConfig,
    assignment: Vec<u32>,
    rebalanced: Vec<bool>,
}

/// Heap entry: the predicted finish time (ns) of a rank's next micro-batch, whether the rank is
/// a plain one (true sorts after a rebalanced one at equal time: at equal step time the
/// rebalanced rank keeps its work, so less work moves), rank id; min-heap in that order.
#[derive(PartialEq)]
struct Next(f64, bool, usize);
impl Eq for Next {}
impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Next {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1)).then(other.2.cmp(&self.2))
    }
}

fn valid(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// The median of `v` (the mean of the two middle values for an even count; values ordered by
/// `f64::total_cmp`), `None` for an empty `v`: the one median over ranks of every straggler
/// rule (the rebalancer's L0, the trackers' slow test, `tune::straggler`, the
/// straggler-free bound).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) })
}

impl Rebalancer {
    /// `world_size` ranks, `micro_batches` (M) each to begin with. `world_size` 0 gives an empty
    /// assignment (updates then do nothing).
    pub fn new(world_size: usize, micro_batches: u32, cfg: RebalanceConfig) -> Self {
        Self { micro_batches, cfg, assignment: vec![micro_batches; world_size], rebalanced: vec![false; world_size] }
    }

    /// Why `restored` (a checkpointed rebalancer) cannot replace this one: another M or
    /// configuration, per-rank vectors of another length than this world size, or an
    /// assignment that does not sum to N·M (the rebalancer moves work, never adds or drops it).
    /// `None` when it can.
    pub fn restore_conflict(&self, restored: &Rebalancer) -> Option<String> {
        let n = self.assignment.len();
        let total: u64 = restored.assignment.iter().map(|&k| u64::from(k)).sum();
        if restored.micro_batches != self.micro_batches {
            Some(format!(
                "rebalancer micro_batches: {} in the checkpoint, {} in this step",
                restored.micro_batches, self.micro_batches
            ))
        } else if restored.cfg != self.cfg {
            Some(format!("rebalancer configuration: {:?} in the checkpoint, {:?} in this step", restored.cfg, self.cfg))
        } else if restored.assignment.len() != n || restored.rebalanced.len() != n {
            Some(format!(
                "rebalancer: {} counts and {} flags in the checkpoint: must be one per rank ({n})",
                restored.assignment.len(),
                restored.rebalanced.len()
            ))
        } else if total != n as u64 * u64::from(self.micro_batches) {
            Some(format!(
                "rebalancer assignment: {:?} sums to {total}: must be N·M = {}",
                restored.assignment,
                n as u64 * u64::from(self.micro_batches)
            ))
        } else {
            None
        }
    }

    /// Current assignment: micro-batches per rank, sums to world_size · micro_batches.
    pub fn assignment(&self) -> &[u32] {
        &self.assignment
    }

    /// Which ranks are currently rebalanced (module doc, rule 1), one flag per rank.
    pub fn rebalanced(&self) -> &[bool] {
        &self.rebalanced
    }

    /// The configuration.
    pub fn config(&self) -> &RebalanceConfig {
        &self.cfg
    }

    /// Feeds one step's per-rank micro-batch latency estimates (ns, e.g. the straggler tracker's
    /// EWMA compute time divided by the micro-batches computed) and chronic flags
    /// (`tune::straggler`'s classification); returns the assignment for the next step. Only
    /// chronic ranks move work; a change smaller than `hysteresis` (relative) is not applied;
    /// the global sum is constant; every rank keeps >= min_micro_batches (module doc for the
    /// exact rule).
    ///
    /// Bad input changes nothing: slices whose length is not world_size, or a rank to be
    /// rebalanced whose latency is not finite and > 0, leave the assignment (and the rebalanced
    /// set) as they were. A non-finite latency of another rank is left out of L0.
    pub fn update(&mut self, per_rank_latency_ns: &[f64], chronic: &[bool]) -> &[u32] {
        let n = self.assignment.len();
        if n == 0 || per_rank_latency_ns.len() != n || chronic.len() != n {
            return &self.assignment;
        }
        let h = if self.cfg.hysteresis.is_nan() { 0.0 } else { self.cfg.hysteresis.max(0.0) };
        let lat = per_rank_latency_ns;
        // L0 over the ranks neither chronic now nor rebalanced before.
        let plain = |r: usize| !chronic[r] && !self.rebalanced[r];
        let l0_prev = median((0..n).filter(|&r| plain(r) && valid(lat[r])).map(|r| lat[r]).collect());
        let next: Vec<bool> = (0..n)
            .map(|r| {
                chronic[r]
                    || (self.rebalanced[r]
                        && match l0_prev {
                            // NaN stays rebalanced (then refused below).
                            Some(l0) => lat[r].is_nan() || lat[r] > (1.0 + h) * l0,
                            None => true,
                        })
            })
            .collect();
        if (0..n).any(|r| next[r] && !valid(lat[r])) {
            return &self.assignment;
        }
        let l0 = median((0..n).filter(|&r| !next[r] && valid(lat[r])).map(|r| lat[r]).collect());
        let eff: Vec<f64> = match l0 {
            Some(l0) => (0..n).map(|r| if next[r] { lat[r].max(l0) } else { l0 }).collect(),
            None if next.iter().all(|&x| x) => lat.to_vec(),
            // Some plain rank exists but none has a usable latency: nothing to compare with.
            None => return &self.assignment,
        };
        self.rebalanced = next;
        let target = self.optimal(&eff, &self.rebalanced);
        let predicted = |a: &[u32]| a.iter().zip(&eff).map(|(&a, &l)| f64::from(a) * l).fold(0.0, f64::max);
        if target != self.assignment && predicted(&target) < (1.0 - h) * predicted(&self.assignment) {
            self.assignment = target;
        }
        &self.assignment
    }

    /// The assignment minimizing max_r a_r·eff_r (module doc, rule 3).
    fn optimal(&self, eff: &[f64], capped: &[bool]) -> Vec<u32> {
        let n = eff.len();
        let m = u64::from(self.micro_batches);
        let min = self.cfg.min_micro_batches.min(self.micro_batches);
        let mut a = vec![min; n];
        let mut left = (n as u64) * m - (n as u64) * u64::from(min);
        let mut heap: BinaryHeap<Next> = (0..n)
            .filter(|&r| !(capped[r] && min >= self.micro_batches))
            .map(|r| Next(f64::from(min + 1) * eff[r], !capped[r], r))
            .collect();
        while left > 0 {
            let Some(Next(_, _, r)) = heap.pop() else { break };
            a[r] += 1;
            left -= 1;
            // Every rank capped at M leaves exactly N·M - Σ a for the uncapped ones (or 0).
            if !(capped[r] && a[r] >= self.micro_batches) {
                heap.push(Next(f64::from(a[r] + 1) * eff[r], !capped[r], r));
            }
        }
        a
    }
}

/// Limits of [`RankLatencyTracker`]'s chronic flag: the rule and default values of
/// `tune::straggler::StragglerConfig` (pinned equal by a test there), applied online to the
/// per-micro-batch latency.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TrackerConfig {
    /// Relative excess over the step's median latency (over ranks) that counts as slow
    /// (dimensionless; default 0.05).
    pub tolerance: f64,
    /// Fraction of the steps seen in which a rank must have been slow to be chronic (default 0.5).
    pub chronic_fraction: f64,
    /// EWMA weight of the newest step's latency (default 0.2).
    pub ewma_alpha: f64,
    /// Steps seen before any rank is flagged chronic (default 1: a chronic 2x rank shows in
    /// every step, so the online tracker acts after the first one, inside the warm-up, where
    /// rebalancing is allowed and dropping is not; a false flag from a noisy step moves work
    /// only past the rebalancer's hysteresis and moves it back once the rank's slow fraction
    /// falls under `chronic_fraction`. Measured on `train --ranks 8 --slow-rank 3:2
    /// --policy rebalance-drop --tail-split 2`: 1.837x against 1.789x with 3 steps without
    /// noise, 1.647x against 1.596x under the reference noise. The offline labels of
    /// `tune::straggler` wait for `tune::MIN_STEPS` = 10.)
    pub min_steps: u64,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self { tolerance: 0.05, chronic_fraction: 0.5, ewma_alpha: 0.2, min_steps: 1 }
    }
}

/// Online per-rank latency statistics feeding a [`Rebalancer`]: the EWMA of each rank's mean
/// latency per computed micro-batch (ns) and the chronic flag (slow — above
/// (1 + tolerance)·the step's median over ranks — in at least `chronic_fraction` of the steps,
/// after `min_steps`). Per micro-batch, not per step: a rebalanced rank's compute time is
/// balanced, its per-micro-batch latency is not. Feed it the all-reduced values (identical on
/// every rank) so that every rank computes the same assignment.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankLatencyTracker {
    cfg: TrackerConfig,
    steps: u64,
    slow: Vec<u64>,
    /// NaN for a rank not seen yet (written as `null` in a checkpoint: a tracker no step fed,
    /// as the assignment step of a drop policy keeps it, read back failed before).
    #[serde(with = "crate::serde_nan::vec")]
    ewma: Vec<f64>,
}

impl RankLatencyTracker {
    /// A tracker for `world_size` ranks.
    pub fn new(world_size: usize, cfg: TrackerConfig) -> Self {
        Self { cfg, steps: 0, slow: vec![0; world_size], ewma: vec![f64::NAN; world_size] }
    }

    /// Feeds one step: each rank's compute time divided by its micro-batches computed (ns). A
    /// rank with a non-finite or non-positive value (nothing computed) keeps its EWMA and is
    /// not slow in this step; a slice of the wrong length is ignored.
    pub fn observe(&mut self, per_rank_latency_ns: &[f64]) {
        if per_rank_latency_ns.len() != self.slow.len() {
            return;
        }
        let ok: Vec<f64> = per_rank_latency_ns.iter().copied().filter(|&x| valid(x)).collect();
        let Some(med) = median(ok) else { return };
        let a = self.cfg.ewma_alpha;
        for (r, &x) in per_rank_latency_ns.iter().enumerate() {
            if !valid(x) {
                continue;
            }
            if x > (1.0 + self.cfg.tolerance) * med {
                self.slow[r] = self.slow[r].saturating_add(1); // a checkpoint's counter may sit at the top
            }
            let e = &mut self.ewma[r];
            *e = if e.is_nan() { x } else { a * x + (1.0 - a) * *e };
        }
        self.steps = self.steps.saturating_add(1);
    }

    /// Why `restored` (a checkpointed tracker) cannot replace this one: another configuration,
    /// or a per-rank vector whose length is not this one's world size. `None` when it can.
    pub fn restore_conflict(&self, restored: &RankLatencyTracker) -> Option<String> {
        let n = self.ewma.len();
        if restored.cfg != self.cfg {
            Some(format!("tracker configuration: {:?} in the checkpoint, {:?} in this step", restored.cfg, self.cfg))
        } else if restored.ewma.len() != n || restored.slow.len() != n {
            Some(format!(
                "tracker: {} latencies and {} slow counts in the checkpoint: must be one per rank ({n})",
                restored.ewma.len(),
                restored.slow.len()
            ))
        } else {
            None
        }
    }

    /// Steps observed.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// EWMA latency per micro-batch per rank (ns; NaN before the rank's first value).
    pub fn ewma_latency_ns(&self) -> &[f64] {
        &self.ewma
    }

    /// Chronic flag per rank (all false before `min_steps` steps).
    pub fn chronic(&self) -> Vec<bool> {
        if self.steps < self.cfg.min_steps.max(1) {
            return vec![false; self.slow.len()];
        }
        self.slow.iter().map(|&s| s as f64 / self.steps as f64 >= self.cfg.chronic_fraction).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tracker no step fed (every EWMA NaN) and a fed one both read back from JSON, as a
    /// checkpoint holds them.
    #[test]
    fn a_tracker_reads_back_from_a_checkpoint_fed_or_not() {
        let fresh = RankLatencyTracker::new(3, Default::default());
        let json = serde_json::to_string(&fresh).expect("json");
        let back: RankLatencyTracker = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back.ewma_latency_ns().len(), 3);
        assert!(back.ewma_latency_ns().iter().all(|v| v.is_nan()));
        let mut fed = fresh.clone();
        fed.observe(&[1.0, f64::NAN, 3.0]);
        let back: RankLatencyTracker = serde_json::from_str(&serde_json::to_string(&fed).expect("json")).expect("back");
        assert_eq!(back.ewma_latency_ns()[0], fed.ewma_latency_ns()[0]);
        assert!(back.ewma_latency_ns()[1].is_nan() && back.ewma_latency_ns()[2] == 3.0);
    }
    use proptest::prelude::*;

    fn cfg(h: f64, min: u32) -> RebalanceConfig {
        RebalanceConfig { hysteresis: h, min_micro_batches: min }
    }

    #[test]
    fn one_chronic_rank_at_twice_the_latency_gets_half_the_share() {
        // 8 ranks, M = 12, rank 3 twice as slow: 96 micro-batches; the optimum gives rank 3
        // six (12 units of time) and spreads 90 over the other 7 (12 or 13 each: 13 units).
        let mut r = Rebalancer::new(8, 12, RebalanceConfig::default());
        let mut lat = vec![1.0e6; 8];
        lat[3] = 2.0e6;
        let mut chronic = vec![false; 8];
        chronic[3] = true;
        let a = r.update(&lat, &chronic).to_vec();
        assert_eq!(a, vec![13, 13, 13, 6, 13, 13, 13, 12]);
        assert_eq!(a.iter().sum::<u32>(), 96);
        assert_eq!(r.rebalanced(), &[false, false, false, true, false, false, false, false]);
        // Next step the tracker may no longer flag it (its compute time is balanced), but its
        // per-micro-batch latency is still 2x: the assignment stays.
        let b = r.update(&lat, &[false; 8]).to_vec();
        assert_eq!(b, a);
        // Recovered: latency back to L0, the work returns (gain 13 -> 12 = 7.7 % > 5 %).
        lat[3] = 1.0e6;
        assert_eq!(r.update(&lat, &[false; 8]), &[12; 8]);
        assert_eq!(r.rebalanced(), &[false; 8]);
    }

    #[test]
    fn hysteresis_blocks_a_small_gain() {
        // Rank 0 is 8 % slower: the best move (12 -> 11 on rank 0) brings
        // max(11·1.08, 13) = 13 vs 12·1.08 = 12.96: no gain at all, nothing moves.
        let mut r = Rebalancer::new(4, 12, cfg(0.05, 1));
        assert_eq!(r.update(&[1.08, 1.0, 1.0, 1.0], &[true, false, false, false]), &[12; 4]);
        // 30 % slower: 12·1.3 = 15.6 -> rank 0 gets 10 (13.0), the others 13, 13, 12: gain
        // 16.7 % > 5 %: applied. With hysteresis 0.2 it is not.
        let mut r = Rebalancer::new(4, 12, cfg(0.05, 1));
        assert_eq!(r.update(&[1.3, 1.0, 1.0, 1.0], &[true, false, false, false]), &[10, 13, 13, 12]);
        let mut r = Rebalancer::new(4, 12, cfg(0.2, 1));
        assert_eq!(r.update(&[1.3, 1.0, 1.0, 1.0], &[true, false, false, false]), &[12; 4]);
    }

    #[test]
    fn min_micro_batches_bounds_a_very_slow_rank() {
        let mut r = Rebalancer::new(3, 4, cfg(0.0, 2));
        assert_eq!(r.update(&[100.0, 1.0, 1.0], &[true, false, false]), &[2, 5, 5]);
        // min above M is clamped to M: nothing can move.
        let mut r = Rebalancer::new(3, 4, cfg(0.0, 9));
        assert_eq!(r.update(&[100.0, 1.0, 1.0], &[true, false, false]), &[4, 4, 4]);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let mut r = Rebalancer::new(3, 4, cfg(0.0, 1));
        assert_eq!(r.update(&[1.0, 1.0], &[true, false, false]), &[4, 4, 4]);
        assert_eq!(r.update(&[f64::NAN, 1.0, 1.0], &[true, false, false]), &[4, 4, 4]);
        assert_eq!(r.update(&[0.0, 1.0, 1.0], &[true, false, false]), &[4, 4, 4]);
        assert_eq!(r.rebalanced(), &[false; 3]);
        // A NaN on a plain rank is left out of L0.
        assert_eq!(r.update(&[3.0, f64::NAN, 1.0], &[true, false, false]), &[2, 5, 5]);
        let mut e = Rebalancer::new(0, 4, cfg(0.0, 1));
        assert!(e.update(&[], &[]).is_empty());
    }

    #[test]
    fn tracker_flags_a_rank_slow_in_half_the_steps_after_min_steps() {
        let cfg = TrackerConfig { min_steps: 4, ..TrackerConfig::default() };
        let mut t = RankLatencyTracker::new(3, cfg);
        for s in 0..4 {
            // Rank 0 slow every step, rank 1 slow in one step of four, rank 2 never.
            t.observe(&[2.0, if s == 0 { 1.5 } else { 1.0 }, 1.0]);
            if s < 3 {
                assert_eq!(t.chronic(), vec![false; 3], "before min_steps");
            }
        }
        assert_eq!(t.chronic(), vec![true, false, false]);
        assert_eq!(t.steps(), 4);
        // EWMA: 2.0 constant; rank 1: 1.5 then 0.2·1 + 0.8·prev three times.
        let want = [1.5f64, 1.0, 1.0].iter().skip(1).fold(1.5, |e, &x| 0.2 * x + 0.8 * e);
        let want = 0.2 * 1.0 + 0.8 * want;
        assert_eq!(t.ewma_latency_ns()[0], 2.0);
        assert!((t.ewma_latency_ns()[1] - want).abs() < 1e-12);
        // Nothing computed (NaN) keeps the EWMA; a wrong length is ignored.
        t.observe(&[f64::NAN, 1.0, 1.0]);
        assert_eq!(t.ewma_latency_ns()[0], 2.0);
        t.observe(&[1.0]);
        assert_eq!(t.steps(), 5);
    }

    fn lat_and_flags() -> impl Strategy<Value = (Vec<f64>, Vec<bool>)> {
        (1usize..12).prop_flat_map(|n| {
            (proptest::collection::vec(0.5f64..4.0, n), proptest::collection::vec(proptest::bool::weighted(0.3), n))
        })
    }

    fn predicted(a: &[u32], eff: &[f64]) -> f64 {
        a.iter().zip(eff).map(|(&a, &l)| f64::from(a) * l).fold(0.0, f64::max)
    }

    proptest! {
        /// Over a sequence of updates: the sum is N·M, every rank keeps >= min(min, M).
        #[test]
        fn sum_constant_and_min_respected(m in 1u32..20, min in 0u32..6, h in 0.0f64..0.3,
                                          steps in proptest::collection::vec(lat_and_flags(), 1..6)) {
            let n = steps[0].0.len();
            let mut r = Rebalancer::new(n, m, cfg(h, min));
            for (lat, flags) in steps.iter().filter(|(l, _)| l.len() == n) {
                let a = r.update(lat, flags).to_vec();
                prop_assert_eq!(a.iter().map(|&x| u64::from(x)).sum::<u64>(), n as u64 * u64::from(m));
                prop_assert!(a.iter().all(|&x| x >= min.min(m)));
            }
        }

        /// From a fresh rebalancer, no chronic flag moves nothing, whatever the latencies.
        #[test]
        fn no_move_without_chronic_ranks((lat, _) in lat_and_flags(), m in 1u32..20, h in 0.0f64..0.3) {
            let n = lat.len();
            let mut r = Rebalancer::new(n, m, cfg(h, 1));
            let a = r.update(&lat, &vec![false; n]).to_vec();
            prop_assert_eq!(a, vec![m; n]);
        }

        /// Non-chronic ranks are treated alike (their shares differ by at most 1 and are >= M),
        /// chronic ranks never gain work.
        #[test]
        fn only_chronic_ranks_shed_work((lat, flags) in lat_and_flags(), m in 1u32..20) {
            let n = lat.len();
            let mut r = Rebalancer::new(n, m, cfg(0.0, 1));
            let a = r.update(&lat, &flags).to_vec();
            let plain: Vec<u32> = (0..n).filter(|&i| !flags[i]).map(|i| a[i]).collect();
            if let (Some(lo), Some(hi)) = (plain.iter().min(), plain.iter().max()) {
                prop_assert!(hi - lo <= 1);
                prop_assert!(*lo >= m);
            }
            for i in 0..n {
                if flags[i] { prop_assert!(a[i] <= m); }
            }
        }

        /// An applied change lowers the predicted step compute time (under the effective
        /// latencies) by more than the hysteresis; an unapplied one leaves the assignment.
        #[test]
        fn hysteresis_holds((lat, flags) in lat_and_flags(), m in 1u32..20, h in 0.0f64..0.5) {
            let n = lat.len();
            let mut r = Rebalancer::new(n, m, cfg(h, 1));
            let before = r.assignment().to_vec();
            let after = r.update(&lat, &flags).to_vec();
            if after != before {
                let plain: Vec<f64> = (0..n).filter(|&i| !flags[i]).map(|i| lat[i]).collect();
                let eff: Vec<f64> = match median(plain) {
                    Some(l0) => (0..n).map(|i| if flags[i] { lat[i].max(l0) } else { l0 }).collect(),
                    None => lat.clone(),
                };
                prop_assert!(predicted(&after, &eff) < (1.0 - h) * predicted(&before, &eff));
            }
        }
    }
}
