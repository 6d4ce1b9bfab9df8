//! Health checks: each backend is asked, through a link of its own, whether it is a standby and
//! how far its replay lags. A failure bans it; the next success readmits it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bypass_wire::frontend;
use bypass_wire::BackendMessage;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use super::{Link, LinkKind, Shared};
use crate::buffer::BufferIo;
use crate::config::Policy;
use crate::error::{DispatchError, Result};
use crate::pglogin::{server_error, LoginRequest};

/// Replay lag in ms: 0 on a primary and on a standby that replayed all it received.
pub const LAG_QUERY: &str = "select case when not pg_is_in_recovery() then 0 \
    when pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() then 0 \
    else coalesce((extract(epoch from now() - pg_last_xact_replay_timestamp()) * 1000)::bigint, 0) end";

/// Runs until `stop`: checks backend `id` every `health_interval_ms`.
pub async fn watch_backend(shared: Arc<Shared>, id: usize, mut stop: watch::Receiver<bool>) {
    let settings = &shared.config.settings;
    let interval = Duration::from_millis(settings.health_interval_ms);
    let timeout = Duration::from_millis(settings.health_timeout_ms);
    let mut link: Option<Link> = None;
    loop {
        let outcome = tokio::time::timeout(timeout, check(&shared, id, &mut link)).await;
        let backend = &shared.backends[id];
        match outcome {
            Ok(Ok(lag_ms)) => {
                backend.lag_ms.store(lag_ms, Ordering::Relaxed);
                backend.readmit();
            }
            Ok(Err(error)) => {
                link = None;
                backend.ban(&error);
            }
            Err(_) => {
                link = None;
                let waited_ms = settings.health_timeout_ms;
                backend.ban(&DispatchError::Timeout { what: "a health check".into(), waited_ms });
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

async fn check(shared: &Shared, id: usize, link: &mut Option<Link>) -> Result<u64> {
    let settings = &shared.config.settings;
    if link.is_none() {
        let request = LoginRequest::trust(&settings.health_user, &settings.health_database);
        // Checked the way most answers come: relay-only asks the server itself, the hand-over
        // policies ask through the agent (which needs its server too).
        let backend = &shared.backends[id];
        let kind = if settings.policy == Policy::Relay { backend.relay_kind() } else { LinkKind::Agent };
        *link = Some(backend.connect_kind(kind, request).await?);
    }
    let link = link.as_mut().expect("connected above");
    let value = query_single_value(link, LAG_QUERY).await?;
    value
        .trim()
        .parse::<i64>()
        .map(|lag| lag.max(0) as u64)
        .map_err(|_| DispatchError::Protocol(format!("lag query returned {value:?}")))
}

/// Runs a simple query on a link and returns the first column of its first row.
pub async fn query_single_value(link: &mut Link, sql: &str) -> Result<String> {
    let mut out = Vec::with_capacity(sql.len() + 8);
    frontend::build::query(&mut out, sql);
    link.stream.write_all(&out).await.map_err(|e| DispatchError::io("sending a query on a link", e))?;
    let mut value = None;
    let mut failure = None;
    loop {
        let header = link.buffer.read_message(&mut link.stream, "the backend").await?;
        match BackendMessage::decode(header.tag, link.buffer.body(header))? {
            BackendMessage::DataRow(values) if value.is_none() => {
                value = values.iter().next().flatten().map(|v| String::from_utf8_lossy(v).into_owned());
            }
            BackendMessage::ErrorResponse(fields) => failure = Some(server_error(&fields)),
            BackendMessage::ReadyForQuery(_) => {
                link.buffer.consume(header.frame_len());
                return match failure {
                    Some(error) => Err(error),
                    None => value.ok_or_else(|| DispatchError::Protocol(format!("no value from {sql:?}"))),
                };
            }
            _ => {}
        }
        link.buffer.consume(header.frame_len());
    }
}
