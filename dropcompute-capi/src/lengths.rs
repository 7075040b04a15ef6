//! The length-aware face layer shared by the C ABI (`dc_policy_new_kind`,
//! `dc_walk_set_micro_batches`, `dc_walk_tokens_started`, `dc_estimator_observe`,
//! `dc_estimator_estimate`, `dc_divisor_weighted`) and the Python module (`Policy(kind=...,
//! bucket_lengths=...)`, `StepWalk.set_micro_batches`, `StepWalk.tokens_started`): a step walk
//! that knows each micro-batch's length bucket and tokens, so `length-predictive` and
//! `cost-balance` price the next micro-batch by its own bucket in C and Python as the Rust
//! scheduler does.
//!
//! Owns: [`FaceKind`] (a deadline policy kind with its declared bucket lengths), [`FaceWalk`]
//! (the one `policy::walk::RankWalk` of a face plus the micro-batches' buckets and tokens), the
//! one validation of what a face is told about its micro-batches (`set_micro_batches`), and
//! [`deal_by_cost`] (the face's call of `policy::cost_balance`). Must not touch: the walk, the
//! estimate, the deal or the divisor themselves (`policy::walk`, `policy::bucket`,
//! `schedule::divisor`: every call forwards), devices, clocks, I/O.
//!
//! Buckets are named by their index into the declared bucket lengths (bucket b has padded
//! length `bucket_lengths[b]`, tokens), as in the crate (`policy::BucketTokens`); the declared
//! lengths are the padded length prior of [`deal_by_cost`] for the buckets not measured yet.

use dropcompute::policy::walk::RankWalk;
use dropcompute::policy::{self, BucketEstimator, BucketTokens, CheckMode, DeadlineConfig, Threshold};

use crate::{FaceError, check_size, invalid};

/// A deadline policy of a face: the kind (one of [`FaceKind::KINDS`]), its deadline and the
/// declared bucket lengths (tokens, strictly ascending, at most [`BucketTokens::MAX`]; empty:
/// the job has no buckets).
#[derive(Clone, Debug, PartialEq)]
pub struct FaceKind {
    /// The kind.
    pub kind: policy::Policy,
    /// The deadline (its check mode is the kind's, `Policy::check_mode`).
    pub cfg: DeadlineConfig,
    /// Declared bucket lengths (tokens), strictly ascending.
    pub bucket_lengths: Vec<u32>,
}

impl FaceKind {
    /// The kinds a face walk runs: the DropCompute deadline policies whose check mode is their
    /// own (`Policy::check_mode`).
    pub const KINDS: [policy::Policy; 4] = [
        policy::Policy::DropBefore,
        policy::Policy::DropPredictive,
        policy::Policy::LengthPredictive,
        policy::Policy::CostBalance,
    ];

    /// The policy `kind` (a kebab-case name) at `threshold` (its check mode the kind's), steps
    /// `0..warmup_steps` never dropping, the first `min_micro_batches` micro-batches always
    /// started, with the declared `bucket_lengths`.
    ///
    /// # Errors
    /// [`FaceError::InvalidArgument`] for a kind not in [`FaceKind::KINDS`], a bucket length 0
    /// or not above the one before (naming its index); [`FaceError::TooLarge`] for more than
    /// [`BucketTokens::MAX`] bucket lengths.
    pub fn new(
        kind: &str,
        threshold: Threshold,
        warmup_steps: u64,
        min_micro_batches: u32,
        bucket_lengths: &[u32],
    ) -> Result<Self, FaceError> {
        let Some(p) = Self::KINDS.into_iter().find(|p| p.name() == kind) else {
            let names: Vec<&str> = Self::KINDS.iter().map(|p| p.name()).collect();
            return Err(invalid("kind", format!("{kind:?}"), format!("must be one of {}", names.join(", "))));
        };
        check_lengths(bucket_lengths)?;
        let cfg =
            DeadlineConfig { threshold, check: p.check_mode(CheckMode::Predictive), warmup_steps, min_micro_batches };
        Ok(Self { kind: p, cfg, bucket_lengths: bucket_lengths.to_vec() })
    }
}

/// Refuses more than [`BucketTokens::MAX`] bucket lengths, a length 0, or one not above the one
/// before.
fn check_lengths(lengths: &[u32]) -> Result<(), FaceError> {
    check_size("bucket_lengths", lengths.len() as u128, BucketTokens::MAX as u128, "BucketTokens::MAX")?;
    for (i, &l) in lengths.iter().enumerate() {
        if l == 0 {
            return Err(invalid_at("bucket_lengths", i, l, "must be >= 1 (tokens)"));
        }
        if i > 0 && l <= lengths[i - 1] {
            return Err(invalid_at(
                "bucket_lengths",
                i,
                l,
                format!("must be above bucket_lengths[{}] ({})", i - 1, lengths[i - 1]),
            ));
        }
    }
    Ok(())
}

/// `argument[index] value: why` as an invalid argument.
fn invalid_at(
    argument: &'static str,
    index: usize,
    value: impl std::fmt::Display,
    why: impl Into<String>,
) -> FaceError {
    FaceError::InvalidArgument { argument, value: format!("[{index}] {value}"), why: why.into() }
}

/// A face's walk of one rank's step: the scheduler's `RankWalk` (built by [`crate::walk`]) with
/// the declared bucket lengths of its policy and, once told ([`FaceWalk::set_micro_batches`]),
/// each micro-batch's bucket (fed to the walk with `RankWalk::set_buckets`) and tokens.
#[derive(Clone, Debug)]
pub struct FaceWalk {
    walk: RankWalk,
    micro_batches: u64,
    bucket_lengths: Vec<u32>,
    tokens: Vec<u64>,
}

impl FaceWalk {
    /// The walk of step `step` for a rank handed `micro_batches` micro-batches under `kind`,
    /// the check lagging `sync_lag` micro-batches.
    ///
    /// # Errors
    /// As [`crate::walk`] (`micro_batches` above `DC_MAX_MICRO_BATCHES`).
    pub fn new(kind: &FaceKind, step: u64, micro_batches: u64, sync_lag: u32) -> Result<Self, FaceError> {
        Self::with_lengths(kind.cfg, step, micro_batches, sync_lag, &kind.bucket_lengths)
    }

    /// As [`FaceWalk::new`] from a deadline and declared lengths (empty: no buckets; the old
    /// constructors `dc_walk_new` and `StepWalk(policy)` of a policy without lengths).
    ///
    /// # Errors
    /// As [`crate::walk`].
    pub fn with_lengths(
        cfg: DeadlineConfig,
        step: u64,
        micro_batches: u64,
        sync_lag: u32,
        bucket_lengths: &[u32],
    ) -> Result<Self, FaceError> {
        let walk = crate::walk(cfg, step, micro_batches, sync_lag)?;
        Ok(Self { walk, micro_batches, bucket_lengths: bucket_lengths.to_vec(), tokens: Vec::new() })
    }

    /// The walk (drive it with `next`, `ended`, `peek`, `clock_at`).
    pub fn walk(&self) -> &RankWalk {
        &self.walk
    }

    /// The walk, mutably.
    pub fn walk_mut(&mut self) -> &mut RankWalk {
        &mut self.walk
    }

    /// The declared bucket lengths.
    pub fn bucket_lengths(&self) -> &[u32] {
        &self.bucket_lengths
    }

    /// Tells the walk each micro-batch's bucket (`buckets[j]`: an index into the declared bucket
    /// lengths; `None`: not known, the walk asks its estimator blind) and tokens (`tokens[j]`,
    /// what the tokens divisor counts), micro-batch j in launch order. The one validation of
    /// both faces, done once here.
    ///
    /// # Errors
    /// [`FaceError::InvalidArgument`] (nothing is changed) when the walk has launched already,
    /// `tokens` does not hold one value per micro-batch of the walk, `buckets` is not as long
    /// as `tokens`, or a bucket is not below the number of declared lengths (naming the
    /// index and value).
    pub fn set_micro_batches(&mut self, buckets: Option<&[u32]>, tokens: &[u64]) -> Result<(), FaceError> {
        if self.walk.launches() > 0 {
            return Err(invalid(
                "set_micro_batches",
                format!("after {} launch(es)", self.walk.launches()),
                "must be called before the walk's first launch",
            ));
        }
        if tokens.len() as u64 != self.micro_batches {
            return Err(invalid(
                "tokens",
                format!("of length {}", tokens.len()),
                format!("must hold one value per micro-batch ({})", self.micro_batches),
            ));
        }
        if let Some(b) = buckets {
            if b.len() != tokens.len() {
                return Err(invalid(
                    "buckets",
                    format!("of length {}", b.len()),
                    format!("must be as long as tokens ({})", tokens.len()),
                ));
            }
            let n = self.bucket_lengths.len();
            if let Some((i, &v)) = b.iter().enumerate().find(|&(_, &v)| v as usize >= n) {
                let why = if n == 0 {
                    "no bucket lengths were declared (pass bucket_lengths to the policy)".to_string()
                } else {
                    format!("must be a bucket index below {n} (the declared bucket lengths {:?})", self.bucket_lengths)
                };
                return Err(invalid_at("buckets", i, v, why));
            }
        }
        self.walk.set_buckets(buckets.unwrap_or(&[]));
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Tokens of the micro-batches started so far (what the tokens divisor counts: summed over
    /// the launches, saturating; 0 when not told).
    pub fn tokens_started(&self) -> u64 {
        self.tokens.iter().take(self.walk.launches()).fold(0u64, |a, &t| a.saturating_add(t))
    }
}

/// The face's cost-balanced deal of one step (`policy::cost_balance` over `policy::bucket_cost`):
/// the micro-batches of buckets `buckets` (indices into `bucket_lengths`, the declared lengths,
/// the prior of the buckets not measured yet; empty: none) dealt to `ranks` ranks, at most
/// `cap` each, by `est`'s per-bucket cost. Each rank's list holds indices into `buckets`,
/// ascending.
///
/// # Errors
/// [`FaceError::InvalidArgument`] for a bucket not below the number of declared lengths (when
/// some are declared) or bad lengths (as [`FaceKind::new`]).
pub fn deal_by_cost(
    est: &BucketEstimator,
    bucket_lengths: &[u32],
    buckets: &[u32],
    ranks: usize,
    cap: usize,
) -> Result<Vec<Vec<usize>>, FaceError> {
    check_lengths(bucket_lengths)?;
    let n = bucket_lengths.len();
    if n > 0
        && let Some((i, &v)) = buckets.iter().enumerate().find(|&(_, &v)| v as usize >= n)
    {
        return Err(invalid_at("buckets", i, v, format!("must be a bucket index below {n}")));
    }
    let tokens: Vec<u64> = bucket_lengths.iter().map(|&l| u64::from(l)).collect();
    let prior = BucketTokens::new(&tokens).unwrap_or_default();
    let mut est = est.clone().with_prior(prior);
    let costs = policy::bucket::bucket_cost(&mut est, buckets);
    Ok(policy::cost_balance(&costs, ranks, cap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dropcompute::policy::WalkEstimator;
    use dropcompute::policy::walk::Next;
    use std::time::Duration;

    fn kind(name: &str, th: u64) -> FaceKind {
        FaceKind::new(name, Threshold::Fixed(Duration::from_nanos(th)), 0, 1, &[64, 128, 256]).unwrap()
    }

    #[test]
    fn kinds_and_lengths_are_validated_with_the_index_and_value() {
        let th = Threshold::from_ns(Some(10));
        let e = FaceKind::new("rebalance", th, 0, 1, &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kind \"rebalance\": must be one of drop-before, drop-predictive, length-predictive, cost-balance"
        );
        let e = FaceKind::new("cost-balance", th, 0, 1, &[64, 64]).unwrap_err();
        assert_eq!(e.to_string(), "bucket_lengths [1] 64: must be above bucket_lengths[0] (64)");
        let e = FaceKind::new("cost-balance", th, 0, 1, &[0]).unwrap_err();
        assert_eq!(e.to_string(), "bucket_lengths [0] 0: must be >= 1 (tokens)");
        let e = FaceKind::new("cost-balance", th, 0, 1, &[1; 17]).unwrap_err();
        assert_eq!(e.to_string(), "bucket_lengths 17: exceeds BucketTokens::MAX (16)");
        assert_eq!(kind("drop-before", 1).cfg.check, CheckMode::BeforeMicroBatch);
        assert_eq!(kind("length-predictive", 1).cfg.check, CheckMode::Predictive);
    }

    #[test]
    fn set_micro_batches_refuses_bad_lengths_and_buckets_and_changes_nothing() {
        type Case<'a> = (Option<&'a [u32]>, &'a [u64], &'a str);
        let k = kind("length-predictive", 100);
        let mut w = FaceWalk::new(&k, 0, 3, 0).unwrap();
        let cases: [Case<'_>; 3] = [
            (Some(&[0, 1]), &[1, 2, 3], "buckets of length 2: must be as long as tokens (3)"),
            (
                Some(&[0, 3, 1]),
                &[1, 2, 3],
                "buckets [1] 3: must be a bucket index below 3 (the declared bucket lengths [64, 128, 256])",
            ),
            (None, &[1, 2], "tokens of length 2: must hold one value per micro-batch (3)"),
        ];
        for (b, t, msg) in cases {
            assert_eq!(w.set_micro_batches(b, t).unwrap_err().to_string(), msg);
        }
        let mut blind = FaceWalk::with_lengths(k.cfg, 0, 1, 0, &[]).unwrap();
        assert_eq!(
            blind.set_micro_batches(Some(&[0]), &[5]).unwrap_err().to_string(),
            "buckets [0] 0: no bucket lengths were declared (pass bucket_lengths to the policy)"
        );
        assert!(blind.set_micro_batches(None, &[5]).is_ok());
        // After a launch the walk refuses to be told.
        w.set_micro_batches(Some(&[2, 0, 1]), &[256, 64, 128]).unwrap();
        let mut est = BucketEstimator::new(4, 1.0);
        assert!(matches!(w.walk_mut().next(&mut est), Next::Wait { upto: 0 } | Next::Launch(_)));
        let _ = w.walk_mut().next(&mut est);
        assert_eq!(w.walk().launches(), 1);
        assert_eq!(w.tokens_started(), 256);
        let e = w.set_micro_batches(None, &[1, 2, 3]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "set_micro_batches after 1 launch(es): must be called before the walk's first launch"
        );
        assert_eq!(w.tokens_started(), 256, "unchanged by the refused call");
    }

    /// The face walk decides as a `RankWalk` told the same buckets: a long bucket measured at
    /// 90 ns stops a long micro-batch at elapsed 20 under threshold 100 while a short one
    /// (10 ns) starts; the tokens started are those of the launched micro-batches.
    #[test]
    fn the_face_walk_prices_each_micro_batch_by_its_bucket() {
        let k = kind("length-predictive", 100);
        let mut est = BucketEstimator::new(4, 1.0);
        est.observe_for(Some(0), 10);
        est.observe_for(Some(2), 90);
        let buckets = [0u32, 0, 2, 0];
        let tokens = [64u64, 64, 256, 64];
        let lat = [10u64, 10, 90, 10];
        let mut w = FaceWalk::new(&k, 0, 4, 0).unwrap();
        w.set_micro_batches(Some(&buckets), &tokens).unwrap();
        let (mut end, mut launched) = (0u64, Vec::new());
        loop {
            match w.walk_mut().next(&mut est) {
                Next::Wait { upto } => {
                    while w.walk().reported() < upto {
                        let i = w.walk().reported();
                        let d = lat[launched[i] as usize];
                        end += d;
                        assert!(w.walk_mut().ended(i, end, d, &mut est));
                    }
                }
                Next::Launch(l) => launched.push(l.micro_batch),
                Next::Done(_) => break,
            }
        }
        // 0 + 10 <= 100, 10 + 10 <= 100, 20 + 90 > 100: stopped before the long one.
        assert_eq!(launched, vec![0, 1]);
        assert_eq!(w.tokens_started(), 128);
    }

    #[test]
    fn the_deal_by_cost_uses_the_length_prior_before_any_measurement() {
        let est = BucketEstimator::new(4, 1.0);
        // Lengths 64 and 512: the two long micro-batches go to different ranks.
        let d = deal_by_cost(&est, &[64, 512], &[1, 1, 0, 0, 0, 0], 2, 6).unwrap();
        // Graham's deal of costs 512, 512, 64 x 4 over 2 ranks: one long and two short each,
        // equal loads of 640.
        let lens = [64u64, 512];
        let loads: Vec<u64> = d.iter().map(|r| r.iter().map(|&i| lens[[1, 1, 0, 0, 0, 0][i]]).sum()).collect();
        assert_eq!(loads, vec![640, 640], "{d:?}");
        let mut all: Vec<usize> = d.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..6).collect::<Vec<_>>());
        assert!(d.iter().all(|r| r.iter().filter(|&&i| i < 2).count() == 1), "{d:?}");
        assert_eq!(
            deal_by_cost(&est, &[64], &[1], 2, 1).unwrap_err().to_string(),
            "buckets [0] 1: must be a bucket index below 1"
        );
    }
}
