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
            sizes: sizes_between(4 << 10, 256 << 20), // multiples of every granule up to 1024 ranks
            iters: 5,
            warmup: 5,
            dtype: "f32".into(),
            op: BenchOp::AllReduce,
        }
    }
}

/// Powers of four from `min` to `max` bytes (4 KiB, 16 KiB, ..., 256 MiB), before the op's
/// rounding ([`plan_sizes`]); starts at 1 byte when `min` is 0.
pub fn sizes_between(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(Some(min.max(1)), |&s| s.checked_mul(4)).take_while(|&s| s <= max).collect()
}

/// Bytes of one element of `dtype` ("f32": 4, "bf16": 2), `None` for another name.
pub fn element_bytes(dtype: &str) -> Option<usize> {
    match dtype {
        "f32" => Some(4),
        "bf16" => Some(2),
        _ => None,
    }
}

impl BenchOp {
    /// The granule of the op's reported size on `n` ranks of `esz`-byte elements: one element
    /// (all_reduce, broadcast) or one element per rank (all_gather receives, reduce_scatter
    /// sends n chunks), so a size is always a multiple of it.
    pub fn unit_bytes(self, esz: usize, n: u32) -> usize {
        match self {
            Self::AllReduce | Self::Broadcast => esz,
            Self::AllGather | Self::ReduceScatter => esz * n.max(1) as usize,
        }
    }
}

/// No size of `--min-bytes..=--max-bytes` can be moved by the op on this world size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--min-bytes {min} --max-bytes {max}: no {op} size fits ({op} of {dtype} on {ranks} ranks moves multiples \
     of {unit} bytes{per_rank}); raise --max-bytes to at least {at_least}"
)]
pub struct NoSizeFits {
    /// `--min-bytes`.
    pub min: usize,
    /// `--max-bytes`.
    pub max: usize,
    /// The collective's name.
    pub op: &'static str,
    /// Element type.
    pub dtype: String,
    /// World size.
    pub ranks: u32,
    /// The op's granule ([`BenchOp::unit_bytes`]), bytes.
    pub unit: usize,
    /// ", one element per rank" for the ops whose granule grows with the world size.
    pub per_rank: &'static str,
    /// The smallest `--max-bytes` that gives a row with this `--min-bytes`.
    pub at_least: usize,
}

/// The one size rule of every op of `bench allreduce`: each power-of-four size of
/// `min..=max` ([`sizes_between`]) rounded down to a multiple of the op's granule
/// ([`BenchOp::unit_bytes`]), or, where that falls below `min`, the smallest multiple at
/// least `min` if it is within `max`; duplicates merged. Every row lies within
/// `--min-bytes..=--max-bytes` (reduce_scatter on 3 ranks reported a 12-byte row for
/// `--max-bytes 7` while all_reduce rounded down).
///
/// # Errors
/// [`NoSizeFits`] naming both flags, the op, the granule and the smallest `--max-bytes` that
/// gives a row; an unknown `dtype` counts as f32 here (it is refused by the flag parser).
pub fn plan_sizes(min: usize, max: usize, op: BenchOp, dtype: &str, n: u32) -> Result<Vec<usize>, NoSizeFits> {
    let unit = op.unit_bytes(element_bytes(dtype).unwrap_or(4), n);
    // The smallest size the op can move within the flags.
    let least = min.max(1).div_ceil(unit) * unit;
    let mut sizes: Vec<usize> = sizes_between(min, max)
        .into_iter()
        .filter_map(|s| {
            let down = s / unit * unit;
            if down >= least { Some(down) } else { (least <= max).then_some(least) }
        })
        .collect();
    sizes.dedup();
    if sizes.is_empty() {
        return Err(NoSizeFits {
            min,
            max,
            op: op.name(),
            dtype: dtype.to_owned(),
            ranks: n,
            unit,
            per_rank: if unit == element_bytes(dtype).unwrap_or(4) { "" } else { ", one element per rank" },
            at_least: least,
        });
    }
    Ok(sizes)
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

impl AllreduceReport {
    /// The table's heading lines (op, world size, mode; the column names), each ending in a
    /// newline: printed before the first row is measured.
    pub fn header(op: BenchOp, ranks: u32, mode: &str) -> String {
        let sum = if matches!(op, BenchOp::AllReduce | BenchOp::ReduceScatter) { " sum" } else { "" };
        let mut h = format!("# {}{sum}, {ranks} ranks, {mode}\n", op.name());
        h += &format!(
            "#{:>11} {:>12} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}\n",
            "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""
        );
        h += &format!(
            "#{:>11} {:>12} {:>6} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}\n",
            "size(B)", "count", "type", "time(us)", "algbw", "busbw", "#wrong", "time(us)", "algbw", "busbw", "#wrong"
        );
        h
    }

    /// One row's line, ending in a newline: printed as soon as the row is measured.
    pub fn row_line(r: &AllreduceRow) -> String {
        let p = &r.out_of_place;
        let mut line = format!(
            "{:>12} {:>12} {:>6} | {:>10.1} {:>8.3} {:>8.3} {:>6}",
            r.bytes, r.count, r.dtype, p.time_us, p.algbw_gbps, p.busbw_gbps, p.wrong
        );
        line += &match &r.in_place {
            Some(p) => format!(" | {:>10.1} {:>8.3} {:>8.3} {:>6}\n", p.time_us, p.algbw_gbps, p.busbw_gbps, p.wrong),
            None => format!(" | {:>10} {:>8} {:>8} {:>6}\n", "n/a", "n/a", "n/a", "n/a"),
        };
        line
    }

    /// The footer (wrong elements, average busbw), without a final newline.
    pub fn footer(&self) -> String {
        format!(
            "# Out of bounds values : {} {}\n# Avg bus bandwidth    : {:.3}",
            self.wrong(),
            if self.wrong() == 0 { "OK" } else { "WRONG" },
            self.avg_busbw()
        )
    }
}

impl std::fmt::Display for AllreduceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&Self::header(self.op, self.ranks, &self.mode))?;
        for r in &self.rows {
            f.write_str(&Self::row_line(r))?;
        }
        f.write_str(&self.footer())
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

/// Called with each row as soon as it is measured (rank 0 prints it: `bench allreduce` shows
/// progress, and an interrupted run keeps the rows it printed).
pub type OnRow<'a> = &'a mut dyn FnMut(&AllreduceRow) -> Result<(), BoxError>;

/// A measurement's error: a collective or device error ([`HcclError`] inside), or the row
/// callback's (a closed or full stdout).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn measure_typed<T: BenchElem>(
    comm: &Comm,
    stream: &Stream,
    opts: &AllreduceOptions,
    on_row: OnRow<'_>,
) -> Result<Vec<AllreduceRow>, BoxError> {
    let (n, rank) = (comm.world_size(), comm.rank());
    let nf = n as f64;
    let dev = comm.device();
    let esz = size_of::<T>();
    let iters = opts.iters.max(1);
    let mut rows = Vec::new();
    for &bytes in &opts.sizes {
        // Elements sent and received by this rank: `bytes` is a multiple of the op's granule
        // (`plan_sizes`), so nothing is rounded here and the row reports `bytes` itself.
        let c = bytes / opts.op.unit_bytes(esz, n);
        if c == 0 {
            let value = format!("{bytes} bytes (below one element)");
            return Err(HcclError::InvalidArgument { what: "size", value }.into());
        }
        let (send_n, recv_n) = match opts.op {
            BenchOp::AllReduce | BenchOp::Broadcast => (c, c),
            BenchOp::AllGather => (c, c * n as usize),
            BenchOp::ReduceScatter => (c * n as usize, c),
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
        let row = AllreduceRow {
            bytes: send_n.max(recv_n) * esz,
            count: send_n.max(recv_n),
            dtype: T::NAME.to_string(),
            out_of_place,
            in_place,
        };
        on_row(&row)?;
        rows.push(row);
    }
    Ok(rows)
}

/// Runs the measurement on one rank (every rank must call it with the same options), calling
/// `on_row` with each row as it is measured.
///
/// # Errors
/// [`HcclError::InvalidArgument`] for an unknown dtype; any collective or device error;
/// `on_row`'s error.
pub fn measure_rank(
    comm: &Comm,
    stream: &Stream,
    opts: &AllreduceOptions,
    on_row: OnRow<'_>,
) -> Result<Vec<AllreduceRow>, BoxError> {
    match opts.dtype.as_str() {
        "f32" => measure_typed::<f32>(comm, stream, opts, on_row),
        "bf16" => measure_typed::<half::bf16>(comm, stream, opts, on_row),
        other => Err(HcclError::InvalidArgument { what: "dtype", value: other.to_string() }.into()),
    }
}

/// The rank program name of `bench allreduce --launch processes` in a
/// `dropcompute::launch::ChildSpec` (its config is the [`AllreduceOptions`], its result the rows).
pub const CHILD_PROGRAM: &str = "bench-allreduce";

/// Joins the communicator as `join` says on a fresh device (any free device, or the
/// launcher's local rank under [`Join::Env`]) and measures: one rank of any launch mode.
///
/// `on_row` as in [`measure_rank`].
///
/// # Errors
/// Device acquisition, communicator init, or measurement errors; `on_row`'s.
pub fn join_and_measure(
    rt: &Arc<Runtime>,
    join: &Join,
    opts: &AllreduceOptions,
    on_row: OnRow<'_>,
) -> Result<Vec<AllreduceRow>, BoxError> {
    let dev = match join {
        Join::Env(b) => Device::acquire_for_local_rank(rt, b.local_rank)?,
        Join::UniqueId { .. } => Device::acquire_any(rt)?,
    };
    // Feasibility of the sizes before any rank joins: every rank's device holds the largest
    // size's send and receive buffers (each rank judges its own device; ranks of one device
    // type refuse alike instead of failing one allocation mid-table).
    let esz = element_bytes(&opts.dtype).unwrap_or(4);
    let n = join.world_size();
    let need = opts.sizes.iter().map(|&b| {
        let c = b / opts.op.unit_bytes(esz, n);
        let per_rank = match opts.op {
            BenchOp::AllReduce | BenchOp::Broadcast => 2 * c,
            BenchOp::AllGather | BenchOp::ReduceScatter => c * (n as usize + 1),
        };
        (per_rank * esz) as u64
    });
    if let Some(need) = need.max() {
        let (free, _) = dev.memory_info()?;
        if need > free {
            return Err(dropcompute::launch::Infeasible::TooLittleMemory {
                what: format!(
                    "the largest size ({} bytes of {} on {n} ranks)",
                    opts.sizes.last().copied().unwrap_or(0),
                    opts.op.name()
                ),
                need,
                free,
                flag: "--max-bytes",
            }
            .into());
        }
    }
    let stream = Stream::new(&dev)?;
    let comm = join.comm(&dev, CommOptions::default())?;
    let rows = measure_rank(&comm, &stream, opts, on_row)?;
    comm.destroy().map_err(|b| b.0)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One size rule for every op: rows within the flags, rounded down to the op's granule,
    /// refused naming both flags when none fits.
    #[test]
    fn every_op_rounds_down_within_the_flags() {
        let ops = [BenchOp::AllReduce, BenchOp::AllGather, BenchOp::ReduceScatter, BenchOp::Broadcast];
        // (min, max, dtype, ranks, op) -> sizes or None (refused)
        type Row = (usize, usize, &'static str, u32, BenchOp, Option<&'static [usize]>);
        let table: &[Row] = &[
            (1, 7, "f32", 3, BenchOp::AllReduce, Some(&[4])),
            (1, 7, "f32", 3, BenchOp::Broadcast, Some(&[4])),
            (1, 7, "f32", 3, BenchOp::ReduceScatter, None),
            (1, 7, "f32", 3, BenchOp::AllGather, None),
            (1, 12, "f32", 3, BenchOp::ReduceScatter, Some(&[12])),
            (1, 64, "f32", 3, BenchOp::AllGather, Some(&[12, 60])),
            (1, 1, "f32", 1, BenchOp::AllReduce, None),
            (2, 3, "bf16", 1, BenchOp::AllReduce, Some(&[2])),
            (5, 7, "f32", 2, BenchOp::AllReduce, None),
            (4096, 4096, "f32", 3, BenchOp::ReduceScatter, None),
            (4096, 16384, "f32", 3, BenchOp::ReduceScatter, Some(&[4104, 16380])),
            (4096, 16384, "f32", 4, BenchOp::ReduceScatter, Some(&[4096, 16384])),
        ];
        for &(min, max, dtype, n, op, want) in table {
            let got = plan_sizes(min, max, op, dtype, n);
            match want {
                Some(w) => assert_eq!(got.as_deref(), Ok(w), "{min}..={max} {dtype} {n} {op:?}"),
                None => {
                    let e = got.expect_err("refused").to_string();
                    assert!(e.contains("--min-bytes") && e.contains("--max-bytes") && e.contains(op.name()), "{e}");
                }
            }
        }
        for op in ops {
            for n in 1..=9 {
                for max in 1..=200 {
                    for min in [1, 3, 5, 12, 13] {
                        match plan_sizes(min, max, op, "f32", n) {
                            Ok(sizes) => {
                                for size in sizes {
                                    assert!(
                                        (min..=max).contains(&size) && size % op.unit_bytes(4, n) == 0,
                                        "{op:?} {n} {min}..={max}: {size}"
                                    );
                                }
                            }
                            // The message's advice works.
                            Err(e) => assert!(
                                e.at_least > max && plan_sizes(min, e.at_least, op, "f32", n).is_ok(),
                                "{op:?} {n} {min}..={max}: {e}"
                            ),
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn sizes_are_powers_of_four_in_range() {
        let s = sizes_between(4 << 10, 256 << 20);
        assert_eq!(s.first(), Some(&4096));
        assert_eq!(s.last(), Some(&(256 << 20)));
        assert_eq!(s.len(), 9);
        assert!(s.windows(2).all(|w| w[1] == 4 * w[0]));
    }
}
