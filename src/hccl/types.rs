//! Element types, reduction operations and the unique id of HCCL.
//!
//! Owns: [`HcclType`] (sealed: f32, bf16, f16, i32, u32 — the types Habana documents as
//! supported), [`ReduceOp`] (Sum, Min, Max only: `hcclProd` and `hcclAvg` are not supported by
//! Habana, so they cannot be named), [`UniqueId`].

use habana_sys::{HCCL_UNIQUE_ID_MAX_BYTES, hcclDataType_t, hcclRedOp_t, hcclUniqueId};

use super::error::{HcclError, Result};
use crate::synapse::DeviceRepr;

mod sealed {
    pub trait Sealed {}
}

/// Element types HCCL reduces (Habana's C API docs: f32, bf16, f16, i32, u32). Sealed: a
/// collective over any other type does not compile.
pub trait HcclType: sealed::Sealed + DeviceRepr {
    /// The `hcclDataType_t` tag.
    const HCCL: hcclDataType_t;
}

macro_rules! hccl_type {
    ($t:ty, $tag:ident) => {
        impl sealed::Sealed for $t {}
        impl HcclType for $t {
            const HCCL: hcclDataType_t = hcclDataType_t::$tag;
        }
    };
}
hccl_type!(f32, FLOAT32);
hccl_type!(half::bf16, BFLOAT16);
hccl_type!(half::f16, FLOAT16);
hccl_type!(i32, INT32);
hccl_type!(u32, UINT32);

/// A reduction. Maps to `hcclSum = 0`, `hcclMin = 2`, `hcclMax = 3` (note: Min and Max are the
/// reverse of NCCL's numbering; `hccl_types.h` 1.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
}

impl ReduceOp {
    /// The raw `hcclRedOp_t`.
    pub fn raw(self) -> hcclRedOp_t {
        match self {
            ReduceOp::Sum => hcclRedOp_t::SUM,
            ReduceOp::Min => hcclRedOp_t::MIN,
            ReduceOp::Max => hcclRedOp_t::MAX,
        }
    }
}

/// A communicator's unique id: created by rank 0 (`hcclGetUniqueId`), sent to every other rank
/// out of band (e.g. [`super::rendezvous`]), passed by value to `hcclCommInitRank`.
#[derive(Clone, Copy)]
pub struct UniqueId(pub(crate) hcclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({} bytes)", self.0.length)
    }
}

impl UniqueId {
    /// An all-zero id: what every rank passes when `HCCL_COMM_ID=IP:PORT` tells the library
    /// where rank 0's coordinator is (the vendor's no-out-of-band mode).
    pub fn zeroed() -> Self {
        Self(hcclUniqueId::default())
    }

    /// The meaningful bytes (`internal[..length]`), for sending to the other ranks.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal[..self.0.length.min(HCCL_UNIQUE_ID_MAX_BYTES)].to_vec()
    }

    /// Rebuilds an id from [`UniqueId::to_bytes`].
    ///
    /// # Errors
    /// [`HcclError::InvalidArgument`] when `bytes` is longer than 1024.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > HCCL_UNIQUE_ID_MAX_BYTES {
            return Err(HcclError::InvalidArgument { what: "unique id length", value: bytes.len().to_string() });
        }
        let mut id = hcclUniqueId::default();
        id.internal[..bytes.len()].copy_from_slice(bytes);
        id.length = bytes.len();
        Ok(Self(id))
    }
}
