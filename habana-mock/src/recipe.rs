//! Mock recipe files and loaded recipes.
//!
//! Owns: the file format [`MockRecipe`] (JSON, written/read with typed errors) and the loaded
//! form `Recipe` (tensor names as C strings, tensor ids). Must not touch: launching (that is
//! `ops.rs`) or the kernel table (the caller resolves the kernel name).
//!
//! Tensor ids are NOT indices: tensor i of a recipe has id [`TENSOR_ID_BASE`] + i, so code that
//! confuses an index with an id fails on the mock as it would on Gaudi.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The `format` field of every mock recipe file.
pub const RECIPE_FORMAT: &str = "dropcompute-mock-recipe";
/// The current `version` of the mock recipe format.
pub const RECIPE_VERSION: u32 = 1;
/// Tensor id of the first recipe tensor; tensor i has id `TENSOR_ID_BASE + i`.
pub const TENSOR_ID_BASE: u64 = 0x1000;

/// One recipe tensor: its name and size in bytes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MockTensorSpec {
    /// Unique, non-empty tensor name (bind with SYN_FLAGS_TENSOR_NAME).
    pub name: String,
    /// Bytes the bound device range must hold.
    pub bytes: u64,
}

/// Latency of one launch before noise and slowdown.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct MockLatency {
    /// Base latency in ns.
    pub base_ns: u64,
}

/// A mock recipe file: which registered kernel to run on which tensors, with which scalar
/// parameters and base latency. JSON, e.g.
/// `{"format":"dropcompute-mock-recipe","version":1,"name":"fill","kernel":"fill_f32",
///   "tensors":[{"name":"out","bytes":4096}],"params":[2.5],"workspace_bytes":0,
///   "latency":{"base_ns":100000}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MockRecipe {
    /// Always [`RECIPE_FORMAT`].
    pub format: String,
    /// Always [`RECIPE_VERSION`].
    pub version: u32,
    /// Recipe name (free text).
    pub name: String,
    /// Name of a kernel registered with the mock (built-ins: "noop", "fill_f32", "copy").
    pub kernel: String,
    /// Tensors in kernel argument order.
    pub tensors: Vec<MockTensorSpec>,
    /// Scalar parameters passed to the kernel.
    #[serde(default)]
    pub params: Vec<f64>,
    /// Workspace bytes (RECIPE_ATTRIBUTE_WORKSPACE_SIZE); when > 0 a launch must pass a device
    /// workspace of at least this size.
    #[serde(default)]
    pub workspace_bytes: u64,
    /// Launch latency model input.
    #[serde(default)]
    pub latency: MockLatency,
}

/// Why a mock recipe file could not be written, read or accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecipeFileError {
    /// Reading or writing the file failed.
    #[error("mock recipe {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON of the mock recipe schema.
    #[error("mock recipe {path}: malformed: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error (line and column).
        #[source]
        source: serde_json::Error,
    },
    /// The content is well-formed but invalid (wrong format/version, duplicate tensor name, ...).
    #[error("mock recipe {path}: {why}")]
    Invalid {
        /// The file (empty when validating in memory).
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

impl MockRecipe {
    /// A recipe named `name` running `kernel`, with no tensors, params or latency yet.
    pub fn new(name: impl Into<String>, kernel: impl Into<String>) -> Self {
        Self {
            format: RECIPE_FORMAT.into(),
            version: RECIPE_VERSION,
            name: name.into(),
            kernel: kernel.into(),
            tensors: Vec::new(),
            params: Vec::new(),
            workspace_bytes: 0,
            latency: MockLatency::default(),
        }
    }

    /// Appends a tensor of `bytes` bytes.
    pub fn tensor(mut self, name: impl Into<String>, bytes: u64) -> Self {
        self.tensors.push(MockTensorSpec { name: name.into(), bytes });
        self
    }

    /// Sets the scalar parameters.
    pub fn params(mut self, params: impl Into<Vec<f64>>) -> Self {
        self.params = params.into();
        self
    }

    /// Sets the workspace size in bytes.
    pub fn workspace_bytes(mut self, bytes: u64) -> Self {
        self.workspace_bytes = bytes;
        self
    }

    /// Sets the base latency in ns.
    pub fn base_latency_ns(mut self, ns: u64) -> Self {
        self.latency.base_ns = ns;
        self
    }

    /// Checks format, version, non-empty unique tensor names without NUL, finite params.
    ///
    /// # Errors
    /// [`RecipeFileError::Invalid`] with `path` and the first problem found.
    pub fn validate(&self, path: &Path) -> Result<(), RecipeFileError> {
        let invalid = |why: String| Err(RecipeFileError::Invalid { path: path.to_path_buf(), why });
        if self.format != RECIPE_FORMAT {
            return invalid(format!("format is {:?}, expected {RECIPE_FORMAT:?}", self.format));
        }
        if self.version != RECIPE_VERSION {
            return invalid(format!("version {} is not supported (expected {RECIPE_VERSION})", self.version));
        }
        for (i, t) in self.tensors.iter().enumerate() {
            if t.name.is_empty() || t.name.contains('\0') {
                return invalid(format!("tensor {i} has an empty name or a NUL byte"));
            }
            if self.tensors[..i].iter().any(|u| u.name == t.name) {
                return invalid(format!("tensor name {:?} appears twice", t.name));
            }
        }
        if self.kernel.contains('\0') {
            return invalid("kernel name contains a NUL byte".into());
        }
        if let Some(p) = self.params.iter().find(|p| !p.is_finite()) {
            return invalid(format!("parameter {p} is not finite"));
        }
        Ok(())
    }

    /// Writes the recipe as pretty JSON to `path`.
    ///
    /// # Errors
    /// [`RecipeFileError::Invalid`] when [`MockRecipe::validate`] fails; [`RecipeFileError::Io`].
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), RecipeFileError> {
        let path = path.as_ref();
        self.validate(path)?;
        let json = serde_json::to_string_pretty(self).expect("a MockRecipe always serialises");
        std::fs::write(path, json).map_err(|source| RecipeFileError::Io { path: path.to_path_buf(), source })
    }

    /// Reads and validates a recipe file.
    ///
    /// # Errors
    /// [`RecipeFileError::Io`], [`RecipeFileError::Parse`] or [`RecipeFileError::Invalid`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self, RecipeFileError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| RecipeFileError::Io { path: path.to_path_buf(), source })?;
        Self::from_slice(&bytes, path)
    }

    /// Parses and validates a recipe from the bytes of a file (`path` labels errors): for
    /// fuzzing and property tests.
    ///
    /// # Errors
    /// [`RecipeFileError::Parse`] (including invalid UTF-8) or [`RecipeFileError::Invalid`].
    pub fn from_slice(bytes: &[u8], path: &Path) -> Result<Self, RecipeFileError> {
        habana_sys::require_json_object(bytes)
            .map_err(|why| RecipeFileError::Invalid { path: path.to_path_buf(), why: why.to_owned() })?;
        let r: Self = serde_json::from_slice(bytes)
            .map_err(|source| RecipeFileError::Parse { path: path.to_path_buf(), source })?;
        r.validate(path)?;
        Ok(r)
    }
}

/// A loaded recipe (behind a recipe handle).
#[derive(Debug)]
pub(crate) struct Recipe {
    pub spec: MockRecipe,
    pub names: Arc<Vec<CString>>,
    pub params: Arc<Vec<f64>>,
}

impl Recipe {
    pub(crate) fn new(spec: MockRecipe) -> Self {
        let names = spec.tensors.iter().map(|t| CString::new(t.name.as_str()).expect("validated: no NUL")).collect();
        let params = spec.params.clone();
        Self { spec, names: Arc::new(names), params: Arc::new(params) }
    }

    /// Index of the tensor with id `id`.
    pub(crate) fn index_of_id(&self, id: u64) -> Option<usize> {
        let i = usize::try_from(id.checked_sub(TENSOR_ID_BASE)?).ok()?;
        (i < self.spec.tensors.len()).then_some(i)
    }

    /// Index of the tensor named `name`.
    pub(crate) fn index_of_name(&self, name: &[u8]) -> Option<usize> {
        self.spec.tensors.iter().position(|t| t.name.as_bytes() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_round_trip_and_errors() {
        let tmp = tempfile::Builder::new().prefix("dcmock-recipe-").tempdir().unwrap();
        let dir = tmp.path();
        let p = dir.join("r.json");
        let r = MockRecipe::new("r", "copy").tensor("a", 64).tensor("b", 64).params([1.5]).base_latency_ns(10);
        r.write(&p).unwrap();
        assert_eq!(MockRecipe::read(&p).unwrap(), r);
        std::fs::write(&p, "{not json").unwrap();
        assert!(matches!(MockRecipe::read(&p), Err(RecipeFileError::Parse { .. })));
        let dup = MockRecipe::new("r", "copy").tensor("a", 1).tensor("a", 1);
        assert!(matches!(dup.write(&p), Err(RecipeFileError::Invalid { .. })));
        assert!(matches!(MockRecipe::read(dir.join("missing.json")), Err(RecipeFileError::Io { .. })));
        let mut wrong = r.clone();
        wrong.version = 2;
        std::fs::write(&p, serde_json::to_string(&wrong).unwrap()).unwrap();
        let e = MockRecipe::read(&p).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
    }

    #[test]
    fn ids_are_not_indices() {
        let r = Recipe::new(MockRecipe::new("r", "noop").tensor("x", 4).tensor("y", 4));
        assert_eq!(r.index_of_id(TENSOR_ID_BASE + 1), Some(1));
        assert_eq!(r.index_of_id(1), None);
        assert_eq!(r.index_of_id(TENSOR_ID_BASE + 2), None);
        assert_eq!(r.index_of_name(b"y"), Some(1));
    }
}
