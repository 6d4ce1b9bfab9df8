//! Connects a mirrored client's shadow (`mirror = "<database>"`, see [`crate::mirror`]): logs in
//! to the mirror entry's backend outside every pool, then mirrors in the kernel when it can,
//! else in user space.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::client::ClientSide;
use crate::error::PoolerError;
use crate::lease::Lease;
use crate::mirror::{ClientMirror, KernelMirror, UserMirror};
use crate::server::{Credential, LoginTarget, ServerConn, ServerLimits};
use crate::shared::Shared;
use crate::stream::Stream;

/// Opens the shadow session of a client of a mirrored database and starts mirroring it; `None`
/// when the database has no mirror or the shadow failed (warned and counted). Runs after the
/// client's login succeeded and before its ReadyForQuery is sent.
pub async fn attach(
    shared: &Arc<Shared>,
    client: &ClientSide,
    database: &str,
    user: &str,
    shard: usize,
) -> Option<ClientMirror> {
    let target = shared.mirror_target(database, user)?;
    let counters = &shared.mirror.counters;
    let shadow = match target {
        Ok((target, credential)) => connect_shadow(shared, &target, &credential, shard).await,
        Err(error) => Err(error),
    };
    let shadow = match shadow {
        Ok(shadow) => shadow,
        Err(error) => {
            counters.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, database, "shadow server unreachable; this client is not mirrored");
            return None;
        }
    };
    let shadow = match try_kernel(shared, client, shadow) {
        Ok(mirror) => return Some(ClientMirror::Kernel(mirror)),
        Err(shadow) => shadow,
    };
    Some(ClientMirror::User(UserMirror::start(shadow, client.buffer.pending(), counters)))
}

/// Logs in to the shadow server within `mirror_connect_timeout_ms`, as a pool would log in a
/// server (same TLS and authentication), but outside every pool.
async fn connect_shadow(
    shared: &Shared,
    target: &LoginTarget,
    credential: &Credential,
    shard: usize,
) -> Result<Stream, PoolerError> {
    let settings = &shared.live().settings;
    let limits = ServerLimits { message_size_max: settings.message_size_max, statements_max: 0 };
    let timeout = Duration::from_millis(settings.mirror_connect_timeout_ms);
    let login = ServerConn::login(target, credential, Lease::detached(), limits, shard);
    let (server, _) = tokio::time::timeout(timeout, login).await.map_err(|_| PoolerError::ServerConnect {
        address: target.address.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::TimedOut, "mirror_connect_timeout_ms ran out"),
    })??;
    // The login read up to ReadyForQuery and a fresh server says nothing more: the stream is
    // at a message boundary with nothing unread, so a copy of the client's stream fits on.
    let ServerConn { stream, .. } = *server;
    Ok(stream)
}

/// Mirrors in the kernel when it can: fast path loaded, mirroring enabled on the interface, a
/// plaintext client with nothing read ahead (bytes already read would miss the copy), a
/// plaintext shadow, an IPv4 flow. Otherwise the shadow comes back for user space.
fn try_kernel(shared: &Shared, client: &ClientSide, shadow: Stream) -> Result<KernelMirror, Stream> {
    let Some(fast) = &shared.fastpath else { return Err(shadow) };
    if client.stream.is_tls() || !client.buffer.is_empty() {
        return Err(shadow);
    }
    let Stream::Plain(shadow_tcp) = shadow else { return Err(shadow) };
    if !shared.mirror.kernel_ready(fast, &shared.live().settings.mirror_interface) {
        return Err(Stream::Plain(shadow_tcp));
    }
    let Some(tcp) = client.stream.tcp() else { return Err(Stream::Plain(shadow_tcp)) };
    let (Ok(peer), Ok(local)) = (tcp.peer_addr(), tcp.local_addr()) else { return Err(Stream::Plain(shadow_tcp)) };
    match fast.add_mirror(peer, local, shadow_tcp.as_fd()) {
        Ok(handle) => Ok(KernelMirror::start(fast.clone(), handle, shadow_tcp, &shared.mirror.counters)),
        Err(error) => {
            tracing::debug!(%error, %peer, "kernel mirroring refused this client; mirroring in user space");
            Err(Stream::Plain(shadow_tcp))
        }
    }
}
