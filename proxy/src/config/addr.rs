//! Socket addresses in HAProxy's `bind` and `server` notation.
//!
//! Owns turning `ADDR:PORT` text into [`SocketAddr`]s. Accepted forms:
//! `1.2.3.4:80`, `[::1]:80`, `:::80` (the last colon separates the port),
//! `*:80` and `:80` (all IPv4 addresses), `ipv4@`/`ipv6@` prefixes, and host
//! names resolved once at load time (first answer wins, as HAProxy's libc
//! resolution does). UNIX sockets and other address families are refused:
//! shunt is TCP only. Errors are plain phrases; the caller adds the keyword.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// Largest `bind` port range (`8000-8099`) expanded into individual listeners:
/// each is a socket, so a typo like `1-65535` must not open thousands of them.
pub const MAX_BIND_PORT_RANGE: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Any,
    V4,
    V6,
}

/// Parses one address. `allow_range` permits `PORT1-PORT2` (bind only).
pub fn parse_addr(text: &str, allow_range: bool) -> Result<Vec<SocketAddr>, String> {
    let (family, rest) = if let Some(r) = text.strip_prefix("ipv4@") {
        (Family::V4, r)
    } else if let Some(r) = text.strip_prefix("ipv6@") {
        (Family::V6, r)
    } else if text.starts_with('/') || text.starts_with("unix@") || text.starts_with("abns@") {
        return Err(format!(
            "UNIX sockets are not supported by shunt (got '{text}')"
        ));
    } else if let Some((proto, _)) = text.split_once('@') {
        return Err(format!(
            "address family '{proto}@' is not supported by shunt (got '{text}')"
        ));
    } else {
        (Family::Any, text)
    };

    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let Some((host, after)) = inner.split_once(']') else {
            return Err(format!("invalid address '{text}' (missing ']')"));
        };
        let Some(port) = after.strip_prefix(':') else {
            return Err(format!("missing port specification in '{text}'"));
        };
        (host, port)
    } else {
        match rest.rsplit_once(':') {
            Some(hp) => hp,
            None => return Err(format!("missing port specification in '{text}'")),
        }
    };

    let ip = parse_host(host, family, text)?;
    let ports = parse_ports(port, allow_range, text)?;
    Ok(ports.into_iter().map(|p| SocketAddr::new(ip, p)).collect())
}

fn parse_host(host: &str, family: Family, text: &str) -> Result<IpAddr, String> {
    if host.is_empty() || host == "*" {
        return Ok(match family {
            Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            Family::Any | Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        });
    }
    let wanted = |ip: &IpAddr| match family {
        Family::Any => true,
        Family::V4 => ip.is_ipv4(),
        Family::V6 => ip.is_ipv6(),
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        if !wanted(&ip) {
            return Err(format!("address family mismatch in '{text}'"));
        }
        return Ok(ip);
    }
    let resolved = (host, 0u16)
        .to_socket_addrs()
        .map_err(|_| format!("could not resolve address '{host}'"))?;
    resolved
        .map(|sa| sa.ip())
        .find(wanted)
        .ok_or_else(|| format!("could not resolve address '{host}'"))
}

fn parse_one_port(p: &str) -> Result<u16, String> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid port '{p}'"));
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("invalid port '{p}'")),
        Ok(n) => Ok(n),
    }
}

fn parse_ports(port: &str, allow_range: bool, text: &str) -> Result<Vec<u16>, String> {
    if port.is_empty() {
        return Err(format!("missing port specification in '{text}'"));
    }
    if port.starts_with('+') || port.starts_with('-') {
        return Err(format!(
            "port offsets are not supported by shunt (got '{text}')"
        ));
    }
    match port.split_once('-') {
        None => Ok(vec![parse_one_port(port)?]),
        Some(_) if !allow_range => Err(format!("port ranges are not allowed here (got '{text}')")),
        Some((lo, hi)) => {
            let (lo, hi) = (parse_one_port(lo)?, parse_one_port(hi)?);
            if lo > hi {
                return Err(format!("invalid port range '{port}'"));
            }
            let count = usize::from(hi - lo) + 1;
            if count > MAX_BIND_PORT_RANGE {
                return Err(format!(
                    "port range '{port}' spans {count} ports, more than {MAX_BIND_PORT_RANGE}"
                ));
            }
            Ok((lo..=hi).collect())
        }
    }
}
