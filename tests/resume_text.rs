//! Checkpoint and resume of `train --task text` (issue 26, part ckpt28), virtual time, so runs
//! are exact: under a dropping length-aware policy and under cost-balanced dealing, a run
//! stopped at a checkpoint and resumed ends with parameters bitwise identical to an
//! uninterrupted run (AdamW's m, v and step count, the dealer's stream and the scheduler's
//! bucket-cost estimates all restored), and with the same held-out loss in report.json. Every
//! file involved is read back by the product: the checkpoint by the resumed run, the parameters
//! file through `train::params::load_text` and by `train --task text --init-params`. A digits
//! checkpoint is refused by a text run naming `--task`.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;
use std::process::Output;

#[path = "support/tiny_text.rs"]
mod tiny_text;

/// The tiny text job (`tiny_text::tiny_text_train`) with this file's flags.
fn text_args() -> Vec<&'static str> {
    [&tiny_text::tiny_text_train()[..], &["--no-compare", "--seed=3"]].concat()
}

fn dropcompute(extra: &[&str]) -> Output {
    hermetic::dropcompute().args(text_args()).args(extra).output().expect("run dropcompute")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The final parameters' bits, read back from the run's parameters file by the product's
/// reader (which checks every block's shape against the sizes in the metadata).
fn params(out: &Path) -> Vec<u32> {
    let (cfg, p) =
        dropcompute_train::params::load_text(&out.join("params_dropcompute.safetensors")).expect("reads back");
    assert_eq!(cfg, dropcompute_train::transformer::TransformerConfig::TINY);
    p.iter().map(|x| x.to_bits()).collect()
}

fn holdout_loss(out: &Path) -> f64 {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report")).expect("report.json");
    r["dropcompute"]["holdout_loss_per_token"].as_f64().expect("the text metric")
}

#[test]
fn a_resumed_text_run_ends_bitwise_equal_to_an_uninterrupted_one() {
    // (policy, threshold): a deadline of 0.5 ms drops in most steps of the tiny model (bucket
    // 16 costs about 0.16 ms a micro-batch), so the requeued units and the bucket-cost
    // estimates are part of what the checkpoint must restore.
    let table = [("length-predictive", "0.5"), ("cost-balance", "off")];
    let root = hermetic::temp_dir("resume-text");
    for (policy, threshold) in table {
        let dir = root.path().join(policy);
        let (ck, full, first, resumed) = (dir.join("ck"), dir.join("full"), dir.join("first"), dir.join("resumed"));
        let run = |extra: &[&str]| {
            let mut a = vec!["--policy", policy, "--threshold", threshold];
            a.extend(extra);
            let o = dropcompute(&a);
            assert!(o.status.success(), "{policy} {extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        run(&["--steps", "8", "--out", s(&full)]);
        // The first 4 steps with a checkpoint after them, then a resumed run to step 8.
        run(&["--steps", "4", "--checkpoint-every", "4", "--checkpoint-dir", s(&ck), "--out", s(&first)]);
        for r in 0..4 {
            assert!(ck.join(format!("rank-{r}/checkpoint-0000000004.dcc")).is_file(), "{policy}: rank {r}");
        }
        run(&["--steps", "8", "--resume", s(&ck), "--out", s(&resumed)]);
        let want = params(&full);
        assert_ne!(params(&first), want, "{policy}: 4 steps must differ from 8");
        assert!(params(&resumed) == want, "{policy}: the resumed run's parameters differ from the uninterrupted run's");
        assert_eq!(holdout_loss(&resumed).to_bits(), holdout_loss(&full).to_bits(), "{policy}");
    }
    // The parameters file starts a run (`--init-params`; at lr 1e-12 the run keeps them, to
    // within the update's size) and a file of another model size is refused naming both.
    let p = root.path().join("cost-balance/full/params_dropcompute.safetensors");
    let warm = root.path().join("warm");
    let o = dropcompute(&[
        "--steps",
        "1",
        "--threshold",
        "off",
        "--lr",
        "1e-12",
        "--init-params",
        s(&p),
        "--out",
        s(&warm),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (start, after) = (params(&root.path().join("cost-balance/full")), params(&warm));
    let moved =
        start.iter().zip(&after).map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs()).fold(0f32, f32::max);
    assert!(moved < 1e-6, "the run started from the file: largest change {moved}");
    let o = hermetic::dropcompute()
        .args(["train", "--task", "text", "--ranks", "2", "--steps", "1", "--threshold", "off", "--init-params", s(&p)])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("d8h2n1f16p16") && err.contains("d32h2n1f64p512"), "{err}");
}

#[test]
fn a_digits_checkpoint_is_refused_by_a_text_run_naming_the_task() {
    let root = hermetic::temp_dir("resume-text-digits");
    let ck = root.path().join("ck");
    let o = hermetic::dropcompute()
        .args(["train", "--ranks", "4", "--steps", "2", "--no-compare", "--threshold", "off"])
        .args(["--time-mode", "virtual", "--checkpoint-every", "2", "--checkpoint-dir", s(&ck)])
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = dropcompute(&["--steps", "4", "--threshold", "off", "--resume", s(&ck)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--task was digits, this run has text"), "{err}");
}
