//! Micro-batches, the rank's data source, and the ledger of dropped samples.
//!
//! Owns: [`MicroBatch`], the [`DataSource`] trait, [`EpochQueue`] (a ready-made source over a
//! list of sample ids with re-queueing) and [`DropLedger`]. Must not touch: devices, sample
//! contents (a micro-batch is a list of sample ids; the workload fetches the data).
//!
//! Why a ledger: the reference implementation does not advance the data loader for dropped
//! micro-batches, so their samples silently move to later steps (and one pulled micro-batch is
//! thrown away in its DeepSpeed variant; `../shared/reference/dropcompute.md` §2). Here every
//! dropped micro-batch is recorded with its fate, and by default handed back to the source.

use serde::{Deserialize, Serialize};

/// One micro-batch of one rank: the sample ids it holds (its position in the step is decided
/// by the scheduler).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroBatch {
    /// Sample ids (unique within an epoch); `sample_ids.len()` samples, >= 1.
    pub sample_ids: Vec<u64>,
    /// Token count, when the workload weighs by tokens (`Weighting::Tokens`).
    pub tokens: Option<u64>,
}

impl MicroBatch {
    /// A micro-batch of `ids` without a token count.
    pub fn new(ids: Vec<u64>) -> Self {
        Self { sample_ids: ids, tokens: None }
    }

    /// Number of samples.
    pub fn samples(&self) -> u64 {
        self.sample_ids.len() as u64
    }
}

/// Where a rank's micro-batches come from. The scheduler takes up to M micro-batches at the
/// start of each step and gives back, in order, the ones it did not start (re-queue mode).
pub trait DataSource {
    /// The next micro-batch, `None` when the source is exhausted (end of epoch).
    fn next_micro_batch(&mut self) -> Option<MicroBatch>;
    /// Puts `dropped` back at the front, in the given order (so the first of them comes out
    /// next).
    fn requeue(&mut self, dropped: Vec<MicroBatch>);
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
}

/// The per-rank record of every dropped micro-batch and of every computed sample id, so that
/// "no sample lost or computed twice" can be checked over an epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropLedger {
    /// Dropped micro-batches in order.
    pub dropped: Vec<DropRecord>,
    /// Sample ids computed, in order.
    pub computed: Vec<u64>,
}

impl DropLedger {
    /// Samples discarded for good.
    pub fn discarded_samples(&self) -> u64 {
        self.dropped.iter().filter(|d| d.fate == DropFate::Discarded).map(|d| d.sample_ids.len() as u64).sum()
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
}
