//! TLS termination's rustls side: the acceptor of every `bind ... ssl`
//! listener and the client configuration of every `server ... ssl`, built
//! once at start-up from the certificates the configuration loaded, and the
//! kernel's kTLS status.
//!
//! The health checks' TLS (`check-ssl`) uses the same client configuration
//! as the server's traffic when it has `ssl`, else one built for the checks.
//!
//! Owns: choosing a certificate by SNI (exact name, then a `*.` wildcard of
//! the name's parent, else the line's first certificate, as HAProxy's
//! default certificate), the protocol versions (`ssl-min-ver`), ALPN, and the
//! server-side verification rules (`verify none|required`, `ca-file`).
//! Must not: do I/O on sockets or read files (the configuration read them);
//! the handshakes happen in `session` (and `checks::probe` for the health
//! checks), the forwarding in `handoff::tls`.
//! Invariant: the contexts are indexed as the configuration's frontends ×
//! bind lines and backends × servers, and built from that configuration only,
//! so a reload (a new process) is what picks up new certificate files.
//!
//! kTLS: with the kernel's `tls` ULP a terminated flow's keys go to the
//! kernel after the handshake (`handoff::ktls`). It is detected here at
//! start: the ULP listed in `tcp_available_ulp`, then each AEAD tried on a
//! loopback connection, so that a flow is offloaded only with a cipher the
//! kernel is known to take (an offload that fails after rustls gave up its
//! secrets would cost the flow). Absent, TLS flows are forwarded in
//! userspace; the listeners' configurations allow secret extraction only
//! when kTLS is there.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use crate::config::{BindTls, Config, ServerTls, TlsVersion};
use crate::sys::ktls::{Cipher, Ciphers, CryptoInfo, Direction, Version};

/// Where the kernel lists the upper-layer protocols it can attach to a TCP
/// socket; `tls` is kTLS.
const AVAILABLE_ULP: &str = "/proc/sys/net/ipv4/tcp_available_ulp";

/// Why the TLS contexts could not be built from a loaded configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS settings of {what}: {source}")]
    Rustls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("certificate verifier of {what}: {source}")]
    Verifier {
        what: String,
        #[source]
        source: rustls::client::VerifierBuilderError,
    },
}

/// Whether the kernel can take a TLS flow's records (kTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelTls {
    /// The `tls` ULP took these ciphers (at least one) when probed:
    /// terminated flows with one of them are handed to the kernel.
    Available(Ciphers),
    /// The ULP is listed but refused every cipher (no crypto module):
    /// userspace forwarding.
    NoCiphers,
    /// Not listed (or the list unreadable): userspace forwarding.
    Missing,
}

impl KernelTls {
    /// Probes the kernel's ciphers (attaching the ULP loads a modular `tls`
    /// where shunt may load modules), then reads the ULP list, at start,
    /// before any chroot hides /proc.
    pub fn detect() -> Self {
        let ciphers = probe_ciphers();
        if !ciphers.is_empty() {
            return Self::Available(ciphers);
        }
        match std::fs::read_to_string(AVAILABLE_ULP) {
            Ok(s) if s.split_whitespace().any(|u| u == "tls") => Self::NoCiphers,
            _ => Self::Missing,
        }
    }

    /// The ciphers a flow may be offloaded with (none: no kTLS).
    pub fn ciphers(self) -> Ciphers {
        match self {
            Self::Available(c) => c,
            Self::NoCiphers | Self::Missing => Ciphers::NONE,
        }
    }

    /// `show info`'s `Ktls` field.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Available(_) => "available (TLS flows handed to the kernel)",
            Self::NoCiphers => "tls ULP without usable ciphers (TLS flows forwarded in userspace)",
            Self::Missing => "no tls ULP (TLS flows forwarded in userspace)",
        }
    }
}

/// The AEADs the kernel's TLS takes: each tried (TX and RX keys, zero
/// bytes) on its own loopback connection, since keys go on a socket once.
/// Any failure (no loopback, a cipher's crypto module missing) leaves that
/// cipher out.
fn probe_ciphers() -> Ciphers {
    use std::os::fd::AsFd;
    let Ok(listener) = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)) else {
        return Ciphers::NONE;
    };
    let Ok(addr) = listener.local_addr() else {
        return Ciphers::NONE;
    };
    let mut found = Ciphers::NONE;
    for c in Cipher::ALL {
        let took = || -> std::io::Result<()> {
            let s = std::net::TcpStream::connect(addr)?;
            let _peer = listener.accept()?;
            let key = [0u8; 32];
            let info = CryptoInfo::new(c, Version::Tls13, &key[..c.key_len()], &[0; 12], 0)
                .map_err(std::io::Error::other)?;
            crate::sys::ktls::set_ulp(s.as_fd())?;
            crate::sys::ktls::set_crypto(s.as_fd(), Direction::Tx, &info)?;
            crate::sys::ktls::set_crypto(s.as_fd(), Direction::Rx, &info)
        };
        match took() {
            Ok(()) => found = found.with(c),
            Err(e) => tracing::debug!(cipher = c.name(), error = %e, "kTLS probe: cipher refused"),
        }
    }
    found
}

/// The TLS side of every listener and server of one configuration.
pub struct Contexts {
    /// Per frontend, per bind line: the acceptor of a `ssl` line.
    binds: Vec<Vec<Option<tokio_rustls::TlsAcceptor>>>,
    /// Per backend, per server: the connector of a `ssl` server.
    servers: Vec<Vec<Option<Connector>>>,
    /// Per backend, per server: the connector of its TLS checks, the
    /// traffic's own (one client configuration) when the server has `ssl`.
    checks: Vec<Vec<Option<Connector>>>,
    kernel: KernelTls,
}

/// What a flow needs to open TLS to a server.
#[derive(Clone)]
pub struct Connector {
    pub connector: tokio_rustls::TlsConnector,
    pub settings: Arc<ServerTls>,
}

impl Contexts {
    /// No TLS anywhere (tests, a configuration without `ssl`).
    pub fn none() -> Self {
        Self {
            binds: Vec::new(),
            servers: Vec::new(),
            checks: Vec::new(),
            kernel: KernelTls::Missing,
        }
    }

    /// Builds every context `config` asks for.
    pub fn build(config: &Config, kernel: KernelTls) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut binds = Vec::with_capacity(config.frontends.len());
        for fe in &config.frontends {
            let mut v = Vec::with_capacity(fe.bind_opts.len());
            for (i, b) in fe.bind_opts.iter().enumerate() {
                let what = || format!("frontend '{}' bind #{}", fe.name, i + 1);
                v.push(match &b.tls {
                    Some(t) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                        server_config(t, &provider).map_err(|source| TlsError::Rustls {
                            what: what(),
                            source,
                        })?,
                    ))),
                    None => None,
                });
            }
            binds.push(v);
        }
        let mut servers = Vec::with_capacity(config.backends.len());
        let mut checks = Vec::with_capacity(config.backends.len());
        for be in &config.backends {
            let mut v = Vec::with_capacity(be.servers.len());
            let mut c = Vec::with_capacity(be.servers.len());
            for s in &be.servers {
                let what = || format!("server {}/{}", be.name, s.name);
                let connector = |t: &Arc<ServerTls>| -> Result<Connector, TlsError> {
                    Ok(Connector {
                        connector: tokio_rustls::TlsConnector::from(Arc::new(client_config(
                            t, &provider, &what,
                        )?)),
                        settings: t.clone(),
                    })
                };
                let traffic = s.tls.as_ref().map(connector).transpose()?;
                c.push(match (&s.check_tls, &traffic) {
                    (Some(t), Some(tc)) if Arc::ptr_eq(t, &tc.settings) => Some(tc.clone()),
                    (Some(t), _) => Some(connector(t)?),
                    (None, _) => None,
                });
                v.push(traffic);
            }
            servers.push(v);
            checks.push(c);
        }
        Ok(Self {
            binds,
            servers,
            checks,
            kernel,
        })
    }

    /// Whether any listener or server uses TLS.
    pub fn any(&self) -> bool {
        self.binds.iter().flatten().any(Option::is_some)
            || self.servers.iter().flatten().any(Option::is_some)
    }

    /// The acceptor of bind line `bind` of frontend `fe`, if it is `ssl`.
    pub fn acceptor(&self, fe: usize, bind: usize) -> Option<&tokio_rustls::TlsAcceptor> {
        self.binds.get(fe)?.get(bind)?.as_ref()
    }

    /// The connector of server `srv` of backend `be`, if it is `ssl`.
    pub fn connector(&self, be: usize, srv: usize) -> Option<&Connector> {
        self.servers.get(be)?.get(srv)?.as_ref()
    }

    /// The connector of the TLS checks of server `srv` of backend `be`
    /// (`check-ssl`, a `ssl` server's checks, `tcp-check connect ssl`).
    pub fn check_connector(&self, be: usize, srv: usize) -> Option<&Connector> {
        self.checks.get(be)?.get(srv)?.as_ref()
    }

    pub fn kernel(&self) -> KernelTls {
        self.kernel
    }
}

/// `ssl-min-ver TLSv1.3`: the only version above rustls' floor (1.2).
static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];

/// The protocol versions a minimum allows (rustls has TLS 1.2 and 1.3).
fn versions(min: Option<TlsVersion>) -> &'static [&'static rustls::SupportedProtocolVersion] {
    match min {
        Some(TlsVersion::Tls13) => &TLS13_ONLY,
        _ => rustls::DEFAULT_VERSIONS,
    }
}

/// A `bind ... ssl` line's configuration; its secrets may be extracted,
/// for kTLS or shunt's own records after the handshake.
fn server_config(
    t: &BindTls,
    provider: &Arc<CryptoProvider>,
) -> Result<ServerConfig, rustls::Error> {
    let mut certs = Vec::with_capacity(t.certs.len());
    let mut names = Vec::new();
    for (i, c) in t.certs.iter().enumerate() {
        let key = CertifiedKey::from_der(c.chain.clone(), c.key.clone_key(), provider)?;
        certs.push(Arc::new(key));
        names.extend(c.names.iter().map(|n| (n.clone(), i)));
    }
    let mut cfg = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions(t.min_ver))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(BySni { certs, names }));
    cfg.alpn_protocols = t.alpn.clone();
    // After the handshake the keys go to kTLS or to shunt's own records
    // (`handoff::ktls::offload`).
    cfg.enable_secret_extraction = true;
    Ok(cfg)
}

fn client_config(
    t: &ServerTls,
    provider: &Arc<CryptoProvider>,
    what: &dyn Fn() -> String,
) -> Result<ClientConfig, TlsError> {
    let rustls_err = |source| TlsError::Rustls {
        what: what(),
        source,
    };
    let inner = match t.verify {
        true => {
            let mut roots = RootCertStore::empty();
            for c in &t.roots {
                roots.add(c.clone()).map_err(rustls_err)?;
            }
            let v = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|source| TlsError::Verifier {
                what: what(),
                source,
            })?;
            Some(v)
        }
        false => None,
    };
    let verifier = Arc::new(Verify {
        inner,
        provider: provider.clone(),
    });
    let cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(rustls_err)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(cfg)
}

/// The certificate for a ClientHello's server name: exact, then wildcard,
/// then the first (HAProxy's default certificate).
#[derive(Debug)]
struct BySni {
    certs: Vec<Arc<CertifiedKey>>,
    /// (lower-case name or `*.parent`, index in `certs`), in file order.
    names: Vec<(String, usize)>,
}

impl BySni {
    fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let found = sni.and_then(|name| {
            let name = name.to_ascii_lowercase();
            let exact = self.names.iter().find(|(n, _)| *n == name);
            let wild = || {
                let parent = name.split_once('.')?.1;
                self.names
                    .iter()
                    .find(|(n, _)| n.strip_prefix("*.") == Some(parent))
            };
            exact.or_else(wild).map(|(_, i)| *i)
        });
        self.certs.get(found.unwrap_or(0)).cloned()
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pick(hello.server_name())
    }
}

/// A server's certificate check: `verify none` accepts any certificate
/// (signatures of the handshake are still checked, so the session keys are
/// the server's); `verify required` checks the chain against `ca-file` and,
/// as HAProxy, the name only when an SNI was sent (a server reached by
/// address has no name to match).
#[derive(Debug)]
struct Verify {
    inner: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verify {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(inner) = &self.inner else {
            return Ok(ServerCertVerified::assertion());
        };
        match inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) if matches!(server_name, ServerName::IpAddress(_)) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The server name a `server ... ssl` handshake uses: the `sni` expression's
/// value (`client_sni` is the flow's: the terminated handshake's, or the
/// peeked hello's), else the server's address (then no SNI is sent).
pub fn server_name(
    t: &ServerTls,
    client_sni: Option<&str>,
    addr: std::net::IpAddr,
) -> ServerName<'static> {
    let name = match &t.sni {
        Some(crate::config::SniExpr::Str(s)) => Some(s.as_str()),
        Some(crate::config::SniExpr::Client) => client_sni,
        None => None,
    };
    name.and_then(|n| ServerName::try_from(n.to_string()).ok())
        .unwrap_or(ServerName::IpAddress(addr.into()))
}

/// The server name of a health check's handshake: `check-sni`, else the
/// address (no SNI). As HAProxy, checks never evaluate the server's `sni`
/// expression, which is a flow's.
pub fn check_server_name(check_sni: Option<&str>, addr: std::net::IpAddr) -> ServerName<'static> {
    check_sni
        .and_then(|n| ServerName::try_from(n.to_string()).ok())
        .unwrap_or(ServerName::IpAddress(addr.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_checks_share_the_servers_client_configuration() {
        let text = "defaults\n timeout connect 1s\n timeout client 1s\n timeout server 1s\n\
                    backend be\n server a 127.0.0.1:1 ssl verify none check\n \
                    server b 127.0.0.1:2 check-ssl verify none check\n \
                    server c 127.0.0.1:3 check\n";
        let loaded = crate::config::parse_str("t.cfg", text).expect("valid");
        let cx = Contexts::build(&loaded.config, KernelTls::Missing).expect("contexts");
        let (traffic, check) = (cx.connector(0, 0), cx.check_connector(0, 0));
        let (traffic, check) = (traffic.expect("a: ssl"), check.expect("a: checks"));
        assert!(
            Arc::ptr_eq(traffic.connector.config(), check.connector.config()),
            "a's checks build no client configuration of their own"
        );
        assert!(cx.connector(0, 1).is_none() && cx.check_connector(0, 1).is_some());
        assert!(cx.connector(0, 2).is_none() && cx.check_connector(0, 2).is_none());
    }

    #[test]
    fn check_names_come_from_check_sni_only() {
        let ip: std::net::IpAddr = [127, 0, 0, 1].into();
        assert_eq!(
            check_server_name(Some("chk.test"), ip),
            ServerName::try_from("chk.test").expect("name")
        );
        assert_eq!(
            check_server_name(None, ip),
            ServerName::IpAddress(ip.into())
        );
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_the_first() {
        let provider = rustls::crypto::ring::default_provider();
        let key = |_: usize| {
            // Any usable key: the resolver only returns the Arc it holds.
            let k = rcgen::KeyPair::generate().expect("key");
            let der = rustls::pki_types::PrivateKeyDer::try_from(k.serialize_der()).expect("der");
            let signer = provider
                .key_provider
                .load_private_key(der)
                .expect("load key");
            Arc::new(CertifiedKey::new(vec![], signer))
        };
        let certs: Vec<_> = (0..3).map(key).collect();
        let r = BySni {
            certs: certs.clone(),
            names: vec![
                ("a.test".into(), 0),
                ("b.test".into(), 1),
                ("*.w.test".into(), 2),
            ],
        };
        let is = |sni, i: usize| {
            let got = r.pick(sni).expect("a certificate");
            assert!(Arc::ptr_eq(&got, &certs[i]), "{sni:?} -> not #{i}");
        };
        is(Some("b.test"), 1);
        is(Some("B.Test"), 1);
        is(Some("x.w.test"), 2);
        is(Some("y.x.w.test"), 0);
        is(Some("other"), 0);
        is(None, 0);
    }
}
