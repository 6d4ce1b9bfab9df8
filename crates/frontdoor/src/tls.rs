//! The accepting side's TLS (rustls with the ring provider), built from PEM files at start, so a
//! bad file is a configuration error, not a failure at the first client.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio_rustls::TlsAcceptor;

use crate::stream::Stream;

/// The ALPN protocol name PostgreSQL 17 defines; required with direct TLS.
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// Which file of a TLS setup a problem is in, so a caller can name its own setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    Certificate,
    Key,
    ClientCa,
}

/// A TLS file that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TlsConfigError {
    pub file: TlsFile,
    pub path: String,
    pub message: String,
}

/// What the server's TLS is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain the server presents.
    pub certificate: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `certificate`.
    pub key: PathBuf,
    /// PEM CA certificates client certificates are checked against; with `None` clients are not
    /// asked for one.
    pub client_ca: Option<PathBuf>,
    /// A client must present a certificate signed by `client_ca` (`verify-ca`/`verify-full`).
    pub client_certificate_required: bool,
    /// Plaintext clients are refused (28000) after their startup packet (`require` and above).
    pub plaintext_refused: bool,
}

/// The accepting side's TLS.
pub struct ServerTls {
    pub(crate) acceptor: TlsAcceptor,
    /// Plaintext clients are refused after their startup packet.
    pub plaintext_refused: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ServerTls").field("plaintext_refused", &self.plaintext_refused).finish_non_exhaustive()
    }
}

/// The crypto provider every TLS context of the project uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn problem(file: TlsFile, path: &Path, message: impl std::fmt::Display) -> TlsConfigError {
    TlsConfigError { file, path: path.display().to_string(), message: message.to_string() }
}

/// Every PEM certificate in `path` (at least one).
pub fn read_certificates(path: &Path, file: TlsFile) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|error| problem(file, path, error))?;
    if certificates.is_empty() {
        return Err(problem(file, path, "no PEM certificate in the file"));
    }
    Ok(certificates)
}

/// A root store of every certificate in `path`.
pub fn read_roots(path: &Path, file: TlsFile) -> Result<Arc<RootCertStore>, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path, file)? {
        roots.add(certificate).map_err(|error| problem(file, path, error))?;
    }
    Ok(Arc::new(roots))
}

/// The PEM private key in `path`.
pub fn read_key(path: &Path, file: TlsFile) -> Result<PrivateKeyDer<'static>, TlsConfigError> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| problem(file, path, error))
}

impl ServerTls {
    /// Reads the files and builds the acceptor (ALPN `postgresql` offered for direct TLS).
    pub fn from_files(files: &TlsFiles) -> Result<ServerTls, TlsConfigError> {
        let chain = read_certificates(&files.certificate, TlsFile::Certificate)?;
        let key = read_key(&files.key, TlsFile::Key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| problem(TlsFile::Certificate, &files.certificate, error))?;
        let builder = match (&files.client_ca, files.client_certificate_required) {
            (None, true) => {
                return Err(problem(TlsFile::ClientCa, Path::new(""), "a client CA file is required to verify clients"))
            }
            (None, false) => builder.with_no_client_auth(),
            (Some(path), required) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(read_roots(path, TlsFile::ClientCa)?, provider());
                // Without `required` a certificate is checked when sent (for hba `cert`).
                let verifier = if required { verifier } else { verifier.allow_unauthenticated() };
                builder.with_client_cert_verifier(
                    verifier.build().map_err(|error| problem(TlsFile::ClientCa, path, error))?,
                )
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|error| problem(TlsFile::Key, &files.key, format!("does not match the certificate: {error}")))?;
        config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
        Ok(ServerTls { acceptor: TlsAcceptor::from(Arc::new(config)), plaintext_refused: files.plaintext_refused })
    }
}

/// The subject common name of the client's verified certificate, if it sent one.
pub fn client_certificate_name(stream: &Stream) -> Option<String> {
    let Stream::Tls(session) = stream else { return None };
    let certificate = session.get_ref().1.peer_certificates()?.first()?;
    common_name(certificate.as_ref())
}

/// The subject's commonName (OID 2.5.4.3) of a DER certificate. A few lines of DER walking
/// rather than a full X.509 parser: webpki already verified the chain, this only reads a name.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, certificate, _) = der_element(der)?;
    let (_, tbs, _) = der_element(certificate)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xA0) {
        rest = der_element(rest)?.2; // explicit version
    }
    for _ in 0..4 {
        rest = der_element(rest)?.2; // serial, signature algorithm, issuer, validity
    }
    let (_, mut names, _) = der_element(rest)?;
    while !names.is_empty() {
        let (_, set, after_set) = der_element(names)?;
        let (_, attribute, _) = der_element(set)?;
        let (_, oid, value) = der_element(attribute)?;
        if oid == [0x55, 0x04, 0x03] {
            return Some(String::from_utf8_lossy(der_element(value)?.1).into_owned());
        }
        names = after_set;
    }
    None
}

/// Splits one DER element off `input`: (tag, content, what follows).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        first as usize
    } else {
        let count = (first & 0x7F) as usize;
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let length = rest[..count].iter().fold(0usize, |length, byte| (length << 8) | *byte as usize);
        rest = &rest[count..];
        length
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_is_read_from_the_subject_not_the_issuer() {
        // Goal: `cert` compares the subject's CN. Method: the walker on a hand-built certificate
        // skeleton whose issuer CN differs, and on malformed input.
        let attribute = [0x30, 0x0A, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0C, 0x03, b'b', b'o', b'b'];
        let mut set = vec![0x31, attribute.len() as u8];
        set.extend_from_slice(&attribute);
        let mut name = vec![0x30, set.len() as u8];
        name.extend_from_slice(&set);
        let mut issuer = name.clone();
        let len = issuer.len();
        issuer[len - 3..].copy_from_slice(b"eve");
        let mut tbs_body = vec![0xA0, 0x03, 0x02, 0x01, 0x02, 0x02, 0x01, 0x01, 0x30, 0x00];
        tbs_body.extend_from_slice(&issuer);
        tbs_body.extend_from_slice(&[0x30, 0x00]);
        tbs_body.extend_from_slice(&name);
        let mut tbs = vec![0x30, tbs_body.len() as u8];
        tbs.extend_from_slice(&tbs_body);
        let mut certificate = vec![0x30, tbs.len() as u8];
        certificate.extend_from_slice(&tbs);
        assert_eq!(common_name(&certificate).as_deref(), Some("bob"));
        assert_eq!(common_name(&certificate[..certificate.len() - 4]), None);
        assert_eq!(common_name(&[0x30, 0x84, 0xFF]), None);
    }
}
