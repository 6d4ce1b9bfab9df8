//! The pooler's side of the kernel fast path (crate `bypass-fastpath`).
//!
//! ```text
//!  login ─► add_client (gate open) ─► ReadyForQuery ─► kernel forwards transactions
//!                 ▲                                          │ gate closed (no free server,
//!                 │ rearm once every passed byte is read     ▼ named statement, Terminate)
//!             session: link the waiting client to a server and write its request (answers
//!             flow in the kernel), or serve the transaction in user space (prepared statements)
//!  pool: idle servers are lent to the kernel (FREE); a waiter takes one back (reclaim) or is
//!        handed one the kernel released while it waited (handoff ring → accept_handoff)
//! ```
//! Servers lent to the kernel stay owned here (`lent`), so their sockets, leases and statement
//! caches live on; only the right to use them moves. Their sockets are parked (out of every
//! reactor: each answer the kernel forwards would otherwise wake a shard for nothing) until
//! user space reads or writes them again.
//!
//! Parameters: every client and lent server carries the id of its tracked parameter values
//! (interned here per pool), and the kernel links a client only to a free server with its id;
//! any other client is served (and its server synced) here. A server whose session state
//! changed in the kernel comes back marked dirty and is reset or closed before reuse.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, Weak};

use std::sync::atomic::{AtomicBool, Ordering};

use bypass_fastpath::abi::{NO_PEER, OWNER_FREE, OWNER_KERNEL, PARAMS_UNKNOWN, POOL_SERVERS_MAX};
use bypass_fastpath::{ClientSlot, FastPath, ServerSlot};
use tokio::sync::Notify;

use crate::params::ParamSet;
use crate::server::{KernelSocket, ServerConn};
use crate::stream::Stream;

/// Distinct parameter-value sets a pool gives ids to; clients with others stay in user space.
const PARAMS_IDS_MAX: usize = 1024;

/// A pool's share of the fast path: its kernel index and the servers lent to the kernel.
pub struct KernelPool {
    pub fast: Arc<FastPath>,
    pub index: u32,
    #[allow(clippy::vec_box)]
    lent: Mutex<Vec<Option<Box<ServerConn>>>>,
    /// Packed parameter values → their id in `fp_slot.params`.
    params_ids: Mutex<HashMap<Vec<u8>, u16>>,
    /// Kernel clients' sessions by client slot, woken when the server linked to them hangs up
    /// or (parked) when the kernel passed them bytes or they hung up.
    sessions: Mutex<HashMap<u32, SessionWake>>,
    /// A client queued here since the last maintenance tick.
    queued_since_tick: AtomicBool,
    /// No client queued for a whole tick: kernel clients park their sockets while their gate
    /// is open (see `session::kernel`). Off from the first waiter on, so a busy pool (where
    /// most requests pass and each would unpark a socket, a new reactor registration) does not.
    clients_may_park: AtomicBool,
    /// Wakes kernel clients waiting unparked on each tick that lets them park.
    park_allowed: Notify,
}

/// How a kernel client's session is woken (see [`KernelPool::watch`]).
struct SessionWake {
    server_hung_up: Weak<Notify>,
    passed: Weak<Notify>,
}

/// The notifies [`KernelPool::watch`] hands a kernel client's session.
pub struct SessionSignals {
    /// Its linked server hung up: the session ends.
    pub server_hung_up: Arc<Notify>,
    /// Parked: the kernel passed it bytes, or it hung up; the session reads its socket.
    pub passed: Arc<Notify>,
}

impl KernelPool {
    pub fn new(fast: Arc<FastPath>, index: u32) -> Self {
        KernelPool {
            fast,
            index,
            lent: Mutex::new((0..POOL_SERVERS_MAX).map(|_| None).collect()),
            params_ids: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            queued_since_tick: AtomicBool::new(false),
            clients_may_park: AtomicBool::new(false),
            park_allowed: Notify::new(),
        }
    }

    /// Registers a kernel client's session (see [`SessionSignals`]). Entries are keyed by
    /// client slot, so a reused slot replaces its stale one: bounded.
    pub fn watch(&self, client: ClientSlot) -> SessionSignals {
        let signals = SessionSignals { server_hung_up: Arc::new(Notify::new()), passed: Arc::new(Notify::new()) };
        let wake = SessionWake {
            server_hung_up: Arc::downgrade(&signals.server_hung_up),
            passed: Arc::downgrade(&signals.passed),
        };
        lock(&self.sessions).insert(client.0, wake);
        signals
    }

    /// Wakes a parked kernel client's session to read its socket.
    pub fn wake_passed(&self, client: ClientSlot) {
        if let Some(session) = lock(&self.sessions).get(&client.0).and_then(|wake| wake.passed.upgrade()) {
            session.notify_one();
        }
    }

    /// Lent servers whose backend hung up (killed, restarted): free ones are taken back, linked
    /// ones are unlinked from their client, whose session is woken to end it. The caller
    /// closes what comes back. One non-blocking poll over the pool's sockets.
    #[allow(clippy::vec_box)]
    pub fn reap_hung_up(&self) -> Vec<Box<ServerConn>> {
        let mut lent = lock(&self.lent);
        let mut polled: Vec<libc::pollfd> = lent
            .iter()
            .flatten()
            .map(|server| libc::pollfd { fd: server.stream.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 })
            .collect();
        // SAFETY: `polled` is a valid array of that many pollfds; timeout 0 never blocks.
        let ready = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 0) };
        if ready <= 0 {
            return Vec::new();
        }
        let hung_up: Vec<i32> = polled
            .iter()
            .filter(|entry| entry.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
            .map(|entry| entry.fd)
            .collect();
        let mut taken = Vec::new();
        for entry in lent.iter_mut() {
            let Some(server) = entry.as_ref() else { continue };
            let slot = server.kernel.as_ref().map(|socket| socket.slot);
            if hung_up.contains(&server.stream.as_raw_fd()) && slot.is_some_and(|slot| self.take_hung_up(slot)) {
                taken.extend(entry.take());
            }
        }
        taken
    }

    /// Takes a hung-up server from the kernel: back from the free set, or from its client.
    fn take_hung_up(&self, slot: ServerSlot) -> bool {
        if self.fast.reclaim_server(slot) {
            return true;
        }
        let kernel = self.fast.server(slot);
        let client = kernel.peer.load(Ordering::Acquire);
        if kernel.owner.load(Ordering::Acquire) != OWNER_KERNEL || client == NO_PEER {
            return false;
        }
        if !self.fast.unlink_server(ClientSlot(client), slot) {
            return false;
        }
        self.wake(ClientSlot(client));
        self.fail_queued(slot);
        true
    }

    /// Wakes a kernel client's session to end it: its server is gone.
    fn wake(&self, client: ClientSlot) {
        if let Some(session) = lock(&self.sessions).get(&client.0).and_then(|wake| wake.server_hung_up.upgrade()) {
            session.notify_one();
        }
    }

    /// A server user space took from its client while another client was queued behind it
    /// (`fast_path_queue_behind`): that client's requests will not be answered, so its session
    /// ends with an error. Call before the server is closed or reused.
    pub fn fail_queued(&self, server: ServerSlot) {
        if let Some(queued) = self.fast.take_queued(server) {
            tracing::warn!(server = server.0, client = queued.0, "queue behind a server broke; client disconnected");
            self.wake(queued);
        }
    }

    /// A server the kernel handed up because the queue behind it broke (see
    /// `FP_FLAG_QUEUE_BROKEN`): both its clients are told, and the caller closes it.
    pub fn fail_broken_queue(&self, server: ServerSlot) {
        let client = self.fast.server(server).peer.load(Ordering::Acquire);
        if client != NO_PEER {
            self.wake(ClientSlot(client));
        }
        self.fail_queued(server);
    }

    /// The id of a set of parameter values; [`PARAMS_UNKNOWN`] once the table is full.
    pub fn params_id(&self, params: &ParamSet) -> u16 {
        let mut ids = lock(&self.params_ids);
        if let Some(&id) = ids.get(params.packed()) {
            return id;
        }
        if ids.len() >= PARAMS_IDS_MAX {
            return PARAMS_UNKNOWN;
        }
        let id = ids.len() as u16;
        ids.insert(params.packed().to_vec(), id);
        id
    }

    /// Lends an idle server to the kernel's free set; a server that cannot go there (TLS, no
    /// slot left) comes back for the user-space idle list.
    pub fn lend(&self, mut server: Box<ServerConn>) -> Result<(), Box<ServerConn>> {
        let Some(slot) = self.register(&mut server) else { return Err(server) };
        let params = self.params_id(&server.params);
        let Some(server) = server.park() else { return Ok(()) };
        lock(&self.lent)[relative(slot)] = Some(server);
        self.fast.lend(slot, params);
        Ok(())
    }

    /// A free server taken back from the kernel.
    pub fn reclaim(&self) -> Option<Box<ServerConn>> {
        let slot = self.fast.reclaim(self.index)?;
        self.take(slot)
    }

    /// The server of a slot user space now holds (after reclaim, handoff or unlink); marked
    /// dirty if its session state changed in the kernel (the release path resets it).
    pub fn take(&self, slot: ServerSlot) -> Option<Box<ServerConn>> {
        let mut server = lock(&self.lent)[relative(slot)].take()?;
        if self.fast.server_dirty(slot) {
            server.session_dirty = true;
        }
        Some(server)
    }

    /// Puts a server user space holds into the kernel's maps (once), without lending it.
    pub fn register(&self, server: &mut ServerConn) -> Option<ServerSlot> {
        if let Some(socket) = &server.kernel {
            return Some(socket.slot);
        }
        let Stream::Plain(tcp) = &server.stream else { return None };
        let slot = self.fast.add_server(tcp, self.index).ok()?;
        server.kernel = Some(KernelSocket::new(self.fast.clone(), slot));
        Some(slot)
    }

    /// The socket of a server in the lent table (linked in the kernel or free).
    pub fn fd_of(&self, slot: ServerSlot) -> Option<std::os::fd::RawFd> {
        lock(&self.lent)[relative(slot)].as_ref().map(|server| server.stream.as_raw_fd())
    }

    /// Takes back the free servers `expired` picks (past their lifetime or idle timeout, which
    /// they see through `idle_since`: traffic the kernel moved since the last look counts as
    /// use, so a server busy in the kernel never looks idle).
    #[allow(clippy::vec_box)]
    pub fn reclaim_free_where(
        &self,
        now: std::time::Instant,
        mut expired: impl FnMut(&ServerConn) -> bool,
    ) -> Vec<Box<ServerConn>> {
        let mut lent = lock(&self.lent);
        let mut taken = Vec::new();
        for entry in lent.iter_mut() {
            let Some(server) = entry.as_mut() else { continue };
            let Some(socket) = server.kernel.as_mut() else { continue };
            let (slot, kernel) = (socket.slot, self.fast.server(socket.slot));
            let redirected = kernel.redirected.load(Ordering::Acquire);
            if redirected != socket.seen_redirected {
                socket.seen_redirected = redirected;
                server.idle_since = now;
            }
            let free = kernel.owner.load(Ordering::Acquire) == OWNER_FREE;
            if free && expired(server) && self.fast.reclaim_server(slot) {
                taken.extend(entry.take());
            }
        }
        taken
    }

    /// (backend process id, opened at) of every lent server the kernel holds free (idle).
    pub fn free_servers(&self) -> Vec<(i32, std::time::Instant)> {
        let lent = lock(&self.lent);
        let free = |server: &ServerConn| {
            let slot = server.kernel.as_ref().map(|socket| socket.slot);
            slot.is_some_and(|slot| self.fast.server(slot).owner.load(Ordering::Acquire) == OWNER_FREE)
        };
        lent.iter()
            .flatten()
            .filter(|server| free(server))
            .map(|server| (server.key.process_id, server.created_at))
            .collect()
    }

    /// The cancel key of a server in the lent table.
    pub fn key_of(&self, slot: ServerSlot) -> Option<crate::server::BackendKey> {
        lock(&self.lent)[relative(slot)].as_ref().map(|server| server.key)
    }

    /// Puts back a server user space linked to a client in the kernel (it stays owned here),
    /// with the id of its parameter values for when the kernel frees it.
    pub fn keep_linked(&self, server: Box<ServerConn>) {
        if let Some(slot) = server.kernel.as_ref().map(|socket| socket.slot) {
            self.fast.set_params(self.fast.server(slot), self.params_id(&server.params));
            lock(&self.lent)[relative(slot)] = server.park();
        }
    }

    /// Where the kernel moved this pool's bytes (summed over CPUs: one map read).
    pub fn counters(&self) -> bypass_fastpath::PoolCounters {
        self.fast.pool_counters(self.index)
    }

    pub fn set_waiters(&self, waiters: usize) {
        if waiters > 0 {
            self.queued_since_tick.store(true, Ordering::Relaxed);
            self.clients_may_park.store(false, Ordering::Relaxed);
        }
        self.fast.set_waiters(self.index, u32::try_from(waiters).unwrap_or(u32::MAX));
    }

    /// On the pool's maintenance tick: clients may park from now on if none queued since the
    /// last tick.
    pub fn tick(&self) {
        let queued = self.queued_since_tick.swap(false, Ordering::Relaxed);
        self.clients_may_park.store(!queued, Ordering::Relaxed);
        if !queued {
            self.park_allowed.notify_waiters();
        }
    }

    pub fn clients_may_park(&self) -> bool {
        self.clients_may_park.load(Ordering::Relaxed)
    }

    /// Fires (for those waiting) on each tick that lets clients park.
    pub fn park_allowed(&self) -> &Notify {
        &self.park_allowed
    }
}

fn relative(slot: ServerSlot) -> usize {
    (slot.0 % POOL_SERVERS_MAX) as usize
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Loads the programs, or says in one line why the pooler stays in user space.
pub fn load() -> Option<Arc<FastPath>> {
    match FastPath::load() {
        Ok(fast) => {
            tracing::info!("kernel fast path loaded (sk_skb verdict programs on client and server sockets)");
            Some(Arc::new(fast))
        }
        Err(error) => {
            tracing::warn!(%error, "kernel fast path unavailable; serving every client in user space");
            None
        }
    }
}
