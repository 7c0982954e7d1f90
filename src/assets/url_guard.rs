//! Where the `url()` host rules (`manifest::UrlHosts`, `--allow-url-host`) are enforced: on
//! the addresses the fetcher actually connects to.
//!
//! Invariants: a URL whose host is an address is judged before any request (such hosts never
//! reach a resolver); a host name is judged on every address it resolves to, inside the
//! client's resolver, so the connector only ever sees judged addresses (one refused address
//! refuses the name: a name that answers both public and internal addresses is how DNS
//! rebinding reaches inside); every redirect hop is judged the same way, and at most
//! `MAX_REDIRECTS` are followed. The agent's own HTTP address (`--listen`) is refused whatever
//! is allowed.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::sync::Arc;

use reqwest::Url;

use crate::manifest::UrlHosts;

/// Redirects one fetch follows at most.
const MAX_REDIRECTS: usize = 10;

/// Where the other requests a manifest causes may connect (`on_deploy` webhooks): the same
/// rules as `url()` (`--allow-url-host`; never link-local, never the agent's own HTTP
/// address). The default allows no internal address.
#[derive(Debug, Clone)]
pub struct Outbound {
    guard: Arc<Guard>,
}

impl Default for Outbound {
    fn default() -> Outbound {
        Outbound {
            guard: Arc::new(Guard {
                never_link_local: true,
                ..Guard::default()
            }),
        }
    }
}

/// `--allow-url-host` entries that do not parse (the message names the entry).
pub type HostsError = crate::model::url_hosts::UrlHostError;

/// Why no guarded HTTP client was built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The TLS configuration (the platform's roots, `model::tls`) could not be built.
    #[error(transparent)]
    Tls(crate::model::tls::TlsError),
    #[error("cannot build an HTTP client: {0}")]
    Build(#[source] Arc<reqwest::Error>),
}

impl ClientError {
    /// The shared TLS configuration of every guarded client.
    pub(super) fn tls() -> Result<rustls::ClientConfig, ClientError> {
        crate::model::tls::client_config().map_err(ClientError::Tls)
    }

    pub(super) fn build(error: reqwest::Error) -> ClientError {
        ClientError::Build(Arc::new(error))
    }
}

/// The URL parser's error (`url::ParseError`, which reqwest does not re-export).
type UrlParseError = <Url as std::str::FromStr>::Err;

/// Why nothing may be sent to a URL.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckError {
    #[error("{url:?} is not a URL: {source}")]
    NotUrl {
        url: String,
        #[source]
        source: UrlParseError,
    },
    #[error("{0}")]
    Refused(#[source] Refused),
}

impl Outbound {
    /// Requests may reach what `allow_url_host` allows, never `own_address` (`--listen`).
    pub fn new(
        allow_url_host: &[String],
        own_address: Option<SocketAddr>,
    ) -> Result<Outbound, HostsError> {
        Ok(Outbound {
            guard: Arc::new(Guard::never_link_local(allow_url_host, own_address)?),
        })
    }

    /// A client that connects only where allowed: an address host judged before the request
    /// (`check`), a name judged on every address it resolves to, every redirect hop judged.
    pub(crate) fn client(
        &self,
        timeout: std::time::Duration,
    ) -> Result<reqwest::Client, ClientError> {
        reqwest::Client::builder()
            .tls_backend_preconfigured(ClientError::tls()?)
            .timeout(timeout)
            .connect_timeout(timeout)
            .dns_resolver(Arc::new(GuardedResolver(Arc::clone(&self.guard))))
            .redirect(redirect_policy(Arc::clone(&self.guard)))
            .build()
            .map_err(ClientError::build)
    }

    /// Why nothing may be sent to `url`, judged before any connection: its scheme, and its
    /// host when that is an address.
    pub(crate) fn check(&self, url: &str) -> Result<(), CheckError> {
        let parsed = Url::parse(url).map_err(|source| CheckError::NotUrl {
            url: url.to_owned(),
            source,
        })?;
        self.guard.check_url(&parsed).map_err(CheckError::Refused)
    }

    /// The refusal in `error`'s causes, when a request failed on one (a name resolving to a
    /// refused address, a redirect to one).
    pub(crate) fn refusal(error: &(dyn std::error::Error + 'static)) -> Option<String> {
        refusal_in(error).map(|refused| refused.0)
    }
}

/// The rules and the agent's own address.
#[derive(Debug, Default)]
pub(super) struct Guard {
    pub(super) hosts: UrlHosts,
    /// Where the agent's HTTP side listens (`--listen`), when it does.
    pub(super) own_address: Option<SocketAddr>,
    /// Refuse link-local addresses even when `hosts` allows them (image registry scans: no
    /// registry answers where cloud metadata services do).
    pub(super) never_link_local: bool,
}

/// Why a destination is refused: a policy refusal, never a network failure (so never stands
/// in for a cached copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub(super) String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl Guard {
    /// The rule of requests a manifest causes beside `url()` (`on_deploy` webhooks, registry
    /// scans): what `allow_url_host` allows, never link-local, never `own_address`.
    pub(super) fn never_link_local(
        allow_url_host: &[String],
        own_address: Option<SocketAddr>,
    ) -> Result<Guard, HostsError> {
        Ok(Guard {
            hosts: UrlHosts::parse(allow_url_host)?,
            own_address,
            never_link_local: true,
        })
    }

    /// Judges `url` before anything connects to it: its scheme, its host when that is an
    /// address, and whether it is the agent's own address.
    pub(super) fn check_url(&self, url: &Url) -> Result<(), Refused> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refused(format!(
                "{url}: only http:// and https:// URLs can be fetched"
            )));
        }
        let port = url.port_or_known_default().unwrap_or(0);
        let host_text = url.host_str().unwrap_or_default();
        // The URL parser writes an address host in its one canonical form (IPv4 dotted, IPv6
        // in brackets), whatever spelling the manifest used.
        let literal = host_text
            .strip_prefix('[')
            .and_then(|inner| inner.strip_suffix(']'))
            .unwrap_or(host_text)
            .parse::<IpAddr>();
        let address = match literal {
            Ok(address) => address,
            Err(_) if host_text.is_empty() => return Err(Refused(format!("{url} has no host"))),
            Err(_) => {
                // The resolver does not see the port: a name on the agent's own port is looked
                // up here for this one check (the resolver still judges what it connects to).
                if let Some(own) = self.own_address
                    && own.port() == port
                    && let Ok(addresses) = (host_text, port).to_socket_addrs()
                {
                    for address in addresses {
                        self.check_own(host_text, address)?;
                    }
                }
                return Ok(());
            }
        };
        self.check_own(host_text, SocketAddr::new(address, port))?;
        self.check_link_local(host_text, address)?;
        match self.hosts.refusal(host_text, address) {
            Some(refusal) => Err(Refused(refusal.to_string())),
            None => Ok(()),
        }
    }

    /// Judges the addresses the name `host` resolved to: all must be allowed.
    pub(super) fn check_resolved(
        &self,
        host: &str,
        addresses: &[SocketAddr],
    ) -> Result<(), Refused> {
        for address in addresses {
            self.check_link_local(host, address.ip())?;
            if let Some(refusal) = self.hosts.refusal(host, address.ip()) {
                return Err(Refused(refusal.to_string()));
            }
        }
        Ok(())
    }

    /// With `never_link_local`, refuses a link-local address whatever `hosts` allows.
    fn check_link_local(&self, host: &str, address: IpAddr) -> Result<(), Refused> {
        if self.never_link_local && crate::model::url_hosts::is_link_local(address) {
            return Err(Refused(format!(
                "{host} ({address}) is a link-local address (where cloud metadata services answer): never contacted as an image registry"
            )));
        }
        Ok(())
    }

    /// Refuses the agent's own HTTP address (a listener on every address is reached through
    /// any address of this host).
    fn check_own(&self, host: &str, address: SocketAddr) -> Result<(), Refused> {
        let Some(own) = self.own_address else {
            return Ok(());
        };
        if address.port() != own.port() {
            return Ok(());
        }
        let ip = address.ip().to_canonical();
        let own_ip = own.ip().to_canonical();
        let own = ip == own_ip
            // Linux delivers a connect to 0.0.0.0 to a local listener.
            || ip.is_unspecified()
            || (own_ip.is_unspecified() && (ip.is_loopback() || is_local(ip)));
        if own {
            return Err(Refused(format!(
                "{host} ({address}) is the agent's own HTTP address (--listen {})",
                self.own_address
                    .map(|address| address.to_string())
                    .unwrap_or_default()
            )));
        }
        Ok(())
    }
}

/// Whether `ip` is an address of this host: binding a socket to it (which sends nothing)
/// succeeds only then.
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The client's resolver: the system's, keeping only names whose every address is allowed.
pub(super) struct GuardedResolver(pub(super) Arc<Guard>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = Arc::clone(&self.0);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let lookup = host.clone();
            let addresses: Vec<SocketAddr> = tokio::task::spawn_blocking(move || {
                (lookup.as_str(), 0)
                    .to_socket_addrs()
                    .map(Iterator::collect)
            })
            .await??;
            guard.check_resolved(&host, &addresses)?;
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Follows a redirect only to a destination `guard` allows, and at most `MAX_REDIRECTS`.
pub(super) fn redirect_policy(guard: Arc<Guard>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        match guard.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(refused) => attempt.error(refused),
        }
    })
}

/// The refusal somewhere in `error`'s chain of causes, if the request failed on one.
pub(super) fn refusal_in(error: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if let Some(refused) = current.downcast_ref::<Refused>() {
            return Some(refused.clone());
        }
        cause = current.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allowed: &[&str], own: Option<&str>) -> Result<Guard, String> {
        let entries: Vec<String> = allowed.iter().map(|entry| (*entry).to_owned()).collect();
        Ok(Guard {
            hosts: UrlHosts::parse(&entries).map_err(|error| error.to_string())?,
            own_address: own
                .map(|own| own.parse().map_err(|_| format!("{own}?")))
                .transpose()?,
            never_link_local: false,
        })
    }

    fn check(guard: &Guard, url: &str) -> Result<String, String> {
        let url = Url::parse(url).map_err(|error| error.to_string())?;
        Ok(match guard.check_url(&url) {
            Ok(()) => "ok".to_owned(),
            Err(refused) => refused.0,
        })
    }

    /// Address literals are judged before any connection: these tests connect nowhere.
    #[test]
    fn address_literals_are_judged_before_connecting() -> Result<(), String> {
        let deny = guard(&[], None)?;
        for (url, expected) in [
            (
                "http://169.254.169.254/latest/meta-data/",
                "169.254.169.254 is a link-local address (where cloud metadata services answer); start the agent with --allow-url-host 169.254.169.254 to allow it",
            ),
            (
                "http://10.255.255.1/",
                "10.255.255.1 is a private address; start the agent with --allow-url-host 10.255.255.1 to allow it",
            ),
            (
                "http://[::ffff:127.0.0.1]:8080/",
                "::ffff:127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it",
            ),
            // The URL parser reads other spellings of an IPv4 address as that address.
            (
                "http://2130706433/",
                "127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it",
            ),
            (
                "http://0x7f.1/",
                "127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it",
            ),
            ("http://93.184.216.34/", "ok"),
            // Names are judged by the resolver, on what they resolve to.
            ("http://localhost/", "ok"),
        ] {
            assert_eq!(check(&deny, url)?, expected, "{url}");
        }
        let allow = guard(&["127.0.0.1", "10.0.0.0/8"], None)?;
        assert_eq!(check(&allow, "http://127.0.0.1:9/")?, "ok");
        assert_eq!(check(&allow, "http://[::ffff:127.0.0.1]:9/")?, "ok");
        assert_eq!(check(&allow, "http://10.255.255.1/")?, "ok");
        Ok(())
    }

    #[test]
    fn the_agents_own_address_is_refused_even_when_allowed() -> Result<(), String> {
        let own = guard(&["127.0.0.1", "localhost"], Some("127.0.0.1:8687"))?;
        assert_eq!(
            check(&own, "http://127.0.0.1:8687/status")?,
            "127.0.0.1 (127.0.0.1:8687) is the agent's own HTTP address (--listen 127.0.0.1:8687)"
        );
        assert!(check(&own, "http://0.0.0.0:8687/")?.contains("the agent's own HTTP address"));
        assert!(
            check(&own, "http://localhost:8687/")?.contains("the agent's own HTTP address"),
            "a name on the agent's port is looked up"
        );
        assert_eq!(check(&own, "http://127.0.0.1:8688/")?, "ok");
        let everywhere = guard(&["127.0.0.0/8"], Some("0.0.0.0:8687"))?;
        assert!(check(&everywhere, "http://127.0.0.1:8687/")?.contains("own HTTP address"));
        assert_eq!(check(&everywhere, "http://127.0.0.1:8686/")?, "ok");
        Ok(())
    }

    #[test]
    fn names_are_refused_when_any_address_is() -> Result<(), String> {
        let deny = guard(&[], None)?;
        let addresses: Vec<SocketAddr> = ["93.184.216.34:0", "127.0.0.1:0"]
            .iter()
            .map(|text| text.parse().map_err(|_| text.to_string()))
            .collect::<Result<_, _>>()?;
        assert_eq!(
            deny.check_resolved("rebind.example", &addresses),
            Err(Refused("rebind.example resolves to 127.0.0.1, a loopback address; start the agent with --allow-url-host rebind.example to allow it".to_owned()))
        );
        assert_eq!(
            deny.check_resolved("public.example", &addresses[..1]),
            Ok(())
        );
        let by_name = guard(&["rebind.example"], None)?;
        assert_eq!(by_name.check_resolved("rebind.example", &addresses), Ok(()));
        Ok(())
    }
}
