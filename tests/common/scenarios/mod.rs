//! Mock conformance scenarios, each run against the in-process table and the loaded library.
//! Each takes the table and the matching control handle.

use dropcompute::mock::{MockConfig, MockControl};

mod control;
mod memory;
mod streams;

#[allow(unused_imports)] // not every test binary runs the scenarios
pub use control::*;
#[allow(unused_imports)]
pub use memory::*;
#[allow(unused_imports)]
pub use streams::*;

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
