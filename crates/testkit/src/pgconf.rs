//! Pure rendering of the files and statements a test cluster needs: `testkit.conf`,
//! `pg_hba.conf` and the role DDL. No I/O here, so the exact text is unit-tested.

use std::path::Path;

use crate::postgres::TestUser;
use crate::sql::{quote_identifier, quote_literal};

/// Name of the settings file included at the end of `postgresql.conf` and rewritten on every
/// `start_with`, so a persistent data directory can come back on a different port.
pub(crate) const SETTINGS_FILE: &str = "testkit.conf";

/// The line appended once to `postgresql.conf`.
pub(crate) const INCLUDE_LINE: &str = "include_if_exists = 'testkit.conf'";

/// What goes into [`SETTINGS_FILE`].
pub(crate) struct ServerSettings<'a> {
    pub port: u16,
    pub socket_dir: &'a Path,
    pub max_connections: u32,
    pub shared_buffers_mb: u32,
    /// `false` for throwaway clusters: fsync and full-page writes off, nothing survives an OS
    /// crash anyway.
    pub durable: bool,
    pub extra_conf: &'a [String],
}

/// The text of [`SETTINGS_FILE`].
pub(crate) fn render_settings(settings: &ServerSettings<'_>) -> String {
    let socket_dir = quote_literal(&settings.socket_dir.to_string_lossy());
    let mut lines = vec![
        "# Written by bypass-testkit on every start; overrides postgresql.conf.".to_string(),
        format!("port = {}", settings.port),
        "listen_addresses = '127.0.0.1'".to_string(),
        format!("unix_socket_directories = {socket_dir}"),
        format!("max_connections = {}", settings.max_connections),
        format!("shared_buffers = '{}MB'", settings.shared_buffers_mb),
        "logging_collector = off".to_string(),
    ];
    if !settings.durable {
        lines.push("fsync = off".to_string());
        lines.push("full_page_writes = off".to_string());
    }
    lines.extend(settings.extra_conf.iter().cloned());
    lines.join("\n") + "\n"
}

/// `pg_hba.conf`: local trust, one line per password user, then trust for everyone else on
/// loopback. Order matters: PostgreSQL uses the first matching line.
pub(crate) fn render_hba(users: &[TestUser]) -> String {
    let mut lines = vec!["# Written by bypass-testkit.".to_string(), "local all all trust".to_string()];
    for user in users {
        if let Some(method) = user.auth.hba_method() {
            let name = quote_identifier(&user.name);
            lines.push(format!("host all {name} 127.0.0.1/32 {method}"));
        }
    }
    lines.push("host all all 127.0.0.1/32 trust".to_string());
    lines.join("\n") + "\n"
}

/// `SET password_encryption ...; CREATE ROLE ...` (or `ALTER ROLE` when it already exists, as in
/// a reused persistent data directory). The encryption setting is what makes an `Md5` user's
/// stored secret really MD5.
pub(crate) fn role_sql(user: &TestUser, exists: bool) -> String {
    let verb = if exists { "ALTER" } else { "CREATE" };
    let password = match &user.password {
        Some(password) => quote_literal(password),
        None => "NULL".to_string(),
    };
    format!(
        "SET password_encryption = '{}'; {verb} ROLE {} LOGIN SUPERUSER PASSWORD {password}",
        user.auth.password_encryption(),
        quote_identifier(&user.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: hba lines come in the documented order with the right methods; method: render.
    #[test]
    fn hba_orders_password_users_before_trust() {
        let users = vec![TestUser::trust("t"), TestUser::md5("m", "pw"), TestUser::scram("s", "pw")];
        let hba = render_hba(&users);
        let lines: Vec<&str> = hba.lines().skip(1).collect();
        assert_eq!(
            lines,
            vec![
                "local all all trust",
                "host all \"m\" 127.0.0.1/32 md5",
                "host all \"s\" 127.0.0.1/32 scram-sha-256",
                "host all all 127.0.0.1/32 trust",
            ]
        );
    }

    // Goal: throwaway clusters turn fsync off, durable ones keep it; method: render both.
    #[test]
    fn settings_respect_durability() {
        let extra = vec!["synchronous_commit = off".to_string()];
        let mut settings = ServerSettings {
            port: 5555,
            socket_dir: Path::new("/tmp/x'y"),
            max_connections: 100,
            shared_buffers_mb: 128,
            durable: false,
            extra_conf: &extra,
        };
        let text = render_settings(&settings);
        assert!(text.contains("port = 5555\n"));
        assert!(text.contains("unix_socket_directories = '/tmp/x''y'\n"));
        assert!(text.contains("fsync = off\n"));
        assert!(text.ends_with("synchronous_commit = off\n"));
        settings.durable = true;
        assert!(!render_settings(&settings).contains("fsync"));
    }

    // Goal: role DDL picks the encryption per method and quotes safely; method: render.
    #[test]
    fn role_sql_quotes_and_encrypts() {
        let sql = role_sql(&TestUser::md5("o\"k", "it's"), false);
        assert_eq!(sql, "SET password_encryption = 'md5'; CREATE ROLE \"o\"\"k\" LOGIN SUPERUSER PASSWORD 'it''s'");
        let sql = role_sql(&TestUser::trust("t"), true);
        assert!(sql.starts_with("SET password_encryption = 'scram-sha-256'; ALTER ROLE \"t\""));
        assert!(sql.ends_with("PASSWORD NULL"));
    }
}
