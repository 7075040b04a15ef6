//! One conformance suite over the safe Synapse API, run twice: against the in-process CPU mock
//! table and against a shared library loaded through `SynapseApi::load_path` (the real dlopen
//! path a Gaudi host uses). The burn pattern: one suite, every backend. The library is
//! `$DROPCOMPUTE_SYNAPSE_LIB` when set (on a Gaudi host: the real libSynapse.so), else the mock
//! built as a shared library. Against a library without the mock's control ABI (`dcmock_*`),
//! the cases that need the mock's recipe files and fault knobs print that they are skipped.
//! The harness (backends, locking, skipping) is `tests/support/harness.rs`.
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/harness.rs"]
#[macro_use]
mod harness;

use harness::{Harness, hermetic, run, status_of};

use std::time::Duration;

use dropcompute::mock::{Fault, MockRecipe};
use dropcompute::synapse::Device;
use dropcompute::synapse::{DeviceBuffer, DeviceRepr, Error, Event, HostBuffer, LaunchTensor, Recipe, Stream, result};
use habana_sys::{synDmaDir, synRecipeAttribute, synStatus};

fn round_trip<T: DeviceRepr + PartialEq + std::fmt::Debug>(dev: &Device, data: &[T]) {
    let s = Stream::new(dev).unwrap();
    let host = HostBuffer::from_slice(dev, data).unwrap();
    let mut a = DeviceBuffer::<T>::alloc(dev, data.len()).unwrap();
    let mut b = DeviceBuffer::<T>::alloc(dev, data.len()).unwrap();
    let mut back = HostBuffer::<T>::zeroed(dev, data.len()).unwrap();
    s.copy_h2d(&host, &mut a).unwrap();
    s.copy_d2d(&a, &mut b).unwrap();
    s.copy_d2h(&b, &mut back).unwrap();
    assert_eq!(back.as_slice().unwrap(), data, "{} round trip", T::NAME);
}

fn acquire_release(h: &Harness) {
    let ids = h.rt.module_ids().unwrap();
    assert_eq!(ids.len() as u32, h.rt.device_count().unwrap());
    let module = ids[0];
    let dev = Device::acquire(&h.rt, module).unwrap();
    assert_eq!(dev.module_id(), Some(module));
    let again = Device::acquire(&h.rt, module).unwrap_err();
    assert_eq!(status_of(&again), synStatus::DEVICE_ALREADY_ACQUIRED);
    assert!(dev.info().unwrap().dram_size > 0);
    let (free, total) = dev.memory_info().unwrap();
    assert!(free <= total && total > 0);
    // A stream keeps the device alive: explicit release is refused and hands the device back.
    let s = Stream::new(&dev).unwrap();
    let (err, dev) = dev.release().unwrap_err();
    assert!(matches!(err, Error::InUse { count: 1, .. }), "{err:?}");
    s.destroy().unwrap();
    dev.release().unwrap();
    // Released: the module can be acquired again.
    let dev = Device::acquire(&h.rt, module).unwrap();
    drop(dev);
    let unknown = Device::acquire(&h.rt, 1_000_000).unwrap_err();
    assert!(!status_of(&unknown).is_success());
}

fn memory_round_trips(h: &Harness) {
    let dev = h.device();
    round_trip::<f32>(&dev, &[1.5, -2.25, f32::MAX, f32::MIN_POSITIVE, 0.0, 7.0, 1e-3]);
    let bf: Vec<half::bf16> = (0..1000).map(|i| half::bf16::from_f32(i as f32 * 0.37 - 100.0)).collect();
    round_trip(&dev, &bf);
    let hf: Vec<half::f16> = (0..33).map(|i| half::f16::from_f32(i as f32 / 3.0)).collect();
    round_trip(&dev, &hf);
    round_trip::<i32>(&dev, &[i32::MIN, -1, 0, 1, i32::MAX]);
    round_trip::<u32>(&dev, &(0..4097u32).map(|i| i.wrapping_mul(2_654_435_761)).collect::<Vec<_>>());
}

fn stream_ordering_and_event_timing(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let n = 4096;
    let mut buf = DeviceBuffer::<u32>::alloc(&dev, n).unwrap();
    let events: Vec<Event> = (0..8).map(|_| Event::new(&dev, true).unwrap()).collect();
    let hosts: Vec<HostBuffer<u32>> =
        (0..8).map(|k| HostBuffer::from_slice(&dev, &vec![k as u32; n]).unwrap()).collect();
    for (k, host) in hosts.iter().enumerate() {
        s.copy_h2d(host, &mut buf).unwrap();
        events[k].record(&s).unwrap();
    }
    let mut out = HostBuffer::<u32>::zeroed(&dev, n).unwrap();
    s.copy_d2h(&buf, &mut out).unwrap();
    // In-order execution: the last write wins.
    assert!(out.as_slice().unwrap().iter().all(|&v| v == 7));
    s.synchronize().unwrap();
    assert!(s.is_idle().unwrap());
    let ts: Vec<u64> = events.iter().map(|e| e.timestamp_ns().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "timestamps not monotonic: {ts:?}");
    let elapsed = events[7].elapsed_since(&events[0]).unwrap();
    assert_eq!(elapsed.as_nanos() as u64, ts[7] - ts[0]);
    // Each copy of 16 KiB costs time on the device timeline.
    assert!(ts[7] > ts[0]);
}

fn cross_stream_wait(h: &Harness) {
    let dev = h.device();
    let a = Stream::new(&dev).unwrap();
    let b = Stream::new(&dev).unwrap();
    let module = dev.module_id();
    let mut buf = DeviceBuffer::<f32>::alloc(&dev, 256).unwrap();
    let src = HostBuffer::from_slice(&dev, &[3.0f32; 256]).unwrap();
    // Stall stream a's device work, make b wait on a's event: b cannot finish before a.
    if let Some(m) = module {
        h.control().inject_fault(&Fault::StallStream { module_id: m, duration_ms: None }).unwrap();
    }
    a.copy_h2d(&src, &mut buf).unwrap();
    let done_a = Event::new(&dev, true).unwrap();
    done_a.record(&a).unwrap();
    b.wait_event(&done_a).unwrap();
    let done_b = Event::new(&dev, true).unwrap();
    done_b.record(&b).unwrap();
    if let Some(m) = module {
        // The stall holds until released below, so these hold whenever they are checked.
        assert!(!a.is_idle().unwrap(), "stalled stream reported idle");
        assert!(!done_b.is_complete().unwrap(), "waiting stream ran ahead of the event");
        h.control().inject_fault(&Fault::ReleaseStall { module_id: m }).unwrap();
    }
    done_b.synchronize().unwrap();
    assert!(done_b.timestamp_ns().unwrap() >= done_a.timestamp_ns().unwrap());
}

fn launch_by_id_and_by_name(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let n = 1000usize;
    let recipe = h.recipe(
        "copy",
        MockRecipe::new("copy4k", "copy")
            .tensor("src", (n * 4) as u64)
            .tensor("dst", (n * 4) as u64)
            .base_latency_ns(50_000),
    );
    assert_eq!(recipe.attribute(synRecipeAttribute::NUM_PERSISTENT_TENSORS).unwrap(), 2);
    assert_eq!(recipe.workspace_size().unwrap(), 0);
    let launch_ids = recipe.launch_ids().unwrap();
    let ids = recipe.tensor_ids(&["src", "dst"]).unwrap();
    assert_eq!(launch_ids, ids);
    assert_ne!(ids, vec![0, 1], "tensor ids must not be plain indices");
    let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let host = HostBuffer::from_slice(&dev, &data).unwrap();
    let mut src = DeviceBuffer::<f32>::alloc(&dev, n).unwrap();
    let dst = DeviceBuffer::<f32>::alloc(&dev, n).unwrap();
    s.copy_h2d(&host, &mut src).unwrap();
    let (t0, t1) = (Event::new(&dev, true).unwrap(), Event::new(&dev, true).unwrap());
    t0.record(&s).unwrap();
    s.launch(&recipe, &[LaunchTensor::by_id(ids[0], &src), LaunchTensor::by_id(ids[1], &dst)], None, &[&t1]).unwrap();
    let mut out = HostBuffer::<f32>::zeroed(&dev, n).unwrap();
    s.copy_d2h(&dst, &mut out).unwrap();
    assert_eq!(out.as_slice().unwrap(), &data[..]);
    // The launch signalled t1 on completion and took at least the recipe's base latency.
    assert!(t1.elapsed_since(&t0).unwrap() >= Duration::from_nanos(50_000));

    // By name, with the bindings in the opposite order: names decide, not positions.
    let dst2 = DeviceBuffer::<f32>::alloc(&dev, n).unwrap();
    s.launch(
        &recipe,
        &[LaunchTensor::by_name("dst", &dst2).unwrap(), LaunchTensor::by_name("src", &src).unwrap()],
        None,
        &[],
    )
    .unwrap();
    s.copy_d2h(&dst2, &mut out).unwrap();
    assert_eq!(out.as_slice().unwrap(), &data[..]);

    // Serialize and load again: same tensor ids.
    let dir = hermetic::temp_dir("conformance");
    let copy_path = dir.path().join("copy-saved.json");
    recipe.save(&copy_path).unwrap();
    let again = Recipe::load(&h.rt, &copy_path).unwrap();
    assert_eq!(again.tensor_ids(&["src", "dst"]).unwrap(), ids);

    // Launch errors: unknown id, a missing tensor, a mixed binding, a buffer too small.
    let e = s.launch(&recipe, &[LaunchTensor::by_id(ids[0], &src), LaunchTensor::by_id(999, &dst)], None, &[]);
    assert_eq!(status_of(&e.unwrap_err()), synStatus::INVALID_ARGUMENT);
    let e = s.launch(&recipe, &[LaunchTensor::by_id(ids[0], &src)], None, &[]);
    assert_eq!(status_of(&e.unwrap_err()), synStatus::INVALID_ARGUMENT);
    let e =
        s.launch(&recipe, &[LaunchTensor::by_id(ids[0], &src), LaunchTensor::by_name("dst", &dst).unwrap()], None, &[]);
    assert!(matches!(e, Err(Error::InvalidArgument { what: "launch bindings", .. })), "{e:?}");
    let small = DeviceBuffer::<f32>::alloc(&dev, 10).unwrap();
    let e = s.launch(&recipe, &[LaunchTensor::by_id(ids[0], &src), LaunchTensor::by_id(ids[1], &small)], None, &[]);
    assert_eq!(status_of(&e.unwrap_err()), synStatus::INVALID_ARGUMENT);
    s.synchronize().unwrap();
}

fn memory_error_paths(h: &Harness) {
    let dev = h.device();
    let api = dev.api();
    let s = Stream::new(&dev).unwrap();
    let addr = result::device_malloc(api, dev.id(), 1024).unwrap();
    assert_eq!(addr % 128, 0, "device addresses are 128-byte aligned");
    let host = HostBuffer::<u8>::zeroed(&dev, 4096).unwrap();
    // Out of range: 2048 bytes into a 1024-byte allocation.
    // SAFETY: live stream; the host range is pinned; the mock must reject the device range.
    let e = unsafe { result::mem_copy_async(api, s.raw(), host.host_addr(), 2048, addr, synDmaDir::HOST_TO_DRAM) };
    assert_eq!(status_of(&e.unwrap_err()), synStatus::INVALID_ARGUMENT);
    result::device_free(api, dev.id(), addr).unwrap();
    // Double free.
    assert_eq!(status_of(&result::device_free(api, dev.id(), addr).unwrap_err()), synStatus::INVALID_ARGUMENT);
    // Use after free.
    // SAFETY: as above; the device address is freed and must be rejected.
    let e = unsafe { result::mem_copy_async(api, s.raw(), host.host_addr(), 16, addr, synDmaDir::HOST_TO_DRAM) };
    assert_eq!(status_of(&e.unwrap_err()), synStatus::INVALID_ARGUMENT);
    // A host range that is not pinned is refused (the mock never touches arbitrary memory).
    let unpinned = [0u8; 64];
    let ok = result::device_malloc(api, dev.id(), 64).unwrap();
    // SAFETY: live stream; the host pointer is valid but not registered, which must be rejected.
    let e = unsafe { result::mem_copy_async(api, s.raw(), unpinned.as_ptr() as u64, 64, ok, synDmaDir::HOST_TO_DRAM) };
    assert_eq!(status_of(&e.unwrap_err()), synStatus::INVALID_ARGUMENT);
    result::device_free(api, dev.id(), ok).unwrap();
    // Safe-layer checks happen before any C call.
    let mut d = DeviceBuffer::<f32>::alloc(&dev, 8).unwrap();
    let h4 = HostBuffer::<f32>::zeroed(&dev, 4).unwrap();
    assert!(matches!(s.copy_h2d(&h4, &mut d), Err(Error::SizeMismatch { expected: 8, got: 4, .. })));
    assert!(matches!(DeviceBuffer::<f32>::alloc(&dev, 0), Err(Error::InvalidArgument { .. })));
}

fn event_error_paths(h: &Harness) {
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let untimed = Event::new(&dev, false).unwrap();
    let timed = Event::new(&dev, true).unwrap();
    // Never recorded: complete for query/synchronize, but no timestamp.
    assert!(timed.is_complete().unwrap());
    timed.synchronize().unwrap();
    assert_eq!(status_of(&timed.timestamp_ns().unwrap_err()), synStatus::OBJECT_NOT_INITIALIZED);
    untimed.record(&s).unwrap();
    timed.record(&s).unwrap();
    s.synchronize().unwrap();
    // Elapsed time needs EVENT_COLLECT_TIME on both events.
    assert_eq!(status_of(&timed.elapsed_since(&untimed).unwrap_err()), synStatus::INVALID_ARGUMENT);
    // Unknown handles are reported, not dereferenced.
    let api = dev.api();
    // SAFETY: deliberately bogus handle; the mock looks handles up and must reject it.
    let st = unsafe { (api.syn_stream_synchronize)(0xdead_beef as habana_sys::synStreamHandle) };
    assert_eq!(st, synStatus::INVALID_ARGUMENT);
    // SAFETY: as above, for events.
    let st = unsafe { (api.syn_event_query)(0xdead_beef as habana_sys::synEventHandle) };
    assert!(st == synStatus::INVALID_EVENT_HANDLE || st == synStatus::INVALID_ARGUMENT, "{st:?}");
}

fn injected_fault_fails_once(h: &Harness) {
    let dev = h.device();
    h.control()
        .inject_fault(&Fault::FailNextCall {
            function: "synDeviceMalloc".into(),
            status: synStatus::OUT_OF_DEVICE_MEMORY.0,
            times: 1,
        })
        .unwrap();
    let e = DeviceBuffer::<f32>::alloc(&dev, 16).unwrap_err();
    match &e {
        Error::Synapse { call, status, description, .. } => {
            assert_eq!(*call, "synDeviceMalloc");
            assert_eq!(*status, synStatus::OUT_OF_DEVICE_MEMORY);
            assert!(!description.is_empty());
        }
        other => panic!("expected a Synapse error, got {other:?}"),
    }
    assert!(e.to_string().contains("synDeviceMalloc"));
    DeviceBuffer::<f32>::alloc(&dev, 16).expect("the fault fires once");
}

fn gradient_kernels(h: &Harness) {
    use half::bf16;
    let dev = h.device();
    let s = Stream::new(&dev).unwrap();
    let n = 1031usize;
    let acc0: Vec<f32> = (0..n).map(|i| (i as f32).sin()).collect();
    let g: Vec<bf16> = (0..n).map(|i| bf16::from_f32((i as f32 * 0.01).cos())).collect();
    let scale = 0.125f32;
    let recipe = h.recipe(
        "sacc",
        MockRecipe::new("sacc", "scale_accumulate_bf16_to_f32")
            .tensor("acc", (n * 4) as u64)
            .tensor("grad", (n * 2) as u64)
            .tensor("scale", 4),
    );
    let ids = recipe.tensor_ids(&["acc", "grad", "scale"]).unwrap();
    let mut acc = DeviceBuffer::<f32>::alloc(&dev, n).unwrap();
    let mut grad = DeviceBuffer::<bf16>::alloc(&dev, n).unwrap();
    let mut sc = DeviceBuffer::<f32>::alloc(&dev, 1).unwrap();
    s.copy_h2d(&HostBuffer::from_slice(&dev, &acc0).unwrap(), &mut acc).unwrap();
    s.copy_h2d(&HostBuffer::from_slice(&dev, &g).unwrap(), &mut grad).unwrap();
    s.copy_h2d(&HostBuffer::from_slice(&dev, &[scale]).unwrap(), &mut sc).unwrap();
    let bind =
        [LaunchTensor::by_id(ids[0], &acc), LaunchTensor::by_id(ids[1], &grad), LaunchTensor::by_id(ids[2], &sc)];
    s.launch(&recipe, &bind, None, &[]).unwrap();
    s.launch(&recipe, &bind, None, &[]).unwrap();
    let mut out = HostBuffer::<f32>::zeroed(&dev, n).unwrap();
    s.copy_d2h(&acc, &mut out).unwrap();
    let out = out.to_vec().unwrap();
    for i in 0..n {
        // Two launches, each one f32 multiply and one f32 add (no contraction), then an f64 bound.
        let once = acc0[i] + scale * g[i].to_f32();
        let want = once + scale * g[i].to_f32();
        assert_eq!(out[i].to_bits(), want.to_bits(), "element {i}");
        let exact = acc0[i] as f64 + 2.0 * scale as f64 * g[i].to_f64();
        assert!((out[i] as f64 - exact).abs() <= 4.0 * f32::EPSILON as f64 * (1.0 + exact.abs()));
    }
    // Binding the accumulator as its own input overlaps: rejected as an asynchronous error.
    let small = h.recipe(
        "acc-overlap",
        MockRecipe::new("acc-overlap", "accumulate_f32").tensor("acc", (n * 4) as u64).tensor("x", (n * 4) as u64),
    );
    let ids2 = small.tensor_ids(&["acc", "x"]).unwrap();
    let s2 = Stream::new(&dev).unwrap();
    s2.launch(&small, &[LaunchTensor::by_id(ids2[0], &acc), LaunchTensor::by_id(ids2[1], &acc)], None, &[]).unwrap();
    assert_eq!(status_of(&s2.synchronize().unwrap_err()), synStatus::INVALID_ARGUMENT);
}

suite!(
    any: [acquire_release, memory_round_trips, stream_ordering_and_event_timing, memory_error_paths, event_error_paths],
    mock_only: [cross_stream_wait, launch_by_id_and_by_name, injected_fault_fails_once, gradient_kernels],
);
