//! The mock conformance scenarios against `libmock_synapse.so` loaded through the real dlopen
//! path (`SynapseApi::load_path`), with the control functions from the same library.
#![cfg(feature = "mock")] // runs on the CPU mock device
#[path = "support/mock_library.rs"]
mod mock_library;

mod common;

use std::sync::OnceLock;

use dropcompute::mock::MockControl;
use habana_sys::{ApiOrigin, SynapseApi};
use mock_library::shared_library_path;

fn lib() -> &'static (SynapseApi, MockControl) {
    static L: OnceLock<(SynapseApi, MockControl)> = OnceLock::new();
    L.get_or_init(|| {
        let path = shared_library_path().expect("mock shared library");
        let api = SynapseApi::load_path(&path).expect("load mock library");
        assert_eq!(api.origin(), &ApiOrigin::Library(path.clone()));
        let ctl = MockControl::from_library(&path).expect("control symbols");
        (api, ctl)
    })
}

conformance_suite!(lib().0, lib().1);

#[test]
fn library_state_is_separate_from_the_in_process_mock() {
    let _g = common::serial();
    let (api, _) = lib();
    let _held = common::Dev::acquire(api, 5);
    // The in-process mock has its own modules: module 5 is free there.
    let inproc = dropcompute::mock::api();
    let d = common::Dev::acquire(&inproc, 5);
    assert_eq!(d.module, 5);
}
