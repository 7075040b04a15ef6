//! A panic inside a face's call prints nothing into the host (the faces' hook records it for
//! `dc_last_error` / the Python exception), while a panic outside the faces still reaches the
//! hook installed before (the default hook prints it): checked on the real stderr of a child
//! process (this test binary re-run with `--nocapture`).

use std::process::Command;

use dropcompute_capi::{DC_PANIC, FaceError, quiet};

const CHILD: &str = "DROPCOMPUTE_QUIET_PANIC_CHILD";

/// In the child: one panic inside `quiet`, one outside; prints what `quiet` returned.
#[test]
fn quiet_panic_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let e = quiet(|| -> Result<(), FaceError> { panic!("boom in the face {}", 7) }).unwrap_err();
    println!("status={} message={e}", e.status().0);
    let outside = std::panic::catch_unwind(|| panic!("boom outside the face"));
    println!("outside caught={}", outside.is_err());
}

#[test]
fn a_panic_in_a_face_prints_nothing_and_one_outside_still_does() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "quiet_panic_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The harness prints "test quiet_panic_child ... " before the child's own line.
    let at = stdout.find("status=").unwrap_or_else(|| panic!("{stdout}"));
    let line = stdout[at..].lines().next().unwrap_or_default();
    assert!(
        line.starts_with(&format!(
            "status={} message=panic in dropcompute: boom in the face 7 (at dropcompute-capi/tests/quiet_panic.rs:",
            DC_PANIC.0
        )),
        "{line}"
    );
    assert!(stdout.contains("outside caught=true"), "{stdout}");
    // Only the outside panic is printed (with its backtrace: RUST_BACKTRACE=1).
    assert!(!stderr.contains("boom in the face"), "printed: {stderr}");
    assert_eq!(stderr.matches("panicked at").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("stack backtrace").count(), 1, "{stderr}");
    assert!(stderr.contains("boom outside the face"), "the previous hook no longer runs: {stderr}");
}
