//! The rendezvous messages without a network: job secret parsing, the hello check, and
//! arbitrary bytes as a hello (never a panic, always refused).

use dropcompute::hccl::rendezvous::{
    HELLO_LEN, Hello, JobSecret, MAGIC, SecretError, VERSION, check_hello, make_hello,
};

fn secret(b: u8) -> JobSecret {
    JobSecret::from_hex(&format!("{b:02x}").repeat(16)).unwrap()
}

#[test]
fn secret_hex_round_trip_and_bad_forms() {
    let s = JobSecret::from_hex("00FF10ab00000000000000000000000a").unwrap();
    assert_eq!(s.to_hex(), "00ff10ab00000000000000000000000a");
    let r = JobSecret::random();
    assert_eq!(JobSecret::from_hex(&r.to_hex()).unwrap(), r);
    assert_ne!(JobSecret::random(), r);
    assert_eq!(JobSecret::from_hex("abcg"), Err(SecretError::NotHex { position: 3, ch: 'g' }));
    assert_eq!(JobSecret::from_hex("abc"), Err(SecretError::OddLength { digits: 3 }));
    assert_eq!(JobSecret::from_hex(&"a".repeat(30)), Err(SecretError::TooShort { bits: 120 }));
    assert!(!format!("{r:?}").contains(&r.to_hex()));
}

#[test]
fn hello_checks() {
    let (k, n, cn) = (secret(7), [3u8; 32], [9u8; 32]);
    let good = make_hello(&k, &n, 2, 4, &cn);
    assert_eq!(check_hello(&good, &k, &n, 4), Ok(Hello { rank: 2, client_nonce: cn }));
    // Replayed against another nonce, or made with another secret: refused.
    assert!(check_hello(&good, &k, &[4u8; 32], 4).unwrap_err().contains("secret"));
    assert!(check_hello(&make_hello(&secret(8), &n, 2, 4, &cn), &k, &n, 4).unwrap_err().contains("secret"));
    // A flipped rank byte breaks the proof.
    let mut tampered = good.clone();
    tampered[8] ^= 1;
    assert!(check_hello(&tampered, &k, &n, 4).unwrap_err().contains("secret"));
    assert!(check_hello(&make_hello(&k, &n, 2, 5, &cn), &k, &n, 4).unwrap_err().contains("world size 5"));
    assert!(check_hello(&make_hello(&k, &n, 0, 4, &cn), &k, &n, 4).unwrap_err().contains("rank 0"));
    assert!(check_hello(&make_hello(&k, &n, 4, 4, &cn), &k, &n, 4).unwrap_err().contains("rank 4"));
    assert!(check_hello(&good[..40], &k, &n, 4).unwrap_err().contains("40 bytes"));
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert!(check_hello(&bad_magic, &k, &n, 4).unwrap_err().contains("magic"));
    let mut v2 = good;
    v2[6] = 2;
    assert!(check_hello(&v2, &k, &n, 4).unwrap_err().contains("version 2"));
}

proptest::proptest! {
    #[test]
    fn arbitrary_hello_bytes_are_refused(body in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
                                         nonce in proptest::array::uniform32(proptest::num::u8::ANY)) {
        proptest::prop_assert!(check_hello(&body, &secret(1), &nonce, 8).is_err());
    }

    #[test]
    fn arbitrary_hello_with_magic_is_refused(tail in proptest::collection::vec(proptest::num::u8::ANY, HELLO_LEN - 8)) {
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&VERSION.to_le_bytes());
        body.extend_from_slice(&tail);
        proptest::prop_assert!(check_hello(&body, &secret(1), &[0u8; 32], 8).is_err());
    }
}
