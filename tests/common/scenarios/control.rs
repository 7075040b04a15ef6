//! Conformance scenarios: stalls, kernel errors, faults, virtual time, latency scripts, strings.

use std::ffi::{CStr, c_void};

use dropcompute::mock::{DeviceOverride, Fault, MockConfig, MockControl, MockKernelArgs, MockRecipe, Noise, TimeMode};
use habana_sys::*;

use super::super::{Dev, last_message, ok};
use super::*;

pub fn stall_makes_stream_busy(api: &SynapseApi, c: &MockControl) {
    let d = Dev::acquire(api, 3);
    let s = d.stream();
    let h = d.host_f32(4);
    let a = d.malloc(16);
    c.inject_fault(&Fault::StallStream { module_id: 3, duration_ms: None }).unwrap();
    ok(api, d.copy(s, h.as_ptr() as u64, 16, a, synDmaDir::HOST_TO_DRAM));
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        assert_eq!((api.syn_stream_query)(s), synStatus::BUSY);
        assert_eq!((api.syn_stream_destroy)(s), synStatus::BUSY);
        let e = d.event(0);
        d.record(e, s);
        assert_eq!((api.syn_event_query)(e), synStatus::BUSY);
        c.inject_fault(&Fault::ReleaseStall { module_id: 3 }).unwrap();
        ok(api, (api.syn_event_synchronize)(e));
        ok(api, (api.syn_stream_query)(s));
        ok(api, (api.syn_stream_destroy)(s));
    }
    assert!(c.inject_fault(&Fault::StallStream { module_id: 1 << 20, duration_ms: Some(1) }).is_err());
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
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        c.register_kernel("test_fail", failing_kernel, std::ptr::null_mut()).unwrap();
        c.register_kernel("test_add", add_user_value, &ADDEND as *const f32 as *mut c_void).unwrap();
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
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
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
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        assert_eq!((api.syn_device_malloc)(d.id, 64, 0, 0, &mut x), synStatus::OUT_OF_RESOURCES);
        assert!(last_message(api).contains("injected"), "{}", last_message(api));
        ok(api, (api.syn_device_malloc)(d.id, 64, 0, 0, &mut x));
    }
    c.inject_fault(&Fault::FailNextCall { function: "synStreamQuery".into(), status: 26, times: 2 }).unwrap();
    c.inject_fault(&Fault::ClearAll).unwrap();
    let s = d.stream();
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
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
        let r = d.recipe(&MockRecipe::new("noop", "noop").tensor("x", 4096).base_latency_ns(1_000_000));
        let e = d.event(EVENT_COLLECT_TIME);
        for _ in 0..10 {
            ok(api, d.launch(s, r, &["x"], &[a], false, &mut []));
            d.record(e, s);
            // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
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
    assert!(a[..10].windows(2).all(|w| w[1] - w[0] >= 1_000_000), "{a:?}");
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
            script_ns: vec![1234, 5678, 91_011],
            script_recipe: None,
        }],
        ..MockConfig::default()
    };
    c.configure(&cfg).unwrap();
    let d = Dev::acquire(api, 2);
    let s = d.stream();
    let a = d.malloc(1000);
    let r = d.recipe(&MockRecipe::new("noop2", "noop").tensor("x", 8).base_latency_ns(100));
    let ev: Vec<_> = (0..5).map(|_| d.event(EVENT_COLLECT_TIME)).collect();
    d.record(ev[0], s);
    for (i, e) in ev[1..4].iter().enumerate() {
        let _ = i;
        ok(api, d.launch(s, r, &["x"], &[a], false, &mut []));
        d.record(*e, s);
    }
    let h = d.host_f32(250);
    ok(api, d.copy(s, a, 1000, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST));
    d.record(ev[4], s);
    ok(api, d.sync(s));
    let dt: Vec<u64> = ev.windows(2).map(|w| d.elapsed(w[0], w[1]).unwrap()).collect();
    // Script, script, script, then base 100 ns × slowdown 3; 1000 bytes at 1 GB/s = 1000 ns.
    assert_eq!(dt, vec![1234, 5678, 91_011, 1000]);
    // The external event of a launch is signalled at its end: the next script entry is
    // exhausted, so base 100 ns × slowdown 3 after the previous event.
    let ext = d.event(EVENT_COLLECT_TIME);
    ok(api, d.launch(s, r, &["x"], &[a], false, &mut [ext]));
    ok(api, d.sync(s));
    assert_eq!(d.elapsed(ev[4], ext), Ok(300));
}

pub fn status_strings_and_hccl_entry_points(api: &SynapseApi, _c: &MockControl) {
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        let mut buf = [0i8; 64];
        ok(api, (api.syn_status_get_brief_description)(synStatus::DEVICE_ALREADY_ACQUIRED, buf.as_mut_ptr(), 64));
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "device already acquired");
        ok(api, (api.syn_status_get_brief_description)(synStatus::DEVICE_ALREADY_ACQUIRED, buf.as_mut_ptr(), 7));
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "device");
        assert_eq!(api.version(), Some("1.21.0-mock"));
        let mut v = 0;
        assert_eq!((api.hccl_get_version)(&mut v), hcclResult_t::SUCCESS);
        assert_eq!(v, HCCL_VERSION_CODE);
        let mut comm: hcclComm_t = std::ptr::null_mut();
        assert_eq!((api.hccl_comm_init_all)(&mut comm, 2, std::ptr::null()), hcclResult_t::INVALID_USAGE);
        let msg = CStr::from_ptr((api.hccl_get_last_error_message.unwrap())()).to_str().unwrap();
        assert!(msg.contains("hcclCommInitAll") && msg.contains("not implemented"), "{msg}");
        let mut id = hcclUniqueId::default();
        assert_eq!((api.hccl_get_unique_id)(&mut id), hcclResult_t::SUCCESS);
        assert_eq!(&id.internal[..8], b"DCMOCKID");
        assert!(id.length > 30 && id.length < 64, "{}", id.length);
        let s = CStr::from_ptr((api.hccl_get_error_string)(hcclResult_t::UNSUPPORTED)).to_str().unwrap();
        assert!(s.contains("unsupported"));
        let e = CStr::from_ptr((api.syn_get_error_string.unwrap())(synStatus::INVALID_EVENT_HANDLE)).to_str().unwrap();
        assert_eq!(e, "invalid event handle");
        let mut c = 0;
        assert_eq!((api.syn_device_get_count)(&mut c), synStatus::SUCCESS);
        assert_eq!((api.syn_device_release)(424242), synStatus::INVALID_ARGUMENT);
        assert_eq!((api.syn_get_last_error.unwrap())(), synStatus::INVALID_ARGUMENT);
    }
}
