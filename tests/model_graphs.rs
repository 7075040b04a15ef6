//! The training job's device graphs (`train::model_graphs`: the MLP forward/backward with its
//! loss, and SGD with momentum) built with `synapse::graph` and launched on the in-process mock,
//! checked against the host MLP of `train::mlp` (an f64 reference for the gradient, bit for
//! bit for the SGD update), plus the emulated device time of a launch (`--base-latency-ms`
//! keeps its meaning) and the rejection of bad bindings.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use dropcompute::mock::{MockConfig, MockControl, Noise, TimeMode, api};
use dropcompute::synapse::{Device, DeviceBuffer, DeviceRepr, Error, Event, HostBuffer, Runtime, Stream};
use dropcompute_train::data::Dataset;
use dropcompute_train::mlp::{self, MlpScratch, MlpShape};
use dropcompute_train::model_graphs::{MlpGraphs, forward_backward_recipe_name, stage_labels};

const SHAPE: MlpShape = MlpShape { input: 64, hidden: 32, classes: 10 };

/// The in-process mock is one per test process; its configuration is global, so tests take
/// turns and each configures it first.
fn mock(cfg: &MockConfig) -> (MutexGuard<'static, ()>, &'static Arc<Runtime>) {
    static L: Mutex<()> = Mutex::new(());
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    let g = L.lock().unwrap_or_else(PoisonError::into_inner);
    hermetic::scrub_process_env(); // the mock's configuration is not the calling shell's
    MockControl::in_process().configure(cfg).unwrap();
    (g, RT.get_or_init(|| Runtime::new(api()).unwrap()))
}

fn upload<T: DeviceRepr>(s: &Stream, dev: &Device, data: &[T]) -> DeviceBuffer<T> {
    let mut d = DeviceBuffer::alloc(dev, data.len()).unwrap();
    s.copy_h2d(&HostBuffer::from_slice(dev, data).unwrap(), &mut d).unwrap();
    s.synchronize().unwrap();
    d
}

fn download<T: DeviceRepr>(s: &Stream, dev: &Device, d: &DeviceBuffer<T>) -> Vec<T> {
    let mut h = HostBuffer::zeroed(dev, d.len()).unwrap();
    s.copy_d2h(d, &mut h).unwrap();
    s.synchronize().unwrap();
    h.to_vec().unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A micro-batch of 16 rows of the digits: 12 samples then 4 padding rows.
fn micro_batch() -> (Vec<f32>, Vec<i32>) {
    let d = Dataset::embedded_digits().unwrap();
    let ids: Vec<u64> = (0..12).map(|i| i * 97 + 5).collect();
    d.rows_padded(&ids, 16).unwrap()
}

/// The summed gradient and loss of the valid rows in f64, written out from the model's
/// definition (`train::mlp` module docs), independently of both implementations.
fn reference(params: &[f32], x: &[f32], y: &[i32]) -> (Vec<f64>, f64) {
    let MlpShape { input, hidden, classes } = SHAPE;
    let p: Vec<f64> = params.iter().map(|&v| f64::from(v)).collect();
    let (w1, b1, w2, b2) = (&p[SHAPE.w1()], &p[SHAPE.b1()], &p[SHAPE.w2()], &p[SHAPE.b2()]);
    let mut g = vec![0f64; SHAPE.param_len()];
    let mut loss = 0.0;
    for (row, &label) in y.iter().enumerate() {
        let Ok(label) = usize::try_from(label) else { continue };
        let xr: Vec<f64> = x[row * input..(row + 1) * input].iter().map(|&v| f64::from(v)).collect();
        let pre: Vec<f64> =
            (0..hidden).map(|j| b1[j] + (0..input).map(|i| xr[i] * w1[i * hidden + j]).sum::<f64>()).collect();
        let h: Vec<f64> = pre.iter().map(|&v| v.max(0.0)).collect();
        let z: Vec<f64> =
            (0..classes).map(|c| b2[c] + (0..hidden).map(|j| h[j] * w2[j * classes + c]).sum::<f64>()).collect();
        let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
        loss += max + sum.ln() - z[label];
        let dz: Vec<f64> =
            (0..classes).map(|c| (z[c] - max).exp() / sum - if c == label { 1.0 } else { 0.0 }).collect();
        for j in 0..hidden {
            for c in 0..classes {
                g[SHAPE.w2().start + j * classes + c] += h[j] * dz[c];
            }
        }
        for c in 0..classes {
            g[SHAPE.b2().start + c] += dz[c];
        }
        for j in 0..hidden {
            let dh: f64 = (0..classes).map(|c| dz[c] * w2[j * classes + c]).sum();
            let dpre = if pre[j] > 0.0 { dh } else { 0.0 };
            for i in 0..input {
                g[i * hidden + j] += xr[i] * dpre;
            }
            g[SHAPE.b1().start + j] += dpre;
        }
    }
    (g, loss)
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

#[test]
fn one_micro_batch_gradient_and_loss_match_the_host_mlp() {
    let (_g, rt) = mock(&MockConfig::default());
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let graphs = MlpGraphs::build(&dev, SHAPE, 16, 0.1, 0.9, 0.0).unwrap();
    assert_eq!(graphs.forward_backward_recipe().name(), forward_backward_recipe_name(SHAPE, 16));
    let params = mlp::init_params(SHAPE, 11).unwrap();
    let (x, y) = micro_batch();
    let (labels, mask) = stage_labels(&y);
    let dp = upload(&s, &dev, &params);
    let dx = upload(&s, &dev, &x);
    let dy = upload(&s, &dev, &labels);
    let dm = upload(&s, &dev, &mask);
    let dg = upload(&s, &dev, &vec![f32::NAN; SHAPE.param_len()]); // overwritten, not accumulated
    let dl = upload(&s, &dev, &[1.5f32, 3.0]);
    for _ in 0..2 {
        graphs.launch_forward_backward(&s, &dp, &dx, &dy, &dm, &dg, &dl).unwrap();
    }
    let grad = download(&s, &dev, &dg);
    let loss = download(&s, &dev, &dl);

    let mut host = vec![0.0f32; SHAPE.param_len()];
    let (sum, rows) = mlp::forward_backward(SHAPE, &params, &x, &y, &mut host, &mut MlpScratch::default()).unwrap();
    assert_eq!(rows, 12);
    let (want, want_loss) = reference(&params, &x, &y);
    // Both f32 implementations lie within f32 rounding of the f64 reference, so within it of
    // each other: 1e-5 of the largest gradient entry (sums of at most 64 products).
    let tol = 1e-5 * max_abs(&want);
    for (i, ((&g, &h), &w)) in grad.iter().zip(&host).zip(&want).enumerate() {
        assert!((f64::from(g) - w).abs() <= tol, "graph grad[{i}] = {g}, f64 reference {w}");
        assert!((f64::from(h) - w).abs() <= tol, "host grad[{i}] = {h}, f64 reference {w}");
        assert!((g - h).abs() as f64 <= 2.0 * tol, "grad[{i}]: graph {g}, host mlp.rs {h}");
    }
    assert!(max_abs(&want) > 0.1, "a gradient worth comparing");
    // The loss accumulates [loss sum, rows] over launches (twice here, onto [1.5, 3]).
    assert!((sum - want_loss).abs() <= 1e-5 * want_loss, "host loss {sum}, f64 {want_loss}");
    assert!((f64::from(loss[0]) - (1.5 + 2.0 * want_loss)).abs() <= 1e-5 * want_loss, "{loss:?} vs {want_loss}");
    assert_eq!(loss[1], 3.0 + 24.0, "valid rows counted, padding not");
}

#[test]
fn an_all_padding_micro_batch_gives_a_zero_gradient_and_no_loss() {
    let (_g, rt) = mock(&MockConfig::default());
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let graphs = MlpGraphs::build(&dev, SHAPE, 4, 0.1, 0.9, 0.0).unwrap();
    let params = mlp::init_params(SHAPE, 2).unwrap();
    let d = Dataset::embedded_digits().unwrap();
    let (x, y) = d.rows_padded(&[], 4).unwrap();
    let (labels, mask) = stage_labels(&y);
    let (dp, dx, dy, dm) =
        (upload(&s, &dev, &params), upload(&s, &dev, &x), upload(&s, &dev, &labels), upload(&s, &dev, &mask));
    let dg = upload(&s, &dev, &vec![7.0f32; SHAPE.param_len()]);
    let dl = upload(&s, &dev, &[2.0f32, 5.0]);
    graphs.launch_forward_backward(&s, &dp, &dx, &dy, &dm, &dg, &dl).unwrap();
    assert!(download(&s, &dev, &dg).iter().all(|&g| g == 0.0), "as mlp::forward_backward with no valid row");
    assert_eq!(download(&s, &dev, &dl), vec![2.0, 5.0]);
}

#[test]
fn sgd_graph_matches_the_host_update_bitwise() {
    let (_g, rt) = mock(&MockConfig::default());
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let n = SHAPE.param_len();
    let p0 = mlp::init_params(SHAPE, 3).unwrap();
    let g: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 0.1).collect();
    let v0: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.11).cos() * 0.01).collect();
    for (lr, mu, wd) in [(0.05f32, 0.9f32, 1e-4f32), (0.2, 0.9, 0.0)] {
        let graphs = MlpGraphs::build(&dev, SHAPE, 8, lr, mu, wd).unwrap();
        let (dp, dv, dg) = (upload(&s, &dev, &p0), upload(&s, &dev, &v0), upload(&s, &dev, &g));
        graphs.launch_sgd(&s, &dp, &dv, &dg).unwrap();
        graphs.launch_sgd(&s, &dp, &dv, &dg).unwrap();
        let (p, v) = (download(&s, &dev, &dp), download(&s, &dev, &dv));
        let (mut hp, mut hv) = (p0.clone(), v0.clone());
        for _ in 0..2 {
            mlp::sgd_momentum(&mut hp, &mut hv, &g, lr, mu, wd).unwrap();
        }
        assert_eq!(bits(&p), bits(&hp), "params, lr {lr} momentum {mu} weight decay {wd}");
        assert_eq!(bits(&v), bits(&hv), "velocity, lr {lr} momentum {mu} weight decay {wd}");
        assert_ne!(bits(&p), bits(&p0));
    }
}

/// Device time of one launch of each graph on a virtual-time mock without noise.
fn launch_times(cfg: &MockConfig) -> (u64, u64) {
    let (_g, rt) = mock(cfg);
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let graphs = MlpGraphs::build(&dev, SHAPE, 16, 0.1, 0.9, 0.0).unwrap();
    let (x, y) = micro_batch();
    let (labels, mask) = stage_labels(&y);
    let p = upload(&s, &dev, &mlp::init_params(SHAPE, 1).unwrap());
    let v = upload(&s, &dev, &vec![0f32; SHAPE.param_len()]);
    let (dx, dy, dm) = (upload(&s, &dev, &x), upload(&s, &dev, &labels), upload(&s, &dev, &mask));
    let dg = upload(&s, &dev, &vec![0f32; SHAPE.param_len()]);
    let dl = upload(&s, &dev, &[0f32, 0.0]);
    let ev: Vec<Event> = (0..3).map(|_| Event::new(&dev, true).unwrap()).collect();
    ev[0].record(&s).unwrap();
    graphs.launch_forward_backward(&s, &p, &dx, &dy, &dm, &dg, &dl).unwrap();
    ev[1].record(&s).unwrap();
    graphs.launch_sgd(&s, &p, &v, &dg).unwrap();
    ev[2].record(&s).unwrap();
    s.synchronize().unwrap();
    let ns = |a: &Event, b: &Event| b.elapsed_since(a).unwrap().as_nanos() as u64;
    (ns(&ev[0], &ev[1]), ns(&ev[1], &ev[2]))
}

#[test]
fn the_forward_backward_recipe_costs_its_configured_base_latency() {
    let virt = MockConfig { time_mode: TimeMode::Virtual, noise: Noise::None, ..MockConfig::default() };
    // Without a configured base latency both graphs follow the per-node cost model (µs).
    let (fwd_model, sgd_model) = launch_times(&virt);
    assert!(fwd_model > 0 && fwd_model < 1_000_000, "{fwd_model} ns");
    assert!(sgd_model > 0 && sgd_model < 1_000_000, "{sgd_model} ns");
    // `train --base-latency-ms 12` configures exactly this: the forward/backward recipe costs
    // 12 ms, the SGD step keeps its modelled cost.
    let mut cfg = virt.clone();
    cfg.graph_base_latency_ns.insert(forward_backward_recipe_name(SHAPE, 16), 12_000_000);
    assert_eq!(launch_times(&cfg), (12_000_000, sgd_model));
    // A slow module scales it (slowdown × base, no noise).
    cfg.per_device = (0..cfg.devices)
        .map(|m| dropcompute::mock::DeviceOverride {
            module_id: m,
            slowdown: 2.0,
            noise: None,
            script_ns: vec![],
            script_recipe: None,
        })
        .collect();
    assert_eq!(launch_times(&cfg).0, 24_000_000);
    // Out of range: refused naming the recipe.
    let mut bad = virt;
    bad.graph_base_latency_ns.insert("x".into(), u64::MAX);
    let e = bad.validate().unwrap_err();
    assert!(e.to_string().contains("graph_base_latency_ns[\"x\"]"), "{e}");
}

#[test]
fn bad_bindings_are_refused_before_the_launch() {
    let (_g, rt) = mock(&MockConfig::default());
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let graphs = MlpGraphs::build(&dev, SHAPE, 4, 0.1, 0.9, 0.0).unwrap();
    let p = upload(&s, &dev, &mlp::init_params(SHAPE, 1).unwrap());
    let x = upload(&s, &dev, &vec![0.5f32; 4 * 64]);
    let y = upload(&s, &dev, &[1i32, 2, 3, 4]);
    let m = upload(&s, &dev, &[1f32; 4]);
    let l = upload(&s, &dev, &[0f32, 0.0]);
    let short = upload(&s, &dev, &vec![0f32; SHAPE.param_len() - 1]);
    // A gradient one element short: its last layer (b2) does not fit.
    let e = graphs.launch_forward_backward(&s, &p, &x, &y, &m, &short, &l).unwrap_err();
    assert!(matches!(e, Error::SizeMismatch { .. }), "{e:?}");
    // A one-element loss buffer cannot hold the row count at byte 4.
    let g = upload(&s, &dev, &vec![0f32; SHAPE.param_len()]);
    let one = upload(&s, &dev, &[0f32]);
    let e = graphs.launch_forward_backward(&s, &p, &x, &y, &m, &g, &one).unwrap_err();
    assert!(matches!(e, Error::SizeMismatch { .. }), "{e:?}");
    // SGD with a short velocity.
    let e = graphs.launch_sgd(&s, &p, &short, &g).unwrap_err();
    assert!(matches!(e, Error::SizeMismatch { .. }), "{e:?}");
    // A label outside 0..classes reaches the device and fails the stream.
    let bad = upload(&s, &dev, &[1i32, 10, 3, 4]);
    graphs.launch_forward_backward(&s, &p, &x, &bad, &m, &g, &l).unwrap();
    assert!(s.synchronize().is_err(), "label 10 of 10 classes");
}

/// Device time of one forward/backward launch of `graphs` (`rows` rows) under the latency key
/// (step 0, micro-batch 3) on module `dev`.
fn keyed_fwd_time(graphs: &MlpGraphs, rows: usize, s: &Stream, dev: &Device) -> u64 {
    let d = Dataset::embedded_digits().unwrap();
    let ids: Vec<u64> = (0..rows as u64 / 2).map(|i| i * 31 + 1).collect();
    let (x, y) = d.rows_padded(&ids, rows).unwrap();
    let (labels, mask) = stage_labels(&y);
    let p = upload(s, dev, &mlp::init_params(SHAPE, 1).unwrap());
    let (dx, dy, dm) = (upload(s, dev, &x), upload(s, dev, &labels), upload(s, dev, &mask));
    let dg = upload(s, dev, &vec![0f32; SHAPE.param_len()]);
    let dl = upload(s, dev, &[0f32, 0.0]);
    let ev: Vec<Event> = (0..2).map(|_| Event::new(dev, true).unwrap()).collect();
    dropcompute::mock::set_latency_key(dev.module_id().unwrap(), 0, 3).unwrap();
    ev[0].record(s).unwrap();
    graphs.launch_forward_backward(s, &p, &dx, &dy, &dm, &dg, &dl).unwrap();
    ev[1].record(s).unwrap();
    s.synchronize().unwrap();
    ev[1].elapsed_since(&ev[0]).unwrap().as_nanos() as u64
}

/// `train --tail-split 2`'s mock configuration: the tail graph (8 rows) costs half the whole
/// one's base latency and, aliased to it, draws the same keyed noise factor, so a tail takes
/// half the time of the whole micro-batch it is cut from (to the rounding ns); without the
/// alias it draws its own factor.
#[test]
fn an_aliased_tail_recipe_draws_the_noise_of_the_whole_one() {
    let (whole, tail) = (forward_backward_recipe_name(SHAPE, 16), forward_backward_recipe_name(SHAPE, 8));
    let mut cfg = MockConfig {
        time_mode: TimeMode::Virtual,
        noise: Noise::Reference { delay_factor: 1.0 },
        ..MockConfig::default()
    };
    cfg.graph_base_latency_ns.insert(whole.clone(), 12_000_000);
    cfg.graph_base_latency_ns.insert(tail.clone(), 6_000_000);
    let times = |cfg: &MockConfig| {
        let (_g, rt) = mock(cfg);
        let dev = Device::acquire(rt, 0).unwrap(); // by module id: the key names the module
        let s = Stream::new(&dev).unwrap();
        let w = MlpGraphs::build(&dev, SHAPE, 16, 0.1, 0.9, 0.0).unwrap();
        let t = MlpGraphs::build(&dev, SHAPE, 8, 0.1, 0.9, 0.0).unwrap();
        (keyed_fwd_time(&w, 16, &s, &dev), keyed_fwd_time(&t, 8, &s, &dev))
    };
    let (w0, t0) = times(&cfg);
    assert!(w0 > 12_000_000, "the reference noise only adds: {w0}");
    assert_ne!(2 * t0, w0, "unaliased: its own draw");
    cfg.graph_noise_alias.insert(tail, whole);
    let (w1, t1) = times(&cfg);
    assert_eq!(w1, w0, "the whole recipe's draw is unchanged");
    assert!((2 * t1).abs_diff(w1) <= 1, "tail {t1} ns = half of {w1} ns");
    // The alias travels in the mock's JSON configuration.
    let back: MockConfig = serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
    assert_eq!(back.graph_noise_alias, cfg.graph_noise_alias);
}
