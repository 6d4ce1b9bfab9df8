//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL uses it, both sides, without channel binding.
//!
//! ```text
//! client                                   server
//!   client-first  n,,n=,r=<c-nonce>   -->
//!                                     <--  r=<c-nonce><s-nonce>,s=<salt>,i=<iterations>
//!   client-final  c=biws,r=..,p=<proof> -->
//!                                     <--  v=<server signature>
//! ```
//! The server side also recovers the client's `ClientKey` from a valid proof, which lets a relay
//! authenticate to a backend with the same verifier without ever knowing the password.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::{WireError, WireResult};

pub const MECHANISM: &str = "SCRAM-SHA-256";
/// PostgreSQL's default iteration count (`scram_iterations`).
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Bounds the work an untrusted verifier or server can ask of us.
pub const ITERATIONS_MAX: u32 = 1_000_000;
const NONCE_BYTES: usize = 18;
const SALT_BYTES: usize = 16;

type Key = [u8; 32];

fn hmac(key: &[u8], data: &[u8]) -> Key {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> Key {
    Sha256::digest(data).into()
}

fn xor(a: &Key, b: &Key) -> Key {
    std::array::from_fn(|i| a[i] ^ b[i])
}

fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> Key {
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
    out
}

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_nonce() -> String {
    let mut raw = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut raw);
    BASE64.encode(raw)
}

/// What a server stores instead of a password: `SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: Key,
    pub server_key: Key,
}

impl Verifier {
    /// Derives a verifier from a plaintext password with a fresh random salt.
    pub fn from_password(password: &[u8], iterations: u32) -> Self {
        let mut salt = vec![0u8; SALT_BYTES];
        rand::thread_rng().fill_bytes(&mut salt);
        Self::from_password_and_salt(password, salt, iterations)
    }

    pub fn from_password_and_salt(password: &[u8], salt: Vec<u8>, iterations: u32) -> Self {
        let salted = salted_password(password, &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        Verifier { iterations, salt, stored_key: sha256(&client_key), server_key: hmac(&salted, b"Server Key") }
    }

    /// Parses PostgreSQL's text form; `None` if `text` is not a SCRAM-SHA-256 verifier.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let iterations: u32 = iterations.parse().ok().filter(|i| (1..=ITERATIONS_MAX).contains(i))?;
        Some(Verifier {
            iterations,
            salt: BASE64.decode(salt).ok()?,
            stored_key: BASE64.decode(stored).ok()?.try_into().ok()?,
            server_key: BASE64.decode(server).ok()?.try_into().ok()?,
        })
    }

    /// PostgreSQL's text form.
    pub fn to_text(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            BASE64.encode(&self.salt),
            BASE64.encode(self.stored_key),
            BASE64.encode(self.server_key)
        )
    }
}

/// Splits `text` at commas into `key=value` attributes, in order.
fn attributes(text: &str) -> impl Iterator<Item = (char, &str)> {
    text.split(',').filter_map(|part| {
        let mut chars = part.chars();
        let key = chars.next()?;
        part.get(1..)?.strip_prefix('=').map(|value| (key, value))
    })
}

fn attribute<'t>(text: &'t str, key: char, what: &'static str) -> WireResult<&'t str> {
    attributes(text).find(|(k, _)| *k == key).map(|(_, v)| v).ok_or(WireError::Scram(what))
}

fn utf8(bytes: &[u8]) -> WireResult<&str> {
    std::str::from_utf8(bytes).map_err(|_| WireError::Scram("message is not UTF-8"))
}

/// The server side of one exchange.
#[derive(Debug)]
pub struct ServerExchange {
    verifier: Verifier,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    gs2_header: String,
}

/// The outcome of a verified exchange.
#[derive(Debug, Clone)]
pub struct ServerSuccess {
    /// `server-final-message`, to send in AuthenticationSASLFinal.
    pub server_final: String,
    /// The client's ClientKey, recovered from its proof.
    pub client_key: Key,
}

impl ServerExchange {
    /// Handles `client-first-message`; returns the exchange and `server-first-message`.
    pub fn start(verifier: Verifier, client_first: &[u8]) -> WireResult<(Self, String)> {
        let text = utf8(client_first)?;
        let (gs2_header, bare) = split_gs2_header(text)?;
        if attributes(bare).any(|(k, _)| k == 'm') {
            return Err(WireError::Scram("mandatory extensions are not supported"));
        }
        let client_nonce = attribute(bare, 'r', "client nonce missing")?;
        if client_nonce.is_empty() || !client_nonce.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(WireError::Scram("client nonce is not printable"));
        }
        let nonce = format!("{client_nonce}{}", random_nonce());
        let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&verifier.salt), verifier.iterations);
        let exchange = ServerExchange {
            verifier,
            client_first_bare: bare.to_owned(),
            server_first: server_first.clone(),
            nonce,
            gs2_header: gs2_header.to_owned(),
        };
        Ok((exchange, server_first))
    }

    /// Handles `client-final-message`: checks channel binding, nonce and proof.
    pub fn finish(self, client_final: &[u8]) -> WireResult<ServerSuccess> {
        let text = utf8(client_final)?;
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or(WireError::Scram("proof missing"))?;
        let binding = attribute(without_proof, 'c', "channel binding missing")?;
        if BASE64.decode(binding).ok().as_deref() != Some(self.gs2_header.as_bytes()) {
            return Err(WireError::Scram("channel binding does not match"));
        }
        if attribute(without_proof, 'r', "nonce missing")? != self.nonce {
            return Err(WireError::Scram("nonce does not match"));
        }
        let proof: Key =
            BASE64.decode(proof).ok().and_then(|p| p.try_into().ok()).ok_or(WireError::Scram("proof is malformed"))?;
        let auth_message = format!("{},{},{}", self.client_first_bare, self.server_first, without_proof);
        let client_signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let client_key = xor(&proof, &client_signature);
        if !constant_time_eq(&sha256(&client_key), &self.verifier.stored_key) {
            return Err(WireError::ScramVerification);
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(ServerSuccess { server_final: format!("v={}", BASE64.encode(server_signature)), client_key })
    }
}

/// Splits `gs2-header` (`n,,` / `y,,`, optional `a=authzid`) from `client-first-message-bare`.
fn split_gs2_header(text: &str) -> WireResult<(&str, &str)> {
    let flag = text.as_bytes().first().copied();
    match flag {
        Some(b'n' | b'y') => {}
        Some(b'p') => return Err(WireError::Scram("channel binding was not offered")),
        _ => return Err(WireError::Scram("malformed gs2 header")),
    }
    let after_flag = text
        .get(2..)
        .filter(|_| text.as_bytes().get(1) == Some(&b','))
        .ok_or(WireError::Scram("malformed gs2 header"))?;
    let comma = after_flag.find(',').ok_or(WireError::Scram("malformed gs2 header"))?;
    let header_len = 2 + comma + 1;
    Ok((&text[..header_len], &text[header_len..]))
}

/// What the client side proves with: the password, or keys recovered from an earlier exchange
/// (valid only against a server that uses the same salt and iteration count).
#[derive(Debug, Clone)]
pub enum ClientSecret {
    Password(Vec<u8>),
    Keys { client_key: Key, server_key: Key, salt: Vec<u8>, iterations: u32 },
}

/// The client side of one exchange.
#[derive(Debug)]
pub struct ClientExchange {
    secret: ClientSecret,
    client_first_bare: String,
    nonce: String,
    expected_server_signature: Option<Key>,
}

impl ClientExchange {
    /// Starts an exchange; returns it and `client-first-message`.
    pub fn start(secret: ClientSecret) -> (Self, String) {
        let nonce = random_nonce();
        let client_first_bare = format!("n=,r={nonce}");
        let message = format!("n,,{client_first_bare}");
        (ClientExchange { secret, client_first_bare, nonce, expected_server_signature: None }, message)
    }

    /// Handles `server-first-message`; returns `client-final-message`.
    pub fn respond(&mut self, server_first: &[u8]) -> WireResult<String> {
        let text = utf8(server_first)?;
        let nonce = attribute(text, 'r', "server nonce missing")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(WireError::Scram("server nonce does not extend the client nonce"));
        }
        let salt =
            BASE64.decode(attribute(text, 's', "salt missing")?).map_err(|_| WireError::Scram("salt is malformed"))?;
        let iterations: u32 = attribute(text, 'i', "iteration count missing")?
            .parse()
            .ok()
            .filter(|i| (1..=ITERATIONS_MAX).contains(i))
            .ok_or(WireError::Scram("iteration count out of range"))?;
        let (client_key, server_key) = self.keys(&salt, iterations)?;
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{},{}", self.client_first_bare, text, without_proof);
        let client_signature = hmac(&sha256(&client_key), auth_message.as_bytes());
        self.expected_server_signature = Some(hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(xor(&client_key, &client_signature))))
    }

    fn keys(&self, salt: &[u8], iterations: u32) -> WireResult<(Key, Key)> {
        match &self.secret {
            ClientSecret::Password(password) => {
                let salted = salted_password(password, salt, iterations);
                Ok((hmac(&salted, b"Client Key"), hmac(&salted, b"Server Key")))
            }
            ClientSecret::Keys { client_key, server_key, salt: own_salt, iterations: own_iterations } => {
                if own_salt != salt || *own_iterations != iterations {
                    return Err(WireError::Scram("server verifier differs from the stored one"));
                }
                Ok((*client_key, *server_key))
            }
        }
    }

    /// Checks `server-final-message`.
    pub fn verify(&self, server_final: &[u8]) -> WireResult<()> {
        let text = utf8(server_final)?;
        if attribute(text, 'e', "").is_ok() {
            return Err(WireError::ScramVerification);
        }
        let signature = BASE64
            .decode(attribute(text, 'v', "server signature missing")?)
            .map_err(|_| WireError::Scram("server signature is malformed"))?;
        let expected = self.expected_server_signature.ok_or(WireError::Scram("server-final before server-first"))?;
        if constant_time_eq(&signature, &expected) {
            Ok(())
        } else {
            Err(WireError::ScramVerification)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_exchange(verifier: Verifier, secret: ClientSecret) -> WireResult<ServerSuccess> {
        let (mut client, client_first) = ClientExchange::start(secret);
        let (server, server_first) = ServerExchange::start(verifier, client_first.as_bytes())?;
        let client_final = client.respond(server_first.as_bytes())?;
        let success = server.finish(client_final.as_bytes())?;
        client.verify(success.server_final.as_bytes())?;
        Ok(success)
    }

    #[test]
    fn right_password_verifies_both_ways_and_wrong_one_fails() {
        let verifier = Verifier::from_password(b"secret", 64);
        assert!(run_exchange(verifier.clone(), ClientSecret::Password(b"secret".to_vec())).is_ok());
        let wrong = run_exchange(verifier, ClientSecret::Password(b"guess".to_vec()));
        assert_eq!(wrong.err(), Some(WireError::ScramVerification));
    }

    #[test]
    fn recovered_client_key_authenticates_again() {
        let verifier = Verifier::from_password(b"secret", 64);
        let success = run_exchange(verifier.clone(), ClientSecret::Password(b"secret".to_vec())).expect("first login");
        let keys = ClientSecret::Keys {
            client_key: success.client_key,
            server_key: verifier.server_key,
            salt: verifier.salt.clone(),
            iterations: verifier.iterations,
        };
        assert!(run_exchange(verifier, keys).is_ok());
    }

    #[test]
    fn verifier_text_round_trips() {
        let verifier = Verifier::from_password(b"pw", 4096);
        assert_eq!(Verifier::parse(&verifier.to_text()), Some(verifier));
        assert_eq!(Verifier::parse("md5abc"), None);
    }

    #[test]
    fn garbage_client_messages_are_errors() {
        let verifier = Verifier::from_password(b"pw", 16);
        for bad in [&b""[..], b"x", b"p=tls-unique,,n=,r=abc", b"n,,n=", b"n,,n=,r=", b"\xff"] {
            assert!(ServerExchange::start(verifier.clone(), bad).is_err(), "{bad:?}");
        }
        let (server, _) = ServerExchange::start(verifier, b"n,,n=,r=abc").expect("valid first message");
        assert!(server.finish(b"c=biws,r=abc,p=AAAA").is_err());
    }
}
