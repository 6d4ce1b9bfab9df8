//! TLS at the front door: SSLRequest with a real rustls client, plaintext refused under
//! `plaintext_refused`, and bytes sent in clear after an SSLRequest refused (never read as part
//! of the encrypted session).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bypass_frontdoor::{Admission, CancelKey, FrontDoor, FrontDoorConfig, ServerTls, TlsFiles};
use bypass_wire::auth_file::AuthFile;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio::net::TcpListener;

/// A CA and a server certificate for 127.0.0.1, as files in `dir`; returns the CA's PEM.
fn certificates(dir: &std::path::Path) -> String {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "frontdoor test CA");
    let ca_key = KeyPair::generate().expect("key");
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, "frontdoor");
    let key = KeyPair::generate().expect("key");
    let certificate = params.signed_by(&key, &ca, &ca_key).expect("signed");
    std::fs::write(dir.join("server.crt"), certificate.pem()).expect("write");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("write");
    ca.pem()
}

async fn serve(door: Arc<FrontDoor>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let door = door.clone();
            tokio::spawn(async move {
                if let Ok(Admission::Client(mut client)) = door.accept(tcp, 16 * 1024).await {
                    assert!(client.stream.is_tls(), "only TLS clients are admitted");
                    let _ = client.welcome(&[], CancelKey::random()).await;
                    let mut sink = [0u8; 64];
                    while matches!(client.stream.read(&mut sink).await, Ok(n) if n > 0) {}
                }
            });
        }
    });
    address
}

fn client_config(ca_pem: &str) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("pem")).expect("root");
    rustls::ClientConfig::builder_with_provider(bypass_frontdoor::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[tokio::test]
async fn tls_clients_log_in_and_plaintext_is_refused() {
    // Goal: TLS from cert/key files works end to end with SCRAM inside, plaintext gets 28000 and
    // cleartext bytes after an SSLRequest are refused. Method: tokio-postgres with rustls, then
    // without TLS, then a raw SSLRequest followed at once by a startup packet.
    let dir = tempfile::tempdir().expect("dir");
    let ca_pem = certificates(dir.path());
    let files = TlsFiles {
        certificate: dir.path().join("server.crt"),
        key: dir.path().join("server.key"),
        client_ca: None,
        client_certificate_required: false,
        plaintext_refused: true,
    };
    let tls = ServerTls::from_files(&files).expect("TLS from files");
    let users = AuthFile::parse("\"alice\" \"alice-pw\"\n").expect("valid");
    let door = FrontDoor::new(FrontDoorConfig { tls: Some(tls), ..FrontDoorConfig::scram(users) });
    let address = serve(door).await;
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(address.port()).user("alice").password("alice-pw").dbname("app");
    config.ssl_mode(tokio_postgres::config::SslMode::Require).connect_timeout(Duration::from_secs(20));
    let tls_client = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(&ca_pem));
    assert!(config.connect(tls_client).await.is_ok(), "TLS login");
    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    let Err(plaintext) = config.connect(tokio_postgres::NoTls).await else { panic!("plaintext was admitted") };
    assert_eq!(plaintext.as_db_error().map(|db| db.code().code()), Some("28000"), "{plaintext}");
    let answer = tokio::task::spawn_blocking(move || {
        let mut raw = std::net::TcpStream::connect(address).expect("connect");
        raw.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut bytes = Vec::new();
        bypass_wire::startup::encode_request(&mut bytes, &bypass_wire::StartupPacket::SslRequest);
        bypass_wire::startup::encode_startup(&mut bytes, &[("user", "alice")]);
        raw.write_all(&bytes).expect("send");
        let mut answer = Vec::new();
        let _ = raw.read_to_end(&mut answer);
        answer
    })
    .await
    .expect("joined");
    assert_eq!(answer.first(), Some(&b'E'), "no 'S' for an SSLRequest with bytes behind it");
    assert!(String::from_utf8_lossy(&answer).contains("unencrypted data after SSL request"));
}
