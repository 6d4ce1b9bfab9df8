//! The console's `SHOW` tables, with PgBouncer's column sets (1.25) so its tooling, and
//! prometheus-community's pgbouncer_exporter, read them unchanged. Values are text; a column
//! Bypass has nothing for is NULL, never a made-up number.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::cancel::CancelEntry;
use crate::config::{Applies, PoolMode, PoolerSettings};
use crate::pool::Pool;
use crate::shared::Shared;
use crate::stats::PoolTotals;

/// A result set: column names and rows of text values (`None` is NULL).
pub struct Table {
    pub columns: &'static [&'static str],
    pub rows: Vec<Vec<Option<String>>>,
}

impl Table {
    pub fn new(columns: &'static [&'static str], rows: Vec<Vec<String>>) -> Table {
        let rows = rows.into_iter().map(|row| row.into_iter().map(Some).collect()).collect();
        Table { columns, rows }
    }
}

/// The `SHOW` items, for `SHOW HELP` and the error on an unknown one.
pub const ITEMS: [&str; 20] = [
    "HELP",
    "POOLS",
    "CLIENTS",
    "SERVERS",
    "STATS",
    "STATS_TOTALS",
    "STATS_AVERAGES",
    "TOTALS",
    "DATABASES",
    "USERS",
    "LISTS",
    "CONFIG",
    "MEM",
    "SOCKETS",
    "ACTIVE_SOCKETS",
    "FDS",
    "VERSION",
    "STATE",
    "DNS_HOSTS",
    "DNS_ZONES",
];

pub fn version() -> String {
    format!("Bypass {}", env!("CARGO_PKG_VERSION"))
}

pub fn mode_name(mode: PoolMode) -> String {
    match mode {
        PoolMode::Session => "session".into(),
        PoolMode::Transaction => "transaction".into(),
    }
}

/// PgBouncer's timestamp text, `2024-01-31 12:00:00 UTC`.
fn timestamp(at: SystemTime) -> String {
    let seconds = at.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = bypass_wire::civil::civil_from_days(days as i64);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

pub fn sorted_pools(shared: &Shared) -> Vec<Arc<Pool>> {
    let mut pools = shared.pools();
    pools.sort_by(|a, b| (&a.key.database, &a.key.user).cmp(&(&b.key.database, &b.key.user)));
    pools
}

pub fn pools(shared: &Shared) -> Table {
    let now = Instant::now();
    let rows = sorted_pools(shared)
        .iter()
        .map(|pool| {
            let (open, idle, waiting) = pool.counts();
            let logging_in = pool.logging_in();
            let clients = pool.stats.clients.load(Ordering::Relaxed);
            let wait = pool.longest_wait(now);
            vec![
                pool.key.database.clone(),
                pool.key.user.clone(),
                clients.saturating_sub(waiting).to_string(),
                waiting.to_string(),
                "0".into(),
                "0".into(),
                open.saturating_sub(idle + logging_in).to_string(),
                "0".into(),
                "0".into(),
                idle.to_string(),
                "0".into(),
                "0".into(),
                logging_in.to_string(),
                wait.as_secs().to_string(),
                wait.subsec_micros().to_string(),
                mode_name(pool.settings.mode),
                if pool.is_paused() { "yes".into() } else { "no".into() },
            ]
        })
        .collect();
    let columns = &[
        "database",
        "user",
        "cl_active",
        "cl_waiting",
        "cl_active_cancel_req",
        "cl_waiting_cancel_req",
        "sv_active",
        "sv_active_cancel",
        "sv_being_canceled",
        "sv_idle",
        "sv_used",
        "sv_tested",
        "sv_login",
        "maxwait",
        "maxwait_us",
        "pool_mode",
        "paused",
    ];
    Table::new(columns, rows)
}

/// Columns of CLIENTS and SERVERS (PgBouncer's, in its order).
const CONNECTION_COLUMNS: [&str; 18] = [
    "type",
    "user",
    "database",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
];

/// Buffer columns SOCKETS adds (PgBouncer's socket buffer positions; NULL here: the relay's
/// buffers are per task and not shared).
const BUFFER_COLUMNS: [&str; 7] =
    ["recv_pos", "pkt_pos", "pkt_remain", "send_pos", "send_remain", "pkt_avail", "send_avail"];

/// Columns of SOCKETS and ACTIVE_SOCKETS: a connection's columns, then its buffers'.
const SOCKET_COLUMNS: [&str; 25] = {
    let mut columns = [""; 25];
    let mut i = 0;
    while i < columns.len() {
        columns[i] = if i < CONNECTION_COLUMNS.len() {
            CONNECTION_COLUMNS[i]
        } else {
            BUFFER_COLUMNS[i - CONNECTION_COLUMNS.len()]
        };
        i += 1;
    }
    columns
};

/// One client as a CLIENTS row.
fn client_row(entry: &CancelEntry) -> Vec<String> {
    let info = &entry.info;
    let state = if entry.is_waiting() { "waiting" } else { "active" };
    let address = |at: Option<std::net::SocketAddr>| {
        (
            at.map(|a| a.ip().to_string()).unwrap_or_else(|| "unix".into()),
            at.map(|a| a.port().to_string()).unwrap_or_default(),
        )
    };
    let (addr, port) = address(info.peer);
    let (local_addr, local_port) = address(info.local);
    let link = entry.route().map(|route| route.key.process_id.to_string()).unwrap_or_default();
    vec![
        "C".into(),
        info.user.clone(),
        info.database.clone(),
        state.into(),
        addr,
        port,
        local_addr,
        local_port,
        timestamp(info.connected_at),
        timestamp(info.connected_at),
        "0".into(),
        "0".into(),
        "0".into(),
        entry.process_id.to_string(),
        link,
        "0".into(),
        if info.tls { "TLS".into() } else { String::new() },
        info.application_name.clone(),
    ]
}

fn clients_sorted(shared: &Shared) -> Vec<Arc<CancelEntry>> {
    let mut entries = shared.cancel.entries();
    entries.sort_by_key(|entry| entry.info.connected_at);
    entries
}

pub fn clients(shared: &Shared) -> Table {
    Table::new(&CONNECTION_COLUMNS, clients_sorted(shared).iter().map(|entry| client_row(entry)).collect())
}

/// Every server: those linked to a client (from the client's cancel route) and the idle ones.
fn server_rows(shared: &Shared) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for entry in shared.cancel.entries() {
        if let Some(route) = entry.route() {
            let info = &entry.info;
            let row = ServerRow { user: &info.user, database: &info.database, state: "active", address: route.address };
            rows.push(row.render(route.key.process_id, Some(entry.process_id), false, info.connected_at));
        }
    }
    for pool in sorted_pools(shared) {
        let row = ServerRow {
            user: &pool.key.user,
            database: &pool.key.database,
            state: "idle",
            address: pool.target.address,
        };
        for idle in pool.idle_servers() {
            rows.push(row.render(idle.process_id, None, idle.close_needed, idle.opened_at));
        }
    }
    rows
}

struct ServerRow<'a> {
    user: &'a str,
    database: &'a str,
    state: &'a str,
    address: std::net::SocketAddr,
}

impl ServerRow<'_> {
    fn render(&self, pid: i32, link: Option<i32>, close_needed: bool, since: SystemTime) -> Vec<String> {
        vec![
            "S".into(),
            self.user.into(),
            self.database.into(),
            self.state.into(),
            self.address.ip().to_string(),
            self.address.port().to_string(),
            String::new(),
            String::new(),
            timestamp(since),
            timestamp(since),
            "0".into(),
            "0".into(),
            u8::from(close_needed).to_string(),
            pid.to_string(),
            link.map(|link| link.to_string()).unwrap_or_default(),
            pid.to_string(),
            String::new(),
            String::new(),
        ]
    }
}

pub fn servers(shared: &Shared) -> Table {
    Table::new(&CONNECTION_COLUMNS, server_rows(shared))
}

/// SOCKETS (every client and server) or ACTIVE_SOCKETS (those linked to a peer).
pub fn sockets(shared: &Shared, active_only: bool) -> Table {
    let mut rows: Vec<Vec<Option<String>>> = Vec::new();
    let mut push = |mut row: Vec<String>| {
        row[3] = format!("{}_{}", if row[0] == "C" { "cl" } else { "sv" }, row[3]);
        let mut cells: Vec<Option<String>> = row.into_iter().map(Some).collect();
        cells.extend(std::iter::repeat_n(None, BUFFER_COLUMNS.len()));
        rows.push(cells);
    };
    for entry in clients_sorted(shared) {
        if !active_only || entry.route().is_some() {
            push(client_row(&entry));
        }
    }
    for row in server_rows(shared) {
        if !active_only || row[3] == "active" {
            push(row);
        }
    }
    Table { columns: &SOCKET_COLUMNS, rows }
}

/// Totals per client-visible database.
pub fn totals_by_database(shared: &Shared) -> BTreeMap<String, PoolTotals> {
    let mut by_database: BTreeMap<String, PoolTotals> = BTreeMap::new();
    for pool in shared.pools() {
        by_database.entry(pool.key.database.clone()).or_default().add(&pool.totals());
    }
    by_database
}

/// The counters of STATS_TOTALS and STATS_AVERAGES, in PgBouncer's column order (without
/// `database`): server assignments, transactions, queries, bytes in, bytes out, transaction
/// time, query time, wait time (µs), client Parse messages, server Parse messages, Binds.
fn counters(totals: &PoolTotals) -> [u64; 11] {
    [
        totals.assignments,
        totals.transactions,
        totals.queries,
        totals.bytes_received,
        totals.bytes_sent,
        totals.transaction_time.sum_us,
        totals.query_time_us,
        totals.wait.sum_us,
        totals.client_parses,
        totals.server_parses,
        totals.binds,
    ]
}

const COUNTER_NAMES: [&str; 11] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
];

/// PgBouncer's averages over the last `stats_period` from two totals `seconds` apart: counts
/// and bytes per second, times per transaction, query and wait.
pub fn averages(new: &PoolTotals, old: &PoolTotals, seconds: f64) -> [u64; 11] {
    let (new_values, old_values) = (counters(new), counters(old));
    let delta = |index: usize| new_values[index].saturating_sub(old_values[index]);
    let rate = |index: usize| if seconds > 0.0 { (delta(index) as f64 / seconds).round() as u64 } else { 0 };
    let per = |sum: usize, count: u64| delta(sum).checked_div(count).unwrap_or(0);
    let waits = new.wait.count.saturating_sub(old.wait.count);
    [
        rate(0),
        rate(1),
        rate(2),
        rate(3),
        rate(4),
        per(5, delta(1)),
        per(6, delta(2)),
        per(7, waits),
        rate(8),
        rate(9),
        rate(10),
    ]
}

/// PgBouncer's columns, then where the kernel fast path moved the bytes: `kernel_*` were
/// forwarded socket to socket inside the kernel, `passed_*` were handed up to user space (which
/// read and relayed them); request bytes and messages run client to server, answer bytes and
/// messages server to client; `*_requests` count Query, Sync and FunctionCall messages (each
/// asks for a ReadyForQuery), `*_answers` the ReadyForQuery messages. Pools that do not run in
/// the kernel show zeros there.
pub fn stats(shared: &Shared) -> Table {
    let averages = shared.averages();
    let rows = totals_by_database(shared)
        .into_iter()
        .map(|(database, totals)| {
            let average = averages.get(&database).copied().unwrap_or_default();
            let mut row = vec![database];
            row.extend(counters(&totals).iter().map(u64::to_string));
            row.extend(average.iter().map(u64::to_string));
            row.extend(kernel_counters(&totals.kernel.unwrap_or_default()).map(|value| value.to_string()));
            row
        })
        .collect();
    let columns = &[
        "database",
        "total_server_assignment_count",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_query_time",
        "total_wait_time",
        "total_client_parse_count",
        "total_server_parse_count",
        "total_bind_count",
        "avg_server_assignment_count",
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
        "avg_xact_time",
        "avg_query_time",
        "avg_wait_time",
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
        "kernel_request_bytes",
        "kernel_request_msgs",
        "kernel_requests",
        "passed_request_bytes",
        "passed_request_msgs",
        "passed_requests",
        "kernel_answer_bytes",
        "kernel_answer_msgs",
        "kernel_answers",
        "passed_answer_bytes",
        "passed_answer_msgs",
        "passed_answers",
    ];
    Table::new(columns, rows)
}

/// The kernel columns of STATS, in their order.
fn kernel_counters(k: &bypass_fastpath::PoolCounters) -> [u64; 12] {
    [
        k.request_bytes_forwarded,
        k.request_messages_forwarded,
        k.requests_forwarded,
        k.request_bytes_passed,
        k.request_messages_passed,
        k.requests_passed,
        k.answer_bytes_forwarded,
        k.answer_messages_forwarded,
        k.answers_forwarded,
        k.answer_bytes_passed,
        k.answer_messages_passed,
        k.answers_passed,
    ]
}

const STATS_COLUMNS: [&str; 12] = [
    "database",
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
];

pub fn stats_totals(shared: &Shared) -> Table {
    let rows = totals_by_database(shared)
        .into_iter()
        .map(|(database, totals)| {
            std::iter::once(database).chain(counters(&totals).iter().map(u64::to_string)).collect()
        })
        .collect();
    Table::new(&STATS_COLUMNS, rows)
}

pub fn stats_averages(shared: &Shared) -> Table {
    let averages = shared.averages();
    let rows = totals_by_database(shared)
        .into_keys()
        .map(|database| {
            let average = averages.get(&database).copied().unwrap_or_default();
            std::iter::once(database).chain(average.iter().map(u64::to_string)).collect()
        })
        .collect();
    Table::new(&STATS_COLUMNS, rows)
}

/// TOTALS: STATS summed over every database, as (name, value) rows.
pub fn totals(shared: &Shared) -> Table {
    let mut sum = PoolTotals::default();
    totals_by_database(shared).values().for_each(|totals| sum.add(totals));
    let mut average_sum = [0u64; 11];
    for average in shared.averages().values() {
        for (slot, value) in average_sum.iter_mut().zip(average) {
            *slot += value;
        }
    }
    let mut rows = Vec::new();
    for (name, value) in COUNTER_NAMES.iter().zip(counters(&sum)) {
        rows.push(vec![format!("total_{}", total_name(name)), value.to_string()]);
    }
    for (name, value) in COUNTER_NAMES.iter().zip(average_sum) {
        rows.push(vec![format!("avg_{}", average_name(name)), value.to_string()]);
    }
    Table::new(&["name", "value"], rows)
}

/// STATS's names for the byte columns (`total_received`), STATS_TOTALS's for the rest.
fn total_name(name: &str) -> &str {
    match name {
        "bytes_received" => "received",
        "bytes_sent" => "sent",
        other => other,
    }
}

fn average_name(name: &str) -> &str {
    match name {
        "bytes_received" => "recv",
        "bytes_sent" => "sent",
        other => other,
    }
}

/// DATABASES: each `[databases]` entry, and each database reached through `*` (as PgBouncer
/// lists its automatically created databases, and not `*` itself).
pub fn databases(shared: &Shared) -> Table {
    let live = shared.live();
    let pools = shared.pools();
    let mut entries: BTreeMap<String, &crate::config::DatabaseEntry> = live
        .databases
        .iter()
        .filter(|(name, _)| name.as_str() != "*")
        .map(|(name, entry)| (name.clone(), entry))
        .collect();
    if let Some(wildcard) = live.databases.get("*") {
        for pool in &pools {
            entries.entry(pool.key.database.clone()).or_insert(wildcard);
        }
    }
    let rows = entries
        .iter()
        .map(|(name, entry)| {
            let ours: Vec<&Arc<Pool>> = pools.iter().filter(|pool| &pool.key.database == name).collect();
            let current: u32 = ours.iter().map(|pool| pool.counts().0).sum();
            let clients: u32 = ours.iter().map(|pool| pool.stats.clients.load(Ordering::Relaxed)).sum();
            let paused = !ours.is_empty() && ours.iter().all(|pool| pool.is_paused());
            let settings = &live.settings;
            vec![
                name.clone(),
                entry.host.clone(),
                entry.port.to_string(),
                entry.dbname.clone().unwrap_or_else(|| name.clone()),
                entry.user.clone().unwrap_or_default(),
                entry.pool_size.unwrap_or(settings.default_pool_size).to_string(),
                entry.min_pool_size.unwrap_or(settings.min_pool_size).to_string(),
                entry.reserve_pool_size.unwrap_or(settings.reserve_pool_size).to_string(),
                (settings.server_lifetime_ms / 1000).to_string(),
                mode_name(entry.pool_mode.unwrap_or(settings.pool_mode)),
                entry.max_db_connections.unwrap_or(settings.max_db_connections).to_string(),
                current.to_string(),
                "0".into(),
                clients.to_string(),
                u8::from(paused).to_string(),
                u8::from(shared.is_disabled(name)).to_string(),
            ]
        })
        .collect();
    let columns = &[
        "name",
        "host",
        "port",
        "database",
        "force_user",
        "pool_size",
        "min_pool_size",
        "reserve_pool_size",
        "server_lifetime",
        "pool_mode",
        "max_connections",
        "current_connections",
        "max_client_connections",
        "current_client_connections",
        "paused",
        "disabled",
    ];
    Table::new(columns, rows)
}

/// Users known from the auth file, the `[users]` table and the pools, with their limits.
pub fn users(shared: &Shared) -> Table {
    let live = shared.live();
    let pools = shared.pools();
    let mut names: std::collections::BTreeSet<String> = live.auth.users().map(str::to_owned).collect();
    names.extend(live.users.keys().cloned());
    names.extend(pools.iter().map(|pool| pool.key.user.clone()));
    let rows = names
        .into_iter()
        .map(|name| {
            let entry = live.users.get(&name);
            let current: u32 = pools.iter().filter(|pool| pool.key.user == name).map(|pool| pool.counts().0).sum();
            let pool_size = entry.and_then(|entry| entry.pool_size).map(|size| size.to_string()).unwrap_or_default();
            let mode = entry.and_then(|entry| entry.pool_mode).map(mode_name).unwrap_or_default();
            let max = entry.and_then(|entry| entry.max_user_connections).unwrap_or(live.settings.max_user_connections);
            vec![name, pool_size, mode, max.to_string(), current.to_string()]
        })
        .collect();
    Table::new(&["name", "pool_size", "pool_mode", "max_user_connections", "current_connections"], rows)
}

/// LISTS: counts of PgBouncer's internal lists, as far as Bypass has them (it keeps no free
/// lists and no DNS cache: those are 0).
pub fn lists(shared: &Shared) -> Table {
    let live = shared.live();
    let pools = shared.pools();
    let registered = shared.cancel.entries().len() as u64;
    let connected = u64::from(shared.client_connections.load(Ordering::Relaxed));
    let servers: u64 = pools.iter().map(|pool| u64::from(pool.counts().0)).sum();
    let users: std::collections::BTreeSet<&str> =
        live.auth.users().chain(live.users.keys().map(String::as_str)).collect();
    let items: [(&str, u64); 12] = [
        ("databases", live.databases.len() as u64),
        ("users", users.len() as u64),
        ("pools", pools.len() as u64),
        ("free_clients", 0),
        ("used_clients", connected),
        ("login_clients", connected.saturating_sub(registered)),
        ("free_servers", 0),
        ("used_servers", servers),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ];
    Table::new(&["list", "items"], items.iter().map(|(name, count)| vec![(*name).into(), count.to_string()]).collect())
}

/// MEM: what each kind of object holds (its struct plus its fixed buffers), how many are in
/// use, and their total. Bypass allocates per object, so nothing is free.
pub fn mem(shared: &Shared) -> Table {
    let pools = shared.pools();
    let clients = u64::from(shared.client_connections.load(Ordering::Relaxed));
    let servers: u64 = pools.iter().map(|pool| u64::from(pool.counts().0)).sum();
    let client_size = (std::mem::size_of::<crate::client::ClientSide>() + crate::buffer::CLIENT_BUFFER_BYTES) as u64;
    let server_size = (std::mem::size_of::<crate::server::ServerConn>() + crate::server::SERVER_BUFFER_BYTES) as u64;
    let pool_size = std::mem::size_of::<Pool>() as u64;
    let items =
        [("client", client_size, clients), ("server", server_size, servers), ("pool", pool_size, pools.len() as u64)];
    let rows = items
        .iter()
        .map(|(name, size, used)| {
            vec![(*name).into(), size.to_string(), used.to_string(), "0".into(), (size * used).to_string()]
        })
        .collect();
    Table::new(&["name", "size", "used", "free", "memtotal"], rows)
}

/// Settings as key, value, default, changeable (by RELOAD); lists as PgBouncer writes them.
pub fn config(settings: &PoolerSettings) -> Table {
    let current = toml::Value::try_from(settings).unwrap_or(toml::Value::Table(Default::default()));
    let defaults = toml::Value::try_from(PoolerSettings::default()).unwrap_or(toml::Value::Table(Default::default()));
    let empty = toml::map::Map::new();
    let rows = current
        .as_table()
        .unwrap_or(&empty)
        .iter()
        .map(|(key, value)| {
            let default = defaults.get(key).map(toml_text).unwrap_or_default();
            let restart = PoolerSettings::setting(key).is_some_and(|setting| setting.applies == Applies::Restart);
            let changeable = if restart { "no" } else { "yes" };
            vec![key.clone(), toml_text(value), default, changeable.into()]
        })
        .collect();
    Table::new(&["key", "value", "default", "changeable"], rows)
}

fn toml_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Array(items) => items.iter().map(toml_text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// STATE: whether the pooler accepts clients and serves them.
pub fn state(shared: &Shared) -> Table {
    let pools = shared.pools();
    let paused = !pools.is_empty() && pools.iter().all(|pool| pool.is_paused());
    let suspended = shared.is_suspended();
    let yes_no = |flag: bool| if flag { "yes".to_owned() } else { "no".to_owned() };
    let rows = vec![
        vec!["active".into(), yes_no(!paused && !suspended)],
        vec!["paused".into(), yes_no(paused)],
        vec!["suspended".into(), yes_no(suspended)],
    ];
    Table::new(&["key", "value"], rows)
}

/// A table with these columns and no rows (DNS_HOSTS, DNS_ZONES: Bypass keeps no DNS cache).
pub fn empty(columns: &'static [&'static str]) -> Table {
    Table { columns, rows: Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_pgbouncers_text() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(timestamp(at), "2023-11-14 22:13:20 UTC");
        assert_eq!(timestamp(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
    }
}
