//! A compiled graph and its launches.
//!
//! Owns: [`GraphRecipe`] (the recipe with the checked launch id of every persistent tensor,
//! the workspace size and how long the compile took), [`GraphArg`] (a persistent tensor bound
//! to a device buffer) and `GraphRecipe::launch`, which checks every binding before the C call:
//! each persistent tensor bound exactly once, on the stream's device, to a buffer large enough,
//! and a workspace of the recipe's size when it needs one. Must not touch: graph building.

use std::marker::PhantomData;
use std::time::Duration;

use std::ffi::CString;

use habana_sys::{HABANA_DIM_MAX, synLaunchTensorInfo, synLaunchTensorInfoExt, synTensorType};

use super::super::error::{Error, Result};
use super::super::memory::{DeviceBuffer, DeviceRepr};
use super::super::recipe::Recipe;
use super::super::result;
use super::super::stream::{Event, Stream};
use super::layout::DType;

/// A tensor of a `GraphBuilder` (and of the [`GraphRecipe`] compiled from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorId(pub(super) usize);

/// One tensor of a compiled graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledTensor {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// Launch id (persistent tensors only; checked against the all-ones invalid id).
    pub id: Option<u64>,
    /// (section index, byte offset) of a persistent tensor.
    pub section: Option<(usize, u64)>,
    /// Marked external ([`super::GraphBuilder::set_external`]): an event can be mapped to it.
    pub external: bool,
}

impl CompiledTensor {
    /// Bytes of the tensor.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size() as u64
    }
}

/// Where a [`GraphRecipe`] came from, and how long that took on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecipeOrigin {
    /// `synGraphCompile`, taking this long.
    Compiled(Duration),
    /// A recipe cache file (`synRecipeDeSerialize` and the id lookups), taking this long.
    Cache(Duration),
}

/// A compiled graph: launch it as often as needed, with new buffers each time.
#[derive(Debug)]
pub struct GraphRecipe {
    recipe: Recipe,
    name: String,
    tensors: Vec<CompiledTensor>,
    workspace: u64,
    origin: RecipeOrigin,
}

/// A persistent tensor bound to a device buffer for one launch (borrows the buffer).
#[derive(Debug, Clone, Copy)]
pub struct GraphArg<'a> {
    tensor: TensorId,
    addr: u64,
    bytes: u64,
    device: u32,
    _buf: PhantomData<&'a ()>,
}

impl<'a> GraphArg<'a> {
    /// Binds `tensor` to `buf` (any element type: the byte size is checked at launch).
    pub fn new<T: DeviceRepr>(tensor: TensorId, buf: &'a DeviceBuffer<T>) -> Self {
        Self { tensor, addr: buf.addr(), bytes: buf.bytes() as u64, device: buf.device().id(), _buf: PhantomData }
    }

    /// Binds `tensor` to the bytes of `buf` from `byte_offset` on: the tensors of one section
    /// at their section offsets (e.g. the layers of a flat parameter vector), since the runtime
    /// derives a section's base as each tensor's address minus its offset (`graph_api.md` §5).
    /// An offset at or past the end leaves 0 bytes, refused at launch as too small.
    pub fn at<T: DeviceRepr>(tensor: TensorId, buf: &'a DeviceBuffer<T>, byte_offset: u64) -> Self {
        let total = buf.bytes() as u64;
        let off = byte_offset.min(total);
        Self { tensor, addr: buf.addr() + off, bytes: total - off, device: buf.device().id(), _buf: PhantomData }
    }
}

impl GraphRecipe {
    pub(super) fn new(
        recipe: Recipe,
        name: String,
        tensors: Vec<CompiledTensor>,
        workspace: u64,
        origin: RecipeOrigin,
    ) -> Self {
        Self { recipe, name, tensors, workspace, origin }
    }

    /// The recipe (to serialize it, or launch it by raw ids).
    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    /// The recipe name given to compile.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Workspace bytes a launch needs (`synWorkspaceGetSize`).
    pub fn workspace_size(&self) -> u64 {
        self.workspace
    }

    /// Compiled now or loaded from a recipe cache, and the host time it took.
    pub fn origin(&self) -> RecipeOrigin {
        self.origin
    }

    /// The compiled tensor `t` (`None` for a tensor of another graph).
    pub fn tensor(&self, t: TensorId) -> Option<&CompiledTensor> {
        self.tensors.get(t.0)
    }

    /// Every tensor, in creation order.
    pub fn tensors(&self) -> &[CompiledTensor] {
        &self.tensors
    }

    /// Maps `event` to external tensor `t` (`synEventMapTensor`): a later launch of this recipe
    /// given `event` among its `signal` events records it when the node producing `t` ends,
    /// which may be before the launch ends (wait for it with [`Stream::wait_event`] on another
    /// stream). A later map of the same event replaces this one. The ≈1.16 runtime does not
    /// give the time of a mapped event (`synEventElapsedTime`) nor synchronize on it on
    /// Gaudi1; wait for it from a stream instead.
    ///
    /// # Errors
    /// Before the C call: [`Error::InvalidArgument`] naming the tensor and the recipe when `t`
    /// is not a persistent tensor of this recipe or was not marked external before compile.
    /// [`Error::Synapse`] from `synEventMapTensor` (synFail for a tensor the runtime cannot
    /// map, e.g. one no node writes).
    pub fn map_event(&self, event: &Event, t: TensorId) -> Result<()> {
        let bad = |why: &str| Error::InvalidArgument {
            what: "mapped tensor",
            value: format!("{t:?} {why} of recipe {}", self.name),
        };
        let c = self.tensors.get(t.0).ok_or_else(|| bad("is not a tensor"))?;
        let id = c.id.ok_or_else(|| bad(&format!("({}) is not a persistent tensor", c.name)))?;
        if !c.external {
            return Err(bad(&format!("({}) is not external (GraphBuilder::set_external before compile)", c.name)));
        }
        let name = CString::new(c.name.as_str())
            .map_err(|_| Error::InvalidArgument { what: "tensor name", value: c.name.clone() })?;
        let info = synLaunchTensorInfo {
            tensorName: name.as_ptr(),
            pTensorAddress: 0,
            tensorType: synTensorType::DATA_TENSOR,
            tensorSize: [0; HABANA_DIM_MAX],
            tensorId: id,
        };
        let mut ev = [event.raw()];
        // SAFETY: live recipe (owned) and event (borrowed); the name outlives the call.
        unsafe { result::event_map_tensor(event.device().api(), &mut ev, &[info], self.recipe.raw()) }
    }

    /// Enqueues one execution on `stream` with `args` bound (`synLaunchWithExternalEventsExt`,
    /// bound by id). Each of `signal` is recorded when the node producing its mapped tensor
    /// ends (an event given to [`GraphRecipe::map_event`] for this recipe) or, unmapped, at
    /// completion.
    ///
    /// # Errors
    /// Before any C call: [`Error::InvalidArgument`] for a tensor that is not persistent or of
    /// another graph, bound twice, or missing (naming it), a buffer or event of another device,
    /// a missing or too small workspace; [`Error::SizeMismatch`] for a buffer smaller than its
    /// tensor. [`Error::Synapse`] when the runtime rejects the launch.
    pub fn launch(
        &self,
        stream: &Stream,
        args: &[GraphArg<'_>],
        workspace: Option<&DeviceBuffer<u8>>,
        signal: &[&Event],
    ) -> Result<()> {
        let dev = stream.device().id();
        let mut bound = vec![false; self.tensors.len()];
        let mut infos = Vec::with_capacity(args.len());
        for a in args {
            let t = self.tensors.get(a.tensor.0).filter(|t| t.id.is_some()).ok_or_else(|| Error::InvalidArgument {
                what: "launch tensor",
                value: format!("{:?} is not a persistent tensor of recipe {}", a.tensor, self.name),
            })?;
            if std::mem::replace(&mut bound[a.tensor.0], true) {
                return Err(Error::InvalidArgument { what: "launch tensor", value: format!("{} bound twice", t.name) });
            }
            if a.device != dev {
                return Err(Error::InvalidArgument {
                    what: "launch tensor device",
                    value: format!("tensor {}: buffer on device {} launched on device {dev}", t.name, a.device),
                });
            }
            if a.bytes < t.bytes() {
                return Err(Error::SizeMismatch {
                    what: "graph tensor buffer bytes",
                    expected: t.bytes() as usize,
                    got: a.bytes as usize,
                });
            }
            infos.push(synLaunchTensorInfoExt {
                tensorName: std::ptr::null(),
                pTensorAddress: a.addr,
                tensorType: synTensorType::DATA_TENSOR,
                tensorSize: [0; HABANA_DIM_MAX],
                tensorId: t.id.expect("filtered above"),
            });
        }
        if let Some(t) = self.tensors.iter().zip(&bound).find(|(t, b)| t.id.is_some() && !**b).map(|(t, _)| t) {
            return Err(Error::InvalidArgument {
                what: "launch tensors",
                value: format!("persistent tensor {} is not bound", t.name),
            });
        }
        let ws = match (self.workspace, workspace) {
            (0, _) => 0,
            (need, Some(w)) if w.bytes() as u64 >= need && w.device().id() == dev => w.addr(),
            (need, w) => {
                return Err(Error::InvalidArgument {
                    what: "workspace",
                    value: format!(
                        "recipe {} needs {need} bytes on device {dev}, got {:?}",
                        self.name,
                        w.map(|w| w.bytes())
                    ),
                });
            }
        };
        if let Some(e) = signal.iter().find(|e| e.device().id() != dev) {
            return Err(Error::InvalidArgument {
                what: "launch event device",
                value: format!("event of device {} signalled by a launch on device {dev}", e.device().id()),
            });
        }
        let mut events: Vec<_> = signal.iter().map(|e| e.raw()).collect();
        // SAFETY: stream, recipe and events are live (borrowed); every address is a live
        // `DeviceBuffer` borrowed for the call and at least as large as its tensor; the
        // workspace is large enough; ids come from this recipe.
        unsafe {
            result::launch_ext(stream.device().api(), stream.raw(), &infos, ws, self.recipe.raw(), &mut events, 0)
        }
    }
}
