//! A recipe cache on disk: compile a graph once per (library version, device type, graph),
//! and let later processes load the serialized recipe (`synRecipeSerialize` /
//! `synRecipeDeSerialize`), as the vendor's test base does (`graph_api.md` §6).
//!
//! Owns: [`RecipeCache`] (the directory, the file name of a key, the atomic store). Must not
//! touch: building or compiling (`builder.rs` decides hit or miss and hashes the graph).
//!
//! Key: SHA-256 of the library version string (`synDriverGetVersion`), the device type, the
//! recipe name and the graph hash (every tensor's name, dtype, shape and placement and every
//! node's GUID, parameter bytes and operands, in order). The vendor documents that a cache must
//! be regenerated when the software version or the platform changes; both are in the key.

use std::path::{Path, PathBuf};

use habana_sys::synDeviceType;
use sha2::{Digest, Sha256};

use super::super::error::{Error, Result};
use super::super::recipe::Recipe;

/// A directory of serialized recipes, one file per key.
#[derive(Debug, Clone)]
pub struct RecipeCache {
    dir: PathBuf,
}

impl RecipeCache {
    /// A cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of recipe `name` for this library `version`, `device_type` and `graph_hash`:
    /// `<dir>/<name>-<first 16 hex digits of the key>.recipe` (the name sanitised to
    /// `[A-Za-z0-9_-]`).
    pub fn path(&self, name: &str, version: &str, device_type: synDeviceType, graph_hash: &[u8]) -> PathBuf {
        let mut h = Sha256::new();
        h.update(format!("version {version:?}\ndevice {}\nname {name:?}\n", device_type.0).as_bytes());
        h.update(graph_hash);
        let key: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        self.dir.join(format!("{safe}-{key}.recipe"))
    }

    /// Serializes `recipe` to `path` atomically (a temporary file in the same directory, then a
    /// rename), so a concurrent reader sees the old file or the whole new one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the directory when it cannot be created or the rename
    /// fails; [`Error::Synapse`] from `synRecipeSerialize`.
    pub fn store(&self, recipe: &Recipe, path: &Path) -> Result<()> {
        let io = |what: &str, e: std::io::Error| Error::InvalidArgument {
            what: "recipe cache",
            value: format!("{what} {}: {e}", self.dir.display()),
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io("cannot create", e))?;
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        recipe.save(&tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("cannot store a recipe in", e)
        })
    }
}
