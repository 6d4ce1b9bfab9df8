//! The listener: accepts clients, enforces `max_client_conn`, runs each client as a task, and
//! keeps pools in shape (idle timeouts, lifetimes, `min_pool_size`) once a second.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

use crate::config::ValidConfig;
use crate::error::{PoolerError, TimeoutKind};
use crate::io::tune;
use crate::login::{login, LoginOutcome};
use crate::session::ClientSide;
use crate::shared::Shared;

/// How often queued clients are checked against `query_wait_timeout`.
const QUEUE_CHECK_PERIOD: Duration = Duration::from_millis(100);
/// Queue checks per pool maintenance round (idle timeouts, lifetimes, `min_pool_size`): 1 s.
const QUEUE_CHECKS_PER_MAINTENANCE: u32 = 10;

/// A bound pooler, ready to serve.
pub struct Proxy {
    shared: Arc<Shared>,
    listener: TcpListener,
}

impl Proxy {
    /// Binds the listen address with the configured backlog. Must run inside a tokio runtime.
    pub fn bind(config: ValidConfig) -> std::io::Result<Proxy> {
        let address = config.listen_addr;
        let backlog = config.config.pooler.listen_backlog;
        let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&address.into())?;
        socket.listen(backlog.min(i32::MAX as u32) as i32)?;
        let listener = TcpListener::from_std(socket.into())?;
        Ok(Proxy { shared: Shared::new(config), listener })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Accepts clients forever.
    pub async fn serve(self) {
        tokio::spawn(maintain(self.shared.clone()));
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => self.admit(stream),
                Err(error) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    fn admit(&self, stream: TcpStream) {
        tune(&stream);
        let shared = self.shared.clone();
        let connected = shared.client_connections.fetch_add(1, Ordering::AcqRel);
        let over_limit = connected >= shared.settings.max_client_conn;
        tokio::spawn(async move {
            let client = ClientSide::new(stream);
            run_client(&shared, client, over_limit).await;
            shared.client_connections.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

async fn run_client(shared: &Arc<Shared>, mut client: ClientSide, over_limit: bool) {
    let login_timeout = Duration::from_millis(shared.settings.client_login_timeout_ms);
    let outcome = match tokio::time::timeout(login_timeout, login(shared, &mut client, over_limit)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(PoolerError::Timeout(TimeoutKind::ClientLogin)),
    };
    let result = match outcome {
        Ok(LoginOutcome::Session(session)) => session.run(&mut client).await,
        Ok(LoginOutcome::Cancelled) => Ok(()),
        Err(error) => Err(error),
    };
    if let Err(error) = result {
        tracing::debug!(%error, blame = ?error.blame(), "client session ended");
        client.send_fatal(&error).await;
    }
}

async fn maintain(shared: Arc<Shared>) {
    let mut ticks = tokio::time::interval(QUEUE_CHECK_PERIOD);
    let mut round: u32 = 0;
    loop {
        ticks.tick().await;
        round = round.wrapping_add(1);
        let now = Instant::now();
        let pools = shared.pools();
        for pool in &pools {
            pool.expire_waiters(now);
        }
        if !round.is_multiple_of(QUEUE_CHECKS_PER_MAINTENANCE) {
            continue;
        }
        for pool in pools {
            let missing = pool.maintain(now);
            for _ in 0..missing {
                let pool = pool.clone();
                tokio::spawn(async move {
                    if let Err(error) = pool.prefill_one().await {
                        tracing::warn!(%error, database = %pool.key.database, "min_pool_size connect failed");
                    }
                });
            }
        }
    }
}
