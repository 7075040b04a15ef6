//! JSON mock recipes loaded through the runtime: a test tool, never the product path. A recipe
//! names a kernel registered with the CPU mock (`crate::mock::MockRecipe`), so it runs only on
//! the mock; its device time is a base latency the recipe states, which lets tests script
//! latencies per recipe name and inject faults (`tests/scheduler.rs`), and gives
//! `bench scheduler` an empty kernel to isolate the scheduler's host cost.
//!
//! Owns: [`load`] and [`gradient_ops`] (the scheduler's four gradient operations as JSON
//! recipes). Must not touch: the scheduler or `train`, which launch device graphs only
//! (`schedule::GradientOps::graphs`, `train::model_graphs`; `ci/no_mock_check.sh`).
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::mock::MockRecipe;
use crate::schedule::{GradDtype, GradientOps, GradientRecipes};
use crate::synapse::{Error, Recipe, Result, Runtime};

/// Emulated HBM bandwidth used to cost the mock gradient recipes (bytes per ns = GB/s): 1 TB/s,
/// the order of Gaudi2's 2.46 TB/s HBM2E at realistic efficiency.
const MOCK_HBM_BYTES_PER_NS: u64 = 1000;

/// Generates and loads the mock recipes for a gradient of `len` elements whose micro-batch
/// gradient has type `dtype`. Recipe files are written to the temp dir and removed after
/// loading.
///
/// # Errors
/// [`Error::InvalidArgument`] when a recipe file cannot be written; [`Error::Synapse`] when
/// the runtime rejects it (e.g. not the mock).
pub fn gradient_ops(rt: &Arc<Runtime>, len: usize, dtype: GradDtype) -> Result<GradientOps> {
    let f32_bytes = (len * 4) as u64;
    let x_bytes = match dtype {
        GradDtype::F32 => f32_bytes,
        GradDtype::Bf16 => (len * 2) as u64,
    };
    let acc_kernel = match dtype {
        GradDtype::F32 => "accumulate_f32",
        GradDtype::Bf16 => "accumulate_bf16_to_f32",
    };
    let cost = |bytes: u64| bytes / MOCK_HBM_BYTES_PER_NS;
    let zero = MockRecipe::new("grad_zero", "fill_f32").tensor("out", f32_bytes).params(vec![0.0]);
    let acc = MockRecipe::new("grad_accumulate", acc_kernel).tensor("acc", f32_bytes).tensor("x", x_bytes);
    let nonfinite = MockRecipe::new("grad_nonfinite", "nonfinite_flag_f32").tensor("flag", 4).tensor("x", f32_bytes);
    let scale = MockRecipe::new("grad_scale", "scale_f32").tensor("x", f32_bytes).tensor("scale", 4);
    GradientOps::from_recipes(GradientRecipes {
        zero: load(rt, zero.base_latency_ns(cost(f32_bytes)))?,
        accumulate: load(rt, acc.base_latency_ns(cost(2 * f32_bytes + x_bytes)))?,
        nonfinite: load(rt, nonfinite.base_latency_ns(cost(f32_bytes)))?,
        scale: load(rt, scale.base_latency_ns(cost(2 * f32_bytes)))?,
    })
}

/// Writes `recipe` to a unique temp file, loads it through the runtime and removes the file.
///
/// # Errors
/// [`Error::InvalidArgument`] when the file cannot be written; the runtime's load error.
pub fn load(rt: &Arc<Runtime>, recipe: MockRecipe) -> Result<Recipe> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("dropcompute-{}-{n}-{}.json", std::process::id(), recipe.name));
    recipe
        .write(&path)
        .map_err(|e| Error::InvalidArgument { what: "mock recipe file", value: format!("{}: {e}", path.display()) })?;
    let r = Recipe::load(rt, Path::new(&path));
    let _ = std::fs::remove_file(&path);
    r
}
