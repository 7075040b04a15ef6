//! The one data-dealing model of a run and of its prediction (`train`'s both runs, the replay
//! behind `train`'s prediction, the property test that pairs them): every rank's replica of one global epoch stream dealt by the step's
//! assignment (`schedule::SharedSource` over an [`EpochSource`] of world size 1: the (seed,
//! epoch) shuffle, undealt), every rank's dropped micro-batches back at the front in rank
//! order, so the next step's ranks pick them up. Every policy deals this way (issue 23: with
//! per-rank shards a slow rank's re-queued micro-batches stayed in its own shard, and an
//! `--epochs` run ended only once that rank had worked off its backlog: 0.950x measured against
//! 1.381x predicted). Per-rank shards ([`RunData::PerRank`]) remain readable from older
//! checkpoints.
//!
//! Owns: [`EpochSource`] (the (seed, epoch) shuffle of sample ids, dealt round-robin and cut
//! into micro-batches or parts), [`RunData`] (one rank's source of a run, checkpointed with it)
//! and [`ReplayStream`] (the same stream as the replay deals it). Must not touch: the
//! assignment itself (`policy::assign`), what a sample is (the workload reads its ids).
#![forbid(unsafe_code)]

use std::sync::Arc;

use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::schedule::{DataSource, EpochQueue, MicroBatch, SharedSource};
use crate::sim::policies::PartShape;

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

    /// Sets the number of epochs after which the source ends (`EpochSource::set_max_epochs`).
    pub fn set_max_epochs(&mut self, max_epochs: Option<u64>) {
        match self {
            Self::PerRank(s) => s.set_max_epochs(max_epochs),
            Self::Shared(s) => s.inner.set_max_epochs(max_epochs),
        }
    }
}

/// One rank's data: each epoch, the training set's ids shuffled by (seed, epoch) and dealt
/// round-robin to the ranks (rank r gets positions r, r+N, ...), cut into micro-batches; dropped
/// micro-batches come back first. With `max_epochs`, the source ends after that many epochs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochSource {
    rank: u32,
    world_size: u32,
    samples: u64,
    seed: u64,
    micro_batch_size: usize,
    /// Current epoch (0-based).
    pub epoch: u64,
    max_epochs: Option<u64>,
    queue: EpochQueue,
    /// Parts merged into one micro-batch (1: none). A baseline paired with a tail-shape run
    /// deals the tail run's parts of b/S samples and merges S consecutive ones, so both runs
    /// hand out the same sample ids per micro-batch, the epoch's short end included.
    #[serde(default = "one")]
    merge: usize,
}

/// Serde default of [`EpochSource`]'s merge factor (checkpoints written before it).
fn one() -> usize {
    1
}

impl EpochSource {
    /// The source of `rank` of `world_size` over `samples` training samples.
    pub fn new(
        rank: u32,
        world_size: u32,
        samples: u64,
        seed: u64,
        micro_batch_size: usize,
        max_epochs: Option<u64>,
    ) -> Self {
        let queue = EpochQueue::new(Self::shard(rank, world_size, samples, seed, 0), micro_batch_size);
        Self { rank, world_size, samples, seed, micro_batch_size, epoch: 0, max_epochs, queue, merge: 1 }
    }

    /// This source dealing micro-batches of `parts` consecutive micro-batches of its
    /// micro-batch size merged (sample ids in order, across an epoch's end as a tail-shape run
    /// takes them; 0 reads as 1).
    pub fn merged(mut self, parts: usize) -> Self {
        self.merge = parts.max(1);
        self
    }

    /// The next micro-batch of the micro-batch size (the next part), moving to the next epoch
    /// when this one is done.
    fn next_part(&mut self) -> Option<MicroBatch> {
        loop {
            if let Some(mb) = self.queue.next_micro_batch() {
                return Some(mb);
            }
            if self.max_epochs.is_some_and(|m| self.epoch + 1 >= m) {
                return None;
            }
            self.epoch += 1;
            let ids = Self::shard(self.rank, self.world_size, self.samples, self.seed, self.epoch);
            if ids.is_empty() {
                return None;
            }
            self.queue = EpochQueue::new(ids, self.micro_batch_size);
        }
    }

    /// Sets the number of epochs after which the source ends (`None`: never), e.g. when a
    /// resumed run is given another `--epochs`.
    pub fn set_max_epochs(&mut self, max_epochs: Option<u64>) {
        self.max_epochs = max_epochs;
    }

    /// Rank `rank`'s sample ids of `epoch`, in order.
    pub fn shard(rank: u32, world_size: u32, samples: u64, seed: u64, epoch: u64) -> Vec<u64> {
        let mut ids: Vec<u64> = (0..samples).collect();
        let mut rng = crate::sim::rng::stream(seed, epoch);
        ids.shuffle(&mut rng);
        ids.into_iter().skip(rank as usize).step_by(world_size.max(1) as usize).collect()
    }
}

impl DataSource for EpochSource {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        if self.merge <= 1 {
            return self.next_part();
        }
        let parts: Vec<MicroBatch> = (0..self.merge).map_while(|_| self.next_part()).collect();
        (!parts.is_empty()).then(|| MicroBatch::merged(&parts))
    }

    /// Puts `dropped` back at the front; merged micro-batches go back as their parts.
    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        if self.merge <= 1 {
            return self.queue.requeue(dropped);
        }
        let size = self.micro_batch_size.max(1);
        let parts =
            dropped.iter().flat_map(|mb| mb.sample_ids.chunks(size).map(|c| MicroBatch::new(c.to_vec()))).collect();
        self.queue.requeue(parts);
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
/// started parts ([`ReplayStream::samples`]); with a per-id table of shapes
/// ([`ReplayStream::with_shapes`]: a text job's bucket-plan units) it also knows every dealt
/// part's bucket and tokens (`ReplayData::part_shape`), deals `cost-balance`'s steps by cost
/// as the run does (`ReplayData::deal_by`, through `DataSource::take_dealt`) and counts the
/// started parts' tokens ([`ReplayStream::tokens`]).
#[derive(Clone, Debug)]
pub struct ReplayStream {
    data: SharedSource<EpochSource>,
    steps: Option<u64>,
    step_samples: Vec<u64>,
    /// Per id of the stream: its shape (`None`: the stream does not know what it deals).
    shapes: Option<Arc<[PartShape]>>,
    step_tokens: Vec<u64>,
}

impl ReplayStream {
    /// The stream of a run over `samples` samples dealt in parts of `part_size` samples (the
    /// second run's micro-batch size over its tail split), ending after `max_epochs` epochs
    /// (`None`: never) or `steps` steps (`None`: at the stream's end).
    pub fn new(samples: u64, seed: u64, part_size: usize, max_epochs: Option<u64>, steps: Option<u64>) -> Self {
        Self {
            data: global_stream(samples, seed, part_size, 1, max_epochs),
            steps,
            step_samples: Vec::new(),
            shapes: None,
            step_tokens: Vec::new(),
        }
    }

    /// This stream knowing each id's shape: `shapes[id]` is id `id`'s bucket and tokens (one
    /// entry per id of the stream; the text job builds it from its bucket plan,
    /// `train::job::Job::replay_stream`). A part of several ids has the largest of their
    /// buckets and the sum of their tokens (as `train::text::BucketPlan::shape`); a part with
    /// an id beyond the table has no shape (then `cost-balance` deals it by counts).
    pub fn with_shapes(mut self, shapes: Arc<[PartShape]>) -> Self {
        self.shapes = Some(shapes);
        self
    }

    /// Samples of every part started so far.
    pub fn samples(&self) -> u64 {
        self.step_samples.iter().sum()
    }

    /// Samples of the parts started in each settled step, in order.
    pub fn step_samples(&self) -> &[u64] {
        &self.step_samples
    }

    /// Real tokens of every part started so far; `None` without shapes.
    pub fn tokens(&self) -> Option<u64> {
        self.shapes.as_ref().map(|_| self.step_tokens.iter().sum())
    }

    /// Real tokens of the parts started in each settled step, in order (empty without shapes).
    pub fn step_tokens(&self) -> &[u64] {
        &self.step_tokens
    }

    /// The shape of `part` from `table` (module doc of [`ReplayStream::with_shapes`]).
    fn shape_in(table: &[PartShape], part: &MicroBatch) -> Option<PartShape> {
        PartShape::merged(
            part.sample_ids.iter().map(|&id| usize::try_from(id).ok().and_then(|i| table.get(i)).copied()),
        )
    }

    /// True when the run has ended before step index `index` (its `steps`).
    fn past_steps(&self, index: usize) -> bool {
        self.steps.is_some_and(|s| index as u64 >= s)
    }
}

impl crate::sim::policies::ReplayData for ReplayStream {
    fn deal(&mut self, index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
        if self.past_steps(index) {
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
        let done = || self.data.dealt().iter().zip(started).flat_map(|(slice, &k)| slice.iter().take(k as usize));
        self.step_samples.push(done().map(MicroBatch::samples).sum());
        if let Some(table) = &self.shapes {
            self.step_tokens.push(done().filter_map(|p| Self::shape_in(table, p)).map(|s| s.tokens).sum());
        }
        self.data.settle(0, started, Vec::new(), true);
    }

    fn knows_shapes(&self) -> bool {
        self.shapes.is_some()
    }

    fn part_shape(&self, rank: usize, slot: usize) -> Option<PartShape> {
        let table = self.shapes.as_ref()?;
        Self::shape_in(table, self.data.dealt().get(rank)?.get(slot)?)
    }

    fn deal_by(
        &mut self,
        index: usize,
        parts: usize,
        deal: &mut dyn FnMut(&[PartShape]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<usize>>> {
        if self.past_steps(index) {
            return None;
        }
        let table = Arc::clone(self.shapes.as_ref()?);
        let mut positions = None;
        let mut by_shape = |window: &[MicroBatch]| -> Vec<Vec<usize>> {
            // An unknown shape: an empty deal, which `take_dealt` refuses (nothing taken).
            let shapes: Option<Vec<PartShape>> = window.iter().map(|p| Self::shape_in(&table, p)).collect();
            let d = shapes.map(|s| deal(&s)).unwrap_or_default();
            positions = Some(d.clone());
            d
        };
        self.data.take_dealt(0, parts, &mut by_shape)?;
        positions
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

    /// The shared stream's deal ([`SharedSource`]); `None` for per-rank shards.
    fn take_dealt(
        &mut self,
        rank: u32,
        parts: usize,
        deal: &mut dyn FnMut(&[MicroBatch]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<MicroBatch>>> {
        match self {
            Self::PerRank(s) => s.take_dealt(rank, parts, deal),
            Self::Shared(s) => s.take_dealt(rank, parts, deal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A stream with shapes: each dealt part's shape is its id's; the tokens counted are the
    /// started parts'; `deal_by` deals the window as named and re-queues the not-started
    /// tails first, as `deal` does; without shapes there is no shape, no token count, no
    /// deal by cost.
    #[test]
    fn a_stream_with_shapes_knows_its_parts_and_counts_their_tokens() {
        use crate::sim::policies::ReplayData;
        let table: Arc<[PartShape]> =
            (0..12u64).map(|id| PartShape { bucket: (id % 3) as u32, tokens: id + 1 }).collect();
        let mut plain = ReplayStream::new(12, 4, 1, None, Some(3));
        let mut s = ReplayStream::new(12, 4, 1, None, Some(3)).with_shapes(Arc::clone(&table));
        assert!(s.knows_shapes() && !plain.knows_shapes());
        let counts = s.deal(0, &[2, 2]).expect("a step");
        assert_eq!(counts, plain.deal(0, &[2, 2]).expect("a step"));
        let ids: Vec<Vec<u64>> = s.data.dealt().iter().map(|v| v.iter().map(|p| p.sample_ids[0]).collect()).collect();
        for (r, row) in ids.iter().enumerate() {
            for (j, &id) in row.iter().enumerate() {
                assert_eq!(s.part_shape(r, j), Some(table[id as usize]), "rank {r} slot {j}");
            }
        }
        assert_eq!((s.part_shape(0, 2), plain.part_shape(0, 0)), (None, None));
        // Rank 1 starts one of its two: the tokens of three parts.
        s.settle(&[2, 1]);
        plain.settle(&[2, 1]);
        assert_eq!(s.step_tokens(), &[ids[0][0] + 1 + ids[0][1] + 1 + ids[1][0] + 1]);
        assert_eq!((s.tokens(), plain.tokens()), (Some(s.step_tokens()[0]), None));
        assert_eq!(s.samples(), 3);
        // By cost: the window of 4 parts, rank 0 the last two, rank 1 the first two; the
        // dropped part comes first in the window.
        let mut seen = Vec::new();
        let dealt = s.deal_by(1, 4, &mut |w: &[PartShape]| {
            seen = w.to_vec();
            vec![vec![2, 3], vec![0, 1]]
        });
        assert_eq!(dealt, Some(vec![vec![2, 3], vec![0, 1]]));
        assert_eq!(seen[0], table[ids[1][1] as usize], "the re-queued part first");
        assert_eq!(s.part_shape(1, 0), Some(seen[0]));
        assert_eq!(s.part_shape(0, 0), Some(seen[2]));
        assert!(plain.deal_by(1, 4, &mut |_: &[PartShape]| vec![vec![0, 1, 2, 3], vec![]]).is_none());
        // A deal naming an index twice is refused, nothing taken; past the run's steps, none.
        s.settle(&[2, 2]);
        assert!(s.deal_by(2, 4, &mut |_: &[PartShape]| vec![vec![0, 0], vec![1, 2]]).is_none());
        assert!(s.deal_by(3, 4, &mut |_: &[PartShape]| vec![vec![0, 1], vec![2, 3]]).is_none());
    }

    #[test]
    fn every_epoch_deals_each_sample_to_exactly_one_rank() {
        let (n, samples) = (3u32, 20u64);
        for epoch in 0..3 {
            let mut all: Vec<u64> = (0..n).flat_map(|r| EpochSource::shard(r, n, samples, 7, epoch)).collect();
            all.sort_unstable();
            assert_eq!(all, (0..samples).collect::<Vec<_>>());
        }
        assert_ne!(EpochSource::shard(0, n, samples, 7, 0), EpochSource::shard(0, n, samples, 7, 1));
    }

    #[test]
    fn a_bounded_source_ends_after_its_epochs_and_requeues_first() {
        let mut s = EpochSource::new(1, 2, 10, 3, 2, Some(2));
        let mut seen = vec![];
        let first = s.next_micro_batch().unwrap();
        s.requeue(vec![first.clone()]);
        while let Some(mb) = s.next_micro_batch() {
            seen.extend(mb.sample_ids);
        }
        let mut want = EpochSource::shard(1, 2, 10, 3, 0);
        want.extend(EpochSource::shard(1, 2, 10, 3, 1));
        assert_eq!(seen, want);
        assert_eq!(&seen[..2], &first.sample_ids[..]);
    }
}
