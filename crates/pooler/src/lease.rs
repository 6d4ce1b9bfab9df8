//! Slot accounting below the pools: a [`Lease`] counts one server connection in its owner (a
//! pool) and in the [`SharedLimits`] it shares with other pools (its database's
//! `max_db_connections` and its user's `max_user_connections`, each a [`ConnectionLimit`]), and
//! gives the slot back when it is dropped, so no error path can leak one. Pools are reached only through the small [`SlotOwner`] trait, so
//! server connections (which carry a lease) need not know what a pool is.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// What counts server connections: a pool.
pub trait SlotOwner: Send + Sync {
    /// A connection counted here closed; `home` is the shard it was counted on once logged in,
    /// `opened_at` when its slot was taken. The owner gives the shared slots back too.
    fn slot_freed(&self, home: Option<usize>, opened_at: Instant);
    /// Gives a connect slot to this owner's first waiting client if it may open a server; true
    /// if it did.
    fn offer_slot(&self) -> bool;
    /// Closes one idle server to free a shared slot; true if there was one.
    fn close_one_idle(&self) -> bool;
}

/// Servers open for one database (`max_db_connections`) or one user (`max_user_connections`)
/// across all its pools.
pub struct ConnectionLimit {
    /// 0 = unlimited; a reload may change it.
    max: AtomicU32,
    open: AtomicU32,
    owners: Mutex<Vec<Weak<dyn SlotOwner>>>,
}

impl std::fmt::Debug for ConnectionLimit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ConnectionLimit")
            .field("max", &self.max())
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ConnectionLimit {
    pub fn new(max: u32) -> Arc<Self> {
        Arc::new(ConnectionLimit { max: AtomicU32::new(max), open: AtomicU32::new(0), owners: Mutex::new(Vec::new()) })
    }

    pub fn set_max(&self, max: u32) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub fn max(&self) -> u32 {
        self.max.load(Ordering::Relaxed)
    }

    /// Servers counted now.
    pub fn open(&self) -> u32 {
        self.open.load(Ordering::Relaxed)
    }

    /// Counts one more server if the limit allows it.
    pub fn try_take(&self) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                let max = self.max();
                (max == 0 || open < max).then_some(open + 1)
            })
            .is_ok()
    }

    pub fn give_back(&self) {
        let previous = self.open.fetch_sub(1, Ordering::AcqRel);
        assert!(previous > 0, "shared connection count underflow");
    }

    /// Adds a pool counted here (its siblings are offered freed slots).
    pub fn register(&self, owner: Weak<dyn SlotOwner>) {
        lock(&self.owners).push(owner);
    }

    /// The pools counted here still alive.
    pub fn owners(&self) -> Vec<Arc<dyn SlotOwner>> {
        lock(&self.owners).iter().filter_map(Weak::upgrade).collect()
    }
}

/// The limits a pool's servers count against besides the pool's own size.
#[derive(Debug, Clone)]
pub struct SharedLimits {
    pub database: Arc<ConnectionLimit>,
    pub user: Arc<ConnectionLimit>,
}

impl SharedLimits {
    /// Counts one more server in both, or in neither.
    pub fn try_take(&self) -> bool {
        if !self.database.try_take() {
            return false;
        }
        if !self.user.try_take() {
            self.database.give_back();
            return false;
        }
        true
    }

    pub fn give_back(&self) {
        self.database.give_back();
        self.user.give_back();
    }

    /// True when either limit is set (a full one may be relieved by closing an idle server).
    pub fn bounded(&self) -> bool {
        self.database.max() > 0 || self.user.max() > 0
    }

    pub fn register(&self, owner: Weak<dyn SlotOwner>) {
        self.database.register(owner.clone());
        self.user.register(owner);
    }

    /// The pools that share a limit with this one (itself included), database siblings first.
    pub fn owners(&self) -> Vec<Arc<dyn SlotOwner>> {
        let mut owners = self.database.owners();
        for owner in self.user.owners() {
            if !owners.iter().any(|known| std::ptr::addr_eq(Arc::as_ptr(known), Arc::as_ptr(&owner))) {
                owners.push(owner);
            }
        }
        owners
    }
}

/// Counts one server connection in its pool and shared limits; dropping it frees the slot.
pub struct Lease {
    owner: Weak<dyn SlotOwner>,
    /// `None` for a connection outside every pool (see [`Lease::detached`]).
    limits: Option<SharedLimits>,
    /// The shard the server is counted on once logged in.
    home: Option<usize>,
    opened_at: Instant,
}

/// The owner of a detached lease: nobody.
struct NoOwner;

impl SlotOwner for NoOwner {
    fn slot_freed(&self, _home: Option<usize>, _opened_at: Instant) {}
    fn offer_slot(&self) -> bool {
        false
    }
    fn close_one_idle(&self) -> bool {
        false
    }
}

impl Lease {
    /// A slot already counted in `owner` and `limits`.
    pub fn new(owner: Weak<dyn SlotOwner>, limits: SharedLimits) -> Lease {
        Lease { owner, limits: Some(limits), home: None, opened_at: Instant::now() }
    }

    /// A lease of no pool, for a connection the pooler opens for itself (auth_query, mirrors).
    pub fn detached() -> Lease {
        Lease { owner: Weak::<NoOwner>::new(), limits: None, home: None, opened_at: Instant::now() }
    }

    /// Counts the server on `shard` from now on; returns the shard it was counted on before.
    pub fn count_on(&mut self, shard: usize) -> Option<usize> {
        self.home.replace(shard)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match self.owner.upgrade() {
            Some(owner) => owner.slot_freed(self.home, self.opened_at),
            // The pool is gone (replaced by a reload and left by its last client).
            None => {
                if let Some(limits) = &self.limits {
                    limits.give_back();
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
