//! The mock conformance scenarios against the in-process table (`dropcompute::mock::api()`).
mod common;

use dropcompute::mock::{MockControl, api};

conformance_suite!(api(), MockControl::in_process());
