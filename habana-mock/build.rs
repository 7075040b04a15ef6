//! Build script of the `habana-mock` crate.
//!
//! Owns: compiling the portable C kernels the CPU mock device runs (`../kernels/cpu/`, the one
//! home of kernel sources) into a static library linked into this crate. Must not: use
//! `-march=native` or any host-specific flag (run-time dispatch in `kernels/cpu/dispatch.c` picks
//! AVX2 / AVX-512), or require any vendor tool.

use std::path::Path;

/// Flags fixed by the project: C11, optimised, and no FMA contraction so that every compiled
/// variant rounds exactly like scalar IEEE f32 arithmetic in Rust.
const CPU_FLAGS: [&str; 3] = ["-O3", "-std=c11", "-ffp-contract=off"];

fn main() {
    build_cpu_kernels();
}

// `files_with_ext`, shared with the root build script.
include!("../kernels/build_files.rs");

fn build_cpu_kernels() {
    let dir = Path::new("../kernels/cpu");
    println!("cargo:rerun-if-changed={}", dir.display());
    for f in files_with_ext(dir, &["c", "h", "inc"]) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let mut build = cc::Build::new();
    build.include(dir).warnings(true);
    // cc adds its own -O level from the cargo profile; ours comes later and wins, so the kernels
    // are -O3 even in debug builds (they are leaf loops; debugging them is not the point).
    for flag in CPU_FLAGS {
        build.flag(flag);
    }
    for f in files_with_ext(dir, &["c"]) {
        build.file(f);
    }
    build.compile("dropcompute_cpu_kernels");
}
