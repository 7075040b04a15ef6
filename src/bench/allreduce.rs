//! All-reduce bandwidth, reported like hccl_demo / nccl-tests: size, count, dtype, time, algbw,
//! busbw, where algbw = bytes / time and busbw = algbw · 2(n−1)/n (the nccl-tests definition:
//! the bandwidth each link sustains in a ring all-reduce).
//!
//! Owns: the per-rank measurement loop ([`measure_rank`]), one rank of any launch mode
//! ([`join_and_measure`]), the thread driver ([`run_threads`]) and the report. Must not touch:
//! starting ranks (`crate::launch` does, for threads, processes and launcher ranks alike).

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::hccl::{Comm, CommOptions, HcclError, HcclType, ReduceOp};
use crate::launch::{self, Join};
use crate::synapse::{Device, DeviceBuffer, Runtime, Stream};

/// What to measure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllreduceOptions {
    /// Message sizes in bytes (per rank), ascending.
    pub sizes: Vec<usize>,
    /// Timed iterations per size (the mean is reported).
    pub iters: usize,
    /// Untimed iterations per size before timing.
    pub warmup: usize,
    /// Element type: "f32" or "bf16".
    pub dtype: String,
}

impl Default for AllreduceOptions {
    fn default() -> Self {
        Self { sizes: sizes_between(4 << 10, 256 << 20), iters: 5, warmup: 1, dtype: "f32".into() }
    }
}

/// Powers of four from `min` to `max` bytes (4 KiB, 16 KiB, ..., 256 MiB).
pub fn sizes_between(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(Some(min.max(4)), |&s| s.checked_mul(4)).take_while(|&s| s <= max).collect()
}

/// One measured size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllreduceRow {
    /// Bytes per rank.
    pub bytes: usize,
    /// Elements per rank.
    pub count: usize,
    /// Element type name.
    pub dtype: String,
    /// Mean time of one all-reduce, µs.
    pub time_us: f64,
    /// bytes / time, GB/s (1e9 B/s).
    pub algbw_gbps: f64,
    /// algbw · 2(n−1)/n, GB/s.
    pub busbw_gbps: f64,
}

/// A measured table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllreduceReport {
    /// "threads" or "processes" (or the launcher).
    pub mode: String,
    /// World size.
    pub ranks: u32,
    /// Rows, one per size.
    pub rows: Vec<AllreduceRow>,
}

impl AllreduceReport {
    /// busbw of the row with exactly `bytes`, if measured.
    pub fn busbw_at(&self, bytes: usize) -> Option<f64> {
        self.rows.iter().find(|r| r.bytes == bytes).map(|r| r.busbw_gbps)
    }
}

impl std::fmt::Display for AllreduceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "# all_reduce sum, {} ranks, {}", self.ranks, self.mode)?;
        writeln!(
            f,
            "{:>12} {:>12} {:>6} {:>12} {:>10} {:>10}",
            "size(B)", "count", "type", "time(us)", "algbw", "busbw"
        )?;
        writeln!(f, "{:>12} {:>12} {:>6} {:>12} {:>10} {:>10}", "", "(elements)", "", "", "(GB/s)", "(GB/s)")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>12} {:>12} {:>6} {:>12.1} {:>10.3} {:>10.3}",
                r.bytes, r.count, r.dtype, r.time_us, r.algbw_gbps, r.busbw_gbps
            )?;
        }
        Ok(())
    }
}

fn measure_typed<T: HcclType>(
    comm: &Comm,
    stream: &Stream,
    opts: &AllreduceOptions,
) -> Result<Vec<AllreduceRow>, HcclError> {
    let n = comm.world_size() as f64;
    let dev = comm.device();
    let mut rows = Vec::new();
    for &bytes in &opts.sizes {
        let count = (bytes / size_of::<T>()).max(1);
        let send = DeviceBuffer::<T>::alloc(dev, count)?;
        let mut recv = DeviceBuffer::<T>::alloc(dev, count)?;
        for _ in 0..opts.warmup {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, stream)?;
        }
        comm.synchronize(stream)?;
        let t0 = Instant::now();
        for _ in 0..opts.iters.max(1) {
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, stream)?;
        }
        comm.synchronize(stream)?;
        let secs = t0.elapsed().as_secs_f64() / opts.iters.max(1) as f64;
        let b = (count * size_of::<T>()) as f64;
        let algbw = b / secs / 1e9;
        rows.push(AllreduceRow {
            bytes: count * size_of::<T>(),
            count,
            dtype: T::NAME.to_string(),
            time_us: secs * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * 2.0 * (n - 1.0) / n,
        });
    }
    Ok(rows)
}

/// Runs the measurement on one rank (every rank must call it with the same options).
///
/// # Errors
/// [`HcclError::InvalidArgument`] for an unknown dtype; any collective or device error.
pub fn measure_rank(comm: &Comm, stream: &Stream, opts: &AllreduceOptions) -> Result<Vec<AllreduceRow>, HcclError> {
    match opts.dtype.as_str() {
        "f32" => measure_typed::<f32>(comm, stream, opts),
        "bf16" => measure_typed::<half::bf16>(comm, stream, opts),
        other => Err(HcclError::InvalidArgument { what: "dtype", value: other.to_string() }),
    }
}

/// The rank program name of `bench allreduce --launch processes` in a
/// `crate::launch::ChildSpec` (its config is the [`AllreduceOptions`], its result the rows).
pub const CHILD_PROGRAM: &str = "bench-allreduce";

/// Joins the communicator as `join` says on a fresh device (any free device, or the
/// launcher's local rank under [`Join::Env`]) and measures: one rank of any launch mode.
///
/// # Errors
/// Device acquisition, communicator init, or measurement errors.
pub fn join_and_measure(
    rt: &Arc<Runtime>,
    join: &Join,
    opts: &AllreduceOptions,
) -> Result<Vec<AllreduceRow>, HcclError> {
    let dev = match join {
        Join::Env(b) => Device::acquire_for_local_rank(rt, b.local_rank)?,
        Join::UniqueId { .. } => Device::acquire_any(rt)?,
    };
    let stream = Stream::new(&dev)?;
    let comm = join.comm(&dev, CommOptions::default())?;
    let rows = measure_rank(&comm, &stream, opts)?;
    comm.destroy().map_err(|b| b.0)?;
    Ok(rows)
}

/// Measures with `ranks` threads in this process (`crate::launch::threads`), each on its own
/// device of `rt`.
///
/// # Errors
/// The first rank's error (a panicked rank thread: [`HcclError::InvalidArgument`] naming it).
pub fn run_threads(rt: &Arc<Runtime>, ranks: u32, opts: &AllreduceOptions) -> Result<AllreduceReport, HcclError> {
    let id = Comm::unique_id(rt)?;
    let results =
        launch::threads(ranks, |rank| join_and_measure(rt, &Join::UniqueId { id, rank, world_size: ranks }, opts));
    let mut rows = None;
    for r in results {
        let r = r.map_err(|e| HcclError::InvalidArgument { what: "rank thread", value: e.to_string() })??;
        rows.get_or_insert(r);
    }
    Ok(AllreduceReport { mode: "threads".into(), ranks, rows: rows.unwrap_or_default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_four_in_range() {
        let s = sizes_between(4 << 10, 256 << 20);
        assert_eq!(s.first(), Some(&4096));
        assert_eq!(s.last(), Some(&(256 << 20)));
        assert_eq!(s.len(), 9);
        assert!(s.windows(2).all(|w| w[1] == 4 * w[0]));
    }
}
