//! Test certificates, generated per test with rcgen (never committed): a CA, and leaf
//! certificates it signs, written as PEM files into a temporary folder.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub struct TestCa {
    pub dir: tempfile::TempDir,
    certificate: Certificate,
    key: KeyPair,
}

/// A certificate and key, as files and as PEM text.
pub struct Issued {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names is valid");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "bypass test CA");
        let key = KeyPair::generate().expect("key generation");
        let certificate = params.self_signed(&key).expect("self-signed CA");
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("ca.pem"), certificate.pem()).expect("write CA");
        TestCa { dir, certificate, key }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Issues a certificate with subject CN `common_name` valid for `names` (DNS names or IPs).
    pub fn issue(&self, file_stem: &str, common_name: &str, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params.distinguished_name.push(DnType::CommonName, common_name);
        let key = KeyPair::generate().expect("key generation");
        let certificate = params.signed_by(&key, &self.certificate, &self.key).expect("signed by the CA");
        let issued = Issued {
            cert_file: self.dir.path().join(format!("{file_stem}.crt")),
            key_file: self.dir.path().join(format!("{file_stem}.key")),
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        };
        std::fs::write(&issued.cert_file, &issued.cert_pem).expect("write cert");
        std::fs::write(&issued.key_file, &issued.key_pem).expect("write key");
        issued
    }

    /// The pooler's own certificate, for 127.0.0.1 and localhost.
    pub fn pooler_certificate(&self) -> Issued {
        self.issue("pooler", "pooler", &["localhost", &IpAddr::from([127, 0, 0, 1]).to_string()])
    }

    /// A rustls client configuration trusting this CA, with ALPN `postgresql`, optionally
    /// presenting a client certificate.
    pub fn client_config(&self, client_certificate: Option<&Issued>) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_file_iter(self.ca_file()).expect("CA file") {
            roots.add(certificate.expect("CA pem")).expect("CA is a valid root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let mut config = match client_certificate {
            None => builder.with_no_client_auth(),
            Some(issued) => {
                let chain = vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("cert pem")];
                let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key pem");
                builder.with_client_auth_cert(chain, key).expect("client certificate")
            }
        };
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        config
    }
}

/// Turns on TLS in a running PostgreSQL with a certificate for `names` signed by `ca`: files in
/// its data directory owned by the server user, `ssl = on`, reload.
pub fn enable_server_tls(postgres: &bypass_testkit::Postgres, ca: &TestCa, names: &[&str]) {
    let issued = ca.issue("server", "postgres server", names);
    let data_dir: &Path = postgres.data_dir();
    for (source, name) in [(&issued.cert_file, "server.crt"), (&issued.key_file, "server.key")] {
        let target = data_dir.join(name);
        std::fs::copy(source, &target).expect("copy into the data dir");
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
        bypass_testkit::process::chown_to_server_user(&target).expect("chown to the server user");
    }
    postgres.psql("ALTER SYSTEM SET ssl = on").expect("ssl on");
    postgres.psql("SELECT pg_reload_conf()").expect("reload");
    for _ in 0..100 {
        if postgres.psql("SHOW ssl").expect("show ssl").trim() == "on" {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("PostgreSQL did not turn TLS on");
}

/// Makes PostgreSQL (with TLS on) demand a client certificate from `user`, signed by `ca`:
/// a `hostssl … cert` line for that user before the catch-all trust line, and `ssl_ca_file`.
pub fn require_client_certificate(postgres: &bypass_testkit::Postgres, ca: &TestCa, user: &str) {
    let data_dir = postgres.data_dir();
    let ca_copy = data_dir.join("client-ca.pem");
    std::fs::copy(ca.ca_file(), &ca_copy).expect("copy the CA");
    bypass_testkit::process::chown_to_server_user(&ca_copy).expect("chown the CA");
    let hba_path = data_dir.join("pg_hba.conf");
    let hba = std::fs::read_to_string(&hba_path).expect("read pg_hba.conf");
    let hba = hba.replacen("local all all trust\n", &format!("local all all trust\nhostssl all {user} all cert\n"), 1);
    bypass_testkit::process::write_server_file(&hba_path, &hba).expect("write pg_hba.conf");
    postgres.psql(&format!("ALTER SYSTEM SET ssl_ca_file = '{}'", ca_copy.display())).expect("ssl_ca_file");
    postgres.psql("SELECT pg_reload_conf()").expect("reload");
    let expected = ca_copy.display().to_string();
    for _ in 0..100 {
        if postgres.psql("SHOW ssl_ca_file").expect("show ssl_ca_file") == expected {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("PostgreSQL did not reload ssl_ca_file");
}
