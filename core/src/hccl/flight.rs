//! The flight recorder: the last K collectives of a communicator (the PyTorch NCCL Flight
//! Recorder idea), dumped to the log when the watchdog fires.
//!
//! Owns: [`FlightRecorder`] and [`FlightEntry`]. Must not touch: the communicator.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One recorded collective.
#[derive(Debug, Clone, PartialEq)]
pub struct FlightEntry {
    /// Sequence number on the communicator (1-based, in enqueue order).
    pub seq: u64,
    /// Operation, e.g. "all_reduce".
    pub op: &'static str,
    /// Element type name, e.g. "f32".
    pub dtype: &'static str,
    /// Element count (per rank, as passed to the C call).
    pub count: usize,
    /// Time since the communicator was created when the call was enqueued.
    pub enqueued: Duration,
    /// Time since creation when the watchdog saw it complete; `None` while pending.
    pub completed: Option<Duration>,
    /// It completed with an error (the stream's asynchronous error was set).
    pub failed: bool,
}

/// A bounded ring of the last `capacity` collectives.
#[derive(Debug)]
pub struct FlightRecorder {
    origin: Instant,
    capacity: usize,
    entries: Mutex<VecDeque<FlightEntry>>,
}

impl FlightRecorder {
    /// A recorder keeping the last `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self { origin: Instant::now(), capacity: capacity.max(1), entries: Mutex::new(VecDeque::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<FlightEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an enqueued collective.
    pub fn enqueued(&self, seq: u64, op: &'static str, dtype: &'static str, count: usize) {
        let mut e = self.lock();
        if e.len() == self.capacity {
            e.pop_front();
        }
        e.push_back(FlightEntry {
            seq,
            op,
            dtype,
            count,
            enqueued: self.origin.elapsed(),
            completed: None,
            failed: false,
        });
    }

    /// Marks collective `seq` complete (no-op if it already left the ring).
    pub fn completed(&self, seq: u64) {
        let now = self.origin.elapsed();
        if let Some(e) = self.lock().iter_mut().find(|e| e.seq == seq) {
            e.completed = Some(now);
        }
    }

    /// Marks collective `seq` as ended with an error (no-op if it already left the ring).
    pub fn failed(&self, seq: u64) {
        let now = self.origin.elapsed();
        if let Some(e) = self.lock().iter_mut().find(|e| e.seq == seq) {
            e.completed = Some(now);
            e.failed = true;
        }
    }

    /// A copy of the entries, oldest first.
    pub fn entries(&self) -> Vec<FlightEntry> {
        self.lock().iter().cloned().collect()
    }

    /// The entries as text, one line each:
    /// `seq op dtype count enqueued_ms completed_ms|FAILED at ms|PENDING`.
    pub fn dump(&self) -> String {
        self.entries()
            .iter()
            .map(|e| {
                let done = match (e.completed, e.failed) {
                    (None, _) => "PENDING".to_string(),
                    (Some(c), false) => format!("{:.3}ms", c.as_secs_f64() * 1e3),
                    (Some(c), true) => format!("FAILED at {:.3}ms", c.as_secs_f64() * 1e3),
                };
                format!(
                    "seq={} op={} dtype={} count={} enqueued={:.3}ms completed={done}",
                    e.seq,
                    e.op,
                    e.dtype,
                    e.count,
                    e.enqueued.as_secs_f64() * 1e3
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_k_and_marks_completion() {
        let r = FlightRecorder::new(3);
        for seq in 1..=5 {
            r.enqueued(seq, "all_reduce", "f32", seq as usize * 10);
        }
        r.completed(4);
        r.failed(5);
        r.completed(1); // already evicted: ignored
        let e = r.entries();
        assert_eq!(e.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert!(e[1].completed.is_some() && e[0].completed.is_none() && e[2].completed.is_some());
        assert!(!e[1].failed && e[2].failed);
        let d = r.dump();
        assert_eq!(d.lines().count(), 3);
        assert!(d.lines().nth(2).unwrap().contains("seq=5 op=all_reduce dtype=f32 count=50"));
        assert!(d.lines().nth(2).unwrap().contains("completed=FAILED at"));
        assert!(d.lines().next().unwrap().ends_with("completed=PENDING"));
    }
}
