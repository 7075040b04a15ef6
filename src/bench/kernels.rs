//! `dropcompute bench kernels`: throughput of the CPU mock device's scale-accumulate kernels
//! next to a plain memcpy of the same working set, measured in the same run.
//!
//! Owns: buffer set-up, the interleaved timing loop and the report table. Must not: change the
//! kernels or their dispatch (`habana_mock::kernels`), or run more than one thread.
//!
//! # Convention
//! *Working set* = bytes of all buffers one call touches. *Bytes moved* = bytes read + bytes
//! written by one call, counting each buffer once (no read-for-ownership or write-allocate
//! traffic): for `n` elements, f32 scale-accumulate moves 12·n (reads acc and x, writes acc),
//! bf16 scale-accumulate 6·n, bf16 → f32 scale-accumulate 10·n (reads 4·n + 2·n, writes 4·n),
//! and a memcpy of `b` bytes moves 2·b. GB/s = bytes moved / seconds / 1e9.
//!
//! Every size runs all four operations on equal working sets. Repetitions are interleaved
//! (the order rotates each repetition) so drift from other processes hits all rows alike; each
//! GB/s is the median over repetitions and each ratio is the median of the per-repetition
//! ratios kernel / memcpy.

use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};

use half::bf16;

use dropcompute::mock::kernels::{Isa, Kernels};

/// The target of the foundation issue: kernel GB/s ≥ 0.7 × memcpy GB/s beyond the LLC.
pub const TARGET_RATIO: f64 = 0.7;

/// LLC size assumed when sysfs does not report one, in bytes (32 MiB).
pub const DEFAULT_LLC_BYTES: usize = 32 << 20;

/// Scale factor `a` used by every kernel call (small, so accumulators stay finite).
const SCALE: f32 = 1.0e-3;

/// One benchmarked operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BenchOp {
    /// `dst.copy_from_slice(src)` over f32 buffers of half the working set each.
    Memcpy,
    /// `acc += a * x`, f32 acc and x.
    ScaleAccumulateF32,
    /// `acc = bf16(acc + a * x)`, bf16 acc and x.
    ScaleAccumulateBf16,
    /// `acc += a * f32(x)`, f32 acc, bf16 x.
    ScaleAccumulateBf16ToF32,
}

impl BenchOp {
    /// All operations, memcpy first.
    pub const ALL: [BenchOp; 4] =
        [BenchOp::Memcpy, BenchOp::ScaleAccumulateF32, BenchOp::ScaleAccumulateBf16, BenchOp::ScaleAccumulateBf16ToF32];

    /// Name printed in the table.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::Memcpy => "memcpy (copy_from_slice)",
            BenchOp::ScaleAccumulateF32 => "scale_accumulate f32",
            BenchOp::ScaleAccumulateBf16 => "scale_accumulate bf16",
            BenchOp::ScaleAccumulateBf16ToF32 => "scale_accumulate bf16->f32",
        }
    }

    /// (bytes of the working set per element, bytes moved per element); memcpy counts one f32
    /// element of the destination plus one of the source.
    fn bytes_per_element(self) -> (usize, usize) {
        match self {
            BenchOp::Memcpy => (8, 8),
            BenchOp::ScaleAccumulateF32 => (8, 12),
            BenchOp::ScaleAccumulateBf16 => (4, 6),
            BenchOp::ScaleAccumulateBf16ToF32 => (6, 10),
        }
    }
}

/// Options of [`run_kernel_bench`].
#[derive(Debug, Clone)]
pub struct KernelBenchOptions {
    /// Working-set sizes in bytes. Empty means [`automatic_sizes`] of the LLC size.
    pub sizes: Vec<usize>,
    /// Interleaved repetitions per size (median taken); at least 1. Default 5.
    pub reps: usize,
    /// Minimum duration of one timed measurement; short calls are repeated until it is
    /// reached. Default 20 ms.
    pub min_measure_time: Duration,
    /// LLC size in bytes; `None` reads sysfs (see [`last_level_cache`]).
    pub llc_bytes: Option<usize>,
}

impl Default for KernelBenchOptions {
    fn default() -> Self {
        KernelBenchOptions { sizes: Vec::new(), reps: 5, min_measure_time: Duration::from_millis(20), llc_bytes: None }
    }
}

/// One (size, operation) measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelBenchRow {
    /// Bytes of all buffers the call touches.
    pub working_set_bytes: usize,
    /// The operation.
    pub op: BenchOp,
    /// Bytes read + bytes written by one call.
    pub bytes_moved: usize,
    /// Median throughput over the repetitions, in GB/s (1e9 bytes per second).
    pub gb_per_s: f64,
    /// Median over repetitions of this row's GB/s divided by memcpy's GB/s in the same
    /// repetition (1.0 for the memcpy row).
    pub ratio_vs_memcpy: f64,
}

/// Result of [`run_kernel_bench`]; `Display` prints it as a table.
#[derive(Debug, Clone)]
pub struct KernelBenchReport {
    /// Instruction set of the kernels that ran.
    pub isa: Isa,
    /// Last-level cache size used to pick and judge sizes, in bytes.
    pub llc_bytes: usize,
    /// Where `llc_bytes` came from (a sysfs path, "option" or "default").
    pub llc_source: String,
    /// Repetitions per size.
    pub reps: usize,
    /// Rows grouped by size, in [`BenchOp::ALL`] order within a size.
    pub rows: Vec<KernelBenchRow>,
    /// Sizes not run and why (e.g. not enough free memory).
    pub skipped: Vec<(usize, String)>,
}

impl KernelBenchReport {
    /// Kernel rows whose working set exceeds the LLC.
    fn beyond_llc(&self) -> impl Iterator<Item = &KernelBenchRow> {
        self.rows.iter().filter(|r| r.op != BenchOp::Memcpy && r.working_set_bytes > self.llc_bytes)
    }

    /// True when at least one size beyond the LLC was measured and every kernel row there
    /// reaches [`TARGET_RATIO`] of memcpy.
    pub fn meets_target(&self) -> bool {
        self.beyond_llc().next().is_some() && self.beyond_llc().all(|r| r.ratio_vs_memcpy >= TARGET_RATIO)
    }
}

/// Formats a byte count with a binary unit, e.g. `256 MiB`.
fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 { format!("{v:.0} {}", UNITS[u]) } else { format!("{v:.1} {}", UNITS[u]) }
}

impl fmt::Display for KernelBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel bench: isa {}, LLC {} ({}), {} interleaved reps (median), 1 thread",
            self.isa,
            human_bytes(self.llc_bytes),
            self.llc_source,
            self.reps
        )?;
        writeln!(
            f,
            "GB/s = (bytes read + bytes written) / s / 1e9; ratio = kernel GB/s / memcpy GB/s \
             in the same rep"
        )?;
        writeln!(
            f,
            "{:>11}  {:<27} {:>11} {:>9} {:>16}",
            "working set", "operation", "moved/call", "GB/s", "ratio vs memcpy"
        )?;
        for r in &self.rows {
            let mark = if r.op == BenchOp::Memcpy || r.working_set_bytes <= self.llc_bytes {
                ""
            } else if r.ratio_vs_memcpy >= TARGET_RATIO {
                "  ok"
            } else {
                "  BELOW TARGET"
            };
            writeln!(
                f,
                "{:>11}  {:<27} {:>11} {:>9.2} {:>16.2}{mark}",
                human_bytes(r.working_set_bytes),
                r.op.name(),
                human_bytes(r.bytes_moved),
                r.gb_per_s,
                r.ratio_vs_memcpy
            )?;
        }
        for (size, why) in &self.skipped {
            writeln!(f, "skipped {}: {why}", human_bytes(*size))?;
        }
        let verdict = if self.meets_target() { "met" } else { "NOT met" };
        write!(f, "target: ratio >= {TARGET_RATIO} for working sets > LLC: {verdict}")
    }
}

/// LLC size in bytes and its source: the highest `level` among
/// `/sys/devices/system/cpu/cpu0/cache/index*/` with a parsable `size` (e.g. `32768K`), else
/// [`DEFAULT_LLC_BYTES`] with source `"default"`.
pub fn last_level_cache() -> (usize, String) {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize, String)> = None;
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let dir = entry.path();
        let read = |name: &str| {
            dropcompute::input::read_to_string(&dir.join(name), dropcompute::input::InputKind::System).ok()
        };
        let level = read("level").and_then(|s| s.trim().parse::<u32>().ok());
        let size = read("size").and_then(|s| parse_cache_size(s.trim()));
        if let (Some(level), Some(size)) = (level, size)
            && best.as_ref().is_none_or(|(l, _, _)| level > *l)
        {
            best = Some((level, size, dir.join("size").display().to_string()));
        }
    }
    best.map(|(_, size, src)| (size, src)).unwrap_or((DEFAULT_LLC_BYTES, "default".to_string()))
}

/// Parses a sysfs cache size such as `48K`, `2048K`, `32M` or `1G` into bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let (digits, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(mult)
}

/// Default sizes: 64 KiB × 4^k while below 4 × `llc_bytes`, then 4 × `llc_bytes` itself, so
/// the list runs from in-cache to well beyond the LLC.
pub fn automatic_sizes(llc_bytes: usize) -> Vec<usize> {
    let top = llc_bytes.saturating_mul(4).max(256 << 10);
    let mut sizes: Vec<usize> =
        std::iter::successors(Some(64usize << 10), |s| s.checked_mul(4)).take_while(|&s| s < top).collect();
    sizes.push(top);
    sizes
}

/// `MemAvailable` from /proc/meminfo in bytes, if readable.
fn mem_available() -> Option<usize> {
    let info = dropcompute::input::read_to_string(
        std::path::Path::new("/proc/meminfo"),
        dropcompute::input::InputKind::System,
    )
    .ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Buffers for one working-set size, shared by the four operations so that memory use is
/// about 2.2 × the working set instead of 4 ×.
struct Buffers {
    f32_acc: Vec<f32>,
    f32_x: Vec<f32>,
    bf16_acc: Vec<bf16>,
    bf16_x: Vec<bf16>,
    working_set: usize,
}

impl Buffers {
    /// Bytes allocated for a working set of `ws` bytes.
    fn footprint(ws: usize) -> usize {
        ws / 6 * 4 + ws / 8 * 4 + 2 * (ws / 4 * 2)
    }

    /// Allocates and touches every page (non-zero fill), so timing sees no page faults.
    fn new(ws: usize) -> Buffers {
        Buffers {
            f32_acc: vec![1.0; ws / 6],
            f32_x: vec![0.5; ws / 8],
            bf16_acc: vec![bf16::ONE; ws / 4],
            bf16_x: vec![bf16::from_f32(0.5); ws / 4],
            working_set: ws,
        }
    }

    /// Element count of `op` for this working set.
    fn elements(&self, op: BenchOp) -> usize {
        self.working_set / op.bytes_per_element().0
    }

    /// Runs `op` once; returns the bytes moved.
    fn run(&mut self, k: Kernels, op: BenchOp) -> usize {
        let n = self.elements(op);
        let result = match op {
            BenchOp::Memcpy => {
                self.f32_acc[..n].copy_from_slice(&self.f32_x[..n]);
                black_box(&mut self.f32_acc);
                Ok(())
            }
            BenchOp::ScaleAccumulateF32 => k.scale_accumulate_f32(&mut self.f32_acc[..n], &self.f32_x[..n], SCALE),
            BenchOp::ScaleAccumulateBf16 => k.scale_accumulate_bf16(&mut self.bf16_acc[..n], &self.bf16_x[..n], SCALE),
            BenchOp::ScaleAccumulateBf16ToF32 => {
                k.scale_accumulate_bf16_to_f32(&mut self.f32_acc[..n], &self.bf16_x[..n], SCALE)
            }
        };
        debug_assert!(result.is_ok(), "slices are cut to equal lengths: {result:?}");
        n * op.bytes_per_element().1
    }

    /// Calls `op` `iters` times; returns GB/s.
    fn measure(&mut self, k: Kernels, op: BenchOp, iters: usize) -> f64 {
        let start = Instant::now();
        let mut moved = 0usize;
        for _ in 0..iters {
            moved += self.run(k, op);
        }
        moved as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e9
    }
}

/// Median of a non-empty slice (NaN-free); 0 for an empty one.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
}

/// Measures one working-set size: calibrates iterations per op, then `reps` interleaved
/// repetitions. Returns rows in [`BenchOp::ALL`] order.
fn bench_size(k: Kernels, ws: usize, opts: &KernelBenchOptions) -> Vec<KernelBenchRow> {
    let mut bufs = Buffers::new(ws);
    let iters: Vec<usize> = BenchOp::ALL
        .iter()
        .map(|&op| {
            bufs.run(k, op); // warm-up: caches, TLB, dispatch
            let start = Instant::now();
            bufs.run(k, op);
            let once = start.elapsed().as_secs_f64().max(1e-9);
            (opts.min_measure_time.as_secs_f64() / once).ceil().clamp(1.0, 1e7) as usize
        })
        .collect();
    let reps = opts.reps.max(1);
    let mut gbps = vec![Vec::with_capacity(reps); BenchOp::ALL.len()];
    let mut order: Vec<usize> = (0..BenchOp::ALL.len()).collect();
    for _ in 0..reps {
        for &i in &order {
            gbps[i].push(bufs.measure(k, BenchOp::ALL[i], iters[i]));
        }
        order.rotate_left(1);
    }
    BenchOp::ALL
        .iter()
        .enumerate()
        .map(|(i, &op)| {
            let mut ratios: Vec<f64> = gbps[i].iter().zip(&gbps[0]).map(|(g, m)| g / m).collect();
            KernelBenchRow {
                working_set_bytes: ws,
                op,
                bytes_moved: bufs.elements(op) * op.bytes_per_element().1,
                gb_per_s: median(&mut gbps[i].clone()),
                ratio_vs_memcpy: median(&mut ratios),
            }
        })
        .collect()
}

/// Runs the kernel benchmark with the best kernels for this CPU ([`Kernels::best`]) on one
/// thread. Sizes needing more than half of `MemAvailable` are skipped and listed in the report.
/// Takes roughly `sizes × 4 × reps × min_measure_time` plus set-up; never panics on options
/// (zero reps count as one, sizes below 24 bytes are skipped).
pub fn run_kernel_bench(opts: &KernelBenchOptions) -> KernelBenchReport {
    let (llc_bytes, llc_source) = match opts.llc_bytes {
        Some(b) => (b, "option".to_string()),
        None => last_level_cache(),
    };
    let sizes = if opts.sizes.is_empty() { automatic_sizes(llc_bytes) } else { opts.sizes.clone() };
    let budget = mem_available().map(|m| m / 2);
    let k = Kernels::best();
    let mut report = KernelBenchReport {
        isa: k.isa(),
        llc_bytes,
        llc_source,
        reps: opts.reps.max(1),
        rows: Vec::new(),
        skipped: Vec::new(),
    };
    for ws in sizes {
        let need = Buffers::footprint(ws);
        if ws < 24 {
            report.skipped.push((ws, "smaller than one element of every operation".into()));
        } else if let Some(b) = budget.filter(|&b| need > b) {
            report
                .skipped
                .push((ws, format!("needs {} but half of MemAvailable is {}", human_bytes(need), human_bytes(b))));
        } else {
            report.rows.extend(bench_size(k, ws, opts));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_with_units() {
        assert_eq!(parse_cache_size("48K"), Some(48 * 1024));
        assert_eq!(parse_cache_size("32M"), Some(32 * 1024 * 1024));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("abcK"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    #[test]
    fn automatic_sizes_span_cache_to_four_times_llc() {
        let s = automatic_sizes(32 << 20);
        assert_eq!(s.first(), Some(&(64 << 10)));
        assert_eq!(s.last(), Some(&(128 << 20)));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(automatic_sizes(300 << 20).last(), Some(&(1200 << 20)));
    }

    #[test]
    fn bytes_moved_follow_the_documented_convention() {
        // 96-byte working set: f32 saxpy has 12 elements (96 / 8) and moves 12 * 12 bytes.
        let b = Buffers::new(96);
        assert_eq!(b.elements(BenchOp::ScaleAccumulateF32), 12);
        assert_eq!(b.elements(BenchOp::ScaleAccumulateBf16), 24);
        assert_eq!(b.elements(BenchOp::ScaleAccumulateBf16ToF32), 16);
        assert_eq!(b.elements(BenchOp::Memcpy), 12);
        for op in BenchOp::ALL {
            let (ws, moved) = op.bytes_per_element();
            assert_eq!(b.elements(op) * ws, 96, "{op:?} uses the whole working set");
            assert!(moved >= ws, "{op:?} reads every byte of its working set at least once");
        }
    }

    #[test]
    fn tiny_run_reports_every_op_and_judges_only_beyond_llc() {
        let opts = KernelBenchOptions {
            sizes: vec![4096, 16384, 8],
            reps: 2,
            min_measure_time: Duration::from_micros(200),
            llc_bytes: Some(8192),
        };
        let r = run_kernel_bench(&opts);
        assert_eq!(r.rows.len(), 2 * BenchOp::ALL.len());
        assert_eq!(r.skipped.len(), 1);
        assert!(r.rows.iter().all(|row| row.gb_per_s > 0.0 && row.gb_per_s.is_finite()));
        let memcpy_rows = r.rows.iter().filter(|row| row.op == BenchOp::Memcpy);
        assert!(memcpy_rows.clone().all(|row| row.ratio_vs_memcpy == 1.0));
        assert_eq!(memcpy_rows.count(), 2);
        assert_eq!(r.beyond_llc().count(), 3, "only the 16 KiB kernel rows exceed an 8 KiB LLC");
        let text = r.to_string();
        assert!(text.contains("scale_accumulate bf16->f32") && text.contains("target"), "{text}");
    }

    #[test]
    fn target_needs_a_row_beyond_llc() {
        let mut r = KernelBenchReport {
            isa: Isa::Generic,
            llc_bytes: 1 << 20,
            llc_source: "option".into(),
            reps: 1,
            rows: Vec::new(),
            skipped: Vec::new(),
        };
        assert!(!r.meets_target());
        let row = |op, ratio| KernelBenchRow {
            working_set_bytes: 4 << 20,
            op,
            bytes_moved: 0,
            gb_per_s: 1.0,
            ratio_vs_memcpy: ratio,
        };
        r.rows = vec![row(BenchOp::Memcpy, 1.0), row(BenchOp::ScaleAccumulateF32, 0.9)];
        assert!(r.meets_target());
        r.rows.push(row(BenchOp::ScaleAccumulateBf16, 0.5));
        assert!(!r.meets_target());
    }
}
