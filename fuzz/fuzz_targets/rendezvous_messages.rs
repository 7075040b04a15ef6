//! The rendezvous decoders (hello on the server, challenge and reply on the client) from
//! arbitrary bytes: never a panic; a hello or a payload reply without the secret never passes.
#![no_main]

use dropcompute::hccl::rendezvous::{self, JobSecret, NONCE_LEN, Reply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let secret = JobSecret::from_hex("000102030405060708090a0b0c0d0e0f").expect("valid secret");
    let nonce = [7u8; NONCE_LEN];
    let world = data.first().map_or(2, |b| u32::from(*b % 9));
    assert!(rendezvous::check_hello(data, &secret, &nonce, world).is_err(), "forged hello accepted");
    let _ = rendezvous::parse_challenge(data);
    if let Ok(Reply::Payload(_)) = rendezvous::check_reply(data, &secret, &nonce, &nonce, 1) {
        panic!("forged reply accepted");
    }
});
