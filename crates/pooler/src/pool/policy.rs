//! A pool's state and the pure decisions on it: which idle server a client takes, which waiter a
//! released server goes to (see the [`super`] documentation for the rules), whether a server is
//! retired. No I/O, no clock: `now` is an argument, so the rules are tested on their own.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::waiters::Waiter;
use super::{PoolLimits, LOCAL_SLACK};
use crate::server::ServerConn;

/// Idle servers inspected for one of the caller's shard.
const IDLE_SCAN_MAX: usize = 16;

/// A client in the queue and when it joined.
pub(super) struct Queued {
    pub(super) waiter: Arc<Waiter>,
    pub(super) since: Instant,
}

pub(super) struct PoolState {
    // Boxed: servers leave the pool as the box the session holds, so moving one is a pointer copy.
    #[allow(clippy::vec_box)]
    pub(super) idle: Vec<Box<ServerConn>>,
    /// One FIFO of waiting clients per shard; the oldest waiter overall is the oldest front.
    pub(super) waiters: Box<[VecDeque<Queued>]>,
    /// Logged-in servers per home shard (what their leases are counted on).
    pub(super) homed: Box<[u32]>,
    pub(super) open: u32,
    pub(super) limits: PoolLimits,
    /// PAUSE: no server is handed out; clients queue.
    pub(super) paused: bool,
    /// RECONNECT: servers opened before this instant are closed instead of reused.
    pub(super) retire_before: Option<Instant>,
    /// Servers opened before `retire_before` still open.
    pub(super) retiring: u32,
}

impl PoolState {
    pub(super) fn new(shards: usize, limits: PoolLimits) -> Self {
        PoolState {
            idle: Vec::new(),
            waiters: (0..shards.max(1)).map(|_| VecDeque::new()).collect(),
            homed: vec![0; shards.max(1)].into_boxed_slice(),
            open: 0,
            limits,
            paused: false,
            retire_before: None,
            retiring: 0,
        }
    }

    /// Whether a released server should be closed instead of reused.
    pub(super) fn retired(&self, server: &ServerConn, now: Instant) -> bool {
        self.retire_reason(server, now).is_some()
    }

    /// Why a server should be closed instead of reused, if it should.
    pub(super) fn retire_reason(&self, server: &ServerConn, now: Instant) -> Option<&'static str> {
        let lifetime = self.limits.server_lifetime_ms;
        if self.retire_before.is_some_and(|before| server.created_at < before) {
            Some("RECONNECT")
        } else if lifetime > 0 && server.age_ms(now) >= lifetime {
            Some("server_lifetime")
        } else if self.open > self.limits.size + self.reserve_in_use() {
            Some("pool over its size")
        } else {
            None
        }
    }

    /// Why the idle server should be closed by maintenance, if it should: retired, its pool
    /// replaced, or idle past `server_idle_timeout_ms` while the pool holds more than
    /// `min_size` (`closing` servers are already on their way out).
    pub(super) fn idle_close_reason(
        &self,
        server: &ServerConn,
        now: Instant,
        replaced: bool,
        closing: u32,
    ) -> Option<&'static str> {
        let limits = &self.limits;
        let idle_expired = limits.server_idle_timeout_ms > 0 && server.idle_ms(now) >= limits.server_idle_timeout_ms;
        let keep_for_min = self.open - closing <= limits.min_size;
        match self.retire_reason(server, now) {
            Some(reason) => Some(reason),
            None if replaced => Some("pool replaced by a reload"),
            None if idle_expired && !keep_for_min => Some("server_idle_timeout"),
            None => None,
        }
    }

    /// Servers beyond the size the reserve pool may keep: while clients wait.
    fn reserve_in_use(&self) -> u32 {
        if self.waiting() > 0 {
            self.limits.reserve_size
        } else {
            0
        }
    }

    /// How long the oldest waiter has waited at `now`.
    pub(super) fn oldest_wait(&self, now: Instant) -> Option<std::time::Duration> {
        let shard = self.oldest_shard()?;
        self.waiters[shard].front().map(|queued| now.saturating_duration_since(queued.since))
    }

    /// An idle server, preferring the most recently used one of `shard`.
    pub(super) fn take_idle(&mut self, shard: usize) -> Option<Box<ServerConn>> {
        let scan_from = self.idle.len().saturating_sub(IDLE_SCAN_MAX);
        let local = self.idle[scan_from..].iter().rposition(|server| server.home == shard);
        match local {
            Some(offset) => Some(self.idle.remove(scan_from + offset)),
            None => self.idle.pop(),
        }
    }

    pub(super) fn waiting(&self) -> usize {
        self.waiters.iter().map(VecDeque::len).sum()
    }

    /// The shard whose front waiter joined first.
    pub(super) fn oldest_shard(&self) -> Option<usize> {
        let fronts = self.waiters.iter().enumerate().filter_map(|(shard, queue)| Some((queue.front()?.since, shard)));
        fronts.min().map(|(_, shard)| shard)
    }

    /// The oldest waiter overall, and its shard.
    pub(super) fn pop_oldest(&mut self) -> Option<(usize, Queued)> {
        let shard = self.oldest_shard()?;
        Some((shard, self.waiters[shard].pop_front()?))
    }

    /// The waiter a server of `home` released at `now` goes to, and that waiter's shard; `None`
    /// leaves it idle on `home`. `clients` counts the pool's clients on a shard. See the module
    /// documentation for the rules.
    pub(super) fn next_waiter(
        &mut self,
        home: usize,
        now: Instant,
        clients: impl Fn(usize) -> u32,
    ) -> Option<(usize, Queued)> {
        let oldest = self.oldest_shard()?;
        let oldest_since = self.waiters[oldest].front().map(|queued| queued.since)?;
        let shard = match self.waiters[home].front() {
            _ if oldest == home => home,
            _ if self.richer(home, oldest, &clients) => oldest,
            Some(local) if local.since.duration_since(oldest_since) <= LOCAL_SLACK => home,
            Some(_) => oldest,
            None if self.homed[oldest] == 0 || now.saturating_duration_since(oldest_since) > LOCAL_SLACK => oldest,
            None => return None,
        };
        Some((shard, self.waiters[shard].pop_front()?))
    }

    /// True when `shard` has more servers per client than `other` would have with one more:
    /// moving one server then evens out the clients' share without swinging back.
    pub(super) fn richer(&self, shard: usize, other: usize, clients: impl Fn(usize) -> u32) -> bool {
        let servers = |shard: usize| u64::from(self.homed[shard]);
        servers(shard) * u64::from(clients(other)) > (servers(other) + 1) * u64::from(clients(shard))
    }

    /// Counts a logged-in server on `shard` from now on (it is about to move there, or just
    /// logged in there).
    pub(super) fn count_home(&mut self, server: &mut ServerConn, shard: usize) {
        if let Some(home) = server.lease.count_on(shard) {
            self.homed[home] -= 1;
        }
        self.homed[shard] += 1;
    }

    pub(super) fn remove(&mut self, waiter: &Arc<Waiter>) {
        for queue in self.waiters.iter_mut() {
            queue.retain(|queued| !Arc::ptr_eq(&queued.waiter, waiter));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LIMITS: PoolLimits = PoolLimits {
        size: 20,
        min_size: 0,
        query_wait_timeout_ms: 0,
        server_idle_timeout_ms: 0,
        server_lifetime_ms: 0,
        server_connect_timeout_ms: 0,
        log_disconnections: false,
        reserve_size: 0,
        reserve_timeout_ms: 0,
    };

    /// Two shards; `joined` lists (shard, milliseconds after the first arrival) in arrival order.
    /// Returns the state and the time of the first arrival.
    fn queues(joined: &[(usize, u64)], homed: [u32; 2]) -> (PoolState, Vec<Arc<Waiter>>, Instant) {
        let mut state = PoolState::new(2, LIMITS);
        state.homed = Box::new(homed);
        let start = Instant::now();
        let waiters: Vec<_> = joined.iter().map(|_| Waiter::new()).collect();
        for ((shard, after_ms), waiter) in joined.iter().zip(&waiters) {
            let since = start + Duration::from_millis(*after_ms);
            state.waiters[*shard].push_back(Queued { waiter: waiter.clone(), since });
        }
        (state, waiters, start)
    }

    /// Where a server released on `home` `after_ms` after the first arrival goes, with
    /// `clients` per shard; `None` when it stays idle.
    fn served_with(state: &mut PoolState, home: usize, after_ms: u64, clients: [u32; 2]) -> Option<usize> {
        let now = state.oldest_shard().and_then(|shard| state.waiters[shard].front()).map(|queued| queued.since)?;
        let next = state.next_waiter(home, now + Duration::from_millis(after_ms), |shard| clients[shard]);
        next.map(|(shard, _)| shard)
    }

    fn served(state: &mut PoolState, home: usize) -> Option<usize> {
        served_with(state, home, 2, [25, 25])
    }

    #[test]
    fn a_released_server_stays_with_a_local_waiter_that_came_within_the_slack() {
        let (mut state, waiters, _) = queues(&[(1, 0), (0, 10)], [10, 10]);
        assert_eq!(served(&mut state, 0), Some(0));
        assert_eq!(state.waiters[0].len(), 0, "the local waiter, 10 ms behind the head, got it");
        assert!(Arc::ptr_eq(&state.waiters[1][0].waiter, &waiters[0]));
    }

    #[test]
    fn the_oldest_waiter_wins_over_a_local_one_that_came_more_than_the_slack_later() {
        let (mut state, _, _) = queues(&[(1, 0), (0, 60)], [10, 10]);
        assert_eq!(served(&mut state, 0), Some(1));
    }

    #[test]
    fn with_equal_clients_a_shard_with_two_servers_more_gives_one_away() {
        let (mut state, _, _) = queues(&[(1, 0), (0, 1)], [11, 9]);
        assert_eq!(served(&mut state, 0), Some(1), "11 against 9: the server moves");
        let (mut state, _, _) = queues(&[(1, 0), (0, 1)], [10, 9]);
        assert_eq!(served(&mut state, 0), Some(0), "10 against 9: it stays");
    }

    #[test]
    fn servers_follow_the_clients_share_of_each_shard() {
        // 28 and 22 clients on 20 servers: 11.2 and 8.8 is the fair split.
        let (mut state, _, _) = queues(&[(0, 0), (1, 1)], [10, 10]);
        assert_eq!(served_with(&mut state, 1, 2, [28, 22]), Some(0), "10 for 22 clients is more than a share");
        let (mut state, _, _) = queues(&[(0, 0), (1, 1)], [11, 9]);
        assert_eq!(served_with(&mut state, 1, 2, [28, 22]), Some(1), "9 for 22 stays");
        let (mut state, _, _) = queues(&[(1, 0), (0, 1)], [11, 9]);
        assert_eq!(served_with(&mut state, 0, 2, [28, 22]), Some(0), "11 for 28 stays");
    }

    #[test]
    fn with_no_local_waiter_a_server_stays_idle_unless_the_other_shard_needs_it() {
        let (mut state, _, _) = queues(&[(1, 0)], [10, 10]);
        assert_eq!(served(&mut state, 0), None, "the other shard has its share and waited 2 ms");
        assert_eq!(served_with(&mut state, 0, 60, [25, 25]), Some(1), "it waited past the slack");
        let (mut state, _, _) = queues(&[(1, 0)], [1, 0]);
        assert_eq!(served(&mut state, 0), Some(1), "the other shard has no server");
        assert_eq!(served(&mut state, 0), None, "nobody left");
    }
}
