//! ABI facts of the hand-written bindings: constant values that differ from NCCL or are easy to
//! get wrong, unknown-code handling, and (with feature `bindgen` and `HABANA_SDK_INCLUDE`) a
//! comparison with bindings generated from the vendor headers.

use habana_sys::*;

#[test]
fn hccl_min_max_are_swapped_relative_to_nccl() {
    // NCCL: ncclMax = 2, ncclMin = 3. HCCL (hccl_types.h 1.21): hcclMin = 2, hcclMax = 3.
    assert_eq!(hcclRedOp_t::MIN.0, 2);
    assert_eq!(hcclRedOp_t::MAX.0, 3);
    assert_eq!(hcclDataType_t::BFLOAT16.0, 9);
    assert_eq!(hcclResult_t::UNINITIALIZED.0, -1);
}

#[test]
fn unknown_status_codes_are_representable() {
    let s = synStatus(4711);
    assert_eq!(s.name(), None);
    assert_eq!(format!("{s:?}"), "synStatus(unknown 4711)");
    assert!(!s.is_success());
    assert_eq!(synStatus::FAIL_TPC_KERNELS.name(), Some("synFailTpcKernels"));
    assert_eq!(hcclResult_t(99).name(), None);
    assert_eq!(hcclResult_t::PORT_DOWN.name(), Some("hcclPortDown"));
}

#[test]
fn every_required_symbol_is_unique_and_named_like_c() {
    let mut all: Vec<&str> = REQUIRED_SYMBOLS.iter().chain(OPTIONAL_SYMBOLS).copied().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a symbol is listed twice");
    assert!(all.iter().all(|s| s.starts_with("syn") || s.starts_with("hccl")));
    assert!(REQUIRED_SYMBOLS.contains(&"synLaunchWithExternalEventsExt"));
    assert!(REQUIRED_SYMBOLS.contains(&"hcclCommInitRank"));
    assert!(OPTIONAL_SYMBOLS.contains(&"hcclCommGetAsyncErrorMessage"));
}

#[test]
fn version_strings_parse() {
    assert_eq!(parse_version("1.21.0-555"), Some((1, 21)));
    assert_eq!(parse_version("1.9.0"), Some((1, 9)));
    assert_eq!(parse_version("garbage"), None);
    assert_eq!(parse_version("Version 1.21.0"), Some((1, 21)));
    assert_eq!(parse_version("2"), None);
    assert_eq!(parse_version(""), None);
    assert!(parse_version("1.15.1").unwrap() < MIN_VERSION);
    // The loader's rule (also the in-process mock's DROPCOMPUTE_MOCK_VERSION check).
    let supported: Vec<bool> = ["1.16.0", "1.21.0-555", "2.0", "1.15.9", "xyz", ""]
        .iter()
        .map(|v| habana_sys::is_supported_version(v))
        .collect();
    assert_eq!(supported, [true, true, true, false, false, false]);
}

#[test]
fn missing_library_is_a_typed_error_not_a_panic() {
    // Inside a fresh private directory: a fixed path such as /nonexistent may exist.
    let tmp = tempfile::tempdir().unwrap();
    let path = &tmp.path().join("missing").join("libSynapse.so");
    match SynapseApi::load(Some(path)) {
        Err(LoadError::NotFound { tried }) => assert_eq!(tried, vec![path.to_path_buf()]),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[test]
fn a_library_that_is_not_synapse_names_the_missing_symbol() {
    // libm is on every glibc system and exports none of the Synapse symbols.
    let candidates = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"];
    let Some(path) = candidates.iter().map(std::path::Path::new).find(|p| p.exists()) else {
        eprintln!("no libm found at the usual paths; nothing to load");
        return;
    };
    match SynapseApi::load_path(path) {
        Err(LoadError::MissingSymbol { path: p, symbol, version }) => {
            assert_eq!(p, path);
            assert_eq!(symbol, REQUIRED_SYMBOLS[0]);
            assert_eq!(version, None);
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_library_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libSynapse.so");
    std::fs::write(&path, b"not an ELF file").unwrap();
    let err = SynapseApi::load_path(&path).unwrap_err();
    assert!(matches!(err, LoadError::Open { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()));
}

/// With `--features bindgen` and `HABANA_SDK_INCLUDE` set, compare every struct layout and every
/// constant and enum value this crate declares with the vendor headers' (the test does not
/// exist without the headers). Struct names as bindgen emits them; field offsets through
/// `offset_of!` on both sides.
#[cfg(all(feature = "bindgen", habana_sdk_bindings))]
#[test]
fn layouts_match_vendor_headers() {
    use habana_sys::generated as g;
    use std::mem::{align_of, offset_of, size_of};
    // Each of `ours` against the header's struct of the same name, fields by name; a struct and
    // its `…Ext` twin share one field list.
    macro_rules! same_layout {
        ($($ours:ident),+ : $fields:tt) => {
            $(same_layout!(@one $ours $fields);)+
        };
        (@one $ours:ident [$($f:ident),* $(,)?]) => {
            assert_eq!(size_of::<$ours>(), size_of::<g::$ours>(), "size of {}", stringify!($ours));
            assert_eq!(align_of::<$ours>(), align_of::<g::$ours>(), "align of {}", stringify!($ours));
            $(assert_eq!(offset_of!($ours, $f), offset_of!(g::$ours, $f), "{}.{}", stringify!($ours), stringify!($f));)*
        };
    }
    same_layout!(synLaunchTensorInfo, synLaunchTensorInfoExt: [tensorName, pTensorAddress, tensorType, tensorSize, tensorId]);
    same_layout!(
        synDeviceInfo: [sramBaseAddress, dramBaseAddress, sramSize, dramSize, tpcEnabledMask, dramEnabled, deviceId, fd, deviceType]
    );
    same_layout!(synDeviceInfoV2: [
        sramBaseAddress,
        dramBaseAddress,
        sramSize,
        dramSize,
        tpcEnabledMask,
        dramEnabled,
        deviceId,
        fd,
        deviceType,
        deviceIndex
    ]);
    same_layout!(hcclUniqueId: [internal, length]);
    same_layout!(synTensorGeometry, synTensorGeometryExt: [sizes, dims]);
    same_layout!(synTensorDeviceFullLayout: [strides, deviceDataType]);
    same_layout!(synTensorPermutation: [permutation, dims]);
    same_layout!(
        synRetrievedLaunchTensorInfo,
        synRetrievedLaunchTensorInfoExt: [
            tensorName,
            tensorId,
            tensorType,
            tensorDataType,
            tensorDims,
            tensorMaxSize,
            tensorMinSize,
            tensorPermutation,
            tensorSectionId,
            tensorOffsetInSection,
            isInput,
            reserved
        ]
    );
    same_layout!(synGEMMParams: [transpose_a, transpose_b]);
    assert_eq!(hcclRedOp_t::MIN.0 as i64, g::hcclRedOp_t_hcclMin as i64);
    assert_eq!(hcclRedOp_t::MAX.0 as i64, g::hcclRedOp_t_hcclMax as i64);
    assert_eq!(synStatus::DEVICE_ALREADY_ACQUIRED.0 as i64, g::synStatus_synDeviceAlreadyAcquired as i64);
    assert_eq!(synStatus::FAILED_SECTION_VALIDATION.0 as i64, g::synStatus_synFailedSectionValidation as i64);
    assert_eq!(synStatus::NAME_IS_ALREADY_USED.0 as i64, g::synStatus_synNameIsAlreadyUsed as i64);
    assert_eq!(synGeometryType::MAX_SIZES.0 as i64, g::synGeometryType_synGeometryMaxSizes as i64);
    assert_eq!(synGeometryType::SIZES.0 as i64, g::synGeometryType_synGeometrySizes as i64);
    assert_eq!(synGeometryType::DIMS.0 as i64, g::synGeometryType_synGeometryDims as i64);
    assert_eq!(synDataType::BF16.0 as i64, g::synDataType_syn_type_bf16 as i64);
    assert_eq!(synDataType::SINGLE.0 as i64, g::synDataType_syn_type_single as i64);
    assert_eq!(synDataType::INT32.0 as i64, g::synDataType_syn_type_int32 as i64);
    assert_eq!(synTensorType::DATA_TENSOR.0 as i64, g::synTensorType_DATA_TENSOR as i64);
    assert_eq!(synDeviceType::GAUDI2.0 as i64, g::synDeviceType_synDeviceGaudi2 as i64);
    assert_eq!(synDeviceType::GAUDI3.0 as i64, g::synDeviceType_synDeviceGaudi3 as i64);
    assert_eq!(synRoundingMode::STOCHASTIC.0 as i64, g::synRoundingMode_synStochasticRounding as i64);
    assert_eq!(synGraphAttribute::BACKOFF_FACTOR.0 as i64, g::synGraphAttribute_GRAPH_ATTRIBUTE_BACKOFF_FACTOR as i64);
    assert_eq!(
        synRecipeAttribute::WORKSPACE_SIZE.0 as i64,
        g::synRecipeAttribute_RECIPE_ATTRIBUTE_WORKSPACE_SIZE as i64
    );
    assert_eq!(HABANA_DIM_MAX as i64, g::HABANA_DIM_MAX as i64);
    assert_eq!(ENQUEUE_TENSOR_NAME_MAX_SIZE as i64, g::ENQUEUE_TENSOR_NAME_MAX_SIZE as i64);
    assert_eq!(SYN_FLAGS_TENSOR_NAME as i64, g::SYN_FLAGS_TENSOR_NAME as i64);
    assert_eq!(SYN_MAX_TENSOR_DIM as i64, g::SYN_MAX_TENSOR_DIM as i64);
    assert_eq!(SYN_GAUDI_MAX_TENSOR_DIM as i64, g::SYN_GAUDI_MAX_TENSOR_DIM as i64);
    assert_eq!(MAX_USER_PARAMS_SIZE as i64, g::MAX_USER_PARAMS_SIZE as i64);
    assert_eq!(MAX_TENSOR_NR as i64, g::MAX_TENSOR_NR as i64);
    assert_eq!(HCCL_UNIQUE_ID_MAX_BYTES as i64, g::HCCL_UNIQUE_ID_MAX_BYTES as i64);
}

#[test]
fn graph_path_is_bound_required_and_newer_functions_optional() {
    for f in [
        "synGraphCreate",
        "synGraphDestroy",
        "synSectionCreate",
        "synSectionSetPersistent",
        "synTensorHandleCreate",
        "synTensorAssignToSection",
        "synTensorSetGeometry",
        "synTensorSetDeviceDataType",
        "synNodeCreate",
        "synNodeCreateWithId",
        "synGraphCompile",
        "synTensorRetrieveLaunchInfoById",
        "synMemsetD32Async",
        "synEventMapTensor",
    ] {
        assert!(REQUIRED_SYMBOLS.contains(&f), "{f} must be required (present since 1.16)");
    }
    for f in ["synGraphCompileV2", "synErrorGetStatus", "synErrorGetMessage", "synErrorDestroy"] {
        assert!(OPTIONAL_SYMBOLS.contains(&f), "{f} is 1.20+ and must be optional");
    }
    for removed in ["synLaunchExt", "synEventMapTensorExt", "synTensorSetGeometryExt", "synTensorGetGeometryExt"] {
        assert!(
            !REQUIRED_SYMBOLS.contains(&removed) && !OPTIONAL_SYMBOLS.contains(&removed),
            "{removed} was removed in 1.19"
        );
    }
}

#[test]
fn launch_ids_put_the_type_in_the_top_byte() {
    assert_eq!(launch_tensor_id(3, synTensorType::DATA_TENSOR), 3);
    assert_eq!(launch_tensor_id(3, synTensorType::SHAPE_TENSOR), (1 << 56) | 3);
    assert_eq!(launch_tensor_id(u64::MAX, synTensorType::DATA_TENSOR), (1 << 56) - 1);
    assert_eq!(TENSOR_INVALID_ID, 0xFFFF_FFFF_FFFF_FFFF);
    assert_eq!(synGeometryType::SIZES, synGeometryType::MAX_SIZES);
}
