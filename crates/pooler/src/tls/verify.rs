//! Certificate checks the webpki defaults do not cover: libpq's `verify-ca` (chain without host
//! name) and `prefer`/`require` (no check), and the client certificate's common name for the
//! hba method `cert`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// `verify-ca` and `verify-full`: the chain must lead to a configured root; the host name is
/// checked only for `verify-full`.
#[derive(Debug)]
pub(super) struct CertificateCheck {
    pub(super) webpki: Arc<WebPkiServerVerifier>,
    pub(super) check_name: bool,
}

impl ServerCertVerifier for CertificateCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// `prefer` and `require`: encryption without authentication of the server, as libpq's modes of
/// the same names. The handshake signature is still checked, so the session keys are sound.
#[derive(Debug)]
pub(super) struct NoCertificateCheck(pub(super) Arc<CryptoProvider>);

impl ServerCertVerifier for NoCertificateCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The subject's commonName (OID 2.5.4.3) of a DER certificate. A few lines of DER walking
/// rather than a full X.509 parser: webpki already verified the chain, this only reads a name.
pub(super) fn common_name(der: &[u8]) -> Option<String> {
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
        // Goal: `cert` compares the subject's CN. Method: an rcgen-free DER fixture would be
        // long; instead check the walker on a tiny hand-built Name and on malformed input.
        let attribute = [0x30, 0x0A, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0C, 0x03, b'b', b'o', b'b'];
        let mut set = vec![0x31, attribute.len() as u8];
        set.extend_from_slice(&attribute);
        let mut name = vec![0x30, set.len() as u8];
        name.extend_from_slice(&set);
        let issuer = {
            let mut other = name.clone();
            let len = other.len();
            other[len - 3..].copy_from_slice(b"eve");
            other
        };
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
