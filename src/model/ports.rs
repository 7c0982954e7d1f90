//! Published ports: voodu's normalised `ip:host:container/proto` strings parsed into one
//! mapping per port (ranges expanded as `docker run -p` does).

/// One published port: `host_ip:host_port:container_port/protocol`, host port optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_ip: String,
    pub host_port: Option<u16>,
    pub container_port: u16,
    pub protocol: String,
}

/// Parses a voodu-normalised port (`ip:host:container[/proto]`, `ip::container`, …) into one
/// mapping per port; ranges (`8000-8010`, on either side) expand as `docker run -p` does.
/// `None` when the text is not a port spec.
pub fn parse_ports(text: &str) -> Option<Vec<PortMapping>> {
    let (address, protocol) = match text.rsplit_once('/') {
        Some((address, protocol)) => (address, protocol.to_ascii_lowercase()),
        None => (text, "tcp".to_owned()),
    };
    if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") {
        return None;
    }
    let (host_ip, rest) = if let Some(stripped) = address.strip_prefix('[') {
        let (ip, rest) = stripped.split_once("]:")?;
        (ip.to_owned(), rest)
    } else {
        match address.matches(':').count() {
            0 | 1 => (String::new(), address),
            _ => {
                let (ip, rest) = address.split_once(':')?;
                (ip.to_owned(), rest)
            }
        }
    };
    let (host, container) = match rest.split_once(':') {
        Some((host, container)) => (host, container),
        None => ("", rest),
    };
    let range = |text: &str| -> Option<(u16, u16)> {
        let (start, end) = match text.split_once('-') {
            Some((start, end)) => (start.parse().ok()?, end.parse().ok()?),
            None => {
                let port = text.parse().ok()?;
                (port, port)
            }
        };
        (start > 0 && start <= end).then_some((start, end))
    };
    let (first, last) = range(container)?;
    let host = if host.is_empty() {
        None
    } else {
        Some(range(host)?)
    };
    if let Some((host_first, host_last)) = host
        && host_last - host_first != last - first
    {
        return None;
    }
    Some(
        (first..=last)
            .map(|container_port| PortMapping {
                host_ip: host_ip.clone(),
                host_port: host.map(|(host_first, _)| host_first + (container_port - first)),
                container_port,
                protocol: protocol.clone(),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_ports_parse() {
        let one = |text: &str| {
            let ports = parse_ports(text).expect("valid");
            assert_eq!(ports.len(), 1, "{text}");
            ports.into_iter().next().expect("one port")
        };
        let port = one("127.0.0.1::80");
        assert_eq!(
            (port.host_ip.as_str(), port.host_port, port.container_port),
            ("127.0.0.1", None, 80)
        );
        let port = one("127.0.0.1:8080:80/udp");
        assert_eq!(
            (port.host_port, port.protocol.as_str()),
            (Some(8080), "udp")
        );
        let port = one("[::1]:81:80");
        assert_eq!((port.host_ip.as_str(), port.host_port), ("::1", Some(81)));
        let range = parse_ports("127.0.0.1:9000-9002:8000-8002").expect("a range");
        let pairs: Vec<(Option<u16>, u16)> = range
            .iter()
            .map(|p| (p.host_port, p.container_port))
            .collect();
        assert_eq!(
            pairs,
            [(Some(9000), 8000), (Some(9001), 8001), (Some(9002), 8002)]
        );
        assert_eq!(
            parse_ports("127.0.0.1::16384-16386/udp").map(|p| p.len()),
            Some(3)
        );
        for bad in [
            "127.0.0.1::http",
            "127.0.0.1:1-3:1-2",
            "127.0.0.1::0",
            "80/icmp",
            "127.0.0.1::5-1",
        ] {
            assert_eq!(parse_ports(bad), None, "{bad}");
        }
    }
}
