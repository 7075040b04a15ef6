//! Per-rank timelines of a `train` run as Chrome-trace JSON (opens in Perfetto and
//! chrome://tracing).
//!
//! Owns: [`Span`] / [`SpanKind`] (what the driver records) and [`chrome_trace`]. Must not
//! touch: clocks or devices (the driver supplies device-event times), files (the caller writes
//! the string through `output::StagedOut`).
//!
//! Layout (Trace Event Format, "JSON Object Format"): `{"traceEvents":[...],
//! "displayTimeUnit":"ms"}`. Each run is a process (pid = 1 + its index in the input, named by
//! a `process_name` metadata event); each rank is a thread of it (tid = rank, named `rank N` by a
//! `thread_name` metadata event, sorted by rank). Computed micro-batches, collectives and
//! optimizer steps are complete events (`"ph":"X"`, `ts`/`dur` in µs as f64).
//!
//! Dropped micro-batches never ran, so they have no duration: they are thread-scoped instant
//! events (`"ph":"i"`, `"s":"t"`) at the span's `start_ns` (the moment the deadline stopped the
//! rank), with `args.dropped = true`; their `dur_ns` is ignored. Instants were chosen over
//! zero-length `X` slices because Perfetto draws them as visible markers on the rank's row,
//! whereas a zero-length slice is invisible at most zoom levels.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;

use serde_json::{Value, json};

/// What a span on a rank's timeline is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// A micro-batch whose forward/backward ran.
    Computed,
    /// A micro-batch skipped by the deadline (drawn as an instant).
    Dropped,
    /// The gradient all-reduce (and the computed-sample count with it).
    Collective,
    /// The optimizer update.
    Optimizer,
}

impl SpanKind {
    /// Trace category (`cat`) of this kind: "compute", "dropped", "collective", "optimizer".
    pub fn category(self) -> &'static str {
        match self {
            SpanKind::Computed => "compute",
            SpanKind::Dropped => "dropped",
            SpanKind::Collective => "collective",
            SpanKind::Optimizer => "optimizer",
        }
    }
}

/// One interval on one rank's timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Rank index.
    pub rank: u32,
    /// Optimizer step index (0-based).
    pub step: u64,
    /// Micro-batch index within the step (`None` for collective and optimizer spans).
    pub micro_batch: Option<u32>,
    /// What the span is.
    pub kind: SpanKind,
    /// Start, ns since the run's time origin (device event time).
    pub start_ns: u64,
    /// Duration, ns (ignored for [`SpanKind::Dropped`]).
    pub dur_ns: u64,
}

/// One run's spans and its name (e.g. "baseline", "dropcompute").
#[derive(Clone, Copy, Debug)]
pub struct RunSpans<'a> {
    /// Process name shown in the viewer.
    pub name: &'a str,
    /// The run's spans, any order.
    pub spans: &'a [Span],
}

fn us(ns: u64) -> f64 {
    // Exact below 2^53 ns (104 days).
    ns as f64 / 1e3
}

fn event(pid: u32, s: &Span) -> Value {
    let name = match (s.kind, s.micro_batch) {
        (SpanKind::Computed, Some(k)) => format!("mb {k}"),
        (SpanKind::Computed, None) => "compute".to_owned(),
        (SpanKind::Dropped, Some(k)) => format!("dropped mb {k}"),
        (SpanKind::Dropped, None) => "dropped".to_owned(),
        (SpanKind::Collective, _) => "all-reduce".to_owned(),
        (SpanKind::Optimizer, _) => "optimizer".to_owned(),
    };
    let mut args = json!({ "step": s.step });
    if let Some(k) = s.micro_batch {
        args["micro_batch"] = json!(k);
    }
    let (cat, ts) = (s.kind.category(), us(s.start_ns));
    if s.kind == SpanKind::Dropped {
        args["dropped"] = json!(true);
        json!({ "name": name, "cat": cat, "ph": "i", "s": "t", "pid": pid, "tid": s.rank, "ts": ts, "args": args })
    } else {
        json!({ "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": s.rank, "ts": ts, "dur": us(s.dur_ns), "args": args })
    }
}

/// Build the Chrome-trace JSON of `runs` (layout in the module doc). Metadata events come
/// first, then the spans in input order. Ranks get a row if they have at least one span.
/// Infallible: every input is representable.
pub fn chrome_trace(runs: &[RunSpans<'_>]) -> String {
    let mut events = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let pid = u32::try_from(i + 1).unwrap_or(u32::MAX);
        events.push(json!({ "name": "process_name", "ph": "M", "pid": pid, "args": { "name": run.name } }));
        events.push(json!({ "name": "process_sort_index", "ph": "M", "pid": pid, "args": { "sort_index": pid } }));
        let ranks: BTreeSet<u32> = run.spans.iter().map(|s| s.rank).collect();
        for r in ranks {
            events.push(
                json!({ "name": "thread_name", "ph": "M", "pid": pid, "tid": r, "args": { "name": format!("rank {r}") } }),
            );
            events.push(
                json!({ "name": "thread_sort_index", "ph": "M", "pid": pid, "tid": r, "args": { "sort_index": r } }),
            );
        }
        events.extend(run.spans.iter().map(|s| event(pid, s)));
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `ranks` ranks x `steps` steps x `m` micro-batches where rank r drops its last r
    /// micro-batches (capped at m - 1); each micro-batch 1 ms, all-reduce 0.5 ms, optimizer 0.25 ms.
    fn spans(ranks: u32, steps: u64, m: u32) -> Vec<Span> {
        let mut v = Vec::new();
        for step in 0..steps {
            let t0 = step * 20_000_000;
            for rank in 0..ranks {
                let dropped = rank.min(m - 1);
                for k in 0..m {
                    let kind = if k < m - dropped { SpanKind::Computed } else { SpanKind::Dropped };
                    let start_ns = t0 + u64::from(k.min(m - dropped)) * 1_000_000;
                    let dur_ns = if kind == SpanKind::Computed { 1_000_000 } else { 0 };
                    v.push(Span { rank, step, micro_batch: Some(k), kind, start_ns, dur_ns });
                }
                let c0 = t0 + u64::from(m) * 1_000_000;
                let s = |kind, start_ns, dur_ns| Span { rank, step, micro_batch: None, kind, start_ns, dur_ns };
                v.push(s(SpanKind::Collective, c0, 500_000));
                v.push(s(SpanKind::Optimizer, c0 + 500_000, 250_000));
            }
        }
        v
    }

    fn events(json: &str) -> Vec<Value> {
        let v: Value = serde_json::from_str(json).expect("valid JSON");
        assert_eq!(v["displayTimeUnit"], "ms");
        v["traceEvents"].as_array().expect("traceEvents array").clone()
    }

    #[test]
    fn one_named_row_per_rank_and_counts_per_kind() {
        let (ranks, steps, m) = (4u32, 3u64, 5u32);
        let s = spans(ranks, steps, m);
        let ev = events(&chrome_trace(&[RunSpans { name: "dropcompute", spans: &s }]));
        let names: Vec<String> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().expect("name").to_owned())
            .collect();
        assert_eq!(names, ["rank 0", "rank 1", "rank 2", "rank 3"]);
        let count = |ph: &str, cat: &str| ev.iter().filter(|e| e["ph"] == ph && e["cat"] == cat).count() as u64;
        // Rank r drops r micro-batches per step: 0 + 1 + 2 + 3 = 6 per step.
        let dropped_per_step = 6;
        assert_eq!(count("X", "compute"), steps * u64::from(ranks * m) - steps * dropped_per_step);
        assert_eq!(count("i", "dropped"), steps * dropped_per_step);
        assert_eq!(count("X", "collective"), steps * u64::from(ranks));
        assert_eq!(count("X", "optimizer"), steps * u64::from(ranks));
        assert!(ev.iter().filter(|e| e["ph"] == "i").all(|e| e["args"]["dropped"] == true && e["s"] == "t"));
        assert!(ev.iter().filter(|e| e["ph"] == "X").all(|e| e.get("dur").is_some() && e["args"]["dropped"].is_null()));
        let procs: Vec<&Value> = ev.iter().filter(|e| e["name"] == "process_name").collect();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0]["args"]["name"], "dropcompute");
    }

    #[test]
    fn times_are_microseconds_and_rows_match_ranks() {
        let s = [
            Span { rank: 7, step: 2, micro_batch: Some(1), kind: SpanKind::Computed, start_ns: 1_500, dur_ns: 2_250 },
            Span { rank: 7, step: 2, micro_batch: None, kind: SpanKind::Collective, start_ns: 3_750, dur_ns: 1 },
        ];
        let ev = events(&chrome_trace(&[RunSpans { name: "baseline", spans: &s }]));
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!((x[0]["ts"].as_f64(), x[0]["dur"].as_f64()), (Some(1.5), Some(2.25)));
        assert_eq!((x[1]["ts"].as_f64(), x[1]["dur"].as_f64()), (Some(3.75), Some(0.001)));
        assert_eq!((x[0]["tid"].as_u64(), x[0]["args"]["step"].as_u64()), (Some(7), Some(2)));
        assert_eq!(x[0]["args"]["micro_batch"].as_u64(), Some(1));
        assert!(x[1]["args"].get("micro_batch").is_none());
    }

    #[test]
    fn two_runs_get_distinct_processes() {
        let a = spans(2, 1, 2);
        let b = spans(3, 1, 2);
        let ev = events(&chrome_trace(&[
            RunSpans { name: "baseline", spans: &a },
            RunSpans { name: "dropcompute", spans: &b },
        ]));
        let rows = |pid: u64| ev.iter().filter(|e| e["name"] == "thread_name" && e["pid"] == pid).count();
        assert_eq!((rows(1), rows(2)), (2, 3));
        let spans_of = |pid: u64| ev.iter().filter(|e| e["ph"] != "M" && e["pid"] == pid).count();
        assert_eq!((spans_of(1), spans_of(2)), (a.len(), b.len()));
    }

    #[test]
    fn empty_input_is_a_valid_empty_trace() {
        assert!(events(&chrome_trace(&[])).is_empty());
        let ev = events(&chrome_trace(&[RunSpans { name: "x", spans: &[] }]));
        assert!(ev.iter().all(|e| e["ph"] == "M" && e["name"] != "thread_name"));
    }
}
