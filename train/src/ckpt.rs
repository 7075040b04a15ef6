//! Checkpoint and resume of the DropCompute run.
//!
//! Owns: the per-rank checkpoint layout (`DIR/rank-<r>/checkpoint-<step>.dcc`, written with
//! `dropcompute::checkpoint`: temp file, fsync, rename, format version, SHA-256), the choice of the
//! step to resume from (the newest step every rank has a readable checkpoint of, refusing a
//! directory written by another world size). Must not touch: the step loop, the file format
//! itself or signals (`dropcompute::signals`).
//!
//! Exactness: a checkpoint at step s holds everything a rank's future depends on: parameters,
//! the optimizer state ([`OptimizerState`]: the digits' momentum, or the text transformer's
//! AdamW m, v and step count), the data source (epoch, queue, re-queued micro-batches), the scheduler state
//! (threshold, latency estimate window, straggler statistics, drop ledger) and the losses so
//! far. The mock's latencies are a pure function of (seed, module, step, micro-batch) (the
//! latency key set by `workload::set_latency_key`), so in virtual time a resumed run draws the
//! same latencies, makes the same decisions and ends with bitwise-identical parameters.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use dropcompute::checkpoint::{self, Checkpoint, CheckpointError};
use dropcompute::schedule::SchedulerState;

use super::config::Task;
use super::error::TrainError;
use super::transformer_train::AdamWState;
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
    /// AdamW steps taken (the text task's [`OptimizerState::AdamW`]; absent for the digits,
    /// and in checkpoints written before the text task had checkpoints). Set by [`save`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adamw_step: Option<u64>,
}

/// `dir/rank-<rank>`.
pub fn rank_dir(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// The optimizer state of a rank's checkpoint, by task: the tensors of the file.
#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerState {
    /// The digits MLP (SGD with momentum): tensors `params` and `velocity`, param_len f32 each.
    Momentum {
        /// Flat parameters (`mlp::MlpShape`'s layout).
        params: Vec<f32>,
        /// Momentum buffer.
        velocity: Vec<f32>,
    },
    /// The text transformer (AdamW): tensors `params`, `adamw_m`, `adamw_v` (param_len f32
    /// each, `transformer::TransformerConfig::blocks`' layout), the step count in the meta
    /// ([`RankMeta::adamw_step`]).
    AdamW(AdamWState),
}

impl OptimizerState {
    /// The parameters.
    pub fn params(&self) -> &[f32] {
        match self {
            Self::Momentum { params, .. } => params,
            Self::AdamW(s) => &s.params,
        }
    }

    /// The tensor names of this state, in file order.
    fn names(&self) -> &'static [&'static str] {
        match self {
            Self::Momentum { .. } => &MOMENTUM_TENSORS,
            Self::AdamW(_) => &ADAMW_TENSORS,
        }
    }
}

/// Tensor names of a digits checkpoint.
pub const MOMENTUM_TENSORS: [&str; 2] = ["params", "velocity"];
/// Tensor names of a text checkpoint.
pub const ADAMW_TENSORS: [&str; 3] = ["params", "adamw_m", "adamw_v"];

/// Writes rank `rank`'s checkpoint of `step` (the state before step `step` runs): `meta` and
/// `state`'s tensors (an AdamW state's step count goes into the meta, [`RankMeta::adamw_step`]).
///
/// # Errors
/// [`TrainError::Checkpoint`] when the directory or file cannot be written.
pub fn save(dir: &Path, rank: u32, step: u64, meta: &RankMeta, state: OptimizerState) -> Result<PathBuf, TrainError> {
    let d = rank_dir(dir, rank);
    std::fs::create_dir_all(&d).map_err(|source| {
        TrainError::Checkpoint(CheckpointError::Io { path: d.clone(), op: "create_dir_all", source })
    })?;
    let mut meta = meta.clone();
    let names = state.names();
    let values = match state {
        OptimizerState::Momentum { params, velocity } => {
            meta.adamw_step = None;
            vec![params, velocity]
        }
        OptimizerState::AdamW(s) => {
            meta.adamw_step = Some(s.step);
            vec![s.params, s.m, s.v]
        }
    };
    let meta = serde_json::to_value(&meta)
        .map_err(|e| TrainError::Config { what: "checkpoint meta", value: e.to_string() })?;
    let tensors = names.iter().map(|n| (*n).to_owned()).zip(values).collect();
    let c = Checkpoint { step, meta, tensors };
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

/// Loads rank `rank`'s checkpoint of `step`: its meta and optimizer state. `want` is the job's
/// fingerprint (`Job::fingerprint`), `p` its parameter count (`Job::param_len`).
///
/// # Errors
/// [`TrainError::Checkpoint`] for an unreadable file or one of another configuration (another
/// fingerprint), [`CheckpointError::Malformed`] for tensors other than [`MOMENTUM_TENSORS`] or
/// [`ADAMW_TENSORS`] of `p` values each (or AdamW tensors without a step count).
pub fn load(want: &str, p: usize, dir: &Path, rank: u32, step: u64) -> Result<(RankMeta, OptimizerState), TrainError> {
    let d = rank_dir(dir, rank);
    let c = checkpoint::read_step(&d, step)?;
    let path = d.join(checkpoint::file_name(step));
    let malformed = |reason: String| TrainError::Checkpoint(CheckpointError::Malformed { path: path.clone(), reason });
    // An array would be read into RankMeta's fields in order (serde's sequence form).
    if !c.meta.is_object() {
        return Err(malformed(format!("meta: {}", habana_sys::NOT_A_JSON_OBJECT)));
    }
    let meta: RankMeta = serde_json::from_value(c.meta).map_err(|e| malformed(format!("meta: {e}")))?;
    if meta.fingerprint != want {
        return Err(TrainError::Checkpoint(CheckpointError::OtherConfiguration {
            path: path.clone(),
            differences: differences(&meta.fingerprint, want),
        }));
    }
    if let Some((n, t)) = c.tensors.iter().find(|(_, t)| t.len() != p) {
        return Err(malformed(format!("tensor {n} has {} values, the model has {p}", t.len())));
    }
    // The names are checked before the tensors are moved out (no copy of params, m and v).
    let (names, tensors): (Vec<String>, Vec<Vec<f32>>) = c.tensors.into_iter().unzip();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut values = tensors.into_iter();
    let mut next = || values.next().unwrap_or_default();
    let state = match (names.as_slice(), meta.adamw_step) {
        (n, None) if n == MOMENTUM_TENSORS => OptimizerState::Momentum { params: next(), velocity: next() },
        (n, Some(step)) if n == ADAMW_TENSORS => {
            OptimizerState::AdamW(AdamWState { params: next(), m: next(), v: next(), step })
        }
        (n, s) => {
            return Err(malformed(format!(
                "tensors {n:?} with AdamW step {s:?}: expected {MOMENTUM_TENSORS:?} without a step or {ADAMW_TENSORS:?} with one"
            )));
        }
    };
    Ok((meta, state))
}

/// The flag (or what sets it) of each field of a fingerprint (`Job::fingerprint`) of a job of
/// `task`, and its value in the flag's spelling: the fingerprint keeps Rust debug names
/// (`check=Predictive`, `norm=Realized`) so that existing checkpoints still resume; messages
/// never show them. The parameter count and the training data are worded by the task
/// (`config::Task::params_flags`, `Task::units_name`, `Task::units_flags`).
fn field_as_flag(key: &str, value: &str, task: Task) -> (String, String) {
    let flag = match key {
        "ranks" => "--ranks".to_owned(),
        "m" => "--micro-batches".to_owned(),
        "b" => "--micro-batch-size".to_owned(),
        "seed" => "--seed".to_owned(),
        "params" => format!("the parameter count ({})", task.params_flags()),
        "hidden" => "--hidden".to_owned(),
        "check" => "--check".to_owned(),
        "lag" => "--sync-lag".to_owned(),
        "norm" => "--normalization".to_owned(),
        "lr" => "--lr".to_owned(),
        "momentum" => "--momentum".to_owned(),
        // The digits' field (0 in a text fingerprint); the text job's is `units`.
        "train" => format!("the {} ({})", Task::Digits.units_name(), Task::Digits.units_flags()),
        "policy" => "--policy".to_owned(),
        "task" => "--task".to_owned(),
        "model" => "--text-model".to_owned(),
        "units" => format!("the {} ({})", Task::Text.units_name(), Task::Text.units_flags()),
        "tail" => "--tail-split:--tail-cost".to_owned(),
        other => other.to_owned(),
    };
    let value = match (key, value) {
        ("check", "Predictive") => "predictive".to_owned(),
        ("check", "BeforeMicroBatch") => "before".to_owned(),
        ("norm", v) => v.to_lowercase(),
        (_, v) => v.to_owned(),
    };
    (flag, value)
}

/// The fields of a fingerprint that follow from its task (the model's size, the data it deals):
/// when the task differs they differ with it, and only `--task` is named.
const TASK_FIELDS: [&str; 4] = ["params", "train", "model", "units"];

/// Each field in which fingerprint `saved` (the checkpoint's) differs from `want` (this run's)
/// as "FLAG was X, this run has Y" ([`field_as_flag`], worded for this run's task), joined by
/// "; ". A field only one of them has (`policy`, `tail`, `task`: absent means the drop policy
/// of `--check`, no tail shape, the digits) reads so on the other side. `--task` comes first
/// when it differs, and then the fields that follow from the task ([`TASK_FIELDS`]) are not
/// listed (the digits' "training samples" of a text job, always 0, read as a difference).
pub fn differences(saved: &str, want: &str) -> String {
    let fields = |f: &str| -> Vec<(String, String)> {
        f.split_whitespace()
            .map(|kv| kv.split_once('=').map_or((kv.to_owned(), String::new()), |(k, v)| (k.to_owned(), v.to_owned())))
            .collect()
    };
    let (a, b) = (fields(saved), fields(want));
    let get = |f: &[(String, String)], k: &str| f.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone());
    let task_of =
        |f: &[(String, String)]| if get(f, "task").as_deref() == Some("text") { Task::Text } else { Task::Digits };
    let (saved_task, task) = (task_of(&a), task_of(&b));
    let mut keys: Vec<&String> = Vec::new();
    for (k, _) in a.iter().chain(&b) {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    if saved_task != task {
        keys.retain(|k| !TASK_FIELDS.contains(&k.as_str()));
        keys.sort_by_key(|k| k.as_str() != "task");
    }
    let mut out = Vec::new();
    for k in keys {
        let (x, y) = (get(&a, k), get(&b, k));
        if x == y {
            continue;
        }
        let flag = field_as_flag(k, "", task).0;
        let absent = match k.as_str() {
            "policy" => "the drop policy of --check",
            "tail" => "off",
            "task" => "digits",
            _ => "(not recorded)",
        };
        let shown = |v: Option<String>| v.map_or_else(|| absent.to_owned(), |v| field_as_flag(k, &v, task).1);
        let (was, has) = (shown(x), shown(y));
        out.push(format!("{flag} was {was}, this run has {has}"));
    }
    if out.is_empty() { format!("fingerprint {saved:?}, this run {want:?}") } else { out.join("; ") }
}

#[cfg(test)]
mod difference_tests {
    /// Every field reads in the CLI's spelling, never a Rust debug name.
    #[test]
    fn differences_name_flags_and_cli_values() {
        let base = "ranks=2 m=4 b=16 seed=0 params=10 hidden=32 check=Predictive lag=0 norm=Realized lr=0.1 momentum=0.9 train=1438";
        let table = [
            ("check=Predictive", "check=BeforeMicroBatch", "--check was predictive, this run has before"),
            ("ranks=2", "ranks=4", "--ranks was 2, this run has 4"),
            ("norm=Realized", "norm=Nominal", "--normalization was realized, this run has nominal"),
            ("lag=0", "lag=2", "--sync-lag was 0, this run has 2"),
        ];
        for (from, to, want) in table {
            let got = super::differences(base, &base.replace(from, to));
            assert_eq!(got, want);
        }
        let got = super::differences(base, &format!("{base} policy=rebalance"));
        assert_eq!(got, "--policy was the drop policy of --check, this run has rebalance");
    }
}
