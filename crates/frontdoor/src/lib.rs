//! The one authenticated front door of every Bypass server (pooler, dispatcher, engine).
//!
//! ```text
//!   TcpStream ─► negotiate ─────────► read_first ──────────► choose_method ─► authenticate ─► welcome
//!               GSSENC → 'N'          StartupMessage           hba or fixed     SCRAM / MD5 /    AuthOk, S…,
//!               SSL → 'S'+TLS | 'N'   CancelRequest → caller   method           password / cert  K, Z('I')
//!               direct TLS (ALPN)                                               mock if unknown
//!                      └──── any failure: log line (warn), count + delay (class 28), FATAL ────┘
//! ```
//!
//! The protocol work is sans-I/O in `bypass-wire` ([`bypass_wire::auth`] for the exchanges,
//! [`bypass_wire::hba`], [`bypass_wire::auth_file`], [`bypass_wire::startup`]); this crate adds
//! the sockets, TLS ([`tls`], rustls) and the failed-login guard ([`guard`]).
//!
//! Two ways in:
//! - [`FrontDoor::accept`] does everything for a server whose users are in one auth file (the
//!   dispatcher, the engine):
//!
//! ```no_run
//! use bypass_frontdoor::{Admission, CancelKey, FrontDoor, FrontDoorConfig};
//! use bypass_wire::auth_file::AuthFile;
//!
//! # async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
//! let users = AuthFile::load("userlist.txt".as_ref()).map_err(std::io::Error::other)?;
//! let door = FrontDoor::new(FrontDoorConfig::scram(users));
//! loop {
//!     let (tcp, _) = listener.accept().await?;
//!     let door = door.clone();
//!     tokio::spawn(async move {
//!         // Refusals are already answered (FATAL 28P01, 28000, 08P01…) and logged.
//!         let Ok(Admission::Client(mut client)) = door.accept(tcp, 64 * 1024).await else { return };
//!         let parameters = vec![("server_version".to_string(), "15.0".to_string())];
//!         if client.welcome(&parameters, CancelKey::random()).await.is_ok() {
//!             // client.stream / client.buffer now carry the query protocol.
//!         }
//!     });
//! }
//! # }
//! ```
//! - The steps of [`login`] one by one, for a server that looks secrets up or chooses pools
//!   between them (the pooler); it then calls [`LoginGuard::on_failure`] itself.
//!
//! Invariants:
//! - Nothing reaches a backend and no per-name state is created before [`login::authenticate`]
//!   returns a proof; the front door itself keeps only the bounded per-address failure table.
//! - An unknown user sees the same messages, in the same order, and the same FATAL as a known
//!   user with a wrong password (mock exchange, [`bypass_wire::auth`]).
//! - Bytes a client sends in clear after an SSLRequest are refused, never read as part of the
//!   encrypted session.
//! - Every refusal is a FATAL ErrorResponse with a SQLSTATE and a message without secrets.

pub mod cancel;
pub mod door;
pub mod guard;
pub mod login;
pub mod mock;
pub mod stream;
pub mod tls;

pub use bypass_wire::auth::{Method, MockKey, Proof, Refusal};
pub use cancel::CancelKey;
pub use door::{Admission, Admitted, FrontDoor, FrontDoorConfig, LOGIN_BUFFER_MIN};
pub use guard::{Attempted, GuardSettings, LoginGuard};
pub use login::{CancelRequest, First, LoginError};
pub use mock::{mock_key, mock_key_in};
pub use stream::Stream;
pub use tls::{ServerTls, TlsFiles};
