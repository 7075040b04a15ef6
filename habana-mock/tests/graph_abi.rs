//! The mock's graph API under arbitrary inputs through its C ABI (the table a libSynapse user
//! gets): any GUID (known or not), operand counts, shapes (sizes, and zero or huge ones), dtypes
//! and parameter bytes, built, compiled and, when the compile succeeds, launched on real buffers.
//! Every call returns a status of the real runtime's set for these calls and never reaches the
//! guard's panic path (its message would say "panic").

use std::ffi::{CStr, CString};

use habana_sys::*;
use proptest::prelude::*;

const GUIDS: &[&str] = &[
    "add_fwd_f32",
    "sub_fwd_bf16",
    "mult_fwd_f32",
    "max_fwd_f32",
    "min_fwd_bf16",
    "cast_bf16_to_f32",
    "cast_f32_to_bf16",
    "constant_f32",
    "memset",
    "relu_fwd_f32",
    "relu_bwd_bf16",
    "softmax_fwd_f32",
    "softmax_bwd_f32",
    "logsoftmax_fwd_f32",
    "softmax_cross_entropy_fwd_f32",
    "softmax_cross_entropy_bwd_f32",
    "reduce_sum_fwd_f32",
    "reduce_sum_multi_dim_fwd_f32",
    "isfinite_fwd_f32",
    "gemm",
    "gemm_dedx",
    "gemm_dedw",
    "batch_gemm",
    "no_such_kernel_fwd_f32",
    "",
    "add",
];
const DTYPES: &[synDataType] = &[synDataType::SINGLE, synDataType::BF16, synDataType::INT32, synDataType::INT8];

fn api() -> &'static SynapseApi {
    static API: std::sync::OnceLock<SynapseApi> = std::sync::OnceLock::new();
    API.get_or_init(|| {
        let api = habana_mock::api();
        // SAFETY: no arguments.
        assert_eq!(unsafe { (api.syn_initialize)() }, synStatus::SUCCESS);
        api
    })
}

/// Fails the case when a status is outside `allowed` or the last error mentions a panic.
fn checked(what: &str, st: synStatus, allowed: &[synStatus]) -> Result<synStatus, TestCaseError> {
    if !st.is_success() {
        let f = api().syn_get_last_error_message.expect("the mock exports it");
        // SAFETY: NUL-terminated thread-local string, copied at once.
        let m = unsafe { CStr::from_ptr(f()) }.to_string_lossy().into_owned();
        prop_assert!(!m.contains("panic"), "{what}: {m}");
    }
    prop_assert!(st.is_success() || allowed.contains(&st), "{what}: unexpected {st}");
    Ok(st)
}

#[derive(Debug, Clone)]
struct TensorSpec {
    sizes: Vec<u64>,
    dtype: usize,
}

fn tensor_spec() -> impl Strategy<Value = TensorSpec> {
    let size = prop_oneof![8 => 1u64..5, 1 => Just(0u64), 1 => Just(u64::MAX / 3)];
    (prop::collection::vec(size, 1..4), 0..DTYPES.len()).prop_map(|(sizes, dtype)| TensorSpec { sizes, dtype })
}

fn one_node(
    guid: usize,
    ins: &[TensorSpec],
    outs: &[TensorSpec],
    params: &[u8],
    null_input: bool,
) -> Result<(), TestCaseError> {
    use synStatus as S;
    let api = api();
    let mut g: synGraphHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    checked("graph", unsafe { (api.syn_graph_create)(&mut g, synDeviceType::GAUDI2) }, &[])?;
    let mut handles = Vec::new();
    let mut ok_geometry = Vec::new();
    for (k, t) in ins.iter().chain(outs).enumerate() {
        let name = CString::new(format!("t{k}")).unwrap();
        let mut h: synTensor = std::ptr::null_mut();
        let mut s: synSectionHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointers, live graph, NUL-terminated name.
        unsafe {
            checked("section", (api.syn_section_create)(&mut s, 0, g), &[])?;
            checked(
                "tensor",
                (api.syn_tensor_handle_create)(&mut h, g, synTensorType::DATA_TENSOR, name.as_ptr()),
                &[],
            )?;
            checked("assign", (api.syn_tensor_assign_to_section)(h, s, 0), &[])?;
        }
        let mut geo = synTensorGeometry::default();
        geo.sizes[..t.sizes.len()].copy_from_slice(&t.sizes);
        geo.dims = t.sizes.len() as u32;
        // SAFETY: live tensor, valid geometry.
        let st = checked(
            "geometry",
            unsafe { (api.syn_tensor_set_geometry)(h, &geo, synGeometryType::SIZES) },
            &[S::INVALID_ARGUMENT],
        )?;
        ok_geometry.push(st.is_success());
        // SAFETY: live tensor.
        checked("dtype", unsafe { (api.syn_tensor_set_device_data_type)(h, DTYPES[t.dtype]) }, &[])?;
        handles.push(h);
    }
    let (mut hin, hout) = (handles[..ins.len()].to_vec(), handles[ins.len()..].to_vec());
    if null_input && !hin.is_empty() {
        hin[0] = std::ptr::null_mut();
    }
    let guid = CString::new(GUIDS[guid]).unwrap();
    let p = if params.is_empty() { std::ptr::null() } else { params.as_ptr().cast() };
    // SAFETY: arrays of the given lengths, params of the given size, NUL-terminated strings.
    let st = unsafe {
        (api.syn_node_create)(
            g,
            hin.as_ptr(),
            hout.as_ptr(),
            hin.len() as u32,
            hout.len() as u32,
            p,
            params.len() as u32,
            guid.as_ptr(),
            c"node".as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    let created = checked("node", st, &[S::FAIL, S::INVALID_ARGUMENT])?.is_success();
    if created {
        let skip = usize::from(null_input && !ins.is_empty());
        prop_assert!(ok_geometry[skip..].iter().all(|&ok| ok), "a node over a tensor without geometry was accepted");
    }
    let mut r: synRecipeHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer, live graph.
    let st = unsafe { (api.syn_graph_compile)(&mut r, g, c"fuzz".as_ptr(), std::ptr::null()) };
    let compiled = checked("compile", st, &[S::FAIL, S::UNSUPPORTED])?.is_success();
    // SAFETY: live graph.
    checked("destroy", unsafe { (api.syn_graph_destroy)(g) }, &[])?;
    if compiled && created {
        launch(r)?;
    }
    if compiled {
        // SAFETY: live recipe.
        checked("recipe destroy", unsafe { (api.syn_recipe_destroy)(r) }, &[])?;
    }
    Ok(())
}

/// Binds every persistent tensor of `r` to a buffer of its size and runs it once.
fn launch(r: synRecipeHandle) -> Result<(), TestCaseError> {
    use synStatus as S;
    let api = api();
    let dev = device();
    let mut n = 0u32;
    // SAFETY: live recipe, valid out-pointer.
    checked("amount", unsafe { (api.syn_tensor_retrieve_launch_amount)(r, &mut n) }, &[])?;
    let mut ids = vec![0u64; n as usize];
    // SAFETY: room for n ids.
    checked("ids", unsafe { (api.syn_tensor_retrieve_launch_ids)(r, ids.as_mut_ptr(), n) }, &[])?;
    let mut infos = vec![synRetrievedLaunchTensorInfo::default(); n as usize];
    for (i, id) in infos.iter_mut().zip(&ids) {
        i.tensorId = *id;
    }
    // SAFETY: room for n infos.
    checked("info", unsafe { (api.syn_tensor_retrieve_launch_info_by_id)(r, n, infos.as_mut_ptr()) }, &[])?;
    let mut ws = 0u64;
    // SAFETY: live recipe.
    checked("workspace", unsafe { (api.syn_workspace_get_size)(&mut ws, r) }, &[])?;
    let mut bufs = Vec::new();
    let mut launch = Vec::new();
    for i in &infos {
        let elems: u64 = i.tensorMaxSize[..i.tensorDims as usize].iter().product();
        let bytes = elems
            * if i.tensorDataType == synDataType::BF16 {
                2
            } else if i.tensorDataType == synDataType::INT8 {
                1
            } else {
                4
            };
        let mut a = 0u64;
        // SAFETY: valid out-pointer.
        checked("malloc", unsafe { (api.syn_device_malloc)(dev, bytes.max(1), 0, 0, &mut a) }, &[])?;
        bufs.push(a);
        launch.push(synLaunchTensorInfo {
            tensorName: std::ptr::null(),
            pTensorAddress: a,
            tensorType: synTensorType::DATA_TENSOR,
            tensorSize: [0; HABANA_DIM_MAX],
            tensorId: i.tensorId,
        });
    }
    let mut wsa = 0u64;
    if ws > 0 {
        // SAFETY: valid out-pointer.
        checked("malloc ws", unsafe { (api.syn_device_malloc)(dev, ws, 0, 0, &mut wsa) }, &[])?;
    }
    let mut s: synStreamHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    checked("stream", unsafe { (api.syn_stream_create_generic)(&mut s, dev, 0) }, &[])?;
    // SAFETY: live stream and recipe; infos of live allocations.
    let st =
        unsafe { (api.syn_launch_with_external_events)(s, launch.as_ptr(), n, wsa, r, std::ptr::null_mut(), 0, 0) };
    checked("launch", st, &[])?;
    // SAFETY: live stream. A kernel failure (e.g. a label out of range) is an asynchronous synFail.
    checked("sync", unsafe { (api.syn_stream_synchronize)(s) }, &[S::FAIL])?;
    // SAFETY: live stream, idle.
    checked("stream destroy", unsafe { (api.syn_stream_destroy)(s) }, &[])?;
    for a in bufs.into_iter().chain((ws > 0).then_some(wsa)) {
        // SAFETY: live allocation, not in use.
        checked("free", unsafe { (api.syn_device_free)(dev, a, 0) }, &[])?;
    }
    Ok(())
}

fn device() -> synDeviceId {
    static DEV: std::sync::OnceLock<synDeviceId> = std::sync::OnceLock::new();
    *DEV.get_or_init(|| {
        let mut d = 0;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (api().syn_device_acquire_by_module_id)(&mut d, 0) }, synStatus::SUCCESS);
        d
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_graph_nodes_never_panic_and_return_runtime_statuses(
        guid in 0..GUIDS.len(),
        ins in prop::collection::vec(tensor_spec(), 0..4),
        outs in prop::collection::vec(tensor_spec(), 0..3),
        params in prop::collection::vec(any::<u8>(), 0..20),
        null_input in any::<bool>(),
    ) {
        one_node(guid, &ins, &outs, &params, null_input)?;
    }

    /// Well-formed elementwise and GEMM nodes over small shapes compile and run most of the time:
    /// the arbitrary case above must not only exercise the rejection paths.
    #[test]
    fn small_matching_shapes_compile_and_run(k in 1u64..4, m in 1u64..4, n in 1u64..4, ta: bool, tb: bool) {
        let f = |sizes: Vec<u64>| TensorSpec { sizes, dtype: 0 };
        one_node(0, &[f(vec![k, m]), f(vec![k, 1])], &[f(vec![k, m])], &[], false)?;
        let a = if ta { vec![m, k] } else { vec![k, m] };
        let b = if tb { vec![k, n] } else { vec![n, k] };
        one_node(19, &[f(a), f(b)], &[f(vec![n, m])], &[u8::from(ta), u8::from(tb)], false)?;
    }
}
