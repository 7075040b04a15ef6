//! `HCCL_COMM_ID`, the vendor library's bootstrap variable (`habana_api.md` §1 and §6), parsed
//! as the library parses it: the value is split at its **last** `:`; the right part is the port,
//! the left part a bare address (IPv4, IPv6 without brackets, or a host name, resolved). So
//! `::1:29576` is IPv6 loopback port 29576, and the bracketed URL form `[::1]:29575` is refused
//! (the library would read `[::1]` as a host name); the refusal gives the accepted form. The
//! grammar is the one of every address variable ([`crate::addr`], [`crate::addr::Convention::Vendor`]).
//!
//! Owns: the one parser of the variable, used by the product (`dropcompute::hccl::bootstrap`)
//! and by the mock (`habana-mock`'s `hcclGetUniqueId` and `hcclCommInitRank`), so a CPU test
//! sees what the vendor library would. Must not touch: sockets (only the resolver for host
//! names).

use std::net::SocketAddr;

use crate::addr::{Convention, parse_port, resolve, split_host_port};

/// The variable's name.
pub const ENV_COMM_ID: &str = "HCCL_COMM_ID";

/// An `HCCL_COMM_ID` value the vendor library would not accept, with the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HCCL_COMM_ID={value:?}: {reason}")]
pub struct CommIdError {
    /// The value as given.
    pub value: String,
    /// The rule it breaks (and, for the bracketed form, the accepted spelling).
    pub reason: String,
}

/// Splits `value` as the library does: `(address or host, port)`, split at the last `:`
/// (the one grammar, [`crate::addr::split_host_port`] under [`Convention::Vendor`]).
///
/// # Errors
/// [`CommIdError`] when there is no `:`, the address part is empty or bracketed (`[::1]`: the
/// message gives the bare form, `::1:PORT`), or the port is not an integer in 1..=65535.
pub fn split_comm_id(value: &str) -> Result<(&str, u16), CommIdError> {
    let bad = |reason: String| CommIdError { value: value.to_string(), reason };
    let hp = split_host_port(value, Convention::Vendor).map_err(bad)?;
    let Some(port) = hp.port else {
        return Err(bad("expected ADDRESS:PORT (the port after the last ':')".into()));
    };
    Ok((hp.host, parse_port(port).map_err(bad)?))
}

/// Parses and resolves `value` ([`split_comm_id`], then [`crate::addr::resolve`]): an IP
/// literal as is, a host name through the system resolver (IPv4 results preferred, as a
/// host's first address; wider than the vendor, which documents `IP:PORT`).
///
/// # Errors
/// As [`split_comm_id`]; a host that does not resolve; an unspecified address (`0.0.0.0`,
/// `::`), which other ranks cannot connect to.
pub fn parse_comm_id(value: &str) -> Result<SocketAddr, CommIdError> {
    let (host, port) = split_comm_id(value)?;
    resolve(host, port).map_err(|reason| CommIdError { value: value.to_string(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_after_the_last_colon_and_the_address_is_bare() {
        let ok = [
            ("127.0.0.1:29500", "127.0.0.1:29500"),
            ("::1:29576", "[::1]:29576"),
            ("fe80::1:2:3", "[fe80::1:2]:3"),
            ("localhost:29577", "127.0.0.1:29577"),
        ];
        for (v, want) in ok {
            assert_eq!(parse_comm_id(v).map(|a| a.to_string()), Ok(want.to_string()), "{v}");
        }
    }

    #[test]
    fn the_bracketed_form_and_malformed_values_are_refused_naming_the_value() {
        let e = parse_comm_id("[::1]:29575").unwrap_err();
        assert!(e.to_string().contains("HCCL_COMM_ID=::1:29575") && e.value == "[::1]:29575", "{e}");
        for (v, why) in [
            ("10.0.0.1", "last ':'"),
            (":29500", "no host"),
            ("10.0.0.1:0", "port 0"),
            ("10.0.0.1:http", "not an integer"),
            ("10.0.0.1:70000", "not an integer"),
            ("0.0.0.0:29500", "unspecified"),
            (":::29500", "unspecified"),
        ] {
            let e = parse_comm_id(v).unwrap_err();
            assert!(e.reason.contains(why) && e.value == v, "{v}: {e}");
        }
    }
}
