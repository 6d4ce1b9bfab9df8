//! Files to checked runtime objects: reads `bypass.toml`, checks it ([`Config::problems`]),
//! resolves its addresses and builds what its file settings name (auth file, TLS contexts, hba
//! rules), listing every problem of every file in one error.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::auth_file::AuthFile;
use crate::config::{AuthType, Config, PoolerSettings};

/// Why a configuration could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

/// A configuration that passed validation, with the files it names loaded.
#[derive(Debug, Clone)]
pub struct ValidConfig {
    pub config: Config,
    pub listen_addr: SocketAddr,
    pub auth: AuthFile,
    /// Certificates and keys of both sides, loaded.
    pub tls: crate::tls::TlsContexts,
    /// The parsed `auth_hba_file`, if one is set.
    pub hba: Option<crate::hba::Hba>,
}

impl Config {
    /// Reads, parses and validates a TOML file; relative paths inside resolve against its folder.
    pub fn load(path: &Path) -> Result<ValidConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let (config, mut problems) = Config::parse_listing(&text);
        let Some(mut config) = config else { return Err(ConfigError::Invalid(problems)) };
        if let Some(folder) = path.parent() {
            resolve_file_paths(&mut config.pooler, folder);
        }
        default_mock_key_file(&mut config.pooler, path);
        match config.validate() {
            Ok(valid) if problems.is_empty() => Ok(valid),
            Ok(_) => Err(ConfigError::Invalid(problems)),
            Err(ConfigError::Invalid(more)) => {
                problems.extend(more);
                Err(ConfigError::Invalid(once_each(problems)))
            }
            Err(other) => Err(other),
        }
    }

    /// Parses TOML text; every problem is listed, each once (one run shows all).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        match Config::parse_listing(text) {
            (Some(config), problems) if problems.is_empty() => Ok(config),
            (Some(config), problems) => Err(ConfigError::Invalid(once_each([problems, config.problems()].concat()))),
            (None, problems) => Err(ConfigError::Invalid(problems)),
        }
    }

    /// The configuration made of every key that parses (`None` on a TOML syntax error), and
    /// one problem per key that does not: unknown table or key, wrong type.
    fn parse_listing(text: &str) -> (Option<Config>, Vec<String>) {
        let first = match toml::from_str::<Config>(text) {
            Ok(config) => return (Some(config), Vec::new()),
            Err(error) => error,
        };
        let Ok(table) = toml::from_str::<toml::Table>(text) else {
            return (None, vec![first.to_string().trim().to_owned()]);
        };
        let (usable, problems) = usable_part(table);
        (usable.try_into::<Config>().ok(), problems)
    }

    /// Checks every setting and loads the files it names; lists all problems at once.
    pub fn validate(self) -> Result<ValidConfig, ConfigError> {
        let mut problems = Vec::new();
        let listen_addr = resolve(&self.pooler.listen_addr, "pooler.listen_addr", &mut problems);
        if let Some(metrics_addr) = &self.pooler.metrics_addr {
            resolve(metrics_addr, "pooler.metrics_addr", &mut problems);
        }
        problems.extend(self.problems());
        let auth = load_auth_file(&self.pooler, &mut problems);
        let tls = crate::tls::TlsContexts::load(&self.pooler, &mut problems);
        let hba = self.pooler.auth_hba_file.as_deref().and_then(|path| {
            crate::hba::Hba::load(path).map_err(|mut file_problems| problems.append(&mut file_problems)).ok()
        });
        match (problems.is_empty(), listen_addr) {
            (true, Some(listen_addr)) => Ok(ValidConfig { config: self, listen_addr, auth, tls, hba }),
            _ => Err(ConfigError::Invalid(once_each(problems))),
        }
    }
}

/// Splits a parsed file into what deserializes and one problem per key that does not (unknown
/// table, unknown key, wrong type).
fn usable_part(table: toml::Table) -> (toml::Table, Vec<String>) {
    let mut problems = Vec::new();
    let mut usable = toml::Table::new();
    for (name, value) in table {
        let checked = match name.as_str() {
            "pooler" => check_table::<PoolerSettings>("pooler", value, &mut problems),
            "databases" | "users" => check_entries(&name, value, &mut problems),
            _ => {
                problems.push(format!("unknown table [{name}] (known: [pooler], [databases], [users])"));
                None
            }
        };
        if let Some(value) = checked {
            usable.insert(name, value);
        }
    }
    (usable, problems)
}

/// Every `[databases.NAME]` or `[users.NAME]` entry checked alone.
fn check_entries(table: &str, value: toml::Value, problems: &mut Vec<String>) -> Option<toml::Value> {
    let toml::Value::Table(entries) = value else {
        problems.push(format!("[{table}] must be a table of entries"));
        return None;
    };
    let mut usable = toml::Table::new();
    for (name, entry) in entries {
        let place = format!("{table}.{name}");
        let checked = match table {
            "databases" => check_table::<crate::config::DatabaseEntry>(&place, entry, problems),
            _ => check_table::<crate::config::UserEntry>(&place, entry, problems),
        };
        if let Some(entry) = checked {
            usable.insert(name, entry);
        }
    }
    Some(toml::Value::Table(usable))
}

/// The keys of one table that deserialize as `T` on their own; a problem for each other one.
fn check_table<T: serde::de::DeserializeOwned>(
    place: &str,
    value: toml::Value,
    problems: &mut Vec<String>,
) -> Option<toml::Value> {
    let toml::Value::Table(keys) = value else {
        problems.push(format!("{place} must be a table"));
        return None;
    };
    let known = known_keys(place);
    let mut usable = toml::Table::new();
    for (key, value) in keys {
        if !known.contains(&key.as_str()) {
            let hint = closest(&key, &known).map(|name| format!("; did you mean `{name}`?")).unwrap_or_default();
            problems.push(format!("{place}.{key}: unknown key{hint} (docs/config.md lists every setting)"));
            continue;
        }
        let alone = toml::Table::from_iter([(key.clone(), value.clone())]);
        match toml::Value::Table(alone).try_into::<T>() {
            Ok(_) => {
                usable.insert(key, value);
            }
            Err(error) => {
                let text = error.to_string();
                problems.push(format!("{place}.{key}: {}", text.lines().next().unwrap_or_default().trim()));
            }
        }
    }
    Some(toml::Value::Table(usable))
}

/// The setting names of the table at `place` (`pooler`, `databases.NAME`, `users.NAME`).
fn known_keys(place: &str) -> Vec<&'static str> {
    let settings = match place.split('.').next() {
        Some("pooler") => PoolerSettings::SETTINGS,
        Some("databases") => crate::config::DatabaseEntry::SETTINGS,
        _ => crate::config::UserEntry::SETTINGS,
    };
    settings.iter().map(|setting| setting.name).collect()
}

/// The known name within two edits of `key`, if one is.
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|name| (edit_distance(key, name), *name))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, name)| name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, left) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, right) in b.iter().enumerate() {
            let substitution = previous + usize::from(left != *right);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

/// The problems in their order, each once.
fn once_each(problems: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    problems.into_iter().filter(|problem| seen.insert(problem.clone())).collect()
}

/// Resolves the file names of the auth file, TLS and hba settings against the config file's folder.
fn resolve_file_paths(settings: &mut PoolerSettings, folder: &Path) {
    for path in [
        &mut settings.auth_file,
        &mut settings.client_tls_cert_file,
        &mut settings.client_tls_key_file,
        &mut settings.client_tls_ca_file,
        &mut settings.server_tls_ca_file,
        &mut settings.server_tls_cert_file,
        &mut settings.server_tls_key_file,
        &mut settings.auth_hba_file,
        &mut settings.mock_key_file,
    ]
    .into_iter()
    .flatten()
    {
        *path = folder.join(&*path);
    }
}

/// Where the mock key is kept when `mock_key_file` is unset: beside the auth file (where it
/// always was), else beside the configuration file, so that a pooler whose users come only
/// through `auth_query` keeps one across restarts too.
fn default_mock_key_file(settings: &mut PoolerSettings, config_file: &Path) {
    if settings.mock_key_file.is_none() {
        let beside = settings.auth_file.as_deref().unwrap_or(config_file);
        settings.mock_key_file = Some(bypass_frontdoor::mock::mock_key_path(beside));
    }
}

fn load_auth_file(settings: &PoolerSettings, problems: &mut Vec<String>) -> AuthFile {
    match (&settings.auth_file, settings.auth_type) {
        (None, AuthType::Trust) => AuthFile::default(),
        (None, _) => {
            problems.push("pooler.auth_file is required unless auth_type = \"trust\"".into());
            AuthFile::default()
        }
        (Some(path), _) => AuthFile::load(path).unwrap_or_else(|error| {
            problems.push(format!("pooler.auth_file: {error}"));
            AuthFile::default()
        }),
    }
}

fn resolve(address: &str, field: &str, problems: &mut Vec<String>) -> Option<SocketAddr> {
    match address.to_socket_addrs().map(|mut addrs| addrs.next()) {
        Ok(Some(addr)) => Some(addr),
        _ => {
            problems.push(format!("{field} = {address:?} is not a host:port address"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_lists_every_problem() {
        let text = "[pooler]\nlisten_addr = \"nowhere\"\ndefault_pool_size = 0\nauth_type = \"md5\"\n";
        let config: Config = toml::from_str(text).expect("parses");
        let Err(ConfigError::Invalid(problems)) = config.validate() else { panic!("must be invalid") };
        assert!(problems.len() >= 4, "{problems:?}");
    }

    #[test]
    fn a_broken_file_lists_every_problem_once() {
        // Goal: one run shows every problem: unknown keys, wrong types, bad values, in every table.
        let text = "[pooler]\npool_mdoe = \"session\"\ndefault_pool_size = \"ten\"\nmin_pool_size = 99\n\
                    [databases.app]\nport = \"x\"\nhots = \"h\"\n[users.bob]\npool_size = 0\n[pgbouncer]\n";
        let Err(ConfigError::Invalid(problems)) = Config::parse(text) else { panic!("must be invalid") };
        let joined = problems.join("\n");
        for expected in ["pool_mdoe", "default_pool_size", "databases.app.port", "hots", "[pgbouncer]", "users.bob"] {
            assert!(joined.contains(expected), "{expected} missing from:\n{joined}");
        }
        assert!(joined.contains("did you mean `pool_mode`"), "{joined}");
        assert_eq!(once_each(problems.clone()).len(), problems.len(), "each problem once:\n{joined}");
    }

    #[test]
    fn minimal_trust_config_is_valid() {
        let text = "[pooler]\nauth_type = \"trust\"\n[databases.app]\nport = 5433\n";
        let valid = toml::from_str::<Config>(text).expect("parses").validate().expect("valid");
        assert_eq!(valid.config.databases["app"].backend_dbname("app"), "app");
        assert_eq!(valid.listen_addr.port(), 6432);
    }

    #[test]
    fn every_configuration_file_names_a_mock_key_file() {
        // Goal: the mock key has a home whatever the file says: beside the auth file, else beside
        // the configuration file, or where mock_key_file says (relative to the file's folder).
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("users.txt"), "\"alice\" \"pw\"\n").expect("auth file");
        let path = dir.path().join("bypass.toml");
        let key_file_of = |extra: &str| {
            std::fs::write(&path, format!("[pooler]\n{extra}\n[databases.app]\nport = 5433\n")).expect("config");
            Config::load(&path).expect("valid").config.pooler.mock_key_file.expect("a key file")
        };
        assert_eq!(key_file_of("auth_type = \"trust\""), dir.path().join("bypass.toml.mock-key"));
        assert_eq!(key_file_of("auth_file = \"users.txt\""), dir.path().join("users.txt.mock-key"));
        assert_eq!(
            key_file_of("auth_file = \"users.txt\"\nmock_key_file = \"keys/mock\""),
            dir.path().join("keys/mock")
        );
    }
}
