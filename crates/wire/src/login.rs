//! The client side of PostgreSQL connection start, without I/O: feed it the server's messages,
//! send what it returns. Used by the dispatcher and its agent (async) and the load generator
//! (blocking).
//!
//! ```text
//!   StartupMessage ─► R(Ok | Cleartext | MD5 | SASL…) ─► S… K Z('I') ─► Done(Welcome)
//! ```

use crate::scram::{ClientExchange, ClientSecret, MECHANISM};
use crate::{auth_messages, md5, startup, Authentication, BackendMessage, TransactionStatus, WireError};

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// The server refused with this ErrorResponse.
    #[error("server error {code}: {message}")]
    Server { code: String, message: String },
    /// The server broke the protocol or asked for something we cannot do.
    #[error("login: {0}")]
    Protocol(String),
    /// A SCRAM message or signature was wrong.
    #[error("login: {0}")]
    Wire(#[from] WireError),
}

type Result<T> = std::result::Result<T, LoginError>;

/// Who logs in where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    pub user: String,
    pub database: String,
    /// Needed unless the server trusts us.
    pub password: Option<String>,
    /// Extra startup parameters (`application_name`, …).
    pub parameters: Vec<(String, String)>,
}

impl LoginRequest {
    pub fn trust(user: &str, database: &str) -> Self {
        LoginRequest { user: user.into(), database: database.into(), password: None, parameters: Vec::new() }
    }
}

/// What the server told us during login.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Welcome {
    pub parameters: Vec<(String, String)>,
    pub process_id: i32,
    pub secret_key: Vec<u8>,
}

/// What to do after feeding a message.
#[derive(Debug, PartialEq, Eq)]
pub enum LoginStep {
    /// Send these bytes, then keep feeding messages.
    Send(Vec<u8>),
    /// Keep feeding messages.
    Continue,
    /// ReadyForQuery arrived: the connection is usable.
    Done(Welcome),
}

/// The login state machine.
#[derive(Debug)]
pub struct Login {
    request: LoginRequest,
    scram: Option<ClientExchange>,
    welcome: Welcome,
}

impl Login {
    /// Starts a login; returns it and the StartupMessage to send.
    pub fn start(request: LoginRequest) -> (Self, Vec<u8>) {
        let mut params: Vec<(&str, &str)> = vec![("user", &request.user), ("database", &request.database)];
        params.extend(request.parameters.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut packet = Vec::with_capacity(128);
        startup::encode_startup(&mut packet, &params);
        (Login { request, scram: None, welcome: Welcome::default() }, packet)
    }

    /// Feeds one server message.
    pub fn on_message(&mut self, message: BackendMessage<'_>) -> Result<LoginStep> {
        match message {
            BackendMessage::Authentication(auth) => self.on_authentication(auth),
            BackendMessage::ParameterStatus { name, value } => {
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                self.welcome.parameters.push((text(name), text(value)));
                Ok(LoginStep::Continue)
            }
            BackendMessage::BackendKeyData { process_id, secret_key } => {
                self.welcome.process_id = process_id;
                self.welcome.secret_key = secret_key.to_vec();
                Ok(LoginStep::Continue)
            }
            BackendMessage::NoticeResponse(_) | BackendMessage::NegotiateProtocolVersion { .. } => {
                Ok(LoginStep::Continue)
            }
            BackendMessage::ReadyForQuery(TransactionStatus::Idle) => {
                Ok(LoginStep::Done(std::mem::take(&mut self.welcome)))
            }
            BackendMessage::ErrorResponse(fields) => Err(server_error(&fields)),
            other => Err(LoginError::Protocol(format!("unexpected message {:?} during login", other.tag() as char))),
        }
    }

    fn on_authentication(&mut self, auth: Authentication<'_>) -> Result<LoginStep> {
        let mut out = Vec::new();
        match auth {
            Authentication::Ok => return Ok(LoginStep::Continue),
            Authentication::CleartextPassword => auth_messages::encode_password(&mut out, self.password()?.as_bytes()),
            Authentication::Md5Password { salt } => {
                let stored = md5::stored_hash(self.request.user.as_bytes(), self.password()?.as_bytes());
                auth_messages::encode_password(&mut out, md5::salted_response(&stored, salt).as_bytes());
            }
            ref sasl @ Authentication::Sasl { .. } if sasl.offers(MECHANISM) => {
                let secret = ClientSecret::Password(self.password()?.as_bytes().to_vec());
                let (exchange, first) = ClientExchange::start(secret);
                self.scram = Some(exchange);
                auth_messages::encode_sasl_initial(&mut out, MECHANISM, first.as_bytes());
            }
            Authentication::SaslContinue(data) => {
                let exchange = self.scram.as_mut().ok_or_else(|| protocol("SASL continue before SASL start"))?;
                auth_messages::encode_sasl_response(&mut out, exchange.respond(data)?.as_bytes());
            }
            Authentication::SaslFinal(data) => {
                let exchange = self.scram.as_ref().ok_or_else(|| protocol("SASL final before SASL start"))?;
                exchange.verify(data)?;
                return Ok(LoginStep::Continue);
            }
            Authentication::Sasl { .. } | Authentication::Unsupported { .. } => {
                return Err(protocol("the server asks for an authentication method we do not speak"))
            }
        }
        Ok(LoginStep::Send(out))
    }

    fn password(&self) -> Result<&str> {
        self.request
            .password
            .as_deref()
            .ok_or_else(|| protocol("the server asks for a password and none is configured"))
    }
}

fn protocol(text: &str) -> LoginError {
    LoginError::Protocol(text.to_string())
}

/// An ErrorResponse as a typed error.
pub fn server_error(fields: &crate::backend::Fields<'_>) -> LoginError {
    let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
    LoginError::Server { code: text(fields.code()), message: text(fields.message()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::build;
    use crate::frame::split_message;

    fn feed(login: &mut Login, bytes: &[u8]) -> Result<LoginStep> {
        let (header, body) = split_message(bytes, 1 << 20).expect("valid").expect("complete");
        login.on_message(BackendMessage::decode(header.tag, body)?)
    }

    // Goal: a trust login collects parameters and the key and ends at ReadyForQuery; method:
    // feed the messages a server sends.
    #[test]
    fn trust_login_ends_with_the_welcome() {
        let (mut login, startup) = Login::start(LoginRequest::trust("app", "shop"));
        assert!(startup.windows(4).any(|w| w == b"shop"));
        let mut buf = Vec::new();
        build::authentication(&mut buf, &Authentication::Ok);
        assert_eq!(feed(&mut login, &buf).expect("ok"), LoginStep::Continue);
        buf.clear();
        build::parameter_status(&mut buf, b"server_version", b"15.0");
        feed(&mut login, &buf).expect("param");
        buf.clear();
        build::backend_key_data(&mut buf, 77, &[1, 2, 3, 4]);
        feed(&mut login, &buf).expect("key");
        buf.clear();
        build::ready_for_query(&mut buf, TransactionStatus::Idle);
        let LoginStep::Done(welcome) = feed(&mut login, &buf).expect("ready") else { panic!("not done") };
        assert_eq!(welcome.process_id, 77);
        assert_eq!(welcome.parameters, vec![("server_version".to_string(), "15.0".to_string())]);
    }

    // Goal: a password request without a password is a clear error; method: feed MD5 request.
    #[test]
    fn missing_password_is_a_typed_error() {
        let (mut login, _) = Login::start(LoginRequest::trust("app", "shop"));
        let mut buf = Vec::new();
        build::authentication(&mut buf, &Authentication::Md5Password { salt: [1, 2, 3, 4] });
        assert!(matches!(feed(&mut login, &buf), Err(LoginError::Protocol(_))));
    }
}
