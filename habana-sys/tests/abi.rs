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

/// With `--features bindgen` and `HABANA_SDK_INCLUDE` set, compare our layouts and constants with
/// the vendor headers' (skipped, with a note, when the headers are absent).
#[cfg(all(feature = "bindgen", habana_sdk_bindings))]
#[test]
fn layouts_match_vendor_headers() {
    use habana_sys::generated as g;
    use std::mem::size_of;
    assert_eq!(size_of::<synLaunchTensorInfo>(), size_of::<g::synLaunchTensorInfo>());
    assert_eq!(size_of::<synLaunchTensorInfoExt>(), size_of::<g::synLaunchTensorInfoExt>());
    assert_eq!(size_of::<synDeviceInfo>(), size_of::<g::synDeviceInfo>());
    assert_eq!(size_of::<synDeviceInfoV2>(), size_of::<g::synDeviceInfoV2>());
    assert_eq!(size_of::<hcclUniqueId>(), size_of::<g::hcclUniqueId>());
    assert_eq!(hcclRedOp_t::MIN.0 as i64, g::hcclRedOp_t_hcclMin as i64);
    assert_eq!(hcclRedOp_t::MAX.0 as i64, g::hcclRedOp_t_hcclMax as i64);
    assert_eq!(synStatus::DEVICE_ALREADY_ACQUIRED.0 as i64, g::synStatus_synDeviceAlreadyAcquired as i64);
    assert_eq!(HABANA_DIM_MAX as i64, g::HABANA_DIM_MAX as i64);
}
