//! The checkpoint container: bitwise round trip, every truncation, every single-byte flip,
//! version mismatch, fallback past a corrupt newest checkpoint, retention, and arbitrary bytes.

#[path = "support/hermetic.rs"]
mod hermetic;

use std::path::Path;

use dropcompute::checkpoint::{self, Checkpoint, CheckpointError, FORMAT_VERSION, HEADER_LEN};
use proptest::prelude::*;

/// A fresh empty directory, removed when the returned value drops.
fn temp_dir(tag: &str) -> tempfile::TempDir {
    hermetic::temp_dir(&format!("ckpt-{tag}"))
}

fn sample(step: u64) -> Checkpoint {
    // NaN with a payload, signed zero, infinities, subnormal: bits must survive.
    let odd = [f32::from_bits(0x7fc0_1234), f32::from_bits(0xffa0_0001), -0.0, f32::INFINITY, f32::MIN_POSITIVE / 3.0];
    Checkpoint {
        step,
        meta: serde_json::json!({"threshold_ms": 12.5, "rng": [1u64, 2, 3], "ledger": {"dropped": [4, 5]}}),
        tensors: vec![
            ("w".into(), (0..50).map(|i| i as f32 * 0.1 + step as f32).collect()),
            ("adam.m".into(), odd.to_vec()),
            ("empty".into(), vec![]),
        ],
    }
}

fn bits(c: &Checkpoint) -> Vec<(String, Vec<u32>)> {
    c.tensors.iter().map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect())).collect()
}

fn p() -> &'static Path {
    Path::new("mem.dcc")
}

#[test]
fn round_trip_is_bitwise_exact_including_nan_payloads() {
    let tmp = temp_dir("rt");
    let dir = tmp.path();
    let c = sample(7);
    let path = checkpoint::save(dir, &c).unwrap();
    assert_eq!(path, dir.join("checkpoint-0000000007.dcc"));
    let back = checkpoint::read(&path).unwrap();
    assert_eq!(back.step, 7);
    assert_eq!(back.meta, c.meta);
    assert_eq!(bits(&back), bits(&c));
    assert_eq!(back.tensors[1].1[0].to_bits(), 0x7fc0_1234);
    assert!(!dir.join("checkpoint-0000000007.dcc.tmp").exists());
}

#[test]
fn truncation_at_every_cut_point_is_reported_as_truncated() {
    let bytes = checkpoint::encode(&sample(3), p()).unwrap();
    for cut in 0..bytes.len() {
        match checkpoint::decode(&bytes[..cut], p()) {
            Err(CheckpointError::Truncated { expected, got, .. }) => {
                assert_eq!(got, cut as u64);
                assert!(expected > got, "cut {cut}: expected {expected}");
            }
            other => panic!("cut at {cut} of {}: {other:?}", bytes.len()),
        }
    }
}

#[test]
fn one_flipped_byte_anywhere_is_an_error() {
    let bytes = checkpoint::encode(&sample(3), p()).unwrap();
    let mut kinds = std::collections::BTreeSet::new();
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            let e = checkpoint::decode(&b, p()).expect_err(&format!("flip of byte {i} accepted"));
            kinds.insert(format!("{e:?}").split([' ', '{']).next().unwrap().to_string());
        }
    }
    // Magic, version, total length and body bytes each hit their own check.
    for k in ["BadMagic", "UnsupportedVersion", "ChecksumMismatch", "Truncated"] {
        assert!(kinds.contains(k), "{kinds:?}");
    }
}

#[test]
fn version_mismatch_names_found_and_supported() {
    let mut bytes = checkpoint::encode(&sample(3), p()).unwrap();
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    match checkpoint::decode(&bytes, p()) {
        Err(CheckpointError::UnsupportedVersion { found: 2, supported, .. }) => assert_eq!(supported, FORMAT_VERSION),
        other => panic!("{other:?}"),
    }
    let e = checkpoint::decode(b"PK\x03\x04 a zip file", p()).unwrap_err();
    assert!(matches!(e, CheckpointError::BadMagic { .. }), "{e:?}");
    assert!(bytes.len() > HEADER_LEN);
}

#[test]
fn load_latest_falls_back_past_a_corrupt_newest_and_leaves_it_on_disk() {
    let tmp = temp_dir("fallback");
    let dir = tmp.path();
    checkpoint::save(dir, &sample(10)).unwrap();
    let newest = checkpoint::save(dir, &sample(20)).unwrap();
    let mut b = std::fs::read(&newest).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&newest, &b).unwrap();
    let l = checkpoint::load_latest(dir).unwrap();
    assert_eq!(l.checkpoint.step, 10);
    assert_eq!(bits(&l.checkpoint), bits(&sample(10)));
    assert_eq!(l.skipped.len(), 1);
    assert_eq!(l.skipped[0].0, newest);
    assert!(matches!(l.skipped[0].1, CheckpointError::ChecksumMismatch { .. }));
    assert!(newest.exists(), "a corrupt checkpoint must never be deleted");
    // A later save keeps the corrupt file and the previous good one.
    checkpoint::save(dir, &sample(30)).unwrap();
    assert!(newest.exists() && dir.join(checkpoint::file_name(10)).exists());
    // Truncating the only good files: NoCheckpoint lists the corrupt ones.
    for s in [10, 30] {
        let f = dir.join(checkpoint::file_name(s));
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len - 1).unwrap();
    }
    match checkpoint::load_latest(dir) {
        Err(e @ CheckpointError::NoCheckpoint { .. }) => {
            let CheckpointError::NoCheckpoint { corrupt, .. } = &e else { unreachable!() };
            assert_eq!(corrupt.len(), 3);
            // The message lists every corrupt file by path (mutation-checked: `list`).
            let paths = corrupt.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            assert_eq!(
                e.to_string(),
                format!("no valid checkpoint in {} (3 corrupt file(s) skipped: {paths})", dir.display())
            );
        }
        other => panic!("{other:?}"),
    }
    // No checkpoint file at all: nothing listed.
    let empty = hermetic::temp_dir("no-checkpoint");
    match checkpoint::load_latest(empty.path()) {
        Err(e @ CheckpointError::NoCheckpoint { .. }) => assert_eq!(
            e.to_string(),
            format!("no valid checkpoint in {} (0 corrupt file(s) skipped)", empty.path().display())
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn retention_keeps_the_newest_two_and_removes_stale_temp_files() {
    let tmp = temp_dir("keep");
    let dir = tmp.path();
    std::fs::write(dir.join("checkpoint-0000000002.dcc.tmp"), b"half written").unwrap();
    std::fs::write(dir.join("notes.txt"), b"not ours").unwrap();
    for s in 1..=5 {
        checkpoint::save(dir, &sample(s)).unwrap();
    }
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, vec!["checkpoint-0000000004.dcc", "checkpoint-0000000005.dcc", "notes.txt"]);
    // A file whose header step disagrees with its name is not trusted.
    std::fs::copy(dir.join(checkpoint::file_name(4)), dir.join(checkpoint::file_name(9))).unwrap();
    let l = checkpoint::load_latest(dir).unwrap();
    assert_eq!(l.checkpoint.step, 5);
    assert!(matches!(&l.skipped[0].1, CheckpointError::Malformed { reason, .. } if reason.contains("step 9")));
}

#[test]
fn io_errors_name_the_path() {
    let (_tmp, missing) = hermetic::missing_path("checkpoint-0000000001.dcc");
    let e = checkpoint::read(&missing).unwrap_err();
    assert!(matches!(&e, CheckpointError::Input(dropcompute::input::InputError::Io { op: "open", .. })), "{e:?}");
    assert!(e.to_string().contains(missing.to_str().unwrap()), "{e}");
    let missing_dir = missing.parent().unwrap();
    assert!(matches!(checkpoint::load_latest(missing_dir), Err(CheckpointError::Io { .. })));
}

proptest! {
    #[test]
    fn decode_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = checkpoint::decode(&bytes, p());
    }

    #[test]
    fn decode_of_a_valid_header_with_arbitrary_body_never_panics(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        meta_len in any::<u64>(),
        count in any::<u64>(),
    ) {
        // Header and checksum valid, lengths arbitrary: exercises the structural checks.
        let total = (HEADER_LEN + body.len() + 32) as u64;
        let mut b = Vec::new();
        b.extend_from_slice(checkpoint::MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&total.to_le_bytes());
        b.extend_from_slice(&meta_len.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&body);
        use sha2::Digest;
        let d = sha2::Sha256::digest(&b);
        b.extend_from_slice(&d);
        match checkpoint::decode(&b, p()) {
            Ok(_) | Err(CheckpointError::Malformed { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected {e:?}"),
        }
    }
}

/// Re-seals `bytes` after an edit of the body: recomputes the trailing SHA-256, so that the
/// structural checks behind the checksum are reached.
fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    use sha2::Digest;
    let n = bytes.len() - checkpoint::DIGEST_LEN;
    let d = sha2::Sha256::digest(&bytes[..n]);
    bytes[n..].copy_from_slice(&d);
    bytes
}

fn malformed_reason(bytes: &[u8]) -> String {
    match checkpoint::decode(bytes, p()) {
        Err(CheckpointError::Malformed { reason, .. }) => reason,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

/// The structural checks behind a valid checksum, each with its exact message (the header is
/// magic 0..8, version 8..12, reserved 12..16, step 16..24, total 24..32, meta length 32..40,
/// tensor count 40..48).
#[test]
fn structural_errors_behind_a_valid_checksum_are_named_exactly() {
    let good = checkpoint::encode(&sample(5), p()).unwrap();
    let meta_len = u64::from_le_bytes(good[32..40].try_into().unwrap()) as usize;
    let left = good.len() - checkpoint::DIGEST_LEN - HEADER_LEN - meta_len;
    // A tensor count that cannot fit (12 bytes per empty tensor at least): one more than fits.
    let over = left as u64 / 12 + 1;
    let mut b = good.clone();
    b[40..48].copy_from_slice(&over.to_le_bytes());
    assert_eq!(malformed_reason(&reseal(b)), format!("{over} tensors cannot fit in the {left} bytes left"));
    // The last tensor ("empty", 0 elements) announcing one element: 4 bytes more than left.
    let mut b = good.clone();
    let at = good.len() - checkpoint::DIGEST_LEN - 8;
    b[at..at + 8].copy_from_slice(&1u64.to_le_bytes());
    let r = malformed_reason(&reseal(b));
    assert_eq!(r, format!("tensor data: 4 bytes announced, 0 left at offset {}", at + 8), "{r}");
    // One trailing byte after the announced length.
    let mut b = good.clone();
    b.push(0);
    assert_eq!(malformed_reason(&b), format!("1 trailing bytes after the announced length {}", good.len()));
    // A 12-byte file with another version is a version error, not a truncation.
    let mut b = good[..12].to_vec();
    b[8..12].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(checkpoint::decode(&b, p()), Err(CheckpointError::UnsupportedVersion { found: 99, .. })));
    // A prefix shorter than header + digest is truncated against their length.
    match checkpoint::decode(&good[..40], p()) {
        Err(CheckpointError::Truncated { expected, got, .. }) => {
            assert_eq!((expected, got), ((HEADER_LEN + checkpoint::DIGEST_LEN) as u64, 40));
        }
        other => panic!("{other:?}"),
    }
    // A prefix holding the whole header and a digest's length is truncated against the total.
    let cut = HEADER_LEN + checkpoint::DIGEST_LEN;
    match checkpoint::decode(&good[..cut], p()) {
        Err(CheckpointError::Truncated { expected, got, .. }) => {
            assert_eq!((expected, got), (good.len() as u64, cut as u64))
        }
        other => panic!("{other:?}"),
    }
}

/// A checkpoint of empty-named empty tensors only: the tensor count equals the bytes left over
/// the smallest record exactly, which is valid.
#[test]
fn the_smallest_tensor_records_fill_the_body_exactly() {
    let c = Checkpoint {
        step: 2,
        meta: serde_json::json!(null),
        tensors: vec![(String::new(), vec![]), (String::new(), vec![]), (String::new(), vec![])],
    };
    let back = checkpoint::decode(&checkpoint::encode(&c, p()).unwrap(), p()).unwrap();
    assert_eq!((back.step, back.tensors.len()), (2, 3));
    assert!(back.tensors.iter().all(|(n, v)| n.is_empty() && v.is_empty()));
}

/// File names: only `checkpoint-<digits>.dcc` names a step (a sign is not a digit).
#[test]
fn only_digit_names_are_checkpoint_steps() {
    assert_eq!(checkpoint::step_of("checkpoint-0000000012.dcc"), Some(12));
    for bad in ["checkpoint-+12.dcc", "checkpoint-.dcc", "checkpoint-1a.dcc", "checkpoint-12.dcc.tmp", "x-12.dcc"] {
        assert_eq!(checkpoint::step_of(bad), None, "{bad}");
    }
    assert_eq!(checkpoint::step_of(&checkpoint::file_name(u64::MAX)), Some(u64::MAX));
}

/// `valid_steps` lists every readable step newest first and names each unreadable file.
#[test]
fn valid_steps_lists_readable_steps_newest_first_and_names_the_bad_ones() {
    let tmp = temp_dir("valid");
    let dir = tmp.path();
    checkpoint::save(dir, &sample(3)).unwrap();
    checkpoint::save(dir, &sample(7)).unwrap();
    let bad = dir.join(checkpoint::file_name(9));
    std::fs::write(&bad, b"DCCKPT\0\0garbage").unwrap();
    let (ok, skipped) = checkpoint::valid_steps(dir).unwrap();
    assert_eq!(ok, vec![7, 3]);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].0, bad);
}
