//! The tiny text job the text-task tests share (`tests/train_text.rs`, `tests/resume_text.rs`):
//! `--text-model tiny`, 800 documents, 4 documents per micro-batch, no noise (all straggling is
//! the data's) — the model part, which `validate` also takes after `--` — and the run part: 4
//! ranks, M = 4, virtual time (runs are exact), no warm-up steps. Each test adds its own flags
//! (`--epochs`, `--policy`, `--threshold`, `--seed`, ...).

/// The model and data flags of the tiny text job (what `validate ... --` takes).
pub const TINY_TEXT_MODEL: [&str; 10] =
    ["--task", "text", "--text-model", "tiny", "--text-documents", "800", "--micro-batch-size", "4", "--noise", "none"];

/// The run flags of the tiny text job under `train`.
pub const TINY_TEXT_RUN: [&str; 7] =
    ["--ranks", "4", "--micro-batches", "4", "--time-mode", "virtual", "--warmup-steps=0"];

/// `dropcompute` arguments of the tiny text job: `train`, the model part, the run part.
pub fn tiny_text_train() -> Vec<&'static str> {
    [&["train"][..], &TINY_TEXT_MODEL, &TINY_TEXT_RUN].concat()
}
