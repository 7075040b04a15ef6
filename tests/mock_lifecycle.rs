//! Process-level lifecycle of the in-process mock: state before synInitialize, the device count
//! from the environment, synDestroy releasing everything, reconfiguration, 1024 thread-per-rank
//! modules. One test function: these steps change global state and must run in order.
#![cfg(feature = "mock")] // runs on the CPU mock device
mod common;

use std::ffi::CStr;

use dropcompute::mock::{MockConfig, MockControl, MockRecipe, TimeMode, api};
use habana_sys::*;

use common::{Dev, ok};

fn version(api: &SynapseApi) -> String {
    let mut buf = [0i8; 64];
    // SAFETY: 64-byte buffer.
    let s = unsafe { (api.syn_driver_get_version.unwrap())(buf.as_mut_ptr(), 64) };
    assert!(s.is_success());
    // SAFETY: NUL-terminated by the callee.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_owned()
}

#[test]
fn lifecycle() {
    // The device count below comes from the variables this test sets, not the calling shell's.
    common::hermetic::scrub_process_env();
    let api = api();
    // SAFETY (raw calls below): pointers to live locals; single-threaded until the rank threads.
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        // Before synInitialize: synObjectNotInitialized, but the version is available.
        let mut n = 0;
        assert_eq!((api.syn_device_get_count)(&mut n), synStatus::OBJECT_NOT_INITIALIZED);
        let mut id = 0;
        assert_eq!((api.syn_device_acquire_by_module_id)(&mut id, 0), synStatus::OBJECT_NOT_INITIALIZED);
        assert_eq!(version(&api), "1.21.0-mock");
        // SAFETY: no other thread of this process reads the environment concurrently.
        std::env::set_var("DROPCOMPUTE_MOCK_VERSION", "1.15.0");
        assert_eq!(version(&api), "1.15.0");
        std::env::remove_var("DROPCOMPUTE_MOCK_VERSION");
        std::env::set_var("DROPCOMPUTE_MOCK_DEVICES", "3");

        ok(&api, (api.syn_initialize)());
        ok(&api, (api.syn_initialize)());
        ok(&api, (api.syn_device_get_count)(&mut n));
        assert_eq!(n, 3);
        std::env::remove_var("DROPCOMPUTE_MOCK_DEVICES");

        // synDestroy releases devices and invalidates every handle.
        let d = Dev::acquire(&api, 2);
        let s = d.stream();
        let e = d.event(0);
        let a = d.malloc(64);
        let dev_id = d.id;
        std::mem::forget(d);
        ok(&api, (api.syn_destroy)());
        assert_eq!((api.syn_device_get_count)(&mut n), synStatus::OBJECT_NOT_INITIALIZED);
        ok(&api, (api.syn_initialize)());
        assert_eq!((api.syn_stream_query)(s), synStatus::INVALID_ARGUMENT);
        assert_eq!((api.syn_event_query)(e), synStatus::INVALID_EVENT_HANDLE);
        assert_eq!((api.syn_device_free)(dev_id, a, 0), synStatus::INVALID_ARGUMENT);
        let d = Dev::acquire(&api, 2);
        assert_ne!(d.id, dev_id, "device ids are not reused");
        drop(d);
    }

    // 1024 modules, one thread per rank, virtual time.
    let ctl = MockControl::in_process();
    ctl.configure(&MockConfig { devices: 1024, time_mode: TimeMode::Virtual, ..MockConfig::default() }).unwrap();
    let (_dir, path) = common::temp_path("rank_noop.json");
    MockRecipe::new("rank_noop", "noop").tensor("x", 128).base_latency_ns(1000).write(&path).unwrap();
    let handles: Vec<_> = (0..1024u32)
        .map(|rank| {
            let api = api.clone();
            let path = path.clone();
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let d = Dev::acquire(&api, rank);
                    let s = d.stream();
                    let a = d.malloc(128);
                    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                    let mut r = std::ptr::null_mut();
                    // SAFETY: valid out-pointer and path.
                    unsafe { ok(&api, (api.syn_recipe_deserialize)(&mut r, c.as_ptr())) };
                    let e = d.event(EVENT_COLLECT_TIME);
                    ok(&api, d.launch(s, r, &["x"], &[a], false, &mut [e]));
                    ok(&api, d.sync(s));
                    d.elapsed(e, std::ptr::null_mut()).unwrap()
                })
                .unwrap()
        })
        .collect();
    let ts: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Virtual clock: every rank's single launch ends at exactly 1000 ns.
    assert!(ts.iter().all(|&t| t == 1000), "{:?}", &ts[..8]);
    ctl.configure(&MockConfig::default()).unwrap();
}
