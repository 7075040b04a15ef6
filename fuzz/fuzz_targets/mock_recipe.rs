//! The mock recipe file from arbitrary bytes: never a panic; whatever parses also validates.
#![no_main]

use std::path::Path;

use dropcompute::mock::MockRecipe;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = MockRecipe::from_slice(data, Path::new("fuzz.json")) {
        assert!(r.validate(Path::new("fuzz.json")).is_ok());
    }
});
