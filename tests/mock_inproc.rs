//! The mock conformance scenarios against the in-process table (`dropcompute::mock::api()`).
#![cfg(feature = "mock")] // runs on the CPU mock device
mod common;

use dropcompute::mock::{MockControl, api};

conformance_suite!(api(), MockControl::in_process());

mod properties {
    use super::common::{self, Dev};
    use dropcompute::mock::api;
    use habana_sys::{synDmaDir, synStatus};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// A device-to-host copy of `len` bytes at offset `off` of a `size`-byte allocation is
        /// accepted exactly when it stays inside the allocation.
        #[test]
        fn copy_accepted_iff_inside_allocation(size in 1u64..4096, off in 0u64..4200, len in 1u64..4200) {
            let _g = common::serial();
            let api = api();
            let d = Dev::acquire(&api, 6);
            let s = d.stream();
            let a = d.malloc(size);
            let h = d.host_f32(2100);
            let st = d.copy(s, a + off, len, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST);
            prop_assert_eq!(st.is_success(), off + len <= size, "{}", common::last_message(&api));
            prop_assert!(d.sync(s).is_success());
        }

        /// Allocations are 128-byte aligned, never overlap, are never reused after free, and a
        /// freed allocation can be neither freed again nor read.
        #[test]
        fn addresses_are_fresh_and_frees_are_checked(sizes in proptest::collection::vec(1u64..5000, 1..20)) {
            let _g = common::serial();
            let api = api();
            let d = Dev::acquire(&api, 7);
            let s = d.stream();
            let h = d.host_f32(8);
            let mut seen: Vec<(u64, u64)> = Vec::new();
            for (i, &size) in sizes.iter().enumerate() {
                let a = d.malloc(size);
                prop_assert_eq!(a % 128, 0);
                prop_assert!(seen.iter().all(|&(b, n)| a >= b + n || a + size <= b), "overlap at {:#x}", a);
                seen.push((a, size));
                if i % 2 == 0 {
                    prop_assert!(d.free(a).is_success());
                    prop_assert_eq!(d.free(a), synStatus::INVALID_ARGUMENT);
                    prop_assert_eq!(d.copy(s, a, 1, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST), synStatus::INVALID_ARGUMENT);
                }
            }
        }
    }
}
