//! Recipes (compiled device graphs) and launching them on a stream.
//!
//! Owns: [`Recipe`] (deserialize, tensor ids, workspace, attributes, serialize) and
//! `Stream::launch` with [`LaunchTensor`] bindings by id or by name.
//! Must not touch: memory allocation (buffers are borrowed) or scheduling policy.

use std::ffi::CString;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use habana_sys::{
    HABANA_DIM_MAX, SYN_FLAGS_TENSOR_NAME, synDataType, synLaunchTensorInfoExt, synRecipeAttribute, synRecipeHandle,
    synTensorType,
};

use super::error::{Error, Result};
use super::graph::layout::row_major_shape;
use super::memory::{DeviceBuffer, DeviceRepr};
use super::result;
use super::runtime::Runtime;
use super::stream::{Event, Stream};

/// A recipe: a graph compiled for the device, loaded from a file (`synRecipeDeSerialize`). On the
/// CPU mock the file is a mock recipe naming a registered kernel (see `crate::mock`).
///
/// `Send` but not `Sync`. `Drop` destroys it (best effort); do not drop a recipe while launches of
/// it are queued.
#[derive(Debug)]
pub struct Recipe {
    rt: Arc<Runtime>,
    handle: synRecipeHandle,
}

// SAFETY: the handle is an opaque token usable from any thread; not `Sync`.
unsafe impl Send for Recipe {}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::InvalidArgument { what: "recipe path", value: path.display().to_string() })
}

/// One tensor a launch of a [`Recipe`] binds, as the runtime describes it
/// ([`Recipe::launch_tensors`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchTensorInfo {
    /// Tensor name.
    pub name: String,
    /// Launch id (bind with [`LaunchTensor::by_id`]).
    pub id: u64,
    /// Element type (C tag; [`super::graph::DType::from_syn`] for graph tensors).
    pub dtype: synDataType,
    /// Row-major shape (the runtime's max sizes, converted by the graph layer's `layout.rs`).
    pub shape: Vec<u64>,
    /// The recipe's id of the tensor's section.
    pub section: u32,
    /// Byte offset of the tensor in its section.
    pub offset: u64,
    /// True when some node reads the tensor.
    pub is_input: bool,
}

impl LaunchTensorInfo {
    /// Bytes of the tensor, `None` for an element type graphs here do not use.
    pub fn bytes(&self) -> Option<u64> {
        let size = super::graph::DType::from_syn(self.dtype)?.size() as u64;
        Some(self.shape.iter().product::<u64>() * size)
    }
}

impl Recipe {
    /// Wraps a live recipe handle (from `synGraphCompile`); the `Recipe` destroys it.
    pub(crate) fn from_raw(rt: &Arc<Runtime>, handle: synRecipeHandle) -> Self {
        Self { rt: rt.clone(), handle }
    }

    /// The raw handle (valid while `self` lives).
    pub fn raw(&self) -> synRecipeHandle {
        self.handle
    }

    /// Loads a serialized recipe from `path`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a path with an interior NUL; [`Error::Synapse`] when the
    /// file is missing or not a recipe.
    pub fn load(rt: &Arc<Runtime>, path: &Path) -> Result<Self> {
        let handle = result::recipe_deserialize(rt.api(), &c_path(path)?)?;
        Ok(Self { rt: rt.clone(), handle })
    }

    /// Writes the recipe to `path` (`synRecipeSerialize`).
    ///
    /// # Errors
    /// As [`Recipe::load`].
    pub fn save(&self, path: &Path) -> Result<()> {
        // SAFETY: live handle.
        unsafe { result::recipe_serialize(self.rt.api(), self.handle, &c_path(path)?) }
    }

    /// Ids of every tensor that must be bound at launch, in the recipe's order.
    ///
    /// # Errors
    /// [`Error::Synapse`].
    pub fn launch_ids(&self) -> Result<Vec<u64>> {
        // SAFETY: live handle.
        unsafe { result::tensor_launch_ids(self.rt.api(), self.handle) }
    }

    /// What the recipe says of every tensor a launch binds (`synTensorRetrieveLaunchAmount`,
    /// `synTensorRetrieveLaunchIds`, `synTensorRetrieveLaunchInfoById`), in launch-id order:
    /// enough to allocate and bind buffers for a recipe loaded from a file.
    ///
    /// # Errors
    /// [`Error::Synapse`] from any of the three calls.
    pub fn launch_tensors(&self) -> Result<Vec<LaunchTensorInfo>> {
        let ids = self.launch_ids()?;
        // SAFETY: live handle.
        let infos = unsafe { result::launch_info_by_id(self.rt.api(), self.handle, &ids) }?;
        Ok(infos
            .iter()
            .map(|i| {
                let name: Vec<u8> = i.tensorName.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
                LaunchTensorInfo {
                    name: String::from_utf8_lossy(&name).into_owned(),
                    id: i.tensorId,
                    dtype: i.tensorDataType,
                    shape: row_major_shape(&i.tensorMaxSize, i.tensorDims),
                    section: i.tensorSectionId,
                    offset: i.tensorOffsetInSection,
                    is_input: i.isInput != 0,
                }
            })
            .collect())
    }

    /// Ids of the named tensors, in the order given. The runtime answers an unknown name with
    /// success and the all-ones id (`TENSOR_INVALID_ID`), which a launch would silently skip;
    /// that id is turned into an error here.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name with NUL; [`Error::UnknownTensor`] for a name the
    /// recipe does not have; [`Error::Synapse`] when the call fails.
    pub fn tensor_ids(&self, names: &[&str]) -> Result<Vec<u64>> {
        let c: Vec<CString> = names
            .iter()
            .map(|n| CString::new(*n).map_err(|_| Error::InvalidArgument { what: "tensor name", value: n.to_string() }))
            .collect::<Result<_>>()?;
        // SAFETY: live handle.
        let ids = unsafe { result::tensor_ids(self.rt.api(), self.handle, &c) }?;
        if let Some(i) = ids.iter().position(|&id| id == habana_sys::TENSOR_INVALID_ID) {
            return Err(Error::UnknownTensor { recipe: "(loaded recipe)".into(), tensor: names[i].to_string() });
        }
        Ok(ids)
    }

    /// Workspace the launch needs, in bytes (`synWorkspaceGetSize`).
    ///
    /// # Errors
    /// [`Error::Synapse`].
    pub fn workspace_size(&self) -> Result<u64> {
        // SAFETY: live handle.
        unsafe { result::workspace_size(self.rt.api(), self.handle) }
    }

    /// One recipe attribute (`synRecipeGetAttribute`).
    ///
    /// # Errors
    /// [`Error::Synapse`].
    pub fn attribute(&self, attr: synRecipeAttribute) -> Result<u64> {
        // SAFETY: live handle.
        unsafe { result::recipe_attribute(self.rt.api(), self.handle, attr) }
    }
}

impl Drop for Recipe {
    fn drop(&mut self) {
        // SAFETY: live handle, never used again.
        if let Err(e) = unsafe { result::recipe_destroy(self.rt.api(), self.handle) } {
            tracing::warn!(error = %e, "best-effort recipe destroy failed");
        }
    }
}

/// How a launch tensor is identified.
#[derive(Debug, Clone)]
enum Binding {
    Id(u64),
    Name(CString),
}

/// One tensor bound at launch: a recipe tensor (by id or by name) and the device buffer that
/// backs it. Borrows the buffer for the call.
#[derive(Debug, Clone)]
pub struct LaunchTensor<'a> {
    binding: Binding,
    addr: u64,
    device: u32,
    _buf: PhantomData<&'a ()>,
}

impl<'a> LaunchTensor<'a> {
    /// Binds recipe tensor `id` (from [`Recipe::tensor_ids`] / [`Recipe::launch_ids`]) to `buf`.
    pub fn by_id<T: DeviceRepr>(id: u64, buf: &'a DeviceBuffer<T>) -> Self {
        Self { binding: Binding::Id(id), addr: buf.addr(), device: buf.device().id(), _buf: PhantomData }
    }

    /// Binds the recipe tensor named `name` to `buf`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name containing NUL or longer than the vendor's limit.
    pub fn by_name<T: DeviceRepr>(name: &str, buf: &'a DeviceBuffer<T>) -> Result<Self> {
        if name.len() >= habana_sys::ENQUEUE_TENSOR_NAME_MAX_SIZE {
            return Err(Error::InvalidArgument { what: "tensor name", value: name.to_string() });
        }
        let c =
            CString::new(name).map_err(|_| Error::InvalidArgument { what: "tensor name", value: name.to_string() })?;
        Ok(Self { binding: Binding::Name(c), addr: buf.addr(), device: buf.device().id(), _buf: PhantomData })
    }
}

impl Stream {
    /// Enqueues one execution of `recipe` (`synLaunchWithExternalEventsExt`) with `tensors`
    /// bound, an optional workspace, and `signal` events recorded when the launch completes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when bindings mix ids and names, or a buffer or event is on
    /// another device (checked before any C call); [`Error::Synapse`] when the runtime rejects
    /// the launch (unknown id or name, missing tensor, buffer too small, ...).
    pub fn launch(
        &self,
        recipe: &Recipe,
        tensors: &[LaunchTensor<'_>],
        workspace: Option<&DeviceBuffer<u8>>,
        signal: &[&Event],
    ) -> Result<()> {
        let by_name = matches!(tensors.first().map(|t| &t.binding), Some(Binding::Name(_)));
        let dev = self.device().id();
        let mut infos = Vec::with_capacity(tensors.len());
        for t in tensors {
            if t.device != dev {
                return Err(Error::InvalidArgument {
                    what: "launch tensor device",
                    value: format!("buffer on device {} launched on device {dev}", t.device),
                });
            }
            let (name, id) = match (&t.binding, by_name) {
                (Binding::Name(n), true) => (n.as_ptr(), 0),
                (Binding::Id(i), false) => (std::ptr::null(), *i),
                _ => {
                    return Err(Error::InvalidArgument {
                        what: "launch bindings",
                        value: "tensors must all be bound by id or all by name".into(),
                    });
                }
            };
            infos.push(synLaunchTensorInfoExt {
                tensorName: name,
                pTensorAddress: t.addr,
                tensorType: synTensorType::DATA_TENSOR,
                tensorSize: [0; HABANA_DIM_MAX],
                tensorId: id,
            });
        }
        if let Some(e) = signal.iter().find(|e| e.device().id() != dev) {
            return Err(Error::InvalidArgument {
                what: "launch event device",
                value: format!("event of device {} signalled by a launch on device {dev}", e.device().id()),
            });
        }
        let mut events: Vec<_> = signal.iter().map(|e| e.raw()).collect();
        let flags = if by_name { SYN_FLAGS_TENSOR_NAME } else { 0 };
        let ws = workspace.map(|w| w.addr()).unwrap_or(0);
        // SAFETY: stream, recipe and events are live (borrowed); every address comes from a
        // live `DeviceBuffer` borrowed for the call; names are NUL-terminated `CString`s owned
        // by `tensors`, alive for the call.
        unsafe { result::launch_ext(self.device().api(), self.raw(), &infos, ws, recipe.handle, &mut events, flags) }
    }
}
