//! Build script of the `dropcompute` crate.
//!
//! Owns: only when the environment variable `TPC_CLANG` names a TPC compiler, compiling the
//! Gaudi TPC-C kernels (`kernels/tpc/`) to objects that are reported but not linked (they run on
//! the device, not the host). The CPU kernels of the mock device (`kernels/cpu/`) are built by
//! `habana-mock/build.rs`. Must not: require any vendor tool for a default build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

fn main() {
    build_tpc_kernels();
}

// `files_with_ext`, shared with `habana-mock/build.rs`.
include!("../kernels/build_files.rs");

fn build_tpc_kernels() {
    println!("cargo:rerun-if-env-changed=TPC_CLANG");
    let dir = Path::new("../kernels/tpc");
    println!("cargo:rerun-if-changed={}", dir.display());
    for f in files_with_ext(dir, &["c", "h"]) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let Some(compiler) = env::var_os("TPC_CLANG").filter(|c| !c.is_empty()) else {
        return;
    };
    let Some(out_dir) = env::var_os("OUT_DIR").map(|d| PathBuf::from(d).join("tpc")) else {
        println!("cargo:warning=TPC kernels skipped: OUT_DIR is not set");
        return;
    };
    if let Err(e) = fs::create_dir_all(&out_dir) {
        println!("cargo:warning=TPC kernels skipped: cannot create {}: {e}", out_dir.display());
        return;
    }
    let mut objects = Vec::new();
    for src in files_with_ext(dir, &["c"]) {
        let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("kernel");
        let obj = out_dir.join(format!("{stem}.o"));
        let status = Command::new(&compiler)
            .args(["-march=gaudi2", "-O2", "-c"])
            .arg("-I")
            .arg(dir)
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => objects.push(obj.display().to_string()),
            Ok(s) => println!(
                "cargo:warning=TPC kernel {} failed to compile with {}: {s}",
                src.display(),
                Path::new(&compiler).display()
            ),
            Err(e) => println!("cargo:warning=cannot run TPC_CLANG={}: {e}", Path::new(&compiler).display()),
        }
    }
    if !objects.is_empty() {
        println!("cargo:warning=TPC kernel objects (not linked into the host crate): {}", objects.join(", "));
    }
}
