//! PostgreSQL protocol v3 codec with no I/O.
//!
//! ```text
//!   bytes ──► frame::Scanner ──► Header (tag, length) ──► FrontendMessage / BackendMessage
//!                 │ (relays stop here: boundaries only)        (borrowed, allocation-free)
//!   Vec<u8> ◄── write::message (back-patched length) ◄── encode / build::*
//! ```
//!
//! Invariants:
//! - Decoders take untrusted bytes and return [`WireError`] on anything malformed; they never panic
//!   and never allocate. `message_size_max` bounds every frame before its body is looked at.
//! - Encoders append to a caller-owned buffer, so a relay reuses one buffer per connection.
//! - Authentication helpers ([`scram`], [`md5`]) are pure: randomness is the only side effect.

pub mod auth;
pub mod auth_file;
pub mod auth_messages;
pub mod backend;
pub mod buffer;
pub mod civil;
pub mod error;
pub mod frame;
pub mod frontend;
pub mod hba;
pub mod login;
pub mod md5;
pub mod read;
pub mod scram;
pub mod sql;
pub mod sqlstate;
pub mod startup;
pub mod tag;
pub mod write;

pub use backend::{Authentication, BackendMessage, Severity, TransactionStatus};
pub use buffer::Buffer;
pub use error::{WireError, WireResult};
pub use frame::{Header, Scanner, Step, HEADER_LEN};
pub use frontend::FrontendMessage;
pub use sqlstate::SqlState;
pub use startup::{StartupPacket, StartupParams, StartupRequest};

/// The default bound on one message, as in PgBouncer's `max_packet_size` (2 GiB is PostgreSQL's).
pub const DEFAULT_MESSAGE_SIZE_MAX: u32 = 256 * 1024 * 1024;
