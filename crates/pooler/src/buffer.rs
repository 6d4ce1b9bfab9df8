//! The read buffer every connection owns: [`bypass_wire::Buffer`], shared with the dispatcher.

pub use bypass_wire::buffer::Buffer;

/// Bytes of a client's read buffer. Larger client messages stream through in pieces.
pub const CLIENT_BUFFER_BYTES: usize = 16 * 1024;
