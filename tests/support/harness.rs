//! Test support: one harness for the suites over the safe Synapse API that run against every
//! backend (the in-process CPU mock and a shared library loaded through the real loader:
//! `$DROPCOMPUTE_SYNAPSE_LIB`, else the mock built as a shared library). Used by
//! `tests/conformance.rs` and `tests/graph_conformance.rs`.
//!
//! The mock's state is process-global (one copy in-process, one inside the loaded library), and
//! fault knobs are global, so the cases of each backend run one at a time under a lock.
#![allow(dead_code)]

#[path = "hermetic.rs"]
pub mod hermetic;
#[path = "mock_library.rs"]
pub mod mock_library;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use dropcompute::mock::{self, Fault, MockControl, MockRecipe};
use dropcompute::synapse::{Device, Error, Recipe, Runtime};
use habana_sys::{SynapseApi, synStatus};

/// One backend: its runtime, the mock's control ABI when it is the mock, and its case lock.
pub struct Harness {
    pub rt: Arc<Runtime>,
    /// The mock's control ABI; `None` for a library that is not the mock (a real libSynapse).
    pub control: Option<MockControl>,
    lock: &'static Mutex<()>,
}

impl Harness {
    pub fn in_process() -> &'static Harness {
        static H: OnceLock<Harness> = OnceLock::new();
        static L: Mutex<()> = Mutex::new(());
        H.get_or_init(|| {
            hermetic::scrub_process_env();
            Harness::new(mock::api(), Some(MockControl::in_process()), &L)
        })
    }

    pub fn shared_library() -> &'static Harness {
        static H: OnceLock<Harness> = OnceLock::new();
        static L: Mutex<()> = Mutex::new(());
        H.get_or_init(|| {
            // Read before the scrub: the one variable this suite takes from the shell on purpose
            // (run the conformance cases against another library, e.g. a real libSynapse).
            let chosen = std::env::var_os("DROPCOMPUTE_SYNAPSE_LIB").filter(|p| !p.is_empty());
            hermetic::scrub_process_env();
            let path = match chosen {
                Some(p) => PathBuf::from(p),
                None => mock_library::shared_library_path().expect("build or locate libmock_synapse.so"),
            };
            let api = SynapseApi::load_path(&path).expect("load the library through the real loader");
            assert_eq!(api.origin(), &habana_sys::ApiOrigin::Library(path.clone()));
            let control = MockControl::from_library(&path).ok();
            Harness::new(api, control, &L)
        })
    }

    fn new(api: SynapseApi, control: Option<MockControl>, lock: &'static Mutex<()>) -> Harness {
        Harness { rt: Runtime::new(api).unwrap(), control, lock }
    }

    pub fn guard(&self) -> MutexGuard<'static, ()> {
        let g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &self.control {
            c.inject_fault(&Fault::ClearAll).unwrap();
        }
        g
    }

    /// The mock's control ABI (cases that need it are skipped on other libraries).
    pub fn control(&self) -> &MockControl {
        self.control.as_ref().expect("mock-only case run against a library without the mock's control ABI")
    }

    pub fn device(&self) -> Device {
        Device::acquire_any(&self.rt).expect("a free mock device")
    }

    pub fn recipe(&self, name: &str, r: MockRecipe) -> Recipe {
        let dir = hermetic::temp_dir("conformance");
        let path = dir.path().join(format!("{name}.json"));
        r.write(&path).unwrap();
        Recipe::load(&self.rt, &path).unwrap()
    }
}

/// The status of a `Error::Synapse`.
pub fn status_of(e: &Error) -> synStatus {
    e.status().unwrap_or_else(|| panic!("expected a Synapse status error, got {e:?}"))
}

/// Runs `case` on `h`, or prints why it is skipped: a mock-only case against a library that
/// has no mock control ABI (a real libSynapse.so).
pub fn run(h: &Harness, case: fn(&Harness), name: &str, mock_only: bool) {
    if mock_only && h.control.is_none() {
        eprintln!("skipped {name}: needs the mock's recipe files and fault knobs (dcmock_* symbols)");
        return;
    }
    let _g = h.guard();
    case(h);
}

macro_rules! suite {
    (any: [$($case:ident),* $(,)?], mock_only: [$($mcase:ident),* $(,)?] $(,)?) => {
        mod in_process {
            $(#[test] fn $case() { super::run(super::Harness::in_process(), super::$case, stringify!($case), false); })*
            $(#[test] fn $mcase() { super::run(super::Harness::in_process(), super::$mcase, stringify!($mcase), true); })*
        }
        mod shared_library {
            $(#[test] fn $case() { super::run(super::Harness::shared_library(), super::$case, stringify!($case), false); })*
            $(#[test] fn $mcase() { super::run(super::Harness::shared_library(), super::$mcase, stringify!($mcase), true); })*
        }
    };
}
