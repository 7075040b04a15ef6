// Shared by the build scripts of `dropcompute` (`build.rs`) and `habana-mock`
// (`habana-mock/build.rs`) through `include!`, so kernels/ stays the one home of what builds the
// kernel sources. Paths are spelled in full so the including script's imports do not clash.

/// Sorted list of files in `dir` whose extension is one of `exts` (empty when `dir` is missing).
fn files_with_ext(dir: &std::path::Path, exts: &[&str]) -> Vec<std::path::PathBuf> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}
