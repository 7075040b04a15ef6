//! Collective bandwidth, reported in the nccl-tests shape: per size, out-of-place and in-place
//! columns of time, algbw, busbw and #wrong (elements that differ from an f64 reference),
//! warm-up iterations before timing, and the average busbw footer. algbw = size / time and
//! busbw = algbw · factor, with size and factor per collective as nccl-tests defines them
//! (`PERFORMANCE.md`: all_reduce 2(n−1)/n, all_gather and reduce_scatter (n−1)/n, broadcast 1).
//!
//! Owns: the per-rank measurement loop ([`measure_rank`]), one rank of any launch mode
//! ([`join_and_measure`]), the thread driver ([`run_threads`]) and the report. Must not touch:
//! starting ranks (`dropcompute::launch` does, for threads, processes and launcher ranks alike).

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use dropcompute::hccl::{Comm, CommOptions, HcclError, HcclType, ReduceOp};
use dropcompute::launch::Join;
use dropcompute::synapse::{Device, DeviceBuffer, HostBuffer, Runtime, Stream};

/// Which collective `bench allreduce --op` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[value(rename_all = "snake_case")]
pub enum BenchOp {
    /// hcclAllReduce (sum): size = bytes per rank, busbw = algbw · 2(n−1)/n.
    #[default]
    AllReduce,
    /// hcclAllGather: size = bytes received per rank (n × sent), busbw = algbw · (n−1)/n.
    AllGather,
    /// hcclReduceScatter (sum): size = bytes sent per rank (n × received), busbw = algbw ·
    /// (n−1)/n.
    ReduceScatter,
    /// hcclBroadcast from rank 0: size = bytes per rank, busbw = algbw.
    Broadcast,
}

impl BenchOp {
    /// The nccl-tests name (`all_reduce`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::Broadcast => "broadcast",
        }
    }

    /// busbw / algbw on `n` ranks (nccl-tests `PERFORMANCE.md`).
    pub fn bus_factor(self, n: f64) -> f64 {
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::AllGather | Self::ReduceScatter => (n - 1.0) / n,
            Self::Broadcast => 1.0,
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllreduceOptions {
    /// Message sizes in bytes (nccl-tests "size": see [`BenchOp`]), ascending.
    pub sizes: Vec<usize>,
    /// Timed iterations per size and placement (the mean is reported).
    pub iters: usize,
    /// Untimed iterations per size and placement before timing.
    pub warmup: usize,
    /// Element type: "f32" or "bf16".
    pub dtype: String,
    /// The collective.
    #[serde(default)]
    pub op: BenchOp,
}

impl Default for AllreduceOptions {
    fn default() -> Self {
        Self {
            sizes: sizes_between(4 << 10, 256 << 20),
            iters: 5,
            warmup: 5,
            dtype: "f32".into(),
            op: BenchOp::AllReduce,
        }
    }
}

/// Powers of four from `min` to `max` bytes (4 KiB, 16 KiB, ..., 256 MiB).
pub fn sizes_between(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(Some(min.max(4)), |&s| s.checked_mul(4)).take_while(|&s| s <= max).collect()
}

/// One placement (out-of-place or in-place) of one size: time, bandwidths, wrong elements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// Mean time of one collective, µs.
    pub time_us: f64,
    /// size / time, GB/s (1e9 B/s).
    pub algbw_gbps: f64,
    /// algbw · [`BenchOp::bus_factor`], GB/s.
    pub busbw_gbps: f64,
    /// Elements of this rank's result that differ from the f64 reference rounded once to the
    /// element type (inputs are small integers, so the exact result is known).
    pub wrong: u64,
}

/// One measured size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllreduceRow {
    /// Size in bytes (see [`BenchOp`]).
    pub bytes: usize,
    /// Elements per rank (of the larger buffer, as nccl-tests).
    pub count: usize,
    /// Element type name.
    pub dtype: String,
    /// Separate send and receive buffers.
    pub out_of_place: Placement,
    /// One buffer (all_reduce only: the safe API has no in-place form of the others).
    pub in_place: Option<Placement>,
}

/// A measured table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllreduceReport {
    /// "threads" or "processes" (or the launcher).
    pub mode: String,
    /// World size.
    pub ranks: u32,
    /// The collective.
    #[serde(default)]
    pub op: BenchOp,
    /// Rows, one per size.
    pub rows: Vec<AllreduceRow>,
}

impl AllreduceReport {
    /// Out-of-place busbw of the row with exactly `bytes`, if measured.
    pub fn busbw_at(&self, bytes: usize) -> Option<f64> {
        self.rows.iter().find(|r| r.bytes == bytes).map(|r| r.out_of_place.busbw_gbps)
    }

    /// Mean busbw over every row and placement (the nccl-tests footer), GB/s.
    pub fn avg_busbw(&self) -> f64 {
        let all: Vec<f64> = self
            .rows
            .iter()
            .flat_map(|r| std::iter::once(r.out_of_place.busbw_gbps).chain(r.in_place.as_ref().map(|p| p.busbw_gbps)))
            .collect();
        if all.is_empty() { 0.0 } else { all.iter().sum::<f64>() / all.len() as f64 }
    }

    /// Wrong elements over every row and placement.
    pub fn wrong(&self) -> u64 {
        self.rows.iter().map(|r| r.out_of_place.wrong + r.in_place.as_ref().map_or(0, |p| p.wrong)).sum()
    }
}

impl std::fmt::Display for AllreduceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sum = if matches!(self.op, BenchOp::AllReduce | BenchOp::ReduceScatter) { " sum" } else { "" };
        writeln!(f, "# {}{sum}, {} ranks, {}", self.op.name(), self.ranks, self.mode)?;
        writeln!(
            f,
            "#{:>11} {:>12} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
            "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""
        )?;
        writeln!(
            f,
            "#{:>11} {:>12} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
            "size(B)", "count", "type", "time(us)", "algbw", "busbw", "#wrong", "time(us)", "algbw", "busbw", "#wrong"
        )?;
        for r in &self.rows {
            let p = &r.out_of_place;
            write!(
                f,
                "{:>12} {:>12} {:>6} | {:>10.1} {:>8.3} {:>8.3} {:>6}",
                r.bytes, r.count, r.dtype, p.time_us, p.algbw_gbps, p.busbw_gbps, p.wrong
            )?;
            match &r.in_place {
                Some(p) => {
                    writeln!(f, " | {:>10.1} {:>8.3} {:>8.3} {:>6}", p.time_us, p.algbw_gbps, p.busbw_gbps, p.wrong)?
                }
                None => writeln!(f, " | {:>10} {:>8} {:>8} {:>6}", "n/a", "n/a", "n/a", "n/a")?,
            }
        }
        writeln!(f, "# Out of bounds values : {} {}", self.wrong(), if self.wrong() == 0 { "OK" } else { "WRONG" })?;
        write!(f, "# Avg bus bandwidth    : {:.3}", self.avg_busbw())
    }
}

/// An element type the benchmark fills and checks.
trait BenchElem: HcclType + Copy + PartialEq {
    fn from_f64(v: f64) -> Self;
}

impl BenchElem for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl BenchElem for half::bf16 {
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
}

/// Rank `r`'s input element `i`: a small integer (1..=13), so f32 sums of up to 2^20 ranks are
/// exact and the f64 reference is the exact result.
fn input_value(r: u32, i: usize) -> f64 {
    ((r as usize + i) % 13 + 1) as f64
}

/// Times `iters` calls of `op` after `warmup` untimed ones; seconds per call.
fn time_it(
    comm: &Comm,
    stream: &Stream,
    warmup: usize,
    iters: usize,
    mut op: impl FnMut() -> Result<u64, HcclError>,
) -> Result<f64, HcclError> {
    for _ in 0..warmup {
        op()?;
    }
    comm.synchronize(stream)?;
    let t0 = Instant::now();
    for _ in 0..iters {
        op()?;
    }
    comm.synchronize(stream)?;
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

fn upload<T: BenchElem>(stream: &Stream, data: &[T], dst: &mut DeviceBuffer<T>) -> Result<(), HcclError> {
    let h = HostBuffer::from_slice(stream.device(), data)?;
    stream.copy_h2d(&h, dst)?;
    Ok(())
}

fn download<T: BenchElem>(comm: &Comm, stream: &Stream, src: &DeviceBuffer<T>) -> Result<Vec<T>, HcclError> {
    comm.synchronize(stream)?;
    let mut h = HostBuffer::<T>::zeroed(stream.device(), src.len())?;
    stream.copy_d2h(src, &mut h)?;
    stream.synchronize()?;
    Ok(h.to_vec()?)
}

fn count_wrong<T: BenchElem>(got: &[T], want: &[f64]) -> u64 {
    got.iter().zip(want).filter(|(g, w)| **g != T::from_f64(**w)).count() as u64 + want.len().abs_diff(got.len()) as u64
}

fn measure_typed<T: BenchElem>(
    comm: &Comm,
    stream: &Stream,
    opts: &AllreduceOptions,
) -> Result<Vec<AllreduceRow>, HcclError> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let nf = n as f64;
    let dev = comm.device();
    let esz = size_of::<T>();
    let iters = opts.iters.max(1);
    let mut rows = Vec::new();
    for &bytes in &opts.sizes {
        // Elements sent and received by this rank.
        let (send_n, recv_n) = match opts.op {
            BenchOp::AllReduce | BenchOp::Broadcast => {
                let c = (bytes / esz).max(1);
                (c, c)
            }
            BenchOp::AllGather => {
                let c = (bytes / esz / n as usize).max(1);
                (c, c * n as usize)
            }
            BenchOp::ReduceScatter => {
                let c = (bytes / esz / n as usize).max(1);
                (c * n as usize, c)
            }
        };
        let input: Vec<f64> = (0..send_n).map(|i| input_value(rank, i)).collect();
        let want: Vec<f64> = match opts.op {
            BenchOp::AllReduce => (0..recv_n).map(|i| (0..n).map(|r| input_value(r, i)).sum()).collect(),
            BenchOp::AllGather => (0..recv_n).map(|j| input_value((j / send_n) as u32, j % send_n)).collect(),
            BenchOp::ReduceScatter => {
                (0..recv_n).map(|i| (0..n).map(|r| input_value(r, rank as usize * recv_n + i)).sum()).collect()
            }
            BenchOp::Broadcast => (0..recv_n).map(|i| input_value(0, i)).collect(),
        };
        let host_in: Vec<T> = input.iter().map(|&v| T::from_f64(v)).collect();
        let mut send = DeviceBuffer::<T>::alloc(dev, send_n)?;
        let mut recv = DeviceBuffer::<T>::alloc(dev, recv_n)?;
        upload(stream, &host_in, &mut send)?;
        let secs = time_it(comm, stream, opts.warmup, iters, || match opts.op {
            BenchOp::AllReduce => comm.all_reduce(&send, &mut recv, ReduceOp::Sum, stream),
            BenchOp::AllGather => comm.all_gather(&send, &mut recv, stream),
            BenchOp::ReduceScatter => comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum, stream),
            BenchOp::Broadcast => comm.broadcast(&send, &mut recv, 0, stream),
        })?;
        let size = (send_n.max(recv_n) * esz) as f64;
        let placement = |secs: f64, wrong: u64| {
            let algbw = size / secs / 1e9;
            Placement { time_us: secs * 1e6, algbw_gbps: algbw, busbw_gbps: algbw * opts.op.bus_factor(nf), wrong }
        };
        let out_of_place = placement(secs, count_wrong(&download(comm, stream, &recv)?, &want));
        let in_place = if opts.op == BenchOp::AllReduce {
            // Repeated in-place sums grow the data: time them, then check one call on fresh input.
            let secs = time_it(comm, stream, opts.warmup, iters, || {
                comm.all_reduce_in_place(&mut send, ReduceOp::Sum, stream)
            })?;
            upload(stream, &host_in, &mut send)?;
            comm.all_reduce_in_place(&mut send, ReduceOp::Sum, stream)?;
            Some(placement(secs, count_wrong(&download(comm, stream, &send)?, &want)))
        } else {
            None
        };
        rows.push(AllreduceRow {
            bytes: send_n.max(recv_n) * esz,
            count: send_n.max(recv_n),
            dtype: T::NAME.to_string(),
            out_of_place,
            in_place,
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
/// `dropcompute::launch::ChildSpec` (its config is the [`AllreduceOptions`], its result the rows).
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
