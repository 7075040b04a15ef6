//! Launcher bootstrap: who this process is in the job (rank, world size, local rank) and how it
//! gets rank 0's HCCL unique id, read from explicit values and the launcher's environment.
//!
//! Owns: [`Bootstrap::from_lookup`] (the testable core, every variable read through `lookup`)
//! and its typed [`ConfigError`]. Must not touch: the network (except resolving a host name
//! given for the rendezvous), HCCL or the device: everything here is checked before any of them.
//!
//! # Sources, in order
//! 1. [`Explicit`] values (e.g. CLI flags): each given field wins over the environment, without
//!    a conflict check (they are the way out of a confusing environment).
//! 2. torchrun: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//!    `MASTER_PORT`.
//! 3. Open MPI: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
//! 4. Slurm: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID` (no local world size: Slurm's
//!    `SLURM_TASKS_PER_NODE` is a per-node list such as `2(x3),1`).
//!
//! A launcher counts as present when its rank or world size variable is set. When several are
//! present they must agree on rank, world size and local rank (same values: fine, e.g. a job
//! that exports both); otherwise [`ConfigError::Conflict`]. One launcher nested in another
//! (`srun torchrun ...`) disagrees by design: set `DROPCOMPUTE_LAUNCHER=torchrun|openmpi|slurm`
//! to read only that one.
//!
//! # Rendezvous (world size > 1)
//! Every address variable goes through the one grammar (`habana_sys::addr`): `MASTER_ADDR` is a
//! host, IPv4 or IPv6 (bare or bracketed) address; `DROPCOMPUTE_RENDEZVOUS` is `HOST:PORT` with
//! brackets around an IPv6 address; `HCCL_COMM_ID` follows the vendor (split at the last `:`).
//!
//! `HCCL_COMM_ID=IP:PORT` (the vendor's variable, `habana_api.md` §1 and §6): the library
//! bootstraps itself and every rank passes a zeroed unique id. Otherwise our TCP rendezvous at,
//! in order: [`Explicit::addr`], `DROPCOMPUTE_RENDEZVOUS=HOST:PORT`, `MASTER_ADDR:MASTER_PORT`;
//! with the job secret from [`Explicit::secret`] or `DROPCOMPUTE_JOB_SECRET` (hex, >= 128 bits).
//! No address is ever guessed (never `0.0.0.0`): without one, a job whose every rank is on this
//! host (and whose launcher gives a job id) meets through a private file
//! ([`Rendezvous::Local`], `super::local`); any other gets a [`ConfigError::Missing`] saying
//! what to set. torchrun's `MASTER_ADDR:MASTER_PORT` counts as no address when its agent serves
//! its own store there (`TORCHELASTIC_USE_AGENT_STORE=True`). Variables that are set are
//! validated even when a single rank does not use them.
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use habana_sys::addr::{Convention, parse_port, split_host_port};
use habana_sys::comm_id::ENV_COMM_ID;

use super::rendezvous::JobSecret;

/// Which source gave rank and world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// [`Explicit`] values.
    Explicit,
    /// torchrun (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Open MPI's mpirun (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm's srun (`SLURM_PROCID`, ...).
    Slurm,
    /// Nothing set: one process, rank 0 of 1.
    Single,
}

/// How the ranks get rank 0's HCCL unique id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Our TCP rendezvous (`hccl::rendezvous`): rank 0 serves at `addr`, the others fetch, all
    /// proving `secret`.
    Tcp {
        /// Rank 0's address (rank 0 binds exactly this address).
        addr: SocketAddr,
        /// The job secret.
        secret: JobSecret,
    },
    /// `HCCL_COMM_ID=IP:PORT` is set: the library bootstraps itself from it; every rank passes
    /// a zeroed unique id.
    HcclCommId(SocketAddr),
    /// Every rank on this host and no address given: rank 0 binds `127.0.0.1:0` and publishes
    /// its address and a fresh secret in this private file; the others read it
    /// (`hccl::local`, which also says when a job counts as one-host).
    Local {
        /// The private file.
        file: std::path::PathBuf,
    },
    /// World size 1: nothing to exchange.
    None,
}

/// Values given explicitly (e.g. by CLI flags); each `Some` wins over the environment.
#[derive(Debug, Clone, Default)]
pub struct Explicit {
    /// Rank.
    pub rank: Option<u32>,
    /// World size.
    pub world_size: Option<u32>,
    /// Local rank (index of the process on its host).
    pub local_rank: Option<u32>,
    /// Rendezvous address of rank 0.
    pub addr: Option<SocketAddr>,
    /// Job secret.
    pub secret: Option<JobSecret>,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// Rank, `< world_size`.
    pub rank: u32,
    /// Number of ranks, >= 1.
    pub world_size: u32,
    /// Index of this process on its host (picks the device: `synapse::module_id_from_env`).
    pub local_rank: u32,
    /// Processes on this host, when the launcher says.
    pub local_world_size: Option<u32>,
    /// Which source gave rank and world size.
    pub launcher: Launcher,
    /// How the unique id is exchanged.
    pub rendezvous: Rendezvous,
    /// Settings that were given but are overridden, one sentence each naming both variables
    /// and their values (`HCCL_COMM_ID` wins over `DROPCOMPUTE_RENDEZVOUS`, `MASTER_ADDR` and
    /// `MASTER_PORT`); [`Bootstrap::from_env`] logs each as a warning.
    pub warnings: Vec<String>,
}

/// A bad launcher environment or explicit value, naming the variable and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value that does not parse or breaks a rule (rank >= world size, ...).
    #[error("{variable}={value:?}: {reason}")]
    Invalid {
        /// The variable (or `explicit <field>`).
        variable: String,
        /// Its value.
        value: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A needed variable is not set; `reason` names what needs it and how to set it.
    #[error("{variable} is not set: {reason}")]
    Missing {
        /// The variable to set.
        variable: String,
        /// Why it is needed (naming the variable and value that need it) and how to set it.
        reason: String,
    },
    /// Two launchers disagree.
    #[error(
        "{first}={first_value} conflicts with {second}={second_value}: a stale variable or one \
         launcher inside another; unset one, set DROPCOMPUTE_LAUNCHER=torchrun|openmpi|slurm, or \
         pass explicit values"
    )]
    Conflict {
        /// The variable of the launcher that comes first in the order.
        first: String,
        /// Its value.
        first_value: u32,
        /// The other launcher's variable.
        second: String,
        /// Its value.
        second_value: u32,
    },
}

impl ConfigError {
    /// The variable the error is about (for a conflict, the first one).
    pub fn variable(&self) -> &str {
        match self {
            Self::Invalid { variable, .. } | Self::Missing { variable, .. } => variable,
            Self::Conflict { first, .. } => first,
        }
    }
}

type Result<T> = std::result::Result<T, ConfigError>;

/// One launcher's variable names.
struct Spec {
    launcher: Launcher,
    key: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

const SPECS: [Spec; 3] = [
    Spec {
        launcher: Launcher::Torchrun,
        key: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Spec {
        launcher: Launcher::OpenMpi,
        key: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Spec {
        launcher: Launcher::Slurm,
        key: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
];

/// What one present launcher says.
struct Seen {
    spec: &'static Spec,
    rank: u32,
    size: u32,
    local_rank: Option<u32>,
    local_size: Option<u32>,
}

fn invalid(variable: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { variable: variable.into(), value: value.into(), reason: reason.into() }
}

fn missing(variable: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Missing { variable: variable.into(), reason: reason.into() }
}

/// A set, non-blank variable (trimmed).
fn get(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// Parses a launcher's rank, world size, local rank or local world size (`RANK`,
/// `OMPI_COMM_WORLD_SIZE`, `SLURM_LOCALID`, ...): a non-negative integer (the one parser, also
/// `crate::environment`'s and `info`'s for `LOCAL_RANK`).
///
/// # Errors
/// The rule broken.
pub fn parse_count(v: &str) -> std::result::Result<u32, String> {
    v.trim().parse::<u32>().map_err(|_| "not a non-negative integer".to_string())
}

fn number(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<u32>> {
    get(lookup, name).map(|v| parse_count(&v).map_err(|why| invalid(name, &v, why))).transpose()
}

/// Parses `DROPCOMPUTE_LAUNCHER`: `torchrun`, `openmpi` or `slurm` (any case).
///
/// # Errors
/// The rule broken.
pub fn parse_launcher(v: &str) -> std::result::Result<(), String> {
    if SPECS.iter().any(|s| s.key.eq_ignore_ascii_case(v.trim())) {
        Ok(())
    } else {
        Err("expected torchrun, openmpi or slurm".into())
    }
}

fn read_launcher(spec: &'static Spec, lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Seen>> {
    let (rank, size) = (number(lookup, spec.rank)?, number(lookup, spec.size)?);
    let local_rank = number(lookup, spec.local_rank)?;
    let local_size = spec.local_size.map(|n| number(lookup, n)).transpose()?.flatten();
    match (rank, size) {
        (None, None) => Ok(None),
        (Some(r), None) => {
            Err(missing(spec.size, format!("{}={r} is set ({}) but not the world size", spec.rank, spec.key)))
        }
        (None, Some(s)) => Err(missing(spec.rank, format!("{}={s} is set ({}) but not the rank", spec.size, spec.key))),
        (Some(rank), Some(size)) => Ok(Some(Seen { spec, rank, size, local_rank, local_size })),
    }
}

/// The launchers present, in order, after `DROPCOMPUTE_LAUNCHER` filtering; checked to agree.
fn launchers(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Seen>> {
    let only = get(lookup, "DROPCOMPUTE_LAUNCHER");
    if let Some(v) = &only {
        parse_launcher(v).map_err(|why| invalid("DROPCOMPUTE_LAUNCHER", v, why))?;
    }
    let mut seen = Vec::new();
    for spec in SPECS.iter().filter(|s| only.as_ref().is_none_or(|v| s.key.eq_ignore_ascii_case(v))) {
        seen.extend(read_launcher(spec, lookup)?);
    }
    let mut it = seen.into_iter();
    let Some(first) = it.next() else { return Ok(None) };
    for other in it {
        let pairs = [
            (first.spec.size, Some(first.size), other.spec.size, Some(other.size)),
            (first.spec.rank, Some(first.rank), other.spec.rank, Some(other.rank)),
            (first.spec.local_rank, first.local_rank, other.spec.local_rank, other.local_rank),
        ];
        for (a, va, b, vb) in pairs {
            if let (Some(va), Some(vb)) = (va, vb)
                && va != vb
            {
                return Err(ConfigError::Conflict {
                    first: a.into(),
                    first_value: va,
                    second: b.into(),
                    second_value: vb,
                });
            }
        }
    }
    Ok(Some(first))
}

/// Parses `DROPCOMPUTE_RENDEZVOUS`: `HOST:PORT`, `IPv4:PORT` or `[IPv6]:PORT` (the one address
/// grammar, `habana_sys::addr` under its URI convention; a bare IPv6 address has no port), the
/// port in 1..=65535. Syntax only: the host is resolved where the rendezvous is used.
///
/// # Errors
/// The rule broken (for a bare IPv6 address followed by a port, the bracketed spelling).
pub fn parse_rendezvous(value: &str) -> std::result::Result<(String, u16), String> {
    let hp = split_host_port(value, Convention::Uri)?;
    let Some(port) = hp.port else {
        // A bare IPv6 address has no port (`::1:4000` is the address ::1:4000): say both
        // bracketed spellings, the one that reads its last group as the port first.
        if hp.host.contains(':') && !value.starts_with('[') {
            let port_first = value
                .rsplit_once(':')
                .filter(|(a, p)| a.parse::<std::net::Ipv6Addr>().is_ok() && parse_port(p).is_ok())
                .map_or(String::new(), |(a, p)| format!("[{a}]:{p} if {p} is the port, else "));
            return Err(format!("a bare IPv6 address has no port: write {port_first}[{value}]:PORT"));
        }
        return Err("expected HOST:PORT ([IPv6]:PORT for an IPv6 address)".into());
    };
    Ok((hp.host.to_string(), parse_port(port)?))
}

/// Parses `MASTER_ADDR` (torchrun's): a host name, an IPv4 address or an IPv6 address with or
/// without brackets (`::1`, `[::1]`), no port (that is `MASTER_PORT`). Syntax only.
///
/// # Errors
/// The rule broken.
pub fn parse_master_addr(value: &str) -> std::result::Result<String, String> {
    let hp = split_host_port(value, Convention::Uri)?;
    match hp.port {
        None => Ok(hp.host.to_string()),
        Some(_) => Err("a host only: the port goes in MASTER_PORT".into()),
    }
}

fn host_port(variable: &str, value: &str) -> Result<(String, u16)> {
    parse_rendezvous(value).map_err(|why| invalid(variable, value, why))
}

fn port_number(variable: &str, value: &str, port: &str) -> Result<u16> {
    parse_port(port).map_err(|why| invalid(variable, value, why))
}

/// An address the other ranks can connect to (not `0.0.0.0`/`::`, port not 0).
fn connectable(variable: &str, value: &str, addr: SocketAddr) -> Result<SocketAddr> {
    if addr.ip().is_unspecified() {
        return Err(invalid(variable, value, "an unspecified address cannot be reached: give rank 0's host address"));
    }
    if addr.port() == 0 {
        return Err(invalid(variable, value, "port 0 cannot be reached by other ranks"));
    }
    Ok(addr)
}

/// Resolves a host name (IP literals need no lookup; IPv4 results preferred; unspecified
/// refused): the one resolver, `habana_sys::addr::resolve`.
fn resolve(variable: &str, value: &str, host: &str, port: u16) -> Result<SocketAddr> {
    habana_sys::addr::resolve(host, port).map_err(|why| invalid(variable, value, why))
}

const SECRET_HINT: &str = "every rank must share one job secret (hex, >= 128 bits): e.g. \
    `export DROPCOMPUTE_JOB_SECRET=$(openssl rand -hex 16)` then `mpirun -x DROPCOMPUTE_JOB_SECRET \
    ...` (srun and torchrun pass the environment on)";

impl Bootstrap {
    /// Where the world size came from, for messages: `WORLD_SIZE=2` (the launcher's variable
    /// and value), `explicit world_size=2`, or `no launcher variable set: world size 1`.
    pub fn world_size_source(&self) -> String {
        let var = SPECS.iter().find(|s| s.launcher == self.launcher).map(|s| s.size);
        match (self.launcher, var) {
            (Launcher::Single, _) => "no launcher variable set: world size 1".to_string(),
            (_, Some(v)) => format!("{v}={}", self.world_size),
            (_, None) => format!("explicit world_size={}", self.world_size),
        }
    }

    /// [`Bootstrap::from_lookup`] with no explicit values, reading the process environment.
    ///
    /// # Errors
    /// As [`Bootstrap::from_lookup`].
    pub fn from_env() -> Result<Self> {
        let b = Self::from_lookup(Explicit::default(), |k| std::env::var(k).ok())?;
        for w in &b.warnings {
            tracing::warn!("{w}");
        }
        Ok(b)
    }

    /// Works out rank, world size, local rank and rendezvous from `explicit` and the variables
    /// read through `lookup` (see the module doc for the order). Only resolving a rendezvous
    /// host name touches the network.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a non-numeric value, world size 0, rank >= world size,
    /// local rank >= local world size (or >= world size), local world size > world size, a bad
    /// `HOST:PORT` or `HCCL_COMM_ID`, an unspecified or unresolvable host, a bad secret, an
    /// unknown `DROPCOMPUTE_LAUNCHER`, or `HABANA_VISIBLE_MODULES`/`HLS_MODULE_ID` malformed or
    /// shorter than the local ranks; [`ConfigError::Missing`] for half-set values (a rank
    /// without a world size, a multi-rank job without local rank, rendezvous address, or job
    /// secret); [`ConfigError::Conflict`] when launchers disagree.
    pub fn from_lookup(explicit: Explicit, lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let env = launchers(&lookup)?;
        let from_explicit = explicit.rank.is_some() || explicit.world_size.is_some();
        let launcher = match (&env, from_explicit) {
            (_, true) => Launcher::Explicit,
            (Some(s), false) => s.spec.launcher,
            (None, false) => Launcher::Single,
        };
        let name = |field: &str, pick: fn(&Spec) -> &'static str| match (&env, from_explicit) {
            (Some(s), false) => pick(s.spec).to_string(),
            _ => format!("explicit {field}"),
        };
        let (rank_var, size_var) = (name("rank", |s| s.rank), name("world_size", |s| s.size));
        let rank = explicit.rank.or(env.as_ref().map(|s| s.rank));
        let size = explicit.world_size.or(env.as_ref().map(|s| s.size));
        let (rank, world_size) = match (rank, size) {
            (Some(r), Some(s)) => (r, s),
            (None, None) => (0, 1),
            (Some(r), None) => return Err(missing("explicit world_size", format!("explicit rank={r} is given"))),
            (None, Some(s)) => return Err(missing("explicit rank", format!("explicit world_size={s} is given"))),
        };
        if world_size == 0 {
            return Err(invalid(&size_var, "0", "world size must be at least 1"));
        }
        if rank >= world_size {
            return Err(invalid(
                &rank_var,
                &rank.to_string(),
                format!("must be below the world size {world_size} ({size_var})"),
            ));
        }

        let env_local = env.as_ref().and_then(|s| s.local_rank.map(|r| (s.spec.local_rank.to_string(), r)));
        let (local_var, local_rank) = match (explicit.local_rank, env_local) {
            (Some(r), _) => ("explicit local_rank".to_string(), r),
            (None, Some(found)) => found,
            (None, None) if world_size == 1 => ("local rank".to_string(), 0),
            (None, None) => {
                let var = env.as_ref().map_or("explicit local_rank", |s| s.spec.local_rank);
                return Err(missing(
                    var,
                    format!("{rank_var}={rank} of {size_var}={world_size}: the device is picked by local rank"),
                ));
            }
        };
        let local_world_size = match &env {
            Some(s) if launcher == s.spec.launcher => s.local_size.map(|n| (s.spec.local_size.unwrap_or_default(), n)),
            _ => None,
        };
        if let Some((var, n)) = local_world_size {
            if n == 0 || n > world_size {
                return Err(invalid(var, &n.to_string(), format!("must be in 1..={world_size} ({size_var})")));
            }
            if local_rank >= n {
                return Err(invalid(
                    &local_var,
                    &local_rank.to_string(),
                    format!("must be below the local world size {n} ({var})"),
                ));
            }
        } else if local_rank >= world_size {
            return Err(invalid(
                &local_var,
                &local_rank.to_string(),
                format!("must be below the world size {world_size}"),
            ));
        }
        check_modules(&lookup, local_rank, local_world_size.map(|(_, n)| n))?;

        let (rendezvous, warnings) = rendezvous(&explicit, &lookup, launcher, world_size)?;
        Ok(Self {
            rank,
            world_size,
            local_rank,
            local_world_size: local_world_size.map(|(_, n)| n),
            launcher,
            rendezvous,
            warnings,
        })
    }
}

/// The vendor's module-id rule must have an entry for this local rank (and for every local
/// rank, when the local world size is known).
fn check_modules(lookup: &impl Fn(&str) -> Option<String>, local_rank: u32, local_world: Option<u32>) -> Result<()> {
    let last = local_world.map_or(local_rank, |n| n.saturating_sub(1).max(local_rank));
    crate::synapse::module_id_from_env(last, lookup).map(|_| ()).map_err(|e| match e {
        crate::synapse::Error::Config { variable, value, reason } => invalid(variable, &value, reason),
        other => invalid("HABANA_VISIBLE_MODULES", "", other.to_string()),
    })
}

fn rendezvous(
    explicit: &Explicit,
    lookup: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    world_size: u32,
) -> Result<(Rendezvous, Vec<String>)> {
    // Validate every variable that is set, used or not. HCCL_COMM_ID is parsed by the one
    // parser the mock uses too, as the vendor library parses it (habana_sys::comm_id).
    let comm_id = get(lookup, ENV_COMM_ID)
        .map(|v| {
            habana_sys::comm_id::parse_comm_id(&v)
                .map(|a| (v.clone(), a))
                .map_err(|e| invalid(ENV_COMM_ID, &v, e.reason))
        })
        .transpose()?;
    let ours = get(lookup, "DROPCOMPUTE_RENDEZVOUS")
        .map(|v| host_port("DROPCOMPUTE_RENDEZVOUS", &v).map(|hp| (v, hp)))
        .transpose()?;
    let master_addr = get(lookup, "MASTER_ADDR")
        .map(|v| parse_master_addr(&v).map(|host| (v.clone(), host)).map_err(|why| invalid("MASTER_ADDR", &v, why)))
        .transpose()?;
    let master_port = get(lookup, "MASTER_PORT").map(|v| port_number("MASTER_PORT", &v, &v)).transpose()?;
    let env_secret = get(lookup, "DROPCOMPUTE_JOB_SECRET")
        .map(|v| {
            // The value is a secret: never echoed, even when malformed (only its length).
            let shown = format!("<{} characters, not shown>", v.chars().count());
            JobSecret::from_hex(&v)
                .map_err(|e| invalid("DROPCOMPUTE_JOB_SECRET", &shown, format!("{e}; {SECRET_HINT}")))
        })
        .transpose()?;
    if let Some(addr) = explicit.addr {
        connectable("explicit addr", &addr.to_string(), addr)?;
    }

    if world_size == 1 {
        return Ok((Rendezvous::None, Vec::new()));
    }
    if let Some((v, addr)) = comm_id {
        let mut overridden: Vec<String> = Vec::new();
        if let Some((o, _)) = &ours {
            overridden.push(format!("DROPCOMPUTE_RENDEZVOUS={o}"));
        }
        if let Some((a, _)) = &master_addr {
            overridden.push(format!("MASTER_ADDR={a}"));
        }
        if let Some(p) = get(lookup, "MASTER_PORT") {
            overridden.push(format!("MASTER_PORT={p}"));
        }
        if let Some(a) = explicit.addr {
            overridden.push(format!("explicit addr={a}"));
        }
        let warnings = overridden
            .into_iter()
            .map(|o| {
                format!(
                    "{ENV_COMM_ID}={v} overrides {o}: the HCCL library bootstraps from {ENV_COMM_ID} \
                     and the other setting is ignored (unset one of them)"
                )
            })
            .collect();
        return Ok((Rendezvous::HcclCommId(addr), warnings));
    }
    // torchrun's agent serves its own store at MASTER_ADDR:MASTER_PORT (it exports
    // TORCHELASTIC_USE_AGENT_STORE=True): rank 0 could not bind it, so torchrun's address
    // counts as no address.
    let master_addr = master_addr.filter(|_| !(launcher == Launcher::Torchrun && torchrun_agent_store(lookup)));
    let addr = if let Some(addr) = explicit.addr {
        addr
    } else if let Some((v, (host, port))) = ours {
        resolve("DROPCOMPUTE_RENDEZVOUS", &v, &host, port)?
    } else if let Some((v, host)) = master_addr {
        let port =
            master_port.ok_or_else(|| missing("MASTER_PORT", format!("MASTER_ADDR={v} is set but not its port")))?;
        resolve("MASTER_ADDR", &v, &host, port)?
    } else if let Some(file) = one_host_rendezvous(lookup, launcher, world_size) {
        return Ok((Rendezvous::Local { file }, Vec::new()));
    } else {
        let how = match launcher {
            Launcher::Torchrun if torchrun_agent_store(lookup) => {
                "torchrun's agent serves its own store at MASTER_ADDR:MASTER_PORT, so a job on \
                 several hosts needs rank 0's host and another free port here (one host needs \
                 nothing: LOCAL_WORLD_SIZE = WORLD_SIZE)"
            }
            Launcher::Slurm => {
                "Slurm does not say where rank 0 runs: set it to the first host of SLURM_JOB_NODELIST \
                 (`scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -1`) and a free port"
            }
            Launcher::OpenMpi => {
                "mpirun does not say where rank 0 runs: set it to rank 0's host and a free port, \
                 and pass it on with `mpirun -x DROPCOMPUTE_RENDEZVOUS`"
            }
            _ => "give rank 0's HOST:PORT (or MASTER_ADDR and MASTER_PORT, or HCCL_COMM_ID=IP:PORT)",
        };
        return Err(missing(
            "DROPCOMPUTE_RENDEZVOUS",
            format!("a job of {world_size} ranks needs rank 0's address; {how}"),
        ));
    };
    let secret = explicit.secret.clone().or(env_secret).ok_or_else(|| {
        missing("DROPCOMPUTE_JOB_SECRET", format!("the TCP rendezvous at {addr} needs it; {SECRET_HINT}"))
    })?;
    Ok((Rendezvous::Tcp { addr, secret }, Vec::new()))
}

/// Whether torchrun's agent holds MASTER_ADDR:MASTER_PORT for its own store
/// (`TORCHELASTIC_USE_AGENT_STORE` true, which torchrun exports to every worker).
fn torchrun_agent_store(lookup: &impl Fn(&str) -> Option<String>) -> bool {
    get(lookup, "TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The "no address" case: a job whose every rank is on this host, with a job id from its
/// launcher, meets through a private file (`super::local::one_host`); `None` otherwise (a
/// multi-host job never gets a guessed address).
fn one_host_rendezvous(
    lookup: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    world_size: u32,
) -> Option<std::path::PathBuf> {
    super::local::one_host(lookup, launcher, world_size)
}
