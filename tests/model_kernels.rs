//! The model kernels (`mlp_fwd_bwd_f32`, `sgd_momentum_f32`, registered by the training job
//! from safe Rust) launched on the in-process mock
//! through the safe Synapse layer, compared bit for bit with `train::mlp` on the host, plus the
//! rejection of inconsistent launches.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use dropcompute::mock::{MockRecipe, api};
use dropcompute::synapse::{Device, DeviceBuffer, DeviceRepr, HostBuffer, LaunchTensor, Recipe, Runtime, Stream};
use dropcompute::train::data::Dataset;
use dropcompute::train::mlp::{self, MlpScratch, MlpShape};
use dropcompute::train::model_kernels::{self, MLP_TENSORS, SGD_TENSORS, mlp_recipe, sgd_recipe};
use habana_sys::synStatus;

const SHAPE: MlpShape = MlpShape { input: 64, hidden: 32, classes: 10 };

fn runtime() -> &'static Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        hermetic::scrub_process_env(); // the mock's configuration is not the calling shell's
        model_kernels::register().unwrap();
        Runtime::new(api()).unwrap()
    })
}

fn load(r: &MockRecipe) -> Recipe {
    let dir = hermetic::temp_dir("model-kernels");
    let path: PathBuf = dir.path().join(format!("{}.json", r.name));
    r.write(&path).unwrap();
    Recipe::load(runtime(), &path).unwrap()
}

fn upload<T: DeviceRepr>(s: &Stream, dev: &Device, data: &[T]) -> DeviceBuffer<T> {
    let mut d = DeviceBuffer::alloc(dev, data.len()).unwrap();
    s.copy_h2d(&HostBuffer::from_slice(dev, data).unwrap(), &mut d).unwrap();
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

#[test]
fn mlp_kernel_matches_host_bitwise_and_accumulates_loss() {
    let dev = Device::acquire_any(runtime()).unwrap();
    let s = Stream::new(&dev).unwrap();
    let params = mlp::init_params(SHAPE, 11).unwrap();
    let (x, y) = micro_batch();
    let recipe = load(&mlp_recipe(SHAPE, 16, 1000));
    let ids = recipe.tensor_ids(&MLP_TENSORS).unwrap();
    let dp = upload(&s, &dev, &params);
    let dx = upload(&s, &dev, &x);
    let dy = upload(&s, &dev, &y);
    let dg = upload(&s, &dev, &vec![f32::NAN; SHAPE.param_len()]); // overwritten, not accumulated
    let dl = upload(&s, &dev, &[1.5f32, 3.0]);
    let bind = [
        LaunchTensor::by_id(ids[0], &dp),
        LaunchTensor::by_id(ids[1], &dx),
        LaunchTensor::by_id(ids[2], &dy),
        LaunchTensor::by_id(ids[3], &dg),
        LaunchTensor::by_id(ids[4], &dl),
    ];
    s.launch(&recipe, &bind, None, &[]).unwrap();
    s.launch(&recipe, &bind, None, &[]).unwrap();
    let grad = download(&s, &dev, &dg);
    let loss = download(&s, &dev, &dl);

    let mut want = vec![0.0f32; SHAPE.param_len()];
    let (sum, rows) = mlp::forward_backward(SHAPE, &params, &x, &y, &mut want, &mut MlpScratch::default()).unwrap();
    assert_eq!(rows, 12);
    assert_eq!(bits(&grad), bits(&want));
    let l = sum as f32;
    assert_eq!(bits(&loss), bits(&[1.5 + l + l, 3.0 + 12.0 + 12.0]));
    // Binding the parameters as the gradient output overlaps an input: rejected, untouched.
    let s2 = Stream::new(&dev).unwrap();
    let overlap = [
        LaunchTensor::by_id(ids[0], &dp),
        LaunchTensor::by_id(ids[1], &dx),
        LaunchTensor::by_id(ids[2], &dy),
        LaunchTensor::by_id(ids[3], &dp),
        LaunchTensor::by_id(ids[4], &dl),
    ];
    s2.launch(&recipe, &overlap, None, &[]).unwrap();
    assert_eq!(s2.synchronize().unwrap_err().status(), Some(synStatus::INVALID_ARGUMENT));
    assert_eq!(bits(&download(&s, &dev, &dp)), bits(&params));
    // Sanity of the value itself: 12 samples of an untrained 10-class model, loss ~ ln 10 each.
    assert!((sum / 12.0 - 10f64.ln()).abs() < 1.5, "mean loss {}", sum / 12.0);
}

#[test]
fn sgd_kernel_matches_host_bitwise() {
    let dev = Device::acquire_any(runtime()).unwrap();
    let s = Stream::new(&dev).unwrap();
    let n = SHAPE.param_len();
    let p0 = mlp::init_params(SHAPE, 3).unwrap();
    let g: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 0.1).collect();
    let v0: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.11).cos() * 0.01).collect();
    let (lr, mu, wd) = (0.05f32, 0.9f32, 1e-4f32);
    let recipe = load(&sgd_recipe(n, lr, mu, wd));
    let ids = recipe.tensor_ids(&SGD_TENSORS).unwrap();
    let (dp, dv, dg) = (upload(&s, &dev, &p0), upload(&s, &dev, &v0), upload(&s, &dev, &g));
    let bind = [LaunchTensor::by_id(ids[0], &dp), LaunchTensor::by_id(ids[1], &dv), LaunchTensor::by_id(ids[2], &dg)];
    s.launch(&recipe, &bind, None, &[]).unwrap();
    s.launch(&recipe, &bind, None, &[]).unwrap();
    let (p, v) = (download(&s, &dev, &dp), download(&s, &dev, &dv));
    let (mut hp, mut hv) = (p0.clone(), v0.clone());
    for _ in 0..2 {
        mlp::sgd_momentum(&mut hp, &mut hv, &g, lr, mu, wd).unwrap();
    }
    assert_eq!(bits(&p), bits(&hp));
    assert_eq!(bits(&v), bits(&hv));
    assert_ne!(bits(&p), bits(&p0));
}

/// Launches `recipe` with buffers of the recipe's sizes holding `fill(tensor index)`; returns
/// the stream's status after synchronising and the downloaded contents of tensor `watch`.
fn launch_status(recipe: MockRecipe, fill: impl Fn(usize, usize) -> Vec<f32>, watch: usize) -> (synStatus, Vec<f32>) {
    let dev = Device::acquire_any(runtime()).unwrap();
    let s = Stream::new(&dev).unwrap();
    let r = load(&recipe);
    let bufs: Vec<DeviceBuffer<f32>> =
        recipe.tensors.iter().enumerate().map(|(i, t)| upload(&s, &dev, &fill(i, t.bytes as usize / 4))).collect();
    let ids = r.tensor_ids(&recipe.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>()).unwrap();
    let bind: Vec<_> = ids.iter().zip(&bufs).map(|(&id, b)| LaunchTensor::by_id(id, b)).collect();
    s.launch(&r, &bind, None, &[]).unwrap();
    let st = match s.synchronize() {
        Ok(()) => synStatus::SUCCESS,
        Err(e) => e.status().expect("a Synapse status"),
    };
    let mut h = HostBuffer::zeroed(&dev, bufs[watch].len()).unwrap();
    let s2 = Stream::new(&dev).unwrap();
    s2.copy_d2h(&bufs[watch], &mut h).unwrap();
    s2.synchronize().unwrap();
    (st, h.to_vec().unwrap())
}

#[test]
fn inconsistent_launches_are_rejected_without_writing() {
    let p = SHAPE.param_len();
    let params = mlp::init_params(SHAPE, 1).unwrap();
    // Labels are i32 in the kernel; build them as f32 bit patterns of the i32 values.
    let label_bits = |v: i32| f32::from_bits(v as u32);
    let fill = |bad_label: i32| {
        let params = params.clone();
        move |i: usize, n: usize| match i {
            0 => params.clone(),
            2 => (0..n).map(|r| label_bits(if r == 1 { bad_label } else { 0 })).collect(),
            _ => vec![0.25; n],
        }
    };
    let ok = launch_status(mlp_recipe(SHAPE, 4, 0), fill(9), 3);
    assert_eq!(ok.0, synStatus::SUCCESS);
    assert!(ok.1.iter().any(|&g| g != 0.25), "a valid launch writes the gradient");
    // Label 10 with 10 classes: rejected, gradient left as it was.
    let (st, grad) = launch_status(mlp_recipe(SHAPE, 4, 0), fill(10), 3);
    assert_eq!(st, synStatus::INVALID_ARGUMENT);
    assert!(grad.iter().all(|&g| g == 0.25));
    // x not a whole number of rows for `labels`.
    let mut r = mlp_recipe(SHAPE, 4, 0);
    r.tensors[1].bytes += 4;
    assert_eq!(launch_status(r, fill(0), 3).0, synStatus::INVALID_ARGUMENT);
    // grad of the wrong size, a missing shape param, a one-element loss, a fourth sgd tensor.
    let mut r = mlp_recipe(SHAPE, 4, 0);
    r.tensors[3].bytes = 4 * (p as u64 - 1);
    assert_eq!(launch_status(r, fill(0), 3).0, synStatus::INVALID_ARGUMENT);
    let r = mlp_recipe(SHAPE, 4, 0).params([64.0, 32.0]);
    assert_eq!(launch_status(r, fill(0), 3).0, synStatus::INVALID_ARGUMENT);
    let mut r = mlp_recipe(SHAPE, 4, 0);
    r.tensors[4].bytes = 4;
    assert_eq!(launch_status(r, fill(0), 3).0, synStatus::INVALID_ARGUMENT);
    let r = sgd_recipe(p, 0.1, 0.9, 0.0).tensor("extra", 4);
    assert_eq!(launch_status(r, |_, n| vec![1.0; n], 0).0, synStatus::INVALID_ARGUMENT);
    let mut r = sgd_recipe(p, 0.1, 0.9, 0.0);
    r.tensors[2].bytes -= 4;
    let (st, params_after) = launch_status(r, |_, n| vec![1.0; n], 0);
    assert_eq!(st, synStatus::INVALID_ARGUMENT);
    assert!(params_after.iter().all(|&v| v == 1.0));
}
