//! User space's half of the link protocol: every change a program could race with is a
//! compare-and-swap on the same word the program changes (see the crate invariants).

use std::sync::atomic::Ordering;

use crate::abi::*;
use crate::{reset_framing, ClientSlot, FastPath, ServerSlot};

impl FastPath {
    /// Opens a client's gate again if user space has read every byte the kernel passed it
    /// (`bytes_read` in total) and holds no partial message. False: more bytes are on the way.
    pub fn rearm(&self, client: ClientSlot, bytes_read: u64) -> bool {
        let slot = self.client(client);
        let gate = slot.gate.load(Ordering::Acquire);
        if gate & GATE_FAST != 0 {
            return true;
        }
        if gate_passed(gate) != bytes_read {
            return false;
        }
        reset_framing(slot);
        slot.gate.compare_exchange(gate, gate | GATE_FAST, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Whether the kernel forwards this client's bytes now (its gate is open).
    pub fn gate_open(&self, client: ClientSlot) -> bool {
        self.client(client).gate.load(Ordering::SeqCst) & GATE_FAST != 0
    }

    /// Bytes of the first passed skb that finish a message the kernel had begun forwarding.
    pub fn pass_skip(&self, client: ClientSlot) -> u32 {
        self.client(client).pass_skip.load(Ordering::Acquire)
    }

    /// The client's server and its unanswered requests, if it is linked.
    pub fn link(&self, client: ClientSlot) -> Option<(ServerSlot, u32)> {
        let link = self.client(client).link.load(Ordering::Acquire);
        link_peer(link).map(|server| (ServerSlot(server), link_outstanding(link)))
    }

    /// Links a client (gate closed) to a server user space holds, with `requests` user space is
    /// about to write to it; the server's answers then flow to the client in the kernel.
    pub fn link_by_user(&self, client: ClientSlot, server: ServerSlot, requests: u32) {
        let slot = self.server(server);
        reset_framing(slot);
        slot.gate.store(0, Ordering::Relaxed);
        slot.peer.store(client.0, Ordering::Release);
        slot.owner.store(OWNER_KERNEL, Ordering::Release);
        self.client(client).link.store(link_word(server.0, requests), Ordering::Release);
    }

    /// Adds requests user space writes to a linked client's server. `None`: the kernel released
    /// the link meanwhile (the bytes start a new transaction), or a client queued behind it (the
    /// bytes must wait for the link to end: see [`FastPath::link`]).
    pub fn add_requests(&self, client: ClientSlot, requests: u32) -> Option<ServerSlot> {
        let word = &self.client(client).link;
        let mut link = word.load(Ordering::Acquire);
        loop {
            let server = link_peer(link)?;
            if link & LINK_CLOSED != 0 {
                return None;
            }
            let next = (link + u64::from(requests)) & !LINK_QUEUEABLE;
            match word.compare_exchange(link, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(ServerSlot(server)),
                Err(now) => link = now,
            }
        }
    }

    /// Takes a linked client's server back into user space once every request is answered.
    /// `None` while requests are outstanding (or when there is no link).
    pub fn unlink_answered(&self, client: ClientSlot) -> Option<ServerSlot> {
        let word = &self.client(client).link;
        let link = word.load(Ordering::Acquire);
        let server = ServerSlot(link_peer(link)?);
        if link_outstanding(link) != 0 {
            return None;
        }
        word.compare_exchange(link, 0, Ordering::AcqRel, Ordering::Acquire).ok()?;
        self.hold(server);
        Some(server)
    }

    /// Takes a client's server back whatever it was doing (the client is gone or failed). A
    /// client queued behind another's transaction leaves the server to it (`None`): the server's
    /// program sees the link gone when it would switch, and hands the server up broken.
    pub fn unlink_now(&self, client: ClientSlot) -> Option<ServerSlot> {
        // Both exchanges (here and the program's on `peer`) order the store before the load.
        let link = self.client(client).link.swap(0, Ordering::SeqCst);
        let server = ServerSlot(link_peer(link)?);
        if self.server(server).peer.load(Ordering::SeqCst) != client.0 {
            return None;
        }
        self.hold(server);
        Some(server)
    }

    /// Marks a link user space made and wrote (`requests`, each one autocommit statement, all
    /// sent) as one a client may queue behind. False if the link changed meanwhile.
    pub fn make_queueable(&self, client: ClientSlot, server: ServerSlot, requests: u32) -> bool {
        let word = &self.client(client).link;
        let link = link_word(server.0, requests);
        word.compare_exchange(link, link | LINK_QUEUEABLE, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Whether `pool` lets clients queue behind queueable links (see [`FastPath::set_queue_behind`]).
    pub fn queue_behind(&self, pool: u32) -> bool {
        self.pool(pool).queue_behind.load(Ordering::Acquire) != 0
    }

    /// The client queued behind a server user space now holds, taken off the queue (its
    /// requests went to a server that will not serve it: the caller fails its session).
    pub fn take_queued(&self, server: ServerSlot) -> Option<ClientSlot> {
        let queued = self.server(server).gate.swap(0, Ordering::AcqRel) as u32;
        let client = ClientSlot(queued.checked_sub(1)?);
        self.unlink_server(client, server).then_some(client)
    }

    /// Whether the queue behind a server user space took from the ring broke (read before
    /// lending or linking clears the flags).
    pub fn queue_broken(&self, server: ServerSlot) -> bool {
        self.server(server).flags.load(Ordering::Acquire) & FLAG_QUEUE_BROKEN != 0
    }

    /// Takes a server back from the client the kernel linked it to, whatever it was doing (the
    /// server hung up). False if the client is linked elsewhere or not at all by now.
    pub fn unlink_server(&self, client: ClientSlot, server: ServerSlot) -> bool {
        let word = &self.client(client).link;
        let link = word.load(Ordering::Acquire);
        if link_peer(link) != Some(server.0)
            || word.compare_exchange(link, 0, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return false;
        }
        self.hold(server);
        true
    }

    fn hold(&self, server: ServerSlot) {
        let slot = self.server(server);
        slot.owner.store(OWNER_USER, Ordering::Release);
        slot.peer.store(NO_PEER, Ordering::Release);
    }

    /// Lends an idle server user space holds to the kernel's free set; `params` is the id of
    /// its parameter values (clients with the same id may take it).
    pub fn lend(&self, server: ServerSlot, params: u16) {
        let slot = self.server(server);
        reset_framing(slot);
        slot.gate.store(0, Ordering::Relaxed);
        slot.params.store(params, Ordering::Relaxed);
        slot.peer.store(NO_PEER, Ordering::Release);
        slot.owner.store(OWNER_FREE, Ordering::Release);
    }

    /// Takes a free server of `pool` from the kernel, preferring the lowest slot (the hot one).
    pub fn reclaim(&self, pool: u32) -> Option<ServerSlot> {
        let used = self.pool(pool).servers.load(Ordering::Acquire).min(POOL_SERVERS_MAX);
        (0..used).map(|i| ServerSlot(pool * POOL_SERVERS_MAX + i)).find(|&server| {
            let owner = &self.server(server).owner;
            owner.compare_exchange(OWNER_FREE, OWNER_USER, Ordering::AcqRel, Ordering::Acquire).is_ok()
        })
    }

    /// Takes one particular free server back from the kernel; false if it is not free.
    pub fn reclaim_server(&self, server: ServerSlot) -> bool {
        let owner = &self.server(server).owner;
        owner.compare_exchange(OWNER_FREE, OWNER_USER, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Accepts a server the kernel announced on the handoff ring.
    pub fn take_handoff(&self, server: ServerSlot) -> bool {
        let owner = &self.server(server).owner;
        owner.compare_exchange(OWNER_HANDOFF, OWNER_USER, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Sets the parameter-values id of a client (what it wants) or a server (what it has, set
    /// before the server is lent): the kernel links a client only to a free server with its id.
    pub fn set_params(&self, slot: &Slot, params: u16) {
        slot.params.store(params, Ordering::Release);
    }

    /// Whether a server's session state changed while the kernel linked it (read it once user
    /// space holds the server, before lending or linking clears the flag).
    pub fn server_dirty(&self, server: ServerSlot) -> bool {
        self.server(server).flags.load(Ordering::Acquire) & FLAG_DIRTY != 0
    }
}
