//! The database's tables over time: committed catalog versions, what one statement sees, and
//! the table locks that keep writers of one table in line and DROP/TRUNCATE away from readers.
//!
//! ```text
//!   Database.committed ── Arc<CatalogVersion> (name → Arc<Table>)   replaced whole on commit
//!        │ snapshot (clone of the Arc: O(1))
//!        ▼
//!   Catalog (a statement's view) = snapshot + the transaction's own changes on top
//!
//!   read:  share-lock every table the statement names (before its snapshot), held to the end
//!          of the transaction
//!   write: lock the table name (wait; 40P01 on a cycle; 55P03 past lock_timeout) ─► build the
//!          next version from the newest committed one ─► keep it in the transaction ─►
//!          COMMIT publishes every changed name at once; ROLLBACK drops them
//!   DROP / TRUNCATE: the write lock taken exclusively (also waits for other transactions'
//!          share locks)
//! ```
//!
//! Lock modes and what they wait for (PostgreSQL's ACCESS SHARE, ROW EXCLUSIVE and ACCESS
//! EXCLUSIVE, as far as they matter here):
//!
//! | asked \ held by another | share | write | exclusive |
//! |------------------------|-------|-------|-----------|
//! | share (read)           |       |       | waits     |
//! | write (INSERT, UPDATE…)|       | waits | waits     |
//! | exclusive (DROP, TRUNCATE) | waits | waits | waits |
//!
//! Why table-level write locks instead of row versions: tables are immutable columnar versions,
//! so a writer builds a whole new version; two writers of one table must not both build from
//! the same base (one would lose the other's rows). Holding the name's lock until commit
//! makes the second writer wait, as PostgreSQL makes a writer wait for a row another
//! transaction changed. Readers keep the version they started with, so plain writes never
//! wait for them; but a DROP or TRUNCATE committed while a reader's transaction is open would
//! make the reader's next statement fail with 42P01 or see the table emptied, so those wait
//! for the readers' share locks (as in PostgreSQL), bounded by lock_timeout (55P03),
//! statement_timeout and cancel (57014), and a cycle of waits is a deadlock (40P01).
//!
//! Invariants: a name has at most one write or exclusive holder; an exclusive holder has no
//! other transaction sharing the name; a transaction only publishes names it holds the write
//! lock of; publication replaces the committed version in one step, so a snapshot never sees
//! half a commit.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};
use crate::storage::Table;

/// First oid handed to a user table (PostgreSQL's FirstNormalObjectId).
pub const FIRST_USER_OID: u32 = 16_384;
/// How often a lock waiter wakes to check for cancel and timeouts.
const LOCK_WAIT_SLICE: Duration = Duration::from_millis(10);

/// Identifies a transaction (for locks).
pub type TransactionId = u64;

/// One committed state of the database.
#[derive(Clone, Default)]
pub struct CatalogVersion {
    tables: HashMap<String, Arc<Table>>,
}

impl CatalogVersion {
    pub fn get(&self, name: &str) -> Option<&Arc<Table>> {
        self.tables.get(name)
    }

    pub fn tables(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.tables.values()
    }
}

/// Changes a transaction made: name → new version, or `None` for a dropped table.
pub type Changes = BTreeMap<String, Option<Arc<Table>>>;

/// What one statement sees: a committed snapshot with its transaction's changes on top.
#[derive(Clone, Default)]
pub struct Catalog {
    snapshot: Arc<CatalogVersion>,
    changes: Changes,
    /// The session's temporary tables are kept under `temp_namespace + name` and found before
    /// tables of the same name (PostgreSQL's pg_temp comes first in the search path).
    temp_namespace: String,
}

/// Keys of temporary tables start with this byte, which no SQL identifier contains.
pub const TEMP_KEY_START: char = '\0';

impl Catalog {
    pub fn new(snapshot: Arc<CatalogVersion>, changes: Changes) -> Catalog {
        Catalog { snapshot, changes, temp_namespace: String::new() }
    }

    /// The same view, with the temporary tables of the session whose keys start with `namespace`.
    pub fn with_temp_namespace(mut self, namespace: &str) -> Catalog {
        self.temp_namespace = namespace.to_string();
        self
    }

    /// The same view with `table` stored under `key` (a statement's private stand-in for a
    /// table, such as ON CONFLICT's one-row `excluded`).
    pub fn with_table(mut self, key: &str, table: Arc<Table>) -> Catalog {
        self.changes.insert(key.to_string(), Some(table));
        self
    }

    /// The key a table is stored under: its temporary table's, if the session has one.
    pub fn key_of(&self, name: &str) -> String {
        if !self.temp_namespace.is_empty() && !name.starts_with(TEMP_KEY_START) {
            let key = format!("{}{name}", self.temp_namespace);
            if self.find_key(&key).is_some() {
                return key;
            }
        }
        name.to_string()
    }

    /// The table visible under `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Table>> {
        self.find(name).ok_or_else(|| EngineError::UnknownTable(name.to_string()))
    }

    pub fn find(&self, name: &str) -> Option<Arc<Table>> {
        self.find_key(&self.key_of(name))
    }

    fn find_key(&self, name: &str) -> Option<Arc<Table>> {
        match self.changes.get(name) {
            Some(change) => change.clone(),
            None => self.snapshot.get(name).cloned(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// Every visible table, by name.
    pub fn tables(&self) -> Vec<Arc<Table>> {
        self.entries().into_iter().map(|(_, table)| table).collect()
    }

    /// Every visible table with the key it is stored under, by key.
    pub fn entries(&self) -> Vec<(String, Arc<Table>)> {
        let mut tables: BTreeMap<&str, Arc<Table>> =
            self.snapshot.tables.iter().map(|(name, table)| (name.as_str(), Arc::clone(table))).collect();
        for (name, change) in &self.changes {
            match change {
                Some(table) => tables.insert(name, Arc::clone(table)),
                None => tables.remove(name.as_str()),
            };
        }
        // Other sessions' temporary tables are not visible.
        let own = |key: &str| !self.temp_namespace.is_empty() && key.starts_with(self.temp_namespace.as_str());
        tables.retain(|key, _| !key.starts_with(TEMP_KEY_START) || own(key));
        tables.into_iter().map(|(key, table)| (key.to_string(), table)).collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.tables().iter().map(|t| t.name.clone()).collect()
    }
}

/// How a transaction locks a table name (see the module docs' table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Reading: keeps DROP and TRUNCATE away until the transaction ends.
    Share,
    /// Writing a new version (INSERT, UPDATE, DELETE, COPY, CREATE).
    Write,
    /// Replacing the table whole (DROP, TRUNCATE).
    Exclusive,
}

/// The user tables a statement names (FROM items, DML targets, …), as the catalog names them;
/// system-catalog names and names the catalog cannot hold are left out.
pub fn named_tables(statement: &sqlparser::ast::Statement) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let _ = sqlparser::ast::visit_relations(statement, |name| {
        if let Ok(name) = crate::ddl::user_table_name(name) {
            names.insert(name);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    names
}

/// Table-name locks held until the end of a transaction.
#[derive(Default)]
struct LockState {
    /// The write or exclusive holder of each name, and whether it holds it exclusively.
    owners: HashMap<String, (TransactionId, bool)>,
    /// The transactions sharing each name (readers).
    sharers: HashMap<String, HashSet<TransactionId>>,
    /// What each waiting transaction waits for (deadlock detection).
    waiting: HashMap<TransactionId, (String, LockMode)>,
}

impl LockState {
    /// The transactions whose locks keep `transaction` from locking `name` in `mode`.
    fn blockers(&self, name: &str, mode: LockMode, transaction: TransactionId) -> Vec<TransactionId> {
        let mut blockers = Vec::new();
        if let Some(&(owner, exclusive)) = self.owners.get(name) {
            if owner != transaction && (exclusive || mode != LockMode::Share) {
                blockers.push(owner);
            }
        }
        if mode == LockMode::Exclusive {
            let sharers = self.sharers.get(name).into_iter().flatten().copied();
            let others: Vec<TransactionId> = sharers.filter(|&t| t != transaction && !blockers.contains(&t)).collect();
            blockers.extend(others);
        } else if !self.holds(name, transaction) {
            // As in PostgreSQL, a new lock queues behind a waiting DROP/TRUNCATE instead of
            // passing it: readers arriving one after another would keep it waiting forever.
            let queued = self.waiting.iter().filter(|(&t, (waited, m))| {
                t != transaction && *m == LockMode::Exclusive && waited == name && !blockers.contains(&t)
            });
            blockers.extend(queued.map(|(&t, _)| t).collect::<Vec<_>>());
        }
        blockers
    }

    /// Whether `transaction` holds a lock on `name` in any mode (then it does not queue: it
    /// would wait for a waiter that waits for it).
    fn holds(&self, name: &str, transaction: TransactionId) -> bool {
        self.owners.get(name).is_some_and(|&(owner, _)| owner == transaction)
            || self.sharers.get(name).is_some_and(|sharers| sharers.contains(&transaction))
    }

    fn grant(&mut self, name: &str, mode: LockMode, transaction: TransactionId) {
        match mode {
            LockMode::Share => {
                self.sharers.entry(name.to_string()).or_default().insert(transaction);
            }
            LockMode::Write => {
                self.owners.entry(name.to_string()).or_insert((transaction, false));
            }
            LockMode::Exclusive => {
                self.owners.insert(name.to_string(), (transaction, true));
            }
        }
    }

    /// Whether `from` (transitively) waits for a lock held by `target`.
    fn waits_for(&self, from: TransactionId, target: TransactionId) -> bool {
        let mut seen = HashSet::new();
        let mut pending = vec![from];
        // Bounded: each waiting transaction is expanded at most once.
        while let Some(current) = pending.pop() {
            if !seen.insert(current) {
                continue;
            }
            let Some((name, mode)) = self.waiting.get(&current) else { continue };
            for blocker in self.blockers(name, *mode, current) {
                if blocker == target {
                    return true;
                }
                pending.push(blocker);
            }
        }
        false
    }
}

/// The shared state of all sessions: committed versions, locks, identifiers.
pub struct Database {
    committed: Mutex<Arc<CatalogVersion>>,
    locks: Mutex<LockState>,
    released: Condvar,
    next_oid: AtomicU32,
    next_transaction: AtomicU64,
}

impl Default for Database {
    fn default() -> Self {
        Database {
            committed: Mutex::new(Arc::new(CatalogVersion::default())),
            locks: Mutex::new(LockState::default()),
            released: Condvar::new(),
            next_oid: AtomicU32::new(FIRST_USER_OID),
            next_transaction: AtomicU64::new(1),
        }
    }
}

impl Database {
    /// The newest committed version (O(1): shares it).
    pub fn snapshot(&self) -> Arc<CatalogVersion> {
        Arc::clone(&self.committed.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn new_transaction_id(&self) -> TransactionId {
        self.next_transaction.fetch_add(1, Ordering::Relaxed)
    }

    pub fn new_oid(&self) -> u32 {
        self.next_oid.fetch_add(1, Ordering::Relaxed)
    }

    /// Publishes a transaction's changes in one step. The caller holds the lock of every name.
    pub fn publish(&self, changes: Changes) {
        if changes.is_empty() {
            return;
        }
        let mut committed = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = CatalogVersion::clone(&committed);
        for (name, change) in changes {
            match change {
                Some(table) => next.tables.insert(name, table),
                None => next.tables.remove(&name),
            };
        }
        *committed = Arc::new(next);
    }

    /// Locks `name` for writing (see [`Database::lock_mode`]).
    pub fn lock(&self, transaction: TransactionId, name: &str, timeout: Option<Duration>) -> Result<()> {
        self.lock_mode(transaction, name, LockMode::Write, timeout)
    }

    /// Locks `name` in `mode` for `transaction` until it ends, waiting while other
    /// transactions hold conflicting locks. Fails with 40P01 when waiting would close a cycle,
    /// 55P03 past `timeout`, or when the statement is canceled or times out (57014).
    pub fn lock_mode(
        &self,
        transaction: TransactionId,
        name: &str,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let started = Instant::now();
        let mut state = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let blockers = state.blockers(name, mode, transaction);
            if blockers.is_empty() {
                state.waiting.remove(&transaction);
                state.grant(name, mode, transaction);
                return Ok(());
            }
            let stop = if blockers.iter().any(|&b| state.waits_for(b, transaction)) {
                Some(EngineError::DeadlockDetected(format!("transactions wait for each other's locks on \"{name}\"")))
            } else if timeout.is_some_and(|t| started.elapsed() >= t) {
                Some(EngineError::LockTimeout)
            } else {
                crate::control::check().err()
            };
            if let Some(error) = stop {
                state.waiting.remove(&transaction);
                return Err(error);
            }
            state.waiting.insert(transaction, (name.to_string(), mode));
            state = self.released.wait_timeout(state, LOCK_WAIT_SLICE).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// How many transactions wait for a lock now (tests, monitoring).
    pub fn lock_waiters(&self) -> usize {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).waiting.len()
    }

    /// Releases every lock of `transaction` (commit, rollback, session end).
    pub fn unlock_all(&self, transaction: TransactionId) {
        let mut state = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        state.owners.retain(|_, (owner, _)| *owner != transaction);
        state.sharers.retain(|_, sharers| {
            sharers.remove(&transaction);
            !sharers.is_empty()
        });
        state.waiting.remove(&transaction);
        drop(state);
        self.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a second transaction waits for a held lock and gets it after release; a cycle is a
    // deadlock (40P01); method: two threads, then a deliberate cycle.
    #[test]
    fn locks_wait_and_detect_deadlocks() {
        let database = Arc::new(Database::default());
        database.lock(1, "a", None).expect("free");
        database.lock(1, "a", None).expect("re-entrant");
        database.lock(2, "b", None).expect("free");
        let waiter = {
            let database = Arc::clone(&database);
            std::thread::spawn(move || database.lock(2, "a", None))
        };
        // The cycle exists only once 2 waits (a fixed sleep hung this test on a loaded machine:
        // 1 blocked on "b" first, then 2 got the 40P01 and 1 waited for ever).
        while !database.locks.lock().unwrap_or_else(|p| p.into_inner()).waiting.contains_key(&2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let deadlock = database.lock(1, "b", None).expect_err("2 waits for 1 and 1 would wait for 2");
        assert_eq!(deadlock.sqlstate(), "40P01");
        database.unlock_all(1);
        waiter.join().expect("no panic").expect("granted after release");
        let timeout = database.lock(3, "a", Some(Duration::from_millis(20))).expect_err("held by 2");
        assert_eq!(timeout.sqlstate(), "55P03");
    }

    // Goal: readers share a name with each other and with a writer; DROP/TRUNCATE's exclusive
    // lock waits for other readers (55P03 past its timeout) and keeps new readers out; two
    // readers that both ask for it deadlock (40P01); method: lock modes on one Database.
    #[test]
    fn exclusive_locks_wait_for_readers() {
        let database = Arc::new(Database::default());
        let short = Some(Duration::from_millis(20));
        database.lock_mode(1, "t", LockMode::Share, None).expect("free");
        database.lock_mode(2, "t", LockMode::Share, None).expect("readers share");
        database.lock_mode(3, "t", LockMode::Write, None).expect("a writer does not wait for readers");
        database.unlock_all(3);
        let refused = database.lock_mode(3, "t", LockMode::Exclusive, short).expect_err("readers hold it");
        assert_eq!(refused.sqlstate(), "55P03");
        database.unlock_all(2);
        database.lock_mode(1, "t", LockMode::Exclusive, None).expect("its own share does not block it");
        let refused = database.lock_mode(2, "t", LockMode::Share, short).expect_err("held exclusively");
        assert_eq!(refused.sqlstate(), "55P03");
        database.unlock_all(1);
        database.lock_mode(1, "u", LockMode::Share, None).expect("free");
        database.lock_mode(2, "u", LockMode::Share, None).expect("readers share");
        let waiter = {
            let database = Arc::clone(&database);
            std::thread::spawn(move || database.lock_mode(1, "u", LockMode::Exclusive, None))
        };
        while database.lock_waiters() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let deadlock = database.lock_mode(2, "u", LockMode::Exclusive, None).expect_err("each waits for the other");
        assert_eq!(deadlock.sqlstate(), "40P01");
        database.unlock_all(2);
        waiter.join().expect("no panic").expect("granted once the other reader ended");
        assert!(database.locks.lock().expect("lock").sharers.get("u").is_some_and(|s| s.len() == 1));
    }

    // Goal: while DROP/TRUNCATE waits for a reader, a new reader or writer queues behind it
    // (PostgreSQL's lock queue; passing it let a stream of readers keep DROP waiting for ever),
    // and a transaction that already holds the name does not; method: one Database, a waiting
    // exclusive request on a thread, short timeouts for the queued requests.
    #[test]
    fn new_locks_queue_behind_a_waiting_drop() {
        let database = Arc::new(Database::default());
        let short = Some(Duration::from_millis(20));
        database.lock_mode(1, "q", LockMode::Share, None).expect("free");
        let dropper = {
            let database = Arc::clone(&database);
            std::thread::spawn(move || database.lock_mode(2, "q", LockMode::Exclusive, None))
        };
        while database.lock_waiters() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        for mode in [LockMode::Share, LockMode::Write] {
            let queued = database.lock_mode(3, "q", mode, short).expect_err("behind the waiting DROP");
            assert_eq!(queued.sqlstate(), "55P03", "{mode:?}");
        }
        database.lock_mode(1, "q", LockMode::Share, None).expect("its holder does not queue");
        database.lock_mode(3, "other", LockMode::Share, None).expect("other names are free");
        database.unlock_all(1);
        dropper.join().expect("no panic").expect("granted once the reader ended");
        database.unlock_all(2);
        database.lock_mode(3, "q", LockMode::Share, None).expect("free after the DROP");
    }
}
