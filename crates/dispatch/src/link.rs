//! The dispatcher–agent link: PostgreSQL messages pass through unchanged; control frames with a
//! tag PostgreSQL never uses carry the hand-over conversation. No I/O here.
//!
//! ```text
//!  dispatcher ──StartupMessage──► agent ──login──► PostgreSQL
//!             ◄──R(Ok) S… K Z────
//!  per request:  [Request{delivery, threshold}] Query/Parse…Sync ─►
//!                ◄─ results (relay)  or  ◄─ HandOverAt{offset} (on demand)
//!  hand-over:    Socket{tcp state} ─►          ◄─ Imported | ImportFailed
//!                or StaysHome ─► (the client is closing: no move, the answer comes relayed)
//!                Steered ─►  (the switch forwards the flow to the agent; it may write now)
//!  hand-back:    ◄─ ReturnReady   Blocked{segments} ─►   ◄─ Returned{status, tcp state}
//! ```
//! A control frame is `0xB7, Int32 length, kind byte, fields`; it is only ever sent at a
//! PostgreSQL message boundary, so a relay's scanner sees it as one more message.

use bypass_wire::write::message;
use bypass_wire::TransactionStatus;

use crate::error::{DispatchError, Result};

/// The tag byte of control frames (no PostgreSQL message uses it).
pub const CONTROL_TAG: u8 = 0xB7;
/// The largest control frame: a connection's state with both queues at their bound. Frames
/// may exceed the link buffers; they are read with [`crate::buffer::BufferIo::read_frame`].
pub const CONTROL_FRAME_BYTES_MAX: usize = 2 * crate::handover::QUEUE_BYTES_MAX + 4096;

/// How the agent delivers the answer to the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Delivery {
    /// Through the link, all of it.
    Relay = 0,
    /// Through the link; once `threshold` bytes passed, ask for the client's connection.
    OnDemand = 1,
    /// The client's connection follows in a `Socket` frame; write the answer into it.
    Direct = 2,
}

/// One control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control<'a> {
    /// Dispatcher → agent, before a request. `Relay` and `OnDemand` stand for every later
    /// request on the link too, until the next `Request` (so a hybrid dispatcher's small
    /// requests carry no frame: only a change of mode does); `Direct` is for this request only.
    Request { delivery: Delivery, threshold: u64 },
    /// Dispatcher → agent: the exported client connection (see [`crate::handover`]).
    Socket(&'a [u8]),
    /// Dispatcher → agent, instead of `Socket`: the client has closed its side, so its
    /// connection cannot be exported; relay the answer (no reply).
    StaysHome,
    /// Dispatcher → agent: the flow is blocked at the switch; once the connection's socket has
    /// received `segments` segments since its import (what the switch let through to it),
    /// export and return the connection.
    Blocked { segments: u64 },
    /// Dispatcher → agent: the switch now steers the flow to the agent; start writing. (Writing
    /// earlier would let the client's quick reply meet the still-blocked switch and wait for a
    /// retransmission timeout.)
    Steered,
    /// Agent → dispatcher: `offset` answer bytes went through the link; take the connection now.
    HandOverAt { offset: u64 },
    /// Agent → dispatcher: the connection is imported; answer bytes now go straight to the client.
    Imported,
    /// Agent → dispatcher: import failed; the state is unchanged and the answer comes relayed.
    ImportFailed,
    /// Agent → dispatcher: the answer is complete and acknowledged; block the flow.
    ReturnReady,
    /// Agent → dispatcher: the connection, exported again, the session's status, and how many
    /// answer bytes the agent wrote in total (relayed and direct).
    Returned { status: TransactionStatus, answer_bytes: u64, state: &'a [u8] },
}

const REQUEST: u8 = 1;
const SOCKET: u8 = 2;
const BLOCKED: u8 = 3;
const HAND_OVER_AT: u8 = 4;
const IMPORTED: u8 = 5;
const IMPORT_FAILED: u8 = 6;
const RETURN_READY: u8 = 7;
const RETURNED: u8 = 8;
const STEERED: u8 = 9;
const STAYS_HOME: u8 = 10;

impl<'a> Control<'a> {
    /// Appends the frame to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        message(buf, Some(CONTROL_TAG), |buf| match self {
            Control::Request { delivery, threshold } => {
                buf.extend_from_slice(&[REQUEST, *delivery as u8]);
                buf.extend_from_slice(&threshold.to_be_bytes());
            }
            Control::Socket(state) => {
                buf.push(SOCKET);
                buf.extend_from_slice(state);
            }
            Control::Blocked { segments } => {
                buf.push(BLOCKED);
                buf.extend_from_slice(&segments.to_be_bytes());
            }
            Control::Steered => buf.push(STEERED),
            Control::StaysHome => buf.push(STAYS_HOME),
            Control::HandOverAt { offset } => {
                buf.push(HAND_OVER_AT);
                buf.extend_from_slice(&offset.to_be_bytes());
            }
            Control::Imported => buf.push(IMPORTED),
            Control::ImportFailed => buf.push(IMPORT_FAILED),
            Control::ReturnReady => buf.push(RETURN_READY),
            Control::Returned { status, answer_bytes, state } => {
                buf.extend_from_slice(&[RETURNED, status.byte()]);
                buf.extend_from_slice(&answer_bytes.to_be_bytes());
                buf.extend_from_slice(state);
            }
        });
    }

    /// Decodes a frame body (after the 5-byte header).
    pub fn decode(body: &'a [u8]) -> Result<Self> {
        let (&kind, rest) = body.split_first().ok_or_else(|| bad("empty control frame"))?;
        let u64_at = |bytes: &[u8]| -> Result<u64> {
            let array: [u8; 8] = bytes.try_into().map_err(|_| bad("control frame field length"))?;
            Ok(u64::from_be_bytes(array))
        };
        Ok(match kind {
            REQUEST => {
                let (&delivery, threshold) = rest.split_first().ok_or_else(|| bad("request frame"))?;
                let delivery = match delivery {
                    0 => Delivery::Relay,
                    1 => Delivery::OnDemand,
                    2 => Delivery::Direct,
                    _ => return Err(bad("unknown delivery")),
                };
                Control::Request { delivery, threshold: u64_at(threshold)? }
            }
            SOCKET => Control::Socket(rest),
            BLOCKED => Control::Blocked { segments: u64_at(rest)? },
            STEERED if rest.is_empty() => Control::Steered,
            STAYS_HOME if rest.is_empty() => Control::StaysHome,
            HAND_OVER_AT => Control::HandOverAt { offset: u64_at(rest)? },
            IMPORTED if rest.is_empty() => Control::Imported,
            IMPORT_FAILED if rest.is_empty() => Control::ImportFailed,
            RETURN_READY if rest.is_empty() => Control::ReturnReady,
            RETURNED => {
                let (&status, rest) = rest.split_first().ok_or_else(|| bad("returned frame"))?;
                let status = TransactionStatus::from_byte(status).ok_or_else(|| bad("transaction status"))?;
                let (answer_bytes, state) = rest.split_at_checked(8).ok_or_else(|| bad("returned frame"))?;
                Control::Returned { status, answer_bytes: u64_at(answer_bytes)?, state }
            }
            _ => return Err(bad("unknown control frame")),
        })
    }
}

fn bad(what: &str) -> DispatchError {
    DispatchError::Protocol(format!("link: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bypass_wire::frame::split_message;

    // Goal: every control frame survives encode/decode; method: round-trip each kind.
    #[test]
    fn control_frames_round_trip() {
        let frames = [
            Control::Request { delivery: Delivery::OnDemand, threshold: 262_144 },
            Control::Socket(b"state"),
            Control::Blocked { segments: 12 },
            Control::Steered,
            Control::StaysHome,
            Control::HandOverAt { offset: 1 << 40 },
            Control::Imported,
            Control::ImportFailed,
            Control::ReturnReady,
            Control::Returned { status: TransactionStatus::InTransaction, answer_bytes: 77, state: b"xyz" },
        ];
        for frame in frames {
            let mut buf = Vec::new();
            frame.encode(&mut buf);
            let (header, body) = split_message(&buf, 1 << 20).expect("valid").expect("complete");
            assert_eq!(header.tag, CONTROL_TAG);
            assert_eq!(Control::decode(body).expect("decodes"), frame);
        }
    }

    // Goal: malformed frames are typed errors, never panics; method: truncated and unknown kinds.
    #[test]
    fn malformed_frames_are_errors() {
        for body in [
            &b""[..],
            &[REQUEST, 9, 0, 0, 0, 0, 0, 0, 0, 0],
            &[HAND_OVER_AT, 1],
            &[99],
            &[BLOCKED, 1],
            &[RETURNED, b'?'],
        ] {
            assert!(Control::decode(body).is_err(), "{body:?}");
        }
    }
}
