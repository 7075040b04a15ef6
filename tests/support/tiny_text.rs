//! The tiny text job the text-task tests share (`tests/train_text.rs`, `tests/resume_text.rs`):
//! `--text-model tiny`, 800 documents, 4 ranks, M = 4, 4 documents per micro-batch, no noise
//! (all straggling is the data's), virtual time (runs are exact), no warm-up steps. Each test
//! adds its own flags (`--epochs`, `--policy`, `--threshold`, `--seed`, ...).

/// `dropcompute` arguments of the tiny text job.
pub const TINY_TEXT: [&str; 18] = [
    "train",
    "--task",
    "text",
    "--text-model",
    "tiny",
    "--text-documents",
    "800",
    "--ranks",
    "4",
    "--micro-batches",
    "4",
    "--micro-batch-size",
    "4",
    "--noise",
    "none",
    "--time-mode",
    "virtual",
    "--warmup-steps=0",
];
