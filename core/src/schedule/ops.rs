//! The scheduler's own device operations on the gradient: zero, accumulate a micro-batch
//! gradient into the f32 accumulator, flag non-finite values, rescale.
//!
//! Owns: [`GradientOps`] (the four operations and their launches). Must not touch: the user's
//! recipes, collectives or the deadline.
//!
//! Three ways to build them:
//! - [`GradientOps::graphs`]: four device graphs built with `synapse::graph` from vendor GUIDs
//!   (memset, cast_bf16_to_f32, add_fwd_f32, reduce_sum_multi_dim_fwd_f32, constant_f32,
//!   mult_fwd_f32), compiled once; runs on libSynapse and on the CPU mock alike (the product
//!   path; on hardware not verified here);
//! - [`GradientOps::from_recipes`]: four precompiled recipes with the tensor names of
//!   [`GradientRecipes`] (e.g. from `kernels/tpc`);
//! - the same four operations as JSON recipes of the CPU mock (a test tool for latency scripts
//!   and faults, and the bare loop of `bench scheduler`) live outside the scheduler, in the
//!   crate's mock-recipe module (cargo feature `mock`).

use crate::synapse::graph::{CastRounding, DType, GraphArg, GraphBuilder, GraphRecipe, Op, TensorId};
use crate::synapse::{Device, DeviceBuffer, LaunchTensor, Recipe, Result, Stream};

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

/// Launches of the gradient operations (recipes with tensor ids looked up once, or graphs).
pub struct GradientOps {
    inner: Inner,
}

enum Inner {
    Recipes { r: GradientRecipes, ids: [[u64; 2]; 4] },
    Graphs(Box<GradientGraphs>),
}

/// The four compiled gradient graphs, their tensors and one workspace (the scheduler launches
/// them on one stream, in order, so one workspace serves all four).
struct GradientGraphs {
    zero: (GraphRecipe, TensorId),
    /// acc, x, acc_out (acc and acc_out share a section: in place).
    accumulate: (GraphRecipe, [TensorId; 3]),
    /// flag, acc.
    nonfinite: (GraphRecipe, [TensorId; 2]),
    /// x, scale, x_out (x and x_out share a section).
    scale: (GraphRecipe, [TensorId; 3]),
    workspace: Option<DeviceBuffer<u8>>,
}

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
        Ok(Self { inner: Inner::Recipes { r, ids } })
    }

    /// Builds and compiles the four gradient graphs for a gradient of `len` elements whose
    /// micro-batch gradient has type `dtype`, for `dev`'s device type, and allocates their
    /// workspace on `dev`:
    /// - zero: `memset` of the f32 accumulator;
    /// - accumulate: acc ← acc + x in place (acc and its output share one section), a bf16
    ///   gradient first cast to f32 (`cast_bf16_to_f32`, round to nearest even);
    /// - non-finite: flag ← Σ acc · 0 + 0 (`reduce_sum_multi_dim_fwd_f32`, then `mult_fwd_f32`
    ///   and `add_fwd_f32` with a `constant_f32` zero), written into the 4-byte flag: its bits
    ///   are 0 when every element is finite (−0 + 0 = +0) and a NaN otherwise, since NaN and ±∞
    ///   propagate through the sum. An f32 overflow of the sum itself also flags (the reference
    ///   notes accept this for the cheapest robust check, `graph_api.md` §4);
    /// - scale: x ← x · scale[0] in place, the scalar a device tensor of shape [1] (a changing
    ///   value needs no recompile).
    ///
    /// # Errors
    /// [`crate::synapse::Error`] from building, compiling (e.g. a runtime without these GUIDs)
    /// or the workspace allocation.
    pub fn graphs(dev: &Device, len: usize, dtype: GradDtype) -> Result<Self> {
        let rt = dev.runtime();
        let dt = dev.info()?.device_type;
        let n = [len as u64];
        let f = DType::F32;
        // zero
        let mut g = GraphBuilder::new(rt, dt)?;
        let out = g.persistent("out", f, &n)?;
        g.node("zero", &Op::Zero, &[], &[out])?;
        let zero = (g.compile("grad_zero")?, out);
        // accumulate
        let mut g = GraphBuilder::new(rt, dt)?;
        let sec = g.section()?;
        let acc = g.persistent_in(sec, 0, "acc", f, &n)?;
        let acc_out = g.persistent_in(sec, 0, "acc_out", f, &n)?;
        let x = match dtype {
            GradDtype::F32 => g.persistent("x", f, &n)?,
            GradDtype::Bf16 => {
                let xb = g.persistent("x", DType::Bf16, &n)?;
                let x32 = g.workspace("x_f32", f, &n)?;
                g.node("cast", &Op::Cast { rounding: CastRounding::NearestEven }, &[xb], &[x32])?;
                g.node("add", &Op::Add, &[acc, x32], &[acc_out])?;
                xb
            }
        };
        if dtype == GradDtype::F32 {
            g.node("add", &Op::Add, &[acc, x], &[acc_out])?;
        }
        let accumulate = (g.compile("grad_accumulate")?, [acc, x, acc_out]);
        // non-finite
        let mut g = GraphBuilder::new(rt, dt)?;
        let x = g.persistent("x", f, &n)?;
        let flag = g.persistent("flag", f, &[1])?;
        let sum = g.workspace("sum", f, &[1])?;
        let zero_c = g.workspace("zero", f, &[1])?;
        let prod = g.workspace("sum_times_zero", f, &[1])?;
        g.node("sum", &Op::ReduceSumAxes { axes: vec![], keep_dims: false }, &[x], &[sum])?;
        g.node("zero", &Op::Constant { value: 0.0 }, &[], &[zero_c])?;
        g.node("times_zero", &Op::Mul, &[sum, zero_c], &[prod])?;
        g.node("plus_zero", &Op::Add, &[prod, zero_c], &[flag])?;
        let nonfinite = (g.compile("grad_nonfinite")?, [flag, x]);
        // scale
        let mut g = GraphBuilder::new(rt, dt)?;
        let sec = g.section()?;
        let x = g.persistent_in(sec, 0, "x", f, &n)?;
        let x_out = g.persistent_in(sec, 0, "x_out", f, &n)?;
        let s = g.persistent("scale", f, &[1])?;
        g.node("scale", &Op::Mul, &[x, s], &[x_out])?;
        let scale = (g.compile("grad_scale")?, [x, s, x_out]);
        let ws = [&zero.0, &accumulate.0, &nonfinite.0, &scale.0].iter().map(|r| r.workspace_size()).max().unwrap_or(0);
        let workspace = if ws > 0 { Some(DeviceBuffer::alloc(dev, ws as usize)?) } else { None };
        Ok(Self { inner: Inner::Graphs(Box::new(GradientGraphs { zero, accumulate, nonfinite, scale, workspace })) })
    }

    /// Enqueues `acc = 0`.
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn zero(&self, s: &Stream, acc: &DeviceBuffer<f32>) -> Result<()> {
        match &self.inner {
            Inner::Recipes { r, ids } => s.launch(&r.zero, &[LaunchTensor::by_id(ids[0][0], acc)], None, &[]),
            Inner::Graphs(g) => g.zero.0.launch(s, &[GraphArg::new(g.zero.1, acc)], g.workspace.as_ref(), &[]),
        }
    }

    /// Enqueues `acc += x`.
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn accumulate(&self, s: &Stream, acc: &DeviceBuffer<f32>, x: &GradientScratch) -> Result<()> {
        match &self.inner {
            Inner::Recipes { r, ids } => {
                let [a, b] = ids[1];
                s.launch(&r.accumulate, &[LaunchTensor::by_id(a, acc), x.tensor(b)], None, &[])
            }
            Inner::Graphs(g) => {
                let (r, [ta, tx, to]) = &g.accumulate;
                let xa = match x {
                    GradientScratch::F32(b) => GraphArg::new(*tx, b),
                    GradientScratch::Bf16(b) => GraphArg::new(*tx, b),
                };
                r.launch(s, &[GraphArg::new(*ta, acc), xa, GraphArg::new(*to, acc)], g.workspace.as_ref(), &[])
            }
        }
    }

    /// Enqueues `flag[0] = nonzero when acc has a non-finite element` (recipes: u32 0/1;
    /// graphs: the bits of an f32 that is +0 or NaN, see [`GradientOps::graphs`]).
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn nonfinite(&self, s: &Stream, flag: &DeviceBuffer<u32>, acc: &DeviceBuffer<f32>) -> Result<()> {
        match &self.inner {
            Inner::Recipes { r, ids } => {
                let [a, b] = ids[2];
                s.launch(&r.nonfinite, &[LaunchTensor::by_id(a, flag), LaunchTensor::by_id(b, acc)], None, &[])
            }
            Inner::Graphs(g) => {
                let (r, [tf, tx]) = &g.nonfinite;
                r.launch(s, &[GraphArg::new(*tf, flag), GraphArg::new(*tx, acc)], g.workspace.as_ref(), &[])
            }
        }
    }

    /// Enqueues `acc *= scale[0]`.
    ///
    /// # Errors
    /// [`Error`] from the launch.
    pub fn scale(&self, s: &Stream, acc: &DeviceBuffer<f32>, scale: &DeviceBuffer<f32>) -> Result<()> {
        match &self.inner {
            Inner::Recipes { r, ids } => {
                let [a, b] = ids[3];
                s.launch(&r.scale, &[LaunchTensor::by_id(a, acc), LaunchTensor::by_id(b, scale)], None, &[])
            }
            Inner::Graphs(g) => {
                let (r, [tx, ts, to]) = &g.scale;
                let args = [GraphArg::new(*tx, acc), GraphArg::new(*ts, scale), GraphArg::new(*to, acc)];
                r.launch(s, &args, g.workspace.as_ref(), &[])
            }
        }
    }
}
