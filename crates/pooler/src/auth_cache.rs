//! Secrets recently found with `auth_query` ([`crate::auth_query`]), and the limiter on lookups
//! running at once; one per process, in [`crate::shared::Shared`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::auth_file::Secret;

/// How long a looked-up secret is reused before it is asked for again.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(5);
/// Bound on cached secrets; when full, expired entries are dropped, then the cache is cleared.
pub const AUTH_CACHE_MAX: usize = 1_000;
/// Lookups running at once. Their connections count in no pool, so a flood of logins for
/// unknown users must not become a flood of backend connections.
pub const AUTH_QUERY_CONCURRENCY_MAX: usize = 4;

/// Recently found secrets by (backend address and database, user), and the lookup limiter.
pub struct AuthCache {
    pub(crate) entries: Mutex<HashMap<(String, String), (Secret, Instant)>>,
    pub lookups: tokio::sync::Semaphore,
}

impl Default for AuthCache {
    fn default() -> Self {
        AuthCache { entries: Mutex::default(), lookups: tokio::sync::Semaphore::new(AUTH_QUERY_CONCURRENCY_MAX) }
    }
}

impl AuthCache {
    pub fn get(&self, scope: &str, user: &str, now: Instant) -> Option<Secret> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (secret, found_at) = entries.get(&(scope.to_owned(), user.to_owned()))?;
        (now.duration_since(*found_at) < AUTH_CACHE_TTL).then(|| secret.clone())
    }

    pub fn insert(&self, scope: &str, user: &str, secret: Secret, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= AUTH_CACHE_MAX {
            entries.retain(|_, (_, found_at)| now.duration_since(*found_at) < AUTH_CACHE_TTL);
        }
        if entries.len() >= AUTH_CACHE_MAX {
            entries.clear();
        }
        entries.insert((scope.to_owned(), user.to_owned()), (secret, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_entries_expire_and_the_map_stays_bounded() {
        // Goal: found secrets are reused only for AUTH_CACHE_TTL and the map never exceeds
        // AUTH_CACHE_MAX. Method: insert and read back at chosen instants.
        let cache = AuthCache::default();
        let start = Instant::now();
        cache.insert("db", "carol", Secret::Md5(format!("md5{}", "0".repeat(32))), start);
        assert!(cache.get("db", "carol", start + AUTH_CACHE_TTL / 2).is_some());
        assert!(cache.get("db", "carol", start + AUTH_CACHE_TTL).is_none(), "expired");
        assert!(cache.get("other", "carol", start).is_none(), "scoped by backend database");
        for index in 0..=AUTH_CACHE_MAX {
            cache.insert("db", &format!("user{index}"), Secret::Md5(String::new()), start);
        }
        let size = cache.entries.lock().expect("not poisoned").len();
        assert!(size <= AUTH_CACHE_MAX, "{size} entries");
    }
}
