//! Slot accounting below the pools: a [`Lease`] counts one server connection in its owner (a
//! pool) and its database's [`DatabaseLimit`], and gives the slot back when it is dropped, so no
//! error path can leak one. Pools are reached only through the small [`SlotOwner`] trait, so
//! server connections (which carry a lease) need not know what a pool is.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What counts server connections: a pool.
pub trait SlotOwner: Send + Sync {
    /// A connection counted here closed; `home` is the shard it was counted on once logged in.
    /// The owner gives the database slot back too.
    fn slot_freed(&self, home: Option<usize>);
    /// Gives a connect slot to this owner's first waiting client if it may open a server; true
    /// if it did.
    fn offer_slot(&self) -> bool;
    /// Closes one idle server to free a slot of the database; true if there was one.
    fn close_one_idle(&self) -> bool;
}

/// Servers open for one backend database across all its pools, against `max_db_connections`.
pub struct DatabaseLimit {
    /// 0 = unlimited; a reload may change it.
    max: AtomicU32,
    open: AtomicU32,
    owners: Mutex<Vec<Weak<dyn SlotOwner>>>,
}

impl std::fmt::Debug for DatabaseLimit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DatabaseLimit")
            .field("max", &self.max())
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl DatabaseLimit {
    pub fn new(max: u32) -> Arc<Self> {
        Arc::new(DatabaseLimit { max: AtomicU32::new(max), open: AtomicU32::new(0), owners: Mutex::new(Vec::new()) })
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
        assert!(previous > 0, "database connection count underflow");
    }

    /// Adds a pool of this database (its siblings are offered freed slots).
    pub fn register(&self, owner: Weak<dyn SlotOwner>) {
        lock(&self.owners).push(owner);
    }

    /// The pools of this database still alive.
    pub fn owners(&self) -> Vec<Arc<dyn SlotOwner>> {
        lock(&self.owners).iter().filter_map(Weak::upgrade).collect()
    }
}

/// Counts one server connection in its pool and database; dropping it frees the slot.
pub struct Lease {
    owner: Weak<dyn SlotOwner>,
    /// `None` for a connection outside every pool (see [`Lease::detached`]).
    database: Option<Arc<DatabaseLimit>>,
    /// The shard the server is counted on once logged in.
    home: Option<usize>,
}

/// The owner of a detached lease: nobody.
struct NoOwner;

impl SlotOwner for NoOwner {
    fn slot_freed(&self, _home: Option<usize>) {}
    fn offer_slot(&self) -> bool {
        false
    }
    fn close_one_idle(&self) -> bool {
        false
    }
}

impl Lease {
    /// A slot already counted in `owner` and `database`.
    pub fn new(owner: Weak<dyn SlotOwner>, database: Arc<DatabaseLimit>) -> Lease {
        Lease { owner, database: Some(database), home: None }
    }

    /// A lease of no pool, for a connection the pooler opens for itself (auth_query, mirrors).
    pub fn detached() -> Lease {
        Lease { owner: Weak::<NoOwner>::new(), database: None, home: None }
    }

    /// Counts the server on `shard` from now on; returns the shard it was counted on before.
    pub fn count_on(&mut self, shard: usize) -> Option<usize> {
        self.home.replace(shard)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match self.owner.upgrade() {
            Some(owner) => owner.slot_freed(self.home),
            // The pool is gone (replaced by a reload and left by its last client).
            None => {
                if let Some(database) = &self.database {
                    database.give_back();
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
