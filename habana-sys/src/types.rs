//! `#[repr(C)]` types, status codes and enum values of the SynapseAI runtime and HCCL.
//!
//! Hand-written from the documented prototypes of SynapseAI 1.16–1.21 (`synapse_api_types.h`,
//! `synapse_common_types.h`, `hccl_types.h`, as quoted in the project's reference notes); the
//! vendor headers are proprietary and are not vendored. Every C enum is a `#[repr(transparent)]`
//! newtype over `c_int` with associated constants, never a Rust `enum`: the library may return a
//! value this crate does not know (new releases add codes), and an unknown discriminant in a Rust
//! enum is undefined behaviour. Layouts are checked at compile time at the bottom of this file.

use std::ffi::{c_char, c_int};
use std::fmt;
use std::marker::{PhantomData, PhantomPinned};

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$cm:meta])* $konst:ident = $val:expr => $cname:literal,)* }) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub c_int);

        impl $name {
            $(
                #[doc = concat!("`", $cname, "` = `", stringify!($val), "` in the vendor header.")]
                $(#[$cm])*
                pub const $konst: Self = Self($val);
            )*

            /// The C name of this value, or `None` for a value this crate does not know.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(v if v == $val => Some($cname),)*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}({})", n, self.0),
                    None => write!(f, "{}(unknown {})", stringify!($name), self.0),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

macro_rules! opaque {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _data: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    };
}

opaque!(
    /// Opaque stream object (`struct InternalStreamHandle`); only ever used behind a pointer.
    InternalStreamHandle
);
opaque!(
    /// Opaque event object (`struct EventInterfaceExternal`); only ever used behind a pointer.
    EventInterfaceExternal
);
opaque!(
    /// Opaque recipe object (`struct InternalRecipeHandle`); only ever used behind a pointer.
    InternalRecipeHandle
);

opaque!(
    /// Opaque graph object (`struct InternalGraphHandle`); only ever used behind a pointer.
    InternalGraphHandle
);
opaque!(
    /// Opaque section object (`struct SectionHandleExternal`); only ever used behind a pointer.
    SectionHandleExternal
);
opaque!(
    /// Opaque tensor object (`struct internalTensor`); only ever used behind a pointer.
    internalTensor
);
opaque!(
    /// Opaque compile-error object (`struct ErrorInterfaceExternal`, SynapseAI 1.20+).
    ErrorInterfaceExternal
);

/// `synGraphHandle`: a graph under construction, from `synGraphCreate` / `synGraphCreateEager`.
pub type synGraphHandle = *mut InternalGraphHandle;
/// `synSectionHandle`: a memory section of a graph, from `synSectionCreate`.
pub type synSectionHandle = *mut SectionHandleExternal;
/// `synTensor`: a tensor of a graph, from `synTensorHandleCreate`.
pub type synTensor = *mut internalTensor;
/// `synErrorHandle`: the detailed error of `synGraphCompileV2` (1.20+); release it with
/// `synErrorDestroy`.
pub type synErrorHandle = *mut ErrorInterfaceExternal;
/// `synNodeId`: the id of a node, from `synNodeCreateWithId`.
pub type synNodeId = u64;
/// `synSectionId`: the id of a section inside a recipe (`synRetrievedLaunchTensorInfo`).
pub type synSectionId = u32;

/// `synStreamHandle`: a stream created by `synStreamCreateGeneric`.
pub type synStreamHandle = *mut InternalStreamHandle;
/// `synEventHandle`: an event created by `synEventCreate`.
pub type synEventHandle = *mut EventInterfaceExternal;
/// `synRecipeHandle`: a compiled graph, from `synGraphCompile` or `synRecipeDeSerialize`.
pub type synRecipeHandle = *mut InternalRecipeHandle;
/// `synDeviceId`: the handle of an acquired device (not its module id).
pub type synDeviceId = u32;
/// `synModuleId`: the physical module id of a device in a server (0..7 on an HLS box).
pub type synModuleId = u32;
/// `TSize`: a tensor dimension size.
pub type TSize = u64;
/// `hcclComm_t`: a communicator. In `hccl.h` this is a `#define` for `void*`, not a typedef.
pub type hcclComm_t = *mut std::ffi::c_void;

/// `HABANA_DIM_MAX`: the number of dimensions in a launch tensor's size array.
pub const HABANA_DIM_MAX: usize = 25;
/// `ENQUEUE_TENSOR_NAME_MAX_SIZE`: the longest tensor name the launch API accepts, in bytes.
pub const ENQUEUE_TENSOR_NAME_MAX_SIZE: usize = 1024;
/// `SYN_FLAGS_TENSOR_NAME`: launch flag; bind tensors by `tensorName` instead of `tensorId`.
pub const SYN_FLAGS_TENSOR_NAME: u32 = 0x1;
/// `EVENT_COLLECT_TIME` (`enum eventCreateFlags`): an event created with it records a device
/// timestamp; `synEventElapsedTime` requires it.
pub const EVENT_COLLECT_TIME: u32 = 1;
/// `INVALID_MODULE_ID`.
pub const INVALID_MODULE_ID: u32 = 0xFFFF_FFFF;
/// `SYN_INVALID_DEVICE_ID`.
pub const SYN_INVALID_DEVICE_ID: synDeviceId = 0xFFFF_FFFF;
/// `HCCL_UNIQUE_ID_MAX_BYTES`: the size of `hcclUniqueId::internal`.
pub const HCCL_UNIQUE_ID_MAX_BYTES: usize = 1024;
/// `HCCL_VERSION_CODE` of `hccl.h` 1.16–1.21 (major 2, minor 6, patch 4, NCCL-style encoding).
pub const HCCL_VERSION_CODE: c_int = 2604;

/// `SYN_MAX_TENSOR_DIM`: dimensions of the legacy (descriptor) tensor API.
pub const SYN_MAX_TENSOR_DIM: usize = 5;
/// `SYN_GAUDI_MAX_TENSOR_DIM`: dimensions a Gaudi tensor may have.
pub const SYN_GAUDI_MAX_TENSOR_DIM: usize = 8;
/// `TENSOR_INVALID_ID`: the id `synTensorRetrieveIds` writes for an unknown name (it still
/// returns synSuccess); a launch silently skips an entry with this id.
pub const TENSOR_INVALID_ID: u64 = u64::MAX;
/// `INVALID_SECTION_ID`.
pub const INVALID_SECTION_ID: synSectionId = 0xFFFF_FFFF;
/// `MAX_USER_PARAMS_SIZE`: bytes of node parameters the graph API copies at most.
pub const MAX_USER_PARAMS_SIZE: usize = 128;
/// `MAX_TENSOR_NR`: operands of a node in the legacy API.
pub const MAX_TENSOR_NR: usize = 16;

/// `GET_TENSOR_INFO(idx, type)`: the launch id of the persistent tensor with recipe index `idx`
/// and type `ty` (the low 56 bits are the index, the top byte the type).
pub const fn launch_tensor_id(idx: u64, ty: synTensorType) -> u64 {
    (idx & ((1 << 56) - 1)) | ((ty.0 as u64) << 56)
}

c_enum!(
    /// `synStatus`, the return value of every Synapse call (values of SynapseAI 1.21.0).
    /// The header's `synStatusLast` is stale (43), so new codes must be representable.
    synStatus {
        SUCCESS = 0 => "synSuccess",
        INVALID_ARGUMENT = 1 => "synInvalidArgument",
        CB_FULL = 2 => "synCbFull",
        OUT_OF_HOST_MEMORY = 3 => "synOutOfHostMemory",
        OUT_OF_DEVICE_MEMORY = 4 => "synOutOfDeviceMemory",
        OBJECT_ALREADY_INITIALIZED = 5 => "synObjectAlreadyInitialized",
        OBJECT_NOT_INITIALIZED = 6 => "synObjectNotInitialized",
        COMMAND_SUBMISSION_FAILURE = 7 => "synCommandSubmissionFailure",
        NO_DEVICE_FOUND = 8 => "synNoDeviceFound",
        DEVICE_TYPE_MISMATCH = 9 => "synDeviceTypeMismatch",
        FAILED_TO_INITIALIZE_CB = 10 => "synFailedToInitializeCb",
        FAILED_TO_FREE_CB = 11 => "synFailedToFreeCb",
        FAILED_TO_MAP_CB = 12 => "synFailedToMapCb",
        FAILED_TO_UNMAP_CB = 13 => "synFailedToUnmapCb",
        FAILED_TO_ALLOCATE_DEVICE_MEMORY = 14 => "synFailedToAllocateDeviceMemory",
        FAILED_TO_FREE_DEVICE_MEMORY = 15 => "synFailedToFreeDeviceMemory",
        FAILED_NOT_ENOUGH_DEVICES_FOUND = 16 => "synFailedNotEnoughDevicesFound",
        DEVICE_RESET = 17 => "synDeviceReset",
        UNSUPPORTED = 18 => "synUnsupported",
        WRONG_PARAMS_FILE = 19 => "synWrongParamsFile",
        DEVICE_ALREADY_ACQUIRED = 20 => "synDeviceAlreadyAcquired",
        NAME_IS_ALREADY_USED = 21 => "synNameIsAlreadyUsed",
        BUSY = 22 => "synBusy",
        ALL_RESOURCES_TAKEN = 23 => "synAllResourcesTaken",
        UNAVAILABLE = 24 => "synUnavailable",
        INVALID_TENSOR_DIMENSIONS = 25 => "synInvalidTensorDimensions",
        FAIL = 26 => "synFail",
        OUT_OF_RESOURCES = 27 => "synOutOfResources",
        UNINITIALIZED = 28 => "synUninitialized",
        ALREADY_INITIALIZED = 29 => "synAlreadyInitialized",
        FAILED_SECTION_VALIDATION = 30 => "synFailedSectionValidation",
        SYNAPSE_TERMINATED = 31 => "synSynapseTerminated",
        ASSERT_ASYNC = 32 => "synAssertAsync",
        INVALID_EVENT_HANDLE = 33 => "synInvalidEventHandle",
        MAPPING_NOT_FOUND = 34 => "synMappingNotFound",
        FAILED_DYNAMIC_PATCHING = 35 => "synFailedDynamicPatching",
        FAILED_STATIC_PATCHING = 36 => "synFailedStaticPatching",
        FAILED_TO_SUBMIT_WORKLOAD = 37 => "synFailedToSubmitWorkload",
        INVALID_SECTIONS_DEFINITION = 38 => "synInvalidSectionsDefinition",
        INVALID_TENSOR_PROPERTIES = 39 => "synInvalidTensorProperties",
        FAIL_HCCL = 40 => "synFailHccl",
        FAILED_TO_COLLECT_TIME = 41 => "synFailedToCollectTime",
        TIMEOUT = 42 => "synTimeout",
        RESOURCE_BAD_USAGE = 43 => "synResourceBadUsage",
        /// Added in 1.20.
        NULL_PTR = 44 => "synNullPtr",
        /// Added in 1.20.
        FAIL_FUSER = 45 => "synFailFuser",
        /// Added in 1.20.
        FAIL_COMPLEX_GUID = 46 => "synFailComplexGuid",
        /// Added in 1.20.
        FAIL_TPC_KERNELS = 47 => "synFailTpcKernels",
    }
);

impl synStatus {
    /// True for `synSuccess`.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }
}

c_enum!(
    /// `hcclResult_t`, the return value of every HCCL call (values of `hccl_types.h` 1.21.0).
    /// It starts at -1 and has values after `hcclNumResults`.
    hcclResult_t {
        UNINITIALIZED = -1 => "hcclUninitialized",
        SUCCESS = 0 => "hcclSuccess",
        NO_DEVICE_FOUND = 1 => "hcclNoDeviceFound",
        UNSUPPORTED = 2 => "hcclUnsupported",
        OUT_OF_MEMORY = 3 => "hcclOutOfMemory",
        UNHANDLED_SYNAPSE_ERROR = 4 => "hcclUnhandledSynapseError",
        SYSTEM_ERROR = 5 => "hcclSystemError",
        INTERNAL_ERROR = 6 => "hcclInternalError",
        INVALID_ARGUMENT = 7 => "hcclInvalidArgument",
        INVALID_USAGE = 8 => "hcclInvalidUsage",
        SOCKET_ERROR = 9 => "hcclSocketError",
        LIBFABRIC_ERROR = 10 => "hcclLibfabricError",
        TRY_AGAIN_ERROR = 11 => "hcclTryAgainError",
        BUSY = 12 => "hcclBusy",
        NUM_RESULTS = 13 => "hcclNumResults",
        STREAM_ERROR = 14 => "hcclStreamError",
        SYNAPSE_TERMINATED = 15 => "hcclSynapseTerminated",
        /// Added in 1.19.
        PORT_DOWN = 16 => "hcclPortDown",
    }
);

impl hcclResult_t {
    /// True for `hcclSuccess`.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }
}

c_enum!(
    /// `synDmaDir`: the direction of `synMemCopyAsync`.
    synDmaDir {
        HOST_TO_DRAM = 0 => "HOST_TO_DRAM",
        DRAM_TO_HOST = 1 => "DRAM_TO_HOST",
        DRAM_TO_DRAM = 2 => "DRAM_TO_DRAM",
        DIRECTION_ENUM_MAX = 3 => "DIRECTION_ENUM_MAX",
    }
);

c_enum!(
    /// `synDeviceType`.
    synDeviceType {
        /// Also named `synDeviceGreco`.
        GOYA2 = 1 => "synDeviceGoya2",
        GAUDI = 2 => "synDeviceGaudi",
        GAUDI2 = 4 => "synDeviceGaudi2",
        GAUDI3 = 5 => "synDeviceGaudi3",
        EMULATOR = 6 => "synDeviceEmulator",
        INVALID = 7 => "synDeviceTypeInvalid",
        SIZE = 8 => "synDeviceTypeSize",
    }
);

c_enum!(
    /// `synDataType`: bit flags, one bit per element type.
    synDataType {
        NA = 0 => "syn_type_na",
        /// Also named `syn_type_fixed`.
        INT8 = 1 << 0 => "syn_type_int8",
        BF16 = 1 << 1 => "syn_type_bf16",
        /// Also named `syn_type_float`.
        SINGLE = 1 << 2 => "syn_type_single",
        INT16 = 1 << 3 => "syn_type_int16",
        INT32 = 1 << 4 => "syn_type_int32",
        UINT8 = 1 << 5 => "syn_type_uint8",
        INT4 = 1 << 6 => "syn_type_int4",
        UINT4 = 1 << 7 => "syn_type_uint4",
        FP16 = 1 << 8 => "syn_type_fp16",
        UINT16 = 1 << 9 => "syn_type_uint16",
        UINT32 = 1 << 10 => "syn_type_uint32",
        TF32 = 1 << 11 => "syn_type_tf32",
        HB_FLOAT = 1 << 12 => "syn_type_hb_float",
        FP8_143 = 1 << 13 => "syn_type_fp8_143",
        FP8_152 = 1 << 14 => "syn_type_fp8_152",
        INT64 = 1 << 15 => "syn_type_int64",
        UINT64 = 1 << 16 => "syn_type_uint64",
        UFP16 = 1 << 17 => "syn_type_ufp16",
        /// Added in 1.20.
        PACKED_NF4 = 1 << 18 => "syn_type_packed_nf4",
    }
);

c_enum!(
    /// `synTensorType`.
    synTensorType {
        DATA_TENSOR = 0 => "DATA_TENSOR",
        SHAPE_TENSOR = 1 => "SHAPE_TENSOR",
        INPUT_DESCRIBING_SHAPE_TENSOR_DEPRECATED = 2 => "INPUT_DESCRIBING_SHAPE_TENSOR_DEPRECATED",
        DATA_TENSOR_DYNAMIC = 3 => "DATA_TENSOR_DYNAMIC",
        DEVICE_SHAPE_TENSOR = 4 => "DEVICE_SHAPE_TENSOR",
        HOST_SHAPE_TENSOR = 5 => "HOST_SHAPE_TENSOR",
        HOST_TO_DEVICE_TENSOR = 6 => "HOST_TO_DEVICE_TENSOR",
        /// Also named `TENSOR_TYPE_INVALID`.
        TENSOR_TYPE_MAX = 7 => "TENSOR_TYPE_MAX",
    }
);

c_enum!(
    /// `synRecipeAttribute` (names carry the `RECIPE_ATTRIBUTE_` prefix in C).
    synRecipeAttribute {
        WORKSPACE_SIZE = 0 => "RECIPE_ATTRIBUTE_WORKSPACE_SIZE",
        NUM_PERSISTENT_TENSORS = 1 => "RECIPE_ATTRIBUTE_NUM_PERSISTENT_TENSORS",
        HOST_MEM_SIZE = 2 => "RECIPE_ATTRIBUTE_HOST_MEM_SIZE",
        NUM_EXTERNAL_TENSORS = 3 => "RECIPE_ATTRIBUTE_NUM_EXTERNAL_TENSORS",
        PERSISTENT_TENSORS_SIZE = 4 => "RECIPE_ATTRIBUTE_PERSISTENT_TENSORS_SIZE",
        CONST_SECTIONS_SIZE = 5 => "RECIPE_ATTRIBUTE_CONST_SECTIONS_SIZE",
        DEVICE_MEMORY_SIZE = 6 => "RECIPE_ATTRIBUTE_DEVICE_MEMORY_SIZE",
    }
);

c_enum!(
    /// `hcclDataType_t` (same numbering as NCCL's `ncclDataType_t`).
    hcclDataType_t {
        /// Also named `hcclChar`.
        INT8 = 0 => "hcclInt8",
        UINT8 = 1 => "hcclUint8",
        /// Also named `hcclInt`.
        INT32 = 2 => "hcclInt32",
        UINT32 = 3 => "hcclUint32",
        INT64 = 4 => "hcclInt64",
        UINT64 = 5 => "hcclUint64",
        /// Also named `hcclHalf`.
        FLOAT16 = 6 => "hcclFloat16",
        /// Also named `hcclFloat`.
        FLOAT32 = 7 => "hcclFloat32",
        /// Also named `hcclDouble`.
        FLOAT64 = 8 => "hcclFloat64",
        BFLOAT16 = 9 => "hcclBfloat16",
        NUM_TYPES = 10 => "hcclNumTypes",
    }
);

c_enum!(
    /// `hcclRedOp_t`. Beware: `hcclMin = 2` and `hcclMax = 3`, the reverse of NCCL; the HCCL
    /// documentation says `hcclProd` and `hcclAvg` are not supported.
    hcclRedOp_t {
        SUM = 0 => "hcclSum",
        PROD = 1 => "hcclProd",
        MIN = 2 => "hcclMin",
        MAX = 3 => "hcclMax",
        AVG = 4 => "hcclAvg",
        OP_NONE = 5 => "hcclOpNone",
    }
);

c_enum!(
    /// `synGeometryType`: which sizes `synTensorSetGeometry` sets. The header also names
    /// `synGeometrySizes` = 1, an alias of `synGeometryMaxSizes` ([`synGeometryType::SIZES`]).
    synGeometryType {
        MIN_SIZES = 0 => "synGeometryMinSizes",
        MAX_SIZES = 1 => "synGeometryMaxSizes",
        DIMS = 2 => "synGeometryDims",
    }
);

impl synGeometryType {
    /// `synGeometrySizes`: alias of `synGeometryMaxSizes`, the sizes of a static tensor.
    pub const SIZES: Self = Self::MAX_SIZES;
}

c_enum!(
    /// `synRoundingMode` (`synNodeSetRoundingMode`; names carry the `synRounding` prefix in C).
    synRoundingMode {
        TO_NEAREST = 0 => "synRoundToNearest",
        TO_ZERO = 1 => "synRoundToZero",
        UP = 2 => "synRoundUp",
        DOWN = 3 => "synRoundDown",
        STOCHASTIC = 4 => "synStochasticRounding",
        AWAY_FROM_ZERO = 5 => "synRoundAwayFromZero",
        STOCHASTIC_AND_NEAREST = 6 => "synStochasticRoundingAndNearest",
    }
);

c_enum!(
    /// `synGraphAttribute` (`synGraphSetAttributes`).
    synGraphAttribute {
        INFERENCE = 0 => "GRAPH_ATTRIBUTE_INFERENCE",
        QUANTIZATION = 1 => "GRAPH_ATTRIBUTE_QUANTIZATION",
        BACKOFF_FACTOR = 2 => "GRAPH_ATTRIBUTE_BACKOFF_FACTOR",
        /// Added in 1.17.
        IS_HW_ALIGNED_SCALE = 3 => "GRAPH_ATTRIBUTE_IS_HW_ALIGNED_SCALE",
        /// Added in 1.17.
        SCALE_METHOD_HASH_ID = 4 => "GRAPH_ATTRIBUTE_SCALE_METHOD_HASH_ID",
    }
);

/// `synTensorGeometry` (also `synTensorGeometryExt`; 208 bytes): sizes **fastest-changing
/// dimension first** (`sizes[0]` is the innermost dimension: a row-major M×K matrix has sizes
/// `[K, M]`), unused entries zero.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct synTensorGeometry {
    /// Sizes in elements, FCD first; `sizes[dims..]` are 0.
    pub sizes: [TSize; HABANA_DIM_MAX],
    /// Number of dimensions.
    pub dims: u32,
}

impl Default for synTensorGeometry {
    fn default() -> Self {
        Self { sizes: [0; HABANA_DIM_MAX], dims: 0 }
    }
}

/// `synTensorGeometryExt`: identical to [`synTensorGeometry`].
pub type synTensorGeometryExt = synTensorGeometry;

/// `synTensorDeviceFullLayout` (104 bytes): strides in bytes (all 0 = dense, the only layout
/// the header supports) and the element type on the device.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[allow(non_snake_case)]
pub struct synTensorDeviceFullLayout {
    /// Strides, FCD first; all 0 for a dense tensor.
    pub strides: [u32; HABANA_DIM_MAX],
    /// Element type on the device.
    pub deviceDataType: synDataType,
}

impl Default for synTensorDeviceFullLayout {
    fn default() -> Self {
        Self { strides: [0; HABANA_DIM_MAX], deviceDataType: synDataType::NA }
    }
}

/// `synTensorPermutation` (26 bytes): a permutation of the tensor's dimensions.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct synTensorPermutation {
    /// `permutation[i]` is the source dimension of dimension i.
    pub permutation: [u8; HABANA_DIM_MAX],
    /// Number of dimensions.
    pub dims: u8,
}

/// `synRetrievedLaunchTensorInfo` (also `…Ext`; 1536 bytes): what
/// `synTensorRetrieveLaunchInfoById` reports about one persistent tensor of a recipe. Set
/// `tensorId` before the call; the runtime fills the rest.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
#[allow(non_snake_case)]
pub struct synRetrievedLaunchTensorInfo {
    /// NUL-terminated tensor name.
    pub tensorName: [c_char; ENQUEUE_TENSOR_NAME_MAX_SIZE],
    /// The launch id asked about (input).
    pub tensorId: u64,
    /// Tensor type.
    pub tensorType: synTensorType,
    /// Element type.
    pub tensorDataType: synDataType,
    /// Number of dimensions.
    pub tensorDims: u32,
    /// Max sizes, FCD first.
    pub tensorMaxSize: [TSize; HABANA_DIM_MAX],
    /// Min sizes, FCD first (equal to the max sizes for a static tensor).
    pub tensorMinSize: [TSize; HABANA_DIM_MAX],
    /// Dimension permutation.
    pub tensorPermutation: [u8; HABANA_DIM_MAX],
    /// The recipe's id of the tensor's section.
    pub tensorSectionId: synSectionId,
    /// Byte offset of the tensor in its section.
    pub tensorOffsetInSection: u64,
    /// Nonzero when the graph reads the tensor (a `bool`-like byte).
    pub isInput: u8,
    /// Reserved, zero.
    pub reserved: [u32; 10],
}

impl Default for synRetrievedLaunchTensorInfo {
    fn default() -> Self {
        Self {
            tensorName: [0; ENQUEUE_TENSOR_NAME_MAX_SIZE],
            tensorId: 0,
            tensorType: synTensorType::DATA_TENSOR,
            tensorDataType: synDataType::NA,
            tensorDims: 0,
            tensorMaxSize: [0; HABANA_DIM_MAX],
            tensorMinSize: [0; HABANA_DIM_MAX],
            tensorPermutation: [0; HABANA_DIM_MAX],
            tensorSectionId: 0,
            tensorOffsetInSection: 0,
            isInput: 0,
            reserved: [0; 10],
        }
    }
}

/// `synRetrievedLaunchTensorInfoExt`: identical to [`synRetrievedLaunchTensorInfo`].
pub type synRetrievedLaunchTensorInfoExt = synRetrievedLaunchTensorInfo;

/// `synGEMMParams` (2 bytes; a C++ struct but plain data): the parameters of `gemm`,
/// `gemm_dedx`, `gemm_dedw` and `batch_gemm`. With no transposes, FCD-first sizes are A `[K, M]`,
/// B `[N, K]`, C `[N, M]` (row-major A M×K, B K×N, C M×N).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct synGEMMParams {
    /// A is given as `[M, K]` (FCD first), i.e. row-major K×M.
    pub transpose_a: bool,
    /// B is given as `[K, N]` (FCD first), i.e. row-major N×K (a PyTorch `Linear` weight).
    pub transpose_b: bool,
}

/// `synLaunchTensorInfo`: one tensor bound at launch (232 bytes on x86-64).
///
/// `tensorName` is used when the launch flags carry [`SYN_FLAGS_TENSOR_NAME`], otherwise
/// `tensorId` (from `synTensorRetrieveIds` / `synTensorRetrieveLaunchIds`). `pTensorAddress` is a
/// device address from `synDeviceMalloc`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
#[allow(non_snake_case)]
pub struct synLaunchTensorInfo {
    /// NUL-terminated tensor name, or null when binding by id.
    pub tensorName: *const c_char,
    /// Device address of the tensor's data.
    pub pTensorAddress: u64,
    /// Tensor type; `DATA_TENSOR` for ordinary tensors.
    pub tensorType: synTensorType,
    /// Actual sizes, for dynamic shapes; zeros otherwise.
    pub tensorSize: [TSize; HABANA_DIM_MAX],
    /// Tensor id from the recipe.
    pub tensorId: u64,
}

/// `synLaunchTensorInfoExt`: field for field identical to [`synLaunchTensorInfo`]; used with
/// `synLaunchWithExternalEventsExt`.
pub type synLaunchTensorInfoExt = synLaunchTensorInfo;

/// `struct synDeviceInfo` (56 bytes on x86-64). Deprecated by the vendor in favour of
/// [`synDeviceInfoV2`].
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
#[allow(non_snake_case)]
pub struct synDeviceInfo {
    /// Device address of the on-chip SRAM (0 when the SRAM is not exposed to the host).
    pub sramBaseAddress: u64,
    /// Device address where the host-visible HBM (DRAM) begins.
    pub dramBaseAddress: u64,
    /// Bytes.
    pub sramSize: u32,
    /// Bytes.
    pub dramSize: u64,
    /// One bit per TPC (Tensor Processor Core) engine, set when the engine is enabled.
    pub tpcEnabledMask: u64,
    /// Nonzero when the HBM is enabled (a `bool` in C, one byte).
    pub dramEnabled: u8,
    /// The `synDeviceId` of this device (the acquisition handle, not the module id).
    pub deviceId: u32,
    /// File descriptor of the opened device node (`/dev/accel/accelN` or `/dev/hl*`).
    pub fd: u32,
    /// The device generation.
    pub deviceType: synDeviceType,
}

/// `struct synDeviceInfoV2` (72 bytes on x86-64): [`synDeviceInfo`] plus the device index and
/// the global HBM base address (named `reserved` before 1.20).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
#[allow(non_snake_case)]
pub struct synDeviceInfoV2 {
    /// Device address of the on-chip SRAM (0 when the SRAM is not exposed to the host).
    pub sramBaseAddress: u64,
    /// Device address where the host-visible HBM (DRAM) begins.
    pub dramBaseAddress: u64,
    /// Bytes.
    pub sramSize: u32,
    /// Bytes.
    pub dramSize: u64,
    /// One bit per TPC (Tensor Processor Core) engine, set when the engine is enabled.
    pub tpcEnabledMask: u64,
    /// Nonzero when the HBM is enabled (a `bool` in C, one byte).
    pub dramEnabled: u8,
    /// The `synDeviceId` of this device (the acquisition handle, not the module id).
    pub deviceId: u32,
    /// File descriptor of the opened device node (`/dev/accel/accelN` or `/dev/hl*`).
    pub fd: u32,
    /// The device generation.
    pub deviceType: synDeviceType,
    /// Index of the device among the Gaudi devices of the server (0..7 on an HLS box).
    pub deviceIndex: u8,
    /// Base address of the HBM in the global (multi-device) address space; the field was named
    /// `reserved` before SynapseAI 1.20, so older libraries may leave it 0.
    pub globalHbmBaseAddress: u64,
}

/// `hcclUniqueId`: 1024 opaque bytes plus the used length (1032 bytes). Passed **by value** to
/// `hcclCommInitRank`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct hcclUniqueId {
    /// Opaque id bytes; only the first `length` are meaningful.
    pub internal: [u8; HCCL_UNIQUE_ID_MAX_BYTES],
    /// Number of meaningful bytes in `internal`.
    pub length: usize,
}

impl Default for hcclUniqueId {
    fn default() -> Self {
        Self { internal: [0; HCCL_UNIQUE_ID_MAX_BYTES], length: 0 }
    }
}

impl fmt::Debug for hcclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("hcclUniqueId").field("length", &self.length).finish_non_exhaustive()
    }
}

// Compile-time layout checks (x86-64 / LP64, from the reference notes' computed layouts).
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<synStatus>() == 4);
    assert!(size_of::<hcclResult_t>() == 4);
    assert!(size_of::<synLaunchTensorInfo>() == 232);
    assert!(align_of::<synLaunchTensorInfo>() == 8);
    assert!(offset_of!(synLaunchTensorInfo, tensorName) == 0);
    assert!(offset_of!(synLaunchTensorInfo, pTensorAddress) == 8);
    assert!(offset_of!(synLaunchTensorInfo, tensorType) == 16);
    assert!(offset_of!(synLaunchTensorInfo, tensorSize) == 24);
    assert!(offset_of!(synLaunchTensorInfo, tensorId) == 224);
    assert!(size_of::<synDeviceInfo>() == 56);
    assert!(offset_of!(synDeviceInfo, sramSize) == 16);
    assert!(offset_of!(synDeviceInfo, dramSize) == 24);
    assert!(offset_of!(synDeviceInfo, dramEnabled) == 40);
    assert!(offset_of!(synDeviceInfo, deviceId) == 44);
    assert!(offset_of!(synDeviceInfo, fd) == 48);
    assert!(offset_of!(synDeviceInfo, deviceType) == 52);
    assert!(size_of::<synDeviceInfoV2>() == 72);
    assert!(offset_of!(synDeviceInfoV2, deviceIndex) == 56);
    assert!(offset_of!(synDeviceInfoV2, globalHbmBaseAddress) == 64);
    assert!(size_of::<hcclUniqueId>() == 1032);
    assert!(offset_of!(hcclUniqueId, length) == 1024);
    assert!(align_of::<hcclUniqueId>() == 8);
    assert!(size_of::<synTensorGeometry>() == 208);
    assert!(align_of::<synTensorGeometry>() == 8);
    assert!(offset_of!(synTensorGeometry, sizes) == 0);
    assert!(offset_of!(synTensorGeometry, dims) == 200);
    assert!(size_of::<synTensorDeviceFullLayout>() == 104);
    assert!(align_of::<synTensorDeviceFullLayout>() == 4);
    assert!(offset_of!(synTensorDeviceFullLayout, strides) == 0);
    assert!(offset_of!(synTensorDeviceFullLayout, deviceDataType) == 100);
    assert!(size_of::<synTensorPermutation>() == 26);
    assert!(offset_of!(synTensorPermutation, dims) == 25);
    assert!(size_of::<synRetrievedLaunchTensorInfo>() == 1536);
    assert!(align_of::<synRetrievedLaunchTensorInfo>() == 8);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorName) == 0);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorId) == 1024);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorType) == 1032);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorDataType) == 1036);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorDims) == 1040);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorMaxSize) == 1048);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorMinSize) == 1248);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorPermutation) == 1448);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorSectionId) == 1476);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, tensorOffsetInSection) == 1480);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, isInput) == 1488);
    assert!(offset_of!(synRetrievedLaunchTensorInfo, reserved) == 1492);
    assert!(size_of::<synGEMMParams>() == 2);
    assert!(align_of::<synGEMMParams>() == 1);
    assert!(offset_of!(synGEMMParams, transpose_b) == 1);
    assert!(size_of::<synGeometryType>() == 4);
    assert!(size_of::<synRoundingMode>() == 4);
    assert!(size_of::<synGraphAttribute>() == 4);
};
