//! The function table ([`SynapseApi`]) and the run-time loader of `libSynapse.so`.
//!
//! The table holds one field per C function listed in [`for_each_function!`](crate::for_each_function).
//! It is filled either by [`SynapseApi::load`] (dlopen through `libloading`) or, for a pure-Rust
//! backend such as the project's CPU mock, by [`SynapseApi::from_fns`] (the `ort::set_api`
//! pattern). Loading never panics: every failure is a [`LoadError`] naming the path and the
//! missing symbol or the version found.

use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};

/// Environment variable naming the runtime library to load when no explicit path is given.
pub const ENV_LIBRARY: &str = "DROPCOMPUTE_SYNAPSE_LIB";
/// Where SynapseAI installs its runtime (`habanalabs-graph` package).
pub const DEFAULT_LIBRARY_PATH: &str = "/usr/lib/habanalabs/libSynapse.so";
/// Oldest SynapseAI release whose ABI these bindings follow (major, minor).
pub const MIN_VERSION: (u32, u32) = (1, 16);

/// Why the runtime library could not be loaded. Every variant names the path tried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate file exists (the explicit path, `$DROPCOMPUTE_SYNAPSE_LIB`, the default path).
    #[error("SynapseAI runtime not found; tried: {}", display_paths(.tried))]
    NotFound {
        /// Every path that was tried, in search order.
        tried: Vec<PathBuf>,
    },
    /// `dlopen` failed (not a shared library, wrong architecture, unresolved dependencies).
    #[error("cannot load {path}: {source}")]
    Open {
        /// The library path.
        path: PathBuf,
        /// The loader's error.
        #[source]
        source: libloading::Error,
    },
    /// A required symbol is absent: not a SynapseAI runtime, or one older than 1.16.
    #[error("{path} does not export {symbol} (required; present in SynapseAI >= 1.16){}", version_suffix(.version))]
    MissingSymbol {
        /// The library path.
        path: PathBuf,
        /// The C name of the missing function.
        symbol: &'static str,
        /// Version reported by `synDriverGetVersion`, if the library exports it.
        version: Option<String>,
    },
    /// The library reports a version older than [`MIN_VERSION`], or one that cannot be parsed.
    #[error("{path} reports SynapseAI version {version:?}; dropcompute needs >= {}.{}", MIN_VERSION.0, MIN_VERSION.1)]
    UnsupportedVersion {
        /// The library path.
        path: PathBuf,
        /// The version string reported by `synDriverGetVersion`.
        version: String,
    },
}

/// The path `dlopen` is given for a library the user named (`--library`,
/// `$DROPCOMPUTE_SYNAPSE_LIB`, any other): a path without `/` is taken relative to the current
/// directory (`libmock_synapse.so` becomes `./libmock_synapse.so`), never looked up on the
/// system search path as `dlopen` would; a path with a `/` is unchanged. The one rule of every
/// flag and variable that names a library ([`SynapseApi::candidates`], [`SynapseApi::load_path`]).
pub fn library_path(path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().contains(&b'/') { path.to_path_buf() } else { Path::new(".").join(path) }
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

fn version_suffix(v: &Option<String>) -> String {
    v.as_ref().map(|v| format!("; it reports version {v}")).unwrap_or_default()
}

/// Where a [`SynapseApi`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiOrigin {
    /// Loaded from this shared library.
    Library(PathBuf),
    /// Filled in-process by a Rust backend, named here (e.g. "cpu-mock").
    InProcess(&'static str),
}

macro_rules! define_table {
    (required: [$(($field:ident, $sym:ident, ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty)),* $(,)?],
     optional: [$(($ofield:ident, $osym:ident, ($($oarg:ident: $oty:ty),* $(,)?) -> $oret:ty)),* $(,)?]) => {
        /// Raw function pointers, one per bound C function (field names are the C names in
        /// snake_case). Required functions are plain pointers; functions added after
        /// SynapseAI 1.16 are `Option`s.
        ///
        /// Calling any of them is `unsafe`: the caller upholds the C API's contract (valid
        /// pointers, live handles, thread-safety rules of `synapse_api.h`).
        #[derive(Clone, Copy)]
        pub struct SynapseFns {
            $(#[doc = concat!("`", stringify!($sym), "`")]
              pub $field: unsafe extern "C" fn($($arg: $ty),*) -> $ret,)*
            $(#[doc = concat!("`", stringify!($osym), "` (optional)")]
              pub $ofield: Option<unsafe extern "C" fn($($oarg: $oty),*) -> $oret>,)*
        }

        /// Names of every required C symbol, in table order.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($sym)),*];
        /// Names of every optional C symbol, in table order.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($osym)),*];

        fn resolve(lib: &'static libloading::Library) -> Result<SynapseFns, &'static str> {
            // Both `get` calls below are sound for the same two reasons: `Library::get` needs
            // the requested type to be the symbol's real type, and each one is the documented C
            // prototype of SynapseAI 1.16-1.21 (see `functions.rs`); and copying the raw
            // function pointer out of the `Symbol` is sound only while the library stays
            // loaded, which holds because `lib` is `&'static` (leaked, never unloaded).
            Ok(SynapseFns {
                $($field:
                // SAFETY: required symbol; its type is the documented prototype and the library
                // is never unloaded (see above).
                unsafe {
                    *lib.get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                        concat!(stringify!($sym), "\0").as_bytes())
                        .map_err(|_| stringify!($sym))?
                },)*
                $($ofield:
                // SAFETY: optional symbol, `None` when absent; its type is the documented
                // prototype and the library is never unloaded (see above).
                unsafe {
                    lib.get::<unsafe extern "C" fn($($oty),*) -> $oret>(
                        concat!(stringify!($osym), "\0").as_bytes())
                        .ok()
                        .map(|s| *s)
                },)*
            })
        }

        fn driver_version_only(lib: &libloading::Library) -> Option<String> {
            // SAFETY: `synDriverGetVersion(char*, int)` per synapse_api.h; see `read_version`.
            let f = unsafe {
                lib.get::<unsafe extern "C" fn(*mut c_char, c_int) -> $crate::synStatus>(b"synDriverGetVersion\0")
                    .ok()
                    .map(|s| *s)
            }?;
            read_version(f)
        }
    };
}

crate::for_each_function!(define_table);

/// Calls `synDriverGetVersion` (allowed before `synInitialize`) into a 256-byte buffer.
fn read_version(f: unsafe extern "C" fn(*mut c_char, c_int) -> crate::synStatus) -> Option<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is valid for `len` bytes; we force NUL termination before reading.
    let status = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int) };
    if !status.is_success() {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated above, within the buffer.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

/// Finds the first "MAJOR.MINOR" in a version string ("1.21.0-555", "Version 1.21.0") and
/// returns (major, minor); `None` when there is none.
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let bytes = v.as_bytes();
    (0..bytes.len()).filter(|&i| bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_digit())).find_map(
        |i| {
            let mut parts = v[i..].splitn(3, '.');
            let major = parts.next()?.parse().ok()?;
            let minor: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
            Some((major, minor.parse().ok()?))
        },
    )
}

/// Whether a reported version string names a supported release: a "MAJOR.MINOR"
/// ([`parse_version`]) of at least [`MIN_VERSION`]. A string without one is unsupported (the ABI
/// is only known for >= 1.16). The one rule of the loader and of the in-process mock's
/// `DROPCOMPUTE_MOCK_VERSION` check.
pub fn is_supported_version(v: &str) -> bool {
    parse_version(v).is_some_and(|found| found >= MIN_VERSION)
}

/// The loaded (or in-process) SynapseAI + HCCL function table.
///
/// Dereferences to [`SynapseFns`]. A loaded library is intentionally never unloaded: the runtime
/// starts threads of its own, and `dlclose` under them would be unsound.
#[derive(Clone)]
pub struct SynapseApi {
    fns: SynapseFns,
    origin: ApiOrigin,
    version: Option<String>,
}

impl std::ops::Deref for SynapseApi {
    type Target = SynapseFns;
    fn deref(&self) -> &SynapseFns {
        &self.fns
    }
}

impl std::fmt::Debug for SynapseApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynapseApi").field("origin", &self.origin).field("version", &self.version).finish()
    }
}

impl SynapseApi {
    /// The paths [`SynapseApi::load`] tries, in order: `explicit`, then `$DROPCOMPUTE_SYNAPSE_LIB`
    /// (when set and non-empty), then [`DEFAULT_LIBRARY_PATH`]. When an explicit path or the
    /// variable is given, only that one is tried: a user who names a library gets that library
    /// or an error, never a silent fallback. A path without `/` is relative to the current
    /// directory ([`library_path`]).
    pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
        if let Some(p) = explicit {
            return vec![library_path(p)];
        }
        match std::env::var_os(ENV_LIBRARY) {
            Some(v) if !v.is_empty() => vec![library_path(Path::new(&v))],
            _ => vec![PathBuf::from(DEFAULT_LIBRARY_PATH)],
        }
    }

    /// Loads the runtime following [`SynapseApi::candidates`].
    ///
    /// # Errors
    /// [`LoadError::NotFound`] when no candidate file exists; otherwise the error of
    /// [`SynapseApi::load_path`] for the candidate found.
    pub fn load(explicit: Option<&Path>) -> Result<Self, LoadError> {
        let tried = Self::candidates(explicit);
        match tried.iter().find(|p| p.exists()) {
            Some(p) => Self::load_path(p),
            None => Err(LoadError::NotFound { tried }),
        }
    }

    /// Loads the runtime from exactly `path` (a path without `/` relative to the current
    /// directory, [`library_path`]), resolving every required symbol.
    ///
    /// # Errors
    /// [`LoadError::Open`] when `dlopen` fails; [`LoadError::UnsupportedVersion`] when
    /// `synDriverGetVersion` reports a release older than [`MIN_VERSION`];
    /// [`LoadError::MissingSymbol`] when a required function is absent.
    pub fn load_path(path: &Path) -> Result<Self, LoadError> {
        let path = &library_path(path);
        // SAFETY: loading a shared library runs its initialisers. That is the point of this
        // function: the caller asked for this library. Nothing else is assumed about it yet.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|source| LoadError::Open { path: path.to_path_buf(), source })?;
        let version = driver_version_only(&lib);
        // A version we cannot read is treated like an old one: the ABI is only known for >= 1.16.
        if let Some(v) = &version
            && !is_supported_version(v)
        {
            return Err(LoadError::UnsupportedVersion { path: path.to_path_buf(), version: v.clone() });
        }
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        let fns = resolve(lib).map_err(|symbol| LoadError::MissingSymbol {
            path: path.to_path_buf(),
            symbol,
            version: version.clone(),
        })?;
        Ok(Self { fns, origin: ApiOrigin::Library(path.to_path_buf()), version })
    }

    /// Wraps a table filled by a Rust backend (the CPU mock).
    ///
    /// # Safety
    /// Every function in `fns` must honour the C prototype and the documented contract of the
    /// SynapseAI function it stands for, for any arguments the safe layer may pass (in
    /// particular: it must not unwind across the C boundary).
    pub unsafe fn from_fns(fns: SynapseFns, name: &'static str) -> Self {
        let version = fns.syn_driver_get_version.and_then(read_version);
        Self { fns, origin: ApiOrigin::InProcess(name), version }
    }

    /// Where this table came from.
    pub fn origin(&self) -> &ApiOrigin {
        &self.origin
    }

    /// The version reported by `synDriverGetVersion`, when the library exports it.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }
}
