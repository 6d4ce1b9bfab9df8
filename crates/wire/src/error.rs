//! The one error type of the codec: every way untrusted bytes can be wrong.

use thiserror::Error;

/// What was wrong with a byte sequence. Every decoder returns this instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// A length field is below the minimum its message allows.
    #[error("invalid message length {length} for message type {tag:?}")]
    BadLength { tag: char, length: i64 },
    /// A message is larger than the configured `message_size_max`.
    #[error("message of {length} bytes exceeds the limit of {limit} bytes")]
    TooLarge { length: u64, limit: u32 },
    /// A type byte that is not defined for this direction of the protocol.
    #[error("unknown message type {0:?}")]
    UnknownTag(char),
    /// The body ended before a field it must contain.
    #[error("message {tag:?} is truncated: {field} is missing")]
    Truncated { tag: char, field: &'static str },
    /// The body has bytes left after its last field.
    #[error("message {tag:?} has {extra} unexpected trailing bytes")]
    TrailingBytes { tag: char, extra: usize },
    /// A field holds a value the protocol does not allow.
    #[error("message {tag:?} has an invalid {field}")]
    BadField { tag: char, field: &'static str },
    /// A startup packet carries a protocol version or request code we do not speak.
    #[error("unsupported protocol version {major}.{minor}")]
    UnsupportedProtocol { major: u16, minor: u16 },
    /// A SCRAM exchange message is malformed or inconsistent.
    #[error("SCRAM: {0}")]
    Scram(&'static str),
    /// A SCRAM proof or server signature did not verify.
    #[error("SCRAM authentication failed")]
    ScramVerification,
}

/// The tag used in errors about untagged startup packets.
pub const STARTUP_TAG: char = '\0';

/// Shorthand used by decoders.
pub type WireResult<T> = Result<T, WireError>;
