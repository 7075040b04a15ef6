//! The per-rank step walk: which launch (a whole micro-batch or a tail part) starts next, and
//! when the rank is done, as one pure state machine fed with latencies. The scheduler
//! (`schedule::Scheduler`, device event times) and the simulator (`sim::policies`, recorded or
//! modelled latencies) both drive this walker; neither holds a copy of the walk.
//!
//! Owns: [`RankWalk`], [`Next`], [`Launch`], [`WalkEnd`]. Must not touch: clocks, devices, I/O,
//! the data source, the assignment of the step (that is [`super::assign`]); the single
//! deadline decision stays [`super::decide`].
//!
//! The walk of one rank in one step (`../shared/reference/dropcompute.md` §2, with our tail
//! shape and sync lag):
//! - the rank is handed `cap` parts (its assignment; a whole micro-batch is `split` parts);
//! - before launch i, the check sees the device time at the end of launch i-1-k (sync lag k;
//!   0 when i-1-k < 0): the walker asks the driver for it with [`Next::Wait`];
//! - a whole micro-batch starts while at least `split` parts remain and [`super::decide`] with
//!   the whole estimate says so; when the predictive check stops a whole one (predicted
//!   overshoot), or fewer than `split` parts remain, single parts run as tail micro-batches,
//!   each checked with the tail's estimate ([`super::TailShape::estimate_ns`]);
//! - the estimator is fed a launch's latency when the driver reports its end, whole micro-batches
//!   only (it estimates a whole one), in launch order; before [`Next::Done`] the walker asks for
//!   every end not yet reported, so the estimator has seen the whole step.
//! - length buckets (the length-aware policies, `policy::bucket`): a driver that knows the
//!   bucket of each micro-batch of the rank's assignment before launching it tells the walker
//!   with [`RankWalk::set_buckets`]; the check before micro-batch j then asks the estimator for
//!   j's bucket ([`WalkEstimator::estimate_for`]), and a whole micro-batch's latency is fed under
//!   its bucket. Without buckets (the default) the estimator is asked blind, as before.

use super::bucket::WalkEstimator;
use super::{DeadlineConfig, Decision, StopReason, TailShape, decide};

/// One launch the walker asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Launch number within the step (0-based; whole and tail micro-batches alike).
    pub index: usize,
    /// The micro-batch this launch is, or is cut from (0-based, `first_part / split`).
    pub micro_batch: u32,
    /// The first part of the rank's assignment this launch computes (0-based).
    pub first_part: usize,
    /// Parts it computes: `split` for a whole micro-batch, 1 for a tail micro-batch.
    pub parts: usize,
    /// True for a whole micro-batch (its latency feeds the estimator).
    pub whole: bool,
}

/// Why the walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkEnd {
    /// Every assigned part was started.
    Assignment,
    /// The deadline stopped the next launch.
    Deadline(StopReason),
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Wait until the device has finished every launch before `upto` (`upto` = 0: until the
    /// step's compute clock has started) and report each of them, in order, with
    /// [`RankWalk::ended`]; then call [`RankWalk::next`] again.
    Wait {
        /// Launches `RankWalk::reported()..upto` are to be reported.
        upto: usize,
    },
    /// Enqueue this launch, then call [`RankWalk::next`] again.
    Launch(Launch),
    /// The rank's step is over: every launch has been reported.
    Done(WalkEnd),
}

/// The answer of [`RankWalk::peek`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek {
    /// Another launch follows.
    Again,
    /// The launch last returned is the rank's last of the step.
    Last,
    /// The decision needs the ends of launches `RankWalk::reported()..upto`.
    Wait {
        /// As in [`Next::Wait`].
        upto: usize,
    },
}

/// One rank's walk through one step (module doc). Create one per rank and step.
#[derive(Clone, Debug)]
pub struct RankWalk {
    deadline: DeadlineConfig,
    step: u64,
    cap: usize,
    tail: TailShape,
    split: usize,
    lag: usize,
    whole: Vec<bool>,
    /// Per launch: the micro-batch it is (or is cut from).
    micro_batch: Vec<u32>,
    /// The bucket of each micro-batch of the assignment (empty: not known).
    buckets: Vec<u32>,
    ends_ns: Vec<u64>,
    parts: usize,
    tail_mode: bool,
    clock_read: bool,
    clock_ns: u64,
    end: Option<WalkEnd>,
}

impl RankWalk {
    /// The walk of step `step` (0-based, compared with the deadline's warm-up) for a rank
    /// handed `cap` parts, under `deadline`, with tail shape `tail` and sync lag `sync_lag`
    /// (micro-batches the check lags behind the device).
    pub fn new(deadline: DeadlineConfig, step: u64, cap: usize, tail: TailShape, sync_lag: u32) -> Self {
        Self {
            deadline,
            step,
            cap,
            tail,
            split: tail.parts() as usize,
            lag: sync_lag as usize,
            whole: Vec::with_capacity(cap),
            micro_batch: Vec::with_capacity(cap),
            buckets: Vec::new(),
            ends_ns: Vec::with_capacity(cap),
            parts: 0,
            tail_mode: false,
            clock_read: false,
            clock_ns: 0,
            end: None,
        }
    }

    /// This walk made the walk of step `step` for a rank handed `cap` parts under the same
    /// deadline, tail shape and sync lag, as [`RankWalk::new`] makes it, keeping its buffers
    /// (a driver walking many rank-steps, the simulator, allocates once).
    pub fn restart(&mut self, step: u64, cap: usize) {
        self.step = step;
        self.cap = cap;
        self.whole.clear();
        self.micro_batch.clear();
        self.buckets.clear();
        self.ends_ns.clear();
        self.parts = 0;
        self.tail_mode = false;
        self.clock_read = false;
        self.clock_ns = 0;
        self.end = None;
    }

    /// Tells the walk the length bucket of each micro-batch of the rank's assignment, in launch
    /// order (`buckets[j]`: micro-batch j; call after [`RankWalk::new`] or
    /// [`RankWalk::restart`], before the first [`RankWalk::next`]; a restart forgets them). The
    /// check before micro-batch j then asks the estimator for `buckets[j]`'s estimate and its
    /// latency is fed under that bucket; a micro-batch beyond the slice is asked blind. The
    /// smallest change for the length-aware policies: the driver, which deals the micro-batches,
    /// knows their buckets before they run.
    pub fn set_buckets(&mut self, buckets: &[u32]) {
        self.buckets.clear();
        self.buckets.extend_from_slice(buckets);
    }

    /// The bucket of micro-batch `j`, `None` when not told.
    fn bucket(&self, j: usize) -> Option<u32> {
        self.buckets.get(j).copied()
    }

    /// What to do next. `est` is the rank's latency estimator (persistent across steps): the
    /// blind [`super::LatencyEstimator`], or a [`super::bucket::BucketEstimator`] asked for the
    /// next micro-batch's bucket ([`RankWalk::set_buckets`]). Never panics; a driver that
    /// answers [`Next::Wait`] without reporting the launches asked for is asked again.
    pub fn next<E: WalkEstimator + ?Sized>(&mut self, est: &mut E) -> Next {
        if let Some(end) = self.end {
            let launched = self.whole.len();
            return if self.ends_ns.len() < launched { Next::Wait { upto: launched } } else { Next::Done(end) };
        }
        if self.parts >= self.cap {
            self.end = Some(WalkEnd::Assignment);
            return self.next(est);
        }
        let i = self.whole.len();
        // The check before launch i sees the end of launch i-1-k; none before the pipeline fills.
        let elapsed_ns = match (i + 1).checked_sub(1 + self.lag) {
            None => 0,
            Some(0) => {
                if !self.clock_read {
                    self.clock_read = true;
                    return Next::Wait { upto: 0 };
                }
                self.clock_ns
            }
            Some(upto) => {
                if self.ends_ns.len() < upto {
                    return Next::Wait { upto };
                }
                self.ends_ns[upto - 1]
            }
        };
        let p = self.parts;
        // Only the predictive check reads an estimate (`decide`); asking in a before-check
        // walk would only cost the estimator its sorted window.
        let estimate = if self.deadline.check == crate::policy::CheckMode::Predictive {
            est.estimate_for(self.bucket(p / self.split))
        } else {
            None
        };
        if !self.tail_mode && self.cap - p >= self.split {
            match decide(&self.deadline, self.step, i as u32, elapsed_ns, estimate) {
                Decision::Start => return self.launch(true),
                Decision::Stop(StopReason::PredictedOvershoot { .. }) if self.split > 1 => self.tail_mode = true,
                Decision::Stop(reason) => {
                    self.end = Some(WalkEnd::Deadline(reason));
                    return self.next(est);
                }
            }
        }
        // Tail micro-batches (split > 1: with split 1 the branch above launched or ended).
        let tail_estimate = estimate.map(|e| self.tail.estimate_ns(e));
        match decide(&self.deadline, self.step, i as u32, elapsed_ns, tail_estimate) {
            Decision::Start => self.launch(false),
            Decision::Stop(reason) => {
                self.end = Some(WalkEnd::Deadline(reason));
                self.next(est)
            }
        }
    }

    fn launch(&mut self, whole: bool) -> Next {
        let l = Launch {
            index: self.whole.len(),
            micro_batch: (self.parts / self.split) as u32,
            first_part: self.parts,
            parts: if whole { self.split } else { 1 },
            whole,
        };
        self.whole.push(whole);
        self.micro_batch.push(l.micro_batch);
        self.parts += l.parts;
        Next::Launch(l)
    }

    /// Whether another launch follows the one [`RankWalk::next`] last returned, asked before
    /// that launch runs: the decision [`RankWalk::next`] will make, taken now on a copy of the
    /// walk and of `est` (nothing here changes). A driver that reduces gradients during the
    /// last micro-batch's backward (the Python face's overlap mode) must know it before
    /// launching it. With sync lag k >= 1 the check before launch i+1 reads the end of launch
    /// i-k, so the answer never needs the end of the launch about to run; with k = 0 it does.
    ///
    /// Returns [`Peek::Again`], [`Peek::Last`], or [`Peek::Wait`] with the launches whose ends
    /// the decision needs (report them with [`RankWalk::ended`] and ask again; `upto` 0: the
    /// clock's reading, answered with [`RankWalk::clock_at`]).
    pub fn peek<E: WalkEstimator + Clone>(&self, est: &E) -> Peek {
        let mut walk = self.clone();
        let mut est = est.clone();
        match walk.next(&mut est) {
            Next::Launch(_) => Peek::Again,
            Next::Done(_) => Peek::Last,
            // The copy has decided to end and gathers the ends for the estimator.
            Next::Wait { .. } if walk.end.is_some() => Peek::Last,
            Next::Wait { upto } => Peek::Wait { upto },
        }
    }

    /// Reports the end of launch `launch`: the device time from the step's compute clock start
    /// to its end (`end_ns`) and its own duration (`duration_ns`, fed to `est` for a whole
    /// micro-batch, under its bucket when told). Launches must be reported in order; a launch
    /// reported out of order, twice, or not yet launched is ignored (returns false).
    pub fn ended<E: WalkEstimator + ?Sized>(
        &mut self,
        launch: usize,
        end_ns: u64,
        duration_ns: u64,
        est: &mut E,
    ) -> bool {
        if launch != self.ends_ns.len() || launch >= self.whole.len() {
            return false;
        }
        self.ends_ns.push(end_ns);
        if self.whole[launch] {
            est.observe_for(self.bucket(self.micro_batch[launch] as usize), duration_ns);
        }
        true
    }

    /// Answers [`Next::Wait`] `{ upto: 0 }` with the compute time already elapsed when the
    /// driver waited (ns since the step's clock start; 0 when not called). The scheduler leaves
    /// it at 0 (it waits for the clock start event itself); a host-clocked driver (the Python
    /// face) passes its reading, so time spent before the first micro-batch counts, as the
    /// deadline's clock starts at the previous optimizer step (reference §2).
    pub fn clock_at(&mut self, elapsed_ns: u64) {
        self.clock_ns = elapsed_ns;
        // Answered: a [`RankWalk::peek`] that asked for the clock does not ask again.
        self.clock_read = true;
    }

    /// Launches reported so far (the next one to report).
    pub fn reported(&self) -> usize {
        self.ends_ns.len()
    }

    /// Launches started so far.
    pub fn launches(&self) -> usize {
        self.whole.len()
    }

    /// Parts started so far (a whole micro-batch counts `split`).
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Per launch: true for a whole micro-batch.
    pub fn whole(&self) -> &[bool] {
        &self.whole
    }

    /// Whole-micro-batch equivalents of device time started: whole + tail · the tail's cost
    /// fraction (the divisor of a rank's mean micro-batch latency).
    pub fn equivalents(&self) -> f64 {
        let whole = self.whole.iter().filter(|&&w| w).count();
        whole as f64 + (self.whole.len() - whole) as f64 * self.tail.cost_fraction()
    }

    /// The compute end (ns from the clock start): the end of the last launch, 0 when none.
    /// Valid once [`Next::Done`] was returned.
    pub fn end_ns(&self) -> u64 {
        self.ends_ns.last().copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bucket::BucketEstimator;
    use crate::policy::{CheckMode, LatencyEstimator, Threshold};
    use std::time::Duration;

    fn deadline(th: u64, check: CheckMode) -> DeadlineConfig {
        DeadlineConfig {
            threshold: Threshold::Fixed(Duration::from_nanos(th)),
            check,
            warmup_steps: 0,
            min_micro_batches: 1,
        }
    }

    /// Drives `walk` with per-micro-batch latencies `lat` (a tail costs `cost` of its
    /// micro-batch's): returns the launches and the waits in order.
    fn drive<E: WalkEstimator>(walk: &mut RankWalk, est: &mut E, lat: &[u64], cost: f64) -> (Vec<Launch>, Vec<usize>) {
        let (mut launches, mut waits, mut ends, mut acc) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
        loop {
            match walk.next(est) {
                Next::Launch(l) => {
                    let d = lat[l.micro_batch as usize];
                    let d = if l.whole { d } else { (d as f64 * cost) as u64 };
                    acc += d;
                    ends.push((acc, d));
                    launches.push(l);
                }
                Next::Wait { upto } => {
                    waits.push(upto);
                    let from = walk.reported();
                    for (i, &(end, d)) in ends.iter().enumerate().take(upto).skip(from) {
                        assert!(walk.ended(i, end, d, est));
                    }
                }
                Next::Done(_) => return (launches, waits),
            }
        }
    }

    #[test]
    fn before_check_stops_at_the_threshold_and_reports_every_end() {
        let mut est = LatencyEstimator::default();
        let mut w = RankWalk::new(deadline(25, CheckMode::BeforeMicroBatch), 5, 4, TailShape::default(), 0);
        let (l, waits) = drive(&mut w, &mut est, &[10, 10, 10, 10], 1.0);
        // Ends 10, 20, 30: the check before launch 3 sees 30 >= 25.
        assert_eq!(l.len(), 3);
        assert_eq!(waits, vec![0, 1, 2, 3]);
        assert_eq!((w.parts(), w.end_ns(), est.len()), (3, 30, 3));
        assert!(matches!(w.next(&mut est), Next::Done(WalkEnd::Deadline(StopReason::ThresholdReached { .. }))));
    }

    #[test]
    fn sync_lag_sees_older_ends_and_the_pipeline_fills_without_a_wait() {
        let mut est = LatencyEstimator::default();
        let mut w = RankWalk::new(deadline(25, CheckMode::BeforeMicroBatch), 5, 6, TailShape::default(), 1);
        let (l, waits) = drive(&mut w, &mut est, &[10; 6], 1.0);
        // Lag 1: launch 0 without a wait, launch 1 after the clock, launch i after end i-2:
        // before launch 4 it sees the end of launch 2 (30): stop with 4 launched.
        assert_eq!(l.len(), 4);
        assert_eq!(waits, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_tail_part_follows_a_predicted_overshoot_and_runs_out_the_assignment() {
        let mut est = LatencyEstimator::new(32, 0.9);
        est.observe(10);
        let mut w = RankWalk::new(deadline(35, CheckMode::Predictive), 5, 8, TailShape::split(2), 0);
        let (l, _) = drive(&mut w, &mut est, &[10; 4], 0.5);
        // 3 whole (30), the 4th predicted to end at 40: one tail (35), the next tail at 40: stop.
        assert_eq!(
            l.iter().map(|x| (x.whole, x.parts, x.micro_batch)).collect::<Vec<_>>(),
            vec![(true, 2, 0), (true, 2, 1), (true, 2, 2), (false, 1, 3)]
        );
        assert_eq!((w.parts(), w.end_ns()), (7, 35));
        assert_eq!(w.equivalents(), 3.5);
        // An odd assignment without a deadline ends in a tail part.
        let off = DeadlineConfig::default();
        let mut w = RankWalk::new(off, 0, 5, TailShape::split(2), 0);
        let (l, _) = drive(&mut w, &mut est, &[10; 3], 0.5);
        assert_eq!(l.iter().map(|x| x.parts).collect::<Vec<_>>(), vec![2, 2, 1]);
        assert!(matches!(w.next(&mut est), Next::Done(WalkEnd::Assignment)));
    }

    /// `peek` before each launch runs answers what `next` then does, for every sync lag >= 1,
    /// both checks and an assignment run out; with lag 0 it asks for the launch's own end.
    #[test]
    fn peek_tells_the_last_launch_before_it_runs() {
        for (lag, check, cap) in [
            (1, CheckMode::BeforeMicroBatch, 8),
            (2, CheckMode::BeforeMicroBatch, 8),
            (1, CheckMode::Predictive, 8),
            (1, CheckMode::BeforeMicroBatch, 2),
            (3, CheckMode::Predictive, 3),
        ] {
            let mut est = LatencyEstimator::new(8, 0.9);
            est.observe(10);
            let mut w = RankWalk::new(deadline(45, check), 5, cap, TailShape::default(), lag);
            let (mut ends, mut acc, mut peeks) = (Vec::new(), 0u64, Vec::new());
            loop {
                match w.next(&mut est) {
                    Next::Launch(l) => {
                        let mut asked = 0;
                        let p = loop {
                            asked += 1;
                            assert!(asked < 10, "lag {lag}: the peek keeps asking");
                            match w.peek(&est) {
                                Peek::Wait { upto: 0 } => w.clock_at(0),
                                Peek::Wait { upto } => {
                                    assert!(upto <= l.index, "lag {lag}: the peek needs launch {l:?}'s own end");
                                    for (i, &e) in ends.iter().enumerate().take(upto).skip(w.reported()) {
                                        assert!(w.ended(i, e, 10, &mut est));
                                    }
                                }
                                p => break p,
                            }
                        };
                        peeks.push(p);
                        acc += 10;
                        ends.push(acc);
                    }
                    Next::Wait { upto } => {
                        for (i, &e) in ends.iter().enumerate().take(upto).skip(w.reported()) {
                            assert!(w.ended(i, e, 10, &mut est));
                        }
                    }
                    Next::Done(_) => break,
                }
            }
            let n = peeks.len();
            assert!(n >= 1 && n <= cap);
            assert_eq!(peeks[..n - 1], vec![Peek::Again; n - 1], "lag {lag} {check:?} cap {cap}");
            assert_eq!(peeks[n - 1], Peek::Last, "lag {lag} {check:?} cap {cap}");
        }
        // Lag 0: the decision after launch 0 needs launch 0's end.
        let mut est = LatencyEstimator::default();
        let mut w = RankWalk::new(deadline(45, CheckMode::BeforeMicroBatch), 5, 4, TailShape::default(), 0);
        assert_eq!(w.next(&mut est), Next::Wait { upto: 0 });
        assert!(matches!(w.next(&mut est), Next::Launch(_)));
        assert_eq!(w.peek(&est), Peek::Wait { upto: 1 });
    }

    /// Time already elapsed at the first check (a host-clocked driver) counts.
    #[test]
    fn the_clock_reading_at_the_first_check_counts() {
        let mut est = LatencyEstimator::default();
        let mut d = deadline(25, CheckMode::BeforeMicroBatch);
        d.min_micro_batches = 0;
        let mut w = RankWalk::new(d, 5, 4, TailShape::default(), 0);
        assert_eq!(w.next(&mut est), Next::Wait { upto: 0 });
        w.clock_at(30);
        assert!(matches!(w.next(&mut est), Next::Done(WalkEnd::Deadline(StopReason::ThresholdReached { .. }))));
        assert_eq!((w.launches(), w.end_ns()), (0, 0));
        // Below the threshold it starts; with min_micro_batches 1 the first starts whatever.
        let mut w = RankWalk::new(d, 5, 4, TailShape::default(), 0);
        let _ = w.next(&mut est);
        w.clock_at(10);
        assert!(matches!(w.next(&mut est), Next::Launch(_)));
        let mut w = RankWalk::new(deadline(25, CheckMode::BeforeMicroBatch), 5, 4, TailShape::default(), 0);
        let _ = w.next(&mut est);
        w.clock_at(30);
        assert!(matches!(w.next(&mut est), Next::Launch(_)));
    }

    #[test]
    fn out_of_order_reports_are_ignored_and_asked_again() {
        let mut est = LatencyEstimator::default();
        let mut w = RankWalk::new(deadline(25, CheckMode::BeforeMicroBatch), 5, 2, TailShape::default(), 0);
        assert_eq!(w.next(&mut est), Next::Wait { upto: 0 });
        assert!(matches!(w.next(&mut est), Next::Launch(_)));
        assert_eq!(w.next(&mut est), Next::Wait { upto: 1 });
        assert!(!w.ended(1, 10, 10, &mut est), "not launched");
        assert_eq!(w.next(&mut est), Next::Wait { upto: 1 }, "asked again");
        assert!(w.ended(0, 10, 10, &mut est));
        assert!(!w.ended(0, 10, 10, &mut est), "twice");
        assert_eq!(est.len(), 1);
    }

    /// The bucket-aware check: with a long bucket's estimate overshooting the deadline it is
    /// not started, while a short one (whose own estimate fits) is; the blind estimate (the
    /// rank-wide 0.9 quantile, a long micro-batch's) would stop the short one too.
    #[test]
    fn a_long_bucket_is_not_started_when_it_overshoots_while_a_short_one_is() {
        // Learned: bucket 0 (short) 10 ns, bucket 1 (long) 40 ns.
        let mut est = BucketEstimator::new(32, 0.9);
        for _ in 0..4 {
            est.observe_for(Some(0), 10);
        }
        for _ in 0..4 {
            est.observe_for(Some(1), 40);
        }
        let d = deadline(55, CheckMode::Predictive);
        // Assignment: short, short, long, short. Elapsed 20 after two shorts: the long one
        // (20 + 40 > 55) is not started; the walk stops there (the stream's order is kept).
        let lat = [10, 10, 40, 10];
        let mut w = RankWalk::new(d, 5, 4, TailShape::default(), 0);
        w.set_buckets(&[0, 0, 1, 0]);
        let (l, _) = drive(&mut w, &mut est.clone(), &lat, 1.0);
        assert_eq!(l.len(), 2, "the long bucket predicted to end at 60 > 55");
        // Long first, then shorts: 40, then a short (50 <= 55) is started, the next (60) not.
        let mut w = RankWalk::new(d, 5, 4, TailShape::default(), 0);
        w.set_buckets(&[1, 0, 0, 0]);
        let (l, _) = drive(&mut w, &mut est.clone(), &[40, 10, 10, 10], 1.0);
        assert_eq!(l.len(), 2, "the short one fits after the long one");
        assert_eq!(w.end_ns(), 50);
        // Blind (no buckets told): the rank-wide q 0.9 of 4 x 10 and 4 x 40 is 40: 40 + 40 > 55
        // stops the short micro-batch the bucket estimate started.
        let mut w = RankWalk::new(d, 5, 4, TailShape::default(), 0);
        let (l, _) = drive(&mut w, &mut est.clone(), &[40, 10, 10, 10], 1.0);
        assert_eq!(l.len(), 1, "blind: the long estimate stops the short micro-batch");
        // The same walk driven with the blind LatencyEstimator decides alike.
        let mut blind = est.blind().clone();
        let mut w = RankWalk::new(d, 5, 4, TailShape::default(), 0);
        w.set_buckets(&[1, 0, 0, 0]);
        let (l, _) = drive(&mut w, &mut blind, &[40, 10, 10, 10], 1.0);
        assert_eq!(l.len(), 1, "a LatencyEstimator ignores the buckets");
    }

    /// A bucket not measured yet is estimated blind (today's fallback); its whole micro-batch's
    /// latency is then fed under its bucket, a tail part's is not.
    #[test]
    fn an_unmeasured_bucket_falls_back_and_is_learned_from_its_whole_micro_batches() {
        let mut est = BucketEstimator::new(32, 1.0);
        est.observe_for(Some(0), 10);
        // Bucket 2 never seen (its estimate would be the blind 10); the first micro-batch
        // always starts, and is measured at 30 under bucket 2.
        let mut w = RankWalk::new(deadline(35, CheckMode::Predictive), 5, 8, TailShape::split(2), 0);
        w.set_buckets(&[2, 2, 0, 0]);
        let (l, _) = drive(&mut w, &mut est, &[30, 30, 10, 10], 0.5);
        // Launch 0 (whole, bucket 2): 30. Before launch 1 the bucket's estimate is 30: 60 > 35,
        // a tail part (15 ns: 45 > 35) does not fit either: stop.
        assert_eq!(l.len(), 1);
        assert_eq!(est.bucket_estimate(2), Some(30));
        assert_eq!(est.blind().len(), 2);
        // Buckets 2, 0 at deadline 25: the whole bucket-2 micro-batch (20, fed: blind 3 values);
        // bucket 0's estimate 10: 20 + 10 > 25, its tail part (5) fits and runs (ends at 25);
        // the tail part is fed to no estimator.
        let mut w = RankWalk::new(deadline(25, CheckMode::Predictive), 5, 4, TailShape::split(2), 0);
        w.set_buckets(&[2, 0]);
        let (l, _) = drive(&mut w, &mut est, &[20, 10], 0.5);
        assert_eq!(l.iter().map(|x| (x.whole, x.micro_batch)).collect::<Vec<_>>(), vec![(true, 0), (false, 1)]);
        assert_eq!(w.end_ns(), 25);
        assert_eq!(est.blind().len(), 3, "the tail part feeds no estimator");
        assert_eq!(est.bucket_estimate(0), Some(10));
        assert_eq!(est.bucket_estimate(2), Some(30), "q 1.0 of 30 and 20");
        // A restart forgets the buckets.
        w.restart(6, 4);
        assert_eq!(w.bucket(0), None);
    }
}
