//! The server side of client authentication, without I/O: which exchange a method and a stored
//! secret call for, the exchange itself, and the mock exchange an unknown user gets.
//!
//! ```text
//!  method + secret ──► Exchange::start ──► AuthenticationMD5Password | SASL | CleartextPassword
//!  client 'p' body ──► Exchange::respond ──► Continue (SASLContinue sent) | Done(Proof) | Failure
//! ```
//!
//! Invariant: a user name cannot be told apart by the exchange. A user without a secret (not in
//! the auth file, not found by a lookup) or with a secret the method cannot use gets the same
//! first message, the same number of round trips and the same failure at the same point as a
//! known user with a wrong password (as PostgreSQL's mock SCRAM exchange): SCRAM with a salt
//! derived from a per-process key and the user name (stable across attempts, as a real user's
//! salt is), MD5 with a fresh random salt (as every MD5 challenge has).

use std::sync::Arc;

use hmac::{Hmac, Mac};
use rand::{Rng, RngCore};
use sha2::Sha256;

use crate::auth_file::Secret;
use crate::backend::build;
use crate::error::WireError;
use crate::scram::{constant_time_eq, ServerExchange, Verifier, DEFAULT_ITERATIONS, MECHANISM};
use crate::sqlstate::SqlState;
use crate::{auth_messages, md5, Authentication};

/// How a client proves itself: an hba line's method, or the server's fixed `auth_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Trust,
    Reject,
    /// MD5 challenge; a user whose secret is a SCRAM verifier gets SCRAM (as PostgreSQL).
    Md5,
    ScramSha256,
    /// Cleartext password over the wire, checked against whatever form the secret has.
    Password,
    /// A verified TLS client certificate whose common name is the user name.
    Cert,
}

impl Method {
    /// The hba spelling: `trust`, `md5`, `scram-sha-256`, …
    pub fn name(self) -> &'static str {
        match self {
            Method::Trust => "trust",
            Method::Reject => "reject",
            Method::Md5 => "md5",
            Method::ScramSha256 => "scram-sha-256",
            Method::Password => "password",
            Method::Cert => "cert",
        }
    }
}

/// A client's refusal: the SQLSTATE and message of the FATAL it gets. Messages name what failed
/// and never carry a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: SqlState,
    pub message: String,
}

impl Refusal {
    pub fn new(code: SqlState, message: impl Into<String>) -> Self {
        Refusal { code, message: message.into() }
    }

    /// PostgreSQL's wording for every password failure, known user or not.
    pub fn password_failed(user: &str) -> Self {
        Refusal::new(SqlState::INVALID_PASSWORD, format!("password authentication failed for user \"{user}\""))
    }

    /// Appends the FATAL ErrorResponse.
    pub fn write_fatal(&self, out: &mut Vec<u8>) {
        build::error(out, crate::Severity::Fatal, self.code, &self.message);
    }

    /// True for authentication failures (class 28), the ones a failed-login delay applies to.
    pub fn is_authentication_failure(&self) -> bool {
        self.code.class() == "28"
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{} ({})", self.message, self.code)
    }
}

/// What a successful exchange proved, for servers that log in onward as the client.
#[derive(Debug, Clone)]
pub enum Proof {
    /// No exchange: `trust`.
    Trust,
    /// A verified client certificate named the user.
    Certificate,
    /// SCRAM: the client's ClientKey, which logs in to any server storing the same verifier.
    Scram { client_key: [u8; 32], verifier: Arc<Verifier> },
    /// An MD5 response matched this stored hash.
    Md5 { stored: String },
    /// The client sent this password in clear (method `password`) and it matched.
    Password(Vec<u8>),
}

/// The server's key mock exchanges derive their salts from (and the salts of plaintext
/// passwords): secret, so salts of unknown users cannot be computed offline, and stable, so
/// repeated attempts see the same salt, as they would for a real user. Servers keep it across
/// restarts (`bypass_frontdoor::mock_key`, as PostgreSQL keeps its mock authentication nonce
/// in pg_control); [`MockKey::random`] lasts one process.
#[derive(Clone)]
pub struct MockKey([u8; 32]);

impl MockKey {
    pub fn random() -> Self {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        MockKey(key)
    }

    /// A fixed key, for tests and fuzzing.
    pub fn from_bytes(key: [u8; 32]) -> Self {
        MockKey(key)
    }

    fn derive(&self, purpose: &[u8], user: &str) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(purpose);
        mac.update(&[0]);
        mac.update(user.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The 32 bytes of the key (to store it).
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0
    }

    /// The salt this key gives `user`, known or not.
    fn salt(&self, user: &str) -> Vec<u8> {
        self.derive(b"salt", user)[..16].to_vec()
    }

    /// A verifier no password matches, with the user's stable mock salt and the default
    /// iteration count (what a real verifier of this server shows).
    pub fn scram_verifier(&self, user: &str) -> Verifier {
        Verifier {
            iterations: DEFAULT_ITERATIONS,
            salt: self.salt(user),
            stored_key: self.derive(b"stored", user),
            server_key: self.derive(b"server", user),
        }
    }

    /// The verifier of a plaintext password, salted as an unknown user of this name would be.
    pub fn password_verifier(&self, user: &str, password: &[u8]) -> Verifier {
        Verifier::from_password_and_salt(password, self.salt(user), DEFAULT_ITERATIONS)
    }
}

impl std::fmt::Debug for MockKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("MockKey(..)")
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Wrong password, unknown user, or a secret the method cannot use: one answer for all.
    WrongPassword,
    /// The client broke the exchange (a malformed message, a message out of turn).
    Protocol(WireError),
    /// SASL with a mechanism other than SCRAM-SHA-256.
    InvalidMechanism,
}

impl Failure {
    /// The refusal the client gets; `user` only appears in the password wording.
    pub fn refusal(&self, user: &str) -> Refusal {
        match self {
            Failure::WrongPassword => Refusal::password_failed(user),
            Failure::Protocol(error) => {
                Refusal::new(SqlState::PROTOCOL_VIOLATION, format!("protocol violation: {error}"))
            }
            Failure::InvalidMechanism => {
                Refusal::new(SqlState::PROTOCOL_VIOLATION, "client selected an invalid SASL authentication mechanism")
            }
        }
    }

    /// A short reason for the log line (never a secret).
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::WrongPassword => "password authentication failed",
            Failure::Protocol(_) => "malformed authentication message",
            Failure::InvalidMechanism => "invalid SASL mechanism",
        }
    }
}

/// After a client message: send what was appended to `out`, then either read the next password
/// message or, when done, send the welcome.
#[derive(Debug)]
pub enum Step {
    Continue,
    Done(Proof),
}

/// One password exchange in progress.
pub struct Exchange {
    state: State,
}

enum State {
    Md5 { salt: [u8; 4], stored: Option<String> },
    Cleartext { secret: Option<Secret>, user: String },
    ScramFirst { verifier: Arc<Verifier>, real: bool },
    ScramFinal { exchange: Box<ServerExchange>, verifier: Arc<Verifier>, real: bool },
    Finished,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Md5 { .. } => "md5",
            State::Cleartext { .. } => "cleartext",
            State::ScramFirst { .. } => "scram-first",
            State::ScramFinal { .. } => "scram-final",
            State::Finished => "finished",
        };
        formatter.debug_struct("Exchange").field("state", &state).finish()
    }
}

impl Exchange {
    /// Starts the exchange `method` calls for with the user's stored `secret` (`None`: unknown)
    /// and appends the first authentication request to `out`. `None` for methods without an
    /// exchange (trust, reject, cert), which the caller decides itself.
    pub fn start(
        method: Method,
        user: &str,
        secret: Option<&Secret>,
        mock: &MockKey,
        out: &mut Vec<u8>,
    ) -> Option<Self> {
        let state = match (method, secret) {
            (Method::Trust | Method::Reject | Method::Cert, _) => return None,
            (Method::Password, secret) => State::Cleartext { secret: secret.cloned(), user: user.to_owned() },
            (Method::Md5, Some(Secret::Scram(verifier))) | (Method::ScramSha256, Some(Secret::Scram(verifier))) => {
                State::ScramFirst { verifier: verifier.clone(), real: true }
            }
            (Method::ScramSha256, Some(Secret::Plain { password, verifier })) => {
                let verifier = verifier.get_or_init(|| Arc::new(mock.password_verifier(user, password.as_bytes())));
                State::ScramFirst { verifier: verifier.clone(), real: true }
            }
            // An MD5 hash cannot answer SCRAM, and an unknown user has nothing: both get the
            // mock exchange and fail at its end, as a wrong password does.
            (Method::ScramSha256, Some(Secret::Md5(_)) | None) => {
                State::ScramFirst { verifier: Arc::new(mock.scram_verifier(user)), real: false }
            }
            (Method::Md5, Some(Secret::Plain { password, .. })) => State::Md5 {
                salt: rand::thread_rng().gen(),
                stored: Some(md5::stored_hash(user.as_bytes(), password.as_bytes())),
            },
            (Method::Md5, Some(Secret::Md5(stored))) => {
                State::Md5 { salt: rand::thread_rng().gen(), stored: Some(stored.clone()) }
            }
            (Method::Md5, None) => State::Md5 { salt: rand::thread_rng().gen(), stored: None },
        };
        let request = match &state {
            State::Md5 { salt, .. } => Authentication::Md5Password { salt: *salt },
            State::Cleartext { .. } => Authentication::CleartextPassword,
            _ => Authentication::Sasl { mechanisms: b"SCRAM-SHA-256\0" },
        };
        build::authentication(out, &request);
        Some(Exchange { state })
    }

    /// Handles the body of the client's next `'p'` message, appending any answer to `out`.
    pub fn respond(&mut self, body: &[u8], out: &mut Vec<u8>) -> Result<Step, Failure> {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Md5 { salt, stored } => md5_response(salt, stored.as_deref(), body),
            State::Cleartext { secret, user } => cleartext_response(secret.as_ref(), &user, body),
            State::ScramFirst { verifier, real } => {
                let exchange = scram_first(&verifier, body, out)?;
                self.state = State::ScramFinal { exchange: Box::new(exchange), verifier, real };
                Ok(Step::Continue)
            }
            State::ScramFinal { exchange, verifier, real } => scram_final(*exchange, verifier, real, body, out),
            State::Finished => Err(Failure::Protocol(WireError::Scram("message after the exchange ended"))),
        }
    }
}

fn md5_response(salt: [u8; 4], stored: Option<&str>, body: &[u8]) -> Result<Step, Failure> {
    let response = auth_messages::decode_password(body).map_err(Failure::Protocol)?;
    // An unknown user's response is still checked against a hash, so both paths do the same work.
    let fallback = md5::stored_hash(b"", b"");
    let correct = md5::verify_response(stored.unwrap_or(&fallback), salt, response);
    match (stored, correct) {
        (Some(stored), true) => Ok(Step::Done(Proof::Md5 { stored: stored.to_owned() })),
        _ => Err(Failure::WrongPassword),
    }
}

fn cleartext_response(secret: Option<&Secret>, user: &str, body: &[u8]) -> Result<Step, Failure> {
    let password = auth_messages::decode_password(body).map_err(Failure::Protocol)?;
    let correct = match secret {
        None => false,
        Some(Secret::Plain { password: stored, .. }) => constant_time_eq(stored.as_bytes(), password),
        Some(Secret::Md5(stored)) => {
            constant_time_eq(md5::stored_hash(user.as_bytes(), password).as_bytes(), stored.as_bytes())
        }
        Some(Secret::Scram(verifier)) => {
            let candidate = Verifier::from_password_and_salt(password, verifier.salt.clone(), verifier.iterations);
            constant_time_eq(&candidate.stored_key, &verifier.stored_key)
        }
    };
    match correct {
        true => Ok(Step::Done(Proof::Password(password.to_vec()))),
        false => Err(Failure::WrongPassword),
    }
}

fn scram_first(verifier: &Verifier, body: &[u8], out: &mut Vec<u8>) -> Result<ServerExchange, Failure> {
    let (mechanism, data) = auth_messages::decode_sasl_initial(body).map_err(Failure::Protocol)?;
    if mechanism != MECHANISM.as_bytes() {
        return Err(Failure::InvalidMechanism);
    }
    let (exchange, server_first) =
        ServerExchange::start(verifier.clone(), data.unwrap_or_default()).map_err(Failure::Protocol)?;
    build::authentication(out, &Authentication::SaslContinue(server_first.as_bytes()));
    Ok(exchange)
}

fn scram_final(
    exchange: ServerExchange,
    verifier: Arc<Verifier>,
    real: bool,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<Step, Failure> {
    let success = match exchange.finish(body) {
        Ok(success) => success,
        Err(WireError::ScramVerification) => return Err(Failure::WrongPassword),
        Err(error) => return Err(Failure::Protocol(error)),
    };
    if !real {
        // A mock verifier has no password; a proof can only match it by breaking SHA-256.
        return Err(Failure::WrongPassword);
    }
    build::authentication(out, &Authentication::SaslFinal(success.server_final.as_bytes()));
    Ok(Step::Done(Proof::Scram { client_key: success.client_key, verifier }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::split_message;
    use crate::scram::{ClientExchange, ClientSecret};
    use crate::BackendMessage;

    fn key() -> MockKey {
        MockKey::from_bytes([7; 32])
    }

    /// The authentication request at the head of `out` (tag, request code).
    fn request_code(out: &[u8]) -> i32 {
        let (header, body) = split_message(out, 1 << 20).expect("valid").expect("whole");
        assert_eq!(header.tag, crate::tag::backend::AUTHENTICATION);
        i32::from_be_bytes([body[0], body[1], body[2], body[3]])
    }

    /// Runs a SCRAM client with `password` against an exchange; returns each step's request codes.
    fn scram_login(
        method: Method,
        user: &str,
        secret: Option<&Secret>,
        password: &str,
    ) -> (Vec<i32>, Result<Proof, Failure>) {
        let mut out = Vec::new();
        let mut exchange = Exchange::start(method, user, secret, &key(), &mut out).expect("an exchange");
        let mut codes = vec![request_code(&out)];
        let (mut client, first) = ClientExchange::start(ClientSecret::Password(password.as_bytes().to_vec()));
        let mut body = Vec::new();
        auth_messages::encode_sasl_initial(&mut body, MECHANISM, first.as_bytes());
        out.clear();
        assert!(matches!(exchange.respond(&body[5..], &mut out), Ok(Step::Continue)));
        codes.push(request_code(&out));
        let (_, message) = split_message(&out, 1 << 20).expect("valid").expect("whole");
        let BackendMessage::Authentication(Authentication::SaslContinue(server_first)) =
            BackendMessage::decode(b'R', message).expect("decodes")
        else {
            panic!("not SASLContinue")
        };
        let client_final = client.respond(server_first).expect("client answers");
        body.clear();
        auth_messages::encode_sasl_response(&mut body, client_final.as_bytes());
        out.clear();
        let result = exchange.respond(&body[5..], &mut out).map(|step| match step {
            Step::Done(proof) => proof,
            Step::Continue => panic!("SCRAM ends after two messages"),
        });
        (codes, result)
    }

    #[test]
    fn unknown_user_gets_the_same_scram_exchange_and_failure_as_a_wrong_password() {
        // Goal: no user enumeration through SCRAM. Method: run the same client against a known
        // user with a wrong password and an unknown user; compare request codes and outcomes.
        let secret = Secret::classify("right".into());
        let (known_codes, known) = scram_login(Method::ScramSha256, "alice", Some(&secret), "wrong");
        let (unknown_codes, unknown) = scram_login(Method::ScramSha256, "mallory", None, "wrong");
        assert_eq!(known_codes, unknown_codes);
        assert_eq!(known.expect_err("wrong password"), Failure::WrongPassword);
        assert_eq!(unknown.expect_err("unknown user"), Failure::WrongPassword);
        let (_, right) = scram_login(Method::ScramSha256, "alice", Some(&secret), "right");
        assert!(matches!(right, Ok(Proof::Scram { .. })));
    }

    #[test]
    fn mock_salt_is_stable_per_user_and_differs_between_users() {
        assert_eq!(key().scram_verifier("a").salt, key().scram_verifier("a").salt);
        assert_ne!(key().scram_verifier("a").salt, key().scram_verifier("b").salt);
        assert_ne!(MockKey::random().scram_verifier("a").salt, MockKey::random().scram_verifier("a").salt);
        let plain = key().password_verifier("a", b"pw");
        assert_eq!(plain.salt, key().scram_verifier("a").salt, "a known user's salt is made as an unknown one's");
        assert_eq!(plain.salt, key().password_verifier("a", b"other").salt);
    }

    #[test]
    fn md5_exchange_checks_known_users_and_fails_unknown_ones_the_same_way() {
        let secret = Secret::classify("pw".into());
        for (secret, password, expect_ok) in
            [(Some(&secret), "pw", true), (Some(&secret), "no", false), (None, "pw", false)]
        {
            let mut out = Vec::new();
            let mut exchange = Exchange::start(Method::Md5, "bob", secret, &key(), &mut out).expect("exchange");
            assert_eq!(request_code(&out), 5);
            let salt: [u8; 4] = out[out.len() - 4..].try_into().expect("salt");
            let response = md5::salted_response(&md5::stored_hash(b"bob", password.as_bytes()), salt);
            let mut body = Vec::new();
            auth_messages::encode_password(&mut body, response.as_bytes());
            let result = exchange.respond(&body[5..], &mut Vec::new());
            assert_eq!(result.is_ok(), expect_ok, "{secret:?} {password}");
            if !expect_ok {
                assert_eq!(result.expect_err("fails"), Failure::WrongPassword);
            }
        }
    }

    #[test]
    fn garbage_in_every_state_is_an_error_not_a_panic() {
        let secret = Secret::classify("pw".into());
        for method in [Method::Md5, Method::ScramSha256, Method::Password] {
            for secret in [Some(&secret), None] {
                for garbage in [&b""[..], b"\0", b"SCRAM-SHA-256\0\xff\xff\xff\xff", b"x\0\0\0\0\x05abc", b"\xff"] {
                    let mut out = Vec::new();
                    let mut exchange = Exchange::start(method, "u", secret, &key(), &mut out).expect("exchange");
                    let _ = exchange.respond(garbage, &mut out);
                    let _ = exchange.respond(garbage, &mut out);
                }
            }
        }
    }
}
