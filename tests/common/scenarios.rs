//! Mock conformance scenarios, each run against the in-process table and the loaded library.
//! Each takes the table and the matching control handle.

use std::ffi::{CStr, c_void};

use dropcompute::mock::{
    DeviceOverride, Fault, MockConfig, MockControl, MockKernelArgs, MockRecipe, Noise, TimeMode,
};
use habana_sys::*;

use super::{Dev, last_message, ok};

const N: usize = 1000;

fn pattern(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 7.0).collect()
}

/// Restores the default configuration when dropped (scenarios that reconfigure).
struct Restore<'a>(&'a MockControl);
impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let _ = self.0.configure(&MockConfig::default());
    }
}

pub fn memory_round_trip_all_directions(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let src = d.host_f32(N);
    src.copy_from_slice(&pattern(N));
    let (a, b) = (d.malloc((N * 4) as u64), d.malloc((N * 4) as u64));
    assert_eq!(a % 128, 0);
    assert_ne!(a, b);
    ok(
        api,
        d.copy(
            s,
            src.as_ptr() as u64,
            (N * 4) as u64,
            a,
            synDmaDir::HOST_TO_DRAM,
        ),
    );
    ok(
        api,
        d.copy(s, a, (N * 4) as u64, b, synDmaDir::DRAM_TO_DRAM),
    );
    // Device to host into a synHostMap'ed user buffer.
    let mut dst = vec![0f32; N];
    unsafe {
        ok(
            api,
            (api.syn_host_map)(d.id, (N * 4) as u64, dst.as_ptr().cast()),
        );
        ok(
            api,
            d.copy(
                s,
                b,
                (N * 4) as u64,
                dst.as_mut_ptr() as u64,
                synDmaDir::DRAM_TO_HOST,
            ),
        );
        ok(api, d.sync(s));
        ok(api, (api.syn_host_unmap)(d.id, dst.as_ptr().cast()));
    }
    assert_eq!(dst, pattern(N));
    // A partial copy at an offset inside the allocation.
    ok(
        api,
        d.copy(
            s,
            src.as_ptr() as u64 + 40,
            16,
            b + 400,
            synDmaDir::HOST_TO_DRAM,
        ),
    );
    let back = d.read_f32(s, b + 400, 4);
    assert_eq!(back, pattern(N)[10..14].to_vec());
    unsafe { ok(api, (api.syn_stream_destroy)(s)) };
}

pub fn copy_multiple(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let h = d.host_f32(8);
    h.copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let a = d.malloc(64);
    let src = [h.as_ptr() as u64, h.as_ptr() as u64 + 16];
    let size = [16u64, 16];
    let dst = [a + 16, a];
    unsafe {
        ok(
            api,
            (api.syn_mem_copy_async_multiple)(
                s,
                src.as_ptr(),
                size.as_ptr(),
                dst.as_ptr(),
                synDmaDir::HOST_TO_DRAM,
                2,
            ),
        )
    };
    assert_eq!(
        d.read_f32(s, a, 8),
        vec![5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0]
    );
}

pub fn memory_errors(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let h = d.host_f32(16);
    let a = d.malloc(64);
    // Out of range: 65 bytes from a 64-byte allocation; and an offset past the end.
    assert_eq!(
        d.copy(s, h.as_ptr() as u64, 65, a, synDmaDir::HOST_TO_DRAM),
        synStatus::INVALID_ARGUMENT
    );
    assert!(
        last_message(api).contains("exceeds"),
        "{}",
        last_message(api)
    );
    assert_eq!(
        d.copy(s, a + 60, 8, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST),
        synStatus::INVALID_ARGUMENT
    );
    // Host side outside any registered range.
    let stack = [0f32; 16];
    assert_eq!(
        d.copy(s, stack.as_ptr() as u64, 16, a, synDmaDir::HOST_TO_DRAM),
        synStatus::INVALID_ARGUMENT
    );
    assert!(
        last_message(api).contains("synHostMalloc"),
        "{}",
        last_message(api)
    );
    // Host side running past the end of its range.
    assert_eq!(
        d.copy(s, h.as_ptr() as u64 + 60, 8, a, synDmaDir::HOST_TO_DRAM),
        synStatus::INVALID_ARGUMENT
    );
    // Double free and use after free.
    ok(api, d.free(a));
    assert_eq!(d.free(a), synStatus::INVALID_ARGUMENT);
    assert!(
        last_message(api).contains("already freed"),
        "{}",
        last_message(api)
    );
    assert!(
        last_message(api).starts_with("synDeviceFree"),
        "{}",
        last_message(api)
    );
    assert_eq!(
        d.copy(s, a, 4, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST),
        synStatus::INVALID_ARGUMENT
    );
    assert!(
        last_message(api).contains("after free"),
        "{}",
        last_message(api)
    );
    // Addresses are never reused.
    let b = d.malloc(64);
    assert_ne!(a, b);
    // Freeing an interior address, or a foreign one.
    assert_eq!(d.free(b + 128), synStatus::INVALID_ARGUMENT);
    assert_eq!(d.free(0), synStatus::INVALID_ARGUMENT);
    // Host free twice; unmap of a malloc'd pointer.
    unsafe {
        assert_eq!(
            (api.syn_host_unmap)(d.id, h.as_ptr().cast()),
            synStatus::INVALID_ARGUMENT
        );
        ok(api, (api.syn_host_free)(d.id, h.as_ptr().cast(), 0));
        assert_eq!(
            (api.syn_host_free)(d.id, h.as_ptr().cast(), 0),
            synStatus::INVALID_ARGUMENT
        );
    }
    // Memory info reflects allocations.
    let (mut free, mut total) = (0, 0);
    unsafe {
        ok(
            api,
            (api.syn_device_get_memory_info)(d.id, &mut free, &mut total),
        )
    };
    assert_eq!(total, 96 << 30);
    assert_eq!(free, total - 64);
    // Beyond HBM.
    let mut x = 0;
    assert_eq!(
        unsafe { (api.syn_device_malloc)(d.id, 97 << 30, 0, 0, &mut x) },
        synStatus::OUT_OF_DEVICE_MEMORY
    );
}

pub fn device_errors(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 1);
    unsafe {
        let mut id = 0;
        assert_eq!(
            (api.syn_device_acquire_by_module_id)(&mut id, 1),
            synStatus::DEVICE_ALREADY_ACQUIRED
        );
        assert_eq!(
            (api.syn_device_acquire_by_module_id)(&mut id, 100_000),
            synStatus::INVALID_ARGUMENT
        );
        let mut n = 0;
        ok(api, (api.syn_device_get_count)(&mut n));
        assert_eq!(n, 8);
        let mut ids = [u32::MAX; 16];
        let mut size = 16;
        ok(
            api,
            (api.syn_device_get_module_ids)(ids.as_mut_ptr(), &mut size),
        );
        assert_eq!(&ids[..size as usize], &[0, 1, 2, 3, 4, 5, 6, 7]);
        // Info of the device.
        let mut info = synDeviceInfoV2::default();
        ok(api, (api.syn_device_get_info_v2)(d.id, &mut info));
        assert_eq!(info.deviceType, synDeviceType::GAUDI2);
        assert_eq!(info.deviceIndex, 1);
        assert_eq!(info.dramSize, 96 << 30);
        let mut v1 = synDeviceInfo::default();
        ok(api, (api.syn_device_get_info)(d.id, &mut v1));
        assert_eq!(v1.deviceId, d.id);
        // Acquire by type and by NULL bus take other free modules.
        let mut t = 0;
        ok(
            api,
            (api.syn_device_acquire_by_device_type)(&mut t, synDeviceType::GAUDI2),
        );
        assert_ne!(t, d.id);
        assert_eq!(
            (api.syn_device_acquire_by_device_type)(&mut id, synDeviceType::GAUDI3),
            synStatus::NO_DEVICE_FOUND
        );
        let mut b = 0;
        ok(api, (api.syn_device_acquire)(&mut b, std::ptr::null()));
        ok(api, (api.syn_device_release)(b));
        ok(api, (api.syn_device_release)(t));
        // Released / unknown device ids.
        assert_eq!((api.syn_device_release)(t), synStatus::INVALID_ARGUMENT);
        assert_eq!(
            (api.syn_device_synchronize)(9999),
            synStatus::INVALID_ARGUMENT
        );
        // Unknown or forged handles.
        let bogus = 0x1234_5678usize as synStreamHandle;
        assert_eq!(
            (api.syn_stream_synchronize)(bogus),
            synStatus::INVALID_ARGUMENT
        );
        assert_eq!(
            (api.syn_stream_query)(std::ptr::null_mut()),
            synStatus::INVALID_ARGUMENT
        );
        assert_eq!(
            (api.syn_event_query)(0x40 as synEventHandle),
            synStatus::INVALID_EVENT_HANDLE
        );
        assert_eq!(
            (api.syn_recipe_destroy)(0x7 as synRecipeHandle),
            synStatus::INVALID_ARGUMENT
        );
        // A stream handle passed as an event handle.
        let s = d.stream();
        assert_eq!(
            (api.syn_event_query)(s.cast()),
            synStatus::INVALID_EVENT_HANDLE
        );
        // Handles of a released device become invalid.
        let e = d.event(0);
        let mut d2 = 0;
        ok(api, (api.syn_device_acquire_by_module_id)(&mut d2, 2));
        let s2 = {
            let mut s2 = std::ptr::null_mut();
            ok(api, (api.syn_stream_create_generic)(&mut s2, d2, 0));
            s2
        };
        ok(api, (api.syn_device_release)(d2));
        assert_eq!((api.syn_stream_query)(s2), synStatus::INVALID_ARGUMENT);
        // Objects of the still acquired device are unaffected.
        ok(api, (api.syn_stream_query)(s));
        ok(api, (api.syn_event_query)(e));
        // Stream create flags and null out-pointers.
        let mut s3 = std::ptr::null_mut();
        assert_eq!(
            (api.syn_stream_create_generic)(&mut s3, d.id, 1),
            synStatus::INVALID_ARGUMENT
        );
        assert_eq!(
            (api.syn_device_get_count)(std::ptr::null_mut()),
            synStatus::INVALID_ARGUMENT
        );
    }
}

pub fn event_semantics(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let timed = d.event(EVENT_COLLECT_TIME);
    let untimed = d.event(0);
    unsafe {
        // Never recorded: complete for query/synchronize, not initialised for elapsed time.
        ok(api, (api.syn_event_query)(timed));
        ok(api, (api.syn_event_synchronize)(timed));
        assert_eq!(
            d.elapsed(timed, std::ptr::null_mut()),
            Err(synStatus::OBJECT_NOT_INITIALIZED)
        );
        d.record(untimed, s);
        ok(api, (api.syn_event_synchronize)(untimed));
        assert_eq!(
            d.elapsed(untimed, std::ptr::null_mut()),
            Err(synStatus::INVALID_ARGUMENT)
        );
        assert!(
            last_message(api).contains("EVENT_COLLECT_TIME"),
            "{}",
            last_message(api)
        );
        // Timestamps are monotonic along a stream, across copies and re-records.
        let e2 = d.event(EVENT_COLLECT_TIME);
        let h = d.host_f32(1 << 16);
        let a = d.malloc(1 << 18);
        let mut last = 0;
        for _ in 0..5 {
            d.record(timed, s);
            ok(
                api,
                d.copy(s, h.as_ptr() as u64, 1 << 18, a, synDmaDir::HOST_TO_DRAM),
            );
            d.record(e2, s);
            ok(api, (api.syn_event_synchronize)(e2));
            let t0 = d.elapsed(timed, std::ptr::null_mut()).unwrap();
            let t1 = d.elapsed(e2, std::ptr::null_mut()).unwrap();
            assert!(t0 >= last && t1 >= t0, "{last} {t0} {t1}");
            // 256 KiB at 25 GB/s: at least 10485 ns between the events.
            assert!(
                d.elapsed(timed, e2).unwrap() >= 10_485,
                "{:?}",
                d.elapsed(timed, e2)
            );
            last = t1;
        }
        ok(api, (api.syn_event_destroy)(e2));
        assert_eq!((api.syn_event_query)(e2), synStatus::INVALID_EVENT_HANDLE);
        assert_eq!(
            d.elapsed(e2, std::ptr::null_mut()),
            Err(synStatus::INVALID_EVENT_HANDLE)
        );
        // Wait-event flags must be 0.
        assert_eq!(
            (api.syn_stream_wait_event)(s, timed, 1),
            synStatus::INVALID_ARGUMENT
        );
    }
}

fn fill_recipe(name: &str, bytes: u64, v: f64, base_ns: u64) -> MockRecipe {
    MockRecipe::new(name, "fill_f32")
        .tensor("out", bytes)
        .params([v])
        .base_latency_ns(base_ns)
}

pub fn stream_ordering_and_launch(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let a = d.malloc(4096);
    let b = d.malloc(4096);
    let fill = d.recipe(&fill_recipe("fill3", 4096, 3.0, 1000));
    let fill9 = d.recipe(&fill_recipe("fill9", 2048, 9.0, 1000));
    let copy = d.recipe(
        &MockRecipe::new("copy", "copy")
            .tensor("src", 4096)
            .tensor("dst", 4096),
    );
    // fill a with 3 (by id), the first half with 9 (by name), copy a -> b (by name): order matters.
    ok(api, d.launch(s, fill, &["out"], &[a], false, &mut []));
    ok(api, d.launch(s, fill9, &["out"], &[a], true, &mut []));
    ok(
        api,
        d.launch(s, copy, &["src", "dst"], &[a, b], true, &mut []),
    );
    let v = d.read_f32(s, b, 1024);
    assert!(
        v[..512].iter().all(|&x| x == 9.0) && v[512..].iter().all(|&x| x == 3.0),
        "{:?}",
        &v[500..520]
    );
    // External events are recorded when the launch completes.
    let e = d.event(EVENT_COLLECT_TIME);
    ok(api, d.launch(s, fill, &["out"], &[b], false, &mut [e]));
    unsafe { ok(api, (api.syn_event_synchronize)(e)) };
    assert!(d.elapsed(e, std::ptr::null_mut()).is_ok());
    assert_eq!(d.read_f32(s, b, 1024), vec![3.0; 1024]);
}

pub fn launch_errors(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let a = d.malloc(4096);
    let copy = d.recipe(
        &MockRecipe::new("copy2", "copy")
            .tensor("src", 4096)
            .tensor("dst", 4096),
    );
    let info = |id: u64, addr: u64| synLaunchTensorInfo {
        tensorName: std::ptr::null(),
        pTensorAddress: addr,
        tensorType: synTensorType::DATA_TENSOR,
        tensorSize: [0; HABANA_DIM_MAX],
        tensorId: id,
    };
    let mut ids = [0u64; 2];
    unsafe {
        ok(
            api,
            (api.syn_tensor_retrieve_launch_ids)(copy, ids.as_mut_ptr(), 2),
        );
        let launch = |infos: &[synLaunchTensorInfo]| {
            (api.syn_launch_with_external_events)(
                s,
                infos.as_ptr(),
                infos.len() as u32,
                0,
                copy,
                std::ptr::null_mut(),
                0,
                0,
            )
        };
        // Indices instead of ids.
        assert_eq!(
            launch(&[info(0, a), info(1, a)]),
            synStatus::INVALID_ARGUMENT
        );
        // Missing tensor, tensor bound twice.
        assert_eq!(launch(&[info(ids[0], a)]), synStatus::INVALID_ARGUMENT);
        assert!(
            last_message(api).contains("not bound"),
            "{}",
            last_message(api)
        );
        assert_eq!(
            launch(&[info(ids[0], a), info(ids[0], a)]),
            synStatus::INVALID_ARGUMENT
        );
        // Range past the allocation end; unallocated address.
        assert_eq!(
            launch(&[info(ids[0], a), info(ids[1], a + 8)]),
            synStatus::INVALID_ARGUMENT
        );
        assert_eq!(
            launch(&[info(ids[0], a), info(ids[1], 0xdead_0000)]),
            synStatus::INVALID_ARGUMENT
        );
        // The same buffer twice is allowed (one lock).
        ok(api, launch(&[info(ids[0], a), info(ids[1], a)]));
        ok(api, d.sync(s));
        // Unknown kernel and malformed recipe files.
        let mut h = std::ptr::null_mut();
        let p = super::temp_path("unknown_kernel.json");
        MockRecipe::new("u", "no_such_kernel").write(&p).unwrap();
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        assert_eq!(
            (api.syn_recipe_deserialize)(&mut h, c.as_ptr()),
            synStatus::INVALID_ARGUMENT
        );
        let m = last_message(api);
        assert!(
            m.contains("no_such_kernel") && m.contains("unknown_kernel.json"),
            "{m}"
        );
        std::fs::write(&p, "{\"format\":").unwrap();
        assert_eq!(
            (api.syn_recipe_deserialize)(&mut h, c.as_ptr()),
            synStatus::INVALID_ARGUMENT
        );
        assert!(
            last_message(api).contains("malformed"),
            "{}",
            last_message(api)
        );
    }
}

pub fn cross_stream_wait(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let (s1, s2) = (d.stream(), d.stream());
    let a = d.malloc(4096);
    let b = d.malloc(4096);
    // A slow fill on s1 (20 ms emulated), then s2 waits for it before copying a -> b.
    let fill = d.recipe(&fill_recipe("slowfill", 4096, 5.0, 20_000_000));
    let copy = d.recipe(
        &MockRecipe::new("copy3", "copy")
            .tensor("src", 4096)
            .tensor("dst", 4096),
    );
    let e = d.event(EVENT_COLLECT_TIME);
    let e2 = d.event(EVENT_COLLECT_TIME);
    ok(api, d.launch(s1, fill, &["out"], &[a], false, &mut []));
    d.record(e, s1);
    unsafe { ok(api, (api.syn_stream_wait_event)(s2, e, 0)) };
    ok(
        api,
        d.launch(s2, copy, &["src", "dst"], &[a, b], false, &mut []),
    );
    d.record(e2, s2);
    assert_eq!(d.read_f32(s2, b, 1024), vec![5.0; 1024]);
    // The waiting stream's work ends after the event on the device timeline.
    let (t1, t2) = (
        d.elapsed(e, std::ptr::null_mut()).unwrap(),
        d.elapsed(e2, std::ptr::null_mut()).unwrap(),
    );
    assert!(t2 >= t1, "{t1} {t2}");
    unsafe { ok(api, (api.syn_device_synchronize)(d.id)) };
}

pub fn stall_makes_stream_busy(api: &SynapseApi, c: &MockControl) {
    let d = Dev::acquire(api, 3);
    let s = d.stream();
    let h = d.host_f32(4);
    let a = d.malloc(16);
    c.inject_fault(&Fault::StallStream {
        module_id: 3,
        duration_ms: None,
    })
    .unwrap();
    ok(
        api,
        d.copy(s, h.as_ptr() as u64, 16, a, synDmaDir::HOST_TO_DRAM),
    );
    unsafe {
        assert_eq!((api.syn_stream_query)(s), synStatus::BUSY);
        assert_eq!((api.syn_stream_destroy)(s), synStatus::BUSY);
        let e = d.event(0);
        d.record(e, s);
        assert_eq!((api.syn_event_query)(e), synStatus::BUSY);
        c.inject_fault(&Fault::ReleaseStall { module_id: 3 })
            .unwrap();
        ok(api, (api.syn_event_synchronize)(e));
        ok(api, (api.syn_stream_query)(s));
        ok(api, (api.syn_stream_destroy)(s));
    }
    assert!(
        c.inject_fault(&Fault::StallStream {
            module_id: 1 << 20,
            duration_ms: Some(1)
        })
        .is_err()
    );
}

/// A kernel that always fails with synFail.
unsafe extern "C" fn failing_kernel(_a: *const MockKernelArgs) -> synStatus {
    synStatus::FAIL
}

/// Adds `*(user_data as *const f32)` to every f32 of tensor 0.
unsafe extern "C" fn add_user_value(a: *const MockKernelArgs) -> synStatus {
    // SAFETY: the mock passes valid args; user_data points at a static f32.
    unsafe {
        let a = &*a;
        let t = &*a.tensors;
        let v = *(a.user_data as *const f32);
        let name = CStr::from_ptr(t.name).to_str().unwrap();
        if name != "x" {
            return synStatus::INVALID_ARGUMENT;
        }
        for i in 0..(t.bytes / 4) as usize {
            *(t.data as *mut f32).add(i) += v;
        }
    }
    synStatus::SUCCESS
}

static ADDEND: f32 = 1.5;

pub fn kernel_error_is_sticky(api: &SynapseApi, c: &MockControl) {
    unsafe {
        c.register_kernel("test_fail", failing_kernel, std::ptr::null_mut())
            .unwrap();
        c.register_kernel(
            "test_add",
            add_user_value,
            &ADDEND as *const f32 as *mut c_void,
        )
        .unwrap();
    }
    let d = Dev::acquire(api, 0);
    let (s, other) = (d.stream(), d.stream());
    let a = d.malloc(64);
    let add = d.recipe(&MockRecipe::new("add", "test_add").tensor("x", 64));
    ok(api, d.launch(other, add, &["x"], &[a], false, &mut []));
    ok(api, d.launch(other, add, &["x"], &[a], true, &mut []));
    assert_eq!(d.read_f32(other, a, 16), vec![3.0; 16]);
    let bad = d.recipe(&MockRecipe::new("bad", "test_fail").tensor("x", 64));
    ok(api, d.launch(s, bad, &["x"], &[a], false, &mut []));
    let e = d.event(0);
    d.record(e, s);
    unsafe {
        assert_eq!(d.sync(s), synStatus::FAIL);
        assert_eq!(d.sync(s), synStatus::FAIL, "the error is sticky");
        assert_eq!((api.syn_event_synchronize)(e), synStatus::FAIL);
        assert_eq!((api.syn_device_synchronize)(d.id), synStatus::FAIL);
    }
    // The other stream is unaffected.
    ok(api, d.sync(other));
}

pub fn fault_fails_next_call_once(api: &SynapseApi, c: &MockControl) {
    let d = Dev::acquire(api, 0);
    c.inject_fault(&Fault::FailNextCall {
        function: "synDeviceMalloc".into(),
        status: synStatus::OUT_OF_RESOURCES.0,
        times: 1,
    })
    .unwrap();
    let mut x = 0;
    unsafe {
        assert_eq!(
            (api.syn_device_malloc)(d.id, 64, 0, 0, &mut x),
            synStatus::OUT_OF_RESOURCES
        );
        assert!(
            last_message(api).contains("injected"),
            "{}",
            last_message(api)
        );
        ok(api, (api.syn_device_malloc)(d.id, 64, 0, 0, &mut x));
    }
    c.inject_fault(&Fault::FailNextCall {
        function: "synStreamQuery".into(),
        status: 26,
        times: 2,
    })
    .unwrap();
    c.inject_fault(&Fault::ClearAll).unwrap();
    let s = d.stream();
    unsafe { ok(api, (api.syn_stream_query)(s)) };
}

/// Runs a fixed launch sequence on module 0 and 1 in virtual mode; returns every timestamp.
fn virtual_run(api: &SynapseApi, c: &MockControl, seed: u64) -> Vec<u64> {
    let cfg = MockConfig {
        time_mode: TimeMode::Virtual,
        seed,
        noise: Noise::Reference { delay_factor: 1.0 },
        ..MockConfig::default()
    };
    c.configure(&cfg).unwrap();
    let mut out = Vec::new();
    for m in [0, 1] {
        let d = Dev::acquire(api, m);
        let s = d.stream();
        let a = d.malloc(4096);
        let r = d.recipe(
            &MockRecipe::new("noop", "noop")
                .tensor("x", 4096)
                .base_latency_ns(1_000_000),
        );
        let e = d.event(EVENT_COLLECT_TIME);
        for _ in 0..10 {
            ok(api, d.launch(s, r, &["x"], &[a], false, &mut []));
            d.record(e, s);
            unsafe { ok(api, (api.syn_event_synchronize)(e)) };
            out.push(d.elapsed(e, std::ptr::null_mut()).unwrap());
        }
    }
    out
}

pub fn virtual_mode_is_deterministic(api: &SynapseApi, c: &MockControl) {
    let _r = Restore(c);
    let a = virtual_run(api, c, 7);
    let b = virtual_run(api, c, 7);
    let other = virtual_run(api, c, 8);
    assert_eq!(a, b);
    assert_ne!(a, other);
    // Each launch costs 1 ms × (1 + 0.5 × mult) >= 1 ms on the virtual clock.
    assert!(
        a[..10].windows(2).all(|w| w[1] - w[0] >= 1_000_000),
        "{a:?}"
    );
    // Busy while acquired.
    let _d = Dev::acquire(api, 0);
    let e = c.configure(&MockConfig::default()).unwrap_err().to_string();
    assert!(e.contains("synBusy"), "{e}");
}

pub fn latency_script_sets_elapsed_time(api: &SynapseApi, c: &MockControl) {
    let _r = Restore(c);
    let cfg = MockConfig {
        time_mode: TimeMode::Virtual,
        copy_bandwidth_gbps: 1.0,
        per_device: vec![DeviceOverride {
            module_id: 2,
            slowdown: 3.0,
            noise: None,
            script_ns: vec![1234, 5678],
        }],
        ..MockConfig::default()
    };
    c.configure(&cfg).unwrap();
    let d = Dev::acquire(api, 2);
    let s = d.stream();
    let a = d.malloc(1000);
    let r = d.recipe(
        &MockRecipe::new("noop2", "noop")
            .tensor("x", 8)
            .base_latency_ns(100),
    );
    let ev: Vec<_> = (0..5).map(|_| d.event(EVENT_COLLECT_TIME)).collect();
    d.record(ev[0], s);
    for (i, e) in ev[1..4].iter().enumerate() {
        let _ = i;
        ok(api, d.launch(s, r, &["x"], &[a], false, &mut []));
        d.record(*e, s);
    }
    let h = d.host_f32(250);
    ok(
        api,
        d.copy(s, a, 1000, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST),
    );
    d.record(ev[4], s);
    ok(api, d.sync(s));
    let dt: Vec<u64> = ev
        .windows(2)
        .map(|w| d.elapsed(w[0], w[1]).unwrap())
        .collect();
    // Script, script, then base 100 ns × slowdown 3; 1000 bytes at 1 GB/s = 1000 ns.
    assert_eq!(dt, vec![1234, 5678, 300, 1000]);
}

pub fn recipe_queries(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let r = d.recipe(
        &MockRecipe::new("q", "copy")
            .tensor("a", 16)
            .tensor("b", 32)
            .workspace_bytes(256),
    );
    unsafe {
        let attrs = [
            synRecipeAttribute::WORKSPACE_SIZE,
            synRecipeAttribute::NUM_PERSISTENT_TENSORS,
            synRecipeAttribute::HOST_MEM_SIZE,
        ];
        let mut vals = [u64::MAX; 3];
        ok(
            api,
            (api.syn_recipe_get_attribute)(vals.as_mut_ptr(), attrs.as_ptr(), 3, r),
        );
        assert_eq!(vals, [256, 2, 0]);
        let mut ws = 0;
        ok(api, (api.syn_workspace_get_size)(&mut ws, r));
        assert_eq!(ws, 256);
        let mut n = 0;
        ok(api, (api.syn_tensor_retrieve_launch_amount)(r, &mut n));
        assert_eq!(n, 2);
        let mut ids = [0u64; 2];
        ok(
            api,
            (api.syn_tensor_retrieve_launch_ids)(r, ids.as_mut_ptr(), 2),
        );
        assert!(ids[0] != 0 && ids[1] != 1 && ids[0] != ids[1], "{ids:?}");
        // Launch without the required workspace fails; with it succeeds.
        let s = d.stream();
        let (a, b, w) = (d.malloc(16), d.malloc(32), d.malloc(256));
        assert_eq!(
            d.launch(s, r, &["a", "b"], &[a, b], true, &mut []),
            synStatus::INVALID_ARGUMENT
        );
        assert!(
            last_message(api).contains("workspace"),
            "{}",
            last_message(api)
        );
        let names = [c"a".as_ptr(), c"b".as_ptr()];
        let infos: Vec<_> = (0..2)
            .map(|i| synLaunchTensorInfo {
                tensorName: names[i],
                pTensorAddress: [a, b][i],
                tensorType: synTensorType::DATA_TENSOR,
                tensorSize: [0; HABANA_DIM_MAX],
                tensorId: 0,
            })
            .collect();
        ok(
            api,
            (api.syn_launch_with_external_events)(
                s,
                infos.as_ptr(),
                2,
                w,
                r,
                std::ptr::null_mut(),
                0,
                SYN_FLAGS_TENSOR_NAME,
            ),
        );
        ok(api, d.sync(s));
        // Serialize round trip.
        let p = super::temp_path("serialized.json");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        ok(api, (api.syn_recipe_serialize)(r, c.as_ptr()));
        assert_eq!(MockRecipe::read(&p).unwrap().tensors.len(), 2);
        ok(api, (api.syn_recipe_destroy)(r));
        assert_eq!(
            (api.syn_workspace_get_size)(&mut ws, r),
            synStatus::INVALID_ARGUMENT
        );
    }
}

pub fn status_strings_and_hccl_stubs(api: &SynapseApi, _c: &MockControl) {
    unsafe {
        let mut buf = [0i8; 64];
        ok(
            api,
            (api.syn_status_get_brief_description)(
                synStatus::DEVICE_ALREADY_ACQUIRED,
                buf.as_mut_ptr(),
                64,
            ),
        );
        assert_eq!(
            CStr::from_ptr(buf.as_ptr()).to_str().unwrap(),
            "device already acquired"
        );
        ok(
            api,
            (api.syn_status_get_brief_description)(
                synStatus::DEVICE_ALREADY_ACQUIRED,
                buf.as_mut_ptr(),
                7,
            ),
        );
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "device");
        assert_eq!(api.version(), Some("1.21.0-mock"));
        let mut v = 0;
        assert_eq!((api.hccl_get_version)(&mut v), hcclResult_t::SUCCESS);
        assert_eq!(v, HCCL_VERSION_CODE);
        let mut id = hcclUniqueId::default();
        assert_eq!((api.hccl_get_unique_id)(&mut id), hcclResult_t::UNSUPPORTED);
        let msg = CStr::from_ptr((api.hccl_get_last_error_message.unwrap())())
            .to_str()
            .unwrap();
        assert!(msg.contains("not implemented"));
        let s = CStr::from_ptr((api.hccl_get_error_string)(hcclResult_t::UNSUPPORTED))
            .to_str()
            .unwrap();
        assert!(s.contains("unsupported"));
        let e = CStr::from_ptr((api.syn_get_error_string.unwrap())(
            synStatus::INVALID_EVENT_HANDLE,
        ))
        .to_str()
        .unwrap();
        assert_eq!(e, "invalid event handle");
        let mut c = 0;
        assert_eq!((api.syn_device_get_count)(&mut c), synStatus::SUCCESS);
        assert_eq!(
            (api.syn_device_release)(424242),
            synStatus::INVALID_ARGUMENT
        );
        assert_eq!(
            (api.syn_get_last_error.unwrap())(),
            synStatus::INVALID_ARGUMENT
        );
    }
}
