//! Client access rules: PgBouncer's subset of `pg_hba.conf` (`auth_hba_file`).
//!
//! ```text
//!  # type      database   user         address         method
//!  hostssl     app        alice,bob    10.0.0.0/8      scram-sha-256
//!  hostnossl   all        all          127.0.0.1/32    md5
//!  host        all        all          all             reject
//! ```
//! `local` lines are ignored (the pooler has no Unix socket). The first line matching the
//! connection type, database, user and address decides the method; no match is a refusal.
//! Every parse error is reported with `file:line`, all at once, at config load.

use std::net::IpAddr;
use std::path::Path;

use bypass_wire::SqlState;

use crate::config::AuthType;
use crate::error::PoolerError;
use crate::stream::Stream;

/// Bound on rules in one file.
pub const HBA_RULES_MAX: usize = 10_000;

/// How a client proves itself, as decided by the hba file or `auth_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HbaMethod {
    Trust,
    Reject,
    Md5,
    ScramSha256,
    /// Cleartext password over the wire, checked against the stored secret.
    Password,
    /// A verified TLS client certificate whose common name is the user name.
    Cert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectionType {
    Host,
    HostSsl,
    HostNoSsl,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum NameMatch {
    All,
    Names(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddressMatch {
    All,
    Network { address: IpAddr, prefix_len: u8 },
}

#[derive(Debug, Clone)]
struct HbaRule {
    connection: ConnectionType,
    databases: NameMatch,
    users: NameMatch,
    address: AddressMatch,
    method: HbaMethod,
}

/// A parsed hba file.
#[derive(Debug, Clone, Default)]
pub struct Hba {
    rules: Vec<HbaRule>,
}

/// What the rules are matched against.
#[derive(Debug, Clone, Copy)]
pub struct Connection<'a> {
    pub database: &'a str,
    pub user: &'a str,
    pub address: IpAddr,
    pub tls: bool,
}

impl Hba {
    /// Reads and parses `path`; every problem is named with `file:line`.
    pub fn load(path: &Path) -> Result<Hba, Vec<String>> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| vec![format!("pooler.auth_hba_file: cannot read {}: {error}", path.display())])?;
        Hba::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, file_name: &str) -> Result<Hba, Vec<String>> {
        let mut rules = Vec::new();
        let mut problems = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let content = line.split('#').next().unwrap_or_default();
            let fields: Vec<&str> = content.split_whitespace().collect();
            if fields.is_empty() || fields[0] == "local" {
                continue;
            }
            match parse_rule(&fields) {
                Ok(rule) if rules.len() < HBA_RULES_MAX => rules.push(rule),
                Ok(_) => problems.push(format!("{file_name}:{}: more than {HBA_RULES_MAX} rules", index + 1)),
                Err(problem) => problems.push(format!("{file_name}:{}: {problem}", index + 1)),
            }
        }
        match problems.is_empty() {
            true => Ok(Hba { rules }),
            false => Err(problems),
        }
    }

    /// The method of the first rule matching `connection`; `None` if no rule does.
    pub fn method_for(&self, connection: &Connection<'_>) -> Option<HbaMethod> {
        self.rules.iter().find(|rule| rule.matches(connection)).map(|rule| rule.method)
    }
}

fn parse_rule(fields: &[&str]) -> Result<HbaRule, String> {
    let connection = match fields[0] {
        "host" => ConnectionType::Host,
        "hostssl" => ConnectionType::HostSsl,
        "hostnossl" => ConnectionType::HostNoSsl,
        other => return Err(format!("unknown connection type {other:?} (host, hostssl, hostnossl, local)")),
    };
    let [_, databases, users, rest @ ..] = fields else {
        return Err("expected: type database user address method".into());
    };
    let (address, rest) = match rest {
        [address, mask, rest @ ..] if !address.contains('/') && *address != "all" && mask.parse::<IpAddr>().is_ok() => {
            (parse_address_and_mask(address, mask)?, rest)
        }
        [address, rest @ ..] => (parse_address(address)?, rest),
        [] => return Err("missing address and method".into()),
    };
    let method = match rest {
        [method] => parse_method(method)?,
        [] => return Err("missing method".into()),
        [_, option, ..] => return Err(format!("options such as {option:?} are not supported")),
    };
    Ok(HbaRule { connection, databases: parse_names(databases)?, users: parse_names(users)?, address, method })
}

fn parse_names(field: &str) -> Result<NameMatch, String> {
    if field == "all" {
        return Ok(NameMatch::All);
    }
    let mut names = Vec::new();
    for name in field.split(',') {
        let name = name.trim_matches('"');
        if name.is_empty() || name.starts_with('@') || name.starts_with('+') || name == "sameuser" {
            return Err(format!("unsupported name {name:?} (use all, names or comma lists)"));
        }
        names.push(name.to_owned());
    }
    Ok(NameMatch::Names(names))
}

fn parse_address(field: &str) -> Result<AddressMatch, String> {
    if field == "all" {
        return Ok(AddressMatch::All);
    }
    let (address, prefix_len) = match field.split_once('/') {
        Some((address, prefix)) => (address, Some(prefix)),
        None => (field, None),
    };
    let address: IpAddr = address.parse().map_err(|_| format!("{field:?} is not an address, CIDR or all"))?;
    let bits = address_bits(address);
    let prefix_len = match prefix_len {
        Some(prefix) => prefix.parse::<u8>().ok().filter(|p| *p <= bits).ok_or(format!("bad prefix in {field:?}"))?,
        None => bits,
    };
    Ok(AddressMatch::Network { address, prefix_len })
}

fn parse_address_and_mask(address: &str, mask: &str) -> Result<AddressMatch, String> {
    let address: IpAddr = address.parse().map_err(|_| format!("{address:?} is not an address"))?;
    let mask: IpAddr = mask.parse().map_err(|_| format!("{mask:?} is not a netmask"))?;
    let bits = to_bits(mask);
    let prefix_len = bits.leading_ones() as u8;
    let contiguous = bits.checked_shl(prefix_len as u32).unwrap_or(0) == 0;
    if address.is_ipv4() != mask.is_ipv4() || !contiguous {
        return Err(format!("{mask:?} is not a netmask for {address:?}"));
    }
    let prefix_len = if mask.is_ipv4() { prefix_len.saturating_sub(96) } else { prefix_len };
    Ok(AddressMatch::Network { address, prefix_len })
}

fn parse_method(field: &str) -> Result<HbaMethod, String> {
    Ok(match field {
        "trust" => HbaMethod::Trust,
        "reject" => HbaMethod::Reject,
        "md5" => HbaMethod::Md5,
        "scram-sha-256" => HbaMethod::ScramSha256,
        "password" => HbaMethod::Password,
        "cert" => HbaMethod::Cert,
        other => return Err(format!("unsupported method {other:?}")),
    })
}

fn address_bits(address: IpAddr) -> u8 {
    if address.is_ipv4() {
        32
    } else {
        128
    }
}

/// The address as 128 bits, IPv4 in the low 32 bits (the masks below are aligned to it).
fn to_bits(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(v4) => (u32::from(v4) as u128) | (u128::MAX << 32),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// IPv4 clients may show up as IPv4-mapped IPv6 addresses on a dual-stack listener.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(address),
        v4 => v4,
    }
}

impl AddressMatch {
    fn contains(&self, client: IpAddr) -> bool {
        let AddressMatch::Network { address, prefix_len } = *self else { return true };
        let client = canonical(client);
        if client.is_ipv4() != address.is_ipv4() {
            return false;
        }
        let bits = address_bits(address) as u32;
        let host_bits = bits - prefix_len as u32;
        let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
        to_bits(client) & mask == to_bits(address) & mask
    }
}

impl NameMatch {
    fn contains(&self, name: &str) -> bool {
        match self {
            NameMatch::All => true,
            NameMatch::Names(names) => names.iter().any(|candidate| candidate == name),
        }
    }
}

impl HbaRule {
    fn matches(&self, connection: &Connection<'_>) -> bool {
        let type_matches = match self.connection {
            ConnectionType::Host => true,
            ConnectionType::HostSsl => connection.tls,
            ConnectionType::HostNoSsl => !connection.tls,
        };
        type_matches
            && self.databases.contains(connection.database)
            && self.users.contains(connection.user)
            && self.address.contains(connection.address)
    }
}

fn refused(message: String) -> PoolerError {
    PoolerError::refused(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, message)
}

/// The method for a client: the hba file's first matching rule, else `auth_type`. `reject`
/// and no matching rule are refusals (28000), as in PostgreSQL.
pub fn client_method(
    hba: Option<&Hba>,
    auth_type: AuthType,
    stream: &Stream,
    database: &str,
    user: &str,
) -> Result<HbaMethod, PoolerError> {
    let Some(hba) = hba else {
        return Ok(match auth_type {
            AuthType::Trust => HbaMethod::Trust,
            AuthType::Md5 => HbaMethod::Md5,
            AuthType::ScramSha256 => HbaMethod::ScramSha256,
        });
    };
    let Some(address) = stream.peer_addr().map(|peer| peer.ip()) else {
        return Err(refused(format!(
            "no hba entry for a Unix-socket connection, user \"{user}\", database \"{database}\" (the hba file \
             has host lines only)"
        )));
    };
    let tls = stream.is_tls();
    let connection = Connection { database, user, address, tls };
    let encryption = if tls { "SSL encryption" } else { "no encryption" };
    match hba.method_for(&connection) {
        Some(HbaMethod::Reject) => Err(refused(format!(
            "hba file rejects connection for host \"{address}\", user \"{user}\", database \"{database}\", {encryption}"
        ))),
        Some(method) => Ok(method),
        None => Err(refused(format!(
            "no hba entry for host \"{address}\", user \"{user}\", database \"{database}\", {encryption}"
        ))),
    }
}

/// `cert`: the client's verified certificate must carry the user name as its common name.
pub fn check_certificate(stream: &Stream, user: &str) -> Result<(), PoolerError> {
    match crate::tls::client_certificate_name(stream) {
        Some(name) if name == user => Ok(()),
        Some(_) => Err(refused(format!("certificate authentication failed for user \"{user}\""))),
        None => Err(refused(format!("connection requires a valid client certificate for user \"{user}\""))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(user: &str, address: &str, tls: bool) -> Connection<'static> {
        let user: &'static str = Box::leak(user.to_owned().into_boxed_str());
        Connection { database: "app", user, address: address.parse().expect("address"), tls }
    }

    #[test]
    fn first_matching_rule_wins() {
        let text = "local all all trust\n\
                    hostssl app alice,bob 10.0.0.0/8 cert # comment\n\
                    hostnossl all alice 10.1.0.0 255.255.0.0 password\n\
                    host app,other all ::1/128 scram-sha-256\n\
                    host all all all md5\n";
        let hba = Hba::parse(text, "hba.conf").expect("valid");
        assert_eq!(hba.method_for(&connection("alice", "10.1.2.3", true)), Some(HbaMethod::Cert));
        assert_eq!(hba.method_for(&connection("alice", "10.1.2.3", false)), Some(HbaMethod::Password));
        assert_eq!(hba.method_for(&connection("carol", "10.1.2.3", true)), Some(HbaMethod::Md5));
        assert_eq!(hba.method_for(&connection("carol", "::1", false)), Some(HbaMethod::ScramSha256));
        assert_eq!(hba.method_for(&connection("alice", "::ffff:10.0.0.1", true)), Some(HbaMethod::Cert));
    }

    #[test]
    fn no_match_and_every_error_with_its_line() {
        let hba = Hba::parse("hostssl all all 127.0.0.1/32 trust\n", "h").expect("valid");
        assert_eq!(hba.method_for(&connection("alice", "127.0.0.1", false)), None);
        let text = "host all all 127.0.0.1/33 md5\nhost all all all\nhosts all all all md5\nhost all all all ldap\n";
        let problems = Hba::parse(text, "hba.conf").expect_err("invalid");
        assert_eq!(problems.len(), 4, "{problems:?}");
        for (index, problem) in problems.iter().enumerate() {
            assert!(problem.starts_with(&format!("hba.conf:{}:", index + 1)), "{problem}");
        }
    }
}
