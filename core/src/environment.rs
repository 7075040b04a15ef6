//! Checks of the environment variables the product reads that no other layer validates before
//! the first device or network call: `HCCL_COMM_ID` (the vendor library's parser,
//! `habana_sys::comm_id`), `DROPCOMPUTE_MOCK_VERSION` (`habana_sys::parse_version`),
//! `DROPCOMPUTE_MOCK_LOCK_DIR` and `TMPDIR` (existing directories), `RUST_LOG` (a tracing
//! filter), the input caps `DROPCOMPUTE_MAX_*_BYTES` (`crate::input`), device pinning
//! `HLS_MODULE_ID` / `HABANA_VISIBLE_MODULES` (syntax, by `synapse::module_id_from_env`) and the test hook
//! `DROPCOMPUTE_TEST_SIGKILL_AT` (`STEP[:RANK]`). The other variables
//! are checked where they are parsed: the launcher's (`hccl::bootstrap`), the mock's configuration (`mock::MockConfig::from_env`),
//! `DROPCOMPUTE_BACKEND` (`commands::train`).
//!
//! Owns: [`check`] and [`EnvError`] (exit 2, naming the variable and the value). Must not
//! touch: devices, sockets, files other than the directory checks.
#![forbid(unsafe_code)]

/// A bad value of an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {reason}")]
pub struct EnvError {
    /// The variable.
    pub variable: &'static str,
    /// Its value (lossy UTF-8).
    pub value: String,
    /// The rule it breaks.
    pub reason: String,
}

/// The test hook of `train` (`train::workload`): `STEP[:RANK]`.
pub const ENV_TEST_SIGKILL_AT: &str = "DROPCOMPUTE_TEST_SIGKILL_AT";

/// Parses `DROPCOMPUTE_TEST_SIGKILL_AT`'s value: (step, optional rank).
///
/// # Errors
/// The reason when it is not `STEP` or `STEP:RANK` with unsigned integers.
pub fn parse_sigkill_at(v: &str) -> Result<(u64, Option<u32>), String> {
    let (s, r) = v.split_once(':').map_or((v, None), |(s, r)| (s, Some(r)));
    let step = s.trim().parse().map_err(|_| "expected STEP or STEP:RANK (unsigned integers)".to_string())?;
    let rank =
        r.map(|r| r.trim().parse().map_err(|_| "RANK after ':' is not an unsigned integer".to_string())).transpose()?;
    Ok((step, rank))
}

/// Checks every variable of the module doc that is set, through `lookup` (the process
/// environment in [`check`]).
///
/// # Errors
/// The first bad one, as [`EnvError`].
pub fn check_with(lookup: impl Fn(&str) -> Option<String>) -> Result<(), EnvError> {
    let bad = |variable: &'static str, value: &str, reason: String| EnvError { variable, value: value.into(), reason };
    if let Some(v) = lookup(habana_sys::comm_id::ENV_COMM_ID) {
        habana_sys::comm_id::parse_comm_id(&v).map_err(|e| bad(habana_sys::comm_id::ENV_COMM_ID, &v, e.reason))?;
    }
    if let Some(v) = lookup("DROPCOMPUTE_MOCK_VERSION")
        && habana_sys::parse_version(&v).is_none()
    {
        return Err(bad("DROPCOMPUTE_MOCK_VERSION", &v, "expected a version MAJOR.MINOR[.PATCH] (e.g. 1.21.0)".into()));
    }
    for var in ["DROPCOMPUTE_MOCK_LOCK_DIR", "TMPDIR"] {
        if let Some(v) = lookup(var).filter(|v| !v.is_empty())
            && !std::path::Path::new(&v).is_dir()
        {
            return Err(bad(var, &v, "not an existing directory".into()));
        }
    }
    if let Some(v) = lookup("RUST_LOG")
        && let Err(e) = tracing_subscriber::EnvFilter::try_new(&v)
    {
        return Err(bad("RUST_LOG", &v, format!("not a tracing filter: {e}")));
    }
    if let Err(crate::input::InputError::BadCap { variable, value, reason }) = crate::input::check_env(&lookup) {
        return Err(bad(variable, &value, reason));
    }
    if let Some(v) = lookup(ENV_TEST_SIGKILL_AT) {
        parse_sigkill_at(&v).map_err(|why| bad(ENV_TEST_SIGKILL_AT, &v, why))?;
    }
    // Device pinning, by its one parser (`synapse::module_id_from_env`), in every subcommand and
    // launch mode: `train` and `bench` with thread ranks accepted `HLS_MODULE_ID=abc` that
    // `info` refused (issue 24). Each variable on its own (the parser stops at the first set);
    // local rank 0, so only the syntax is judged here (the entry of a higher local rank is
    // checked where the rank picks its device).
    for var in ["HLS_MODULE_ID", "HABANA_VISIBLE_MODULES"] {
        let only = |k: &str| if k == var { lookup(k) } else { None };
        if let Err(crate::synapse::Error::Config { variable, value, reason }) =
            crate::synapse::module_id_from_env(0, only)
        {
            return Err(bad(variable, &value, reason));
        }
    }
    Ok(())
}

/// [`check_with`] over the process environment.
///
/// # Errors
/// As [`check_with`].
pub fn check() -> Result<(), EnvError> {
    check_with(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_value_is_named_and_good_ones_pass() {
        let one = |k: &'static str, v: &'static str| check_with(move |q| (q == k).then(|| v.to_string()));
        assert_eq!(one("HCCL_COMM_ID", "::1:29576"), Ok(()));
        assert_eq!(one("DROPCOMPUTE_MOCK_VERSION", "1.21.0"), Ok(()));
        assert_eq!(one("RUST_LOG", "dropcompute=debug"), Ok(()));
        assert_eq!(one(ENV_TEST_SIGKILL_AT, "4:1"), Ok(()));
        for (k, v) in [
            ("HCCL_COMM_ID", "[::1]:29575"),
            ("DROPCOMPUTE_MOCK_VERSION", "latest"),
            ("DROPCOMPUTE_MOCK_LOCK_DIR", "/proc/self/status"),
            ("TMPDIR", "/proc/self/status"),
            ("RUST_LOG", "[[["),
            (ENV_TEST_SIGKILL_AT, "four"),
            (ENV_TEST_SIGKILL_AT, "4:x"),
        ] {
            let e = one(k, v).unwrap_err();
            assert_eq!((e.variable, e.value.as_str()), (k, v));
        }
    }
}
