//! `dropcompute-train`, the crate of `dropcompute train`: the example workload (an MLP classifier on the UCI handwritten digits
//! over N ranks) that runs the synchronous baseline and DropCompute with the same seed through
//! the step scheduler and compares them.
//!
//! Owns: the data set ([`data`]), the text job's corpus, byte tokens and length buckets
//! ([`text`]: the embedded fortunes corpus, the bucket plan whose units the core's one
//! dealer deals, the token counts of each micro-batch), the model math ([`mlp`], host-side and deterministic: the
//! reference, and the evaluation of held-out accuracy), the model as device graphs
//! ([`model_graphs`]: forward/backward and SGD, built with `synapse::graph`), the
//! workload that binds it to the scheduler ([`workload`]), the job description ([`job`]:
//! validated inputs, planned runs, per-rank outcomes), the one error type ([`error`]),
//! checkpoints ([`ckpt`]), the run driver ([`run`]: one rank's loop; ranks are started by
//! `dropcompute::launch` as threads, processes or one launcher rank), the validated configuration
//! ([`config`]; its flags and `run` are `dropcompute_cli::commands::train`), and the outputs
//! ([`summary`], [`output`], [`report`], [`timeline`], [`figure`], [`progress`], [`metrics`],
//! [`params`]; `params` is also the reader of `--init-params`), and the text job's model
//! ([`transformer`]: sizes, parameter layout, LM staging, AdamW scalars; [`transformer_graphs`]:
//! the per-bucket forward/backward recipes, AdamW and accumulation as device graphs;
//! [`transformer_train`]: one rank's training loop without the scheduler), and the text job's
//! N-rank wiring through the same driver ([`text_job`]: the task's shared inputs;
//! [`text_workload`]: the workload over the transformer; `--task text`; [`text_device`]: the
//! compute rate of its device model). A run's data is dealt by the
//! core's `dropcompute::deal` (one global stream dealt by the policy's assignment).
//! File dependencies form a DAG (no import cycle): `run` -> {`job`, `ckpt`, `summary`,
//! `workload`, `text_workload`, `text`, `error`}; `workload` -> `model_graphs` -> `mlp`; `summary` -> {`job`, `error`,
//! outputs}; `job` -> {`ckpt`, `error`, `params`, `model_graphs`, `text_job`, `text_device`,
//! `transformer_graphs`}; `text_device` -> {`text`, `transformer`}; `params` -> `mlp` only;
//! `ckpt` -> `error`; `text_workload` -> {`text_job`, `transformer_train`, `workload`};
//! `text_job` -> {`text`, `transformer`, `transformer_train`, `config`, `error`}; `text` -> `data` (the one train/holdout rule); `transformer_train` ->
//! {`transformer_graphs`, `transformer`, `text`}; `transformer_graphs` -> {`transformer`,
//! `text`}; `transformer` -> `text`; `error` -> leaf error types only (and `config`'s
//! `ArgError`); `config` -> no other file of `train`. The threshold of
//! `--threshold auto` is `dropcompute::tune::recommend`, shared with `dropcompute tune`.
//! Must not touch: the deadline rule (`policy`), the step loop (`schedule`), or raw FFI; the only
//! `unsafe` here is the bounds-checked gemm call in the private `gemm` module.

pub mod ckpt;
pub mod config;
pub mod data;
pub mod error;
pub mod figure;
mod gemm;
pub mod job;
pub mod metrics;
pub mod mlp;
pub mod model_graphs;
pub mod output;
pub mod params;
pub mod progress;
pub mod report;
pub mod run;
pub mod summary;
pub mod text;
pub mod text_device;
pub mod text_job;
pub mod text_workload;
pub mod timeline;
pub mod transformer;
pub mod transformer_graphs;
pub mod transformer_train;
pub mod workload;
