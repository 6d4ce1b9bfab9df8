//! The read buffer every connection owns: [`bypass_wire::Buffer`], shared with the dispatcher.

pub use bypass_wire::buffer::Buffer;
