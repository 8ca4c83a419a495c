//! The TLS material a configuration names: the certificates of `bind ... ssl
//! crt FILE|DIR` and the CA bundles of `server ... ssl ca-file FILE`, read
//! once when the configuration is loaded (so `shunt -c` judges them, and a
//! reload, being a new process, reads the files again).
//!
//! Owns: resolving a path against `crt-base` / `ca-base` (HAProxy's rule: a
//! path that does not start with `/` is taken under the base), reading the
//! PEM files, checking that a certificate and its key belong together, and
//! the DNS names each certificate answers for (SNI selection).
//! Must not: build rustls' per-connection configurations (the runtime's
//! `tls` room does) or log; errors are HAProxy's texts, which the caller
//! prefixes with the line's location.
//! Invariant: a [`CertKey`] holds a non-empty chain whose first certificate
//! is the end entity, and a key that the ring provider loaded and that
//! matches that certificate when the key type lets rustls compare them.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Largest PEM file read: a chain of a few certificates and a key is a few
/// KiB; anything near this is not a certificate file.
const MAX_PEM_BYTES: u64 = 4 << 20;

/// Most files a `crt DIR` loads: a bound on start-up work and memory; a
/// directory with more is a mistake (HAProxy's crt-list is the tool for that).
const MAX_DIR_CERTS: usize = 4096;

/// Files of a `crt DIR` that HAProxy skips because they accompany a
/// certificate rather than hold one.
const SIDECAR_EXTS: [&str; 4] = ["key", "ocsp", "issuer", "sctl"];

/// One certificate chain with its private key, as a `crt` file holds it.
#[derive(Debug, PartialEq, Eq)]
pub struct CertKey {
    /// The file it was read from (after `crt-base`), for messages.
    pub path: PathBuf,
    /// End entity first, then the intermediates, as in the file.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The end entity's DNS names (subjectAltName, wildcards as `*.x.y`),
    /// lower case: what SNI selects it by.
    pub names: Vec<String>,
}

/// `path` under `base` unless it is absolute or there is no base.
pub fn resolve(base: Option<&Path>, path: &str) -> PathBuf {
    match base {
        Some(b) if !path.starts_with('/') => b.join(path),
        _ => PathBuf::from(path),
    }
}

/// The certificates of one `crt` argument: the file, or every certificate
/// file of the directory in name order (HAProxy's `crt DIR`).
pub fn load_crt(path: &Path) -> Result<Vec<CertKey>, String> {
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "unable to stat SSL certificate from file '{}' : {}.",
            path.display(),
            super::io_reason(&e)
        )
    })?;
    if !meta.is_dir() {
        return Ok(vec![load_cert_file(path)?]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| {
        format!(
            "unable to scan directory '{}' : {}.",
            path.display(),
            super::io_reason(&e)
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_none_or(|x| !SIDECAR_EXTS.contains(&x))
        })
        .collect();
    if files.len() > MAX_DIR_CERTS {
        return Err(format!(
            "too many files in directory '{}' ({} > {MAX_DIR_CERTS}).",
            path.display(),
            files.len()
        ));
    }
    files.sort();
    files.iter().map(|f| load_cert_file(f)).collect()
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let too_big = std::fs::metadata(path).is_ok_and(|m| m.len() > MAX_PEM_BYTES);
    if too_big {
        return Err(format!(
            "unable to load {what} from file '{}' (larger than {MAX_PEM_BYTES} bytes).",
            path.display()
        ));
    }
    std::fs::read(path).map_err(|e| {
        format!(
            "unable to stat SSL certificate from file '{}' : {}.",
            path.display(),
            super::io_reason(&e)
        )
    })
}

/// One PEM file: its certificates and its key, or, as HAProxy, the key of
/// `FILE.key` beside it when the file holds none.
fn load_cert_file(path: &Path) -> Result<CertKey, String> {
    let pem = read_pem(path, "certificate")?;
    let unable = || format!("unable to load certificate from file '{}'.", path.display());
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| unable())?;
    if chain.is_empty() {
        return Err(unable());
    }
    let key = match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(k) => k,
        Err(_) => {
            let mut side = path.as_os_str().to_owned();
            side.push(".key");
            let side = PathBuf::from(side);
            let no_key = || format!("No Private Key found in '{}'.", side.display());
            let bytes = std::fs::read(&side).map_err(|_| no_key())?;
            PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| no_key())?
        }
    };
    let provider = rustls::crypto::ring::default_provider();
    let checked = rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider);
    if let Err(e) = checked {
        return Err(match e {
            rustls::Error::InconsistentKeys(_) => format!(
                "inconsistencies between private key and certificate loaded from PEM file '{}'.",
                path.display()
            ),
            other => format!(
                "unable to load the private key of '{}' : {other}.",
                path.display()
            ),
        });
    }
    let names = match webpki::EndEntityCert::try_from(&chain[0]) {
        Ok(ee) => ee
            .valid_dns_names()
            .map(|n| n.to_ascii_lowercase())
            .collect(),
        Err(_) => return Err(unable()),
    };
    Ok(CertKey {
        path: path.to_path_buf(),
        chain,
        key,
        names,
    })
}

/// The CA certificates of a `ca-file`.
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| {
        format!(
            "Couldn't open the ca-file '{}' ({}).",
            path.display(),
            super::io_reason(&e)
        )
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| format!("unable to load {}.", path.display()))?;
    if certs.is_empty() {
        return Err(format!("unable to load {}.", path.display()));
    }
    Ok(certs)
}

/// A TLS protocol version of `ssl-min-ver` (HAProxy's names). rustls speaks
/// TLS 1.2 and 1.3 only, so an older minimum allows what it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Ssl3,
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

impl TlsVersion {
    pub fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "SSLv3" => Self::Ssl3,
            "TLSv1.0" => Self::Tls10,
            "TLSv1.1" => Self::Tls11,
            "TLSv1.2" => Self::Tls12,
            "TLSv1.3" => Self::Tls13,
            _ => return Err(format!("'{s}' : unknown ssl/tls version")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_go_under_the_base_and_absolute_ones_do_not() {
        let b = Path::new("/etc/ssl");
        assert_eq!(resolve(Some(b), "a.pem"), PathBuf::from("/etc/ssl/a.pem"));
        assert_eq!(resolve(Some(b), "/x/a.pem"), PathBuf::from("/x/a.pem"));
        assert_eq!(resolve(None, "a.pem"), PathBuf::from("a.pem"));
    }

    #[test]
    fn versions_use_haproxy_names() {
        assert_eq!(TlsVersion::parse("TLSv1.2"), Ok(TlsVersion::Tls12));
        assert_eq!(
            TlsVersion::parse("TLSv1.9"),
            Err("'TLSv1.9' : unknown ssl/tls version".to_string())
        );
    }

    #[test]
    fn a_missing_or_garbage_file_is_haproxys_error() {
        let e = load_crt(Path::new("/nonexistent/x.pem")).unwrap_err();
        assert_eq!(
            e,
            "unable to stat SSL certificate from file '/nonexistent/x.pem' : No such file or directory."
        );
        let dir = std::env::temp_dir().join(format!("shunt-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let bad = dir.join("bad.pem");
        std::fs::write(&bad, "garbage\n").expect("write");
        let e = load_crt(&bad).unwrap_err();
        assert_eq!(
            e,
            format!("unable to load certificate from file '{}'.", bad.display())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
