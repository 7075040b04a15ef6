//! `HCCL_COMM_ID`, the vendor library's bootstrap variable (`habana_api.md` §1 and §6), parsed
//! as the library parses it: the value is split at its **last** `:`; the right part is the port,
//! the left part a bare address (IPv4, IPv6 without brackets, or a host name, resolved). So
//! `::1:29576` is IPv6 loopback port 29576, and the bracketed URL form `[::1]:29575` is refused
//! (the library would read `[::1]` as a host name); the refusal gives the accepted form.
//!
//! Owns: the one parser of the variable, used by the product (`dropcompute::hccl::bootstrap`)
//! and by the mock (`habana-mock`'s `hcclGetUniqueId` and `hcclCommInitRank`), so a CPU test
//! sees what the vendor library would. Must not touch: sockets (only the resolver for host
//! names).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

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

/// Splits `value` as the library does: `(address or host, port)`, split at the last `:`.
///
/// # Errors
/// [`CommIdError`] when there is no `:`, the address part is empty or bracketed (`[::1]`: the
/// message gives the bare form, `::1:PORT`), or the port is not an integer in 1..=65535.
pub fn split_comm_id(value: &str) -> Result<(&str, u16), CommIdError> {
    let bad = |reason: String| CommIdError { value: value.to_string(), reason };
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(bad("expected ADDRESS:PORT (the port after the last ':')".into()));
    };
    if host.starts_with('[') || host.ends_with(']') {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        return Err(bad(format!(
            "the bracketed form is not accepted by the HCCL library (it splits at the last ':' and \
             takes the left part as a bare address): write HCCL_COMM_ID={bare}:{port}"
        )));
    }
    if host.is_empty() {
        return Err(bad("no address before the last ':'".into()));
    }
    match port.parse::<u16>() {
        Ok(0) => Err(bad("port 0 cannot be reached by other ranks".into())),
        Ok(p) => Ok((host, p)),
        Err(_) => Err(bad(format!("port {port:?} (after the last ':') is not an integer in 1..=65535"))),
    }
}

/// Parses and resolves `value` ([`split_comm_id`]): an IP literal as is, a host name through
/// the system resolver (IPv4 results preferred, as a host's first address).
///
/// # Errors
/// As [`split_comm_id`]; a host that does not resolve; an unspecified address (`0.0.0.0`,
/// `::`), which other ranks cannot connect to.
pub fn parse_comm_id(value: &str) -> Result<SocketAddr, CommIdError> {
    let bad = |reason: String| CommIdError { value: value.to_string(), reason };
    let (host, port) = split_comm_id(value)?;
    let addr = match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => {
            let all: Vec<SocketAddr> = (host, port)
                .to_socket_addrs()
                .map_err(|e| bad(format!("host {host:?} does not resolve: {e}")))?
                .collect();
            all.iter()
                .find(|a| a.is_ipv4())
                .or(all.first())
                .copied()
                .ok_or_else(|| bad(format!("host {host:?} resolves to no address")))?
        }
    };
    if addr.ip().is_unspecified() {
        return Err(bad("an unspecified address cannot be reached: give rank 0's host address".into()));
    }
    Ok(addr)
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
            (":29500", "no address"),
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
