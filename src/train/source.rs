//! The data source of one run of `train`, the one data-dealing model of both runs of a job and
//! of its prediction: every rank's replica of one global epoch stream dealt by the step's
//! assignment (`schedule::SharedSource` over an [`EpochSource`] of world size 1: the (seed,
//! epoch) shuffle, undealt), every rank's dropped micro-batches back at the front in rank
//! order, so the next step's ranks pick them up. Every policy deals this way (issue 23: with
//! per-rank shards a slow rank's re-queued micro-batches stayed in its own shard, and an
//! `--epochs` run ended only once that rank had worked off its backlog: 0.950x measured against
//! 1.381x predicted). Per-rank shards ([`RunData::PerRank`]) remain readable from older
//! checkpoints.
//!
//! Owns: [`RunData`], [`RunData::global`] and [`RunData::moves_work`]. Must not touch: the
//! assignment itself (`policy`, `schedule`), the shuffle and epochs (`workload::EpochSource`).
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

use super::workload::EpochSource;
use crate::policy::Policy;
use crate::schedule::{DataSource, MicroBatch, SharedSource};

/// One rank's data source of a run (checkpointed with the rank).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RunData {
    /// This rank's own shard of every epoch (round-robin deal); dropped micro-batches come
    /// back to this rank. (Untagged: checkpoints written before [`RunData`] read back as this.)
    PerRank(EpochSource),
    /// The global epoch stream, dealt per step by the assignment; every rank's dropped tail
    /// goes back to the front in rank order.
    Shared(SharedSource<EpochSource>),
}

impl RunData {
    /// Rank's replica of the global stream over `samples` samples: `micro_batch_size` is the
    /// size of what is dealt (a part of b/S under a tail shape) and `merge` the parts merged
    /// into one micro-batch (S for a baseline paired with a tail-shape run, 1 otherwise:
    /// [`EpochSource::merged`]); the stream ends after `max_epochs` epochs (`None`: never).
    pub fn global(samples: u64, seed: u64, micro_batch_size: usize, merge: usize, max_epochs: Option<u64>) -> Self {
        Self::Shared(global_stream(samples, seed, micro_batch_size, merge, max_epochs))
    }

    /// True for the policies whose per-rank micro-batch counts are not M every step (their
    /// ranks need more slots than M).
    pub fn moves_work(policy: Policy) -> bool {
        match policy {
            Policy::Rebalance | Policy::RebalanceDrop | Policy::ComputeBudget | Policy::BackupWorkers => true,
            Policy::Synchronous | Policy::DropBefore | Policy::DropPredictive => false,
        }
    }

    /// Sets the number of epochs after which the source ends (`EpochSource::set_max_epochs`).
    pub fn set_max_epochs(&mut self, max_epochs: Option<u64>) {
        match self {
            Self::PerRank(s) => s.set_max_epochs(max_epochs),
            Self::Shared(s) => s.inner.set_max_epochs(max_epochs),
        }
    }
}

/// The one global stream of [`RunData::global`] (same arguments).
fn global_stream(
    samples: u64,
    seed: u64,
    micro_batch_size: usize,
    merge: usize,
    max_epochs: Option<u64>,
) -> SharedSource<EpochSource> {
    SharedSource::new(EpochSource::new(0, 1, samples, seed, micro_batch_size, max_epochs).merged(merge))
}

/// A run's data stream as the replay deals it (`sim::policies::ReplayData`): the run's one
/// global stream ([`RunData::global`]) dealt by the replay's assignments, the not-started parts
/// re-queued as the run re-queues them, so a prediction deals exactly as the run it predicts.
/// The run ends after `steps` steps, or (`steps` = `None`, an `--epochs` run) at the first
/// step in which the stream deals nothing, as `train`'s loop ends. Counts the samples of the
/// started parts ([`ReplayStream::samples`]).
#[derive(Clone, Debug)]
pub struct ReplayStream {
    data: SharedSource<EpochSource>,
    steps: Option<u64>,
    step_samples: Vec<u64>,
}

impl ReplayStream {
    /// The stream of a run over `samples` samples dealt in parts of `part_size` samples (the
    /// second run's micro-batch size over its tail split), ending after `max_epochs` epochs
    /// (`None`: never) or `steps` steps (`None`: at the stream's end).
    pub fn new(samples: u64, seed: u64, part_size: usize, max_epochs: Option<u64>, steps: Option<u64>) -> Self {
        Self { data: global_stream(samples, seed, part_size, 1, max_epochs), steps, step_samples: Vec::new() }
    }

    /// The stream `job`'s second run deals (its samples, seed, parts of b/S, epochs or steps),
    /// as `train::run` builds it: the data model of the job's prediction.
    pub fn for_job(job: &super::job::Job) -> Self {
        let cfg = &job.cfg;
        let part_size = (cfg.micro_batch_size / cfg.tail.parts()) as usize;
        Self::new(job.train.len() as u64, cfg.seed, part_size, job.max_epochs(), job.steps())
    }

    /// Samples of every part started so far.
    pub fn samples(&self) -> u64 {
        self.step_samples.iter().sum()
    }

    /// Samples of the parts started in each settled step, in order.
    pub fn step_samples(&self) -> &[u64] {
        &self.step_samples
    }
}

impl crate::sim::policies::ReplayData for ReplayStream {
    fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
        if self.steps.is_some_and(|s| index as u64 >= s) {
            return None;
        }
        let _ = self.data.take_assigned(0, assignment);
        let counts: Vec<u32> = self.data.dealt().iter().map(|v| v.len() as u32).collect();
        if self.steps.is_none() && counts.iter().all(|&c| c == 0) {
            self.data.settle(0, &[], Vec::new(), true);
            return None;
        }
        Some(counts)
    }

    fn settle(&mut self, started: &[u32]) {
        let done: u64 = self
            .data
            .dealt()
            .iter()
            .zip(started)
            .flat_map(|(slice, &k)| slice.iter().take(k as usize))
            .map(MicroBatch::samples)
            .sum();
        self.step_samples.push(done);
        self.data.settle(0, started, Vec::new(), true);
    }
}

impl DataSource for RunData {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        match self {
            Self::PerRank(s) => s.next_micro_batch(),
            Self::Shared(s) => s.next_micro_batch(),
        }
    }

    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        match self {
            Self::PerRank(s) => s.requeue(dropped),
            Self::Shared(s) => s.requeue(dropped),
        }
    }

    fn take_assigned(&mut self, rank: u32, assignment: &[u32]) -> Vec<MicroBatch> {
        match self {
            Self::PerRank(s) => s.take_assigned(rank, assignment),
            Self::Shared(s) => s.take_assigned(rank, assignment),
        }
    }

    fn settle(&mut self, rank: u32, computed: &[u32], dropped: Vec<MicroBatch>, requeue: bool) {
        match self {
            Self::PerRank(s) => s.settle(rank, computed, dropped, requeue),
            Self::Shared(s) => s.settle(rank, computed, dropped, requeue),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::DataSource;

    #[test]
    fn shared_replicas_deal_one_epoch_exactly_once_under_moving_assignments() {
        // 3 ranks, 30 samples, micro-batches of 2: assignments change every step and some
        // ranks drop their tail; every sample of epoch 0 is computed exactly once.
        let n = 3u32;
        let mut reps: Vec<RunData> = (0..n).map(|_| RunData::global(30, 5, 2, 1, Some(1))).collect();
        assert!(matches!(reps[0], RunData::Shared(_)));
        let plans: [([u32; 3], [u32; 3]); 4] =
            [([2, 2, 2], [2, 1, 2]), ([1, 3, 2], [1, 3, 0]), ([3, 3, 0], [3, 2, 0]), ([3, 3, 3], [3, 3, 3])];
        let mut computed: Vec<u64> = Vec::new();
        for (asg, done) in plans {
            let slices: Vec<Vec<MicroBatch>> =
                reps.iter_mut().enumerate().map(|(r, d)| d.take_assigned(r as u32, &asg)).collect();
            for (r, d) in reps.iter_mut().enumerate() {
                let k = (done[r] as usize).min(slices[r].len());
                computed.extend(slices[r][..k].iter().flat_map(|m| m.sample_ids.iter().copied()));
                d.settle(r as u32, &done, slices[r][k..].to_vec(), true);
            }
            assert!(reps.windows(2).all(|w| w[0] == w[1]), "replicas agree");
        }
        computed.sort_unstable();
        assert_eq!(computed, (0..30).collect::<Vec<_>>());
        assert!(reps[0].take_assigned(0, &[1, 1, 1]).is_empty(), "one epoch only");
        assert!(RunData::moves_work(Policy::Rebalance) && !RunData::moves_work(Policy::DropBefore));
    }

    /// A baseline paired with a tail-shape run (split 2) deals the tail run's parts merged in
    /// twos: every step the same sample ids per rank as the tail run computes without a
    /// deadline, across an epoch's short end; a requeued merged micro-batch goes back as its
    /// parts.
    #[test]
    fn a_merged_baseline_deals_the_tail_runs_parts_per_step() {
        let (n, m, s) = (3u32, 2u32, 2u32);
        {
            let policy = "global stream";
            // 31 samples, parts of 2 (b = 4): the epoch ends in a short part.
            let mut tail: Vec<RunData> = (0..n).map(|_| RunData::global(31, 5, 2, 1, Some(2))).collect();
            let mut base: Vec<RunData> = (0..n).map(|_| RunData::global(31, 5, 2, s as usize, Some(2))).collect();
            for step in 0..6 {
                for r in 0..n {
                    let ids = |v: Vec<MicroBatch>| v.into_iter().flat_map(|x| x.sample_ids).collect::<Vec<u64>>();
                    let t = tail[r as usize].take_assigned(r, &[m * s; 3]);
                    let b = base[r as usize].take_assigned(r, &[m; 3]);
                    assert!(b.iter().all(|x| x.samples() <= 4), "{policy} step {step}");
                    assert_eq!(ids(b), ids(t), "{policy} step {step} rank {r}");
                }
                for (r, d) in tail.iter_mut().enumerate() {
                    d.settle(r as u32, &[m * s; 3], Vec::new(), true);
                }
                for (r, d) in base.iter_mut().enumerate() {
                    d.settle(r as u32, &[m; 3], Vec::new(), true);
                }
            }
        }
        let mut one = EpochSource::new(0, 1, 8, 5, 2, None).merged(2);
        let first = one.next_micro_batch().expect("a micro-batch");
        assert_eq!(first.samples(), 4);
        one.requeue(vec![first.clone()]);
        // Back as two parts of 2: merged again into the same 4 samples (not 4 + 2).
        assert_eq!(one.next_micro_batch(), Some(first), "requeued as its parts, in order");
    }
}
