//! The user list: PgBouncer's `userlist.txt` format, one `"name" "secret"` pair per line, where the
//! secret is a plaintext password, an `md5…` hash or a `SCRAM-SHA-256$…` verifier.
//!
//! Bounds: at most [`AUTH_FILE_USERS_MAX`] users and [`AUTH_FILE_BYTES_MAX`] bytes; a file past
//! either is refused whole, with the reason.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::scram::Verifier;

/// What we know about one user's password. `Debug` prints the kind only, never the secret.
#[derive(Clone)]
pub enum Secret {
    /// Plaintext; usable for every method. Its SCRAM verifier is derived at the first SCRAM
    /// login, with the salt the server's mock key gives the user (`MockKey::password_verifier`):
    /// stable across restarts as the key is, and made by the same function as an unknown
    /// user's mock salt.
    Plain { password: String, verifier: Arc<OnceLock<Arc<Verifier>>> },
    /// `md5` + hex(md5(password + user)): usable for MD5 only.
    Md5(String),
    /// A SCRAM verifier: usable for SCRAM only.
    Scram(Arc<Verifier>),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Secret::Plain { .. } => "Secret::Plain(..)",
            Secret::Md5(_) => "Secret::Md5(..)",
            Secret::Scram(_) => "Secret::Scram(..)",
        })
    }
}

/// Users and their secrets.
#[derive(Debug, Clone, Default)]
pub struct AuthFile {
    users: HashMap<String, Secret>,
}

impl AuthFile {
    pub fn load(path: &Path) -> Result<Self, String> {
        let metadata = std::fs::metadata(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        if metadata.len() > AUTH_FILE_BYTES_MAX as u64 {
            return Err(format!("{} is larger than {AUTH_FILE_BYTES_MAX} bytes", path.display()));
        }
        let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        Self::parse(&text)
    }

    /// Parses the file (a plaintext password's SCRAM verifier is derived at its first use).
    pub fn parse(text: &str) -> Result<Self, String> {
        let users = parse_entries(text)?.into_iter().map(|(name, secret)| (name, Secret::classify(secret))).collect();
        Ok(AuthFile { users })
    }

    /// The user names in the file (the pooler's SHOW USERS).
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    pub fn get(&self, user: &str) -> Option<&Secret> {
        self.users.get(user)
    }

    pub fn insert(&mut self, user: &str, password: &str) {
        self.users.insert(user.to_owned(), Secret::classify(password.to_owned()));
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

impl Secret {
    /// Recognizes the stored form of `text`.
    pub fn classify(text: String) -> Secret {
        if let Some(verifier) = Verifier::parse(&text) {
            return Secret::Scram(Arc::new(verifier));
        }
        if crate::md5::is_stored_hash(&text) {
            return Secret::Md5(text);
        }
        Secret::Plain { password: text, verifier: Arc::default() }
    }
}

/// Bound on users in one file.
pub const AUTH_FILE_USERS_MAX: usize = 100_000;
/// Bound on the file's size.
pub const AUTH_FILE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The `(user, secret)` pairs of a file in its order, later lines overriding earlier ones;
/// comments start with `;` or `#`. Pure text work (no key derivation), so it can be fuzzed.
pub fn parse_entries(text: &str) -> Result<Vec<(String, String)>, String> {
    if text.len() > AUTH_FILE_BYTES_MAX {
        return Err(format!("the file is larger than {AUTH_FILE_BYTES_MAX} bytes"));
    }
    let mut entries = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        let (name, secret) =
            parse_line(line).ok_or_else(|| format!("line {}: expected \"user\" \"password\"", number + 1))?;
        if entries.len() >= AUTH_FILE_USERS_MAX {
            return Err(format!("more than {AUTH_FILE_USERS_MAX} users"));
        }
        entries.push((name, secret));
    }
    Ok(entries)
}

/// Splits `"a" "b"` into its two fields; a doubled quote inside a field is a literal quote.
fn parse_line(line: &str) -> Option<(String, String)> {
    let (first, rest) = quoted(line)?;
    let (second, rest) = quoted(rest.trim_start())?;
    rest.trim().is_empty().then_some((first, second))
}

fn quoted(text: &str) -> Option<(String, &str)> {
    let mut chars = text.strip_prefix('"')?.char_indices().peekable();
    let mut value = String::new();
    while let Some((index, c)) = chars.next() {
        if c != '"' {
            value.push(c);
        } else if chars.peek().map(|(_, next)| *next) == Some('"') {
            value.push('"');
            chars.next();
        } else {
            return Some((value, &text[index + 2..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_secret_kinds_and_quotes() {
        let verifier = Verifier::from_password(b"x", 16).to_text();
        let text = format!(
            "; comment\n\"alice\" \"plain \"\"pw\"\"\"\n\"bob\" \"md5{}\"\n\"carol\" \"{verifier}\"\n",
            "0".repeat(32)
        );
        let file = AuthFile::parse(&text).expect("valid");
        assert!(matches!(file.get("alice"), Some(Secret::Plain { password, .. }) if password == "plain \"pw\""));
        assert!(matches!(file.get("bob"), Some(Secret::Md5(_))));
        assert!(matches!(file.get("carol"), Some(Secret::Scram(_))));
        assert!(AuthFile::parse("alice secret").is_err());
    }
}
