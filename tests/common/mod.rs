//! Shared helpers for tests that drive a Synapse function table (the in-process CPU mock or a
//! loaded shared library) through raw calls, and the mock conformance scenarios run against
//! both. Every scenario takes the process-wide [`serial`] lock: the mock state is global and
//! some scenarios reconfigure it.
#![allow(dead_code)]

pub mod hccl;
#[path = "../support/hermetic.rs"]
pub mod hermetic;
pub mod scenarios;

use std::ffi::{CStr, CString, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use dropcompute::mock::MockRecipe;
use habana_sys::*;

/// Serialises the tests of one binary; the first call removes the product's variables from the
/// process (`hermetic::scrub_process_env`), so the mock's configuration is not the shell's.
pub fn serial() -> MutexGuard<'static, ()> {
    hermetic::scrub_process_env();
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

/// The last error message of this thread in `api`.
pub fn last_message(api: &SynapseApi) -> String {
    match api.syn_get_last_error_message {
        // SAFETY: returns a NUL-terminated thread-local string.
        Some(f) => unsafe { CStr::from_ptr(f()) }.to_string_lossy().into_owned(),
        None => String::new(),
    }
}

/// Asserts success, printing the last error message otherwise.
#[track_caller]
pub fn ok(api: &SynapseApi, s: synStatus) {
    assert_eq!(s, synStatus::SUCCESS, "{}", last_message(api));
}

/// An acquired device, released on drop.
pub struct Dev {
    pub api: SynapseApi,
    pub id: synDeviceId,
    pub module: u32,
}

impl Dev {
    /// synInitialize + acquire module `module`.
    pub fn acquire(api: &SynapseApi, module: u32) -> Self {
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe {
            ok(api, (api.syn_initialize)());
            let mut id = 0;
            ok(api, (api.syn_device_acquire_by_module_id)(&mut id, module));
            Self { api: api.clone(), id, module }
        }
    }

    pub fn malloc(&self, size: u64) -> u64 {
        let mut a = 0;
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { ok(&self.api, (self.api.syn_device_malloc)(self.id, size, 0, 0, &mut a)) };
        a
    }

    pub fn free(&self, a: u64) -> synStatus {
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { (self.api.syn_device_free)(self.id, a, 0) }
    }

    /// A synHostMalloc'd buffer of `n` f32.
    pub fn host_f32(&self, n: usize) -> &'static mut [f32] {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe {
            ok(&self.api, (self.api.syn_host_malloc)(self.id, (n * 4) as u64, 0, &mut p));
            std::slice::from_raw_parts_mut(p.cast(), n)
        }
    }

    pub fn stream(&self) -> synStreamHandle {
        let mut s = std::ptr::null_mut();
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { ok(&self.api, (self.api.syn_stream_create_generic)(&mut s, self.id, 0)) };
        s
    }

    pub fn event(&self, flags: u32) -> synEventHandle {
        let mut e = std::ptr::null_mut();
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { ok(&self.api, (self.api.syn_event_create)(&mut e, self.id, flags)) };
        e
    }

    pub fn copy(&self, s: synStreamHandle, src: u64, size: u64, dst: u64, dir: synDmaDir) -> synStatus {
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { (self.api.syn_mem_copy_async)(s, src, size, dst, dir) }
    }

    pub fn sync(&self, s: synStreamHandle) -> synStatus {
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { (self.api.syn_stream_synchronize)(s) }
    }

    pub fn record(&self, e: synEventHandle, s: synStreamHandle) {
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { ok(&self.api, (self.api.syn_event_record)(e, s)) };
    }

    pub fn elapsed(&self, a: synEventHandle, b: synEventHandle) -> Result<u64, synStatus> {
        let mut ns = 0;
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        let s = unsafe { (self.api.syn_event_elapsed_time)(&mut ns, a, b) };
        if s.is_success() { Ok(ns) } else { Err(s) }
    }

    /// Writes `r` to a temp file and deserializes it.
    pub fn recipe(&self, r: &MockRecipe) -> synRecipeHandle {
        let (_dir, path) = temp_path(&format!("{}.json", r.name));
        r.write(&path).unwrap();
        let c = CString::new(path.to_str().unwrap()).unwrap();
        let mut h = std::ptr::null_mut();
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { ok(&self.api, (self.api.syn_recipe_deserialize)(&mut h, c.as_ptr())) };
        h
    }

    /// Launch binding tensor i of the recipe to `addrs[i]` by id (tensor ids retrieved from the
    /// recipe) or by name.
    pub fn launch(
        &self,
        s: synStreamHandle,
        r: synRecipeHandle,
        names: &[&str],
        addrs: &[u64],
        by_name: bool,
        events: &mut [synEventHandle],
    ) -> synStatus {
        let cnames: Vec<CString> = names.iter().map(|n| CString::new(*n).unwrap()).collect();
        let ptrs: Vec<*const i8> = cnames.iter().map(|c| c.as_ptr()).collect();
        let mut ids = vec![0u64; names.len()];
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe {
            ok(&self.api, (self.api.syn_tensor_retrieve_ids)(r, ptrs.as_ptr(), ids.as_mut_ptr(), names.len() as u32));
        }
        let infos: Vec<synLaunchTensorInfo> = (0..names.len())
            .map(|i| synLaunchTensorInfo {
                tensorName: if by_name { ptrs[i] } else { std::ptr::null() },
                pTensorAddress: addrs[i],
                tensorType: synTensorType::DATA_TENSOR,
                tensorSize: [0; HABANA_DIM_MAX],
                tensorId: if by_name { u64::MAX } else { ids[i] },
            })
            .collect();
        let flags = if by_name { SYN_FLAGS_TENSOR_NAME } else { 0 };
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe {
            (self.api.syn_launch_with_external_events_ext)(
                s,
                infos.as_ptr(),
                infos.len() as u32,
                0,
                r,
                events.as_mut_ptr(),
                events.len() as u32,
                flags,
            )
        }
    }

    /// Copies `n` f32 from device address `a` into a fresh host buffer and returns them.
    pub fn read_f32(&self, s: synStreamHandle, a: u64, n: usize) -> Vec<f32> {
        let h = self.host_f32(n);
        ok(&self.api, self.copy(s, a, (n * 4) as u64, h.as_mut_ptr() as u64, synDmaDir::DRAM_TO_HOST));
        ok(&self.api, self.sync(s));
        let v = h.to_vec();
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { ok(&self.api, (self.api.syn_host_free)(self.id, h.as_ptr().cast(), 0)) };
        v
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe { (self.api.syn_device_release)(self.id) };
    }
}

/// A fresh path `name` (not created) in a fresh temporary directory, removed when the returned
/// directory drops: keep it alive while the path is used.
pub fn temp_path(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = hermetic::temp_dir("mock-tests");
    let p = dir.path().join(name);
    (dir, p)
}

/// Generates one `#[test]` per conformance scenario for the table `$api` and control `$ctl`
/// (expressions evaluated in each test).
#[macro_export]
macro_rules! conformance_suite {
    ($api:expr, $ctl:expr) => {
        $crate::conformance_suite!(@tests $api, $ctl;
            memory_round_trip_all_directions, copy_multiple, memory_errors, device_errors,
            event_semantics, stream_ordering_and_launch, launch_errors, cross_stream_wait,
            stall_makes_stream_busy, kernel_error_is_sticky, fault_fails_next_call_once,
            virtual_mode_is_deterministic, latency_script_sets_elapsed_time, recipe_queries,
            status_strings_and_hccl_entry_points);
    };
    (@tests $api:expr, $ctl:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let _g = common::serial();
                common::scenarios::$name(&$api, &$ctl);
            }
        )*
    };
}
