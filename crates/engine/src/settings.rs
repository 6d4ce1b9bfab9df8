//! Session settings: what `SET`, `SHOW`, `RESET` and the startup packet may change, with
//! PostgreSQL's names, units and defaults. A parameter we do not implement is refused (42704 if
//! PostgreSQL does not know it either, 0A000 naming it if it does), and a value we cannot honour
//! is refused (22023): nothing is accepted and ignored.

use std::time::Duration;

use crate::error::{EngineError, Result};

/// The version string clients parse (psql, SQLAlchemy, DBeaver read `server_version`).
pub const SERVER_VERSION: &str = "15.0";
/// `server_version_num`, as PostgreSQL reports it.
pub const SERVER_VERSION_NUM: &str = "150000";
/// What `version()` returns.
pub const VERSION_TEXT: &str = concat!(
    "PostgreSQL 15.0 (Bypass engine ",
    env!("CARGO_PKG_VERSION"),
    ", in-memory columnar) on x86_64-pc-linux-gnu"
);

/// Transaction isolation levels we provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Every statement sees the newest committed data (PostgreSQL's default).
    ReadCommitted,
    /// Every statement of a transaction sees the data committed when it first read.
    RepeatableRead,
}

impl Isolation {
    pub fn name(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read committed",
            Isolation::RepeatableRead => "repeatable read",
        }
    }

    /// PostgreSQL's spelling; READ UNCOMMITTED is READ COMMITTED there too. SERIALIZABLE is
    /// refused: table-level write locks and snapshots do not prevent write skew.
    pub fn parse(text: &str) -> Result<Isolation> {
        match text.trim().to_ascii_lowercase().as_str() {
            "read committed" | "read uncommitted" => Ok(Isolation::ReadCommitted),
            "repeatable read" => Ok(Isolation::RepeatableRead),
            "serializable" => Err(EngineError::unsupported("isolation level SERIALIZABLE (use REPEATABLE READ)")),
            other => Err(EngineError::InvalidParameterValue(format!("invalid isolation level \"{other}\""))),
        }
    }
}

/// The settings of one session.
#[derive(Debug, Clone)]
pub struct Settings {
    pub statement_timeout: Option<Duration>,
    pub lock_timeout: Option<Duration>,
    pub idle_in_transaction_session_timeout: Option<Duration>,
    /// Bound on the memory one statement may hold (bytes).
    pub memory_limit: usize,
    /// The server-wide bound `memory_limit` may not exceed.
    pub memory_limit_max: usize,
    pub default_isolation: Isolation,
    pub application_name: String,
    pub search_path: String,
    pub time_zone: String,
    pub extra_float_digits: i32,
    pub client_min_messages: String,
}

impl Settings {
    pub fn new(memory_limit: usize) -> Settings {
        Settings {
            statement_timeout: None,
            lock_timeout: None,
            idle_in_transaction_session_timeout: None,
            memory_limit,
            memory_limit_max: memory_limit,
            default_isolation: Isolation::ReadCommitted,
            application_name: String::new(),
            search_path: "\"$user\", public".into(),
            time_zone: "UTC".into(),
            extra_float_digits: 1,
            client_min_messages: "notice".into(),
        }
    }

    /// Parameters reported to the client at startup (ParameterStatus), name and value.
    pub fn reported(&self, user: &str) -> Vec<(&'static str, String)> {
        vec![
            ("application_name", self.application_name.clone()),
            ("client_encoding", "UTF8".into()),
            ("DateStyle", "ISO, MDY".into()),
            ("default_transaction_read_only", "off".into()),
            ("in_hot_standby", "off".into()),
            ("integer_datetimes", "on".into()),
            ("IntervalStyle", "postgres".into()),
            ("is_superuser", "on".into()),
            ("server_encoding", "UTF8".into()),
            ("server_version", SERVER_VERSION.into()),
            ("session_authorization", user.to_string()),
            ("standard_conforming_strings", "on".into()),
            ("TimeZone", self.time_zone.clone()),
        ]
    }

    /// Applies `SET name = value` (or a startup parameter). `None` resets to the default.
    pub fn set(&mut self, name: &str, value: Option<&str>) -> Result<()> {
        let defaults = Settings::new(self.memory_limit_max);
        let name = name.to_ascii_lowercase();
        match (name.as_str(), value) {
            ("statement_timeout", v) => self.statement_timeout = v.map(parse_duration_ms).transpose()?.flatten(),
            ("lock_timeout", v) => self.lock_timeout = v.map(parse_duration_ms).transpose()?.flatten(),
            ("idle_in_transaction_session_timeout", v) => {
                self.idle_in_transaction_session_timeout = v.map(parse_duration_ms).transpose()?.flatten()
            }
            ("memory_limit", None) => self.memory_limit = defaults.memory_limit,
            ("memory_limit", Some(v)) => self.memory_limit = self.parse_memory_limit(v)?,
            ("default_transaction_isolation" | "transaction_isolation", v) => {
                self.default_isolation = v.map(Isolation::parse).transpose()?.unwrap_or(defaults.default_isolation)
            }
            ("application_name", v) => self.application_name = v.unwrap_or_default().to_string(),
            ("search_path", v) => self.search_path = v.map_or(defaults.search_path, str::to_string),
            ("timezone", v) => self.time_zone = v.map_or(defaults.time_zone, str::to_string),
            ("extra_float_digits", v) => self.extra_float_digits = parse_extra_float_digits(v)?,
            ("client_min_messages", v) => {
                self.client_min_messages = v.map_or(defaults.client_min_messages, str::to_lowercase)
            }
            (fixed, v) => check_fixed(fixed, v)?,
        }
        Ok(())
    }

    fn parse_memory_limit(&self, text: &str) -> Result<usize> {
        let bytes = parse_bytes(text)?;
        if bytes > self.memory_limit_max {
            return Err(EngineError::InvalidParameterValue(format!(
                "memory_limit {text} is above the server's limit of {} bytes",
                self.memory_limit_max
            )));
        }
        Ok(bytes)
    }

    /// `SHOW name`.
    pub fn show(&self, name: &str) -> Result<String> {
        let name = name.to_ascii_lowercase();
        Ok(match name.as_str() {
            "statement_timeout" => show_duration(self.statement_timeout),
            "lock_timeout" => show_duration(self.lock_timeout),
            "idle_in_transaction_session_timeout" => show_duration(self.idle_in_transaction_session_timeout),
            "memory_limit" => format!("{}kB", self.memory_limit / 1024),
            "default_transaction_isolation" | "transaction_isolation" => self.default_isolation.name().into(),
            "application_name" => self.application_name.clone(),
            "search_path" => self.search_path.clone(),
            "timezone" => self.time_zone.clone(),
            "extra_float_digits" => self.extra_float_digits.to_string(),
            "client_min_messages" => self.client_min_messages.clone(),
            "server_version" => SERVER_VERSION.into(),
            "server_version_num" => SERVER_VERSION_NUM.into(),
            other => FIXED
                .iter()
                .find(|(fixed, _)| fixed.eq_ignore_ascii_case(other))
                .map(|(_, value)| value.to_string())
                .ok_or_else(|| unknown(other))?,
        })
    }
}

/// Parameters with one value we support: SET to that value (any spelling PostgreSQL accepts
/// for it) is fine, any other value is refused.
const FIXED: [(&str, &str); 13] = [
    ("client_encoding", "UTF8"),
    ("server_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("standard_conforming_strings", "on"),
    ("integer_datetimes", "on"),
    ("bytea_output", "hex"),
    ("default_transaction_read_only", "off"),
    ("transaction_read_only", "off"),
    ("is_superuser", "on"),
    ("max_identifier_length", "63"),
    ("lc_messages", "C"),
    ("max_connections", "256"),
];

/// PostgreSQL parameters that exist there but mean nothing we implement: refused as
/// unsupported (0A000) rather than unknown.
const KNOWN_UNSUPPORTED: [&str; 10] = [
    "work_mem",
    "maintenance_work_mem",
    "max_parallel_workers_per_gather",
    "synchronous_commit",
    "jit",
    "enable_seqscan",
    "random_page_cost",
    "session_replication_role",
    "row_security",
    "check_function_bodies",
];

fn check_fixed(name: &str, value: Option<&str>) -> Result<()> {
    let Some((canonical, fixed)) = FIXED.iter().find(|(fixed, _)| fixed.eq_ignore_ascii_case(name)) else {
        if KNOWN_UNSUPPORTED.contains(&name) {
            return Err(EngineError::unsupported(format!("setting \"{name}\"")));
        }
        return Err(unknown(name));
    };
    let Some(value) = value else { return Ok(()) };
    let normalize = |text: &str| text.to_ascii_lowercase().replace(['-', '_', ' ', '\''], "");
    let same = normalize(value) == normalize(fixed)
        || (*canonical == "client_encoding" && ["unicode", "utf8"].contains(&normalize(value).as_str()))
        || (*canonical == "DateStyle"
            && ["iso", "isomdy", "mdyiso"].contains(&normalize(value).replace(',', "").as_str()));
    if same {
        Ok(())
    } else {
        Err(EngineError::unsupported(format!("{canonical} = {value} (only {fixed})")))
    }
}

fn unknown(name: &str) -> EngineError {
    EngineError::UnknownSetting(name.to_string())
}

/// `SET statement_timeout`: an integer in milliseconds or a number with a unit; 0 = none.
fn parse_duration_ms(text: &str) -> Result<Option<Duration>> {
    let text = text.trim().trim_matches('\'');
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let invalid = || EngineError::InvalidParameterValue(format!("invalid value for a timeout: \"{text}\""));
    let number: f64 = number.parse().map_err(|_| invalid())?;
    let factor_ms = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(invalid()),
    };
    let ms = number * factor_ms;
    if !(0.0..=f64::from(i32::MAX)).contains(&ms) {
        return Err(invalid());
    }
    Ok((ms >= 1.0).then(|| Duration::from_millis(ms as u64)))
}

fn show_duration(duration: Option<Duration>) -> String {
    match duration {
        None => "0".into(),
        Some(d) if d.as_millis() % 1000 == 0 => format!("{}s", d.as_secs()),
        Some(d) => format!("{}ms", d.as_millis()),
    }
}

/// `'4GB'`, `'512MB'`, `'1024kB'`, or a number of kilobytes (PostgreSQL's memory unit).
pub fn parse_bytes(text: &str) -> Result<usize> {
    let text = text.trim().trim_matches('\'');
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let invalid = || EngineError::InvalidParameterValue(format!("invalid memory size: \"{text}\""));
    let number: usize = number.parse().map_err(|_| invalid())?;
    let factor: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "kb" => 1 << 10,
        "b" => 1,
        "mb" => 1 << 20,
        "gb" => 1 << 30,
        "tb" => 1 << 40,
        _ => return Err(invalid()),
    };
    number.checked_mul(factor).ok_or_else(invalid)
}

/// PostgreSQL 12+ prints the shortest exact float for values ≥ 1, which is what we print;
/// rounded output (0 and below) is not implemented.
fn parse_extra_float_digits(value: Option<&str>) -> Result<i32> {
    let Some(value) = value else { return Ok(1) };
    let digits: i32 = value.trim().trim_matches('\'').parse().map_err(|_| {
        EngineError::InvalidParameterValue(format!("invalid value for extra_float_digits: \"{value}\""))
    })?;
    match digits {
        1..=3 => Ok(digits),
        -15..=0 => Err(EngineError::unsupported(format!("extra_float_digits = {digits} (rounded float output)"))),
        _ => Err(EngineError::InvalidParameterValue(format!(
            "{digits} is outside the valid range for extra_float_digits"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: SET/SHOW round-trip PostgreSQL's spellings, and what we cannot honour is refused;
    // method: fixed cases.
    #[test]
    fn settings_parse_and_refuse() {
        let mut settings = Settings::new(1 << 30);
        settings.set("statement_timeout", Some("250")).expect("ms");
        assert_eq!(settings.statement_timeout, Some(Duration::from_millis(250)));
        settings.set("statement_timeout", Some("2s")).expect("unit");
        assert_eq!(settings.show("statement_timeout").expect("known"), "2s");
        settings.set("statement_timeout", Some("0")).expect("zero");
        assert_eq!(settings.statement_timeout, None);
        settings.set("memory_limit", Some("512MB")).expect("below the server's");
        assert_eq!(settings.memory_limit, 512 << 20);
        assert_eq!(settings.set("memory_limit", Some("2GB")).expect_err("above").sqlstate(), "22023");
        settings.set("client_encoding", Some("utf8")).expect("the one we speak");
        assert_eq!(settings.set("client_encoding", Some("LATIN1")).expect_err("not ours").sqlstate(), "0A000");
        settings.set("DateStyle", Some("ISO, MDY")).expect("ours");
        assert_eq!(settings.set("work_mem", Some("4MB")).expect_err("known").sqlstate(), "0A000");
        assert_eq!(settings.set("no_such_thing", Some("1")).expect_err("unknown").sqlstate(), "42704");
        assert_eq!(settings.show("server_version").expect("fixed"), SERVER_VERSION);
        assert_eq!(
            settings.set("transaction_isolation", Some("serializable")).expect_err("refused").sqlstate(),
            "0A000"
        );
    }
}
