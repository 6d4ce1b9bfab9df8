//! Parked clients. While a client's gate is open the kernel forwards its traffic, yet the verdict
//! calls the socket's `data_ready` for every skb, forwarded or not, so epoll would wake the
//! client's shard (and its session) for bytes it never sees. The pooler therefore takes such a
//! socket out of its reactor ("parks" it) and two other signals wake the session:
//! - the pass that closes its gate is announced on the handoff ring (`FP_CLIENT_PARKED`,
//!   [`crate::Announcement::Passed`]);
//! - a hang-up shows in an epoll set of the fast path's own that asks for `EPOLLRDHUP` only:
//!   a socket's data wake-up carries `EPOLLIN`, and epoll drops wake-ups for events no one
//!   asked for, so data never wakes that set, while FIN and RST do.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::abi::CLIENT_PARKED;
use crate::handoff::WatchFd;
use crate::{ClientSlot, FastPath, FastPathError};

/// Hang-ups read per `epoll_wait` (the watch is drained until it returns fewer).
const HANGUPS_PER_WAIT: usize = 64;

pub(crate) struct HangupWatch(OwnedFd);

impl HangupWatch {
    pub(crate) fn new() -> Result<HangupWatch, FastPathError> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(FastPathError::Socket(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(HangupWatch(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl FastPath {
    /// Marks a client parked (its gate's closing pass is then announced) or not. Mark it before
    /// opening its gate, and unmark it before its socket rejoins a reactor.
    pub fn park_client(&self, client: ClientSlot, parked: bool) {
        let value = if parked { CLIENT_PARKED } else { 0 };
        self.client(client).owner.store(value, Ordering::SeqCst);
    }

    /// Watches a client's socket for a hang-up for as long as it is open (closing the socket
    /// leaves the watch).
    pub fn watch_hangup(&self, socket: &impl AsRawFd, client: ClientSlot) -> Result<(), FastPathError> {
        let mut event =
            libc::epoll_event { events: (libc::EPOLLRDHUP | libc::EPOLLET) as u32, u64: u64::from(client.0) };
        let watch = self.hangups.0.as_raw_fd();
        // SAFETY: both descriptors are open, `event` is a valid epoll_event for the call.
        if unsafe { libc::epoll_ctl(watch, libc::EPOLL_CTL_ADD, socket.as_raw_fd(), &mut event) } < 0 {
            return Err(FastPathError::Socket(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The hang-up watch's descriptor: readable when a watched client hung up.
    pub fn hangup_fd(&self) -> WatchFd {
        WatchFd(self.hangups.0.as_raw_fd())
    }

    /// Calls `hung_up` for every watched client that hung up since the last call.
    pub fn drain_hangups(&self, mut hung_up: impl FnMut(ClientSlot)) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; HANGUPS_PER_WAIT];
        loop {
            // SAFETY: `events` has room for HANGUPS_PER_WAIT entries; timeout 0 never blocks.
            let ready = unsafe {
                libc::epoll_wait(self.hangups.0.as_raw_fd(), events.as_mut_ptr(), HANGUPS_PER_WAIT as i32, 0)
            };
            let ready = usize::try_from(ready).unwrap_or(0);
            for event in &events[..ready] {
                hung_up(ClientSlot(event.u64 as u32));
            }
            if ready < HANGUPS_PER_WAIT {
                return;
            }
        }
    }
}
