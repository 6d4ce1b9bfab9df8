//! `bypass import-pgbouncer`: a `pgbouncer.ini` translated into an equivalent `bypass.toml`.
//!
//! ```text
//!  pgbouncer.ini ─► sections ([pgbouncer], [databases], [users]) ─► key by key:
//!     same meaning here ─► the Bypass key (seconds → `_ms`, `0/1` → booleans, lists → arrays)
//!     no equivalent     ─► listed in `untranslated` with the reason, never dropped silently
//!  ─► TOML text (only the keys that were set) + the list
//! ```
//! Pure: text in, text out; file names inside are made absolute against the ini's folder, as
//! Bypass resolves them against its own file's folder.

use std::path::Path;

use toml::{Table, Value};

use crate::config::{DatabaseEntry, PoolerSettings, UserEntry};

/// What the translation produced.
#[derive(Debug, Clone, Default)]
pub struct Import {
    /// The `bypass.toml` text.
    pub toml: String,
    /// One line per setting or line with no equivalent: where it was and why.
    pub untranslated: Vec<String>,
}

/// How a `[pgbouncer]` key carries over.
enum Rule {
    /// The same name and meaning.
    Same,
    /// Another name, same unit.
    Renamed(&'static str),
    /// Seconds there, milliseconds here (`name_ms`).
    Seconds,
    /// `0`/`1` there, a boolean here.
    Boolean,
    /// A comma-separated list there, an array here.
    List,
    /// A file name, made absolute.
    File,
    /// Handled with another key or by hand (listen address, auth type, unix socket).
    Special,
    /// No equivalent: why.
    Unsupported(&'static str),
}

/// The `[pgbouncer]` keys Bypass knows; anything else is listed as unknown.
fn rule(key: &str) -> Rule {
    match key {
        "listen_addr" | "listen_port" | "auth_type" | "unix_socket_dir" | "pool_mode" => Rule::Special,
        "max_client_conn"
        | "default_pool_size"
        | "min_pool_size"
        | "reserve_pool_size"
        | "max_db_connections"
        | "max_user_connections"
        | "server_reset_query"
        | "max_prepared_statements"
        | "listen_backlog"
        | "auth_user"
        | "auth_query"
        | "client_tls_sslmode"
        | "server_tls_sslmode" => Rule::Same,
        "max_packet_size" => Rule::Renamed("message_size_max"),
        "server_lifetime"
        | "server_idle_timeout"
        | "server_connect_timeout"
        | "query_wait_timeout"
        | "client_idle_timeout"
        | "client_login_timeout"
        | "idle_transaction_timeout"
        | "reserve_pool_timeout"
        | "autodb_idle_timeout"
        | "auth_failure_delay" => Rule::Seconds,
        "stats_period" => Rule::Renamed("stats_period_ms"),
        "log_connections" | "log_disconnections" => Rule::Boolean,
        "admin_users" | "stats_users" | "ignore_startup_parameters" => Rule::List,
        "auth_file"
        | "auth_hba_file"
        | "client_tls_cert_file"
        | "client_tls_key_file"
        | "client_tls_ca_file"
        | "server_tls_ca_file"
        | "server_tls_cert_file"
        | "server_tls_key_file" => Rule::File,
        "logfile" | "syslog" | "syslog_ident" | "syslog_facility" => {
            Rule::Unsupported("Bypass logs to stderr (redirect it, or run under systemd/journald)")
        }
        "pidfile" => Rule::Unsupported("Bypass refuses a second start on the same address by itself"),
        "user" => Rule::Unsupported("start Bypass as the user it should run as"),
        "so_reuseport" => Rule::Unsupported("Bypass always shards one process over SO_REUSEPORT (workers)"),
        "server_check_query" | "server_check_delay" => {
            Rule::Unsupported("Bypass checks an idle server's socket before handing it out instead of a query")
        }
        "query_timeout" => Rule::Unsupported("use PostgreSQL's statement_timeout"),
        "verbose" => Rule::Unsupported("set BYPASS_LOG=debug"),
        _ => Rule::Unsupported("no Bypass equivalent"),
    }
}

/// True when `text` reads like a `pgbouncer.ini` (a `[pgbouncer]` section, or ini-style
/// `key = value` lines TOML would reject), for a hint when such a file is given as bypass.toml.
pub fn looks_like_pgbouncer_ini(text: &str) -> bool {
    text.lines().any(|line| line.trim().eq_ignore_ascii_case("[pgbouncer]"))
}

/// Translates the text of a `pgbouncer.ini` whose folder is `folder`.
pub fn from_pgbouncer_ini(text: &str, folder: &Path) -> Import {
    let mut import = Import::default();
    let mut pooler = Table::new();
    let mut databases = Table::new();
    let mut users = Table::new();
    let (mut listen_host, mut listen_port) = ("127.0.0.1".to_owned(), "6432".to_owned());
    let mut unix_socket_dir = Some("/tmp".to_owned());
    let mut section = String::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            section = name.trim().to_ascii_lowercase();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            import.untranslated.push(format!("line {}: `{line}` is not `key = value`", number + 1));
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match section.as_str() {
            "pgbouncer" => match key {
                "listen_addr" => listen_host = value.to_owned(),
                "listen_port" => listen_port = value.to_owned(),
                "unix_socket_dir" => unix_socket_dir = Some(value.to_owned()).filter(|dir| !dir.is_empty()),
                _ => pooler_key(&mut pooler, key, value, folder, &mut import.untranslated),
            },
            "databases" => {
                if let Some(entry) = database_entry(key, value, &mut import.untranslated) {
                    databases.insert(key.to_owned(), Value::Table(entry));
                }
            }
            "users" => {
                if let Some(entry) = user_entry(key, value, &mut import.untranslated) {
                    users.insert(key.to_owned(), Value::Table(entry));
                }
            }
            other => import.untranslated.push(format!("[{other}] {key}: unknown section")),
        }
    }
    listen(&mut pooler, &listen_host, &listen_port, &mut import.untranslated);
    if let Some(dir) = unix_socket_dir {
        pooler.insert("unix_socket_dir".into(), Value::String(dir));
    }
    let mut document = Table::new();
    document.insert("pooler".into(), Value::Table(pooler));
    document.insert("databases".into(), Value::Table(databases));
    if !users.is_empty() {
        document.insert("users".into(), Value::Table(users));
    }
    let header = "# Translated from pgbouncer.ini by `bypass import-pgbouncer`; reference: docs/config.md\n";
    import.toml = format!("{header}{}", toml::to_string_pretty(&document).unwrap_or_default());
    import
}

/// One `[pgbouncer]` key into the `[pooler]` table (or the untranslated list).
fn pooler_key(pooler: &mut Table, key: &str, value: &str, folder: &Path, untranslated: &mut Vec<String>) {
    let mut refuse = |why: &str| untranslated.push(format!("[pgbouncer] {key} = {value}: {why}"));
    let converted = match rule(key) {
        Rule::Same => setting_value(key, value).map(|value| (key.to_owned(), value)),
        Rule::Renamed(name) if name == "stats_period_ms" => seconds(value).map(|ms| (name.to_owned(), ms)),
        Rule::Renamed(name) => setting_value(name, value).map(|value| (name.to_owned(), value)),
        Rule::Seconds => seconds(value).map(|ms| (format!("{key}_ms"), ms)),
        Rule::Boolean => Some((key.to_owned(), Value::Boolean(value != "0"))),
        Rule::List => Some((key.to_owned(), list(value))),
        Rule::File if value.is_empty() => return,
        Rule::File => Some((key.to_owned(), Value::String(folder.join(value).display().to_string()))),
        Rule::Special => match key {
            "auth_type" => return auth_type(pooler, value, untranslated),
            "pool_mode" => match pool_mode(value) {
                Ok(mode) => Some(("pool_mode".to_owned(), mode)),
                Err(why) => return refuse(why),
            },
            _ => None,
        },
        Rule::Unsupported(why) => return refuse(why),
    };
    match converted {
        Some((name, value)) if PoolerSettings::setting(&name).is_some() => {
            pooler.insert(name, value);
        }
        Some((name, _)) => refuse(&format!("this Bypass has no `{name}` setting")),
        None => refuse("not a valid value"),
    }
}

/// A value typed as the Bypass setting `name` expects: numbers stay numbers, the rest strings.
fn setting_value(name: &str, value: &str) -> Option<Value> {
    let kind = PoolerSettings::setting(name).map(|setting| setting.kind).unwrap_or("String");
    if kind.starts_with('u') || kind.starts_with("Option<u") {
        value.parse::<i64>().ok().map(Value::Integer)
    } else {
        Some(Value::String(value.trim_matches('\'').to_owned()))
    }
}

/// PgBouncer's seconds (fractions allowed) as milliseconds.
fn seconds(value: &str) -> Option<Value> {
    let seconds: f64 = value.parse().ok()?;
    (seconds >= 0.0).then(|| Value::Integer((seconds * 1000.0).round() as i64))
}

fn list(value: &str) -> Value {
    let items = value.split(',').map(str::trim).filter(|item| !item.is_empty());
    Value::Array(items.map(|item| Value::String(item.to_owned())).collect())
}

fn pool_mode(value: &str) -> Result<Value, &'static str> {
    match value {
        "session" | "transaction" => Ok(Value::String(value.to_owned())),
        "statement" => Err("Bypass has no statement mode (transaction mode is the closest; set it by hand)"),
        _ => Err("not a pool mode"),
    }
}

/// `auth_type`: trust, md5 and scram-sha-256 carry over; `hba` means md5 unless the hba file
/// says otherwise; the rest have no equivalent.
fn auth_type(pooler: &mut Table, value: &str, untranslated: &mut Vec<String>) {
    let translated = match value {
        "trust" | "md5" | "scram-sha-256" => value,
        "hba" => "md5",
        other => {
            let why = match other {
                "cert" => "use an auth_hba_file with the method `cert`",
                "plain" => "clients get md5 or SCRAM instead of a plaintext password",
                _ => "no Bypass equivalent",
            };
            untranslated.push(format!("[pgbouncer] auth_type = {other}: {why}"));
            return;
        }
    };
    pooler.insert("auth_type".into(), Value::String(translated.into()));
}

/// `listen_addr` (comma list, `*` = every address) and `listen_port` into one `host:port`.
fn listen(pooler: &mut Table, hosts: &str, port: &str, untranslated: &mut Vec<String>) {
    let mut hosts = hosts.split(',').map(str::trim).filter(|host| !host.is_empty());
    let first = hosts.next().unwrap_or("127.0.0.1");
    let host = if first == "*" { "0.0.0.0" } else { first };
    let rest: Vec<&str> = hosts.collect();
    if !rest.is_empty() {
        untranslated.push(format!(
            "[pgbouncer] listen_addr: Bypass listens on one address; kept {host}, not {}",
            rest.join(", ")
        ));
    }
    let address = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    pooler.insert("listen_addr".into(), Value::String(address));
}

/// The `key=value` pairs of a connection string (values may be single-quoted).
fn connection_string(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let after = after.trim_start();
        let (value, remaining) = match after.strip_prefix('\'') {
            Some(quoted) => match quoted.find('\'') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            },
            None => after.split_once(char::is_whitespace).unwrap_or((after, "")),
        };
        pairs.push((key.trim().to_owned(), value.to_owned()));
        rest = remaining.trim_start();
    }
    pairs
}

/// One `[databases]` line into a `[databases.NAME]` table.
fn database_entry(name: &str, text: &str, untranslated: &mut Vec<String>) -> Option<Table> {
    let mut entry = Table::new();
    let mut has_host = false;
    for (key, value) in connection_string(text) {
        let mut refuse = |why: &str| untranslated.push(format!("[databases] {name}: {key}={value}: {why}"));
        let (target, converted) = match key.as_str() {
            "host" if value.starts_with('/') => {
                refuse("Bypass reaches PostgreSQL over TCP only; set to 127.0.0.1, check the port");
                has_host = true;
                ("host", Some(Value::String("127.0.0.1".into())))
            }
            "host" => {
                has_host = true;
                ("host", Some(Value::String(value.clone())))
            }
            "port" | "pool_size" | "min_pool_size" | "max_db_connections" => {
                (key.as_str(), value.parse::<i64>().ok().map(Value::Integer))
            }
            "reserve_pool" | "reserve_pool_size" => {
                ("reserve_pool_size", value.parse::<i64>().ok().map(Value::Integer))
            }
            "dbname" | "user" | "password" => (key.as_str(), Some(Value::String(value.clone()))),
            "pool_mode" => match pool_mode(&value) {
                Ok(mode) => ("pool_mode", Some(mode)),
                Err(why) => {
                    refuse(why);
                    continue;
                }
            },
            _ => {
                refuse("no Bypass equivalent for this database option");
                continue;
            }
        };
        match converted {
            Some(value) if DatabaseEntry::setting(target).is_some() => {
                entry.insert(target.to_owned(), value);
            }
            Some(_) => refuse(&format!("this Bypass has no `{target}` database setting")),
            None => refuse("not a valid value"),
        }
    }
    if !has_host {
        untranslated.push(format!(
            "[databases] {name}: no host (PgBouncer then uses PostgreSQL's Unix socket); set to 127.0.0.1"
        ));
        entry.insert("host".into(), Value::String("127.0.0.1".into()));
    }
    Some(entry)
}

/// One `[users]` line into a `[users.NAME]` table.
fn user_entry(name: &str, text: &str, untranslated: &mut Vec<String>) -> Option<Table> {
    let mut entry = Table::new();
    for (key, value) in connection_string(text) {
        let converted = match key.as_str() {
            "pool_size" | "max_user_connections" => value.parse::<i64>().ok().map(Value::Integer).ok_or("not a number"),
            "pool_mode" => pool_mode(&value),
            _ => Err("no Bypass equivalent for this user option"),
        };
        match converted {
            Ok(value) if UserEntry::setting(&key).is_some() => {
                entry.insert(key, value);
            }
            Ok(_) => untranslated.push(format!("[users] {name}: {key}: this Bypass has no such user setting")),
            Err(why) => untranslated.push(format!("[users] {name}: {key}={value}: {why}")),
        }
    }
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_split_with_quotes() {
        let pairs = connection_string("host=db1 port=5433 dbname='my db' password='p w'");
        let expected = [("host", "db1"), ("port", "5433"), ("dbname", "my db"), ("password", "p w")];
        assert_eq!(pairs, expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    #[test]
    fn a_typical_file_translates_and_lists_the_rest() {
        // Goal: every setting with an equivalent carries over with its unit converted, and the
        // others are listed, each once. Method: translate, parse the result as a Config.
        let ini = "[databases]\napp = host=127.0.0.1 port=5433 dbname=appdb pool_size=5 reserve_pool=2\n\
                   * = host=10.0.0.1\nsock = host=/var/run/postgresql\n\
                   [users]\nalice = pool_mode=session max_user_connections=3\n\
                   [pgbouncer]\nlisten_addr = *\nlisten_port = 6543\nauth_type = md5\nauth_file = users.txt\n\
                   pool_mode = transaction\nserver_idle_timeout = 30\nquery_wait_timeout = 1.5\n\
                   log_connections = 0\nadmin_users = postgres, ops\nlogfile = /var/log/pgb.log\n\
                   reserve_pool_timeout = 3\nignore_startup_parameters = extra_float_digits,options\n";
        let import = from_pgbouncer_ini(ini, Path::new("/etc/pgbouncer"));
        let config: crate::config::Config = toml::from_str(&import.toml).expect("valid bypass.toml");
        assert_eq!(config.pooler.listen_addr, "0.0.0.0:6543");
        assert_eq!(config.pooler.server_idle_timeout_ms, 30_000);
        assert_eq!(config.pooler.query_wait_timeout_ms, 1_500);
        assert_eq!(config.pooler.reserve_pool_timeout_ms, 3_000);
        assert!(!config.pooler.log_connections);
        assert_eq!(config.pooler.admin_users, ["postgres", "ops"]);
        assert_eq!(config.pooler.ignore_startup_parameters, ["extra_float_digits", "options"]);
        assert_eq!(config.pooler.auth_file.as_deref(), Some(Path::new("/etc/pgbouncer/users.txt")));
        assert_eq!(config.pooler.unix_socket_dir.as_deref(), Some(Path::new("/tmp")));
        assert_eq!(config.databases["app"].port, 5433);
        assert_eq!(config.databases["app"].reserve_pool_size, Some(2));
        assert_eq!(config.databases["*"].host, "10.0.0.1");
        assert_eq!(config.users["alice"].max_user_connections, Some(3));
        let listed = import.untranslated.join("\n");
        assert!(listed.contains("logfile") && listed.contains("/var/run/postgresql"), "{listed}");
        assert_eq!(import.untranslated.len(), 2, "{listed}");
    }
}
