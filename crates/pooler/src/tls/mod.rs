//! TLS on both sides (rustls with the ring provider).
//!
//! ```text
//!  client ─► first byte 0x16? ── yes ─► TLS handshake, ALPN must be "postgresql" (PG17 direct)
//!               │ no
//!               ▼
//!           8-byte request: SSLRequest ─► 'S' + handshake   (or 'N' when TLS is off)
//!                           GSSENCRequest ─► 'N', next request
//!                           anything else ─► plaintext, the 8 bytes go back to login
//!
//!  pooler ─► server: SSLRequest ─► 'S' ─► handshake (verify per server_tls_sslmode)
//!                                  'N' ─► plaintext (prefer) or refuse (require, verify-*)
//! ```
//! Certificates are read at config load, so a bad file is a config error, not a runtime one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bypass_wire::startup::{GSSENC_REQUEST_CODE, SSL_REQUEST_CODE};
use bypass_wire::SqlState;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::PoolerSettings;
pub use crate::config::{ClientSslMode, ServerSslMode};
use crate::error::PoolerError;
use crate::stream::Stream;

mod verify;
use verify::{common_name, CertificateCheck, NoCertificateCheck};

/// The ALPN protocol name PostgreSQL 17 defines; required with direct TLS.
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";
/// The first byte of a TLS handshake record: a client starting TLS without an SSLRequest.
const TLS_HANDSHAKE_BYTE: u8 = 0x16;
/// Length of SSLRequest and GSSENCRequest, and the least any startup packet has.
pub const REQUEST_LEN: usize = 8;
/// Encryption requests a client may send before its startup packet (GSSENCRequest, then
/// SSLRequest, as libpq does with `gssencmode=prefer`).
const ENCRYPTION_REQUESTS_MAX: usize = 2;

/// The accepting side's TLS, built from the config.
pub struct ClientTls {
    pub mode: ClientSslMode,
    acceptor: TlsAcceptor,
}

/// The connecting side's TLS, built from the config.
pub struct ServerTls {
    pub mode: ServerSslMode,
    connector: TlsConnector,
}

/// Both sides' TLS; `None` where it is disabled.
#[derive(Clone, Default)]
pub struct TlsContexts {
    pub client: Option<Arc<ClientTls>>,
    pub server: Option<Arc<ServerTls>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ServerTls").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TlsContexts {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TlsContexts")
            .field("client", &self.client.as_ref().map(|tls| tls.mode))
            .field("server", &self.server.as_ref().map(|tls| tls.mode))
            .finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsContexts {
    /// Reads certificates and keys; every problem is added to `problems`.
    pub fn load(settings: &PoolerSettings, problems: &mut Vec<String>) -> TlsContexts {
        let client = match settings.client_tls_sslmode {
            ClientSslMode::Disable => None,
            mode => client_tls(settings, mode).map_err(|problem| problems.push(problem)).ok(),
        };
        let server = match settings.server_tls_sslmode {
            ServerSslMode::Disable => None,
            mode => server_tls(settings, mode).map_err(|problem| problems.push(problem)).ok(),
        };
        TlsContexts { client: client.map(Arc::new), server: server.map(Arc::new) }
    }
}

fn read_certificates(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("pooler.{field} = {}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("pooler.{field} = {}: no PEM certificate in the file", path.display()));
    }
    Ok(certificates)
}

fn read_roots(path: &Path, field: &str) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path, field)? {
        roots.add(certificate).map_err(|error| format!("pooler.{field} = {}: {error}", path.display()))?;
    }
    Ok(Arc::new(roots))
}

fn read_key(path: &Path, field: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| format!("pooler.{field} = {}: {error}", path.display()))
}

fn required<'a>(path: &'a Option<PathBuf>, field: &str, mode: &str) -> Result<&'a Path, String> {
    path.as_deref().ok_or_else(|| format!("pooler.{field} is required with {mode}"))
}

fn client_tls(settings: &PoolerSettings, mode: ClientSslMode) -> Result<ClientTls, String> {
    let mode_name = format!("client_tls_sslmode = {mode:?}");
    let cert_path = required(&settings.client_tls_cert_file, "client_tls_cert_file", &mode_name)?;
    let key_path = required(&settings.client_tls_key_file, "client_tls_key_file", &mode_name)?;
    let chain = read_certificates(cert_path, "client_tls_cert_file")?;
    let key = read_key(key_path, "client_tls_key_file")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("client TLS: {error}"))?;
    let verifies = mode >= ClientSslMode::VerifyCa;
    let builder = match (&settings.client_tls_ca_file, verifies) {
        (None, true) => return Err(format!("pooler.client_tls_ca_file is required with {mode_name}")),
        (None, false) => builder.with_no_client_auth(),
        (Some(path), _) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(read_roots(path, "client_tls_ca_file")?, provider());
            // Below verify-ca a certificate is checked when sent (for hba `cert`), not required.
            let verifier = if verifies { verifier } else { verifier.allow_unauthenticated() };
            builder.with_client_cert_verifier(verifier.build().map_err(|error| format!("client TLS: {error}"))?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|error| format!("pooler.client_tls_key_file does not match client_tls_cert_file: {error}"))?;
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(ClientTls { mode, acceptor: TlsAcceptor::from(Arc::new(config)) })
}

fn server_tls(settings: &PoolerSettings, mode: ServerSslMode) -> Result<ServerTls, String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("server TLS: {error}"))?;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        ServerSslMode::VerifyCa | ServerSslMode::VerifyFull => {
            let path = required(&settings.server_tls_ca_file, "server_tls_ca_file", &format!("{mode:?}"))?;
            let roots = read_roots(path, "server_tls_ca_file")?;
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|error| format!("server TLS: {error}"))?;
            Arc::new(CertificateCheck { webpki, check_name: mode == ServerSslMode::VerifyFull })
        }
        _ => Arc::new(NoCertificateCheck(provider())),
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    let config = match (&settings.server_tls_cert_file, &settings.server_tls_key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert_path), Some(key_path)) => {
            let chain = read_certificates(cert_path, "server_tls_cert_file")?;
            let key = read_key(key_path, "server_tls_key_file")?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| format!("pooler.server_tls_key_file does not match server_tls_cert_file: {error}"))?
        }
        _ => return Err("pooler.server_tls_cert_file and server_tls_key_file go together".into()),
    };
    Ok(ServerTls { mode, connector: TlsConnector::from(Arc::new(config)) })
}

fn refused(message: impl Into<String>) -> PoolerError {
    PoolerError::refused(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, message)
}

/// A negotiated client connection and the bytes of its startup packet already read.
pub struct AcceptedClient {
    pub stream: Stream,
    /// The first bytes of the startup packet when the client did not ask for encryption.
    pub leftover: Option<[u8; REQUEST_LEN]>,
}

/// Negotiates encryption with a new client before its startup packet. With TLS off the client
/// goes to login untouched (login answers SSLRequest with 'N').
pub async fn accept_client(tls: Option<&ClientTls>, tcp: TcpStream) -> Result<AcceptedClient, PoolerError> {
    let Some(tls) = tls else {
        return Ok(AcceptedClient { stream: Stream::Plain(tcp), leftover: None });
    };
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await.map_err(PoolerError::ClientIo)? == 0 {
        return Err(PoolerError::ClientIo(std::io::ErrorKind::UnexpectedEof.into()));
    }
    if first[0] == TLS_HANDSHAKE_BYTE {
        let session = tls.acceptor.accept(tcp).await.map_err(PoolerError::ClientIo)?;
        // PostgreSQL 17 requires ALPN with direct TLS so that a TLS port of another protocol
        // cannot be confused with ours.
        if session.get_ref().1.alpn_protocol() != Some(ALPN_POSTGRESQL) {
            return Err(refused("direct TLS connection without ALPN \"postgresql\""));
        }
        return Ok(AcceptedClient { stream: tls_stream(session), leftover: None });
    }
    read_encryption_requests(tls, tcp).await
}

async fn read_encryption_requests(tls: &ClientTls, mut tcp: TcpStream) -> Result<AcceptedClient, PoolerError> {
    for _ in 0..ENCRYPTION_REQUESTS_MAX {
        let mut request = [0u8; REQUEST_LEN];
        tcp.read_exact(&mut request).await.map_err(PoolerError::ClientIo)?;
        let length = u32::from_be_bytes([request[0], request[1], request[2], request[3]]);
        let code = i32::from_be_bytes([request[4], request[5], request[6], request[7]]);
        match (length as usize, code) {
            (REQUEST_LEN, SSL_REQUEST_CODE) => {
                tcp.write_all(b"S").await.map_err(PoolerError::ClientIo)?;
                let session = tls.acceptor.accept(tcp).await.map_err(PoolerError::ClientIo)?;
                return Ok(AcceptedClient { stream: tls_stream(session), leftover: None });
            }
            (REQUEST_LEN, GSSENC_REQUEST_CODE) => tcp.write_all(b"N").await.map_err(PoolerError::ClientIo)?,
            _ => return Ok(AcceptedClient { stream: Stream::Plain(tcp), leftover: Some(request) }),
        }
    }
    Err(PoolerError::refused(SqlState::PROTOCOL_VIOLATION, "too many encryption requests"))
}

fn tls_stream(session: tokio_rustls::server::TlsStream<TcpStream>) -> Stream {
    Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(session)))
}

/// Refuses a plaintext client when the mode requires TLS, after its startup packet (as
/// PgBouncer, so the client can read the reason).
pub fn check_client(tls: Option<&ClientTls>, stream: &Stream) -> Result<(), PoolerError> {
    match tls {
        // A Unix-socket client is local: TLS is not offered there (as PostgreSQL).
        Some(tls) if tls.mode >= ClientSslMode::Require && !stream.is_tls() && !stream.is_unix() => {
            Err(refused("SSL required: this pooler accepts TLS connections only"))
        }
        _ => Ok(()),
    }
}

/// The client certificate's subject common name, when the client sent a verified certificate.
pub fn client_certificate_name(stream: &Stream) -> Option<String> {
    let Stream::Tls(session) = stream else { return None };
    let certificate = session.get_ref().1.peer_certificates()?.first()?;
    common_name(certificate.as_ref())
}

/// Negotiates TLS with a server per `server_tls_sslmode`; `host` is the name `verify-full` checks.
pub async fn connect_server(tls: Option<&ServerTls>, mut tcp: TcpStream, host: &str) -> Result<Stream, PoolerError> {
    let Some(tls) = tls else { return Ok(Stream::Plain(tcp)) };
    let mut request = Vec::with_capacity(REQUEST_LEN);
    bypass_wire::startup::encode_request(&mut request, &bypass_wire::StartupPacket::SslRequest);
    tcp.write_all(&request).await.map_err(PoolerError::ServerIo)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(PoolerError::ServerIo)?;
    match (answer[0], tls.mode) {
        (b'S', _) => {}
        (b'N', ServerSslMode::Prefer) => return Ok(Stream::Plain(tcp)),
        (b'N', _) => return Err(server_tls_failed("the server does not accept TLS")),
        (other, _) => {
            return Err(PoolerError::ServerProtocol(bypass_wire::WireError::UnknownTag(other as char)));
        }
    }
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| server_tls_failed(&format!("{host:?} is not a valid TLS server name")))?;
    let session = tls.connector.connect(name, tcp).await.map_err(|error| server_tls_failed(&error.to_string()))?;
    Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(session))))
}

fn server_tls_failed(reason: &str) -> PoolerError {
    PoolerError::ServerLogin {
        code: SqlState::INVALID_AUTHORIZATION_SPECIFICATION.code().into(),
        message: format!("TLS to the server failed: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn modes_parse_in_kebab_case_and_missing_files_are_listed() {
        // Goal: the TOML spelling is PgBouncer's and every missing TLS file is reported at once.
        let text = "[pooler]\nauth_type = \"trust\"\nclient_tls_sslmode = \"verify-full\"\n\
                    server_tls_sslmode = \"verify-ca\"\n[databases.app]\n";
        let config: Config = toml::from_str(text).expect("parses");
        assert_eq!(config.pooler.client_tls_sslmode, ClientSslMode::VerifyFull);
        assert_eq!(config.pooler.server_tls_sslmode, ServerSslMode::VerifyCa);
        let Err(crate::ConfigError::Invalid(problems)) = config.validate() else { panic!("must be invalid") };
        let joined = problems.join("\n");
        assert!(joined.contains("client_tls_cert_file") && joined.contains("server_tls_ca_file"), "{joined}");
    }
}
