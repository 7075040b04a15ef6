//! The one host/port grammar of every address variable the product reads: `HCCL_COMM_ID`
//! ([`crate::comm_id`]), `DROPCOMPUTE_RENDEZVOUS` and `MASTER_ADDR` + `MASTER_PORT`
//! (`dropcompute::hccl::bootstrap`). One splitter ([`split_host_port`]), one port rule
//! ([`parse_port`]) and one resolver ([`resolve`]); the variables differ only in the
//! [`Convention`] they pass, which decides the one ambiguous spelling, a bare IPv6 address
//! followed by a port (`::1:29500`):
//!
//! | form | [`Convention::Uri`] (`DROPCOMPUTE_RENDEZVOUS`, `MASTER_ADDR`) | [`Convention::Vendor`] (`HCCL_COMM_ID`) |
//! |---|---|---|
//! | `host`, `10.0.0.1` | host, no port | refused: no port |
//! | `host:29500`, `10.0.0.1:29500` | host and port | host and port |
//! | `[::1]:29500` | `::1`, port 29500 | refused, the message gives `::1:29500` |
//! | `[::1]` | `::1`, no port | refused |
//! | `::1`, `fe80::1:2:3` (bare IPv6) | the whole value is the address, no port | split at the last `:`: `fe80::1:2:3` is `fe80::1:2` port 3 (`::1` leaves the address `:`, which does not resolve) |
//! | `::1:29500` | refused: not an IPv6 address; the message gives `[::1]:29500` | `::1`, port 29500 |
//! | `::1:4000` (also a valid IPv6 address) | the address `::1:4000`, no port (`DROPCOMPUTE_RENDEZVOUS`, which needs a port, names both `[::1]:4000` and `[::1:4000]:PORT`) | `::1`, port 4000 |
//!
//! The vendor convention is the HCCL library's own (it splits `HCCL_COMM_ID` at its last `:`
//! and reads the left part as a bare address: `/work/shared/reference/habana_api.md` §1, §6), so
//! a value that works on the CPU mock works on Gaudi. Where ours is wider than the vendor's: a
//! host name is resolved (the vendor documents `IP:PORT`). The URI convention is RFC 3986's
//! (brackets around an IPv6 literal followed by a port).
//!
//! Owns: the grammar, the port range, resolution (IPv4 preferred, unspecified refused). Must
//! not touch: sockets other than the system resolver.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// How a value with several `:` and no brackets is read (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convention {
    /// RFC 3986: an IPv6 literal followed by a port needs brackets (`[::1]:29500`); a bare
    /// IPv6 address is the whole value (no port). `DROPCOMPUTE_RENDEZVOUS`, `MASTER_ADDR`.
    Uri,
    /// The HCCL library's: split at the last `:`, the left part a bare address; brackets
    /// refused (the library would take `[::1]` as a host name). `HCCL_COMM_ID`.
    Vendor,
}

/// A value split into its host (an IP literal without brackets, or a host name) and its port
/// text, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPort<'a> {
    /// The host: an IPv4 or IPv6 literal (without brackets) or a host name; never empty.
    pub host: &'a str,
    /// The text after the separating `:`, not yet checked ([`parse_port`]).
    pub port: Option<&'a str>,
}

/// Splits `value` into host and optional port by `convention` (the module table). The
/// reason, when refused, names the form expected and, for a spelling of the other convention,
/// the accepted one.
///
/// # Errors
/// The reason (a sentence without the value; callers add the variable and value): an empty
/// host, a bracket that does not enclose an IPv6 literal, text after `]` other than `:PORT`,
/// whitespace, brackets under [`Convention::Vendor`], or an unbracketed value with several `:`
/// that is no IPv6 address under [`Convention::Uri`].
pub fn split_host_port(value: &str, convention: Convention) -> Result<HostPort<'_>, String> {
    if value.chars().any(char::is_whitespace) {
        return Err("contains whitespace".into());
    }
    if let Some(rest) = value.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Err("'[' without its ']': expected [IPv6] or [IPv6]:PORT".into());
        };
        if inside.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{inside:?} in brackets is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected :PORT after ']'")?),
        };
        if convention == Convention::Vendor {
            let spelled = port.map_or(inside.to_string(), |p| format!("{inside}:{p}"));
            return Err(format!(
                "the bracketed form is not accepted by the HCCL library (it splits at the last ':' and \
                 takes the left part as a bare address): write HCCL_COMM_ID={spelled}"
            ));
        }
        return Ok(HostPort { host: inside, port });
    }
    if value.contains(['[', ']']) {
        return Err("a bracket is only allowed around an IPv6 address: [IPv6] or [IPv6]:PORT".into());
    }
    let colons = value.matches(':').count();
    let (host, port) = match (convention, colons) {
        (_, 0) => (value, None),
        (Convention::Uri, 1) | (Convention::Vendor, _) => {
            let (h, p) = value.rsplit_once(':').unwrap_or((value, ""));
            (h, Some(p))
        }
        (Convention::Uri, _) => {
            if value.parse::<Ipv6Addr>().is_err() {
                let hint = value.rsplit_once(':').map_or(String::new(), |(h, p)| format!(": write [{h}]:{p}"));
                return Err(format!("not an IPv6 address; an IPv6 address followed by a port needs brackets{hint}"));
            }
            (value, None)
        }
    };
    if host.is_empty() {
        return Err("no host before the ':'".into());
    }
    Ok(HostPort { host, port })
}

/// Parses a port: an integer in 1..=65535 (port 0 cannot be reached by other ranks).
///
/// # Errors
/// The reason, naming the text.
pub fn parse_port(text: &str) -> Result<u16, String> {
    match text.trim().parse::<u16>() {
        Ok(0) => Err("port 0 cannot be reached by other ranks".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("port {text:?} is not an integer in 1..=65535")),
    }
}

/// Resolves `host` (an IP literal needs no lookup; a name goes through the system resolver,
/// IPv4 results preferred, as a host's first address) with `port`.
///
/// # Errors
/// The reason: a host that does not resolve or resolves to nothing, or an unspecified address
/// (`0.0.0.0`, `::`), which other ranks cannot connect to.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let all: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (host, port).to_socket_addrs().map_err(|e| format!("host {host:?} does not resolve: {e}"))?.collect(),
    };
    let addr = all
        .iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("host {host:?} resolves to no address"))?;
    if addr.ip().is_unspecified() {
        return Err("an unspecified address cannot be reached: give rank 0's host address".into());
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (value, convention, Ok((host, port)) or a word of the reason)
    #[test]
    fn every_form_under_both_conventions() {
        use Convention::{Uri, Vendor};
        let ok: &[(&str, Convention, &str, Option<&str>)] = &[
            ("host", Uri, "host", None),
            ("10.0.0.1", Uri, "10.0.0.1", None),
            ("host:29500", Uri, "host", Some("29500")),
            ("10.0.0.1:29500", Uri, "10.0.0.1", Some("29500")),
            ("[::1]:29500", Uri, "::1", Some("29500")),
            ("[::1]", Uri, "::1", None),
            ("::1", Uri, "::1", None),
            ("fe80::1:2:3", Uri, "fe80::1:2:3", None),
            ("host:29500", Vendor, "host", Some("29500")),
            ("10.0.0.1:29500", Vendor, "10.0.0.1", Some("29500")),
            ("::1:29500", Vendor, "::1", Some("29500")),
            ("fe80::1:2:3", Vendor, "fe80::1:2", Some("3")),
            ("host", Vendor, "host", None),
            ("host:", Uri, "host", Some("")),
        ];
        for &(v, c, host, port) in ok {
            assert_eq!(split_host_port(v, c), Ok(HostPort { host, port }), "{v} {c:?}");
        }
        let bad: &[(&str, Convention, &str)] = &[
            ("::1:29500", Uri, "[::1]:29500"),
            (":29500", Uri, "no host"),
            (":29500", Vendor, "no host"),
            ("", Uri, "no host"),
            ("[::1]:29500", Vendor, "write HCCL_COMM_ID=::1:29500"),
            ("[::1]", Vendor, "write HCCL_COMM_ID=::1"),
            ("[::1", Uri, "without its ']'"),
            ("[host]:1", Uri, "not an IPv6"),
            ("[::1]x", Uri, ":PORT after"),
            ("a]b", Uri, "bracket"),
            ("ho st:1", Uri, "whitespace"),
        ];
        for &(v, c, why) in bad {
            let e = split_host_port(v, c).unwrap_err();
            assert!(e.contains(why), "{v} {c:?}: {e}");
        }
    }

    #[test]
    fn ports_and_resolution() {
        assert_eq!(parse_port("29500"), Ok(29500));
        for (p, why) in [("0", "port 0"), ("70000", "1..=65535"), ("http", "1..=65535"), ("", "1..=65535")] {
            assert!(parse_port(p).unwrap_err().contains(why), "{p}");
        }
        assert_eq!(resolve("::1", 5).map(|a| a.to_string()), Ok("[::1]:5".into()));
        assert_eq!(resolve("localhost", 7).map(|a| a.to_string()), Ok("127.0.0.1:7".into()));
        assert!(resolve("0.0.0.0", 1).unwrap_err().contains("unspecified"));
        assert!(resolve("::", 1).unwrap_err().contains("unspecified"));
    }
}
