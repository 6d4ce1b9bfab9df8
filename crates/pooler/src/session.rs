//! A logged-in client: the state machine that links it to servers and relays bytes.
//!
//! ```text
//!            request bytes                       ReadyForQuery 'I', nothing outstanding
//!   Idle ───────────────────► Linked(server) ──────────────────────────────► Idle
//!    │  (transaction mode:      │  relay both ways, count requests         (server back to pool)
//!    │   acquire from pool)     │
//!    └── Terminate / EOF ──►  Done ◄── Terminate / EOF / error (server reset or closed)
//! ```
//! In session mode the client is linked from login to disconnect.
//! The bytes themselves are moved by [`crate::relay`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_wire::frame::Step;
use bypass_wire::tag;

use crate::cancel::{CancelRoute, ClientInfo, Registration};
use crate::client::ClientSide;
use crate::config::{PoolMode, SessionStatePolicy};
use crate::error::{PoolerError, TimeoutKind};
use crate::io::sleep_until;
use crate::params::ParamSet;
use crate::pool::{Pool, Waiter};
use crate::prepared::ClientStatements;
use crate::relay::{relay, LinkEnd, Linked, RelayContext, RelayLimits};
use crate::server::ServerConn;
use crate::shared::Shared;

mod kernel;
pub use kernel::KernelClient;

/// A logged-in client.
pub struct Session {
    pool: Arc<Pool>,
    /// The runtime (core) this client runs on.
    shard: usize,
    wanted: ParamSet,
    waiter: Arc<Waiter>,
    cancel: Registration,
    linked: Option<Linked>,
    /// The server a session-mode client logged in with, linked when serving starts.
    first_server: Option<Box<ServerConn>>,
    /// The client's named prepared statements, owned by the pooler in transaction mode.
    statements: ClientStatements,
    sync_sql: String,
    /// Scratch for rewritten traffic, reused for the whole session.
    buffers: RelayBuffers,
    /// Timeouts and sizes in force at login (a reload applies to later logins).
    limits: SessionLimits,
    /// Set when this client's transactions run in the kernel fast path.
    kernel: Option<KernelClient>,
}

#[derive(Debug, Clone, Copy)]
struct SessionLimits {
    client_idle_timeout_ms: u64,
    idle_transaction_timeout_ms: u64,
    message_size_max: u32,
    session_state: SessionStatePolicy,
}

/// Reusable output buffers of the relay.
#[derive(Default)]
struct RelayBuffers {
    to_server: Vec<u8>,
    to_client: Vec<u8>,
    synthetic: Vec<u8>,
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        pool: Arc<Pool>,
        shard: usize,
        wanted: ParamSet,
        waiter: Arc<Waiter>,
        cancel: Registration,
        server: Option<Box<ServerConn>>,
    ) -> Self {
        let settings = &shared.live().settings;
        let limits = SessionLimits {
            client_idle_timeout_ms: settings.client_idle_timeout_ms,
            idle_transaction_timeout_ms: settings.idle_transaction_timeout_ms,
            message_size_max: settings.message_size_max,
            session_state: settings.session_state,
        };
        Session {
            limits,
            pool,
            shard,
            wanted,
            waiter,
            cancel,
            linked: None,
            first_server: server,
            statements: ClientStatements::default(),
            sync_sql: String::new(),
            buffers: RelayBuffers::default(),
            kernel: None,
        }
    }

    /// Who the client is (for log lines and the console).
    pub fn client(&self) -> &ClientInfo {
        &self.cancel.entry.info
    }

    /// Runs this client's transactions in the kernel fast path.
    pub fn in_kernel(mut self, kernel: Option<KernelClient>) -> Self {
        self.kernel = kernel;
        self
    }

    fn transaction_mode(&self) -> bool {
        self.pool.settings.mode == PoolMode::Transaction
    }

    /// The pooler owns prepared statements in transaction mode unless they are turned off.
    fn owns_statements(&self) -> bool {
        self.transaction_mode() && self.pool.settings.max_prepared_statements > 0
    }

    /// Serves the client until it leaves; the server it holds is returned or closed on every path.
    pub async fn run(mut self, client: &mut ClientSide) -> Result<(), PoolerError> {
        self.pool.stats.client_joined(self.shard);
        let mut result = self.serve(client).await;
        self.pool.stats.client_left(self.shard);
        let clean_end = result.is_ok();
        if let Some(linked) = self.linked.take() {
            if result.is_err() && !linked.client_can_be_told() {
                result = Err(PoolerError::ServerTerminated);
            }
            self.finish_server(linked, clean_end).await;
        }
        result
    }

    async fn serve(&mut self, client: &mut ClientSide) -> Result<(), PoolerError> {
        if self.kernel.is_some() {
            return self.serve_kernel(client).await;
        }
        if let Some(server) = self.first_server.take() {
            self.link_with(server).await?;
        }
        loop {
            if self.linked.is_none() {
                if !self.wait_for_request(client).await? {
                    return Ok(());
                }
                self.waiter.remember_lines([client.buffer.pending().as_ptr(), self.cancel.entry.route_line()]);
                let server = self.acquire().await?;
                self.link_with(server).await?;
            }
            match self.relay_once(client).await? {
                LinkEnd::Released => self.unlink().await,
                LinkEnd::ClientGone => return Ok(()),
            }
        }
    }

    /// Relays on the current link until the transaction (or, in session mode, the client) ends.
    async fn relay_once(&mut self, client: &mut ClientSide) -> Result<LinkEnd, PoolerError> {
        {
            let limits = RelayLimits {
                message_size_max: self.pool.settings.message_size_max,
                idle_transaction_timeout_ms: self.limits.idle_transaction_timeout_ms,
                transaction_mode: self.transaction_mode(),
                shard: self.shard,
                session_state: self.transaction_mode().then_some(self.limits.session_state),
            };
            let owns_statements = self.owns_statements();
            let linked = self.linked.as_mut().expect("linked above");
            let mut context = RelayContext {
                limits,
                pool: &self.pool,
                wanted: &mut self.wanted,
                statements: owns_statements.then_some(&mut self.statements),
                to_server: &mut self.buffers.to_server,
                to_client: &mut self.buffers.to_client,
                synthetic: &mut self.buffers.synthetic,
            };
            relay(client, linked, &mut context).await
        }
    }

    /// A server from the pool, or from its successor once a reload replaced it.
    async fn acquire(&mut self) -> Result<Box<ServerConn>, PoolerError> {
        loop {
            while let Some(next) = self.pool.successor().cloned() {
                self.pool.stats.client_left(self.shard);
                next.stats.client_joined(self.shard);
                self.pool = next;
            }
            self.cancel.entry.set_waiting(true);
            let acquired = self.pool.acquire(self.shard, &self.waiter).await;
            self.cancel.entry.set_waiting(false);
            if let Some(server) = acquired? {
                return Ok(server);
            }
        }
    }

    /// Idle in transaction mode: waits until the client sends a request. False when it left.
    async fn wait_for_request(&mut self, client: &mut ClientSide) -> Result<bool, PoolerError> {
        let timeout_ms = self.limits.client_idle_timeout_ms;
        let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
        loop {
            if let Some(tag) = next_request(client, self.limits.message_size_max)? {
                return Ok(tag != tag::frontend::TERMINATE); // A request, or Terminate: the client is leaving.
            }
            tokio::select! {
                read = client.read_some() => {
                    if read.map_err(PoolerError::ClientIo)? == 0 {
                        return Ok(false);
                    }
                }
                _ = sleep_until(deadline) => return Err(PoolerError::Timeout(TimeoutKind::ClientIdle)),
            }
        }
    }

    /// Brings a server's parameters in line with the client's and links it.
    async fn link_with(&mut self, mut server: Box<ServerConn>) -> Result<(), PoolerError> {
        self.sync_params(&mut server).await?;
        self.attach(server);
        Ok(())
    }

    async fn sync_params(&mut self, server: &mut ServerConn) -> Result<(), PoolerError> {
        self.sync_sql.clear();
        if server.params.diff_into(&self.wanted, &mut self.sync_sql) > 0 {
            server.run_internal(&self.sync_sql, "parameter sync", self.pool.settings.message_size_max).await?;
        }
        Ok(())
    }

    fn attach(&mut self, server: Box<ServerConn>) {
        self.pool.stats.shard(self.shard).assignments.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let route = CancelRoute { address: self.pool.target.address, key: server.key };
        self.cancel.entry.set_route(Some(route));
        self.linked = Some(Linked::new(server));
    }

    async fn unlink(&mut self) {
        let linked = self.linked.take().expect("unlink without a link");
        self.cancel.entry.set_route(None);
        self.release(linked.server).await;
    }

    /// Returns a server to the pool, first resetting session state a client left on it.
    async fn release(&self, mut server: Box<ServerConn>) {
        if server.session_dirty {
            let limit = self.pool.settings.message_size_max;
            if server.run_internal("DISCARD ALL", "session state reset", limit).await.is_err() {
                return; // Dropping the server closes it.
            }
            server.statements.clear();
            server.params = self.pool.welcome_params();
            server.session_dirty = false;
        }
        self.pool.release(server);
    }

    /// The client is gone or failed: reuse its server only if it is idle and intact.
    async fn finish_server(&mut self, linked: Linked, clean_end: bool) {
        self.cancel.entry.set_route(None);
        let reusable = clean_end
            && linked.tracker.releasable()
            && linked.server.plan.is_empty()
            && linked.server.buffer.is_empty()
            && linked.server.scanner.at_boundary();
        let mut server = linked.server;
        if !reusable {
            return; // Dropping the server closes it; PostgreSQL rolls back whatever it held.
        }
        if !self.transaction_mode() && !self.pool.settings.reset_query.is_empty() {
            let settings = &self.pool.settings;
            if server
                .run_internal(&settings.reset_query, "server_reset_query", settings.message_size_max)
                .await
                .is_err()
            {
                return;
            }
            server.statements.clear(); // DISCARD ALL dropped them.
        }
        self.release(server).await;
    }
}

/// Peeks at the client's buffer: the tag of the first message if at least its start is there.
fn next_request(client: &ClientSide, message_size_max: u32) -> Result<Option<u8>, PoolerError> {
    if client.scanner.at_boundary() {
        bypass_wire::frame::check_frontend_tag(client.buffer.pending()).map_err(PoolerError::ClientProtocol)?;
    }
    let mut scanner = client.scanner.clone();
    match scanner.next(client.buffer.pending(), client.buffer.capacity(), message_size_max) {
        Ok(Step::Message(header) | Step::LargeStart { header, .. }) => Ok(Some(header.tag)),
        Ok(Step::Continuation { .. }) => Ok(Some(0)),
        Ok(Step::NeedMore) => Ok(None),
        Err(error) => Err(PoolerError::ClientProtocol(error)),
    }
}
