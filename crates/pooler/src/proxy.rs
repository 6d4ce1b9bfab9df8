//! The listener side: one shard per core, each a thread with a single-threaded tokio runtime and
//! its own `SO_REUSEPORT` listener on the pooler's address, so the kernel spreads new clients
//! across cores and a client's whole life (login, relay, queue) stays on one core. With two or
//! more shards each is pinned to its CPU (`pin_workers`): the scheduler would otherwise pull a
//! shard onto the CPU of the backend that woke it, and the backends it wakes onto its own,
//! leaving the other CPU idle. Shard 0 also keeps the pools in shape: the queue janitor
//! (`query_wait_timeout`, idle servers to waiters of another shard) every 100 ms, idle
//! timeouts, lifetimes and `min_pool_size` every second.
//!
//! ```text
//!   :6432 ─┬─ shard 0: listener ─► client tasks ─┐
//!          └─ shard 1: listener ─► client tasks ─┴─► pools (shared; servers have a home shard)
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::cancel::ClientInfo;
use crate::client::ClientSide;
use crate::error::PoolerError;
use crate::io::tune;
use crate::load::ValidConfig;
use crate::login::{login, LoginOutcome};
use crate::session::Session;
use crate::shared::{Shared, StopRequest};
use crate::stats::PoolTotals;

/// How often queued clients are checked against `query_wait_timeout`.
const QUEUE_CHECK_PERIOD: Duration = Duration::from_millis(100);
/// Queue checks per pool maintenance round (idle timeouts, lifetimes, `min_pool_size`): 1 s.
const QUEUE_CHECKS_PER_MAINTENANCE: u32 = 10;
/// How often a graceful stop checks for running transactions.
const GRACEFUL_POLL: Duration = Duration::from_millis(20);
/// How long a stopping shard waits for its tasks to drop.
const SHARD_STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// A bound pooler, ready to start.
pub struct Proxy {
    shared: Arc<Shared>,
    listeners: Vec<std::net::TcpListener>,
    address: SocketAddr,
    metrics: Option<std::net::TcpListener>,
    /// The `unix_socket_dir` socket, served by shard 0, and its files.
    unix: Option<(std::os::unix::net::UnixListener, crate::listen::UnixSocketFiles)>,
}

impl Proxy {
    /// Binds one listener per shard on the listen address (port 0 picks one free port for all).
    pub fn bind(config: ValidConfig) -> std::io::Result<Proxy> {
        let shards = config.config.pooler.worker_count();
        let backlog = config.config.pooler.listen_backlog.min(i32::MAX as u32) as i32;
        let listeners = crate::listen::bind_shards(config.listen_addr, shards, backlog)?;
        let address = listeners[0].local_addr()?;
        let metrics = match &config.config.pooler.metrics_addr {
            Some(metrics_addr) => Some(bind_metrics(metrics_addr)?),
            None => None,
        };
        let unix = match &config.config.pooler.unix_socket_dir {
            Some(folder) => Some(crate::listen::bind_unix(folder, address.port())?),
            None => None,
        };
        Ok(Proxy { shared: Shared::new(config), listeners, address, metrics, unix })
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|listener| listener.local_addr().ok())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Starts one thread per shard; the pooler runs until [`RunningProxy::stop`] or drop.
    pub fn start(mut self) -> std::io::Result<RunningProxy> {
        let mut shards = Vec::with_capacity(self.listeners.len());
        let (unix, unix_files) = match self.unix.take() {
            Some((listener, files)) => (Some(listener), Some(files)),
            None => (None, None),
        };
        let mut unix = unix;
        for (index, listener) in self.listeners.into_iter().enumerate() {
            let (stop, stopped) = oneshot::channel();
            let shared = self.shared.clone();
            let listeners = ShardListeners { tcp: listener, metrics: self.metrics.take(), unix: unix.take() };
            let thread = std::thread::Builder::new()
                .name(format!("bypass-shard-{index}"))
                .spawn(move || run_shard(index, listeners, shared, stopped))?;
            shards.push((stop, thread));
        }
        Ok(RunningProxy { shared: self.shared, address: self.address, shards, _unix_files: unix_files })
    }
}

/// A pooler serving on its shard threads.
pub struct RunningProxy {
    shared: Arc<Shared>,
    address: SocketAddr,
    shards: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
    /// Removed when the pooler stops (after the shards, by field order).
    _unix_files: Option<crate::listen::UnixSocketFiles>,
}

impl RunningProxy {
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Stops every shard at once: clients and servers are disconnected.
    pub fn stop(mut self) {
        self.stop_shards();
    }

    /// Stops taking new transactions (every pool paused, so clients queue), waits up to
    /// `timeout` for running ones to finish, then stops.
    pub async fn stop_gracefully(self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let pools = self.shared.pools();
        for pool in &pools {
            pool.set_paused(true);
        }
        while Instant::now() < deadline && pools.iter().any(|pool| pool.active_servers() > 0) {
            tokio::time::sleep(GRACEFUL_POLL).await;
        }
        self.stop();
    }

    fn stop_shards(&mut self) {
        for (stop, _) in &mut self.shards {
            let _ = std::mem::replace(stop, oneshot::channel().0).send(());
        }
        for (_, thread) in self.shards.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a shard thread panicked");
            }
        }
    }
}

/// Pins the calling thread to the `index`-th CPU of those the process may use. Failure (a
/// restricted container) only costs the benefit, so it is logged, not fatal.
fn pin_to_cpu(index: usize) {
    // SAFETY: cpu_set_t is plain data; both calls get its exact size and affect this thread only.
    let result = unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            -1
        } else {
            let cpus: Vec<usize> =
                (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &allowed)).collect();
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            match cpus.get(index % cpus.len().max(1)) {
                Some(&cpu) => {
                    libc::CPU_SET(cpu, &mut one);
                    libc::sched_setaffinity(0, size, &one)
                }
                None => -1,
            }
        }
    };
    if result != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), shard = index, "cannot pin the shard's thread");
    }
}

/// Serves until told to stop: SIGHUP reloads the configuration file (a bad file is reported and
/// changes nothing), SIGTERM and `SHUTDOWN WAIT_FOR_SERVERS` stop after running transactions
/// (up to `shutdown_timeout_ms`), SIGINT and `SHUTDOWN` stop at once.
pub async fn serve_until_stopped(running: RunningProxy) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let shared = running.shared();
    let request = loop {
        tokio::select! {
            _ = hangup.recv() => match shared.reload_from_file() {
                Ok(report) => tracing::info!(?report, "configuration reloaded (SIGHUP)"),
                Err(problem) => tracing::error!(%problem, "reload refused, configuration unchanged"),
            },
            _ = terminate.recv() => break StopRequest::Graceful,
            _ = interrupt.recv() => break StopRequest::Immediate,
            request = shared.stop_requested() => break request,
        }
    };
    tracing::info!(?request, "stopping");
    match request {
        StopRequest::Graceful => {
            let timeout = Duration::from_millis(shared.live().settings.shutdown_timeout_ms);
            running.stop_gracefully(timeout).await;
        }
        StopRequest::Immediate => running.stop(),
    }
    Ok(())
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        self.stop_shards();
    }
}

fn bind_metrics(address: &str) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A shard's client listener, and the metrics and Unix-socket listeners for the shard that
/// serves them.
struct ShardListeners {
    tcp: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    unix: Option<std::os::unix::net::UnixListener>,
}

fn run_shard(index: usize, listeners: ShardListeners, shared: Arc<Shared>, stopped: oneshot::Receiver<()>) {
    let ShardListeners { tcp: listener, metrics: mut metrics_listener, unix } = listeners;
    // One shard is left to the scheduler: pinning keeps shards apart, and a lone pinned shard
    // cannot leave a CPU the backends crowd (on 2 cores, 0.90× PgBouncer's TPS at 50 clients
    // pinned against 0.99× unpinned).
    let live = shared.live();
    if live.settings.pin_workers && live.settings.worker_count() > 1 {
        pin_to_cpu(index);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, shard = index, "cannot start the shard's runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => return tracing::error!(%error, shard = index, "cannot register the listener"),
        };
        if index == 0 {
            tokio::spawn(maintain(shared.clone()));
            if let Some(fast) = &shared.fastpath {
                tokio::spawn(crate::pool::serve_handoffs(fast.clone(), shared.kernel_pools.clone()));
            }
            if let Some(metrics) = metrics_listener.take().and_then(|l| TcpListener::from_std(l).ok()) {
                tokio::spawn(crate::metrics::serve(metrics, shared.clone()));
            }
            if let Some(unix) = unix.and_then(|l| tokio::net::UnixListener::from_std(l).ok()) {
                tokio::spawn(accept_unix(index, unix, shared.clone()));
            }
        }
        tokio::select! {
            _ = accept_loop(index, listener, shared) => {}
            _ = stopped => {}
        }
    });
    runtime.shutdown_timeout(SHARD_STOP_TIMEOUT);
}

async fn accept_loop(shard: usize, listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // SUSPEND: this client and those behind it in the backlog wait until RESUME.
                shared.accepting().await;
                admit(shard, &shared, stream)
            }
            Err(error) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Clients of the Unix-domain socket: no TLS (as PostgreSQL), straight to login.
async fn accept_unix(shard: usize, listener: tokio::net::UnixListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                shared.accepting().await;
                let connected = shared.client_connections.fetch_add(1, Ordering::AcqRel);
                let over_limit = connected >= shared.live().settings.max_client_conn;
                let slot = ClientSlot(shared.clone());
                tokio::spawn(async move {
                    if let Some(client) = crate::login::accept_unix_within_login_timeout(&slot.0, stream).await {
                        log_in_and_serve(slot, client, over_limit, shard).await;
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accept on the Unix socket failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

fn admit(shard: usize, shared: &Arc<Shared>, stream: TcpStream) {
    tune(&stream);
    let connected = shared.client_connections.fetch_add(1, Ordering::AcqRel);
    let over_limit = connected >= shared.live().settings.max_client_conn;
    let slot = ClientSlot(shared.clone());
    let task = async move {
        if let Some(client) = crate::login::accept_within_login_timeout(&slot.0, stream).await {
            log_in_and_serve(slot, client, over_limit, shard).await;
        }
    };
    crate::pool::remember_client_task_bytes(std::mem::size_of_val(&task));
    tokio::spawn(task);
}

/// A connected client counted against `max_client_conn` until dropped.
struct ClientSlot(Arc<Shared>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.client_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Logs the client in, then serves it. A pooled session runs as a task of its own: the login's
/// state is dropped and every wake-up of a busy client polls one future level less than if the
/// session ran inside the login task (at 1,000 clients those nested polls each touch a cold line).
async fn log_in_and_serve(slot: ClientSlot, mut client: ClientSide, over_limit: bool, shard: usize) {
    let shared = &slot.0;
    // `login` bounds itself by client_login_timeout_ms and logs its own failures (one warn line
    // each, through the front door's guard).
    let outcome = login(shared, &mut client, over_limit, shard).await;
    let (result, info) = match outcome {
        Ok(LoginOutcome::Session(session)) => {
            log_login(shared, session.client(), "login");
            tokio::spawn(serve_session(slot, *session, client));
            return;
        }
        Ok(LoginOutcome::Admin(console)) => {
            log_login(shared, console.client(), "console login");
            let info = console.client().clone();
            (console.run(&mut client).await, Some(info))
        }
        Ok(LoginOutcome::Cancelled) => return,
        // Failed logins, timeouts included, were logged by `login`.
        Err(error) => (Err(error), None),
    };
    report_end(shared, &mut client, info.as_ref(), result).await;
}

async fn serve_session(slot: ClientSlot, session: Session, mut client: ClientSide) {
    let info = session.client().clone();
    let result = session.run(&mut client).await;
    report_end(&slot.0, &mut client, Some(&info), result).await;
}

/// The client's address for a log line; `unix` for the `unix_socket_dir` socket (as the front
/// door's `login failed` line).
fn client_address(info: &ClientInfo) -> String {
    info.peer.map_or_else(|| "unix".to_owned(), |peer| peer.to_string())
}

/// The `log_connections` line.
fn log_login(shared: &Shared, info: &ClientInfo, what: &str) {
    if shared.live().settings.log_connections {
        let client = client_address(info);
        tracing::info!(%client, database = %info.database, user = %info.user, "{what}");
    }
}

/// Counts a session that ended in an error, tells the client why if it can be told, and logs
/// the end of a logged-in client (`info` set): failures at warn, ordinary ends at info with
/// `log_disconnections`.
async fn report_end(
    shared: &Shared,
    client: &mut ClientSide,
    info: Option<&ClientInfo>,
    result: Result<(), PoolerError>,
) {
    if let Some(info) = info {
        log_client_end(shared, info, result.as_ref().err());
    }
    if let Err(error) = result {
        shared.errors.count(&error);
        client.send_fatal(&error).await;
    }
}

/// One `closing client` line: why, after how long.
fn log_client_end(shared: &Shared, info: &ClientInfo, error: Option<&PoolerError>) {
    let client = client_address(info);
    let connected = info.connected_at.elapsed().unwrap_or_default();
    let connected_s = format!("{:.3}", connected.as_secs_f64());
    let (database, user) = (&info.database, &info.user);
    let Some(error) = error else {
        if shared.live().settings.log_disconnections {
            tracing::info!(%client, %database, %user, %connected_s, reason = "client close request", "closing client");
        }
        return;
    };
    let sqlstate = error.client_report().map(|(code, _)| code).unwrap_or_default();
    let reason = error.to_string();
    match error {
        PoolerError::ClientIo(_) if !shared.live().settings.log_disconnections => {}
        PoolerError::ClientIo(_) => {
            tracing::info!(%client, %database, %user, %connected_s, %reason, "closing client");
        }
        _ => tracing::warn!(%client, %database, %user, %connected_s, %sqlstate, %reason, "closing client"),
    }
}

/// Runs on shard 0: servers it opens for `min_pool_size` start there.
async fn maintain(shared: Arc<Shared>) {
    let mut ticks = tokio::time::interval(QUEUE_CHECK_PERIOD);
    let mut round: u32 = 0;
    let mut stats_line = StatsLine::new(&shared, Instant::now());
    loop {
        ticks.tick().await;
        round = round.wrapping_add(1);
        let now = Instant::now();
        let pools = shared.pools();
        for pool in &pools {
            pool.expire_waiters(now);
        }
        stats_line.maybe_log(&shared, now);
        if !round.is_multiple_of(QUEUE_CHECKS_PER_MAINTENANCE) {
            continue;
        }
        shared.sweep_autodb(now);
        for pool in pools {
            let missing = pool.maintain(now);
            for _ in 0..missing {
                let pool = pool.clone();
                tokio::spawn(async move {
                    if let Err(error) = pool.prefill_one(0).await {
                        tracing::warn!(%error, database = %pool.key.database, "min_pool_size connect failed");
                    }
                });
            }
        }
    }
}

/// The `stats` line every `stats_period_ms` (PgBouncer's `stats:` line: rates and averages
/// since the previous line, over every pool), and the per-database averages of SHOW STATS.
struct StatsLine {
    since: Instant,
    previous: BTreeMap<String, PoolTotals>,
}

impl StatsLine {
    fn new(shared: &Shared, now: Instant) -> Self {
        StatsLine { since: now, previous: crate::admin::show::totals_by_database(shared) }
    }

    fn maybe_log(&mut self, shared: &Shared, now: Instant) {
        let period_ms = shared.live().settings.stats_period_ms;
        let elapsed = now.duration_since(self.since);
        if period_ms == 0 || elapsed < Duration::from_millis(period_ms) {
            return;
        }
        let current = crate::admin::show::totals_by_database(shared);
        let seconds = elapsed.as_secs_f64();
        let empty = PoolTotals::default();
        let averages = current
            .iter()
            .map(|(database, totals)| {
                let old = self.previous.get(database).unwrap_or(&empty);
                (database.clone(), crate::admin::show::averages(totals, old, seconds))
            })
            .collect();
        let (mut sum, mut old_sum) = (PoolTotals::default(), PoolTotals::default());
        current.values().for_each(|totals| sum.add(totals));
        self.previous.values().for_each(|totals| old_sum.add(totals));
        let [_, xacts, queries, received, sent, xact_us, query_us, wait_us, ..] =
            crate::admin::show::averages(&sum, &old_sum, seconds);
        tracing::info!(
            xacts_per_s = xacts,
            queries_per_s = queries,
            in_bytes_per_s = received,
            out_bytes_per_s = sent,
            xact_us,
            query_us,
            wait_us,
            clients = shared.client_connections.load(Ordering::Relaxed),
            "stats"
        );
        shared.set_averages(averages);
        self.since = now;
        self.previous = current;
    }
}
