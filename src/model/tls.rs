//! The process's TLS client configuration: the platform's root certificates are read and
//! parsed once, on first use, and every HTTP client of the agent (notification sinks, image
//! registries, `url()` fetches, git over https, the CLI's calls to an agent) shares them.
//!
//! Left to itself each reqwest client builds its own verifier, and on Linux that reads and
//! parses every certificate of the system's bundle and of `SSL_CERT_DIR` (a few hundred) and
//! keeps its own copy: once per client, and once per git fetch over https. Here it is once
//! per process, and one copy in memory.
//!
//! The cryptography is ring's (`rustls::crypto::ring`), installed as the process default
//! here too: reqwest is built without a provider of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;

/// The shared configuration, or why the platform's roots could not be loaded.
static SHARED: OnceLock<Result<ClientConfig, TlsError>> = OnceLock::new();

/// How many times the shared configuration was built (once per process; read by a test).
static SHARED_BUILDS: AtomicUsize = AtomicUsize::new(0);

/// Why no TLS client configuration was built. The rustls error is kept, and its text is part
/// of the message; it is not also a `source`, so a chain printed with `{:#}` says it once.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TlsError {
    #[error("cannot load the system's root certificates: {0}")]
    Roots(rustls::Error),
    #[error("cannot configure TLS: {0}")]
    Configure(rustls::Error),
}

/// The process's crypto provider (ring), installed as rustls' default when none is.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // An error means a default is installed already (by `main`, or a racing first call).
    let _ = rustls::crypto::ring::default_provider().install_default();
    rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// A configuration verifying servers against the platform's roots and `extra`.
fn build(extra: Vec<CertificateDer<'static>>) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra, Arc::clone(&provider))
            .map_err(TlsError::Roots)?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Configure)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The shared client configuration (a clone: the verifier and its roots are shared). For
/// `reqwest::ClientBuilder::tls_backend_preconfigured`.
pub fn client_config() -> Result<ClientConfig, TlsError> {
    SHARED
        .get_or_init(|| {
            SHARED_BUILDS.fetch_add(1, Ordering::Relaxed);
            build(Vec::new())
        })
        .clone()
}

/// A configuration that trusts no server: for a client that never speaks TLS (the engine's
/// unix socket, `runtime::docker_api`), which reqwest still wants one for. No roots are read.
pub fn without_roots() -> Result<ClientConfig, TlsError> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Configure)?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// A configuration trusting `extra` (a source's `ca_file`) beside the platform's roots. Built
/// per call: only sources with their own CA use it.
pub fn client_config_trusting(
    extra: Vec<CertificateDer<'static>>,
) -> Result<ClientConfig, TlsError> {
    if extra.is_empty() {
        return client_config();
    }
    build(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platform_roots_are_loaded_once_per_process() -> Result<(), TlsError> {
        let config = client_config()?;
        client_config()?;
        assert_eq!(SHARED_BUILDS.load(Ordering::Relaxed), 1);
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        Ok(())
    }
}
