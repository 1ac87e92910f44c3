//! A provider's TLS material read from its files: shared by `legate check` (and start-up and
//! reload validation), which must refuse what the upstream client could not use, and by the
//! client itself.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of a PEM file (at least one).
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = pem_file(path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    let certs = certs.map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate found", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub(crate) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(&pem_file(path)?)
        .map_err(|e| format!("{}: not a usable PEM private key: {e}", path.display()))
}

/// A PEM file's bytes: a regular file of at most 16 MiB (`config::read`).
fn pem_file(path: &Path) -> Result<Vec<u8>, String> {
    super::read::bounded(path, super::read::LARGE).map_err(|e| format!("{}: {e}", path.display()))
}

/// The roots `ca_file` adds, each checked usable as a trust anchor.
pub(crate) fn add_ca_file(roots: &mut rustls::RootCertStore, path: &Path) -> Result<(), String> {
    for cert in read_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(())
}

/// A TLS client configuration with `roots` and, when given, the client certificate and its
/// key (refused when they do not belong together).
pub(crate) fn client_config(
    roots: rustls::RootCertStore,
    client: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots);
    match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| format!("client certificate rejected: {e}")),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// What the upstream client would refuse in a provider's TLS files, by the key that names
/// them: the same reading as at start, so that `legate check` refuses what `serve` could not
/// run (SPEC §14).
pub(crate) fn problems(
    ca_file: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(ca) = ca_file
        && let Err(e) = add_ca_file(&mut rustls::RootCertStore::empty(), ca)
    {
        out.push(("ca_file", e));
    }
    if let Some((cert, key)) = client {
        let named = match (read_certs(cert), read_key(key)) {
            (Err(e), _) => Some(("client_cert_file", e)),
            (_, Err(e)) => Some(("client_key_file", e)),
            (Ok(_), Ok(_)) => client_config(rustls::RootCertStore::empty(), client)
                .err()
                .map(|e| ("client_cert_file", e)),
        };
        out.extend(named);
    }
    out
}
