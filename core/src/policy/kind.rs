//! The step policies: what each rank computes in a step and whose work enters the gradient.
//! One enum, [`Policy`], shared by the scheduler (`train --policy`) and the simulator
//! (`simulate`/`tune --policy`), with its parameters in [`StepPolicy`], and the one pure
//! aggregation rule of backup workers, [`backup_aggregated`].
//!
//! Owns: [`Policy`], [`StepPolicy`], [`TailShape`], [`backup_aggregated`]. Must not touch: clocks, I/O,
//! devices. The per-micro-batch stop decision stays [`super::decide`] (drop policies and the
//! compute budget call it with their own threshold); the per-rank micro-batch counts of
//! rebalancing stay [`super::Rebalancer`].
//!
//! Sources: DropCompute (Giladi et al., NeurIPS 2023; `../shared/reference/dropcompute.md` §2);
//! backup workers (Chen et al., "Revisiting Distributed Synchronous SGD", 2016: aggregate the
//! first N - b gradients, drop the b slowest whole); compute budget (Ferdinand et al.,
//! "Anytime Minibatch", ICLR 2020: every rank computes for a fixed time, the gradient is
//! weighted by the samples computed); rebalance (Cannikin, per-node batch sizes with
//! sample-weighted aggregation; the What-if study's data-parallel rebalancing, OSDI '25).
//!
//! `DeadlineConfig` (the deadline of [`super::decide`]) keeps its name and fields; the parameters
//! of the step policy are [`StepPolicy`] (the brief's name `DeadlineConfig` was already taken).

use super::CheckMode;
use super::rebalance::RebalanceConfig;

/// A step policy. Command-line and JSON names (kebab-case): `synchronous`, `drop-before`,
/// `drop-predictive`, `backup-workers`, `compute-budget`, `rebalance`, `rebalance-drop`,
/// `length-predictive`, `cost-balance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Every rank computes its M micro-batches; the step waits for the slowest rank.
    #[cfg_attr(feature = "clap", value(help = "Every rank computes all M micro-batches (baseline)"))]
    Synchronous,
    /// DropCompute, deadline checked before each micro-batch ([`CheckMode::BeforeMicroBatch`]).
    #[cfg_attr(feature = "clap", value(help = "DropCompute: start a micro-batch iff elapsed < threshold"))]
    DropBefore,
    /// DropCompute, predictive check ([`CheckMode::Predictive`]).
    #[cfg_attr(feature = "clap", value(help = "DropCompute: start iff elapsed + estimated latency <= threshold"))]
    DropPredictive,
    /// Backup workers: every rank computes its M micro-batches; the gradient aggregates the
    /// first N - b ranks to finish; the b slowest are dropped whole ([`backup_aggregated`]).
    #[cfg_attr(feature = "clap", value(help = "Aggregate the first N-b ranks to finish, drop the b slowest whole"))]
    BackupWorkers,
    /// Compute budget (Anytime-Minibatch): every rank starts micro-batches while the deadline
    /// check at the budget allows (the configured check: before, or predictive), up to
    /// [`StepPolicy::budget_max_micro_batches`]
    /// (so a fast rank computes more than M, a slow one fewer).
    #[cfg_attr(
        feature = "clap",
        value(help = "Each rank computes micro-batches while elapsed < budget (Anytime-Minibatch)")
    )]
    ComputeBudget,
    /// Rebalance: chronic stragglers get fewer micro-batches, the others more, the global
    /// batch constant ([`super::Rebalancer`]); no deadline.
    #[cfg_attr(
        feature = "clap",
        value(help = "Give chronic stragglers fewer micro-batches, the others more (global batch kept)")
    )]
    Rebalance,
    /// Rebalance the chronic part and drop the transient tail with the DropCompute deadline (the
    /// configured check mode).
    #[cfg_attr(feature = "clap", value(help = "Rebalance, then DropCompute on the transient tail"))]
    RebalanceDrop,
    /// DropCompute with the length-aware predictive check: the next micro-batch's estimate is
    /// its length bucket's, learned online from the measured latencies of that bucket
    /// ([`super::bucket::BucketEstimator`]; the rank-wide estimate for a bucket not measured
    /// yet, and when the job has no buckets: then it is `drop-predictive`).
    #[cfg_attr(
        feature = "clap",
        value(help = "DropCompute, predictive check with the next micro-batch's length-bucket estimate")
    )]
    LengthPredictive,
    /// Cost-balanced dealing: each step the step's N·M micro-batches are dealt to ranks by
    /// predicted cost (their buckets' estimates, longest first: [`super::bucket::cost_balance`]),
    /// the global batch kept, then the length-aware deadline on the residual. Without buckets
    /// every micro-batch costs the same and each rank is dealt M (then it is
    /// `length-predictive`).
    #[cfg_attr(
        feature = "clap",
        value(help = "Deal each step's micro-batches to ranks by predicted bucket cost, then the deadline")
    )]
    CostBalance,
}

impl Policy {
    /// Every policy, in the order of the tables of `simulate`/`tune --policy all`.
    pub const ALL: [Policy; 9] = [
        Policy::Synchronous,
        Policy::DropBefore,
        Policy::DropPredictive,
        Policy::BackupWorkers,
        Policy::ComputeBudget,
        Policy::Rebalance,
        Policy::RebalanceDrop,
        Policy::LengthPredictive,
        Policy::CostBalance,
    ];

    /// The command-line / JSON name (kebab-case).
    pub fn name(self) -> &'static str {
        match self {
            Policy::Synchronous => "synchronous",
            Policy::DropBefore => "drop-before",
            Policy::DropPredictive => "drop-predictive",
            Policy::BackupWorkers => "backup-workers",
            Policy::ComputeBudget => "compute-budget",
            Policy::Rebalance => "rebalance",
            Policy::RebalanceDrop => "rebalance-drop",
            Policy::LengthPredictive => "length-predictive",
            Policy::CostBalance => "cost-balance",
        }
    }

    /// True when the DropCompute deadline (a threshold, [`super::decide`]) applies.
    pub fn drops(self) -> bool {
        match self {
            Policy::DropBefore
            | Policy::DropPredictive
            | Policy::RebalanceDrop
            | Policy::LengthPredictive
            | Policy::CostBalance => true,
            Policy::Synchronous | Policy::BackupWorkers | Policy::ComputeBudget | Policy::Rebalance => false,
        }
    }

    /// True when the walk is told each micro-batch's length bucket and checks the deadline with
    /// that bucket's estimate ([`super::bucket::BucketEstimator`]): `length-predictive` and
    /// `cost-balance`. The other policies run blind even on a bucketed job.
    pub fn length_aware(self) -> bool {
        match self {
            Policy::LengthPredictive | Policy::CostBalance => true,
            Policy::Synchronous
            | Policy::DropBefore
            | Policy::DropPredictive
            | Policy::BackupWorkers
            | Policy::ComputeBudget
            | Policy::Rebalance
            | Policy::RebalanceDrop => false,
        }
    }

    /// True when the walk runs under a deadline: the DropCompute threshold ([`Policy::drops`])
    /// or the compute budget (whose budget is the threshold).
    pub fn has_deadline(self) -> bool {
        match self {
            Policy::DropBefore
            | Policy::DropPredictive
            | Policy::RebalanceDrop
            | Policy::ComputeBudget
            | Policy::LengthPredictive
            | Policy::CostBalance => true,
            Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance => false,
        }
    }

    /// True when the per-rank micro-batch counts follow a [`super::Rebalancer`].
    pub fn rebalances(self) -> bool {
        match self {
            Policy::Rebalance | Policy::RebalanceDrop => true,
            Policy::Synchronous
            | Policy::DropBefore
            | Policy::DropPredictive
            | Policy::BackupWorkers
            | Policy::ComputeBudget
            | Policy::LengthPredictive
            | Policy::CostBalance => false,
        }
    }

    /// True when the per-rank counts of a step are not M each (the assignment moves work
    /// between ranks or beyond M): the rank needs more than M slots, and its run deals the one
    /// global stream by the assignment (`deal::RunData::global`).
    pub fn moves_work(self) -> bool {
        match self {
            Policy::Rebalance
            | Policy::RebalanceDrop
            | Policy::ComputeBudget
            | Policy::BackupWorkers
            | Policy::CostBalance => true,
            Policy::Synchronous | Policy::DropBefore | Policy::DropPredictive | Policy::LengthPredictive => false,
        }
    }

    /// The check mode the deadline runs with: the policy's own for `drop-before` /
    /// `drop-predictive` (and the predictive check of the length-aware `length-predictive` and
    /// `cost-balance`: their point is the bucket's estimate), `configured` otherwise (`rebalance-drop`, and the compute budget,
    /// whose budget is the threshold: with the predictive check a rank starts a micro-batch
    /// only if it is predicted to end within the budget).
    pub fn check_mode(self, configured: CheckMode) -> CheckMode {
        match self {
            Policy::DropBefore => CheckMode::BeforeMicroBatch,
            Policy::DropPredictive | Policy::LengthPredictive | Policy::CostBalance => CheckMode::Predictive,
            Policy::Synchronous
            | Policy::BackupWorkers
            | Policy::ComputeBudget
            | Policy::Rebalance
            | Policy::RebalanceDrop => configured,
        }
    }
}

impl Policy {
    /// The check mode this policy runs with when `--check` is `given` (`None`: not given, so
    /// `default`): [`Policy::check_mode`], except that a given check contradicting the
    /// policy's own (drop-before runs the before check, drop-predictive the predictive one)
    /// is refused instead of silently replaced. The one rule of `train --policy` and `tune
    /// --auto-for`.
    ///
    /// # Errors
    /// The policy's own check mode when `given` differs from it.
    pub fn resolve_check(self, given: Option<CheckMode>, default: CheckMode) -> Result<CheckMode, CheckMode> {
        let runs = self.check_mode(given.unwrap_or(default));
        match given {
            Some(g) if g != runs => Err(runs),
            _ => Ok(runs),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A step policy as one value: the [`Policy`] (its kind) with every parameter it takes
/// (identical on every rank). The DropCompute threshold itself is not here: it is [`super::DeadlineConfig::threshold`] (set by the user or `tune`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StepPolicy {
    /// The policy.
    pub policy: Policy,
    /// Backup workers: b, the number of slowest ranks whose gradient is dropped whole each step
    /// (0 = synchronous; clamped to N - 1 so that at least one rank is aggregated).
    pub backup_workers: u32,
    /// Compute budget per step (compute time, measured as the deadline is: from the step's
    /// compute clock start). [`super::Threshold::Off`]: not set (the tuner chooses it in
    /// `tune` and `simulate`; `train` refuses `compute-budget` without it). JSON: `budget_ms`,
    /// milliseconds or `null`.
    #[serde(rename = "budget_ms", with = "super::threshold_ms")]
    pub budget: super::Threshold,
    /// Compute budget: the most micro-batches a rank starts in one step. `None` = 2·M (our
    /// choice: a fast rank may compute at most twice its nominal share, which bounds what the
    /// data source must hand out and a zero-latency trace's loop).
    pub budget_max_micro_batches: Option<u32>,
    /// Rebalancing limits (`rebalance`, `rebalance-drop`).
    pub rebalance: RebalanceConfig,
    /// The second compiled shape, [`TailShape`]: a micro-batch of 1/`split` of the samples
    /// used near the deadline and for the remainder of a rebalanced assignment (`split` = 1,
    /// the default: whole micro-batches only).
    pub tail: TailShape,
    /// `cost-balance`'s padded length prior for the buckets not measured yet
    /// ([`super::bucket::BucketTokens`]: the job-wide estimate of the scheduler and of the replay
    /// both take it from here); empty (the default, not written): none, step 0 dealt blind.
    #[serde(skip_serializing_if = "super::bucket::BucketTokens::is_empty")]
    pub bucket_tokens: super::bucket::BucketTokens,
}

/// A second compiled shape of the forward/backward recipe: a *tail micro-batch* of B/`split`
/// samples (B the micro-batch size), launched instead of a whole micro-batch when the
/// predictive check says the whole one would end after the deadline but the tail one would
/// not (`policy::decide` with the tail's estimate, [`TailShape::estimate_ns`]), and to run the
/// remainder of a rebalanced assignment counted in tail parts. A launched graph cannot be
/// aborted on the device, so a finer shape is the only way to stop closer to the deadline
/// (issue 16's "shorter final micro-batch near the deadline").
///
/// Work is then counted in *parts*: one part = B/`split` samples, a whole micro-batch =
/// `split` parts. `split` = 1 is the whole-micro-batch behaviour, bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TailShape {
    /// Parts per micro-batch (>= 1; 0 reads as 1): the tail micro-batch holds B/`split`
    /// samples. B must be divisible by it where samples are dealt (`train` checks).
    pub split: u32,
    /// Device time of a tail micro-batch as a fraction of a whole micro-batch's (in (0, 1]);
    /// `None`: 1/`split` (linear in samples, an assumption: a smaller graph usually runs at
    /// lower utilisation, so measure the two recipes' device times and pass the ratio; `train`
    /// runs the mock's tail recipe at this cost).
    pub cost: Option<f64>,
}

impl Default for TailShape {
    /// `split` 1 (no tail shape), cost `None`.
    fn default() -> Self {
        Self { split: 1, cost: None }
    }
}

/// Why a tail shape is refused ([`TailShape::checked`]): the field (`split` or `cost`), its
/// value and the rule it breaks.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("tail shape {field} {value}: {}", self.why("a split", "the micro-batch size"))]
pub struct TailShapeError {
    /// `split` or `cost` (the flags `--tail-split` / `--tail-cost`).
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The rule it breaks.
    pub rule: TailRule,
}

/// The rules of [`TailShape::checked`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailRule {
    /// The split is 0 or above [`MAX_TAIL_SPLIT`].
    SplitRange,
    /// The split does not divide this micro-batch size (samples).
    SplitDivides(u32),
    /// The cost is not a finite number in (0, 1].
    CostRange,
    /// A cost is given without a tail shape (split 1).
    CostNeedsSplit,
}

impl TailShapeError {
    /// What is required, naming the split and the micro-batch size as the caller names them
    /// (`--tail-split` and `--micro-batch-size` on the command line).
    pub fn why(&self, split: &str, micro_batch_size: &str) -> String {
        match self.rule {
            TailRule::SplitRange => format!("must be in 1..={MAX_TAIL_SPLIT} (1 = whole micro-batches only)"),
            TailRule::SplitDivides(b) => {
                format!("must divide {micro_batch_size} {b} (a tail micro-batch holds b/S samples)")
            }
            TailRule::CostRange => "must be a fraction in (0, 1] of a whole micro-batch's time".into(),
            TailRule::CostNeedsSplit => format!("needs {split} >= 2 (there is no tail shape)"),
        }
    }
}

/// The largest split [`TailShape::checked`] accepts (a tail micro-batch of B/64 samples).
pub const MAX_TAIL_SPLIT: u32 = 64;

impl TailShape {
    /// The tail shape of `split` parts per micro-batch of `micro_batch_size` samples with the
    /// tail cost `cost` (a fraction of a whole micro-batch's device time; `None`: linear), every
    /// rule checked once for every caller (`train`, `tune`, `simulate`).
    ///
    /// # Errors
    /// [`TailShapeError`] naming `split` when it is 0, above [`MAX_TAIL_SPLIT`], or does not
    /// divide `micro_batch_size` (when given: a tail micro-batch holds b/S samples); naming
    /// `cost` when it is not a finite number in (0, 1] or is given with split 1.
    pub fn checked(split: u32, cost: Option<f64>, micro_batch_size: Option<u32>) -> Result<Self, TailShapeError> {
        let bad = |field, value: String, rule| Err(TailShapeError { field, value, rule });
        if split == 0 || split > MAX_TAIL_SPLIT {
            return bad("split", split.to_string(), TailRule::SplitRange);
        }
        if let Some(c) = cost {
            if !(c.is_finite() && c > 0.0 && c <= 1.0) {
                return bad("cost", c.to_string(), TailRule::CostRange);
            }
            if split == 1 {
                return bad("cost", c.to_string(), TailRule::CostNeedsSplit);
            }
        }
        if let Some(b) = micro_batch_size
            && !b.is_multiple_of(split)
        {
            return bad("split", split.to_string(), TailRule::SplitDivides(b));
        }
        Ok(Self { split, cost })
    }

    /// A tail shape of B/`split` samples with the default (linear) cost.
    pub fn split(split: u32) -> Self {
        Self { split, cost: None }
    }

    /// Parts per micro-batch, at least 1.
    pub fn parts(&self) -> u32 {
        self.split.max(1)
    }

    /// True when a tail shape exists (`split` > 1).
    pub fn enabled(&self) -> bool {
        self.parts() > 1
    }

    /// The tail micro-batch's device time over a whole one's: [`TailShape::cost`] when finite
    /// and in (0, 1], else 1/`split`.
    pub fn cost_fraction(&self) -> f64 {
        match self.cost {
            Some(c) if c.is_finite() && c > 0.0 && c <= 1.0 => c,
            _ => 1.0 / f64::from(self.parts()),
        }
    }

    /// The estimated latency (ns) of a tail micro-batch from a whole micro-batch's estimate
    /// `whole_ns` (rounded up: the estimate must not shrink below the cost model).
    pub fn estimate_ns(&self, whole_ns: u64) -> u64 {
        (whole_ns as f64 * self.cost_fraction()).ceil() as u64
    }
}

impl StepPolicy {
    /// `policy` with the default parameters (b = 1, no budget, default rebalancing).
    pub fn new(policy: Policy) -> Self {
        Self { policy, ..Self::default() }
    }

    /// The deadline the walk of this policy runs under, given the DropCompute `threshold`:
    /// the budget for `compute-budget` ([`StepPolicy::budget`]; off when unset), `threshold` for the drop policies, off for the
    /// policies without a deadline ([`Policy::has_deadline`]).
    pub fn deadline(&self, threshold: super::Threshold) -> super::Threshold {
        use super::Threshold;
        match self.policy {
            Policy::ComputeBudget => self.budget,
            Policy::DropBefore
            | Policy::DropPredictive
            | Policy::RebalanceDrop
            | Policy::LengthPredictive
            | Policy::CostBalance => threshold,
            Policy::Synchronous | Policy::BackupWorkers | Policy::Rebalance => Threshold::Off,
        }
    }

    /// The per-rank cap of micro-batches under the compute budget for a nominal `m`
    /// micro-batches per rank: [`StepPolicy::budget_max_micro_batches`] (at least 1) or, when
    /// unset, 2·m (saturating, at least 1).
    pub fn budget_cap(&self, m: u32) -> u32 {
        match self.budget_max_micro_batches {
            Some(c) => c.max(1),
            None => m.saturating_mul(2).max(1),
        }
    }

    /// The most whole micro-batches `cost-balance` deals one rank in a step: the policy's cap
    /// ([`StepPolicy::budget_cap`] of `m`) within the run's micro-batch slots per rank `slots`
    /// (`SchedulerConfig::slots`; `train` sizes them to the cap). The one cap of the
    /// scheduler's cost-balanced deal (`schedule::step`) and of its replay (`sim::policies`,
    /// `PolicyRun::slots`), so the two cannot disagree when the slots are fewer.
    pub fn deal_cap(&self, m: u32, slots: u32) -> u32 {
        self.budget_cap(m).min(slots)
    }
}

impl Default for StepPolicy {
    /// `drop-predictive` (the scheduler's default check), b = 1, no budget, the default cap,
    /// default rebalancing, no tail shape, no bucket prior.
    fn default() -> Self {
        Self {
            policy: Policy::DropPredictive,
            backup_workers: 1,
            budget: super::Threshold::Off,
            budget_max_micro_batches: None,
            rebalance: RebalanceConfig::default(),
            tail: TailShape::default(),
            bucket_tokens: super::bucket::BucketTokens::default(),
        }
    }
}

/// Backup workers' aggregation: which ranks' gradients enter the step, given each rank's
/// compute finish time (ns from the step's compute clock start, one per rank) and `b`.
///
/// Returns one flag per rank: true for the first N - b' ranks to finish, b' = min(b, N - 1)
/// (at least one rank is aggregated). Ties are broken by rank id (the lower id finishes
/// "first"); a NaN finish time counts as the latest. With b = 0 every flag is true. Empty input
/// gives an empty output. Never panics.
pub fn backup_aggregated(finish_ns: &[f64], b: u32) -> Vec<bool> {
    let n = finish_ns.len();
    if n == 0 {
        return Vec::new();
    }
    let b = (b as usize).min(n - 1);
    let mut keep = vec![true; n];
    if b == 0 {
        return keep;
    }
    let mut order: Vec<usize> = (0..n).collect();
    // NaN last: map it to +inf for ordering, then rank id.
    let key = |i: usize| if finish_ns[i].is_nan() { f64::INFINITY } else { finish_ns[i] };
    order.sort_by(|&a, &c| key(a).total_cmp(&key(c)).then(a.cmp(&c)));
    for &r in &order[n - b..] {
        keep[r] = false;
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[cfg(feature = "clap")]
    #[test]
    fn names_are_kebab_case_in_clap_serde_and_display() {
        use clap::ValueEnum;
        for p in Policy::ALL {
            let json = serde_json::to_string(&p).expect("serialize");
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<Policy>(&json).expect("read back"), p);
            assert_eq!(Policy::from_str(p.name(), false).expect("clap name"), p);
            assert_eq!(p.to_string(), p.name());
        }
        assert_eq!(Policy::value_variants().len(), Policy::ALL.len());
        assert_eq!(Policy::RebalanceDrop.name(), "rebalance-drop");
        // The check modes' one spelling is clap's and serde's too.
        for c in [CheckMode::BeforeMicroBatch, CheckMode::Predictive] {
            assert_eq!(CheckMode::from_str(c.name(), false).expect("clap name"), c);
            assert_eq!(serde_json::to_string(&c).expect("serialize"), format!("\"{}\"", c.name()));
            assert_eq!(c.to_string(), c.name());
        }
    }

    /// Every policy x `--check` (given or not): drop-before and drop-predictive refuse the
    /// other check, naming their own; the rest run the given one, else the default.
    #[test]
    fn resolve_check_applies_or_refuses_every_combination() {
        use CheckMode::{BeforeMicroBatch as B, Predictive as P};
        for p in Policy::ALL {
            for given in [None, Some(B), Some(P)] {
                for default in [B, P] {
                    let got = p.resolve_check(given, default);
                    let want = match (p, given) {
                        (Policy::DropBefore, Some(P)) => Err(B),
                        (Policy::DropPredictive | Policy::LengthPredictive | Policy::CostBalance, Some(B)) => Err(P),
                        (Policy::DropBefore, _) => Ok(B),
                        (Policy::DropPredictive | Policy::LengthPredictive | Policy::CostBalance, _) => Ok(P),
                        (_, g) => Ok(g.unwrap_or(default)),
                    };
                    assert_eq!(got, want, "{p} {given:?} default {default:?}");
                }
            }
        }
    }

    #[test]
    fn check_modes_and_flags() {
        use CheckMode::*;
        assert_eq!(Policy::DropBefore.check_mode(Predictive), BeforeMicroBatch);
        assert_eq!(Policy::DropPredictive.check_mode(BeforeMicroBatch), Predictive);
        assert_eq!(Policy::RebalanceDrop.check_mode(Predictive), Predictive);
        assert_eq!(Policy::RebalanceDrop.check_mode(BeforeMicroBatch), BeforeMicroBatch);
        assert_eq!(Policy::ComputeBudget.check_mode(Predictive), Predictive);
        assert_eq!(Policy::ComputeBudget.check_mode(BeforeMicroBatch), BeforeMicroBatch);
        let drops: Vec<_> = Policy::ALL.into_iter().filter(|p| p.drops()).collect();
        assert_eq!(
            drops,
            vec![
                Policy::DropBefore,
                Policy::DropPredictive,
                Policy::RebalanceDrop,
                Policy::LengthPredictive,
                Policy::CostBalance
            ]
        );
        let aware: Vec<_> = Policy::ALL.into_iter().filter(|p| p.length_aware()).collect();
        assert_eq!(aware, vec![Policy::LengthPredictive, Policy::CostBalance]);
        assert!(Policy::CostBalance.moves_work() && !Policy::LengthPredictive.moves_work());
        let reb: Vec<_> = Policy::ALL.into_iter().filter(|p| p.rebalances()).collect();
        assert_eq!(reb, vec![Policy::Rebalance, Policy::RebalanceDrop]);
    }

    #[test]
    fn params_read_back_and_cap() {
        let p = StepPolicy {
            budget: crate::policy::Threshold::from_ms(12.5).expect("ms"),
            backup_workers: 2,
            ..StepPolicy::new(Policy::ComputeBudget)
        };
        let s = serde_json::to_string(&p).expect("serialize");
        assert_eq!(serde_json::from_str::<StepPolicy>(&s).expect("read back"), p);
        assert_eq!(p.budget_cap(12), 24);
        assert_eq!(StepPolicy { budget_max_micro_batches: Some(0), ..p }.budget_cap(12), 1);
        assert_eq!(StepPolicy { budget_max_micro_batches: Some(30), ..p }.budget_cap(12), 30);
        // Missing fields take the defaults.
        let d: StepPolicy = serde_json::from_str(r#"{"policy":"rebalance"}"#).expect("partial");
        assert_eq!(d, StepPolicy::new(Policy::Rebalance));
    }

    /// The one tail-shape check: each rule names its field and value; a valid shape passes.
    #[test]
    fn tail_shapes_are_checked_once_naming_the_field() {
        // (split, cost, micro-batch size, the field refused or None)
        type Case = (u32, Option<f64>, Option<u32>, Option<&'static str>);
        let cases: [Case; 9] = [
            (1, None, Some(16), None),
            (2, Some(0.6), Some(16), None),
            (64, None, None, None),
            (0, None, None, Some("split")),
            (65, None, None, Some("split")),
            (3, None, Some(16), Some("split")),
            (2, Some(0.0), None, Some("cost")),
            (2, Some(f64::NAN), None, Some("cost")),
            (1, Some(0.5), None, Some("cost")),
        ];
        for (split, cost, b, want) in cases {
            let got = TailShape::checked(split, cost, b);
            match (want, &got) {
                (None, Ok(t)) => assert_eq!((t.split, t.cost.map(f64::to_bits)), (split, cost.map(f64::to_bits))),
                (Some(field), Err(e)) => {
                    assert_eq!(e.field, field, "{split} {cost:?} {b:?}");
                    assert!(!e.why("a split", "b").is_empty() && !e.value.is_empty());
                }
                _ => panic!("{split} {cost:?} {b:?}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn tail_shape_cost_and_estimate() {
        let d = TailShape::default();
        assert_eq!((d.parts(), d.enabled(), d.cost_fraction()), (1, false, 1.0));
        assert_eq!(TailShape::split(0).parts(), 1, "0 reads as 1");
        let h = TailShape::split(2);
        assert_eq!((h.parts(), h.enabled(), h.cost_fraction()), (2, true, 0.5));
        assert_eq!(h.estimate_ns(11), 6, "rounded up");
        let q = TailShape { split: 4, cost: Some(0.3) };
        assert_eq!(q.cost_fraction(), 0.3);
        assert_eq!(q.estimate_ns(100), 30);
        // An out-of-range cost falls back to 1/split.
        for bad in [0.0, -1.0, 1.5, f64::NAN, f64::INFINITY] {
            assert_eq!(TailShape { split: 4, cost: Some(bad) }.cost_fraction(), 0.25, "{bad}");
        }
        let p = StepPolicy { tail: q, ..StepPolicy::new(Policy::RebalanceDrop) };
        let s = serde_json::to_string(&p).expect("serialize");
        assert_eq!(serde_json::from_str::<StepPolicy>(&s).expect("read back"), p);
    }

    #[test]
    fn backup_drops_the_b_latest_with_ties_by_rank_and_nan_last() {
        assert_eq!(backup_aggregated(&[5.0, 9.0, 1.0, 7.0], 2), vec![true, false, true, false]);
        assert_eq!(backup_aggregated(&[5.0, 5.0, 5.0], 1), vec![true, true, false]);
        assert_eq!(backup_aggregated(&[f64::NAN, 1.0, 2.0], 1), vec![false, true, true]);
        // b >= N keeps the fastest rank.
        assert_eq!(backup_aggregated(&[3.0, 1.0, 2.0], 9), vec![false, true, false]);
        assert!(backup_aggregated(&[], 3).is_empty());
    }

    proptest! {
        #[test]
        fn backup_keeps_exactly_n_minus_b_and_no_dropped_rank_beats_a_kept_one(
            t in proptest::collection::vec(0.0f64..100.0, 1..20), b in 0u32..25) {
            let keep = backup_aggregated(&t, b);
            let n = t.len();
            let kept = keep.iter().filter(|&&k| k).count();
            prop_assert_eq!(kept, n - (b as usize).min(n - 1));
            let max_kept = t.iter().zip(&keep).filter(|(_, k)| **k).map(|(x, _)| *x).fold(f64::MIN, f64::max);
            for (x, k) in t.iter().zip(&keep) {
                if !k { prop_assert!(*x >= max_kept); }
            }
            if b == 0 { prop_assert!(keep.iter().all(|&k| k)); }
        }
    }
}
