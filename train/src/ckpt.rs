//! Checkpoint and resume of the DropCompute run.
//!
//! Owns: the per-rank checkpoint layout (`DIR/rank-<r>/checkpoint-<step>.dcc`, written with
//! `dropcompute::checkpoint`: temp file, fsync, rename, format version, SHA-256), the choice of the
//! step to resume from (the newest step every rank has a readable checkpoint of, refusing a
//! directory written by another world size). Must not touch: the step loop, the file format
//! itself or signals (`dropcompute::signals`).
//!
//! Exactness: a checkpoint at step s holds everything a rank's future depends on: parameters,
//! momentum, the data source (epoch, queue, re-queued micro-batches), the scheduler state
//! (threshold, latency estimate window, straggler statistics, drop ledger) and the losses so
//! far. The mock's latencies are a pure function of (seed, module, step, micro-batch) (the
//! latency key set by `workload::set_latency_key`), so in virtual time a resumed run draws the
//! same latencies, makes the same decisions and ends with bitwise-identical parameters.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use dropcompute::checkpoint::{self, Checkpoint, CheckpointError};
use dropcompute::schedule::SchedulerState;

use super::error::TrainError;
use dropcompute::deal::RunData;

/// What a rank's checkpoint carries besides the tensors.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankMeta {
    /// The configuration this checkpoint belongs to (must match on resume).
    pub fingerprint: String,
    /// The scheduler's state.
    pub scheduler: SchedulerState,
    /// The rank's data source.
    pub data: RunData,
    /// Global loss per completed step (null = none computed).
    pub losses: Vec<Option<f64>>,
}

/// `dir/rank-<rank>`.
pub fn rank_dir(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// Writes rank `rank`'s checkpoint of `step` (the state before step `step` runs).
///
/// # Errors
/// [`TrainError::Checkpoint`] when the directory or file cannot be written.
pub fn save(
    dir: &Path,
    rank: u32,
    step: u64,
    meta: &RankMeta,
    params: Vec<f32>,
    velocity: Vec<f32>,
) -> Result<PathBuf, TrainError> {
    let d = rank_dir(dir, rank);
    std::fs::create_dir_all(&d).map_err(|source| {
        TrainError::Checkpoint(CheckpointError::Io { path: d.clone(), op: "create_dir_all", source })
    })?;
    let meta =
        serde_json::to_value(meta).map_err(|e| TrainError::Config { what: "checkpoint meta", value: e.to_string() })?;
    let c = Checkpoint { step, meta, tensors: vec![("params".into(), params), ("velocity".into(), velocity)] };
    Ok(checkpoint::save(&d, &c)?)
}

/// The world size of the run that wrote `dir`: one more than the highest `rank-<r>`
/// subdirectory holding a checkpoint file (`None` when there is none).
fn written_world_size(dir: &Path) -> Option<u32> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let r: u32 = name.to_str()?.strip_prefix("rank-")?.parse().ok()?;
            let has_ckpt = std::fs::read_dir(e.path())
                .ok()?
                .filter_map(Result::ok)
                .any(|f| f.path().extension().is_some_and(|x| x == "dcc"));
            has_ckpt.then_some(r)
        })
        .max()
        .map(|r| r + 1)
}

/// The step to resume from: the newest step for which every rank `0..world_size` has a
/// readable checkpoint in `dir`. Unreadable files are reported (warn) and kept.
///
/// # Errors
/// [`TrainError::WorldSizeMismatch`] when `dir` holds checkpoints of another world size (its
/// highest `rank-<r>` directory with a checkpoint is not `world_size - 1`);
/// [`TrainError::Checkpoint`] ([`CheckpointError::NoCheckpoint`]) when there is no such step.
pub fn common_step(dir: &Path, world_size: u32) -> Result<u64, TrainError> {
    if !dir.is_dir() {
        return Err(TrainError::Checkpoint(CheckpointError::NoCheckpoint { dir: dir.to_path_buf(), corrupt: vec![] }));
    }
    if let Some(written) = written_world_size(dir)
        && written != world_size
    {
        return Err(TrainError::WorldSizeMismatch { dir: dir.to_path_buf(), checkpoint: written, run: world_size });
    }
    let mut common: Option<std::collections::BTreeSet<u64>> = None;
    let mut corrupt = Vec::new();
    for r in 0..world_size {
        let d = rank_dir(dir, r);
        let (ok, bad) = if d.is_dir() { checkpoint::valid_steps(&d)? } else { (vec![], vec![]) };
        for (path, e) in bad {
            tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable checkpoint (kept on disk)");
            dropcompute::console::err(&format!("warning: skipping {}: {e}", path.display()));
            corrupt.push(path);
        }
        let set: std::collections::BTreeSet<u64> = ok.into_iter().collect();
        common = Some(match common {
            None => set,
            Some(c) => c.intersection(&set).copied().collect(),
        });
    }
    common
        .and_then(|c| c.last().copied())
        .ok_or(TrainError::Checkpoint(CheckpointError::NoCheckpoint { dir: dir.to_path_buf(), corrupt }))
}

/// Loads rank `rank`'s checkpoint of `step`: (meta, params, velocity). `want` is the job's
/// fingerprint (`Job::fingerprint`), `p` its parameter count (`MlpShape::param_len`).
///
/// # Errors
/// [`TrainError::Checkpoint`] for an unreadable file or one of another configuration (another
/// fingerprint, or tensors other than params and velocity of `p` values each).
pub fn load(
    want: &str,
    p: usize,
    dir: &Path,
    rank: u32,
    step: u64,
) -> Result<(RankMeta, Vec<f32>, Vec<f32>), TrainError> {
    let d = rank_dir(dir, rank);
    let c = checkpoint::read_step(&d, step)?;
    let path = d.join(checkpoint::file_name(step));
    let malformed = |reason: String| TrainError::Checkpoint(CheckpointError::Malformed { path: path.clone(), reason });
    let meta: RankMeta = serde_json::from_value(c.meta).map_err(|e| malformed(format!("meta: {e}")))?;
    if meta.fingerprint != want {
        return Err(malformed(format!(
            "written by another configuration ({}), this run is ({want})",
            meta.fingerprint
        )));
    }
    let mut tensors = c.tensors.into_iter();
    match (tensors.next(), tensors.next()) {
        (Some((a, params)), Some((b, vel)))
            if a == "params" && b == "velocity" && params.len() == p && vel.len() == p =>
        {
            Ok((meta, params, vel))
        }
        _ => Err(malformed(format!("expected tensors params and velocity of {p} values"))),
    }
}
