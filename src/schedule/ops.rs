//! The scheduler's own device operations on the gradient: zero, accumulate a micro-batch
//! gradient into the f32 accumulator, flag non-finite values, rescale. Each is a recipe
//! launch of the foundation's kernels (`kernels/cpu` on the mock, `kernels/tpc` twins on Gaudi).
//!
//! Owns: [`GradientOps`] (the four recipes and their launches). Must not touch: the user's
//! recipes, collectives or the deadline.
//!
//! On the mock (cargo feature `mock`) the recipes are generated (`GradientOps::mock`); on a Gaudi host the four
//! recipes are compiled from `kernels/tpc` with the tensor names below and passed to
//! [`GradientOps::from_recipes`] (not verified on hardware; no tpc-clang here).

#[cfg(feature = "mock")]
use std::path::Path;
#[cfg(feature = "mock")]
use std::sync::Arc;
#[cfg(feature = "mock")]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "mock")]
use crate::mock::MockRecipe;
use crate::synapse::{DeviceBuffer, LaunchTensor, Recipe, Result, Stream};
#[cfg(feature = "mock")]
use crate::synapse::{Error, Runtime};

#[cfg(feature = "mock")]
use super::config::GradDtype;

/// The micro-batch gradient written by the user's recipe (overwritten each micro-batch).
pub enum GradientScratch {
    /// f32 gradient of `gradient_len` elements.
    F32(DeviceBuffer<f32>),
    /// bf16 gradient of `gradient_len` elements.
    Bf16(DeviceBuffer<half::bf16>),
}

impl GradientScratch {
    /// The f32 buffer, if this scratch is f32.
    pub fn as_f32_mut(&mut self) -> Option<&mut DeviceBuffer<f32>> {
        match self {
            GradientScratch::F32(b) => Some(b),
            GradientScratch::Bf16(_) => None,
        }
    }

    /// The bf16 buffer, if this scratch is bf16.
    pub fn as_bf16_mut(&mut self) -> Option<&mut DeviceBuffer<half::bf16>> {
        match self {
            GradientScratch::Bf16(b) => Some(b),
            GradientScratch::F32(_) => None,
        }
    }

    fn tensor(&self, id: u64) -> LaunchTensor<'_> {
        match self {
            GradientScratch::F32(b) => LaunchTensor::by_id(id, b),
            GradientScratch::Bf16(b) => LaunchTensor::by_id(id, b),
        }
    }
}

/// The four gradient recipes with their tensor ids resolved. Tensor names (and order):
/// - `zero`: `out` (f32, gradient_len) — `fill_f32` with value 0;
/// - `accumulate`: `acc` (f32), `x` (f32 or bf16) — acc += x;
/// - `nonfinite`: `flag` (4 bytes), `x` (f32) — flag = any non-finite in x;
/// - `scale`: `x` (f32), `scale` (one f32) — x *= scale.
pub struct GradientRecipes {
    /// `zero` recipe.
    pub zero: Recipe,
    /// `accumulate` recipe.
    pub accumulate: Recipe,
    /// `nonfinite` recipe.
    pub nonfinite: Recipe,
    /// `scale` recipe.
    pub scale: Recipe,
}

/// Launches of the gradient recipes with tensor ids looked up once.
pub struct GradientOps {
    r: GradientRecipes,
    ids: [[u64; 2]; 4],
}

/// Emulated HBM bandwidth used to cost the mock gradient recipes (bytes per ns = GB/s): 1 TB/s,
/// the order of Gaudi2's 2.46 TB/s HBM2E at realistic efficiency.
#[cfg(feature = "mock")]
const MOCK_HBM_BYTES_PER_NS: u64 = 1000;

impl GradientOps {
    /// Wraps compiled recipes (see [`GradientRecipes`] for the tensor names).
    ///
    /// # Errors
    /// [`Error`] when a recipe lacks one of its tensor names.
    pub fn from_recipes(r: GradientRecipes) -> Result<Self> {
        let two = |rec: &Recipe, a: &str, b: &str| -> Result<[u64; 2]> {
            let v = rec.tensor_ids(&[a, b])?;
            Ok([v[0], v[1]])
        };
        let zero = r.zero.tensor_ids(&["out"])?[0];
        let ids =
            [[zero, 0], two(&r.accumulate, "acc", "x")?, two(&r.nonfinite, "flag", "x")?, two(&r.scale, "x", "scale")?];
        Ok(Self { r, ids })
    }

    /// Generates and loads the mock recipes for a gradient of `len` elements whose micro-batch
    /// gradient has type `dtype`. Recipe files are written to the temp dir and removed after
    /// loading.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a recipe file cannot be written; [`Error::Synapse`] when
    /// the runtime rejects it (e.g. not the mock).
    #[cfg(feature = "mock")]
    pub fn mock(rt: &Arc<Runtime>, len: usize, dtype: GradDtype) -> Result<Self> {
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
        let nonfinite =
            MockRecipe::new("grad_nonfinite", "nonfinite_flag_f32").tensor("flag", 4).tensor("x", f32_bytes);
        let scale = MockRecipe::new("grad_scale", "scale_f32").tensor("x", f32_bytes).tensor("scale", 4);
        Self::from_recipes(GradientRecipes {
            zero: load_mock(rt, zero.base_latency_ns(cost(f32_bytes)))?,
            accumulate: load_mock(rt, acc.base_latency_ns(cost(2 * f32_bytes + x_bytes)))?,
            nonfinite: load_mock(rt, nonfinite.base_latency_ns(cost(f32_bytes)))?,
            scale: load_mock(rt, scale.base_latency_ns(cost(2 * f32_bytes)))?,
        })
    }

    /// Enqueues `acc = 0`.
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn zero(&self, s: &Stream, acc: &DeviceBuffer<f32>) -> Result<()> {
        s.launch(&self.r.zero, &[LaunchTensor::by_id(self.ids[0][0], acc)], None, &[])
    }

    /// Enqueues `acc += x`.
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn accumulate(&self, s: &Stream, acc: &DeviceBuffer<f32>, x: &GradientScratch) -> Result<()> {
        let [a, b] = self.ids[1];
        s.launch(&self.r.accumulate, &[LaunchTensor::by_id(a, acc), x.tensor(b)], None, &[])
    }

    /// Enqueues `flag[0] = any non-finite element of acc` (as u32 0/1).
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn nonfinite(&self, s: &Stream, flag: &DeviceBuffer<u32>, acc: &DeviceBuffer<f32>) -> Result<()> {
        let [a, b] = self.ids[2];
        s.launch(&self.r.nonfinite, &[LaunchTensor::by_id(a, flag), LaunchTensor::by_id(b, acc)], None, &[])
    }

    /// Enqueues `acc *= scale[0]`.
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn scale(&self, s: &Stream, acc: &DeviceBuffer<f32>, scale: &DeviceBuffer<f32>) -> Result<()> {
        let [a, b] = self.ids[3];
        s.launch(&self.r.scale, &[LaunchTensor::by_id(a, acc), LaunchTensor::by_id(b, scale)], None, &[])
    }
}

/// Writes `recipe` to a unique temp file, loads it through the runtime and removes the file.
///
/// # Errors
/// [`Error::InvalidArgument`] when the file cannot be written; the runtime's load error.
#[cfg(feature = "mock")]
pub fn load_mock(rt: &Arc<Runtime>, recipe: MockRecipe) -> Result<Recipe> {
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
