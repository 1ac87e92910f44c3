//! What counts as "this host": loopback addresses, IPv4-mapped ones included (a dual-stack
//! socket reports `::ffff:127.0.0.1` for an IPv4 loopback peer), and loopback browser origins.

use std::net::IpAddr;

/// Loopback, including the IPv4-mapped form `::ffff:127.0.0.0/104`.
pub fn is_loopback_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// A host name or address (no port) that is this host.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    // The names nearly every request carries (the quick start's `127.0.0.1`, and `localhost`)
    // answered before the address parser: on a request's `Host` line, parsing
    // `127.0.0.1` as an address cost about 300 instructions (valgrind), the check in all
    // about 450 of a request's 38,000.
    if host == "127.0.0.1" || host == "::1" || host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<IpAddr>().is_ok_and(is_loopback_ip)
}

/// A browser `Origin` (`scheme://host[:port]`) served from this host. `null` and anything
/// unparseable are not.
pub fn is_loopback_origin(origin: &str) -> bool {
    let Some((_, rest)) = origin.trim().split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = if authority.starts_with('[') {
        authority.split(']').next().map(|h| format!("{h}]"))
    } else {
        Some(
            authority
                .rsplit_once(':')
                .map_or(authority, |(h, _)| h)
                .to_string(),
        )
    };
    host.is_some_and(|h| is_loopback_host(&h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_loopback_is_loopback() {
        for ip in ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.3.2.1"] {
            assert!(
                is_loopback_ip(ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))),
                "{ip}"
            );
        }
        for ip in ["10.0.0.1", "::ffff:10.0.0.1", "0.0.0.0", "::"] {
            assert!(
                !is_loopback_ip(ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))),
                "{ip}"
            );
        }
    }

    #[test]
    fn loopback_host_names_pass_and_look_alikes_do_not() {
        for h in [
            "127.0.0.1",
            "::1",
            "[::1]",
            "localhost",
            "LocalHost",
            "127.0.0.2",
            "::ffff:127.0.0.1",
            "0:0:0:0:0:0:0:1",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "127.0.0.1.evil.example",
            "127.0.0.1 ",
            "1127.0.0.1",
            "::2",
            "localhost.evil.example",
            "10.0.0.1",
            "",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn only_loopback_origins_pass() {
        for o in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://[::1]:8443",
            "http://[::ffff:127.0.0.1]:80",
        ] {
            assert!(is_loopback_origin(o), "{o}");
        }
        for o in [
            "https://evil.example",
            "null",
            "",
            "http://127.0.0.1.evil.example",
            "file://",
        ] {
            assert!(!is_loopback_origin(o), "{o}");
        }
    }
}
