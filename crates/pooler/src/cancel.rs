//! Cancel keys and the list of logged-in clients. Each client gets a key of the pooler's own; a
//! CancelRequest with that key is sent on, with the server's real key, to whichever server runs
//! the client's query at that moment. The same entries answer `SHOW CLIENTS` and `KILL`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use bypass_fastpath::ClientSlot;
use bypass_wire::scram::constant_time_eq;
use rand::Rng;

use crate::server::BackendKey;

/// Bound on registered keys; one per client, so `max_client_conn` keeps it far below this.
const REGISTERED_MAX: usize = 1 << 20;

/// Where a client's cancel goes while it holds a server.
#[derive(Debug, Clone, Copy)]
pub struct CancelRoute {
    pub address: SocketAddr,
    pub key: BackendKey,
}

/// Who a logged-in client is, for the admin console.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub user: String,
    pub database: String,
    pub peer: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub connected_at: SystemTime,
    /// The client's socket, shut down by `KILL`. Valid while the entry is registered: the entry
    /// is removed before the session's socket is closed.
    pub fd: RawFd,
    /// The `application_name` the client gave at startup (SHOW CLIENTS).
    pub application_name: String,
    /// Whether the client's connection is TLS.
    pub tls: bool,
}

/// One client's cancel key and its current route.
#[derive(Debug)]
pub struct CancelEntry {
    pub process_id: i32,
    pub secret: [u8; 4],
    pub info: ClientInfo,
    route: Mutex<Option<CancelRoute>>,
    /// The client's slot when its socket is in the kernel fast path: a server the kernel
    /// linked to it is found through the slot's link word, not `route`.
    pub kernel_slot: OnceLock<ClientSlot>,
    /// True while the client waits in a pool's queue (SHOW CLIENTS `waiting`).
    waiting: AtomicBool,
}

impl CancelEntry {
    /// Records the server the client now uses, or `None` when it has none.
    pub fn set_route(&self, route: Option<CancelRoute>) {
        *self.route.lock().unwrap_or_else(|p| p.into_inner()) = route;
    }

    /// Where the route lives, for a prefetch before the client's next transaction sets it.
    pub fn route_line(&self) -> *const u8 {
        std::ptr::from_ref(&self.route).cast()
    }

    pub fn set_waiting(&self, waiting: bool) {
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    pub fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }

    pub fn route(&self) -> Option<CancelRoute> {
        *self.route.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// All clients' keys, by the process id we gave them.
#[derive(Debug, Default)]
pub struct CancelRegistry {
    entries: Mutex<HashMap<i32, Arc<CancelEntry>>>,
}

/// Removes the entry when the client's session ends.
pub struct Registration {
    registry: Arc<CancelRegistry>,
    pub entry: Arc<CancelEntry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.entry.process_id);
    }
}

impl CancelRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Arc<CancelEntry>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Issues a fresh random key; `None` if the registry is full.
    pub fn register(self: &Arc<Self>, info: ClientInfo) -> Option<Registration> {
        let mut rng = rand::thread_rng();
        let mut entries = self.lock();
        if entries.len() >= REGISTERED_MAX {
            return None;
        }
        let process_id = loop {
            let candidate = rng.gen_range(1..i32::MAX);
            if !entries.contains_key(&candidate) {
                break candidate;
            }
        };
        let route = Mutex::new(None);
        let entry = Arc::new(CancelEntry {
            process_id,
            secret: rng.gen(),
            info,
            route,
            kernel_slot: OnceLock::new(),
            waiting: AtomicBool::new(false),
        });
        entries.insert(process_id, entry.clone());
        Some(Registration { registry: self.clone(), entry })
    }

    /// The client a CancelRequest names, if the key is valid.
    pub fn entry_for(&self, process_id: i32, secret: &[u8]) -> Option<Arc<CancelEntry>> {
        let entry = self.lock().get(&process_id).cloned()?;
        constant_time_eq(&entry.secret, secret).then_some(entry)
    }

    /// Every registered client.
    pub fn entries(&self) -> Vec<Arc<CancelEntry>> {
        self.lock().values().cloned().collect()
    }

    /// Disconnects every client `matches` selects (shuts its socket down: its session then ends
    /// as if the client had left); returns how many.
    pub fn kill(&self, matches: impl Fn(&ClientInfo) -> bool) -> usize {
        let entries = self.lock();
        let mut killed = 0;
        for entry in entries.values().filter(|entry| matches(&entry.info)) {
            // SAFETY: the fd stays open while its entry is registered (removal happens before the
            // socket closes) and we hold the registry lock; shutdown() does not close the fd.
            unsafe { libc::shutdown(entry.info.fd, libc::SHUT_RDWR) };
            killed += 1;
        }
        killed
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
