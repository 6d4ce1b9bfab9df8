//! Cancel keys: the (process id, secret) pair a server gives each client in BackendKeyData, and
//! the check a CancelRequest must pass before anything is cancelled.

use bypass_wire::scram::constant_time_eq;
use rand::Rng;

/// A client's cancel key. Servers that relay to PostgreSQL issue their own keys and map them to
/// the server's, so a client never learns a backend's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelKey {
    pub process_id: i32,
    pub secret: [u8; 4],
}

impl CancelKey {
    /// A fresh random key (process id positive, as PostgreSQL's are).
    pub fn random() -> Self {
        let mut rng = rand::thread_rng();
        CancelKey { process_id: rng.gen_range(1..i32::MAX), secret: rng.gen() }
    }

    /// True when a CancelRequest names this key; compared in constant time.
    pub fn matches(&self, process_id: i32, secret: &[u8]) -> bool {
        process_id == self.process_id && constant_time_eq(&self.secret, secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_matches_only_itself() {
        let key = CancelKey::random();
        assert!(key.matches(key.process_id, &key.secret));
        assert!(!key.matches(key.process_id ^ 1, &key.secret));
        assert!(!key.matches(key.process_id, &[key.secret[0] ^ 1, key.secret[1], key.secret[2], key.secret[3]]));
        assert!(!key.matches(key.process_id, &key.secret[..3]));
        assert!(key.process_id > 0);
    }
}
