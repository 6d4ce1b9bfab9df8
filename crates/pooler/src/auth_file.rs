//! The user list: PgBouncer's `userlist.txt` format, one `"name" "secret"` pair per line, where the
//! secret is a plaintext password, an `md5…` hash or a `SCRAM-SHA-256$…` verifier.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bypass_wire::scram::{Verifier, DEFAULT_ITERATIONS};

/// What we know about one user's password.
#[derive(Debug, Clone)]
pub enum Secret {
    /// Plaintext; usable for every method. The SCRAM verifier is derived once at load.
    Plain { password: String, verifier: Arc<Verifier> },
    /// `md5` + hex(md5(password + user)): usable for MD5 only.
    Md5(String),
    /// A SCRAM verifier: usable for SCRAM only.
    Scram(Arc<Verifier>),
}

/// Users and their secrets.
#[derive(Debug, Clone, Default)]
pub struct AuthFile {
    users: HashMap<String, Secret>,
}

impl AuthFile {
    /// The user names in the file.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        Self::parse(&text)
    }

    /// Parses the file; comments start with `;` or `#`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut users = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            let (name, secret) =
                parse_line(line).ok_or_else(|| format!("line {}: expected \"user\" \"password\"", number + 1))?;
            users.insert(name.clone(), Secret::classify(secret));
        }
        Ok(AuthFile { users })
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
        if bypass_wire::md5::is_stored_hash(&text) {
            return Secret::Md5(text);
        }
        let verifier = Arc::new(Verifier::from_password(text.as_bytes(), DEFAULT_ITERATIONS));
        Secret::Plain { password: text, verifier }
    }
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
