//! The checkpoint reader from arbitrary bytes: never a panic or an allocation beyond the input;
//! whatever decodes re-encodes to the same bytes.
#![no_main]

use std::path::Path;

use dropcompute::checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz.dcc");
    if let Ok(c) = checkpoint::decode(data, p) {
        assert_eq!(checkpoint::encode(&c, p).expect("a decoded checkpoint encodes"), data);
    }
});
