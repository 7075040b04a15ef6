//! The graph conformance suite: `synapse::graph` (build, compile, launch many times with new
//! buffers, in-place update through a shared section, workspace, recipe reload, every error
//! path) run against every backend of `tests/support/harness.rs`: the in-process CPU mock and a
//! shared library loaded through the real loader (`$DROPCOMPUTE_SYNAPSE_LIB`, else the mock
//! built as a shared library). Results are checked against f64 references.
//!
//! Cases marked mock-only assert the mock's last-error messages or use its knobs; every status
//! asserted elsewhere is the one the ≈1.16 runtime returns (`graph_api.md` §8).
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/harness.rs"]
#[macro_use]
mod harness;

use std::ffi::CString;

use dropcompute::schedule::{GradDtype, GradientOps, GradientScratch};
use dropcompute::synapse::graph::{
    CastRounding, DType, GraphArg, GraphBuilder, GraphRecipe, Op, RecipeCache, RecipeOrigin, Reduction,
};
use dropcompute::synapse::{Device, DeviceBuffer, DeviceRepr, Error, HostBuffer, LaunchTensor, Recipe, Stream};
use habana_sys::{
    SynapseApi, TENSOR_INVALID_ID, synDataType, synGeometryType, synGraphHandle, synRecipeHandle, synSectionHandle,
    synStatus, synTensor, synTensorGeometry, synTensorType,
};
use harness::{Harness, hermetic, run, status_of};

fn device_type(dev: &Device) -> habana_sys::synDeviceType {
    dev.info().unwrap().device_type
}

fn upload<T: DeviceRepr>(s: &Stream, dev: &Device, data: &[T]) -> DeviceBuffer<T> {
    let host = HostBuffer::from_slice(dev, data).unwrap();
    let mut d = DeviceBuffer::<T>::alloc(dev, data.len()).unwrap();
    s.copy_h2d(&host, &mut d).unwrap();
    s.synchronize().unwrap();
    d
}

fn download<T: DeviceRepr>(s: &Stream, dev: &Device, d: &DeviceBuffer<T>) -> Vec<T> {
    let mut host = HostBuffer::<T>::zeroed(dev, d.len()).unwrap();
    s.copy_d2h(d, &mut host).unwrap();
    s.synchronize().unwrap();
    host.to_vec().unwrap()
}

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0).collect()
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(g) - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: got {g}, want {w}");
    }
}

/// Broadcast add of a [2, 3] and a [1, 3] tensor, launched 5 times with new buffers each time.
fn add_launches_with_new_buffers(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let a = g.persistent("a", DType::F32, &[2, 3]).unwrap();
    let b = g.persistent("b", DType::F32, &[1, 3]).unwrap();
    let c = g.persistent("c", DType::F32, &[2, 3]).unwrap();
    g.node("add", &Op::Add, &[a, b], &[c]).unwrap();
    let r = g.compile("add_bcast").unwrap();
    assert_eq!(r.workspace_size(), 0);
    let ids: Vec<u64> = [a, b, c].iter().map(|&t| r.tensor(t).unwrap().id.unwrap()).collect();
    assert!(ids.iter().all(|&id| id != TENSOR_INVALID_ID));
    let mut addrs = std::collections::HashSet::new();
    for k in 0..5u32 {
        let (av, bv) = (vals(6, k), vals(3, k + 100));
        let (da, db) = (upload(&s, &dev, &av), upload(&s, &dev, &bv));
        let dc = DeviceBuffer::<f32>::alloc(&dev, 6).unwrap();
        assert!(addrs.insert(dc.addr()), "a fresh address each launch");
        r.launch(&s, &[GraphArg::new(a, &da), GraphArg::new(b, &db), GraphArg::new(c, &dc)], None, &[]).unwrap();
        let want: Vec<f64> = (0..6).map(|i| f64::from(av[i] + bv[i % 3])).collect();
        close(&download(&s, &dev, &dc), &want, 0.0, "a + b");
    }
}

/// SGD with momentum as elementwise nodes, weights and momentum updated in place through
/// shared sections: m' = mu·m + g; w' = w − lr·m' (lr and mu are device scalars).
fn in_place_update(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let n = 8u64;
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let (ws, ms) = (g.section().unwrap(), g.section().unwrap());
    let w = g.persistent_in(ws, 0, "w", DType::F32, &[n]).unwrap();
    let w_new = g.persistent_in(ws, 0, "w_new", DType::F32, &[n]).unwrap();
    let m = g.persistent_in(ms, 0, "m", DType::F32, &[n]).unwrap();
    let m_new = g.persistent_in(ms, 0, "m_new", DType::F32, &[n]).unwrap();
    let grad = g.persistent("grad", DType::F32, &[n]).unwrap();
    let lr = g.persistent("lr", DType::F32, &[1]).unwrap();
    let mu = g.persistent("mu", DType::F32, &[1]).unwrap();
    let mu_m = g.workspace("mu_m", DType::F32, &[n]).unwrap();
    let step = g.workspace("step", DType::F32, &[n]).unwrap();
    g.node("mu_m", &Op::Mul, &[m, mu], &[mu_m]).unwrap();
    g.node("m_new", &Op::Add, &[mu_m, grad], &[m_new]).unwrap();
    g.node("step", &Op::Mul, &[m_new, lr], &[step]).unwrap();
    g.node("w_new", &Op::Sub, &[w, step], &[w_new]).unwrap();
    let r = g.compile("sgd_momentum").unwrap();
    assert!(r.workspace_size() >= 2 * n * 4, "two workspace intermediates: {}", r.workspace_size());
    let wsbuf = DeviceBuffer::<u8>::alloc(&dev, r.workspace_size() as usize).unwrap();
    let w0 = vals(n as usize, 1);
    let (dw, dm) = (upload(&s, &dev, &w0), upload(&s, &dev, &vec![0f32; n as usize]));
    let (dlr, dmu) = (upload(&s, &dev, &[0.1f32]), upload(&s, &dev, &[0.9f32]));
    let (mut rw, mut rm): (Vec<f64>, Vec<f64>) = (w0.iter().map(|&v| f64::from(v)).collect(), vec![0.0; n as usize]);
    // A new gradient buffer per launch; the weights and the momentum are bound to one buffer
    // each, as input and output (in place).
    let gvs: Vec<Vec<f32>> = (0..4).map(|k| vals(n as usize, 50 + k)).collect();
    let dgs: Vec<DeviceBuffer<f32>> = gvs.iter().map(|g| upload(&s, &dev, g)).collect();
    let args = |k: usize| {
        [
            GraphArg::new(w, &dw),
            GraphArg::new(w_new, &dw),
            GraphArg::new(m, &dm),
            GraphArg::new(m_new, &dm),
            GraphArg::new(grad, &dgs[k]),
            GraphArg::new(lr, &dlr),
            GraphArg::new(mu, &dmu),
        ]
    };
    for (k, gv) in gvs.iter().enumerate().take(3) {
        r.launch(&s, &args(k), Some(&wsbuf), &[]).unwrap();
        for i in 0..n as usize {
            rm[i] = f64::from((0.9f32 * rm[i] as f32) + gv[i]);
            rw[i] = f64::from(rw[i] as f32 - 0.1f32 * rm[i] as f32);
        }
    }
    close(&download(&s, &dev, &dm), &rm, 1e-6, "momentum");
    close(&download(&s, &dev, &dw), &rw, 1e-6, "weights");
    // A workspace recipe launched without one is refused before the C call.
    let e = r.launch(&s, &args(3), None, &[]).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what: "workspace", .. }), "{e}");
}

/// One MLP layer forward and backward on the device vs f64: z = relu(x·Wᵀ + b), logits = z,
/// softmax cross-entropy (mean), dlogits, dW = dzᵀ·x (gemm_dedw), dx = dz·W (gemm_dedx).
fn mlp_layer_forward_backward(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let (bsz, inp, out) = (4u64, 6u64, 5u64);
    let f = DType::F32;
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let x = g.persistent("x", f, &[bsz, inp]).unwrap();
    let w = g.persistent("w", f, &[out, inp]).unwrap();
    let b = g.persistent("b", f, &[out]).unwrap();
    let labels = g.persistent("labels", DType::I32, &[bsz]).unwrap();
    let pre = g.workspace("pre", f, &[bsz, out]).unwrap();
    let z = g.workspace("z", f, &[bsz, out]).unwrap();
    let loss = g.persistent("loss", f, &[1]).unwrap();
    let ls = g.workspace("log_softmax", f, &[bsz, out]).unwrap();
    let dz = g.workspace("dz", f, &[bsz, out]).unwrap();
    let dpre = g.workspace("dpre", f, &[bsz, out]).unwrap();
    let dw = g.persistent("dw", f, &[out, inp]).unwrap();
    let dx = g.persistent("dx", f, &[bsz, inp]).unwrap();
    let lin = Op::Gemm { transpose_a: false, transpose_b: true };
    g.node("fc", &lin, &[x, w, b], &[pre]).unwrap();
    g.node("relu", &Op::Relu, &[pre], &[z]).unwrap();
    g.node("ce", &Op::SoftmaxCrossEntropy { reduction: Reduction::Mean }, &[z, labels], &[loss, ls]).unwrap();
    g.node("ce_bwd", &Op::SoftmaxCrossEntropyBackward { reduction: Reduction::Mean }, &[ls, labels], &[dz]).unwrap();
    g.node("relu_bwd", &Op::ReluBackward, &[dz, pre], &[dpre]).unwrap();
    g.node("dw", &Op::GemmDw { transpose_a: false, transpose_b: true }, &[dpre, x], &[dw]).unwrap();
    g.node("dx", &Op::GemmDx { transpose_a: false, transpose_b: true }, &[dpre, w], &[dx]).unwrap();
    let r = g.compile("mlp_layer").unwrap();
    let (xv, wv, bv) = (vals(24, 3), vals(30, 4), vals(5, 5));
    let lv = [1i32, 4, 0, 2];
    let (dxv_, dwv_, dbv, dl) =
        (upload(&s, &dev, &xv), upload(&s, &dev, &wv), upload(&s, &dev, &bv), upload(&s, &dev, &lv));
    let dloss = DeviceBuffer::<f32>::alloc(&dev, 1).unwrap();
    let ddw = DeviceBuffer::<f32>::alloc(&dev, 30).unwrap();
    let ddx = DeviceBuffer::<f32>::alloc(&dev, 24).unwrap();
    let wsb = DeviceBuffer::<u8>::alloc(&dev, r.workspace_size().max(1) as usize).unwrap();
    let args = [
        GraphArg::new(x, &dxv_),
        GraphArg::new(w, &dwv_),
        GraphArg::new(b, &dbv),
        GraphArg::new(labels, &dl),
        GraphArg::new(loss, &dloss),
        GraphArg::new(dw, &ddw),
        GraphArg::new(dx, &ddx),
    ];
    r.launch(&s, &args, Some(&wsb), &[]).unwrap();
    // f64 reference.
    let (bs, ni, no) = (bsz as usize, inp as usize, out as usize);
    let xr = |i: usize, k: usize| f64::from(xv[i * ni + k]);
    let wr = |o: usize, k: usize| f64::from(wv[o * ni + k]);
    let mut prev = vec![0f64; bs * no];
    for i in 0..bs {
        for o in 0..no {
            prev[i * no + o] = (0..ni).map(|k| xr(i, k) * wr(o, k)).sum::<f64>() + f64::from(bv[o]);
        }
    }
    let zr: Vec<f64> = prev.iter().map(|&v| v.max(0.0)).collect();
    let mut lossr = 0.0;
    let mut dzr = vec![0f64; bs * no];
    for i in 0..bs {
        let row = &zr[i * no..(i + 1) * no];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let se: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        lossr -= (row[lv[i] as usize] - mx) - se.ln();
        for o in 0..no {
            let p = (row[o] - mx).exp() / se;
            dzr[i * no + o] = (p - if o == lv[i] as usize { 1.0 } else { 0.0 }) / bs as f64;
        }
    }
    lossr /= bs as f64;
    let dprer: Vec<f64> = (0..bs * no).map(|j| if prev[j] > 0.0 { dzr[j] } else { 0.0 }).collect();
    let dwr: Vec<f64> = (0..no * ni).map(|j| (0..bs).map(|i| dprer[i * no + j / ni] * xr(i, j % ni)).sum()).collect();
    let dxr: Vec<f64> = (0..bs * ni).map(|j| (0..no).map(|o| dprer[(j / ni) * no + o] * wr(o, j % ni)).sum()).collect();
    close(&download(&s, &dev, &dloss), &[lossr], 1e-5, "loss");
    close(&download(&s, &dev, &ddw), &dwr, 1e-5, "dW");
    close(&download(&s, &dev, &ddx), &dxr, 1e-5, "dx");
}

/// bf16 path: cast f32 -> bf16 (round to nearest even and toward zero), add in bf16, cast back;
/// reductions to a scalar; isfinite.
fn bf16_casts_reductions_isfinite(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let n = 6u64;
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let x = g.persistent("x", DType::F32, &[2, 3]).unwrap();
    let xb = g.workspace("xb", DType::Bf16, &[2, 3]).unwrap();
    let xz = g.persistent("xz", DType::Bf16, &[2, 3]).unwrap();
    let sum_b = g.workspace("sum_b", DType::Bf16, &[2, 3]).unwrap();
    let back = g.persistent("back", DType::F32, &[2, 3]).unwrap();
    let total = g.persistent("total", DType::F32, &[1]).unwrap();
    let cols = g.persistent("cols", DType::F32, &[1, 3]).unwrap();
    let fin = g.persistent("finite", DType::I8, &[2, 3]).unwrap();
    g.node("to_bf16", &Op::Cast { rounding: CastRounding::NearestEven }, &[x], &[xb]).unwrap();
    g.node("to_bf16_rz", &Op::Cast { rounding: CastRounding::TowardZero }, &[x], &[xz]).unwrap();
    g.node("double", &Op::Add, &[xb, xb], &[sum_b]).unwrap();
    g.node("to_f32", &Op::Cast { rounding: CastRounding::NearestEven }, &[sum_b], &[back]).unwrap();
    g.node("total", &Op::ReduceSumAxes { axes: vec![], keep_dims: false }, &[x], &[total]).unwrap();
    g.node("cols", &Op::ReduceSum { axis: 0 }, &[x], &[cols]).unwrap();
    g.node("finite", &Op::IsFinite, &[x], &[fin]).unwrap();
    let r = g.compile("bf16_reduce").unwrap();
    let xv = [1.0f32 + 1.0 / 256.0 + 1.0 / 512.0, -3.3, 0.1, f32::INFINITY, 2.5, 1e-3];
    let dx = upload(&s, &dev, &xv);
    let outs: Vec<DeviceBuffer<f32>> = (0..3).map(|k| DeviceBuffer::alloc(&dev, [6, 1, 3][k]).unwrap()).collect();
    let dz = DeviceBuffer::<half::bf16>::alloc(&dev, n as usize).unwrap();
    let df = DeviceBuffer::<u8>::alloc(&dev, n as usize).unwrap();
    let wsb = DeviceBuffer::<u8>::alloc(&dev, r.workspace_size().max(1) as usize).unwrap();
    let args = [
        GraphArg::new(x, &dx),
        GraphArg::new(xz, &dz),
        GraphArg::new(back, &outs[0]),
        GraphArg::new(total, &outs[1]),
        GraphArg::new(cols, &outs[2]),
        GraphArg::new(fin, &df),
    ];
    r.launch(&s, &args, Some(&wsb), &[]).unwrap();
    let want: Vec<f32> = xv.iter().map(|&v| half::bf16::from_f32(v).to_f32() * 2.0).collect();
    let got = download(&s, &dev, &outs[0]);
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let rz: Vec<u16> = xv.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    let got_rz: Vec<u16> = download(&s, &dev, &dz).iter().map(|v| v.to_bits()).collect();
    assert_eq!(got_rz, rz, "round toward zero truncates");
    assert_eq!(download(&s, &dev, &outs[1])[0], f32::INFINITY, "a non-finite value propagates through the sum");
    let colsv = download(&s, &dev, &outs[2]);
    assert_eq!(colsv[0], f32::INFINITY, "column 0 holds the infinity");
    close(
        &colsv[1..],
        &[f64::from(xv[1]) + f64::from(xv[4]), f64::from(xv[2]) + f64::from(xv[5])],
        1e-7,
        "columns 1, 2",
    );
    assert_eq!(download(&s, &dev, &df), vec![1, 1, 1, 0, 1, 1]);
}

/// A compiled graph recipe saved and loaded again (the cache path) launches by raw ids with the
/// same result.
fn recipe_reload(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let x = g.persistent("x", DType::F32, &[4]).unwrap();
    let y = g.persistent("y", DType::F32, &[4]).unwrap();
    g.node("softmax", &Op::Softmax { axis: 0 }, &[x], &[y]).unwrap();
    let r = g.compile("softmax4").unwrap();
    let dir = hermetic::temp_dir("graph-recipe");
    let path = dir.path().join("softmax4.recipe");
    r.recipe().save(&path).unwrap();
    let loaded = Recipe::load(&h.rt, &path).unwrap();
    let ids = loaded.tensor_ids(&["x", "y"]).unwrap();
    assert_eq!(ids, vec![r.tensor(x).unwrap().id.unwrap(), r.tensor(y).unwrap().id.unwrap()]);
    assert_eq!(loaded.launch_ids().unwrap().len(), 2);
    let xv = [1.0f32, 2.0, 3.0, 4.0];
    let dx = upload(&s, &dev, &xv);
    let (d1, d2) = (DeviceBuffer::<f32>::alloc(&dev, 4).unwrap(), DeviceBuffer::<f32>::alloc(&dev, 4).unwrap());
    r.launch(&s, &[GraphArg::new(x, &dx), GraphArg::new(y, &d1)], None, &[]).unwrap();
    s.launch(&loaded, &[LaunchTensor::by_id(ids[0], &dx), LaunchTensor::by_id(ids[1], &d2)], None, &[]).unwrap();
    let (a, b) = (download(&s, &dev, &d1), download(&s, &dev, &d2));
    assert_eq!(a, b);
    let se: f64 = xv.iter().map(|&v| f64::from(v).exp()).sum();
    close(&a, &xv.iter().map(|&v| f64::from(v).exp() / se).collect::<Vec<_>>(), 1e-6, "softmax");
    let e = loaded.tensor_ids(&["x", "nope"]).unwrap_err();
    assert!(matches!(&e, Error::UnknownTensor { tensor, .. } if tensor == "nope"), "{e}");
}

/// Mistakes the safe layer catches before any C call, each naming the node and tensor.
fn safe_layer_errors(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let a = g.persistent("a", DType::F32, &[2, 3]).unwrap();
    let b = g.persistent("b", DType::Bf16, &[2, 3]).unwrap();
    let c = g.persistent("c", DType::F32, &[3, 2]).unwrap();
    let e = g.node("add", &Op::Add, &[a, b], &[c]).unwrap_err();
    assert_eq!(e.to_string(), "node add: tensor b: expected dtype f32, got dtype bf16");
    let e = g.node("relu", &Op::Relu, &[a], &[c]).unwrap_err();
    assert_eq!(e.to_string(), "node relu: tensor c: expected shape [2, 3], got shape [3, 2]");
    let e = g.persistent("a", DType::F32, &[1]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { what: "tensor name", .. }), "{e}");
    let e = g.persistent("z", DType::F32, &[2, 0]).unwrap_err();
    assert!(e.to_string().contains("tensor z"), "{e}");
    let d = g.persistent("d", DType::F32, &[2, 3]).unwrap();
    g.node("relu", &Op::Relu, &[a], &[d]).unwrap();
    let r = g.compile("relu").unwrap();
    let small = DeviceBuffer::<f32>::alloc(&dev, 5).unwrap();
    let ok = DeviceBuffer::<f32>::alloc(&dev, 6).unwrap();
    let e = r.launch(&s, &[GraphArg::new(a, &small), GraphArg::new(d, &ok)], None, &[]).unwrap_err();
    assert!(matches!(e, Error::SizeMismatch { expected: 24, got: 20, .. }), "{e}");
    let e = r.launch(&s, &[GraphArg::new(a, &ok)], None, &[]).unwrap_err();
    assert!(e.to_string().contains("persistent tensor d is not bound"), "{e}");
}

/// The raw graph API: handles and statuses the real runtime returns for each mistake.
struct Raw<'a> {
    api: &'a SynapseApi,
    g: synGraphHandle,
}

impl<'a> Raw<'a> {
    fn new(api: &'a SynapseApi, dt: habana_sys::synDeviceType) -> Self {
        let mut g: synGraphHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (api.syn_graph_create)(&mut g, dt) }, synStatus::SUCCESS);
        Self { api, g }
    }

    fn section(&self) -> synSectionHandle {
        let mut s: synSectionHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live graph.
        assert_eq!(unsafe { (self.api.syn_section_create)(&mut s, 0, self.g) }, synStatus::SUCCESS);
        s
    }

    /// A tensor of `sizes` (FCD first) and `dtype`, in a new persistent section unless `ws`.
    fn tensor(&self, name: &str, sizes: &[u64], dtype: synDataType, ws: bool) -> synTensor {
        let c = CString::new(name).unwrap();
        let mut t: synTensor = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live graph, NUL-terminated name.
        let st = unsafe { (self.api.syn_tensor_handle_create)(&mut t, self.g, synTensorType::DATA_TENSOR, c.as_ptr()) };
        assert_eq!(st, synStatus::SUCCESS, "{name}");
        if !ws {
            let s = self.section();
            // SAFETY: live tensor and section.
            assert_eq!(unsafe { (self.api.syn_tensor_assign_to_section)(t, s, 0) }, synStatus::SUCCESS);
        }
        let mut geo = synTensorGeometry::default();
        geo.sizes[..sizes.len()].copy_from_slice(sizes);
        geo.dims = sizes.len() as u32;
        // SAFETY: live tensor, valid geometry.
        assert_eq!(unsafe { (self.api.syn_tensor_set_geometry)(t, &geo, synGeometryType::SIZES) }, synStatus::SUCCESS);
        // SAFETY: live tensor.
        assert_eq!(unsafe { (self.api.syn_tensor_set_device_data_type)(t, dtype) }, synStatus::SUCCESS);
        t
    }

    fn node(&self, guid: &str, name: &str, ins: &[synTensor], outs: &[synTensor], params: &[u8]) -> synStatus {
        let (g, n) = (CString::new(guid).unwrap(), CString::new(name).unwrap());
        let p = if params.is_empty() { std::ptr::null() } else { params.as_ptr().cast() };
        // SAFETY: arrays of the given lengths, params of the given size, NUL-terminated strings.
        unsafe {
            (self.api.syn_node_create)(
                self.g,
                ins.as_ptr(),
                outs.as_ptr(),
                ins.len() as u32,
                outs.len() as u32,
                p,
                params.len() as u32,
                g.as_ptr(),
                n.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
            )
        }
    }

    fn compile(&self, name: &str) -> (synStatus, synRecipeHandle) {
        let c = CString::new(name).unwrap();
        let mut r: synRecipeHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live graph, NUL-terminated name.
        (unsafe { (self.api.syn_graph_compile)(&mut r, self.g, c.as_ptr(), std::ptr::null()) }, r)
    }

    fn last_message(&self) -> String {
        dropcompute::synapse::result::last_message(self.api).unwrap_or_default()
    }
}

impl Drop for Raw<'_> {
    fn drop(&mut self) {
        // SAFETY: live graph, destroyed once.
        unsafe { (self.api.syn_graph_destroy)(self.g) };
    }
}

const F32: synDataType = synDataType::SINGLE;

/// Build-time and compile-time mistakes through the raw table, with the real runtime's status
/// at the real runtime's call.
fn raw_build_and_compile_errors(h: &Harness) {
    let dev = h.device();
    let api = h.rt.api();
    let mock = h.control.is_some();
    let dt = device_type(&dev);
    // Unknown GUID: synFail at node creation.
    let g = Raw::new(api, dt);
    let (a, b, c) = (g.tensor("a", &[4], F32, false), g.tensor("b", &[4], F32, false), g.tensor("c", &[4], F32, false));
    assert_eq!(g.node("no_such_kernel_fwd_f32", "n0", &[a, b], &[c], &[]), synStatus::FAIL);
    if mock {
        assert!(
            g.last_message().contains("n0") && g.last_message().contains("no_such_kernel_fwd_f32"),
            "{}",
            g.last_message()
        );
    }
    // A params size that is no version of the kernel passes creation and fails the compile.
    assert_eq!(g.node("add_fwd_f32", "add_bad_params", &[a, b], &[c], &[0, 0, 0]), synStatus::SUCCESS);
    // Setters after node creation: synObjectAlreadyInitialized.
    // SAFETY: live tensor.
    let st = unsafe { (api.syn_tensor_set_device_data_type)(a, synDataType::BF16) };
    assert_eq!(st, synStatus::OBJECT_ALREADY_INITIALIZED);
    let (st, _) = g.compile("bad_params");
    assert_eq!(st, synStatus::FAIL);
    if mock {
        assert!(
            g.last_message().contains("add_bad_params") && g.last_message().contains("params size 3"),
            "{}",
            g.last_message()
        );
    }
    drop(g);

    // Duplicate tensor name: synNameIsAlreadyUsed with the existing handle.
    let g = Raw::new(api, dt);
    let x = g.tensor("x", &[4], F32, false);
    let c = CString::new("x").unwrap();
    let mut dup: synTensor = std::ptr::null_mut();
    // SAFETY: valid out-pointer, live graph, NUL-terminated name.
    let st = unsafe { (api.syn_tensor_handle_create)(&mut dup, g.g, synTensorType::DATA_TENSOR, c.as_ptr()) };
    assert_eq!((st, dup), (synStatus::NAME_IS_ALREADY_USED, x));
    // Section flags after an assignment: synFail.
    let s = g.section();
    let t = g.tensor("t", &[4], F32, true);
    // SAFETY: live tensor and section.
    assert_eq!(unsafe { (api.syn_tensor_assign_to_section)(t, s, 0) }, synStatus::SUCCESS);
    // SAFETY: live section.
    assert_eq!(unsafe { (api.syn_section_set_persistent)(s, false) }, synStatus::FAIL);
    // gemm operands of mixed dtypes: synFail at creation; too few operands: synInvalidArgument.
    let (ga, gb, gc) = (
        g.tensor("ga", &[3, 2], F32, false),
        g.tensor("gb", &[5, 3], synDataType::BF16, false),
        g.tensor("gc", &[5, 2], F32, false),
    );
    assert_eq!(g.node("gemm", "mixed", &[ga, gb], &[gc], &[]), synStatus::FAIL);
    assert_eq!(g.node("gemm", "one_input", &[ga], &[gc], &[]), synStatus::INVALID_ARGUMENT);
    drop(g);

    // gemm inner dimensions differ: success at creation, synFail at compile.
    let g = Raw::new(api, dt);
    let (ga, gb, gc) =
        (g.tensor("a", &[3, 2], F32, false), g.tensor("b", &[5, 4], F32, false), g.tensor("c", &[5, 2], F32, false));
    assert_eq!(g.node("gemm", "mm", &[ga, gb], &[gc], &[0, 0]), synStatus::SUCCESS);
    assert_eq!(g.compile("mm").0, synStatus::FAIL);
    if mock {
        assert!(g.last_message().contains("mismatch between common dimensions"), "{}", g.last_message());
    }
    drop(g);

    // A cycle: synFail at compile.
    let g = Raw::new(api, dt);
    let x = g.tensor("x", &[4], F32, false);
    let (t1, t2) = (g.tensor("t1", &[4], F32, true), g.tensor("t2", &[4], F32, true));
    assert_eq!(g.node("add_fwd_f32", "n1", &[x, t2], &[t1], &[]), synStatus::SUCCESS);
    assert_eq!(g.node("add_fwd_f32", "n2", &[t1, x], &[t2], &[]), synStatus::SUCCESS);
    assert_eq!(g.compile("cycle").0, synStatus::FAIL);
    if mock {
        assert!(g.last_message().contains("cycle"), "{}", g.last_message());
    }
    drop(g);

    // A workspace tensor read but never written (a non-persistent graph input): synFail.
    let g = Raw::new(api, dt);
    let (w, y) = (g.tensor("w", &[4], F32, true), g.tensor("y", &[4], F32, false));
    assert_eq!(g.node("relu_fwd_f32", "r", &[w], &[y], &[]), synStatus::SUCCESS);
    assert_eq!(g.compile("nonpersistent_input").0, synStatus::FAIL);
    drop(g);

    // Compiled twice: synFail; an empty graph compiles.
    let g = Raw::new(api, dt);
    let (x, y) = (g.tensor("x", &[4], F32, false), g.tensor("y", &[4], F32, false));
    assert_eq!(g.node("relu_fwd_f32", "r", &[x], &[y], &[]), synStatus::SUCCESS);
    let (st, r) = g.compile("once");
    assert_eq!(st, synStatus::SUCCESS);
    assert_eq!(g.compile("twice").0, synStatus::FAIL);
    // SAFETY: live recipe, destroyed once.
    assert_eq!(unsafe { (api.syn_recipe_destroy)(r) }, synStatus::SUCCESS);
    drop(g);
    let g = Raw::new(api, dt);
    let (st, r) = g.compile("empty");
    assert_eq!(st, synStatus::SUCCESS);
    // SAFETY: live recipe, destroyed once.
    assert_eq!(unsafe { (api.syn_recipe_destroy)(r) }, synStatus::SUCCESS);
}

/// Launch-time mistakes (the runtime's section validation): a persistent tensor missing, two
/// sections given the same address, unknown names get the all-ones id.
fn raw_launch_errors(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let a = g.persistent("a", DType::F32, &[4]).unwrap();
    let b = g.persistent("b", DType::F32, &[4]).unwrap();
    let c = g.persistent("c", DType::F32, &[4]).unwrap();
    g.node("add", &Op::Add, &[a, b], &[c]).unwrap();
    let r: GraphRecipe = g.compile("add4").unwrap();
    let id = |t| r.tensor(t).unwrap().id.unwrap();
    let bufs: Vec<DeviceBuffer<f32>> = (0..3).map(|_| DeviceBuffer::alloc(&dev, 4).unwrap()).collect();
    // Missing persistent tensor: synFailedSectionValidation (an all-ones id is skipped).
    let e = s
        .launch(
            r.recipe(),
            &[
                LaunchTensor::by_id(id(a), &bufs[0]),
                LaunchTensor::by_id(TENSOR_INVALID_ID, &bufs[1]),
                LaunchTensor::by_id(id(c), &bufs[2]),
            ],
            None,
            &[],
        )
        .unwrap_err();
    assert_eq!(status_of(&e), synStatus::FAILED_SECTION_VALIDATION, "{e}");
    if h.control.is_some() {
        assert!(e.to_string().contains("tensor b missing"), "{e}");
    }
    // Two sections at one address: synFailedSectionValidation.
    let e = s
        .launch(
            r.recipe(),
            &[
                LaunchTensor::by_id(id(a), &bufs[0]),
                LaunchTensor::by_id(id(b), &bufs[0]),
                LaunchTensor::by_id(id(c), &bufs[2]),
            ],
            None,
            &[],
        )
        .unwrap_err();
    assert_eq!(status_of(&e), synStatus::FAILED_SECTION_VALIDATION, "{e}");
    // Unknown names: success with the all-ones id at the C level.
    let names = [CString::new("a").unwrap(), CString::new("nope").unwrap()];
    // SAFETY: live recipe.
    let ids = unsafe { dropcompute::synapse::result::tensor_ids(h.rt.api(), r.recipe().raw(), &names) }.unwrap();
    assert_eq!(ids, vec![id(a), TENSOR_INVALID_ID]);
    s.synchronize().unwrap();
}

/// A recipe compiled for another device type is refused at launch with synInvalidArgument.
fn device_type_mismatch(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let other = if device_type(&dev) == habana_sys::synDeviceType::GAUDI3 {
        habana_sys::synDeviceType::GAUDI2
    } else {
        habana_sys::synDeviceType::GAUDI3
    };
    let mut g = GraphBuilder::new(&h.rt, other).unwrap();
    let x = g.persistent("x", DType::F32, &[4]).unwrap();
    let y = g.persistent("y", DType::F32, &[4]).unwrap();
    g.node("relu", &Op::Relu, &[x], &[y]).unwrap();
    let r = g.compile("other_device").unwrap();
    let (bx, by) = (DeviceBuffer::<f32>::alloc(&dev, 4).unwrap(), DeviceBuffer::<f32>::alloc(&dev, 4).unwrap());
    let e = r.launch(&s, &[GraphArg::new(x, &bx), GraphArg::new(y, &by)], None, &[]).unwrap_err();
    assert_eq!(status_of(&e), synStatus::INVALID_ARGUMENT, "{e}");
}

/// synGraphCompileV2 (1.20+, optional) hands out an error object on failure; synEventMapTensor
/// makes a launch record an event for an external output.
fn raw_compile_v2_and_event_map(h: &Harness) {
    let dev = h.device();
    let api = h.rt.api();
    let dt = device_type(&dev);
    if let (Some(v2), Some(get_status), Some(get_len), Some(get_msg), Some(destroy)) = (
        api.syn_graph_compile_v2,
        api.syn_error_get_status,
        api.syn_error_get_message_length,
        api.syn_error_get_message,
        api.syn_error_destroy,
    ) {
        let g = Raw::new(api, dt);
        let (a, b, c) = (
            g.tensor("a", &[3, 2], F32, false),
            g.tensor("b", &[5, 4], F32, false),
            g.tensor("c", &[5, 2], F32, false),
        );
        assert_eq!(g.node("gemm", "mm", &[a, b], &[c], &[0, 0]), synStatus::SUCCESS);
        let mut r: synRecipeHandle = std::ptr::null_mut();
        let mut e: habana_sys::synErrorHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointers, live graph, NUL-terminated name.
        let st = unsafe { v2(&mut r, g.g, c"v2".as_ptr(), &mut e) };
        assert_eq!(st, synStatus::FAIL);
        assert!(!e.is_null(), "an error object on failure");
        let (mut es, mut len) = (synStatus::SUCCESS, 0usize);
        // SAFETY: live error object, valid out-pointers.
        unsafe {
            assert_eq!(get_status(e, &mut es), synStatus::SUCCESS);
            assert_eq!(get_len(e, &mut len), synStatus::SUCCESS);
        }
        assert_eq!(es, synStatus::FAIL);
        assert!(len > 0);
        let mut buf = vec![0 as std::ffi::c_char; len + 1];
        // SAFETY: the buffer holds len + 1 bytes.
        assert_eq!(unsafe { get_msg(e, buf.as_mut_ptr(), buf.len()) }, synStatus::SUCCESS);
        // SAFETY: NUL-terminated within the buffer.
        let msg = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        assert_eq!(msg.len(), len);
        if h.control.is_some() {
            assert!(msg.contains("mismatch between common dimensions"), "{msg}");
        }
        // SAFETY: live error object, released once.
        assert_eq!(unsafe { destroy(e) }, synStatus::SUCCESS);
    } else {
        eprintln!("skipped synGraphCompileV2: the library predates 1.20");
    }
    // Event mapped to an external output.
    let s = Stream::new(&dev).unwrap();
    let g = Raw::new(api, dt);
    let (x, y) = (g.tensor("x", &[4], F32, false), g.tensor("y", &[4], F32, false));
    // SAFETY: live tensor, before node creation.
    assert_eq!(unsafe { (api.syn_tensor_set_external)(y, true) }, synStatus::SUCCESS);
    assert_eq!(g.node("relu_fwd_f32", "r", &[x], &[y], &[]), synStatus::SUCCESS);
    let (st, r) = g.compile("mapped");
    assert_eq!(st, synStatus::SUCCESS);
    let names = [CString::new("x").unwrap(), CString::new("y").unwrap()];
    // SAFETY: live recipe.
    let ids = unsafe { dropcompute::synapse::result::tensor_ids(api, r, &names) }.unwrap();
    let (bx, by) = (upload(&s, &dev, &[-1f32, 2.0, -3.0, 4.0]), DeviceBuffer::<f32>::alloc(&dev, 4).unwrap());
    let info = |id: u64, addr: u64| habana_sys::synLaunchTensorInfo {
        tensorName: std::ptr::null(),
        pTensorAddress: addr,
        tensorType: synTensorType::DATA_TENSOR,
        tensorSize: [0; habana_sys::HABANA_DIM_MAX],
        tensorId: id,
    };
    let ev = dropcompute::synapse::Event::new(&dev, true).unwrap();
    let mut evs = [ev.raw()];
    let map = [info(ids[1], 0)];
    // SAFETY: one live event, one launch info, live recipe.
    assert_eq!(unsafe { (api.syn_event_map_tensor)(evs.as_mut_ptr(), 1, map.as_ptr(), r) }, synStatus::SUCCESS);
    if h.control.is_some() {
        let not_external = [info(ids[0], 0)];
        // SAFETY: as above.
        let st = unsafe { (api.syn_event_map_tensor)(evs.as_mut_ptr(), 1, not_external.as_ptr(), r) };
        assert_eq!(st, synStatus::FAIL, "x is not external: 'Unable to find tensor' is synFail");
    }
    let launch = [info(ids[0], bx.addr()), info(ids[1], by.addr())];
    // SAFETY: live stream and recipe; live allocations of the tensors' sizes.
    let st =
        unsafe { (api.syn_launch_with_external_events)(s.raw(), launch.as_ptr(), 2, 0, r, evs.as_mut_ptr(), 1, 0) };
    assert_eq!(st, synStatus::SUCCESS);
    // A mapped event is waited for from a stream (the runtime does not synchronize on it).
    let s2 = Stream::new(&dev).unwrap();
    s2.wait_event(&ev).unwrap();
    s2.synchronize().unwrap();
    assert!(ev.is_complete().unwrap(), "the mapped event was recorded by the launch");
    assert_eq!(download(&s, &dev, &by), vec![0.0, 2.0, 0.0, 4.0]);
    // SAFETY: live recipe, idle stream, destroyed once.
    assert_eq!(unsafe { (api.syn_recipe_destroy)(r) }, synStatus::SUCCESS);
}

/// `Stream::fill`: synMemsetD32Async, D16 and D8 by the element width, on a sub-range; a range
/// past the end is refused before the C call.
fn memset_d8_d16_d32(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let mut d = DeviceBuffer::<f32>::alloc(&dev, 8).unwrap();
    s.fill(&mut d, 0..8, 0.0).unwrap();
    s.fill(&mut d, 1..7, 1.5).unwrap();
    assert_eq!(download(&s, &dev, &d), vec![0.0, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 0.0]);
    let mut w = upload(&s, &dev, &[half::bf16::from_f32(9.0); 5]);
    s.fill(&mut w, 2..4, half::bf16::from_f32(-0.5)).unwrap();
    let want: Vec<f32> = vec![9.0, 9.0, -0.5, -0.5, 9.0];
    assert_eq!(download(&s, &dev, &w).iter().map(|v| v.to_f32()).collect::<Vec<_>>(), want);
    let mut b = upload(&s, &dev, &[7u8; 6]);
    s.fill(&mut b, 3..6, 0xA5).unwrap();
    s.fill(&mut b, 0..0, 1).unwrap();
    assert_eq!(download(&s, &dev, &b), vec![7, 7, 7, 0xA5, 0xA5, 0xA5]);
    let e = s.fill(&mut b, 4..7, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { what: "fill range", .. }), "{e}");
    assert!(e.to_string().contains("4..7") && e.to_string().contains("6 elements"), "{e}");
}

/// Builds two independent nodes: `early` (relu of `x` into external `y`) and `late` (a GEMM),
/// optionally with `late` ordered before `early` by a node dependency; compiles, maps `ev` to
/// `y` and launches with `ev` signalled. Returns the recipe, `y`'s buffer and its input.
fn mapped_graph(
    h: &Harness,
    s: &Stream,
    ev: &dropcompute::synapse::Event,
    late_first: bool,
) -> (GraphRecipe, DeviceBuffer<f32>, Vec<f32>) {
    let dev = s.device();
    let mut g = GraphBuilder::new(&h.rt, device_type(dev)).unwrap();
    let x = g.persistent("x", DType::F32, &[6]).unwrap();
    let y = g.persistent("y", DType::F32, &[6]).unwrap();
    let (a, b, c) = (
        g.persistent("a", DType::F32, &[16, 16]).unwrap(),
        g.persistent("b", DType::F32, &[16, 16]).unwrap(),
        g.persistent("c", DType::F32, &[16, 16]).unwrap(),
    );
    g.set_external(y).unwrap();
    let early = g.node("early", &Op::Relu, &[x], &[y]).unwrap();
    let late = g.node("late", &Op::Gemm { transpose_a: false, transpose_b: false }, &[a, b], &[c]).unwrap();
    if late_first {
        g.depend(&[late], &[early]).unwrap();
    }
    let r = g.compile(if late_first { "mapped_late_first" } else { "mapped" }).unwrap();
    assert!(r.tensor(y).unwrap().external && !r.tensor(x).unwrap().external);
    r.map_event(ev, y).unwrap();
    let xv = vals(6, 4);
    let dx = upload(s, dev, &xv);
    let dy = DeviceBuffer::<f32>::alloc(dev, 6).unwrap();
    let m: Vec<_> = (0..3).map(|k| upload(s, dev, &vals(256, k))).collect();
    let args = [
        GraphArg::new(x, &dx),
        GraphArg::new(y, &dy),
        GraphArg::new(a, &m[0]),
        GraphArg::new(b, &m[1]),
        GraphArg::new(c, &m[2]),
    ];
    r.launch(s, &args, None, &[ev]).unwrap();
    s.synchronize().unwrap();
    (r, dy, xv)
}

/// External tensors, events mapped to them, node dependencies, eager graphs, launch info: the
/// safe wrappers on any backend. A stream waiting for the mapped event sees the tensor ready;
/// every misuse is refused before the C call, naming the object.
fn external_events_dependencies_eager_launch_info(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    for late_first in [false, true] {
        let ev = dropcompute::synapse::Event::new(&dev, false).unwrap();
        let (r, dy, xv) = mapped_graph(h, &s, &ev, late_first);
        let s2 = Stream::new(&dev).unwrap();
        s2.wait_event(&ev).unwrap();
        let mut host = HostBuffer::<f32>::zeroed(&dev, 6).unwrap();
        s2.copy_d2h(&dy, &mut host).unwrap();
        s2.synchronize().unwrap();
        let want: Vec<f64> = xv.iter().map(|&v| f64::from(v.max(0.0))).collect();
        close(&host.to_vec().unwrap(), &want, 0.0, "relu(x) read after the mapped event");
        // Launch info: every persistent tensor, row-major, with its section and direction.
        let info = r.recipe().launch_tensors().unwrap();
        let mut names: Vec<&str> = info.iter().map(|i| i.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["a", "b", "c", "x", "y"]);
        let by = |n: &str| info.iter().find(|i| i.name == n).unwrap();
        assert_eq!((by("x").shape.as_slice(), by("x").bytes(), by("x").is_input), (&[6u64][..], Some(24), true));
        assert_eq!(
            (by("c").shape.as_slice(), by("c").dtype, by("c").is_input),
            (&[16u64, 16][..], synDataType::SINGLE, false)
        );
        assert_eq!(by("y").offset, 0);
        for t in &info {
            assert_eq!(Some(t.id), r.tensors().iter().find(|c| c.name == t.name).unwrap().id, "{}", t.name);
        }
        let sections: std::collections::HashSet<u32> = info.iter().map(|i| i.section).collect();
        assert_eq!(sections.len(), 5, "one section per tensor: {info:?}");
    }
    // Misuse, refused before the C call.
    let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
    let x = g.persistent("x", DType::F32, &[4]).unwrap();
    let y = g.persistent("y", DType::F32, &[4]).unwrap();
    let w = g.workspace("w", DType::F32, &[4]).unwrap();
    let e = g.set_external(w).unwrap_err();
    assert!(e.to_string().contains("tensor w is a workspace tensor"), "{e}");
    let n1 = g.node("n1", &Op::Relu, &[x], &[w]).unwrap();
    let e = g.set_external(x).unwrap_err();
    assert!(e.to_string().contains("tensor x is already used by a node"), "{e}");
    let n2 = g.node("n2", &Op::Relu, &[w], &[y]).unwrap();
    let e = g.depend(&[n1], &[n2, n1]).unwrap_err();
    assert!(e.to_string().contains("node n1 both blocks and is blocked"), "{e}");
    let e = g.depend(&[], &[n2]).unwrap_err();
    assert!(e.to_string().contains("empty node list"), "{e}");
    g.depend(&[n1], &[n2]).unwrap(); // redundant with the data edge, accepted
    let r = g.compile("not_external").unwrap();
    let ev = dropcompute::synapse::Event::new(&dev, false).unwrap();
    let e = r.map_event(&ev, y).unwrap_err();
    assert!(e.to_string().contains("(y) is not external") && e.to_string().contains("not_external"), "{e}");
    let e = r.map_event(&ev, w).unwrap_err();
    assert!(e.to_string().contains("(w) is not a persistent tensor"), "{e}");
    // Eager graphs: Gaudi2/Gaudi3 only; built and launched like any graph.
    let e = GraphBuilder::new_eager(&h.rt, habana_sys::synDeviceType::GAUDI).unwrap_err();
    assert_eq!(status_of(&e), synStatus::INVALID_ARGUMENT, "{e}");
    assert!(e.to_string().contains("synGraphCreateEager"), "{e}");
    let mut g = GraphBuilder::new_eager(&h.rt, device_type(&dev)).unwrap();
    let (x, y) = (g.persistent("x", DType::F32, &[3]).unwrap(), g.persistent("y", DType::F32, &[3]).unwrap());
    g.node("twice", &Op::Add, &[x, x], &[y]).unwrap();
    let r = g.compile("eager_twice").unwrap();
    let (dx, dy) = (upload(&s, &dev, &[1f32, -2.0, 3.5]), DeviceBuffer::<f32>::alloc(&dev, 3).unwrap());
    r.launch(&s, &[GraphArg::new(x, &dx), GraphArg::new(y, &dy)], None, &[]).unwrap();
    assert_eq!(download(&s, &dev, &dy), vec![2.0, -4.0, 7.0]);
}

/// Mock only (virtual time through the control ABI): an event mapped to a tensor is recorded
/// when the node producing it ends, before the launch ends; a node dependency that puts the
/// unrelated GEMM first moves it to the launch's end.
fn mapped_event_fires_at_its_producer(h: &Harness) {
    let ctl = h.control();
    ctl.configure(&dropcompute::mock::MockConfig {
        time_mode: dropcompute::mock::TimeMode::Virtual,
        ..Default::default()
    })
    .unwrap();
    let mut ends = Vec::new();
    {
        let dev = h.device();
        let s = Stream::new(&dev).unwrap();
        for late_first in [false, true] {
            let (start, end) = (
                dropcompute::synapse::Event::new(&dev, true).unwrap(),
                dropcompute::synapse::Event::new(&dev, true).unwrap(),
            );
            let (ev, seen) = (
                dropcompute::synapse::Event::new(&dev, true).unwrap(),
                dropcompute::synapse::Event::new(&dev, true).unwrap(),
            );
            s.synchronize().unwrap();
            start.record(&s).unwrap();
            let (_r, _dy, _) = mapped_graph(h, &s, &ev, late_first);
            end.record(&s).unwrap();
            let s2 = Stream::new(&dev).unwrap();
            s2.wait_event(&ev).unwrap();
            seen.record(&s2).unwrap();
            s2.synchronize().unwrap();
            s.synchronize().unwrap();
            let (t0, t1, ty) =
                (start.timestamp_ns().unwrap(), end.timestamp_ns().unwrap(), seen.timestamp_ns().unwrap());
            ends.push((late_first, t0, ty, t1));
        }
    }
    ctl.configure(&dropcompute::mock::MockConfig::default()).unwrap();
    for (late_first, t0, ty, t1) in ends {
        assert!(t0 <= ty && ty <= t1, "late_first {late_first}: {t0} <= {ty} <= {t1}");
        if late_first {
            assert_eq!(ty, t1, "y is produced by the last node: ready at the launch's end");
        } else {
            assert!(ty < t1, "y is produced by the first node: ready {} ns before the launch's end", t1 - ty);
        }
    }
}

/// The scheduler's gradient operations as graphs: zero, accumulate (f32 and bf16 -> f32, in
/// place), the non-finite flag, rescale by a device scalar; against f64 references.
fn gradient_ops_as_graphs(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let n = 10usize;
    for dtype in [GradDtype::F32, GradDtype::Bf16] {
        let ops = GradientOps::graphs(&dev, n, dtype).unwrap();
        let acc = upload(&s, &dev, &vals(n, 1));
        ops.zero(&s, &acc).unwrap();
        assert_eq!(download(&s, &dev, &acc), vec![0.0; n]);
        let mut want = vec![0f64; n];
        for k in 0..3 {
            let g = vals(n, 10 + k);
            let scratch = match dtype {
                GradDtype::F32 => GradientScratch::F32(upload(&s, &dev, &g)),
                GradDtype::Bf16 => GradientScratch::Bf16(upload(
                    &s,
                    &dev,
                    &g.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(),
                )),
            };
            ops.accumulate(&s, &acc, &scratch).unwrap();
            s.synchronize().unwrap();
            for i in 0..n {
                let x = if dtype == GradDtype::Bf16 { half::bf16::from_f32(g[i]).to_f32() } else { g[i] };
                want[i] = f64::from(want[i] as f32 + x);
            }
        }
        close(&download(&s, &dev, &acc), &want, 0.0, "accumulated");
        let flag = DeviceBuffer::<u32>::alloc(&dev, 1).unwrap();
        ops.nonfinite(&s, &flag, &acc).unwrap();
        assert_eq!(download(&s, &dev, &flag), vec![0], "finite (also with a negative sum)");
        let sc = upload(&s, &dev, &[0.25f32]);
        ops.scale(&s, &acc, &sc).unwrap();
        let scaled: Vec<f64> = want.iter().map(|&v| f64::from(v as f32 * 0.25)).collect();
        close(&download(&s, &dev, &acc), &scaled, 0.0, "rescaled");
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut v = vals(n, 3);
            v[7] = bad;
            let a = upload(&s, &dev, &v);
            ops.nonfinite(&s, &flag, &a).unwrap();
            assert_ne!(download(&s, &dev, &flag), vec![0], "{bad} is flagged");
        }
    }
}

/// The recipe cache: the first compile stores the recipe, an identical graph (a later
/// process) loads it, another shape compiles anew, a corrupt file is replaced.
fn recipe_cache(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let dir = hermetic::temp_dir("recipe-cache");
    let cache = RecipeCache::new(dir.path().join("cache"));
    let build = |n: u64| {
        let mut g = GraphBuilder::new(&h.rt, device_type(&dev)).unwrap();
        let x = g.persistent("x", DType::F32, &[n]).unwrap();
        let y = g.persistent("y", DType::F32, &[n]).unwrap();
        let t = g.workspace("t", DType::F32, &[n]).unwrap();
        g.node("relu", &Op::Relu, &[x], &[t]).unwrap();
        g.node("double", &Op::Add, &[t, t], &[y]).unwrap();
        (g, x, y)
    };
    let run = |r: &GraphRecipe, x, y, n: usize| {
        let xv = vals(n, 8);
        let (dx, dy) = (upload(&s, &dev, &xv), DeviceBuffer::<f32>::alloc(&dev, n).unwrap());
        let ws = DeviceBuffer::<u8>::alloc(&dev, r.workspace_size().max(1) as usize).unwrap();
        r.launch(&s, &[GraphArg::new(x, &dx), GraphArg::new(y, &dy)], Some(&ws), &[]).unwrap();
        let want: Vec<f64> = xv.iter().map(|&v| f64::from(v.max(0.0) * 2.0)).collect();
        close(&download(&s, &dev, &dy), &want, 0.0, "2 relu(x)");
    };
    let (g, x, y) = build(6);
    let first = g.compile_cached("relu2", &cache).unwrap();
    assert!(matches!(first.origin(), RecipeOrigin::Compiled(_)), "{:?}", first.origin());
    run(&first, x, y, 6);
    let files: Vec<_> = std::fs::read_dir(cache.dir()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let (g, x, y) = build(6);
    let again = g.compile_cached("relu2", &cache).unwrap();
    assert!(matches!(again.origin(), RecipeOrigin::Cache(_)), "{:?}", again.origin());
    assert_eq!(again.workspace_size(), first.workspace_size());
    assert_eq!(again.tensor(x).unwrap().id, first.tensor(x).unwrap().id);
    run(&again, x, y, 6);
    let (g, x, y) = build(7);
    let other = g.compile_cached("relu2", &cache).unwrap();
    assert!(matches!(other.origin(), RecipeOrigin::Compiled(_)), "another shape is another key");
    run(&other, x, y, 7);
    std::fs::write(&files[0], b"not a recipe").unwrap();
    let (g, x, y) = build(6);
    let replaced = g.compile_cached("relu2", &cache).unwrap();
    assert!(matches!(replaced.origin(), RecipeOrigin::Compiled(_)), "a corrupt file is recompiled");
    run(&replaced, x, y, 6);
    let (g, _, _) = build(6);
    assert!(matches!(g.compile_cached("relu2", &cache).unwrap().origin(), RecipeOrigin::Cache(_)), "and stored again");
}

suite!(
    any: [
        recipe_cache,
        gradient_ops_as_graphs,
        add_launches_with_new_buffers,
        in_place_update,
        mlp_layer_forward_backward,
        bf16_casts_reductions_isfinite,
        recipe_reload,
        safe_layer_errors,
        raw_build_and_compile_errors,
        raw_launch_errors,
        device_type_mismatch,
        memset_d8_d16_d32,
        raw_compile_v2_and_event_map,
        external_events_dependencies_eager_launch_info,
    ],
    mock_only: [mapped_event_fires_at_its_producer],
);
