//! Configuration of the CPU mock device ([`MockConfig`]) and the fault knobs ([`Fault`]).
//!
//! Owns: the serde types accepted by `dcmock_configure` / `dcmock_inject_fault` (JSON), their
//! defaults and validation; the environment variables the mock reads and the version it reports.
//! Must not touch: the process-global mock state (that is `state.rs`);
//! these are plain values.

use serde::{Deserialize, Serialize};

pub use latency_noise::Noise;

/// Version reported by `synDriverGetVersion` unless [`ENV_VERSION`] is set.
pub const MOCK_VERSION: &str = "1.21.0-mock";
/// Environment variable overriding the reported version (e.g. "1.15.0" to emulate an old
/// runtime), read at each `synDriverGetVersion` call.
pub const ENV_VERSION: &str = "DROPCOMPUTE_MOCK_VERSION";
/// Environment variable overriding `MockConfig::hccl_timeout_ms` (ms, > 0); also exported as
/// `hccl::ENV_TIMEOUT_MS`.
pub const ENV_TIMEOUT_MS: &str = "DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS";
/// Environment variable overriding the default number of mock modules (e.g. `1024`).
pub const ENV_DEVICES: &str = "DROPCOMPUTE_MOCK_DEVICES";
/// Environment variable holding a whole [`MockConfig`] as JSON, read at the first
/// `synInitialize` unless a configuration was set explicitly with `dcmock_configure`.
pub const ENV_CONFIG: &str = "DROPCOMPUTE_MOCK_CONFIG";
/// Largest number of mock modules accepted (thread-per-rank jobs use up to a few thousand).
pub const MAX_DEVICES: u32 = 65_536;
/// 96 GiB: the HBM capacity of a Gaudi2 module, reported by `synDeviceGetMemoryInfo`.
pub const DEFAULT_HBM_BYTES: u64 = 96 << 30;

/// Device type reported by the mock modules (`synDeviceGetInfo*`, `synDeviceAcquireByDeviceType`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum MockDeviceType {
    /// `synDeviceGaudi` (2).
    Gaudi,
    /// `synDeviceGaudi2` (4), the default.
    #[default]
    Gaudi2,
    /// `synDeviceGaudi3` (5).
    Gaudi3,
}

impl MockDeviceType {
    /// The `synDeviceType` code.
    pub fn code(self) -> habana_sys::synDeviceType {
        match self {
            Self::Gaudi => habana_sys::synDeviceType::GAUDI,
            Self::Gaudi2 => habana_sys::synDeviceType::GAUDI2,
            Self::Gaudi3 => habana_sys::synDeviceType::GAUDI3,
        }
    }
}

/// How the mock's device timeline relates to wall time. Command-line names (cargo feature
/// `clap`, `dropcompute train --time-mode`): `real`, `virtual`, the same as the JSON names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum TimeMode {
    /// Device timestamps are ns since a process-wide mock epoch (a monotonic `Instant`); a stream
    /// worker sleeps until each operation's emulated end, so wall time shows the emulated latency.
    /// Operation start = max(now, end of the previous operation on that stream).
    #[default]
    #[cfg_attr(feature = "clap", value(help = "Device time follows wall time (the mock sleeps the emulated latency)"))]
    Real,
    /// No sleeping. Each stream keeps a virtual clock starting at 0 ns: operation start =
    /// max(stream clock, timestamps of the events it waited for), end = start + latency. Fully
    /// deterministic for a given seed and per-device launch order.
    #[cfg_attr(feature = "clap", value(help = "Virtual device clocks, no sleeping; deterministic for a seed"))]
    Virtual,
}

/// Largest accepted persistent slowdown factor (a larger one would put a single launch hours away
/// on the device timeline).
pub const MAX_SLOWDOWN: f64 = 1e6;
/// Smallest accepted copy bandwidth, GB/s.
pub const MIN_COPY_BANDWIDTH_GBPS: f64 = 1e-3;
/// Largest accepted scripted latency: one hour in ns.
pub const MAX_SCRIPT_NS: u64 = 3_600_000_000_000;

/// Per-module overrides of the latency model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceOverride {
    /// Module id this entry applies to (< `MockConfig::devices`).
    pub module_id: u32,
    /// Persistent slowdown factor of this module (a slow rank); default 1, must be > 0.
    #[serde(default = "one")]
    pub slowdown: f64,
    /// Noise for this module instead of `MockConfig::noise`.
    #[serde(default)]
    pub noise: Option<Noise>,
    /// Latency script: successive launches on this module take exactly these many ns (noise and
    /// slowdown ignored); once exhausted, the model applies again.
    #[serde(default)]
    pub script_ns: Vec<u64>,
    /// When set, only launches of the recipe with this name consume `script_ns` (other
    /// launches follow the model), so a test can script the forward/backward recipe of a
    /// training step without counting the scheduler's own gradient launches.
    #[serde(default)]
    pub script_recipe: Option<String>,
}

fn one() -> f64 {
    1.0
}

/// The mock device configuration. JSON form: every field optional, e.g.
/// `{"devices":16,"time_mode":"virtual","seed":7,"noise":{"kind":"reference","delay_factor":1.0}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MockConfig {
    /// Number of mock modules (module ids 0..devices). Default 8, or `$DROPCOMPUTE_MOCK_DEVICES`
    /// through [`MockConfig::from_env`]. 1..=[`MAX_DEVICES`].
    pub devices: u32,
    /// Device type reported by every module (default Gaudi2).
    pub device_type: MockDeviceType,
    /// HBM bytes per module (default 96 GiB); `synDeviceMalloc` beyond it fails.
    pub hbm_bytes: u64,
    /// Timeline mode (default real).
    pub time_mode: TimeMode,
    /// Global seed; module m's random stream is seeded with splitmix64(seed, m).
    pub seed: u64,
    /// Copy bandwidth in GB/s (1e9 bytes/s) used to cost `synMemCopyAsync` on the timeline
    /// (default 25, the order of a PCIe Gen4 x16 host link).
    pub copy_bandwidth_gbps: f64,
    /// Noise model of every module without an override (default none).
    pub noise: Noise,
    /// Per-module overrides.
    pub per_device: Vec<DeviceOverride>,
    /// Mock HCCL timeout in ms (default 30 000): the longest `hcclCommInitRank` waits for all
    /// ranks, and the longest a collective waits for any expected message from a peer.
    /// `$DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS` overrides it when set. 1..=3 600 000.
    pub hccl_timeout_ms: u64,
    /// Link bandwidth (GB/s) of the mock HCCL's virtual-time cost model (default 25).
    pub hccl_bandwidth_gbps: f64,
    /// Device memory bandwidth in GB/s (= bytes/ns) of the graph cost model: each node costs the
    /// bytes it reads and writes at this rate (default 2450, the HBM2E bandwidth Intel publishes
    /// for Gaudi2).
    pub graph_hbm_gbps: f64,
    /// Arithmetic rate in GFLOP/s (= flop/ns) of the graph cost model: each node also costs its
    /// floating-point operations at this rate (default 100 000, i.e. 100 TFLOP/s: an assumed
    /// sustained rate, below the Gaudi2 matrix engines' published bf16 peak).
    pub graph_gflops: f64,
    /// Fixed cost of each graph node in ns (default 2000: kernel launch and sync on the device,
    /// an assumption of the mock, not a measured Gaudi figure).
    pub graph_node_overhead_ns: u64,
    /// Base latency in ns of a launch of the graph recipe with this name (the name given to
    /// `synGraphCompile`), before slowdown and noise, instead of the per-node cost model
    /// (default empty: every graph recipe is costed by the model). An emulation knob: a job
    /// that states its own device time per launch (`dropcompute train --base-latency-ms` for its
    /// forward/backward recipe) sets it. At most [`MAX_SCRIPT_NS`] each. JSON:
    /// `"graph_base_latency_ns": {"mlp_fwd_bwd_64x128x10_b16": 12000000}`.
    pub graph_base_latency_ns: std::collections::BTreeMap<String, u64>,
    /// Keyed noise draws shared between graph recipes: a launch of recipe `k` draws its noise
    /// factor as a launch of recipe `v` would under the same latency key (default empty). An
    /// emulation knob for a job with two compiled shapes of one computation (`dropcompute
    /// train --tail-split`: the tail micro-batch sees the device conditions of the micro-batch
    /// it is cut from). JSON: `"graph_noise_alias": {"mlp_fwd_bwd_64x128x10_b8":
    /// "mlp_fwd_bwd_64x128x10_b16"}`.
    #[serde(default)]
    pub graph_noise_alias: std::collections::BTreeMap<String, String>,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            devices: 8,
            device_type: MockDeviceType::Gaudi2,
            hbm_bytes: DEFAULT_HBM_BYTES,
            time_mode: TimeMode::Real,
            seed: 0,
            copy_bandwidth_gbps: 25.0,
            noise: Noise::None,
            per_device: Vec::new(),
            hccl_timeout_ms: 30_000,
            hccl_bandwidth_gbps: 25.0,
            graph_hbm_gbps: 2450.0,
            graph_gflops: 100_000.0,
            graph_node_overhead_ns: 2000,
            graph_base_latency_ns: std::collections::BTreeMap::new(),
            graph_noise_alias: std::collections::BTreeMap::new(),
        }
    }
}

/// Why a configuration or fault was rejected.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid mock {what}: {why}")]
pub struct ConfigError {
    /// "config" or "fault".
    pub what: &'static str,
    /// Which field and value.
    pub why: String,
}

fn bad(what: &'static str, why: String) -> ConfigError {
    ConfigError { what, why }
}

/// The version `synDriverGetVersion` reports: `$DROPCOMPUTE_MOCK_VERSION` as set (unchecked,
/// so the mock library emulates a runtime reporting anything and the loader's version check
/// refuses it: exit 3 naming the library and version), else [`MOCK_VERSION`]. Read at each call.
pub fn reported_version() -> String {
    std::env::var(ENV_VERSION).unwrap_or_else(|_| MOCK_VERSION.to_string())
}

/// Checks `$DROPCOMPUTE_MOCK_VERSION` for the in-process mock, which no loader checks: when set,
/// it must name a supported release (`habana_sys::is_supported_version`, the loader's own rule:
/// a "MAJOR.MINOR" of at least `habana_sys::MIN_VERSION`).
///
/// # Errors
/// [`ConfigError`] naming the variable and value otherwise (e.g. `xyz`, `1.15.0`).
pub fn check_version_env() -> Result<(), ConfigError> {
    let Ok(v) = std::env::var(ENV_VERSION) else { return Ok(()) };
    let min = habana_sys::MIN_VERSION;
    match habana_sys::parse_version(&v) {
        _ if habana_sys::is_supported_version(&v) => Ok(()),
        Some(_) => {
            Err(bad("config", format!("{ENV_VERSION}={v:?} is older than the supported SynapseAI {}.{}", min.0, min.1)))
        }
        None => Err(bad("config", format!("{ENV_VERSION}={v:?} is not a version (expected MAJOR.MINOR[.PATCH])"))),
    }
}

/// Parses `$DROPCOMPUTE_MOCK_DEVICES`: a device count in 1..=[`MAX_DEVICES`] (the one parser,
/// used by [`MockConfig::from_env`] and `dropcompute::environment`'s table).
///
/// # Errors
/// The rule broken.
pub fn parse_devices(v: &str) -> Result<u32, String> {
    v.trim()
        .parse()
        .ok()
        .filter(|d| (1..=MAX_DEVICES).contains(d))
        .ok_or_else(|| format!("not a device count in 1..={MAX_DEVICES}"))
}

/// Parses `$DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS`: milliseconds in 1..=3600000 (the one parser,
/// used by [`MockConfig::from_env`], the collectives' init and `dropcompute::environment`'s table).
///
/// # Errors
/// The rule broken.
pub fn parse_timeout_ms(v: &str) -> Result<u64, String> {
    v.trim()
        .parse()
        .ok()
        .filter(|ms| (1..=3_600_000).contains(ms))
        .ok_or_else(|| "not a timeout in ms (1..=3600000)".to_string())
}

fn validate_noise(n: &Noise) -> Result<(), ConfigError> {
    if n.is_valid() { Ok(()) } else { Err(bad("config", format!("noise parameters out of range: {n:?}"))) }
}

impl MockConfig {
    /// The default configuration with `$DROPCOMPUTE_MOCK_CONFIG` (JSON; empty is refused) or, when unset,
    /// `$DROPCOMPUTE_MOCK_DEVICES` applied, then `$DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS` (checked
    /// here so a bad value is reported up front; the collectives read it again at init).
    /// `$DROPCOMPUTE_MOCK_VERSION` is checked first ([`check_version_env`]).
    ///
    /// # Errors
    /// [`ConfigError`] when a variable is set but unparsable or invalid.
    pub fn from_env() -> Result<Self, ConfigError> {
        check_version_env()?;
        let mut cfg = match std::env::var(ENV_CONFIG) {
            // The product's one rule for empty values (`dropcompute::environment`): refused.
            Ok(json) if json.trim().is_empty() => {
                return Err(bad("config", format!("{ENV_CONFIG}={json:?}: {}", habana_sys::EMPTY_REFUSED)));
            }
            Ok(json) => {
                Self::from_json(&json).map_err(|e| bad("config", format!("{ENV_CONFIG}={json:?}: {}", e.why)))?
            }
            _ => {
                let mut cfg = Self::default();
                if let Ok(n) = std::env::var(ENV_DEVICES) {
                    cfg.devices =
                        parse_devices(&n).map_err(|why| bad("config", format!("{ENV_DEVICES}={n:?}: {why}")))?;
                }
                cfg
            }
        };
        if let Ok(v) = std::env::var(ENV_TIMEOUT_MS) {
            cfg.hccl_timeout_ms =
                parse_timeout_ms(&v).map_err(|why| bad("config", format!("{ENV_TIMEOUT_MS}={v:?}: {why}")))?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// [`MockConfig::from_env`] for one host whose ranks acquire modules `0..ranks` (threads
    /// or processes of `train` and `bench allreduce`): the device count is raised to `ranks`
    /// unless the user fixed it ([`MockConfig::devices_fixed_by`]). Whether the count then
    /// suffices is judged in one place, after the runtime is up and before any rank starts:
    /// `dropcompute::launch::check_devices` (exit 2 naming ranks, devices and this source).
    ///
    /// # Errors
    /// As [`MockConfig::from_env`].
    pub fn from_env_for_ranks(ranks: u32) -> Result<Self, ConfigError> {
        let mut cfg = Self::from_env()?;
        if cfg.devices < ranks && Self::devices_fixed_by().is_none() {
            cfg.devices = ranks;
        }
        Ok(cfg)
    }

    /// Which variable fixes the mock's device count, worded for a message, or `None` when
    /// it is the default ([`MockConfig::from_env_for_ranks`] may then raise it):
    /// `$DROPCOMPUTE_MOCK_CONFIG` when its JSON has a `"devices"` field (it wins over
    /// `$DROPCOMPUTE_MOCK_DEVICES`, as in [`MockConfig::from_env`]), else
    /// `$DROPCOMPUTE_MOCK_DEVICES` when set. Before this, `{"devices":2}` in the JSON was
    /// raised silently by `train` and left to an HCCL init timeout by `bench allreduce`.
    pub fn devices_fixed_by() -> Option<String> {
        match std::env::var(ENV_CONFIG) {
            Ok(json) if !json.trim().is_empty() => {
                let v: serde_json::Value = serde_json::from_str(&json).ok()?;
                let n = v.get("devices")?;
                Some(format!("${ENV_CONFIG} \"devices\": {n}"))
            }
            _ => std::env::var(ENV_DEVICES).ok().map(|n| format!("${ENV_DEVICES}={}", n.trim())),
        }
    }

    /// The fields `$DROPCOMPUTE_MOCK_CONFIG` sets (the top-level keys of its JSON object, e.g.
    /// `{"graph_gflops": 500}` sets `graph_gflops`); empty when the variable is unset, empty or
    /// not a JSON object (then [`MockConfig::from_env`] reports it). A job that chooses its own
    /// default for a field (`dropcompute train --task text`'s compute rate) keeps the user's
    /// value when this names the field: the user's setting wins.
    pub fn set_by_env() -> std::collections::BTreeSet<String> {
        match std::env::var(ENV_CONFIG) {
            Ok(json) => Self::fields_named(&json),
            Err(_) => std::collections::BTreeSet::new(),
        }
    }

    /// The top-level keys of `json` when it is a JSON object, else none ([`MockConfig::set_by_env`]
    /// applied to a value).
    pub fn fields_named(json: &str) -> std::collections::BTreeSet<String> {
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => std::collections::BTreeSet::new(),
        }
    }

    /// Parses and validates the JSON form: a JSON object (`habana_sys::require_json_object`).
    ///
    /// # Errors
    /// [`ConfigError`] for anything but a JSON object ([`habana_sys::NOT_A_JSON_OBJECT`]), the
    /// JSON error, or the invalid field with its rule.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        // `[]` or `[8,"gaudi2"]` were read as the fields in order (serde's sequence form).
        habana_sys::require_json_object(json.as_bytes()).map_err(|why| bad("config", why.to_owned()))?;
        let cfg: Self = serde_json::from_str(json).map_err(|e| bad("config", e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges: 1 <= devices <= [`MAX_DEVICES`], bandwidth finite and > 0, noise
    /// parameters valid, overrides name existing modules with slowdown finite and > 0.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.devices == 0 || self.devices > MAX_DEVICES {
            return Err(bad("config", format!("devices = {} (must be 1..={MAX_DEVICES})", self.devices)));
        }
        if !(1..=3_600_000).contains(&self.hccl_timeout_ms) {
            return Err(bad("config", format!("hccl_timeout_ms = {} (must be 1..=3600000)", self.hccl_timeout_ms)));
        }
        // Every rate: a positive finite number, at least the floor that keeps the timeline's
        // costs finite (1e-300 GB/s costs a copy about 1e300 ns).
        for (name, v) in [
            ("copy_bandwidth_gbps", self.copy_bandwidth_gbps),
            ("hccl_bandwidth_gbps", self.hccl_bandwidth_gbps),
            ("graph_hbm_gbps", self.graph_hbm_gbps),
            ("graph_gflops", self.graph_gflops),
        ] {
            if !(v.is_finite() && v >= MIN_COPY_BANDWIDTH_GBPS) {
                return Err(bad(
                    "config",
                    format!(
                        "{name} = {} (must be a positive finite number, at least {})",
                        habana_sys::show_f64(v),
                        habana_sys::show_f64(MIN_COPY_BANDWIDTH_GBPS)
                    ),
                ));
            }
        }
        if self.graph_node_overhead_ns > MAX_SCRIPT_NS {
            return Err(bad(
                "config",
                format!(
                    "graph_node_overhead_ns = {} (must be <= {MAX_SCRIPT_NS}, 1 hour)",
                    self.graph_node_overhead_ns
                ),
            ));
        }
        if let Some((name, ns)) = self.graph_base_latency_ns.iter().find(|(_, ns)| **ns > MAX_SCRIPT_NS) {
            return Err(bad("config", format!("graph_base_latency_ns[{name:?}] = {ns} > {MAX_SCRIPT_NS} (1 hour)")));
        }
        validate_noise(&self.noise)?;
        for o in &self.per_device {
            if o.module_id >= self.devices {
                return Err(bad("config", format!("per_device module_id {} >= devices {}", o.module_id, self.devices)));
            }
            if let Some(ns) = o.script_ns.iter().find(|&&ns| ns > MAX_SCRIPT_NS) {
                return Err(bad(
                    "config",
                    format!("module {} script_ns entry {ns} > {MAX_SCRIPT_NS} (1 hour)", o.module_id),
                ));
            }
            if !(o.slowdown.is_finite() && o.slowdown > 0.0 && o.slowdown <= MAX_SLOWDOWN) {
                return Err(bad(
                    "config",
                    format!(
                        "module {} slowdown = {} (must be a positive finite number, at most {})",
                        o.module_id,
                        habana_sys::show_f64(o.slowdown),
                        habana_sys::show_f64(MAX_SLOWDOWN)
                    ),
                ));
            }
            if let Some(n) = &o.noise {
                validate_noise(n)?;
            }
        }
        Ok(())
    }
}

/// A fault to inject into the mock (JSON: `{"kind":"fail_next_call","function":"synMemCopyAsync","status":26}`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// The next `times` calls (default 1) of the C function `function` (C name, e.g.
    /// "synMemCopyAsync") return `status` without doing anything. Applies to `syn*` functions
    /// and to `hccl*` functions (then `status` is an `hcclResult_t` code).
    FailNextCall {
        /// C symbol name.
        function: String,
        /// Raw `synStatus` code to return.
        status: i32,
        /// How many calls fail (default 1).
        #[serde(default = "one_u32")]
        times: u32,
    },
    /// The next operation executed by any stream of module `module_id` blocks for
    /// `duration_ms` (wall ms in real mode; added to the stream clock in virtual mode), or
    /// until a [`Fault::ReleaseStall`] for that module when `duration_ms` is absent.
    StallStream {
        /// Module whose streams stall.
        module_id: u32,
        /// Stall length in ms; `None` = until released.
        #[serde(default)]
        duration_ms: Option<u64>,
    },
    /// Ends (or cancels) a stall of `module_id`.
    ReleaseStall {
        /// Module whose stall ends.
        module_id: u32,
    },
    /// Removes every pending fault and releases every stall.
    ClearAll,
    /// The next collective executed in this process by rank `rank` of a mock HCCL
    /// communicator dies after sending its first data message: it closes its links (peers see
    /// it gone: hcclSocketError) and its own operation fails (hcclInternalError); with
    /// `abort_process` the whole process calls `std::process::abort()` instead (a killed peer).
    HcclKillRank {
        /// Communicator rank that dies.
        rank: u32,
        /// Abort the process instead of closing the links.
        #[serde(default)]
        abort_process: bool,
    },
    /// Sets `code` (an `hcclResult_t`) as the asynchronous error of every mock HCCL
    /// communicator of this process (their next or running operation fails with it).
    HcclAsyncError {
        /// Raw `hcclResult_t` code.
        code: i32,
    },
    /// Not a fault: restarts module `module_id`'s latency random stream from `seed` (mixed
    /// with the module id as at configuration). A training job does this at every checkpoint
    /// boundary, so a run resumed from a checkpoint draws exactly the latencies the
    /// uninterrupted run drew (virtual time mode).
    ReseedLatency {
        /// Module whose stream restarts.
        module_id: u32,
        /// New seed.
        seed: u64,
    },
    /// Not a fault: the job is about to launch micro-batch `micro_batch` of step `step` on
    /// module `module_id`. Until the next key, that module's latencies are keyed draws: a pure
    /// function of (configured seed, module, step, micro-batch, recipe name, launch count of
    /// that recipe under the key), so two runs see the same latency for every micro-batch both
    /// compute (common random numbers; see `latency.rs`). Reconfiguring clears every key.
    LatencyKey {
        /// Module the key applies to.
        module_id: u32,
        /// Training step.
        step: u64,
        /// Micro-batch index within the step.
        micro_batch: u32,
    },
}

fn one_u32() -> u32 {
    1
}

impl Fault {
    /// Parses the JSON form: a JSON object (`habana_sys::require_json_object`).
    ///
    /// # Errors
    /// [`ConfigError`] for anything but a JSON object, or with the JSON error.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        // An internally tagged enum reads `["clear_all"]` as its tag and fields in order.
        habana_sys::require_json_object(json.as_bytes()).map_err(|why| bad("fault", why.to_owned()))?;
        serde_json::from_str(json).map_err(|e| bad("fault", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_knobs_that_would_overflow_the_timeline_are_rejected() {
        for json in [
            r#"{"per_device":[{"module_id":0,"slowdown":1e300}]}"#,
            r#"{"per_device":[{"module_id":0,"script_ns":[18446744073709551615]}]}"#,
            r#"{"copy_bandwidth_gbps":1e-300}"#,
        ] {
            let err = MockConfig::from_json(json).and_then(|c| c.validate().map(|_| c)).unwrap_err();
            assert_eq!(err.what, "config", "{json}");
        }
        let ok =
            MockConfig::from_json(r#"{"per_device":[{"module_id":0,"slowdown":1e6,"script_ns":[3600000000000]}]}"#)
                .unwrap();
        ok.validate().unwrap();
    }

    #[test]
    fn config_json_round_trip_and_defaults() {
        let cfg = MockConfig::from_json(
            r#"{"devices":3,"time_mode":"virtual","noise":{"kind":"reference","delay_factor":1.0},
            "per_device":[{"module_id":2,"slowdown":2.5,"script_ns":[10,20]}]}"#,
        )
        .unwrap();
        assert_eq!(cfg.devices, 3);
        assert_eq!(cfg.time_mode, TimeMode::Virtual);
        assert_eq!(cfg.hbm_bytes, 96 << 30);
        assert_eq!(cfg.per_device[0].script_ns, vec![10, 20]);
        let back = MockConfig::from_json(&serde_json::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn fields_named_lists_the_json_objects_keys_only() {
        let f = MockConfig::fields_named(r#"{"graph_gflops": 500, "devices": 4}"#);
        assert_eq!(f.into_iter().collect::<Vec<_>>(), ["devices", "graph_gflops"]);
        assert!(MockConfig::fields_named("{}").is_empty());
        assert!(MockConfig::fields_named("[1]").is_empty());
        assert!(MockConfig::fields_named("not json").is_empty());
        // A field at its default value is still set by the user.
        assert!(MockConfig::fields_named(r#"{"graph_gflops": 100000}"#).contains("graph_gflops"));
    }

    #[test]
    fn config_rejects_bad_values() {
        assert!(MockConfig::from_json(r#"{"devices":0}"#).is_err());
        assert!(MockConfig::from_json(r#"{"copy_bandwidth_gbps":-1}"#).is_err());
        assert!(MockConfig::from_json(r#"{"devices":2,"per_device":[{"module_id":2}]}"#).is_err());
        assert!(MockConfig::from_json(r#"{"noise":{"kind":"normal","cv":-0.1}}"#).is_err());
        assert!(MockConfig::from_json(r#"{"devise":2}"#).is_err());
    }

    /// Anything but a JSON object is refused (serde read `[]`, `[1]`, `[8,"gaudi2"]` into the
    /// fields in order); every numeric field's refusal names the field, its value as typed and
    /// the rule.
    #[test]
    fn only_a_json_object_is_a_config_and_every_bad_number_says_why() {
        // (input, the message's part; None: accepted)
        let cases: [(&str, Option<&str>); 16] = [
            ("[]", Some(habana_sys::NOT_A_JSON_OBJECT)),
            ("[1]", Some(habana_sys::NOT_A_JSON_OBJECT)),
            (r#"[8,"gaudi2"]"#, Some(habana_sys::NOT_A_JSON_OBJECT)),
            (" \n\t7", Some(habana_sys::NOT_A_JSON_OBJECT)),
            ("null", Some(habana_sys::NOT_A_JSON_OBJECT)),
            (r#""devices""#, Some(habana_sys::NOT_A_JSON_OBJECT)),
            (r#"{"graph_gflops": -1}"#, Some("graph_gflops = -1 (must be a positive finite number, at least 0.001)")),
            (r#"{"graph_gflops": 0}"#, Some("graph_gflops = 0 (must be a positive finite number")),
            (r#"{"graph_hbm_gbps": 1e-300}"#, Some("graph_hbm_gbps = 1e-300 (must be a positive finite number")),
            (r#"{"copy_bandwidth_gbps": 1e-300}"#, Some("copy_bandwidth_gbps = 1e-300 (must be")),
            (r#"{"hccl_bandwidth_gbps": -2.5}"#, Some("hccl_bandwidth_gbps = -2.5 (must be")),
            (
                r#"{"graph_node_overhead_ns": 3600000000001}"#,
                Some("graph_node_overhead_ns = 3600000000001 (must be <="),
            ),
            (r#"{"hccl_timeout_ms": 0}"#, Some("hccl_timeout_ms = 0 (must be 1..=3600000)")),
            (
                r#"{"per_device":[{"module_id":0,"slowdown":1e300}]}"#,
                Some("slowdown = 1e300 (must be a positive finite"),
            ),
            (" {\"graph_gflops\": 500}", None),
            ("{}", None),
        ];
        for (json, want) in cases {
            match (MockConfig::from_json(json), want) {
                (Err(e), Some(w)) => assert!(e.why.contains(w), "{json}: {e}"),
                (Ok(_), None) => {}
                (got, _) => panic!("{json}: {got:?}, want {want:?}"),
            }
        }
        for json in ["[]", r#"["clear_all"]"#, r#"["release_stall", 0]"#] {
            let e = Fault::from_json(json).expect_err(json);
            assert_eq!((e.what, e.why.as_str()), ("fault", habana_sys::NOT_A_JSON_OBJECT), "{json}");
        }
        assert!(Fault::from_json(r#"{"kind":"clear_all"}"#).is_ok());
    }

    #[test]
    fn fault_json() {
        let f = Fault::from_json(r#"{"kind":"fail_next_call","function":"synDeviceFree","status":26}"#).unwrap();
        assert_eq!(f, Fault::FailNextCall { function: "synDeviceFree".into(), status: 26, times: 1 });
        assert!(Fault::from_json(r#"{"kind":"explode"}"#).is_err());
    }
}
