//! Choosing what fills the function table: the real `libSynapse.so` or the CPU mock.
//!
//! Owns: [`BackendChoice`] and [`Backend::select`]. The rest of the crate receives a
//! [`SynapseApi`] and never asks which backend it is.
//! Must not touch: device state.

use std::path::{Path, PathBuf};

use habana_sys::{ApiOrigin, LoadError, SynapseApi};

/// Environment variable choosing the backend: `auto` (default), `mock` or `synapse`.
pub const ENV_BACKEND: &str = "DROPCOMPUTE_BACKEND";

/// Which backend to use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The real runtime if found (explicit path, `$DROPCOMPUTE_SYNAPSE_LIB`, default install path),
    /// else the CPU mock, with the reason recorded.
    #[default]
    Auto,
    /// The in-process CPU mock (only with the cargo feature `mock`).
    #[cfg(feature = "mock")]
    Mock,
    /// The runtime library, from this path or the standard search when `None`; no fallback.
    Synapse(Option<PathBuf>),
}

impl BackendChoice {
    /// Reads [`ENV_BACKEND`] (unset = `auto`; a value by [`BackendChoice::parse`]). An empty
    /// value is refused like every product variable's (`crate::environment`: unset it instead).
    ///
    /// # Errors
    /// [`super::Error::Config`] naming the variable and value when it is empty or something
    /// else than `auto`, `mock`, `synapse`, or `mock` in a build without the cargo feature `mock`.
    pub fn from_env() -> super::Result<Self> {
        let Some(v) = std::env::var_os(ENV_BACKEND).map(|v| v.to_string_lossy().into_owned()) else {
            return Ok(Self::Auto);
        };
        let bad = |reason: String| super::Error::Config { variable: ENV_BACKEND, value: v.clone(), reason };
        if v.trim().is_empty() {
            return Err(bad(crate::environment::EMPTY_REFUSED.into()));
        }
        Self::parse(&v).map_err(bad)
    }

    /// Parses a value of [`ENV_BACKEND`]: `auto`, `mock` or `synapse` (surrounding whitespace
    /// ignored); the one parser (`crate::environment`'s table calls it).
    ///
    /// # Errors
    /// The rule broken: another word, or `mock` in a build without the cargo feature `mock`.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v.trim() {
            "auto" => Ok(Self::Auto),
            #[cfg(feature = "mock")]
            "mock" => Ok(Self::Mock),
            #[cfg(not(feature = "mock"))]
            "mock" => Err("this build has no CPU mock (built without the cargo feature `mock`)".into()),
            "synapse" => Ok(Self::Synapse(None)),
            _ => Err("expected auto, mock or synapse".into()),
        }
    }
}

/// A selected backend: the function table plus why it was chosen.
#[derive(Debug, Clone)]
pub struct Backend {
    /// The function table to build a `Runtime` from.
    pub api: SynapseApi,
    /// Why the mock is in use when `Auto` fell back to it (e.g. "libSynapse.so not found at
    /// /usr/lib/habanalabs/libSynapse.so; using the CPU mock"), else `None`.
    pub note: Option<String>,
}

impl Backend {
    /// Selects a backend.
    ///
    /// `Auto` falls back to the mock only when the default install path
    /// ([`habana_sys::DEFAULT_LIBRARY_PATH`]) does not exist; a library that exists but fails to
    /// load is an error (a broken Gaudi install must not silently become a mock run), and so is
    /// a `$DROPCOMPUTE_SYNAPSE_LIB` naming a missing file (the user named a library: that one or
    /// an error, issue 24).
    /// Without the cargo feature `mock` there is no fallback: a missing library is
    /// [`LoadError::NotFound`] naming every path tried.
    ///
    /// # Errors
    /// [`LoadError`] from loading the runtime.
    pub fn select(choice: &BackendChoice) -> Result<Self, LoadError> {
        match choice {
            #[cfg(feature = "mock")]
            BackendChoice::Mock => Ok(Self { api: crate::mock::api(), note: None }),
            BackendChoice::Synapse(path) => Ok(Self { api: SynapseApi::load(path.as_deref())?, note: None }),
            BackendChoice::Auto => match SynapseApi::load(None) {
                Ok(api) => Ok(Self { api, note: None }),
                #[cfg(feature = "mock")]
                Err(LoadError::NotFound { tried }) if tried == [PathBuf::from(habana_sys::DEFAULT_LIBRARY_PATH)] => {
                    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
                    Ok(Self {
                        api: crate::mock::api(),
                        note: Some(format!("libSynapse.so not found at {}; using the CPU mock", tried.join(", "))),
                    })
                }
                Err(e) => Err(e),
            },
        }
    }

    /// A one-line description: "cpu-mock" or "Synapse at PATH".
    pub fn describe(&self) -> String {
        match self.api.origin() {
            ApiOrigin::InProcess(name) => (*name).to_string(),
            ApiOrigin::Library(p) => format!("Synapse at {}", p.display()),
        }
    }

    /// Whether the table is the in-process mock.
    pub fn is_mock(&self) -> bool {
        matches!(self.api.origin(), ApiOrigin::InProcess(_))
    }

    /// The library path when the table was loaded from one.
    pub fn library_path(&self) -> Option<&Path> {
        match self.api.origin() {
            ApiOrigin::Library(p) => Some(p),
            ApiOrigin::InProcess(_) => None,
        }
    }
}
