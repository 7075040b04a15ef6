//! include/dropcompute.h is what cbindgen generates from src/ now (set DROPCOMPUTE_BLESS=1 to
//! rewrite it after changing the C API).

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/dropcompute.h");
    if std::env::var_os("DROPCOMPUTE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/dropcompute.h is stale: run `DROPCOMPUTE_BLESS=1 cargo test -p dropcompute-capi --test header`\n--- generated ---\n{generated}"
    );
    // The header names every exported function.
    for f in [
        "dc_last_error",
        "dc_policy_new",
        "dc_policy_should_start",
        "dc_policy_free",
        "dc_estimator_new",
        "dc_estimator_free",
        "dc_walk_new",
        "dc_walk_next",
        "dc_walk_ended",
        "dc_walk_clock_at",
        "dc_walk_reported",
        "dc_walk_free",
        "dc_recommend_file",
        "dc_divisor",
        "dc_policy_new_kind",
        "dc_walk_set_micro_batches",
        "dc_walk_tokens_started",
        "dc_estimator_observe",
        "dc_estimator_estimate",
        "dc_divisor_weighted",
    ] {
        assert!(generated.contains(&format!("{f}(")), "{f} missing from the header");
    }
}
