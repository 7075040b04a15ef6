//! Conformance scenarios: memory round trips and memory/device error paths.

use dropcompute::mock::MockControl;
use habana_sys::*;

use super::super::{Dev, last_message, ok};
use super::*;

pub fn memory_round_trip_all_directions(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let src = d.host_f32(N);
    src.copy_from_slice(&pattern(N));
    let (a, b) = (d.malloc((N * 4) as u64), d.malloc((N * 4) as u64));
    assert_eq!(a % 128, 0);
    assert_ne!(a, b);
    ok(api, d.copy(s, src.as_ptr() as u64, (N * 4) as u64, a, synDmaDir::HOST_TO_DRAM));
    ok(api, d.copy(s, a, (N * 4) as u64, b, synDmaDir::DRAM_TO_DRAM));
    // Device to host into a synHostMap'ed user buffer.
    let mut dst = vec![0f32; N];
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        ok(api, (api.syn_host_map)(d.id, (N * 4) as u64, dst.as_ptr().cast()));
        ok(api, d.copy(s, b, (N * 4) as u64, dst.as_mut_ptr() as u64, synDmaDir::DRAM_TO_HOST));
        ok(api, d.sync(s));
        ok(api, (api.syn_host_unmap)(d.id, dst.as_ptr().cast()));
    }
    assert_eq!(dst, pattern(N));
    // A partial copy at an offset inside the allocation.
    ok(api, d.copy(s, src.as_ptr() as u64 + 40, 16, b + 400, synDmaDir::HOST_TO_DRAM));
    let back = d.read_f32(s, b + 400, 4);
    assert_eq!(back, pattern(N)[10..14].to_vec());
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
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
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        ok(
            api,
            (api.syn_mem_copy_async_multiple)(s, src.as_ptr(), size.as_ptr(), dst.as_ptr(), synDmaDir::HOST_TO_DRAM, 2),
        )
    };
    assert_eq!(d.read_f32(s, a, 8), vec![5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0]);
}

pub fn memory_errors(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 0);
    let s = d.stream();
    let h = d.host_f32(16);
    let a = d.malloc(64);
    // Out of range: 65 bytes from a 64-byte allocation; and an offset past the end.
    assert_eq!(d.copy(s, h.as_ptr() as u64, 65, a, synDmaDir::HOST_TO_DRAM), synStatus::INVALID_ARGUMENT);
    assert!(last_message(api).contains("exceeds"), "{}", last_message(api));
    assert_eq!(d.copy(s, a + 60, 8, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST), synStatus::INVALID_ARGUMENT);
    // Host side outside any registered range.
    let stack = [0f32; 16];
    assert_eq!(d.copy(s, stack.as_ptr() as u64, 16, a, synDmaDir::HOST_TO_DRAM), synStatus::INVALID_ARGUMENT);
    assert!(last_message(api).contains("synHostMalloc"), "{}", last_message(api));
    // Host side running past the end of its range.
    assert_eq!(d.copy(s, h.as_ptr() as u64 + 60, 8, a, synDmaDir::HOST_TO_DRAM), synStatus::INVALID_ARGUMENT);
    // Double free and use after free.
    ok(api, d.free(a));
    assert_eq!(d.free(a), synStatus::INVALID_ARGUMENT);
    assert!(last_message(api).contains("already freed"), "{}", last_message(api));
    assert!(last_message(api).starts_with("synDeviceFree"), "{}", last_message(api));
    assert_eq!(d.copy(s, a, 4, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST), synStatus::INVALID_ARGUMENT);
    assert!(last_message(api).contains("after free"), "{}", last_message(api));
    // Addresses are never reused.
    let b = d.malloc(64);
    assert_ne!(a, b);
    // Freeing an interior address, or a foreign one.
    assert_eq!(d.free(b + 128), synStatus::INVALID_ARGUMENT);
    assert_eq!(d.free(0), synStatus::INVALID_ARGUMENT);
    // Host free twice; unmap of a malloc'd pointer.
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        assert_eq!((api.syn_host_unmap)(d.id, h.as_ptr().cast()), synStatus::INVALID_ARGUMENT);
        ok(api, (api.syn_host_free)(d.id, h.as_ptr().cast(), 0));
        assert_eq!((api.syn_host_free)(d.id, h.as_ptr().cast(), 0), synStatus::INVALID_ARGUMENT);
    }
    // Memory info reflects allocations.
    let (mut free, mut total) = (0, 0);
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe { ok(api, (api.syn_device_get_memory_info)(d.id, &mut free, &mut total)) };
    assert_eq!(total, 96 << 30);
    assert_eq!(free, total - 64);
    // Beyond HBM.
    let mut x = 0;
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    assert_eq!(unsafe { (api.syn_device_malloc)(d.id, 97 << 30, 0, 0, &mut x) }, synStatus::OUT_OF_DEVICE_MEMORY);
}

pub fn device_errors(api: &SynapseApi, _c: &MockControl) {
    let d = Dev::acquire(api, 1);
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        let mut id = 0;
        assert_eq!((api.syn_device_acquire_by_module_id)(&mut id, 1), synStatus::DEVICE_ALREADY_ACQUIRED);
        assert_eq!((api.syn_device_acquire_by_module_id)(&mut id, 100_000), synStatus::INVALID_ARGUMENT);
        let mut n = 0;
        ok(api, (api.syn_device_get_count)(&mut n));
        assert_eq!(n, 8);
        let mut ids = [u32::MAX; 16];
        let mut size = 16;
        ok(api, (api.syn_device_get_module_ids)(ids.as_mut_ptr(), &mut size));
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
        ok(api, (api.syn_device_acquire_by_device_type)(&mut t, synDeviceType::GAUDI2));
        assert_ne!(t, d.id);
        assert_eq!((api.syn_device_acquire_by_device_type)(&mut id, synDeviceType::GAUDI3), synStatus::NO_DEVICE_FOUND);
        let mut b = 0;
        ok(api, (api.syn_device_acquire)(&mut b, std::ptr::null()));
        ok(api, (api.syn_device_release)(b));
        ok(api, (api.syn_device_release)(t));
        // Released / unknown device ids.
        assert_eq!((api.syn_device_release)(t), synStatus::INVALID_ARGUMENT);
        assert_eq!((api.syn_device_synchronize)(9999), synStatus::INVALID_ARGUMENT);
        // Unknown or forged handles.
        let bogus = 0x1234_5678usize as synStreamHandle;
        assert_eq!((api.syn_stream_synchronize)(bogus), synStatus::INVALID_ARGUMENT);
        assert_eq!((api.syn_stream_query)(std::ptr::null_mut()), synStatus::INVALID_ARGUMENT);
        assert_eq!((api.syn_event_query)(0x40 as synEventHandle), synStatus::INVALID_EVENT_HANDLE);
        assert_eq!((api.syn_recipe_destroy)(0x7 as synRecipeHandle), synStatus::INVALID_ARGUMENT);
        // A stream handle passed as an event handle.
        let s = d.stream();
        assert_eq!((api.syn_event_query)(s.cast()), synStatus::INVALID_EVENT_HANDLE);
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
        assert_eq!((api.syn_stream_create_generic)(&mut s3, d.id, 1), synStatus::INVALID_ARGUMENT);
        assert_eq!((api.syn_device_get_count)(std::ptr::null_mut()), synStatus::INVALID_ARGUMENT);
    }
}
