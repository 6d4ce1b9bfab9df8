//! How a dispatcher proves to an agent that it holds the agent key, and the agent proves it
//! back, before the agent logs in to PostgreSQL on the dispatcher's behalf. Without I/O: both
//! sides are state machines fed with messages.
//!
//! ```text
//!  dispatcher                                       agent
//!   StartupMessage (user, database, bypass_link=1) ─►  no bypass_link? ─► FATAL 28000
//!                  ◄─ AuthenticationSASL "BYPASS-LINK-HMAC-SHA256"
//!   SASLInitialResponse (dispatcher nonce)        ─►
//!                  ◄─ AuthenticationSASLContinue (agent nonce)
//!   SASLResponse (HMAC(key, "dispatcher", nonces, user, database)) ─►  wrong? ─► FATAL 28P01
//!                  ◄─ AuthenticationSASLFinal (HMAC(key, "agent", …)); then PostgreSQL's login
//! ```
//! The PostgreSQL SASL framing lets a plain client fail cleanly (it never offers the startup
//! parameter, so it gets 28000 before any exchange); the nonces of both sides make every proof
//! single-use, and the agent's own proof stops a process posing as an agent from collecting
//! requests.

use std::path::Path;

use bypass_wire::auth::Refusal;
use bypass_wire::auth_messages;
use bypass_wire::backend::build;
use bypass_wire::login::{Login, LoginError, LoginRequest, LoginStep};
use bypass_wire::scram::constant_time_eq;
use bypass_wire::{Authentication, BackendMessage, SqlState};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// The startup parameter a dispatcher's link carries.
pub const LINK_PARAMETER: &str = "bypass_link";
/// The SASL mechanism name of the link proof.
pub const LINK_MECHANISM: &str = "BYPASS-LINK-HMAC-SHA256";
/// The least key length accepted, in bytes.
pub const KEY_BYTES_MIN: usize = 32;
/// The most key bytes read from a key file.
const KEY_BYTES_MAX: usize = 4096;
const NONCE_BYTES: usize = 32;

/// The secret shared by a dispatcher and its agents.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkKey(Vec<u8>);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("LinkKey(..)")
    }
}

impl LinkKey {
    /// A key from text (surrounding whitespace ignored); at least [`KEY_BYTES_MIN`] bytes.
    pub fn from_text(text: &str) -> Result<LinkKey, String> {
        let key = text.trim();
        if key.len() < KEY_BYTES_MIN {
            return Err(format!("the key has {} bytes; at least {KEY_BYTES_MIN} are required", key.len()));
        }
        if key.len() > KEY_BYTES_MAX {
            return Err(format!("the key is longer than {KEY_BYTES_MAX} bytes"));
        }
        Ok(LinkKey(key.as_bytes().to_vec()))
    }

    /// Reads a key file (e.g. made with `head -c 32 /dev/urandom | base64 > agent.key`).
    pub fn load(path: &Path) -> Result<LinkKey, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        LinkKey::from_text(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A fresh random key as text (64 hex digits).
    pub fn random_text() -> String {
        let mut bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut bytes);
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn proof(&self, role: &str, nonces: &Nonces, user: &str, database: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for part in [role, &nonces.dispatcher, &nonces.agent, user, database] {
            mac.update(part.as_bytes());
            mac.update(&[0]);
        }
        mac.finalize().into_bytes().iter().map(|byte| format!("{byte:02x}")).collect()
    }
}

fn nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[derive(Debug, Clone, Default)]
struct Nonces {
    dispatcher: String,
    agent: String,
}

/// The dispatcher's side: the key proof, then the ordinary login relayed from PostgreSQL.
#[derive(Debug)]
pub struct LinkLogin {
    key: LinkKey,
    user: String,
    database: String,
    nonces: Nonces,
    agent_proven: bool,
    login: Login,
}

impl LinkLogin {
    /// Starts a link login; returns it and the StartupMessage to send.
    pub fn start(key: LinkKey, mut request: LoginRequest) -> (Self, Vec<u8>) {
        let (user, database) = (request.user.clone(), request.database.clone());
        request.parameters.push((LINK_PARAMETER.to_string(), "1".to_string()));
        let (login, startup) = Login::start(request);
        let link = LinkLogin { key, user, database, nonces: Nonces::default(), agent_proven: false, login };
        (link, startup)
    }

    /// Feeds one message from the agent.
    pub fn on_message(&mut self, message: BackendMessage<'_>) -> Result<LoginStep, LoginError> {
        let protocol = |text: &str| LoginError::Protocol(format!("agent link: {text}"));
        match message {
            BackendMessage::Authentication(ref sasl @ Authentication::Sasl { .. }) => {
                if !sasl.offers(LINK_MECHANISM) || !self.nonces.dispatcher.is_empty() {
                    return Err(protocol("the agent does not offer the link proof"));
                }
                self.nonces.dispatcher = nonce();
                let mut out = Vec::new();
                auth_messages::encode_sasl_initial(&mut out, LINK_MECHANISM, self.nonces.dispatcher.as_bytes());
                Ok(LoginStep::Send(out))
            }
            BackendMessage::Authentication(Authentication::SaslContinue(agent_nonce)) => {
                if self.nonces.dispatcher.is_empty()
                    || !self.nonces.agent.is_empty()
                    || agent_nonce.len() != 2 * NONCE_BYTES
                {
                    return Err(protocol("unexpected agent nonce"));
                }
                self.nonces.agent = String::from_utf8_lossy(agent_nonce).into_owned();
                let proof = self.key.proof("dispatcher", &self.nonces, &self.user, &self.database);
                let mut out = Vec::new();
                auth_messages::encode_sasl_response(&mut out, proof.as_bytes());
                Ok(LoginStep::Send(out))
            }
            BackendMessage::Authentication(Authentication::SaslFinal(agent_proof)) => {
                let expected = self.key.proof("agent", &self.nonces, &self.user, &self.database);
                if self.nonces.agent.is_empty() || !constant_time_eq(expected.as_bytes(), agent_proof) {
                    return Err(protocol("the agent did not prove the key"));
                }
                self.agent_proven = true;
                Ok(LoginStep::Continue)
            }
            BackendMessage::Authentication(Authentication::Ok) if !self.agent_proven => {
                Err(protocol("the agent admitted the link without the key proof"))
            }
            other => self.login.on_message(other),
        }
    }
}

/// The agent's side of the proof.
#[derive(Debug)]
pub struct LinkChallenge {
    key: LinkKey,
    user: String,
    database: String,
    nonces: Nonces,
}

/// What the agent does after a dispatcher's message.
#[derive(Debug, PartialEq, Eq)]
pub enum Challenge {
    /// Send these bytes and read the next password message.
    Send(Vec<u8>),
    /// The dispatcher proved the key; send these bytes (SASLFinal), then log in to PostgreSQL.
    Proven(Vec<u8>),
}

impl LinkChallenge {
    /// Checks the startup's link parameter; returns the challenge and the AuthenticationSASL to
    /// send, or the refusal a plain client gets.
    pub fn start(key: LinkKey, request: &LoginRequest) -> Result<(LinkChallenge, Vec<u8>), Refusal> {
        let linked = request.parameters.iter().any(|(name, value)| name == LINK_PARAMETER && value == "1");
        if !linked {
            return Err(Refusal::new(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                "this is a Bypass agent: only a dispatcher holding the agent key may connect",
            ));
        }
        let mut out = Vec::new();
        let mechanisms = format!("{LINK_MECHANISM}\0");
        build::authentication(&mut out, &Authentication::Sasl { mechanisms: mechanisms.as_bytes() });
        let challenge = LinkChallenge {
            key,
            user: request.user.clone(),
            database: request.database.clone(),
            nonces: Nonces::default(),
        };
        Ok((challenge, out))
    }

    /// Handles the body of the dispatcher's next `'p'` message.
    pub fn respond(&mut self, body: &[u8]) -> Result<Challenge, Refusal> {
        let failed = || Refusal::new(SqlState::INVALID_PASSWORD, "agent key proof failed");
        let mut out = Vec::new();
        if self.nonces.dispatcher.is_empty() {
            let (mechanism, data) = auth_messages::decode_sasl_initial(body).map_err(|_| failed())?;
            let data = data.unwrap_or_default();
            if mechanism != LINK_MECHANISM.as_bytes() || data.len() != 2 * NONCE_BYTES {
                return Err(failed());
            }
            self.nonces.dispatcher = String::from_utf8_lossy(data).into_owned();
            self.nonces.agent = nonce();
            build::authentication(&mut out, &Authentication::SaslContinue(self.nonces.agent.as_bytes()));
            return Ok(Challenge::Send(out));
        }
        let expected = self.key.proof("dispatcher", &self.nonces, &self.user, &self.database);
        if !constant_time_eq(expected.as_bytes(), body) {
            return Err(failed());
        }
        let proof = self.key.proof("agent", &self.nonces, &self.user, &self.database);
        build::authentication(&mut out, &Authentication::SaslFinal(proof.as_bytes()));
        Ok(Challenge::Proven(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bypass_wire::frame::split_message;

    fn key(text: &str) -> LinkKey {
        LinkKey::from_text(&text.repeat(32)).expect("long enough")
    }

    /// Runs the proof between a dispatcher holding `dispatcher_key` and an agent holding
    /// `agent_key`; returns the agent's verdict.
    fn run(dispatcher_key: LinkKey, agent_key: LinkKey) -> Result<(), String> {
        let request = LoginRequest::trust("app", "shop");
        let (mut link, startup) = LinkLogin::start(dispatcher_key, request);
        let params = bypass_wire::startup::decode_startup(&startup).expect("valid").expect("whole").0;
        let bypass_wire::StartupPacket::Startup(params) = params else { panic!("startup") };
        let request = bypass_wire::StartupRequest::from_params(&params).expect("user");
        let parameters = request.parameters.clone();
        let login_request = LoginRequest { parameters, ..LoginRequest::trust(&request.user, &request.database) };
        let (mut challenge, mut to_dispatcher) =
            LinkChallenge::start(agent_key, &login_request).map_err(|r| r.message)?;
        loop {
            let (header, body) = split_message(&to_dispatcher, 1 << 20).expect("valid").expect("whole");
            let step = link.on_message(BackendMessage::decode(header.tag, body).expect("decodes"));
            let reply = match step {
                Ok(LoginStep::Send(reply)) => reply,
                Ok(_) => return Ok(()),
                Err(error) => return Err(error.to_string()),
            };
            match challenge.respond(&reply[5..]).map_err(|r| r.message)? {
                Challenge::Send(bytes) => to_dispatcher = bytes,
                Challenge::Proven(bytes) => {
                    let (header, body) = split_message(&bytes, 1 << 20).expect("valid").expect("whole");
                    link.on_message(BackendMessage::decode(header.tag, body).expect("decodes"))
                        .map_err(|e| e.to_string())?;
                    return Ok(());
                }
            }
        }
    }

    #[test]
    fn the_same_key_proves_both_ways_and_another_key_fails() {
        assert_eq!(run(key("a"), key("a")), Ok(()));
        assert_eq!(run(key("a"), key("b")), Err("agent key proof failed".into()));
    }

    #[test]
    fn a_plain_client_is_refused_before_any_exchange() {
        let refusal =
            LinkChallenge::start(key("a"), &LoginRequest::trust("postgres", "postgres")).expect_err("refused");
        assert_eq!(refusal.code, SqlState::INVALID_AUTHORIZATION_SPECIFICATION);
        assert!(LinkKey::from_text("short").is_err());
    }
}
