//! Moving a client's connection to a backend's agent and back — the dispatcher's half of the
//! hand-over, in the safe order: the switch drops the client's packets whenever nobody owns the
//! connection, so no kernel answers them with a reset.
//!
//! ```text
//!  hand over: drain (client acked) ─► BLOCK ─► settle ─► export, silent close ─► Socket
//!             ─► agent imports ─► Imported ─► FORWARD to the backend's MAC ─► Steered
//!             (ImportFailed: import here, PASS)
//!             (client closing after the settle: no export, PASS, StaysHome ─► relayed answer)
//!  take back: ◄─ ReturnReady ─► BLOCK ─► Blocked{segments} ─► agent settles, exports
//!             ─► ◄─ Returned{state} ─► import here ─► PASS
//! ```
//! "Settle": before an owner exports, its socket must have received every segment the switch
//! let through to it before the BLOCK (counted per flow by the switch, see [`crate::steer`]);
//! a segment still queued on the way would meet a closed socket (reset) or be acknowledged by
//! the dying socket and lost.

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bypass_wire::TransactionStatus;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{Link, Shared};
use crate::buffer::BufferIo;
use crate::error::{DispatchError, Result};
use crate::handover::{self, Settled, TcpState};
use crate::link::{Control, CONTROL_FRAME_BYTES_MAX, CONTROL_TAG};
use crate::steer::{Action, Switch};

/// Where counting a connection's segments started for its current owner: the owner's socket
/// had received `socket_segments` when the switch had let `switch_delivered` through.
#[derive(Debug, Clone, Copy)]
pub struct Epoch {
    pub socket_segments: u32,
    pub switch_delivered: u64,
}

/// Starts counting the segments of an accepted client connection; `None` when it cannot move
/// (no steering table, IPv6, table full).
pub fn track(shared: &Shared, stream: &TcpStream, peer: SocketAddr) -> Option<Epoch> {
    let (Some(switch), SocketAddr::V4(peer)) = (shared.switch.as_ref(), peer) else { return None };
    if let Err(error) = switch.track(peer) {
        tracing::warn!(%peer, %error, "cannot count the flow's segments; its answers will be relayed");
        return None;
    }
    // Read after tracking began: a segment counted by both only makes the first move wait longer.
    // (A login segment that passed the switch just before tracking but arrives after this read
    // would let the first move settle one segment early; by the first move, long after login,
    // nothing of that kind is still on its way.)
    let socket_segments = handover::segments_received(stream.as_raw_fd()).ok()?;
    Some(Epoch { socket_segments, switch_delivered: 0 })
}

/// Stops counting the segments of a client connection whose session ended.
pub fn untrack(shared: &Shared, peer: SocketAddr) {
    if let (Some(switch), SocketAddr::V4(peer)) = (shared.switch.as_ref(), peer) {
        let _ = switch.remove(peer);
        let _ = switch.untrack(peer);
    }
}

/// Waits (bounded) until the socket `fd`, owner since `epoch`, has received every segment the
/// switch let through to it.
async fn settle(shared: &Shared, switch: &Switch, peer: SocketAddrV4, fd: i32, epoch: Epoch) {
    let wait = Duration::from_millis(shared.config.settings.settle_wait_ms);
    let expected = || Ok(switch.delivered(peer)?.saturating_sub(epoch.switch_delivered));
    match handover::wait_settled(fd, epoch.socket_segments, expected, wait).await {
        Settled::AtOnce => {}
        Settled::AfterWaiting => _ = shared.stats.settle_waits.fetch_add(1, Ordering::Relaxed),
        Settled::GaveUp => _ = shared.stats.settle_timeouts.fetch_add(1, Ordering::Relaxed),
    }
}

/// How the move went.
pub enum Moved {
    /// The agent owns the connection; the answer flows straight to the client. The switch had
    /// let `switch_delivered` segments through when it began forwarding to the agent.
    Away { switch_delivered: u64 },
    /// The connection did not move (the agent could not import it, or the client is closing);
    /// it is here and the answer comes relayed.
    Refused,
}

/// What came back with the connection.
pub struct Returned {
    pub status: TransactionStatus,
    pub answer_bytes: u64,
    /// The client closed its side while away: the connection could not move and is gone.
    pub closed: bool,
    /// The client's next request came home in the connection's receive queue.
    pub with_request: bool,
}

fn switch(shared: &Shared) -> Result<&Switch> {
    shared.switch.as_ref().ok_or_else(|| DispatchError::Steering("hand-over without a steering table".into()))
}

/// Hands `stream` (the client's connection) to the agent behind `link`.
pub async fn hand_over(
    shared: &Shared,
    stream: &mut Option<TcpStream>,
    epoch: &mut Epoch,
    peer: SocketAddrV4,
    link: &mut Link,
    mac: [u8; 6],
) -> Result<Moved> {
    let switch = switch(shared)?;
    let client = stream.take().expect("the dispatcher owns the connection it hands over");
    let drain_wait = Duration::from_millis(shared.config.settings.drain_wait_ms);
    handover::wait_drained(client.as_raw_fd(), drain_wait).await;
    switch.set(peer, Action::Block)?;
    settle(shared, switch, peer, client.as_raw_fd(), *epoch).await;
    if handover::tcp_state(client.as_raw_fd()).ok() == Some(handover::TCP_STATE_CLOSE_WAIT) {
        return stay_home(shared, switch, stream, client, peer, link).await;
    }
    let state = match handover::export_tokio(client) {
        Ok(state) => state,
        Err(error) => {
            // The socket is gone (closed on the error path): so is the session.
            switch.remove(peer)?;
            return Err(error);
        }
    };
    let mut frame = Vec::with_capacity(128 + state.recv_queue.len() + state.send_queue.len());
    let mut encoded = Vec::new();
    state.encode(&mut encoded);
    Control::Socket(&encoded).encode(&mut frame);
    let reply = match link.stream.write_all(&frame).await {
        Ok(()) => read_control(link).await,
        Err(error) => Err(DispatchError::io("sending the client's connection", error)),
    };
    match reply {
        Ok(ControlKind::Imported) => {
            // Still blocked: nothing reaches the agent's fresh socket before this count.
            let switch_delivered = switch.delivered(peer)?;
            switch.set(peer, Action::Forward { mac, drop_per_million: 0 })?;
            let mut frame = Vec::with_capacity(8);
            Control::Steered.encode(&mut frame);
            // If this fails the link is gone; take_back notices and forgets the flow.
            let _ = link.stream.write_all(&frame).await;
            shared.stats.handovers.fetch_add(1, Ordering::Relaxed);
            Ok(Moved::Away { switch_delivered })
        }
        Ok(ControlKind::ImportFailed) => {
            shared.stats.import_failures.fetch_add(1, Ordering::Relaxed);
            *stream = Some(bring_home(switch, peer, &state, epoch).await?);
            Ok(Moved::Refused)
        }
        Ok(other @ (ControlKind::ReturnReady | ControlKind::Closed { .. })) => {
            *stream = Some(bring_home(switch, peer, &state, epoch).await?);
            Err(DispatchError::Protocol(format!("agent answered a hand-over with {other:?}")))
        }
        Err(error) => {
            // The agent never took it: the connection is still ours to restore.
            *stream = Some(bring_home(switch, peer, &state, epoch).await?);
            Err(error)
        }
    }
}

/// The client closed its side (its FIN is among the settled segments, so no later one can
/// change that): a closing socket cannot be exported. The connection stays here, the switch
/// lets its packets pass again (the socket never changed, so the segment count goes on), and
/// the agent relays the answer, which a half-closed client may still read.
async fn stay_home(
    shared: &Shared,
    switch: &Switch,
    stream: &mut Option<TcpStream>,
    client: TcpStream,
    peer: SocketAddrV4,
    link: &mut Link,
) -> Result<Moved> {
    switch.remove(peer)?;
    *stream = Some(client);
    shared.stats.stayed_home_closing.fetch_add(1, Ordering::Relaxed);
    let mut frame = Vec::with_capacity(8);
    Control::StaysHome.encode(&mut frame);
    link.stream.write_all(&frame).await.map_err(|e| DispatchError::io("sending StaysHome", e))?;
    Ok(Moved::Refused)
}

/// Waits for the agent to finish the answer and takes the connection back. The agent became
/// the owner when the switch had let `away_since` segments through; `mac` is the agent's host.
pub async fn take_back(
    shared: &Shared,
    stream: &mut Option<TcpStream>,
    epoch: &mut Epoch,
    peer: SocketAddrV4,
    link: &mut Link,
    away_since: u64,
    mac: [u8; 6],
) -> Result<Returned> {
    let switch = switch(shared)?;
    let outcome = take_back_inner(switch, stream, epoch, peer, link, away_since, mac).await;
    match &outcome {
        Ok(returned) if returned.closed => {
            shared.stats.closed_while_away.fetch_add(1, Ordering::Relaxed);
            let _ = switch.remove(peer);
        }
        Ok(returned) => {
            shared.stats.handbacks.fetch_add(1, Ordering::Relaxed);
            if returned.with_request {
                shared.stats.returned_with_request.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(_) => {
            // Nobody holds the sequence state any more: forget the flow, so the client's next
            // segment reaches the dispatcher, whose kernel resets it.
            shared.stats.lost_while_away.fetch_add(1, Ordering::Relaxed);
            let _ = switch.remove(peer);
        }
    }
    outcome
}

async fn take_back_inner(
    switch: &Switch,
    stream: &mut Option<TcpStream>,
    epoch: &mut Epoch,
    peer: SocketAddrV4,
    link: &mut Link,
    away_since: u64,
    mac: [u8; 6],
) -> Result<Returned> {
    match read_control(link).await? {
        ControlKind::ReturnReady => {}
        ControlKind::Closed { status, answer_bytes } => {
            return Ok(Returned { status, answer_bytes, closed: true, with_request: false })
        }
        other => return Err(DispatchError::Protocol(format!("expected ReturnReady, got {other:?}"))),
    }
    switch.set(peer, Action::Block)?;
    let segments = switch.delivered(peer)?.saturating_sub(away_since);
    let mut frame = Vec::with_capacity(16);
    Control::Blocked { segments }.encode(&mut frame);
    link.stream.write_all(&frame).await.map_err(|e| DispatchError::io("sending Blocked", e))?;
    // With the client slow to acknowledge, the state carries megabytes: larger than the buffer.
    let (tag, body) = link.buffer.read_frame(&mut link.stream, "the agent", CONTROL_FRAME_BYTES_MAX).await?;
    let (status, answer_bytes, state) = match (tag, Control::decode(&body)) {
        (CONTROL_TAG, Ok(Control::Returned { status, answer_bytes, state: &[] })) => (status, answer_bytes, None),
        (CONTROL_TAG, Ok(Control::Returned { status, answer_bytes, state })) => {
            (status, answer_bytes, Some(TcpState::decode(state)?))
        }
        _ => return Err(DispatchError::Protocol("expected Returned from the agent".into())),
    };
    let Some(state) = state else {
        finish_close_away(switch, peer, link, mac).await;
        return Ok(Returned { status, answer_bytes, closed: true, with_request: false });
    };
    let with_request = !state.recv_queue.is_empty();

    *stream = Some(bring_home(switch, peer, &state, epoch).await?);
    Ok(Returned { status, answer_bytes, closed: false, with_request })
}

/// The client closed its side while the flow was blocked for the hand-back (its FIN reached the
/// agent among the settled segments), so the connection cannot move home. The agent says so
/// with a stateless Returned and closes it: the flow is steered to the agent again until the
/// agent confirms, so the client's last ACK reaches the agent's socket and not the dispatcher
/// (whose kernel, holding no socket for it, would reset it). An agent that could not finish
/// (link gone) leaves nothing to wait for.
async fn finish_close_away(switch: &Switch, peer: SocketAddrV4, link: &mut Link, mac: [u8; 6]) {
    if switch.set(peer, Action::Forward { mac, drop_per_million: 0 }).is_err() {
        return;
    }
    let mut frame = Vec::with_capacity(8);
    Control::Steered.encode(&mut frame);
    if link.stream.write_all(&frame).await.is_ok() {
        // The agent bounds its graceful close (CLOSE_WAIT_MAX); then it confirms or the link ends.
        let _ = read_control(link).await;
    }
}

/// Imports the connection here, starts a new epoch of segment counting, and lets its packets
/// pass to the dispatcher again.
async fn bring_home(switch: &Switch, peer: SocketAddrV4, state: &TcpState, epoch: &mut Epoch) -> Result<TcpStream> {
    let imported = handover::import_tokio(state);
    // Still blocked: the new socket and the switch count from here on together.
    let switch_delivered = switch.delivered(peer);
    switch.remove(peer)?;
    let imported = imported?;
    let socket_segments = handover::segments_received(imported.stream.as_raw_fd())?;
    *epoch = Epoch { socket_segments, switch_delivered: switch_delivered? };
    imported.finish().await
}

/// The kinds of control frame the dispatcher waits for.
#[derive(Debug)]
enum ControlKind {
    Imported,
    ImportFailed,
    ReturnReady,
    /// The client closed while away; the agent finished the close.
    Closed {
        status: TransactionStatus,
        answer_bytes: u64,
    },
}

async fn read_control(link: &mut Link) -> Result<ControlKind> {
    let (tag, body) = link.buffer.read_frame(&mut link.stream, "the agent", CONTROL_FRAME_BYTES_MAX).await?;
    if tag != CONTROL_TAG {
        return Err(DispatchError::Protocol(format!("expected a control frame, got message {:?}", tag as char)));
    }
    match Control::decode(&body)? {
        Control::Imported => Ok(ControlKind::Imported),
        Control::ImportFailed => Ok(ControlKind::ImportFailed),
        Control::ReturnReady => Ok(ControlKind::ReturnReady),
        Control::Returned { status, answer_bytes, state: &[] } => Ok(ControlKind::Closed { status, answer_bytes }),
        other => Err(DispatchError::Protocol(format!("unexpected control frame {other:?}"))),
    }
}
