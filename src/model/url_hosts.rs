//! Which addresses `url()` may connect to: the host policy's part for fetches (`--allow-url-host`).
//!
//! By default a fetch may not reach this host or its networks: loopback, link-local (the cloud
//! metadata address 169.254.169.254), unspecified, multicast, broadcast and reserved, private
//! (RFC 1918, unique-local IPv6), CGNAT, and the IPv4-mapped, -compatible, NAT64 and 6to4
//! IPv6 forms of those. `--allow-url-host` names a host name, an IP address or a CIDR that may
//! be reached all the same.
//!
//! Invariant: pure. The fetcher (`assets::fetch`) applies these rules to every address it
//! connects to, after resolving names and on every redirect hop; this module only judges.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The parsed `--allow-url-host` entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UrlHosts {
    allowed: Vec<Allowed>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    /// A host name, lower case, without a trailing dot: every address it resolves to.
    Name(String),
    /// An address or a network (canonical: IPv4-mapped IPv6 as IPv4).
    Net { base: IpAddr, prefix: u8 },
}

/// A destination `url()` may not connect to, and what would allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UrlRefusal {
    /// The URL's host as written (a name or an address).
    pub(crate) host: String,
    pub(crate) address: IpAddr,
    /// What the address is: "a loopback address", …
    pub(crate) reason: &'static str,
}

impl fmt::Display for UrlRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            host,
            address,
            reason,
        } = self;
        if show_host(host).parse::<IpAddr>().ok() == Some(*address) {
            // Allowing the canonical form allows every spelling of it.
            write!(
                f,
                "{address} is {reason}; start the agent with --allow-url-host {} to allow it",
                address.to_canonical()
            )
        } else {
            write!(
                f,
                "{host} resolves to {address}, {reason}; start the agent with --allow-url-host {} to allow it",
                show_host(host)
            )
        }
    }
}

impl std::error::Error for UrlRefusal {}

/// An IPv6 literal as a flag value takes no brackets.
fn show_host(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .unwrap_or(host)
}

impl UrlHosts {
    /// Parses `--allow-url-host` entries: `example.org`, `10.1.2.3`, `::1`, `[::1]`,
    /// `10.0.0.0/8`, `fd00::/8`.
    pub(crate) fn parse(entries: &[String]) -> Result<UrlHosts, UrlHostError> {
        let allowed = entries
            .iter()
            .map(|entry| parse_entry(entry))
            .collect::<Result<_, _>>()?;
        Ok(UrlHosts { allowed })
    }

    /// Whether `host` (a URL's host name) is allowed by name.
    pub(crate) fn allows_name(&self, host: &str) -> bool {
        let host = normalise_name(host);
        self.allowed
            .iter()
            .any(|allowed| matches!(allowed, Allowed::Name(name) if *name == host))
    }

    /// Why `url()` may not connect to `address` for the URL host `host`, if it may not.
    pub(crate) fn refusal(&self, host: &str, address: IpAddr) -> Option<UrlRefusal> {
        if self.allows_name(host) {
            return None;
        }
        let canonical = address.to_canonical();
        let in_allowed_net = self.allowed.iter().any(|allowed| match allowed {
            Allowed::Net { base, prefix } => contains(*base, *prefix, canonical),
            Allowed::Name(_) => false,
        });
        if in_allowed_net {
            return None;
        }
        classify(address).map(|reason| UrlRefusal {
            host: host.to_owned(),
            address,
            reason,
        })
    }
}

fn normalise_name(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// An `--allow-url-host` entry that is not a host name, an IP address or a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--allow-url-host {entry:?} is not a host name, an IP address or a CIDR (10.0.0.0/8)")]
pub struct UrlHostError {
    entry: String,
}

fn parse_entry(entry: &str) -> Result<Allowed, UrlHostError> {
    let text = entry.trim();
    let bad = || UrlHostError {
        entry: entry.to_owned(),
    };
    if let Some((address, prefix)) = text.split_once('/') {
        let base: IpAddr = show_host(address).parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let width = if base.is_ipv4() { 32 } else { 128 };
        if prefix > width {
            return Err(bad());
        }
        // An IPv4-mapped network is written for IPv4 addresses: keep it as one.
        let (base, prefix) = match base {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() && prefix >= 96 => {
                (base.to_canonical(), prefix - 96)
            }
            _ => (base, prefix),
        };
        return Ok(Allowed::Net { base, prefix });
    }
    if let Ok(address) = show_host(text).parse::<IpAddr>() {
        let address = address.to_canonical();
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        return Ok(Allowed::Net {
            base: address,
            prefix,
        });
    }
    let name = normalise_name(text);
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if valid {
        Ok(Allowed::Name(name))
    } else {
        Err(bad())
    }
}

/// Whether `address` lies in `base/prefix` (both canonical).
fn contains(base: IpAddr, prefix: u8, address: IpAddr) -> bool {
    match (base, address) {
        (IpAddr::V4(base), IpAddr::V4(address)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(base) & mask == u32::from(address) & mask
        }
        (IpAddr::V6(base), IpAddr::V6(address)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(base) & mask == u128::from(address) & mask
        }
        _ => false,
    }
}

/// Whether `address` is link-local (169.254.0.0/16 where cloud metadata services answer,
/// fe80::/10), in any IPv6 form of it: what image registry scans never reach, allowed or not.
pub(crate) fn is_link_local(address: IpAddr) -> bool {
    matches!(classify(address), Some(LINK_LOCAL_V4 | LINK_LOCAL_V6))
}

const LINK_LOCAL_V4: &str = "a link-local address (where cloud metadata services answer)";
const LINK_LOCAL_V6: &str = "a link-local address";

/// What `address` is when `url()` may not reach it by default; `None` for a public address.
fn classify(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = address.octets();
    Some(match (a, b) {
        (127, _) => "a loopback address",
        (0, _) => "an unspecified address (0.0.0.0/8)",
        (169, 254) => LINK_LOCAL_V4,
        (10, _) | (192, 168) => "a private address",
        (172, 16..=31) => "a private address",
        (100, 64..=127) => "a shared (CGNAT, 100.64.0.0/10) address",
        (224..=239, _) => "a multicast address",
        _ if address.is_broadcast() => "the broadcast address",
        (240..=255, _) => "a reserved address",
        _ => return None,
    })
}

fn classify_v6(address: Ipv6Addr) -> Option<&'static str> {
    if address.is_loopback() {
        return Some("a loopback address");
    }
    if address.is_unspecified() {
        return Some("an unspecified address");
    }
    let segments = address.segments();
    let octets = address.octets();
    let embedded =
        |at: usize| Ipv4Addr::new(octets[at], octets[at + 1], octets[at + 2], octets[at + 3]);
    // IPv4-mapped (::ffff:a.b.c.d) and -compatible (::a.b.c.d) forms reach the IPv4 address.
    if let Some(v4) = address.to_ipv4() {
        return classify_v4(v4);
    }
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address a gateway reaches.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return classify_v4(embedded(12));
    }
    if segments[0] == 0x2002 {
        return classify_v4(embedded(2));
    }
    Some(match segments[0] {
        0xfe80..=0xfebf => LINK_LOCAL_V6,
        0xfec0..=0xfeff => "a site-local address",
        0xfc00..=0xfdff => "a private (unique-local) address",
        0xff00..=0xffff => "a multicast address",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(allowed: &[&str], host: &str, address: &str) -> Result<String, String> {
        let entries: Vec<String> = allowed.iter().map(|entry| (*entry).to_owned()).collect();
        let hosts = UrlHosts::parse(&entries).map_err(|error| error.to_string())?;
        let address: IpAddr = address.parse().map_err(|_| format!("{address}?"))?;
        Ok(hosts
            .refusal(host, address)
            .map_or_else(|| "allowed".to_owned(), |refusal| refusal.to_string()))
    }

    #[test]
    fn internal_addresses_are_refused_by_default() -> Result<(), String> {
        for (address, reason) in [
            ("127.0.0.1", "a loopback address"),
            ("127.255.0.9", "a loopback address"),
            ("::1", "a loopback address"),
            ("0.0.0.0", "an unspecified address (0.0.0.0/8)"),
            ("::", "an unspecified address"),
            (
                "169.254.169.254",
                "a link-local address (where cloud metadata services answer)",
            ),
            ("fe80::1", "a link-local address"),
            ("10.255.255.1", "a private address"),
            ("172.16.0.1", "a private address"),
            ("172.31.255.255", "a private address"),
            ("192.168.1.1", "a private address"),
            ("fd12::1", "a private (unique-local) address"),
            ("100.64.0.1", "a shared (CGNAT, 100.64.0.0/10) address"),
            ("100.127.255.254", "a shared (CGNAT, 100.64.0.0/10) address"),
            ("224.0.0.1", "a multicast address"),
            ("ff02::1", "a multicast address"),
            ("255.255.255.255", "the broadcast address"),
            ("240.0.0.1", "a reserved address"),
            ("::ffff:127.0.0.1", "a loopback address"),
            (
                "::ffff:169.254.169.254",
                "a link-local address (where cloud metadata services answer)",
            ),
            ("::10.0.0.1", "a private address"),
            ("64:ff9b::7f00:1", "a loopback address"),
            (
                "2002:a9fe:a9fe::1",
                "a link-local address (where cloud metadata services answer)",
            ),
        ] {
            let parsed = address.parse::<IpAddr>().map_err(|_| address)?;
            let canonical = parsed.to_canonical();
            assert_eq!(
                refusal(&[], address, address)?,
                format!(
                    "{parsed} is {reason}; start the agent with --allow-url-host {canonical} to allow it"
                ),
            );
        }
        for public in [
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "8.8.8.8",
        ] {
            assert_eq!(refusal(&[], public, public)?, "allowed", "{public}");
        }
        Ok(())
    }

    #[test]
    fn a_name_is_judged_by_what_it_resolves_to() -> Result<(), String> {
        assert_eq!(
            refusal(&[], "localhost", "127.0.0.1")?,
            "localhost resolves to 127.0.0.1, a loopback address; start the agent with --allow-url-host localhost to allow it"
        );
        assert_eq!(
            refusal(&[], "[::1]", "::1")?,
            "::1 is a loopback address; start the agent with --allow-url-host ::1 to allow it"
        );
        Ok(())
    }

    #[test]
    fn the_allow_setting_names_hosts_addresses_and_networks() -> Result<(), String> {
        assert_eq!(
            refusal(&["LocalHost."], "localhost", "127.0.0.1")?,
            "allowed"
        );
        assert_eq!(
            refusal(&["127.0.0.1"], "127.0.0.1", "127.0.0.1")?,
            "allowed"
        );
        assert_eq!(refusal(&["127.0.0.1"], "x", "::ffff:127.0.0.1")?, "allowed");
        assert_eq!(refusal(&["[::1]"], "::1", "::1")?, "allowed");
        assert_eq!(refusal(&["10.0.0.0/8"], "h", "10.9.8.7")?, "allowed");
        assert_eq!(
            refusal(&["::ffff:10.0.0.0/104"], "h", "10.9.8.7")?,
            "allowed"
        );
        assert_eq!(refusal(&["fd00::/8"], "h", "fd12::1")?, "allowed");
        // Allowing one thing allows nothing else.
        assert_ne!(
            refusal(&["127.0.0.1"], "127.0.0.2", "127.0.0.2")?,
            "allowed"
        );
        assert_ne!(refusal(&["10.0.0.0/16"], "h", "10.1.0.1")?, "allowed");
        assert_ne!(refusal(&["localhost"], "other", "127.0.0.1")?, "allowed");
        assert_ne!(
            refusal(&["example.org"], "h", "169.254.169.254")?,
            "allowed"
        );
        for bad in ["", "http://x", "10.0.0.0/33", "a b", "host:80", "1.2.3.4/x"] {
            let error = UrlHosts::parse(&[bad.to_owned()]).err().ok_or(bad)?;
            assert!(
                error.to_string().contains("is not a host name"),
                "{bad}: {error}"
            );
        }
        Ok(())
    }
}
