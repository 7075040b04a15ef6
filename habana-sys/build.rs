//! Build script: nothing by default. With the `bindgen` feature and `HABANA_SDK_INCLUDE` naming
//! the vendor header directories (one path, or several joined like `PATH`, e.g.
//! `/usr/include/habanalabs:/opt/hccl/include` when Synapse and HCCL headers sit apart), generates bindings into OUT_DIR (HCCL headers are C++: `-x c++`) so a
//! test can compare them with the hand-written layouts. Default builds never need libclang.

fn main() {
    println!("cargo:rerun-if-env-changed=HABANA_SDK_INCLUDE");
    println!("cargo::rustc-check-cfg=cfg(habana_sdk_bindings)");
    #[cfg(feature = "bindgen")]
    generate();
}

#[cfg(feature = "bindgen")]
fn generate() {
    let Some(include) = std::env::var_os("HABANA_SDK_INCLUDE") else {
        println!("cargo:warning=feature `bindgen` is on but HABANA_SDK_INCLUDE is unset; skipping generation");
        return;
    };
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&include).filter(|p| !p.as_os_str().is_empty()).collect();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let header = out.join("wrapper.hpp");
    std::fs::write(&header, "#include <synapse_api.h>\n#include <hccl.h>\n").expect("write wrapper header");
    let result = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_args(["-x", "c++", "-std=c++17"])
        .clang_args(dirs.iter().map(|d| format!("-I{}", d.display())))
        .allowlist_type("syn.*|hccl.*")
        .allowlist_var(
            "HABANA_DIM_MAX|HCCL_.*|SYN_.*|EVENT_COLLECT_TIME|ENQUEUE_TENSOR_NAME_MAX_SIZE|TENSOR_INVALID_ID|INVALID_.*|MAX_USER_PARAMS_SIZE|MAX_TENSOR_NR",
        )
        .layout_tests(false)
        .generate();
    match result {
        Ok(b) => {
            b.write_to_file(out.join("habana_bindings.rs")).expect("write bindings");
            println!("cargo:rustc-cfg=habana_sdk_bindings");
        }
        Err(e) => println!("cargo:warning=bindgen failed on {}: {e}", include.to_string_lossy()),
    }
}
