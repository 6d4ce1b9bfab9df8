//! What every failed login costs its sender: one warn-level log line (user, database, client
//! address, reason; never a secret), an optional delay before the FATAL (`auth_failure_delay`,
//! as PostgreSQL's auth_delay), and a count per client address that, past a configured bound
//! within a window, refuses that address's next logins before any exchange.
//!
//! The per-address table is the one piece of state strangers can create, so it is bounded
//! ([`ADDRESSES_TRACKED_MAX`]): expired entries go first, then the table is cleared.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use bypass_wire::auth::Refusal;
use bypass_wire::SqlState;

use crate::login::LoginError;

/// Bound on addresses whose failures are counted at once.
pub const ADDRESSES_TRACKED_MAX: usize = 65_536;

/// The guard's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardSettings {
    /// Wait before answering a failed authentication. Zero: answer at once.
    pub failure_delay: Duration,
    /// Failed logins one client address may have within `failure_window` before its further
    /// logins are refused until the window passes. Zero: no limit.
    pub failures_per_address_max: u32,
    pub failure_window: Duration,
}

impl Default for GuardSettings {
    fn default() -> Self {
        GuardSettings {
            failure_delay: Duration::ZERO,
            failures_per_address_max: 0,
            failure_window: Duration::from_secs(60),
        }
    }
}

/// Who failed to log in, for the log line.
#[derive(Debug, Clone, Copy)]
pub struct Attempted<'a> {
    /// `None` for a client on a Unix-domain socket (logged as `unix`, not counted per address).
    pub peer: Option<SocketAddr>,
    pub user: Option<&'a str>,
    pub database: Option<&'a str>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    window_start: Instant,
}

/// Failed-login accounting shared by every connection of one server.
#[derive(Debug, Default)]
pub struct LoginGuard {
    settings: RwLock<GuardSettings>,
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

impl LoginGuard {
    pub fn new(settings: GuardSettings) -> Self {
        LoginGuard { settings: RwLock::new(settings), failures: Mutex::default() }
    }

    /// Applies new settings (a reload); counts already kept stay.
    pub fn set_settings(&self, settings: GuardSettings) {
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = settings;
    }

    pub fn settings(&self) -> GuardSettings {
        *self.settings.read().unwrap_or_else(|p| p.into_inner())
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses an address that failed too often within the window (28000), before any exchange.
    pub fn admit(&self, address: IpAddr, now: Instant) -> Result<(), Refusal> {
        let settings = self.settings();
        if settings.failures_per_address_max == 0 {
            return Ok(());
        }
        match self.table().get(&address) {
            Some(failures)
                if failures.count >= settings.failures_per_address_max
                    && now.duration_since(failures.window_start) < settings.failure_window =>
            {
                Err(Refusal::new(
                    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                    format!("too many failed logins from \"{address}\"; try again later"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication of `address`.
    pub fn record_failure(&self, address: IpAddr, now: Instant) {
        let settings = self.settings();
        if settings.failures_per_address_max == 0 {
            return;
        }
        let mut table = self.table();
        if table.len() >= ADDRESSES_TRACKED_MAX && !table.contains_key(&address) {
            table.retain(|_, failures| now.duration_since(failures.window_start) < settings.failure_window);
            if table.len() >= ADDRESSES_TRACKED_MAX {
                table.clear();
            }
        }
        let failures = table.entry(address).or_insert(Failures { count: 0, window_start: now });
        if now.duration_since(failures.window_start) >= settings.failure_window {
            *failures = Failures { count: 0, window_start: now };
        }
        failures.count = failures.count.saturating_add(1);
    }

    /// Addresses currently counted (for tests and metrics).
    pub fn tracked_addresses(&self) -> usize {
        self.table().len()
    }

    /// Does what every failed login gets before its FATAL is written: the log line, and for an
    /// authentication failure (class 28) the count and the delay. `Io` failures (the client left)
    /// are logged at debug level only: there was no login to fail.
    pub async fn on_failure(&self, attempted: Attempted<'_>, error: &LoginError) {
        let Attempted { peer, user, database } = attempted;
        let client = peer.map_or_else(|| "unix".to_owned(), |peer| peer.to_string());
        let (code, reason) = match error {
            LoginError::Io(error) => {
                return tracing::debug!(client = %client, user, database, %error, "client left during login");
            }
            LoginError::Refused(refusal) => (refusal.code.code(), refusal.message.as_str()),
        };
        tracing::warn!(client = %client, user, database, sqlstate = code, reason, "login failed");
        let authentication = matches!(error, LoginError::Refused(refusal) if refusal.is_authentication_failure());
        if authentication {
            if let Some(peer) = peer {
                self.record_failure(peer.ip(), Instant::now());
            }
            let delay = self.settings().failure_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_past_its_bound_until_the_window_passes() {
        // Goal: the per-address bound refuses and forgives. Method: record failures at chosen
        // instants.
        let guard = LoginGuard::new(GuardSettings {
            failures_per_address_max: 2,
            failure_window: Duration::from_secs(10),
            ..GuardSettings::default()
        });
        let (address, other): (IpAddr, IpAddr) = ("10.0.0.1".parse().expect("ip"), "10.0.0.2".parse().expect("ip"));
        let start = Instant::now();
        guard.record_failure(address, start);
        assert!(guard.admit(address, start).is_ok());
        guard.record_failure(address, start);
        let refusal = guard.admit(address, start).expect_err("over the bound");
        assert_eq!(refusal.code, SqlState::INVALID_AUTHORIZATION_SPECIFICATION);
        assert!(guard.admit(other, start).is_ok(), "other addresses are not affected");
        assert!(guard.admit(address, start + Duration::from_secs(11)).is_ok(), "the window passed");
    }

    #[test]
    fn the_table_stays_bounded_and_is_off_by_default() {
        let off = LoginGuard::default();
        off.record_failure("10.0.0.1".parse().expect("ip"), Instant::now());
        assert_eq!(off.tracked_addresses(), 0);
        let guard = LoginGuard::new(GuardSettings { failures_per_address_max: 1, ..GuardSettings::default() });
        let now = Instant::now();
        for index in 0..(ADDRESSES_TRACKED_MAX as u32 + 10) {
            guard.record_failure(IpAddr::from(index.to_be_bytes()), now);
        }
        assert!(guard.tracked_addresses() <= ADDRESSES_TRACKED_MAX);
    }
}
