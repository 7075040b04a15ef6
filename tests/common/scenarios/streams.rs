//! Conformance scenarios: events, stream ordering, launches and recipes.

use dropcompute::mock::{MockControl, MockRecipe};
use habana_sys::*;

use super::super::{Dev, last_message, ok, temp_path};

pub fn event_semantics(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let timed = d.event(EVENT_COLLECT_TIME);
    let untimed = d.event(0);
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        // Never recorded: complete for query/synchronize, not initialised for elapsed time.
        ok(api, (api.syn_event_query)(timed));
        ok(api, (api.syn_event_synchronize)(timed));
        assert_eq!(d.elapsed(timed, std::ptr::null_mut()), Err(synStatus::OBJECT_NOT_INITIALIZED));
        d.record(untimed, s);
        ok(api, (api.syn_event_synchronize)(untimed));
        assert_eq!(d.elapsed(untimed, std::ptr::null_mut()), Err(synStatus::INVALID_ARGUMENT));
        assert!(last_message(api).contains("EVENT_COLLECT_TIME"), "{}", last_message(api));
        // Timestamps are monotonic along a stream, across copies and re-records.
        let e2 = d.event(EVENT_COLLECT_TIME);
        let h = d.host_f32(1 << 16);
        let a = d.malloc(1 << 18);
        let mut last = 0;
        for _ in 0..5 {
            d.record(timed, s);
            ok(api, d.copy(s, h.as_ptr() as u64, 1 << 18, a, synDmaDir::HOST_TO_DRAM));
            d.record(e2, s);
            ok(api, (api.syn_event_synchronize)(e2));
            let t0 = d.elapsed(timed, std::ptr::null_mut()).unwrap();
            let t1 = d.elapsed(e2, std::ptr::null_mut()).unwrap();
            assert!(t0 >= last && t1 >= t0, "{last} {t0} {t1}");
            // 256 KiB at 25 GB/s: at least 10485 ns between the events.
            assert!(d.elapsed(timed, e2).unwrap() >= 10_485, "{:?}", d.elapsed(timed, e2));
            last = t1;
        }
        ok(api, (api.syn_event_destroy)(e2));
        assert_eq!((api.syn_event_query)(e2), synStatus::INVALID_EVENT_HANDLE);
        assert_eq!(d.elapsed(e2, std::ptr::null_mut()), Err(synStatus::INVALID_EVENT_HANDLE));
        // Wait-event flags must be 0.
        assert_eq!((api.syn_stream_wait_event)(s, timed, 1), synStatus::INVALID_ARGUMENT);
    }
}

fn fill_recipe(name: &str, bytes: u64, v: f64, base_ns: u64) -> MockRecipe {
    MockRecipe::new(name, "fill_f32").tensor("out", bytes).params([v]).base_latency_ns(base_ns)
}

pub fn stream_ordering_and_launch(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let a = d.malloc(4096);
    let b = d.malloc(4096);
    let fill = d.recipe(&fill_recipe("fill3", 4096, 3.0, 1000));
    let fill9 = d.recipe(&fill_recipe("fill9", 2048, 9.0, 1000));
    let copy = d.recipe(&MockRecipe::new("copy", "copy").tensor("src", 4096).tensor("dst", 4096));
    // fill a with 3 (by id), the first half with 9 (by name), copy a -> b (by name): order matters.
    ok(api, d.launch(s, fill, &["out"], &[a], false, &mut []));
    ok(api, d.launch(s, fill9, &["out"], &[a], true, &mut []));
    ok(api, d.launch(s, copy, &["src", "dst"], &[a, b], true, &mut []));
    let v = d.read_f32(s, b, 1024);
    assert!(v[..512].iter().all(|&x| x == 9.0) && v[512..].iter().all(|&x| x == 3.0), "{:?}", &v[500..520]);
    // External events are recorded when the launch completes: after the recipe's latency
    // (base 1000 ns; the exact scripted value: `latency_script_sets_elapsed_time`).
    let (before, e) = (d.event(EVENT_COLLECT_TIME), d.event(EVENT_COLLECT_TIME));
    d.record(before, s);
    ok(api, d.launch(s, fill, &["out"], &[b], false, &mut [e]));
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe { ok(api, (api.syn_event_synchronize)(e)) };
    let (t_before, t_e) =
        (d.elapsed(before, std::ptr::null_mut()).unwrap(), d.elapsed(e, std::ptr::null_mut()).unwrap());
    assert!(t_e >= t_before + 1000, "launch event at {t_e} ns, {t_before} ns before it");
    assert_eq!(d.elapsed(before, e), Ok(t_e - t_before));
    assert_eq!(d.read_f32(s, b, 1024), vec![3.0; 1024]);
}

pub fn launch_errors(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let a = d.malloc(4096);
    let copy = d.recipe(&MockRecipe::new("copy2", "copy").tensor("src", 4096).tensor("dst", 4096));
    let info = |id: u64, addr: u64| synLaunchTensorInfo {
        tensorName: std::ptr::null(),
        pTensorAddress: addr,
        tensorType: synTensorType::DATA_TENSOR,
        tensorSize: [0; HABANA_DIM_MAX],
        tensorId: id,
    };
    let mut ids = [0u64; 2];
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        ok(api, (api.syn_tensor_retrieve_launch_ids)(copy, ids.as_mut_ptr(), 2));
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
        assert_eq!(launch(&[info(0, a), info(1, a)]), synStatus::INVALID_ARGUMENT);
        // Missing tensor, tensor bound twice.
        assert_eq!(launch(&[info(ids[0], a)]), synStatus::INVALID_ARGUMENT);
        assert!(last_message(api).contains("not bound"), "{}", last_message(api));
        assert_eq!(launch(&[info(ids[0], a), info(ids[0], a)]), synStatus::INVALID_ARGUMENT);
        // Range past the allocation end; unallocated address.
        assert_eq!(launch(&[info(ids[0], a), info(ids[1], a + 8)]), synStatus::INVALID_ARGUMENT);
        assert_eq!(launch(&[info(ids[0], a), info(ids[1], 0xdead_0000)]), synStatus::INVALID_ARGUMENT);
        // The same buffer twice is allowed (one lock).
        ok(api, launch(&[info(ids[0], a), info(ids[1], a)]));
        ok(api, d.sync(s));
        // Unknown kernel and malformed recipe files.
        let mut h = std::ptr::null_mut();
        let (_dir, p) = temp_path("unknown_kernel.json");
        MockRecipe::new("u", "no_such_kernel").write(&p).unwrap();
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        assert_eq!((api.syn_recipe_deserialize)(&mut h, c.as_ptr()), synStatus::INVALID_ARGUMENT);
        let m = last_message(api);
        assert!(m.contains("no_such_kernel") && m.contains("unknown_kernel.json"), "{m}");
        std::fs::write(&p, "{\"format\":").unwrap();
        assert_eq!((api.syn_recipe_deserialize)(&mut h, c.as_ptr()), synStatus::INVALID_ARGUMENT);
        assert!(last_message(api).contains("malformed"), "{}", last_message(api));
    }
}

pub fn cross_stream_wait(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let (s1, s2) = (d.stream(), d.stream());
    let a = d.malloc(4096);
    let b = d.malloc(4096);
    // A slow fill on s1 (20 ms emulated), then s2 waits for it before copying a -> b.
    let fill = d.recipe(&fill_recipe("slowfill", 4096, 5.0, 20_000_000));
    let copy = d.recipe(&MockRecipe::new("copy3", "copy").tensor("src", 4096).tensor("dst", 4096));
    let e = d.event(EVENT_COLLECT_TIME);
    let e2 = d.event(EVENT_COLLECT_TIME);
    ok(api, d.launch(s1, fill, &["out"], &[a], false, &mut []));
    d.record(e, s1);
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe { ok(api, (api.syn_stream_wait_event)(s2, e, 0)) };
    ok(api, d.launch(s2, copy, &["src", "dst"], &[a, b], false, &mut []));
    d.record(e2, s2);
    assert_eq!(d.read_f32(s2, b, 1024), vec![5.0; 1024]);
    // The waiting stream's work ends after the event on the device timeline.
    let (t1, t2) = (d.elapsed(e, std::ptr::null_mut()).unwrap(), d.elapsed(e2, std::ptr::null_mut()).unwrap());
    assert!(t2 >= t1, "{t1} {t2}");
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe { ok(api, (api.syn_device_synchronize)(d.id)) };
}

pub fn recipe_queries(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let r = d.recipe(&MockRecipe::new("q", "copy").tensor("a", 16).tensor("b", 32).workspace_bytes(256));
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        let attrs = [
            synRecipeAttribute::WORKSPACE_SIZE,
            synRecipeAttribute::NUM_PERSISTENT_TENSORS,
            synRecipeAttribute::HOST_MEM_SIZE,
        ];
        let mut vals = [u64::MAX; 3];
        ok(api, (api.syn_recipe_get_attribute)(vals.as_mut_ptr(), attrs.as_ptr(), 3, r));
        assert_eq!(vals, [256, 2, 0]);
        let mut ws = 0;
        ok(api, (api.syn_workspace_get_size)(&mut ws, r));
        assert_eq!(ws, 256);
        let mut n = 0;
        ok(api, (api.syn_tensor_retrieve_launch_amount)(r, &mut n));
        assert_eq!(n, 2);
        let mut ids = [0u64; 2];
        ok(api, (api.syn_tensor_retrieve_launch_ids)(r, ids.as_mut_ptr(), 2));
        assert!(ids[0] != 0 && ids[1] != 1 && ids[0] != ids[1], "{ids:?}");
        // Launch without the required workspace fails; with it succeeds.
        let s = d.stream();
        let (a, b, w) = (d.malloc(16), d.malloc(32), d.malloc(256));
        assert_eq!(d.launch(s, r, &["a", "b"], &[a, b], true, &mut []), synStatus::INVALID_ARGUMENT);
        assert!(last_message(api).contains("workspace"), "{}", last_message(api));
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
        let (_dir, p) = temp_path("serialized.json");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        ok(api, (api.syn_recipe_serialize)(r, c.as_ptr()));
        assert_eq!(MockRecipe::read(&p).unwrap().tensors.len(), 2);
        ok(api, (api.syn_recipe_destroy)(r));
        assert_eq!((api.syn_workspace_get_size)(&mut ws, r), synStatus::INVALID_ARGUMENT);
    }
}
