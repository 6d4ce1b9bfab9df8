//! TLS on both sides (rustls with the ring provider). Towards clients it is the front door's
//! ([`bypass_frontdoor::tls`], negotiation in [`bypass_frontdoor::login::negotiate`]: SSLRequest,
//! GSSENCRequest, PostgreSQL 17 direct TLS); this module builds it from the pooler's settings.
//!
//! ```text
//!  pooler ─► server: SSLRequest ─► 'S' ─► handshake (verify per server_tls_sslmode)
//!                                  'N' ─► plaintext (prefer) or refuse (require, verify-*)
//! ```
//! Certificates are read at config load, so a bad file is a config error, not a runtime one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bypass_frontdoor::tls::{read_certificates, read_key, read_roots, TlsConfigError, TlsFile, TlsFiles};
use bypass_wire::{tag, SqlState};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::PoolerSettings;
pub use crate::config::{ClientSslMode, ServerSslMode};
use crate::error::PoolerError;
use crate::stream::Stream;

mod verify;
use verify::{CertificateCheck, NoCertificateCheck};

/// Length of SSLRequest.
const REQUEST_LEN: usize = 8;

/// The accepting side's TLS, built from the config.
pub struct ClientTls {
    pub mode: ClientSslMode,
    pub acceptor: bypass_frontdoor::ServerTls,
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

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    bypass_frontdoor::tls::provider()
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

/// A TLS file problem under the pooler's setting name.
fn named(field_of: impl Fn(TlsFile) -> &'static str) -> impl Fn(TlsConfigError) -> String {
    move |error| format!("pooler.{} = {}: {}", field_of(error.file), error.path, error.message)
}

fn required<'a>(path: &'a Option<PathBuf>, field: &str, mode: &str) -> Result<&'a Path, String> {
    path.as_deref().ok_or_else(|| format!("pooler.{field} is required with {mode}"))
}

fn client_tls(settings: &PoolerSettings, mode: ClientSslMode) -> Result<ClientTls, String> {
    let mode_name = format!("client_tls_sslmode = {mode:?}");
    let verifies = mode >= ClientSslMode::VerifyCa;
    let certificate = required(&settings.client_tls_cert_file, "client_tls_cert_file", &mode_name)?.to_owned();
    let key = required(&settings.client_tls_key_file, "client_tls_key_file", &mode_name)?.to_owned();
    if verifies && settings.client_tls_ca_file.is_none() {
        return Err(format!("pooler.client_tls_ca_file is required with {mode_name}"));
    }
    let files = TlsFiles {
        certificate,
        key,
        client_ca: settings.client_tls_ca_file.clone(),
        client_certificate_required: verifies,
        plaintext_refused: mode >= ClientSslMode::Require,
    };
    let acceptor = bypass_frontdoor::ServerTls::from_files(&files).map_err(named(|file| match file {
        TlsFile::Certificate => "client_tls_cert_file",
        TlsFile::Key => "client_tls_key_file",
        TlsFile::ClientCa => "client_tls_ca_file",
    }))?;
    Ok(ClientTls { mode, acceptor })
}

fn server_tls(settings: &PoolerSettings, mode: ServerSslMode) -> Result<ServerTls, String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("server TLS: {error}"))?;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        ServerSslMode::VerifyCa | ServerSslMode::VerifyFull => {
            let path = required(&settings.server_tls_ca_file, "server_tls_ca_file", &format!("{mode:?}"))?;
            let roots = read_roots(path, TlsFile::ClientCa).map_err(named(|_| "server_tls_ca_file"))?;
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
            let chain =
                read_certificates(cert_path, TlsFile::Certificate).map_err(named(|_| "server_tls_cert_file"))?;
            let key = read_key(key_path, TlsFile::Key).map_err(named(|_| "server_tls_key_file"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| format!("pooler.server_tls_key_file does not match server_tls_cert_file: {error}"))?
        }
        _ => return Err("pooler.server_tls_cert_file and server_tls_key_file go together".into()),
    };
    Ok(ServerTls { mode, connector: TlsConnector::from(Arc::new(config)) })
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
        (tag::encryption::ACCEPT, _) => {}
        (tag::encryption::REFUSE, ServerSslMode::Prefer) => return Ok(Stream::Plain(tcp)),
        (tag::encryption::REFUSE, _) => return Err(server_tls_failed("the server does not accept TLS")),
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
