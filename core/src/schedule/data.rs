//! Micro-batches, the rank's data source, and the ledger of dropped samples.
//!
//! Owns: [`MicroBatch`], the [`DataSource`] trait, [`EpochQueue`] (a ready-made source over a
//! list of sample ids with re-queueing), [`SharedSource`] (every rank's replica of one global
//! stream of micro-batches, dealt by a per-rank assignment, or by an explicit deal of the
//! step's window: [`DataSource::take_dealt`], the cost-balanced deal) and [`DropLedger`] (sample
//! ids, and tokens when the unit of work is tokens). Must not touch:
//! devices, sample contents (a micro-batch is a list of sample ids; the workload fetches the
//! data), the choice of the assignment (`policy::rebalance`).
//!
//! Why a ledger: the reference implementation does not advance the data loader for dropped
//! micro-batches, so their samples silently move to later steps (and one pulled micro-batch is
//! thrown away in its DeepSpeed variant; `../shared/reference/dropcompute.md` §2). Here every
//! dropped micro-batch is recorded with its fate, and by default handed back to the source.

use crate::sim::policies::PartShape;
use serde::{Deserialize, Serialize};

/// One micro-batch of one rank: the sample ids it holds (its position in the step is decided
/// by the scheduler).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroBatch {
    /// Sample ids (unique within an epoch); `sample_ids.len()` samples, >= 1.
    pub sample_ids: Vec<u64>,
    /// Token count (real, non-padding tokens), when the workload weighs by tokens
    /// (`Weighting::Tokens`).
    pub tokens: Option<u64>,
    /// The micro-batch's length bucket (the job's index of its padded length, ascending in
    /// length: one compiled graph per bucket), when the job pads to buckets; `None` for a job
    /// without buckets (the digits MLP). The length-aware policies (`policy::bucket`) read it
    /// before the launch. Absent from checkpoints written before it (and not written when
    /// `None`, so a job without buckets checkpoints byte for byte as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
}

impl MicroBatch {
    /// A micro-batch of `ids` without a token count or a bucket.
    pub fn new(ids: Vec<u64>) -> Self {
        Self { sample_ids: ids, tokens: None, bucket: None }
    }

    /// S consecutive parts as one whole micro-batch (the scheduler's whole launch under a tail
    /// shape): their sample ids in order, their token counts summed (`None` when any part has
    /// none), the largest of their buckets (a micro-batch of several buckets is padded to the
    /// largest; `None` when any part has none).
    pub fn merged(parts: &[MicroBatch]) -> MicroBatch {
        MicroBatch {
            sample_ids: parts.iter().flat_map(|p| p.sample_ids.iter().copied()).collect(),
            tokens: PartShape::merged(parts.iter().map(|p| p.tokens.map(|tokens| PartShape { bucket: 0, tokens })))
                .map(|s| s.tokens),
            bucket: Self::merged_bucket(parts),
        }
    }

    /// The bucket of S consecutive parts as one whole micro-batch ([`MicroBatch::merged`]'s,
    /// without building it): the largest of theirs, `None` when any part has none (or none is
    /// given).
    pub fn merged_bucket(parts: &[MicroBatch]) -> Option<u32> {
        PartShape::merged(parts.iter().map(|p| p.bucket.map(|bucket| PartShape { bucket, tokens: 0 })))
            .map(|s| s.bucket)
    }

    /// Number of samples.
    pub fn samples(&self) -> u64 {
        self.sample_ids.len() as u64
    }
}

/// Where a rank's micro-batches come from. At the start of each step the scheduler takes this
/// rank's assigned micro-batches ([`DataSource::take_assigned`], `assignment[rank]` of them:
/// M for every rank unless a rebalancing policy moves work) and, once every rank's counts are
/// known after the step's collective, settles the step ([`DataSource::settle`]), giving back
/// in order the ones it did not start (re-queue mode).
pub trait DataSource {
    /// The next micro-batch, `None` when the source is exhausted (end of epoch).
    fn next_micro_batch(&mut self) -> Option<MicroBatch>;
    /// Puts `dropped` back at the front, in the given order (so the first of them comes out
    /// next).
    fn requeue(&mut self, dropped: Vec<MicroBatch>);

    /// This rank's micro-batches for one step: up to `assignment[rank]` (fewer when the source
    /// runs out; none when `rank` is out of range). The default, for a per-rank source, takes
    /// them from [`DataSource::next_micro_batch`].
    fn take_assigned(&mut self, rank: u32, assignment: &[u32]) -> Vec<MicroBatch> {
        let want = assignment.get(rank as usize).copied().unwrap_or(0) as usize;
        (0..want).map_while(|_| self.next_micro_batch()).collect()
    }

    /// Ends the step after the collective: `computed[r]` is the number of micro-batches rank r
    /// started (identical on every rank: decoded from the gathered count rows), `dropped` this
    /// rank's not-started micro-batches in schedule order, `requeue` whether dropped
    /// micro-batches go back (`DropHandling::Requeue`) or are discarded. The default, for a
    /// per-rank source, requeues `dropped` when asked.
    fn settle(&mut self, rank: u32, computed: &[u32], dropped: Vec<MicroBatch>, requeue: bool) {
        let _ = (rank, computed);
        if requeue && !dropped.is_empty() {
            self.requeue(dropped);
        }
    }

    /// Every rank's micro-batches for one step dealt by `deal` instead of by contiguous
    /// counts (the cost-balanced deal of the `cost-balance` policy): the next `parts` parts of
    /// the global stream are handed to `deal`, which returns for each rank the indices (into
    /// that slice) it computes, ascending; the result is every rank's parts in that order
    /// (rank `rank`'s is this rank's to run), settled as [`DataSource::take_assigned`]'s
    /// (every rank's not-started tail back to the front, rank 0's first). `None` when the
    /// source cannot deal a global step (the default: a per-rank source), or when fewer than
    /// `parts` parts remain (an epoch's end: the caller then deals by counts); nothing is
    /// taken then. `deal` must name every index exactly once; a deal that does not is refused
    /// (`None`, the parts given back).
    fn take_dealt(
        &mut self,
        rank: u32,
        parts: usize,
        deal: &mut dyn FnMut(&[MicroBatch]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<MicroBatch>>> {
        let _ = (rank, parts, deal);
        None
    }
}

/// True when `deal` names every index of `0..len` exactly once.
fn deals_each_once(deal: &[Vec<usize>], len: usize) -> bool {
    let mut seen = vec![false; len];
    for &i in deal.iter().flatten() {
        match seen.get_mut(i) {
            Some(s) if !*s => *s = true,
            _ => return false,
        }
    }
    seen.iter().all(|&s| s)
}

/// Every rank's replica of ONE global stream of micro-batches (the inner source `S`), dealt per
/// step by an assignment: of the step's `Σ assignment` micro-batches taken from the front of the
/// stream, rank r gets positions `Σ_{q<r} assignment[q] ..` (its `assignment[r]`, fewer at the
/// end of the stream). Every rank holds the same replica and is given the same assignment and
/// the same gathered counts, so every replica stays identical without any extra communication;
/// at [`DataSource::settle`] the not-started tail of every rank's slice goes back to the front
/// of the stream in rank order (the fast ranks pick a slow rank's dropped work up next step).
/// Over an epoch of the inner source every sample is therefore started exactly once (re-queue
/// mode), whatever the assignments were.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSource<S> {
    /// The global stream (e.g. [`EpochQueue`] over every sample id of the epoch).
    pub inner: S,
    /// This step's slice of every rank (empty between steps).
    slices: Vec<Vec<MicroBatch>>,
}

impl<S: DataSource> SharedSource<S> {
    /// A replica over the global stream `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner, slices: Vec::new() }
    }

    /// Every rank's slice of the step being dealt (after [`DataSource::take_assigned`], before
    /// [`DataSource::settle`]; empty between steps), rank 0's first.
    pub fn dealt(&self) -> &[Vec<MicroBatch>] {
        &self.slices
    }
}

impl<S: DataSource> DataSource for SharedSource<S> {
    /// The next micro-batch of the global stream (no dealing: use through
    /// [`DataSource::take_assigned`]).
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        self.inner.next_micro_batch()
    }

    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        self.inner.requeue(dropped);
    }

    fn take_assigned(&mut self, rank: u32, assignment: &[u32]) -> Vec<MicroBatch> {
        // A step not settled (an error in between) gives its slices back first.
        self.settle(rank, &vec![0; self.slices.len()], Vec::new(), true);
        self.slices =
            assignment.iter().map(|&a| (0..a).map_while(|_| self.inner.next_micro_batch()).collect()).collect();
        self.slices.get(rank as usize).cloned().unwrap_or_default()
    }

    fn take_dealt(
        &mut self,
        rank: u32,
        parts: usize,
        deal: &mut dyn FnMut(&[MicroBatch]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<MicroBatch>>> {
        self.settle(rank, &vec![0; self.slices.len()], Vec::new(), true);
        let step: Vec<MicroBatch> = (0..parts).map_while(|_| self.inner.next_micro_batch()).collect();
        let dealt = if step.len() == parts { deal(&step) } else { Vec::new() };
        if step.len() < parts || !deals_each_once(&dealt, step.len()) {
            if !step.is_empty() {
                self.inner.requeue(step);
            }
            return None;
        }
        self.slices = dealt.iter().map(|idx| idx.iter().map(|&i| step[i].clone()).collect()).collect();
        Some(self.slices.clone())
    }

    /// Requeues (when `requeue`) every rank's not-started tail, rank 0's first: the replica's
    /// own record is used, `dropped` (this rank's tail) must equal it.
    fn settle(&mut self, _rank: u32, computed: &[u32], _dropped: Vec<MicroBatch>, requeue: bool) {
        let slices = std::mem::take(&mut self.slices);
        if !requeue {
            return;
        }
        let back: Vec<MicroBatch> = slices
            .into_iter()
            .enumerate()
            .flat_map(|(r, s)| {
                let done = computed.get(r).copied().unwrap_or(0) as usize;
                s.into_iter().skip(done)
            })
            .collect();
        if !back.is_empty() {
            self.inner.requeue(back);
        }
    }
}

/// A data source over a fixed list of sample ids, cut into micro-batches of `micro_batch_size`
/// (the last one may be smaller), with re-queueing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochQueue {
    ids: std::collections::VecDeque<u64>,
    requeued: std::collections::VecDeque<MicroBatch>,
    micro_batch_size: usize,
}

impl EpochQueue {
    /// A queue over `ids` in order; `micro_batch_size` is clamped to >= 1.
    pub fn new(ids: Vec<u64>, micro_batch_size: usize) -> Self {
        Self { ids: ids.into(), requeued: Default::default(), micro_batch_size: micro_batch_size.max(1) }
    }

    /// Samples not yet handed out (re-queued ones included).
    pub fn remaining_samples(&self) -> usize {
        self.ids.len() + self.requeued.iter().map(|m| m.sample_ids.len()).sum::<usize>()
    }
}

impl DataSource for EpochQueue {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        if let Some(mb) = self.requeued.pop_front() {
            return Some(mb);
        }
        if self.ids.is_empty() {
            return None;
        }
        let n = self.micro_batch_size.min(self.ids.len());
        Some(MicroBatch::new(self.ids.drain(..n).collect()))
    }

    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        for mb in dropped.into_iter().rev() {
            self.requeued.push_front(mb);
        }
    }
}

/// What happened to a dropped micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DropFate {
    /// Handed back to the data source (computed in a later step).
    Requeued,
    /// Discarded (`DropHandling::Discard`).
    Discarded,
}

/// One dropped micro-batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropRecord {
    /// 0-based step.
    pub step: u64,
    /// Rank that dropped it.
    pub rank: u32,
    /// Position the micro-batch had in the step (0-based).
    pub micro_batch: u32,
    /// Its sample ids.
    pub sample_ids: Vec<u64>,
    /// Where it went.
    pub fate: DropFate,
    /// Its real tokens, recorded when the job's unit of work is tokens
    /// (`Weighting::Tokens`; not written otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// The per-rank record of every dropped micro-batch and of every computed sample id, so that
/// "no sample lost or computed twice" can be checked over an epoch; when the job's unit of
/// work is tokens (`Weighting::Tokens`), also the tokens computed and each dropped
/// micro-batch's tokens (the token fields are not written otherwise, so a job weighing
/// samples writes its ledger as before).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropLedger {
    /// Dropped micro-batches in order.
    pub dropped: Vec<DropRecord>,
    /// Sample ids computed, in order.
    pub computed: Vec<u64>,
    /// Real tokens computed (`Weighting::Tokens`; 0 and not written under samples).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub computed_tokens: u64,
}

/// Serde's skip rule of [`DropLedger::computed_tokens`].
fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl DropLedger {
    /// Samples discarded for good.
    pub fn discarded_samples(&self) -> u64 {
        self.dropped.iter().filter(|d| d.fate == DropFate::Discarded).map(|d| d.sample_ids.len() as u64).sum()
    }

    /// Tokens discarded for good (`Weighting::Tokens`; 0 under samples).
    pub fn discarded_tokens(&self) -> u64 {
        self.dropped.iter().filter(|d| d.fate == DropFate::Discarded).filter_map(|d| d.tokens).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_queue_cuts_and_requeues_in_order() {
        let mut q = EpochQueue::new((0..10).collect(), 4);
        let a = q.next_micro_batch().unwrap();
        let b = q.next_micro_batch().unwrap();
        assert_eq!(a.sample_ids, vec![0, 1, 2, 3]);
        assert_eq!(b.sample_ids, vec![4, 5, 6, 7]);
        q.requeue(vec![a.clone(), b.clone()]);
        assert_eq!(q.remaining_samples(), 10);
        assert_eq!(q.next_micro_batch().unwrap(), a);
        assert_eq!(q.next_micro_batch().unwrap(), b);
        assert_eq!(q.next_micro_batch().unwrap().sample_ids, vec![8, 9]);
        assert!(q.next_micro_batch().is_none());
    }

    #[test]
    fn shared_source_deals_by_assignment_and_requeues_every_ranks_tail_in_rank_order() {
        let ids: Vec<u64> = (0..40).collect();
        let mut replicas: Vec<SharedSource<EpochQueue>> =
            (0..3).map(|_| SharedSource::new(EpochQueue::new(ids.clone(), 2))).collect();
        let asg = [2u32, 5, 1];
        let slices: Vec<Vec<MicroBatch>> =
            replicas.iter_mut().enumerate().map(|(r, s)| s.take_assigned(r as u32, &asg)).collect();
        let flat = |v: &Vec<MicroBatch>| v.iter().flat_map(|m| m.sample_ids.clone()).collect::<Vec<_>>();
        assert_eq!(flat(&slices[0]), vec![0, 1, 2, 3]);
        assert_eq!(flat(&slices[1]), (4..14).collect::<Vec<_>>());
        assert_eq!(flat(&slices[2]), vec![14, 15]);
        // rank 0 computed 1 of 2, rank 1 computed 3 of 5, rank 2 computed 1 of 1
        let computed = [1u32, 3, 1];
        for (r, s) in replicas.iter_mut().enumerate() {
            let own_tail = slices[r][computed[r] as usize..].to_vec();
            s.settle(r as u32, &computed, own_tail, true);
        }
        assert!(replicas.windows(2).all(|w| w[0] == w[1]), "every replica identical");
        let next = replicas[0].take_assigned(0, &[3, 0, 0]);
        assert_eq!(flat(&next), vec![2, 3, 10, 11, 12, 13], "rank 0's tail, then rank 1's, in order");
    }

    /// Under samples the ledger is written as before (no token keys); under tokens it carries
    /// them, and a ledger written before them reads back with none.
    #[test]
    fn the_ledger_writes_tokens_only_when_it_has_them() {
        let rec = |tokens| DropRecord {
            step: 1,
            rank: 0,
            micro_batch: 2,
            sample_ids: vec![5],
            fate: DropFate::Discarded,
            tokens,
        };
        let samples = DropLedger { dropped: vec![rec(None)], computed: vec![1, 2], computed_tokens: 0 };
        let json = serde_json::to_string(&samples).unwrap();
        assert_eq!(
            json,
            r#"{"dropped":[{"step":1,"rank":0,"micro_batch":2,"sample_ids":[5],"fate":"Discarded"}],"computed":[1,2]}"#
        );
        assert_eq!(serde_json::from_str::<DropLedger>(&json).unwrap(), samples);
        let tokens = DropLedger { dropped: vec![rec(Some(40))], computed: vec![1, 2], computed_tokens: 77 };
        let json = serde_json::to_string(&tokens).unwrap();
        assert!(json.contains(r#""tokens":40"#) && json.ends_with(r#""computed_tokens":77}"#), "{json}");
        assert_eq!(serde_json::from_str::<DropLedger>(&json).unwrap(), tokens);
        assert_eq!((tokens.discarded_tokens(), samples.discarded_tokens()), (40, 0));
    }

    #[test]
    fn merged_parts_sum_their_tokens_and_take_the_largest_bucket() {
        let p = |id: u64, tokens: Option<u64>, bucket: Option<u32>| MicroBatch { sample_ids: vec![id], tokens, bucket };
        let m = MicroBatch::merged(&[p(1, Some(3), Some(0)), p(2, Some(5), Some(2)), p(3, Some(1), Some(1))]);
        assert_eq!(m, MicroBatch { sample_ids: vec![1, 2, 3], tokens: Some(9), bucket: Some(2) });
        assert_eq!(MicroBatch::merged(&[p(1, Some(3), None), p(2, Some(5), Some(2))]).bucket, None);
        assert_eq!(MicroBatch::merged(&[p(1, None, Some(1)), p(2, Some(5), Some(1))]).tokens, None);
        assert_eq!(MicroBatch::merged_bucket(&[]), None);
        // A micro-batch without a bucket is written as before (no `bucket` key).
        let json = serde_json::to_string(&p(7, None, None)).unwrap();
        assert_eq!(json, r#"{"sample_ids":[7],"tokens":null}"#);
        assert_eq!(serde_json::from_str::<MicroBatch>(&json).unwrap(), p(7, None, None));
    }

    /// An explicit deal (the cost-balanced one): each rank's replica deals the step's window
    /// alike, rank r its named positions in stream order, and settles as the deal by counts
    /// (every rank's not-started tail back to the front, rank 0's first). A deal that misses or
    /// repeats a position, and a stream shorter than the window, deal nothing and take nothing.
    #[test]
    fn shared_source_deals_an_explicit_permutation_and_requeues_every_tail_in_rank_order() {
        let ids = |v: &[MicroBatch]| v.iter().flat_map(|m| m.sample_ids.clone()).collect::<Vec<_>>();
        let mut replicas: Vec<SharedSource<EpochQueue>> =
            (0..2).map(|_| SharedSource::new(EpochQueue::new((0..10).collect(), 1))).collect();
        let mut slices = Vec::new();
        for (r, s) in replicas.iter_mut().enumerate() {
            let mut seen = 0;
            let dealt = s
                .take_dealt(r as u32, 6, &mut |w: &[MicroBatch]| {
                    seen = w.len();
                    vec![vec![0, 3, 5], vec![1, 2, 4]]
                })
                .expect("dealt");
            assert_eq!(seen, 6);
            assert_eq!(dealt.iter().map(|v| ids(v)).collect::<Vec<_>>(), vec![vec![0, 3, 5], vec![1, 2, 4]]);
            assert_eq!(s.dealt(), &dealt[..]);
            slices.push(dealt);
        }
        for (r, s) in replicas.iter_mut().enumerate() {
            let own = slices[r][r][[1, 2][r]..].to_vec();
            s.settle(r as u32, &[1, 2], own, true);
        }
        assert!(replicas[0] == replicas[1], "every replica identical");
        assert_eq!(ids(&replicas[0].take_assigned(0, &[4, 0])), vec![3, 5, 4, 6], "rank 0's tail, then rank 1's");
        // Refused: a repeated position, a missing one, a short stream (the deal not asked).
        let mut s = SharedSource::new(EpochQueue::new((0..4).collect(), 1));
        assert!(s.take_dealt(0, 3, &mut |_: &[MicroBatch]| vec![vec![0, 0], vec![2]]).is_none());
        assert!(s.take_dealt(0, 3, &mut |_: &[MicroBatch]| vec![vec![0], vec![2]]).is_none());
        let mut asked = false;
        assert!(
            s.take_dealt(0, 5, &mut |_: &[MicroBatch]| {
                asked = true;
                vec![]
            })
            .is_none()
        );
        assert!(!asked, "a short window is not dealt");
        assert_eq!(s.inner.remaining_samples(), 4, "nothing taken");
        assert_eq!(ids(&s.take_assigned(0, &[4])), vec![0, 1, 2, 3], "in order");
        // A per-rank source cannot deal a global step.
        assert!(EpochQueue::new(vec![1, 2], 1).take_dealt(0, 1, &mut |_: &[MicroBatch]| vec![vec![0]]).is_none());
    }

    #[test]
    fn shared_source_discard_forgets_the_tails_and_per_rank_default_deals_assignment_rank() {
        let mut s = SharedSource::new(EpochQueue::new((0..10).collect(), 1));
        let _ = s.take_assigned(1, &[2, 2]);
        s.settle(1, &[0, 1], Vec::new(), false);
        assert_eq!(s.inner.remaining_samples(), 6);
        let mut q = EpochQueue::new((0..10).collect(), 1);
        assert_eq!(q.take_assigned(1, &[2, 3]).len(), 3);
        assert!(q.take_assigned(5, &[2, 3]).is_empty(), "a rank out of range gets nothing");
    }
}
