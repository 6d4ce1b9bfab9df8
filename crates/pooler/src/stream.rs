//! One connection type for both sides: [`bypass_frontdoor::Stream`] (plaintext TCP, or TLS over
//! TCP), shared with every server behind the front door.

pub use bypass_frontdoor::stream::Stream;
